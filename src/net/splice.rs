//! Bytes moved from one socket to another by the kernel (`splice(2)` through a pipe), never
//! copied through fro-bot: the egress proxy's tunnels (`crate::egress::splice`) and the agent's
//! container's relay to that proxy (`crate::confine::sibling::relay`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// How much one `splice` call moves at most (the pipe is grown to it where the kernel allows).
const CHUNK: usize = 1 << 20;

/// Blocking: `from` → `to` until `from` ends (`Ok`) or either side fails.
pub fn pump(from: RawFd, to: RawFd) -> std::io::Result<()> {
    let (r, w) = pipe()?;
    loop {
        let n = splice(from, w.as_raw_fd(), CHUNK)?;
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            let m = splice(r.as_raw_fd(), to, left)?;
            if m == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            left -= m;
        }
    }
}

/// Up to `len` bytes from `from` into `to`; 0 at `from`'s end.
fn splice(from: RawFd, to: RawFd, len: usize) -> std::io::Result<usize> {
    loop {
        // SAFETY: both fds are open for the call; no offsets are passed.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        if let Ok(n) = usize::try_from(n) {
            return Ok(n);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new fds that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A larger pipe moves more per call; the default (64 KiB) works too.
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as i32) };
    Ok((r, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn every_byte_arrives_in_order_and_the_end_is_seen() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, mut d) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            a.write_all(&sent).unwrap();
        });
        let pumping = std::thread::spawn(move || {
            pump(b.as_raw_fd(), c.as_raw_fd()).unwrap();
            drop(c);
        });
        let mut got = Vec::new();
        d.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        pumping.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data);
    }
}
