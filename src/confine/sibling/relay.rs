//! The sibling container's first process, root there with only `CAP_SETUID`, `CAP_SETGID` and
//! `CAP_KILL` (docs/security.md#the-agents-network). It
//! - runs each command the shell wrapper hands it ([`super::wire`]) as the agent's uid, in its own
//!   process group, inside the commands' Landlock domain and system-call filters
//!   ([`CommandsEnforcement`]), with the wrapper's own stdio, and answers how it ended;
//! - forwards the sibling's `127.0.0.1:<egress port>` to the egress proxy's Unix socket, the bytes
//!   moved by the kernel (`crate::net::splice`): the only way out of a container with no network;
//! - ends everything when fro-bot's lifeline connection closes (fro-bot ended or was killed):
//!   as the container's PID 1, its exit takes every process of the sibling with it.
//!
//! The sockets live in a directory of fro-bot's that is setgid to the memory group, so they belong
//! to that group, mode 0660: only OpenCode's wrapper (which still holds the group when it
//! connects) reaches them, never the agent's commands, here or in fro-bot's container.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::reaper::Reaper;
use super::wire::{recv_request, Note, Request};
use super::{CTL_SOCKET, EGRESS_SOCKET, EXEC_SOCKET};
use crate::confine::memory_group::OPENCODE_ONLY;
use crate::confine::network::CommandsEnforcement;
use crate::net::splice;
use crate::runner::{env, log};

/// The first argument that makes fro-bot the relay.
pub const SUBCOMMAND: &str = "sibling-relay";

/// How long the relay waits for fro-bot's lifeline before it gives up and ends.
const LIFELINE_WAIT: Duration = Duration::from_secs(60);

/// The signals the wrapper may pass on to its command.
const PASSED_SIGNALS: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGKILL,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// What fro-bot starts the relay with (its command line after [`SUBCOMMAND`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    pub dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// The egress proxy's port, which the sibling's own loopback forwards; `None` under `none`.
    pub proxy_port: Option<u16>,
    /// The commands' network (`NetworkPlan::commands_spec`).
    pub spec: String,
}

impl RelayConfig {
    pub fn to_args(&self) -> Vec<String> {
        vec![
            SUBCOMMAND.to_string(),
            self.dir.to_string_lossy().into_owned(),
            self.uid.to_string(),
            self.gid.to_string(),
            self.proxy_port.map_or("-".to_string(), |p| p.to_string()),
            self.spec.clone(),
        ]
    }

    pub fn from_args(args: &[OsString]) -> Option<RelayConfig> {
        let [dir, uid, gid, port, spec] = args else {
            return None;
        };
        let s = |a: &OsString| a.to_str().map(str::to_string);
        Some(RelayConfig {
            dir: PathBuf::from(dir),
            uid: s(uid)?.parse().ok()?,
            gid: s(gid)?.parse().ok()?,
            proxy_port: match s(port)?.as_str() {
                "-" => None,
                p => Some(p.parse().ok()?),
            },
            spec: s(spec)?,
        })
    }
}

/// `fro-bot sibling-relay …`: runs until fro-bot's lifeline closes.
pub fn serve(args: &[OsString]) -> ExitCode {
    let Some(config) = RelayConfig::from_args(args) else {
        log::print_err("fro-bot sibling-relay: arguments fro-bot did not write");
        return ExitCode::from(2);
    };
    if config.uid == 0 {
        log::print_err("fro-bot sibling-relay: never runs the agent's commands as root");
        return ExitCode::from(2);
    }
    match listen(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::print_err(&format!("fro-bot sibling-relay: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn bind(dir: &Path, name: &str) -> std::io::Result<UnixListener> {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)?;
    // The directory is setgid: the socket already belongs to the memory group.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

fn listen(config: &RelayConfig) -> std::io::Result<()> {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o007) };
    let reaper = Reaper::start();
    if let Some(port) = config.proxy_port {
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port))?;
        let target = config.dir.join(EGRESS_SOCKET);
        std::thread::spawn(move || forward_egress(&tcp, &target));
    }
    let exec = bind(&config.dir, EXEC_SOCKET)?;
    let ctl = bind(&config.dir, CTL_SOCKET)?;
    let r = reaper.clone();
    std::thread::spawn(move || hold_lifeline(&ctl, &r));
    // Made once: every command enters the same domain and filters (a spec fro-bot did not write
    // ends the relay before any command).
    let enforcement =
        Arc::new(CommandsEnforcement::from_spec(&config.spec).map_err(std::io::Error::other)?);
    let config = Arc::new(config.clone());
    for conn in exec.incoming() {
        let Ok(conn) = conn else { continue };
        let (config, reaper, enforcement) = (config.clone(), reaper.clone(), enforcement.clone());
        std::thread::spawn(move || run_one(conn, &config, &reaper, enforcement));
    }
    Ok(())
}

/// fro-bot's lifeline: once it connected, its end (fro-bot ended, was killed, or removed the
/// sibling) ends every process here; with no connection in [`LIFELINE_WAIT`], the same.
fn hold_lifeline(ctl: &UnixListener, reaper: &Reaper) {
    let connected = Arc::new(AtomicBool::new(false));
    let flag = connected.clone();
    let r = reaper.clone();
    std::thread::spawn(move || {
        std::thread::sleep(LIFELINE_WAIT);
        if !flag.load(Ordering::SeqCst) {
            end_everything(&r);
        }
    });
    if let Ok((mut conn, _)) = ctl.accept() {
        connected.store(true, Ordering::SeqCst);
        let _ = std::io::copy(&mut conn, &mut std::io::sink());
    }
    end_everything(reaper);
}

