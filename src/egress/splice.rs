//! A tunnel's bytes, moved between the two sockets by the kernel (`splice(2)` through a pipe)
//! instead of being copied through fro-bot: a download through the egress proxy runs at the speed
//! of a direct one (docs/benchmarks.md#the-agents-network). One blocking thread per direction;
//! where the upgraded connection is not a plain TCP stream, an ordinary async copy.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// How much one `splice` call moves at most.
const CHUNK: usize = 1 << 20;
/// Buffers of the async fallback, each way.
const FALLBACK_BUFFER: usize = 256 * 1024;

/// Carries `client` ⇄ `server` until both directions end or `stop` fires.
pub async fn carry(client: Upgraded, mut server: TcpStream, stop: CancellationToken) {
    let parts = match client.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => parts,
        Err(client) => return copy(client, server, stop).await,
    };
    // What the client sent after its CONNECT, already read by the HTTP layer.
    if !parts.read_buf.is_empty() && server.write_all(&parts.read_buf).await.is_err() {
        return;
    }
    let both = match (blocking(parts.io.into_inner()), blocking(server)) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let (client, server) = (Arc::new(both.0), Arc::new(both.1));
    let up = tokio::task::spawn_blocking({
        let (from, to) = (client.clone(), server.clone());
        move || pump(&from, &to)
    });
    let down = tokio::task::spawn_blocking({
        let (from, to) = (server.clone(), client.clone());
        move || pump(&from, &to)
    });
    tokio::select! {
        _ = async { let _ = tokio::join!(up, down); } => {}
        () = stop.cancelled() => {
            // Unblocks both threads; the sockets close when the last handle goes.
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn blocking(stream: TcpStream) -> std::io::Result<std::net::TcpStream> {
    let std = stream.into_std()?;
    std.set_nonblocking(false)?;
    Ok(std)
}

async fn copy(client: Upgraded, mut server: TcpStream, stop: CancellationToken) {
    let mut client = TokioIo::new(client);
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(
            &mut client, &mut server, FALLBACK_BUFFER, FALLBACK_BUFFER) => {}
        () = stop.cancelled() => {}
    }
}

/// `from` → `to` until `from` ends (then `to`'s write side is shut) or either fails.
fn pump(from: &std::net::TcpStream, to: &std::net::TcpStream) {
    if let Some((r, w)) = pipe() {
        while let Some(n) = splice(from.as_raw_fd(), w.as_raw_fd()) {
            let mut left = n;
            while left > 0 {
                match splice(r.as_raw_fd(), to.as_raw_fd()) {
                    Some(m) if m <= left => left -= m,
                    _ => {
                        let _ = from.shutdown(std::net::Shutdown::Read);
                        return;
                    }
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Up to [`CHUNK`] bytes from `from` into `to`; `None` at the end or on an error.
fn splice(from: i32, to: i32) -> Option<usize> {
    // SAFETY: both fds are open for the call; no offsets are passed.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            CHUNK,
            libc::SPLICE_F_MOVE,
        )
    };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

fn pipe() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: pipe2 returned two new fds that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A larger pipe moves more per call; the default (64 KiB) works too.
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as i32) };
    Some((r, w))
}
