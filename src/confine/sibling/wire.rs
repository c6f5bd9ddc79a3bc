//! What the shell wrapper and the sibling's exec relay say to each other over the exec socket
//! (docs/security.md#the-agents-network): one request — the command's argv, environment and
//! working directory, with its three stdio descriptors passed alongside (`SCM_RIGHTS`) — then
//! signals from the wrapper and, last, how the command ended from the relay.
//!
//! Framing: a 4-byte big-endian length (sent with the descriptors) and the request's body, each
//! field a 4-byte length and its bytes; afterwards one-tag messages ([`Note`]).

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// A request larger than this is refused (an environment is a few KiB).
pub const MAX_REQUEST: usize = 4 << 20;
/// At most this many argv entries or environment variables.
const MAX_FIELDS: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the exec socket failed")]
    Io {
        #[source]
        source: std::io::Error,
    },
    #[error("the request is malformed: {what}")]
    Malformed { what: &'static str },
}

impl From<std::io::Error> for WireError {
    fn from(source: std::io::Error) -> Self {
        WireError::Io { source }
    }
}

/// One command to run in the sibling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The real shell first, then its arguments (OpenCode's `-c <command>`).
    pub argv: Vec<Vec<u8>>,
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    pub cwd: Vec<u8>,
}

/// After the request: a signal for the command from the wrapper, or from the relay how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Pass this signal to the command's process group.
    Signal(i32),
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Killed(i32),
    /// It could not be started (the relay's reason went to the command's stderr).
    NotStarted,
}

impl Note {
    pub fn encode(self) -> [u8; 5] {
        let (tag, n) = match self {
            Note::Signal(s) => (b'S', s),
            Note::Exited(c) => (b'X', c),
            Note::Killed(s) => (b'K', s),
            Note::NotStarted => (b'N', 0),
        };
        let mut out = [tag, 0, 0, 0, 0];
        out[1..].copy_from_slice(&n.to_be_bytes());
        out
    }

    pub fn decode(bytes: [u8; 5]) -> Option<Note> {
        let n = i32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        match bytes[0] {
            b'S' => Some(Note::Signal(n)),
            b'X' => Some(Note::Exited(n)),
            b'K' => Some(Note::Killed(n)),
            b'N' => Some(Note::NotStarted),
            _ => None,
        }
    }

    pub fn write(self, to: &mut impl Write) -> std::io::Result<()> {
        to.write_all(&self.encode())
    }

    /// `None` at the end of the stream or on a tag fro-bot never writes.
    pub fn read(from: &mut impl Read) -> Option<Note> {
        let mut b = [0u8; 5];
        from.read_exact(&mut b).ok()?;
        Note::decode(b)
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut field = |b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        };
        field(&(self.argv.len() as u32).to_be_bytes());
        for a in &self.argv {
            field(a);
        }
        field(&(self.env.len() as u32).to_be_bytes());
        for (k, v) in &self.env {
            field(k);
            field(v);
        }
        field(&self.cwd);
        out
    }

    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut rest = body;
        let argc = count(&mut rest)?;
        let argv = (0..argc)
            .map(|_| take(&mut rest).map(<[u8]>::to_vec))
            .collect::<Result<Vec<_>, _>>()?;
        let envc = count(&mut rest)?;
        let env = (0..envc)
            .map(|_| Ok((take(&mut rest)?.to_vec(), take(&mut rest)?.to_vec())))
            .collect::<Result<Vec<_>, WireError>>()?;
        let cwd = take(&mut rest)?.to_vec();
        if !rest.is_empty() {
            return Err(WireError::Malformed {
                what: "trailing bytes",
            });
        }
        if argv.is_empty() {
            return Err(WireError::Malformed { what: "no program" });
        }
        Ok(Request { argv, env, cwd })
    }
}

fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
    let short = WireError::Malformed {
        what: "a field runs past the end",
    };
    let len = rest.get(..4).ok_or(WireError::Malformed {
        what: "a field runs past the end",
    })?;
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let field = rest.get(4..4 + len).ok_or(short)?;
    *rest = &rest[4 + len..];
    Ok(field)
}

fn count(rest: &mut &[u8]) -> Result<usize, WireError> {
    let b = take(rest)?;
    let n = <[u8; 4]>::try_from(b).map_err(|_| WireError::Malformed { what: "a count" })?;
    let n = u32::from_be_bytes(n) as usize;
    if n > MAX_FIELDS {
        return Err(WireError::Malformed {
            what: "too many fields",
        });
    }
    Ok(n)
}

/// The wrapper's side: the request with `fds` (stdin, stdout, stderr) passed alongside.
pub fn send_request(
    sock: &mut UnixStream,
    req: &Request,
    fds: &[BorrowedFd<'_>; 3],
) -> Result<(), WireError> {
    let body = req.encode();
    let len = (body.len() as u32).to_be_bytes();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(WireError::Malformed {
            what: "descriptors",
        });
    }
    let sent = rustix::net::sendmsg(
        sock.as_fd(),
        &[IoSlice::new(&len)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(std::io::Error::from)?;
    if sent != len.len() {
        return Err(WireError::Malformed {
            what: "a short first write",
        });
    }
    sock.write_all(&body)?;
    Ok(())
}

/// The relay's side: the request and the three descriptors that came with it.
pub fn recv_request(sock: &mut UnixStream) -> Result<(Request, [OwnedFd; 3]), WireError> {
    let mut len = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [IoSliceMut::new(&mut len)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got.bytes < len.len() {
        sock.read_exact(&mut len[got.bytes..])?;
    }
    let fds: [OwnedFd; 3] = fds.try_into().map_err(|_| WireError::Malformed {
        what: "not three descriptors",
    })?;
    let size = u32::from_be_bytes(len) as usize;
    if size > MAX_REQUEST {
        return Err(WireError::Malformed { what: "too large" });
    }
    let mut body = vec![0u8; size];
    sock.read_exact(&mut body)?;
    Ok((Request::decode(&body)?, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_its_descriptors_arrive_as_sent() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let req = Request {
            argv: vec![b"/bin/sh".to_vec(), b"-c".to_vec(), b"echo \xff".to_vec()],
            env: vec![
                (b"A".to_vec(), b"1=2".to_vec()),
                (b"B".to_vec(), Vec::new()),
            ],
            cwd: b"/github/workspace".to_vec(),
        };
        let f = tempfile::tempfile().unwrap();
        send_request(&mut a, &req, &[f.as_fd(), f.as_fd(), f.as_fd()]).unwrap();
        let (got, fds) = recv_request(&mut b).unwrap();
        assert_eq!(got, req);
        assert_eq!(fds.len(), 3);
        for n in [
            Note::Signal(15),
            Note::Exited(-3),
            Note::Killed(9),
            Note::NotStarted,
        ] {
            n.write(&mut a).unwrap();
            assert_eq!(Note::read(&mut b), Some(n));
        }
    }

    #[test]
    fn a_malformed_request_is_refused_not_trusted() {
        let good = Request {
            argv: vec![b"sh".to_vec()],
            env: vec![],
            cwd: b"/".to_vec(),
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Request::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(Request::decode(&long).is_err());
        let mut huge = 5u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&[0xff; 4]);
        assert!(Request::decode(&huge).is_err());
        let none = Request {
            argv: vec![],
            env: vec![],
            cwd: b"/".to_vec(),
        }
        .encode();
        assert!(Request::decode(&none).is_err());
    }
}
