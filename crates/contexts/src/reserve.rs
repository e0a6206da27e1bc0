//! Address space reserved for arrays whose elements never move (context nodes).

use std::mem::size_of;

/// `len` elements of `T` in a private anonymous mapping made with `MAP_NORESERVE`: reserved,
/// committed page by page as they are touched, zeroed by the kernel, unmapped on drop.
pub(crate) struct Reserved<T> {
    base: *mut T,
    len: usize,
}

impl<T> Reserved<T> {
    /// Reserves `len` elements.
    ///
    /// # Errors
    /// The OS error if the address space cannot be had.
    pub(crate) fn new(len: usize) -> std::io::Result<Reserved<T>> {
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * size_of::<T>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Reserved {
            base: p.cast(),
            len,
        })
    }

    /// The first element's address.
    pub(crate) fn base(&self) -> *mut T {
        self.base
    }
}

impl<T> Drop for Reserved<T> {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `len` elements made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len * size_of::<T>()) };
    }
}
