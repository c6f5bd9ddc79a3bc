//! The exec relay of the agent's container and the shell wrapper's side of it
//! (docs/security.md#the-agents-network), as processes on this machine: the relay is the built
//! `fro-bot sibling-relay` on a directory laid out as fro-bot lays it out (root, setgid to the
//! memory group, 2710), the wrapper the built `fro-bot --agent-shell=…`. What runs in a real
//! sibling container is `container::the_agents_*`.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fro_bot::confine::memory_group::MEMORY_GID;

use crate::support::action::BIN;
use crate::support::relay::Relay;

const AGENT: u32 = 1001;

/// The wrapper running `command` as OpenCode would start it: the agent's uid, the memory group as
/// its effective gid, the relay's socket named.
fn command(relay: &Relay, command: &str, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(relay.wrapper());
    c.args(["-c", command])
        .current_dir("/")
        .env("FRO_BOT_AGENT_SIBLING", relay.exec())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    as_opencode(&mut c);
    c
}

fn as_opencode(c: &mut Command) {
    // SAFETY: id syscalls between fork and exec.
    unsafe {
        c.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(AGENT, MEMORY_GID, MEMORY_GID) != 0
                || libc::setresuid(AGENT, AGENT, AGENT) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(15), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_command_runs_as_the_agent_with_its_own_stdio_exit_and_no_secret_of_opencodes() {
    let Some(relay) = Relay::start(AGENT, None) else {
        return;
    };
    let out = command(
        &relay,
        "id -u; id -G; echo to-stderr >&2; env | cut -d= -f1 | sort | tr '\\n' ' '; exit 7",
        &[
            ("OPENCODE_SERVER_PASSWORD", "hunter2"),
            ("FRO_BOT_AGENT_NETWORK", "x"),
            ("KEEP_ME", "1"),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("1001"));
    assert_eq!(
        lines.next(),
        Some("1001"),
        "no memory group, no other group"
    );
    let names = lines.next().unwrap_or_default();
    assert!(names.contains("KEEP_ME"), "{names}");
    for never in [
        "OPENCODE_SERVER_PASSWORD",
        "FRO_BOT_AGENT_NETWORK",
        "FRO_BOT_AGENT_SIBLING",
    ] {
        assert!(
            !names.contains(never),
            "{never} reached the command: {names}"
        );
    }
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-stderr\n");
}

#[test]
fn the_agents_commands_cannot_reach_the_relay_and_a_wrapper_that_cannot_never_runs_here() {
    let Some(relay) = Relay::start(AGENT, None) else {
        return;
    };
    // The agent's uid without the memory group: the directory is not its to enter.
    let exec = relay.exec();
    let mut probe = Command::new("/bin/sh");
    probe
        .args(["-c", "[ -S \"$0\" ] && echo seen || echo unseen"])
        .arg(&exec)
        .uid(AGENT)
        .gid(AGENT);
    let seen = String::from_utf8_lossy(&probe.output().unwrap().stdout).into_owned();
    assert_eq!(
        seen.trim(),
        "unseen",
        "the agent's uid cannot even see the socket"
    );
    let r = UnixStream::connect(&exec);
    assert!(r.is_ok(), "root (fro-bot) can");
    // A wrapper whose relay is gone fails the command; it never runs it itself.
    let marker = relay.dir.path().join("..").join("fro-bot-sibling-ran-here");
    let _ = std::fs::remove_file(&marker);
    let mut c = Command::new(relay.wrapper());
    c.args(["-c", &format!("touch {}", marker.display())])
        .env("FRO_BOT_AGENT_SIBLING", "/nonexistent/exec.sock")
        .current_dir("/");
    as_opencode(&mut c);
    let out = c.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(126),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !marker.exists(),
        "the command ran outside the agent's container"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run in its container"));
}

/// A `sleep` the command starts, by the pid it wrote to `file`.
fn pid_in(file: &Path) -> i32 {
    let mut pid = 0;
    until("the command wrote its pid", || {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(file) {
            let _ = f.read_to_string(&mut s);
        }
        pid = s.trim().parse().unwrap_or(0);
        pid > 0
    });
    pid
}

#[test]
fn a_signal_is_passed_on_and_the_wrappers_or_fro_bots_end_kills_the_command() {
    let Some(relay) = Relay::start(AGENT, None) else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // SIGTERM reaches the command's trap; it ends as it chose.
    let pidfile = scratch.path().join("a");
    let mut child = command(
        &relay,
        &format!(
            "trap 'echo got-term; exit 3' TERM; echo $$ > {}; sleep 30 & wait",
            pidfile.display()
        ),
        &[],
    )
    .spawn()
    .unwrap();
    pid_in(&pidfile);
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(status.code(), Some(3), "{out}");
    assert_eq!(out.trim(), "got-term");
    // SIGKILL of the wrapper (OpenCode ending a command): the command's group dies with it.
    let pidfile = scratch.path().join("b");
    let mut child = command(
        &relay,
        &format!("sleep 300 & echo $! > {}; wait", pidfile.display()),
        &[],
    )
    .spawn()
    .unwrap();
    let sleeper = pid_in(&pidfile);
    child.kill().unwrap();
    child.wait().unwrap();
    until("the command died with its wrapper", || !alive(sleeper));
    // fro-bot's lifeline ends: every command still running is killed and the relay exits.
    let pidfile = scratch.path().join("c");
    let running = command(
        &relay,
        &format!("sleep 300 & echo $! > {}; wait", pidfile.display()),
        &[],
    )
    .spawn()
    .unwrap();
    let sleeper = pid_in(&pidfile);
    let mut relay = relay;
    relay.lifeline.take();
    until("the command died with the lifeline", || !alive(sleeper));
    until("the relay exited", || {
        matches!(relay.child.try_wait(), Ok(Some(_)))
    });
    // The wrapper ends too: as its command did (SIGKILL), or, when the relay was gone first,
    // saying its container ended before the command did.
    use std::os::unix::process::ExitStatusExt;
    let out = running.wait_with_output().unwrap();
    assert!(
        out.status.code() == Some(126) || out.status.signal() == Some(libc::SIGKILL),
        "{:?}",
        out.status
    );
}

#[test]
fn a_relay_never_runs_commands_as_root_or_with_arguments_fro_bot_did_not_write() {
    for args in [
        vec!["/tmp", "0", "0", "-", "abi=4;connect=;bind=;ip=tcp"],
        vec!["/tmp", "1001"],
        vec!["/tmp", "x", "1001", "-", "abi=4;connect=;bind=;ip=tcp"],
    ] {
        let out = Command::new(BIN)
            .arg("sibling-relay")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
