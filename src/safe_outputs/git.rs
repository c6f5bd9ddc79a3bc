//! git under a configuration fro-bot controls (docs/security.md#the-agent-proposes-fro-bot-disposes).
//!
//! The work tree and its `.git` belong to the agent for its turn: a hook, `core.fsmonitor`, an
//! `include.path`, an attribute filter or an alias written there must never run when fro-bot reads
//! the change. So every git command here runs with an empty environment, no system or global
//! config, a private `HOME`, and overrides for every setting that can start a program; after the
//! turn git never reads the workspace's `.git` at all — only a private git dir of fro-bot's whose
//! object store borrows the workspace's objects read-only (`capture`).

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Settings that could run a program or change what is read, pinned on every command line
/// (command-line config wins over any config file, included ones too).
const PINNED: &[&str] = &[
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.untrackedCache=false",
    "core.autocrlf=false",
    "core.symlinks=true",
    "core.filemode=true",
    "core.quotePath=false",
    "core.sshCommand=false",
    "core.askPass=",
    "credential.helper=",
    "safe.directory=*",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.allow=never",
    "protocol.https.allow=always",
    "protocol.http.allow=always",
];

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot run git {args}")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("git {args} failed ({status}): {stderr}")]
    Failed {
        args: String,
        status: String,
        stderr: String,
    },
}

/// One git invocation in a sealed environment.
pub struct Git {
    cmd: Command,
    args: Vec<String>,
}

impl Git {
    /// `git` run in `dir`, with `home` as its `HOME` (an empty private directory) and only `PATH`
    /// and the locale passed on.
    pub fn new(dir: &Path, home: &Path) -> Git {
        let mut cmd = Command::new("git");
        cmd.current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .stdin(Stdio::null());
        for setting in PINNED {
            cmd.arg("-c").arg(setting);
        }
        Git {
            cmd,
            args: Vec::new(),
        }
    }

    /// For a command that reaches GitHub: the runner proxy's settings (`crate::net::git_vars`).
    pub fn with_network(mut self) -> Git {
        self.cmd.envs(crate::net::git_vars());
        self
    }

    /// Sets an environment variable (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, ...).
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Git {
        self.cmd.env(key, value);
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Git
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self.args.push(a.as_ref().to_string_lossy().into_owned());
            self.cmd.arg(a);
        }
        self
    }

    /// Runs it; stdout on success.
    pub fn output(self) -> Result<Vec<u8>, GitError> {
        self.output_with(None)
    }

    /// Runs it with `input` on stdin; stdout on success.
    pub fn output_with(mut self, input: Option<&[u8]>) -> Result<Vec<u8>, GitError> {
        let args = self.args.join(" ");
        self.cmd
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.cmd.spawn().map_err(|source| GitError::Spawn {
            args: args.clone(),
            source,
        })?;
        let writer = match (input, child.stdin.take()) {
            (Some(bytes), Some(mut stdin)) => {
                let bytes = bytes.to_vec();
                Some(std::thread::spawn(move || stdin.write_all(&bytes)))
            }
            _ => None,
        };
        let out = child.wait_with_output().map_err(|source| GitError::Spawn {
            args: args.clone(),
            source,
        })?;
        if let Some(w) = writer {
            // A write error shows as git's own failure below; the thread itself cannot panic.
            let _ = w.join();
        }
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(GitError::Failed {
                args,
                status: out.status.to_string(),
                stderr: crate::redact::redact(stderr.trim()),
            });
        }
        Ok(out.stdout)
    }

    /// Runs it for its trimmed, one-line stdout.
    pub fn line(self) -> Result<String, GitError> {
        let out = self.output()?;
        Ok(String::from_utf8_lossy(&out).trim().to_string())
    }
}

/// A private, empty `HOME` for git (so no `~/.gitconfig` of anyone's is read).
pub fn private_home(scratch: &Path) -> std::io::Result<PathBuf> {
    let home = scratch.join("home");
    std::fs::create_dir_all(&home)?;
    Ok(home)
}

/// Whether `s` is a full object id (40 or 64 lowercase hex digits).
pub fn is_oid(s: &str) -> bool {
    matches!(s.len(), 40 | 64)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Git {
    /// Runs as `owner` (uid, gid) instead of fro-bot's own user, when given.
    pub fn as_owner(mut self, owner: Option<(u32, u32)>) -> Git {
        use std::os::unix::process::CommandExt;
        if let Some((uid, gid)) = owner {
            // std drops the supplementary groups itself when root switches uid.
            self.cmd.uid(uid).gid(gid);
        }
        self
    }
}
