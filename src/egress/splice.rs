//! A tunnel's bytes, moved between the two sockets by the kernel (`crate::net::splice`)
//! instead of being copied through fro-bot: a download through the egress proxy runs at the speed
//! of a direct one (docs/benchmarks.md#the-agents-network). One blocking thread per direction;
//! where the upgraded connection is not a plain TCP stream, an ordinary async copy.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

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
    if crate::net::splice::pump(from.as_raw_fd(), to.as_raw_fd()).is_err() {
        let _ = from.shutdown(std::net::Shutdown::Read);
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
