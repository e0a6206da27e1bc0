//! hotpath's own panics, each said in one line: a guest thread's ends the whole process as an
//! internal error does (the other threads stopped, the profile written), never leaving the
//! guest's other threads waiting for a thread that is gone.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};

thread_local! {
    /// The calling thread reports its own panics ([`catch`]): the hook only records them.
    static CAUGHT: Cell<bool> = const { Cell::new(false) };
    /// The last panic on this thread, as `panicked at FILE:LINE:COL: MESSAGE`.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the panic hook: every panic is recorded for [`catch`] and, on a thread that does
/// not catch its own, printed as one line (`hotpath: internal error (bug in hotpath): ...`)
/// instead of the standard library's several. With `RUST_BACKTRACE` set the standard hook
/// runs too, with its backtrace, for whoever debugs hotpath.
pub fn install() {
    let standard = panic::take_hook();
    let backtrace = std::env::var("RUST_BACKTRACE").is_ok_and(|v| !v.is_empty() && v != "0");
    panic::set_hook(Box::new(move |info| {
        let message = message(info.payload());
        let line = match info.location() {
            Some(l) => format!(
                "panicked at {}:{}:{}: {message}",
                l.file(),
                l.line(),
                l.column()
            ),
            None => format!("panicked: {message}"),
        };
        if backtrace {
            standard(info);
        } else if !CAUGHT.with(Cell::get) {
            crate::say(format_args!(
                "hotpath: internal error (bug in hotpath): {line}"
            ));
        }
        LAST.with(|l| *l.borrow_mut() = Some(line));
    }));
}

/// Runs `f`, returning its panic's one-line description (`panicked at FILE:LINE:COL: MESSAGE`)
/// if it panics; the hook prints nothing for it, so the caller says it once, where it ends
/// the process.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let was = CAUGHT.with(|c| c.replace(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    CAUGHT.with(|c| c.set(was));
    r.map_err(|payload| {
        LAST.with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| format!("panicked: {}", message(&*payload)))
    })
}

/// A panic's message: its `&str` or `String` payload.
fn message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_gives_its_location_and_message() {
        install();
        let r: Result<(), String> = catch(|| panic!("the index is {}", 7));
        let e = r.unwrap_err();
        assert!(e.starts_with("panicked at "), "{e}");
        assert!(e.contains("panics.rs:"), "{e}");
        assert!(e.ends_with(": the index is 7"), "{e}");
        assert_eq!(catch(|| 5), Ok(5));
        assert!(
            !CAUGHT.with(Cell::get),
            "catch leaves the flag as it found it"
        );
    }
}
