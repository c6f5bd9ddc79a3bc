//! The agent's container's exec relay (`fro-bot sibling-relay`, docs/security.md#the-agents-network)
//! run here as a process, on a directory laid out as fro-bot lays it out (root, setgid to the
//! memory group, 2710), with fro-bot's lifeline held; and the shell wrapper OpenCode would run as
//! `$SHELL`. Needs root (the relay switches uid). Used by `sibling::` and the benchmarks.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use fro_bot::confine::memory_group::MEMORY_GID;
use fro_bot::confine::sibling::{CTL_SOCKET, EGRESS_SOCKET, EXEC_SOCKET};

use super::action::BIN;

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A running relay; killed when dropped.
pub struct Relay {
    pub dir: tempfile::TempDir,
    pub child: Child,
    /// fro-bot's end: taken (dropped), the relay ends every command and exits.
    pub lifeline: Option<UnixStream>,
}

impl Relay {
    /// A relay running commands as `uid`, forwarding `127.0.0.1:<proxy_port>` (when given) to
    /// [`Relay::egress`]; `None` when this process is not root.
    pub fn start(uid: u32, proxy_port: Option<u16>) -> Option<Relay> {
        if !is_root() {
            eprintln!("skipped: the relay switches uid, which needs root");
            return None;
        }
        let abi = match fro_bot::confine::landlock::support(None) {
            fro_bot::confine::landlock::Support::Abi(v) => v,
            other => panic!("the relay needs Landlock: {}", other.describe()),
        };
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(0), Some(MEMORY_GID)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2710)).unwrap();
        let port = proxy_port.map_or("-".to_string(), |p| p.to_string());
        let child = Command::new(BIN)
            .args(["sibling-relay", &dir.path().to_string_lossy()])
            .args([&uid.to_string(), &uid.to_string(), &port])
            .arg(format!("abi={abi};connect=;bind=;ip=tcp"))
            .spawn()
            .unwrap();
        let ctl = dir.path().join(CTL_SOCKET);
        let t = Instant::now();
        let lifeline = loop {
            if let Ok(s) = UnixStream::connect(&ctl) {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the relay never listened"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        Some(Relay {
            dir,
            child,
            lifeline: Some(lifeline),
        })
    }

    /// Where the wrapper hands commands (`FRO_BOT_AGENT_SIBLING`).
    pub fn exec(&self) -> PathBuf {
        self.dir.path().join(EXEC_SOCKET)
    }

    /// Where the relay forwards its proxy port.
    pub fn egress(&self) -> PathBuf {
        self.dir.path().join(EGRESS_SOCKET)
    }

    /// The wrapper script OpenCode would run as `$SHELL` (`/bin/sh` its real shell), beside the
    /// relay's directory, in a place the agent's uid may read.
    pub fn wrapper(&self) -> PathBuf {
        let script = self.dir.path().join("..").join(format!(
            "fro-bot-sh-{}",
            self.dir.path().file_name().unwrap().to_string_lossy()
        ));
        // As fro-bot does: a copy the agent's uid can run when the build is under root's home.
        let exe = fro_bot::confine::agent_reachable_exe(Path::new(BIN)).unwrap();
        let line = format!("#!{} --agent-shell=/bin/sh\n", exe.display());
        std::fs::write(&script, line).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.lifeline.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