/// Kills what runs here and exits. As the container's PID 1, `kill(-1)` reaches every process
/// of the sibling (and its exit would too); anywhere else (a benchmark's relay on the host)
/// only the commands' own groups, never every process root may signal.
fn end_everything(reaper: &Reaper) -> ! {
    reaper.kill_all();
    // SAFETY: getpid cannot fail; kill(-1) is sent only by the PID 1 of a PID namespace, where
    // it signals every process of that namespace but the sender.
    unsafe {
        if libc::getpid() == 1 {
            libc::kill(-1, libc::SIGKILL);
        }
    }
    std::process::exit(0)
}

/// The sibling's `127.0.0.1:<port>` to the egress proxy's Unix socket, byte for byte.
fn forward_egress(tcp: &std::net::TcpListener, target: &Path) {
    for conn in tcp.incoming() {
        let Ok(conn) = conn else { continue };
        let target = target.to_path_buf();
        std::thread::spawn(move || {
            let Ok(up) = UnixStream::connect(&target) else {
                return;
            };
            splice(conn, up);
        });
    }
}

fn splice(tcp: std::net::TcpStream, unix: UnixStream) {
    let (Ok(tcp_r), Ok(unix_r)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let (tcp_w, unix_w) = (tcp, unix);
    let up = std::thread::spawn(move || {
        let _ = splice::pump(tcp_r.as_raw_fd(), unix_w.as_raw_fd());
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    });
    let _ = splice::pump(unix_r.as_raw_fd(), tcp_w.as_raw_fd());
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

/// One command: started, its signals passed on, its end answered. The wrapper's end before the
/// command's kills the command's group.
fn run_one(
    mut conn: UnixStream,
    config: &RelayConfig,
    reaper: &Reaper,
    enforcement: Arc<CommandsEnforcement>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok((req, [stdin, stdout, stderr])) = recv_request(&mut conn) else {
        return;
    };
    let _ = conn.set_read_timeout(None);
    let mut errors = stderr.try_clone().ok().map(std::fs::File::from);
    let mut cmd = command(&req, config, [stdin, stdout, stderr]);
    // SAFETY: `apply` makes system calls only (async-signal-safe) on a ruleset and filters made
    // before the fork.
    unsafe { cmd.pre_exec(move || enforcement.apply()) };
    let started = reaper.spawn(&mut cmd);
    let (pid, ended) = match started {
        Ok(s) => s,
        Err(e) => {
            if let Some(errors) = errors.as_mut() {
                let _ = writeln!(errors, "fro-bot: the agent's command did not start: {e}");
            }
            let _ = Note::NotStarted.write(&mut conn);
            return;
        }
    };
    let done = Arc::new(AtomicBool::new(false));
    if let Ok(mut signals) = conn.try_clone() {
        let done = done.clone();
        std::thread::spawn(move || pass_signals(&mut signals, pid, &done));
    }
    let note = ended.recv().unwrap_or(Note::Killed(libc::SIGKILL));
    done.store(true, Ordering::SeqCst);
    let _ = note.write(&mut conn);
}

/// The command as the agent's uid: the request's program and arguments, its environment less
/// OpenCode's own variables and the sibling's socket, its working directory, its own group.
fn command(req: &Request, config: &RelayConfig, stdio: [OwnedFd; 3]) -> std::process::Command {
    let os = |b: &[u8]| OsString::from_vec(b.to_vec());
    let mut cmd = std::process::Command::new(os(&req.argv[0]));
    cmd.args(req.argv[1..].iter().map(|a| os(a)));
    cmd.env_clear();
    for (k, v) in &req.env {
        let dropped = OPENCODE_ONLY.iter().any(|n| n.as_bytes() == k.as_slice())
            || k.as_slice() == env::FRO_BOT_AGENT_SIBLING.as_bytes();
        if !dropped {
            cmd.env(os(k), os(v));
        }
    }
    let [i, o, e] = stdio;
    cmd.current_dir(os(&req.cwd))
        .uid(config.uid)
        .gid(config.gid)
        .process_group(0)
        .stdin(i)
        .stdout(o)
        .stderr(e);
    cmd
}

/// The wrapper's signals, to the command's group; its end (OpenCode killed the wrapper) kills it.
fn pass_signals(conn: &mut UnixStream, pid: i32, done: &AtomicBool) {
    loop {
        let sig = match Note::read(conn) {
            Some(Note::Signal(s)) if PASSED_SIGNALS.contains(&s) => s,
            Some(_) => continue,
            None => libc::SIGKILL,
        };
        if done.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: a plain kill of the command's process group.
        unsafe { libc::kill(-pid, sig) };
        if sig == libc::SIGKILL {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relays_arguments_read_back_and_others_are_refused() {
        let c = RelayConfig {
            dir: PathBuf::from("/tmp/fro-bot-sibling-x"),
            uid: 1001,
            gid: 1001,
            proxy_port: Some(34567),
            spec: "abi=7;connect=34567;bind=;ip=tcp".into(),
        };
        let args: Vec<OsString> = c.to_args().into_iter().map(OsString::from).collect();
        assert_eq!(args[0], SUBCOMMAND);
        assert_eq!(RelayConfig::from_args(&args[1..]), Some(c.clone()));
        let none = RelayConfig {
            proxy_port: None,
            ..c
        };
        let args: Vec<OsString> = none.to_args().into_iter().map(OsString::from).collect();
        assert_eq!(RelayConfig::from_args(&args[1..]), Some(none));
        assert_eq!(RelayConfig::from_args(&args[1..3]), None);
    }
}
