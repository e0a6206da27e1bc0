//! Reading a `/proc` file in few system calls.
//!
//! `/proc` files report a size of 0, so `std::fs::read_to_string` starts with a 32-byte probe
//! and doubles its reads from there: `/proc/self/maps` of a small static program took ten
//! `read` calls, and the kernel walks the mappings again at every one (a warm `busybox true`
//! under hotpath made 45 reads, most of them of `/proc` files).

use std::io::Read;

/// Bytes reserved before the first read (a page is what one read of a `/proc` file returns
/// at most; a process's maps are a few pages).
const FIRST_READ_BYTES: usize = 16 << 10;

/// The whole text of the `/proc` file at `path`.
///
/// # Errors
/// Opening or reading it fails, or it is not UTF-8.
pub fn read_to_string(path: &str) -> std::io::Result<String> {
    let mut text = String::with_capacity(FIRST_READ_BYTES);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}
