//! Reading and writing guest memory without trusting the guest's pointers: a bad address gives
//! EFAULT (as the kernel would give the guest), never a fault in hotpath.

use std::ffi::c_void;

/// Reads as many bytes as possible from guest address `addr` into `buf`, stopping at the first
/// unreadable page. Returns the number of bytes read.
pub fn read_partial(addr: u64, buf: &mut [u8]) -> usize {
    let mut done = 0usize;
    while done < buf.len() {
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr() as *mut c_void,
            iov_len: buf.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: the local iovec is our buffer; the remote one is only read by the kernel,
        // which checks it.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Reads exactly `buf.len()` bytes from guest address `addr`.
///
/// # Errors
/// `EFAULT` (as a negative errno) if any byte is unreadable.
pub fn read(addr: u64, buf: &mut [u8]) -> Result<(), i64> {
    if read_partial(addr, buf) == buf.len() {
        Ok(())
    } else {
        Err(-(libc::EFAULT as i64))
    }
}

/// Writes `data` to guest address `addr`.
///
/// # Errors
/// `EFAULT` (as a negative errno) if any byte is not writable.
pub fn write(addr: u64, data: &[u8]) -> Result<(), i64> {
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: the kernel checks the remote range; the local one is our slice.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == data.len() as isize {
        Ok(())
    } else {
        Err(-(libc::EFAULT as i64))
    }
}

/// Reads a NUL-terminated string of at most `max` bytes from guest address `addr`.
///
/// # Errors
/// `EFAULT` if unreadable, `ENAMETOOLONG` if no NUL within `max` bytes.
pub fn read_cstr(addr: u64, max: usize) -> Result<Vec<u8>, i64> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 256];
    while out.len() < max {
        // Never read across a page boundary in one go: the next page may be unmapped.
        let here = addr + out.len() as u64;
        let to_page_end = (4096 - (here % 4096)) as usize;
        let want = chunk.len().min(to_page_end);
        let got = read_partial(here, &mut chunk[..want]);
        if got == 0 {
            return Err(-(libc::EFAULT as i64));
        }
        if let Some(nul) = chunk[..got].iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..nul]);
            return Ok(out);
        }
        out.extend_from_slice(&chunk[..got]);
    }
    Err(-(libc::ENAMETOOLONG as i64))
}
