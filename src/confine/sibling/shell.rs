//! The shell wrapper's side when the agent's commands run in the sibling container
//! (docs/security.md#the-agents-network): instead of becoming the real shell, the wrapper hands
//! the command to the sibling's exec relay — argv, environment, working directory and its own
//! stdio descriptors — passes on the signals it gets, and ends as the command ended. It connects
//! while it still holds the memory group (the socket is that group's), then drops the group.
//! When the sibling cannot be reached the command fails: it never runs here instead.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

use super::wire::{send_request, Note, Request};
use crate::runner::{env, log};

/// The exec socket's descriptor, for the signal handler.
static SOCKET: AtomicI32 = AtomicI32::new(-1);

/// The signals the wrapper passes on (OpenCode ends a command with SIGTERM, then SIGKILL, which
/// cannot be caught: the relay kills the command when the wrapper's connection ends).
const FORWARDED: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Exit status when the sibling could not run the command (the shell's "cannot execute").
const NOT_RUN: u8 = 126;

/// When OpenCode's environment names the sibling's exec socket: runs `real rest…` there and
/// returns how it ended. `None`: no sibling this run (the command runs here, as before).
pub fn forward_if_sibling(real: &OsString, rest: &[OsString]) -> Option<ExitCode> {
    let socket = std::env::var_os(env::FRO_BOT_AGENT_SIBLING)?;
    Some(match forward(&socket, real, rest) {
        Ok(code) => code,
        Err(e) => {
            log::print_err(&format!(
                "fro-bot: the agent's command cannot run in its container: {e}"
            ));
            ExitCode::from(NOT_RUN)
        }
    })
}

fn forward(socket: &OsString, real: &OsString, rest: &[OsString]) -> std::io::Result<ExitCode> {
    let mut conn = UnixStream::connect(socket)?;
    super::super::memory_group::drop_memory_group()?;
    let mut argv = vec![real.as_bytes().to_vec()];
    argv.extend(rest.iter().map(|a| a.as_bytes().to_vec()));
    let env = std::env::vars_os()
        .filter(|(k, _)| k != env::FRO_BOT_AGENT_SIBLING)
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    let cwd = std::env::current_dir()?.into_os_string().into_vec();
    let req = Request { argv, env, cwd };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    send_request(
        &mut conn,
        &req,
        &[stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .map_err(std::io::Error::other)?;
    SOCKET.store(conn.as_raw_fd(), Ordering::SeqCst);
    pass_signals();
    Ok(match Note::read(&mut conn) {
        Some(Note::Exited(code)) => ExitCode::from((code & 0xff) as u8),
        Some(Note::Killed(sig)) => die_like(sig),
        Some(Note::NotStarted) => ExitCode::from(NOT_RUN),
        Some(Note::Signal(_)) | None => {
            log::print_err("fro-bot: the agent's container ended before the command did");
            ExitCode::from(NOT_RUN)
        }
    })
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SOCKET.load(Ordering::SeqCst);
    if fd >= 0 {
        let note = Note::Signal(sig).encode();
        // SAFETY: write(2) is async-signal-safe; the buffer is a local array.
        unsafe { libc::write(fd, note.as_ptr().cast(), note.len()) };
    }
}

fn pass_signals() {
    for &sig in FORWARDED {
        // SAFETY: installs a handler that only calls write(2).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Ends this process by the signal that ended the command, so OpenCode sees the same end.
fn die_like(sig: i32) -> ExitCode {
    // SAFETY: resets one signal to its default and raises it on this process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    ExitCode::from(128u8.saturating_add((sig & 0x7f) as u8))
}
