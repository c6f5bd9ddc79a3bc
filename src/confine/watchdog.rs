//! OpenCode dies with fro-bot, even when fro-bot is killed outright (SIGKILL runs no destructor,
//! so `kill_on_drop` cannot help). The parent-death signal cannot carry it either: OpenCode starts
//! with the memory group as its effective gid ([`super::memory_group`]), an exec the kernel treats
//! as secure, and a secure exec clears that signal.
//!
//! So a watchdog does: fro-bot itself, as `fro-bot watchdog`, of fro-bot's uid and in its own
//! process group (a signal to fro-bot's group does not reach it). Its stdin is a pipe whose only
//! writer is fro-bot (the write end is close-on-exec, so OpenCode and the agent never hold it).
//! fro-bot names OpenCode's process group on it, and says `release` once it stopped OpenCode
//! itself. The pipe's end without `release` means fro-bot died: the watchdog kills the group
//! (OpenCode and whatever of the agent's is still in it) and exits. Strays that left the group
//! are the stray sweep's ([`super::strays`]); in the action the container ends with fro-bot.

use std::io::{BufRead, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{ExitCode, Stdio};

/// The hidden subcommand that runs [`serve`].
pub const SUBCOMMAND: &str = "watchdog";

const GROUP: &str = "group ";
const RELEASE: &str = "release";

/// fro-bot's end: dropped without [`Watchdog::release`], the guarded group is killed.
#[derive(Debug)]
pub struct Watchdog {
    pipe: Option<std::fs::File>,
    child: tokio::process::Child,
}

impl Watchdog {
    /// Starts `exe watchdog` (fro-bot's own binary). Before OpenCode: a fro-bot killed between the
    /// two spawns leaves no group unguarded for longer than the [`Watchdog::guard`] call.
    pub fn start(exe: &Path) -> std::io::Result<Watchdog> {
        let (reader, writer) = pipe()?;
        let mut cmd = tokio::process::Command::new(exe);
        // At `/`: it holds no directory of the run open (a workspace, a mount) while it waits.
        cmd.arg(SUBCOMMAND)
            .current_dir("/")
            .env_clear()
            .stdin(reader)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // An unreaped exit is collected by tokio's orphan reaper: no zombie outlives the run.
        let child = cmd.spawn()?;
        Ok(Watchdog {
            pipe: Some(std::fs::File::from(writer)),
            child,
        })
    }

    /// Guards process group `pgid` (OpenCode's: it leads its own group).
    pub fn guard(&mut self, pgid: u32) -> std::io::Result<()> {
        self.write(&format!("{GROUP}{pgid}\n"))
    }

    /// fro-bot stopped the group's leader itself: nothing is killed when the pipe ends. Waits (1 s
    /// at most) for the watchdog to exit: in a local run as root it has the agent's uid, and the
    /// stray sweep that follows must not find it.
    pub async fn release(mut self) {
        // A watchdog that is gone cannot kill anything: nothing to report.
        let _ = self.write(&format!("{RELEASE}\n"));
        self.pipe = None;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.child.wait()).await;
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        match &mut self.pipe {
            Some(pipe) => pipe.write_all(line.as_bytes()),
            None => Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        }
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What the watchdog was told, read to the pipe's end.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Orders {
    pub groups: Vec<i32>,
    pub released: bool,
}

impl Orders {
    /// Reads lines to the end. Only group ids above 1 are kept: `kill(-1)` would signal every
    /// process fro-bot's uid may, and 0 its own group.
    pub fn read(input: impl BufRead) -> Orders {
        let mut orders = Orders::default();
        for line in input.lines() {
            let Ok(line) = line else { break };
            if line == RELEASE {
                orders.released = true;
            } else if let Some(id) = line.strip_prefix(GROUP) {
                match id.parse::<i32>() {
                    Ok(id) if id > 1 => orders.groups.push(id),
                    _ => {}
                }
            }
        }
        orders
    }

    /// The groups to kill: none once released.
    pub fn to_kill(&self) -> &[i32] {
        if self.released {
            &[]
        } else {
            &self.groups
        }
    }
}

/// `fro-bot watchdog`: waits for its stdin to end, then kills what fro-bot left guarded.
pub fn serve() -> ExitCode {
    let orders = Orders::read(std::io::stdin().lock());
    for &group in orders.to_kill() {
        // SAFETY: a plain syscall. `group` > 1 ([`Orders::read`]), so never every process or this
        // one's group. The id cannot name another group while a member of OpenCode's lives (the
        // kernel does not reuse an id still in use as a group id).
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_real_groups_are_kept_and_release_spares_them() {
        let orders = Orders::read("group 4242\ngroup 1\ngroup 0\ngroup -7\ngroup x\n".as_bytes());
        assert_eq!(orders.to_kill(), &[4242]);
        let released = Orders::read("group 4242\nrelease\n".as_bytes());
        assert!(released.to_kill().is_empty());
    }
}
