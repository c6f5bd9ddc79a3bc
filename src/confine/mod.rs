//! Confining the agent (`docs/security.md#the-agent-is-confined`): OpenCode reads text anyone can
//! write, so it is treated as prompt-injected. It runs as an unprivileged user ([`AgentUser`], this
//! file) with no supplementary groups, no capabilities and `no_new_privs`, in its own process group,
//! from a private copy of its binary ([`PrivateBinary`]); its environment is an allowlist (`env`);
//! its commands are kept out of memory (`memory_group`); the files it needs are handed to it for the
//! turn and taken back (`handover`), and the job's file-command files, the checkout's credentials
//! (`gitcreds`), `.git` (`git_guard`) and the runner's home (`home_guard`) are out of its reach; it
//! holds no model key (`key_proxy`); its network is the kernel's to limit (`network`, `landlock`,
//! `seccomp`); whatever it leaves running is killed before the checkpoint (`strays`, `watchdog`).

pub mod env;
pub mod git_guard;
pub mod gitcreds;
pub mod handover;
pub mod home_guard;
pub mod key_proxy;
pub mod landlock;
pub mod memory_group;
pub mod network;
pub mod seccomp;
pub mod sibling;
pub mod spend;
pub mod strays;
pub mod watchdog;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The uid the agent gets when the workspace belongs to root (a self-hosted runner running as
/// root): `nobody`, which owns nothing.
pub const DEDICATED_UID: u32 = 65534;
pub const DEDICATED_GID: u32 = 65534;

/// Where the Docker daemon's socket is mounted into every container action.
pub const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// First thing in `main`: no other process of the agent's uid may read fro-bot's memory or
/// environment (`/proc/<pid>/environ`, `mem`), and orphans of the agent are re-parented to
/// fro-bot so none escapes the stray sweep (a `setsid` double fork included).
pub fn harden_self() -> std::io::Result<()> {
    // SAFETY: plain prctl calls with integer arguments; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as above.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Who the agent runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentUser {
    /// fro-bot is root and switches the agent to this unprivileged user.
    Switched { uid: u32, gid: u32, why: UidChoice },
    /// fro-bot is not root (e.g. a developer's `fro-bot local`), or is root in a local run on its
    /// own checkout: the agent runs as the current user, unconfined by uid.
    Current { uid: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UidChoice {
    /// The workspace's owner (the runner's user, 1001 on hosted runners).
    WorkspaceOwner,
    /// The workspace belongs to root: a dedicated unprivileged uid, which cannot write it.
    Dedicated,
}

impl AgentUser {
    /// The workspace owner's uid/gid when fro-bot is root; never uid or gid 0, and never the group
    /// of the Docker socket (on hosted runners the runner's primary group is `docker`).
    pub fn choose(workspace: &Path) -> AgentUser {
        // SAFETY: geteuid cannot fail and touches no memory.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return AgentUser::Current { uid: euid };
        }
        let owner = std::fs::metadata(workspace)
            .ok()
            .map(|m| (m.uid(), m.gid()));
        let docker_gid = std::fs::metadata(DOCKER_SOCKET).ok().map(|m| m.gid());
        Self::pick(owner, docker_gid)
    }

    /// Who the agent runs as in `fro-bot local`: whoever runs fro-bot, as on a laptop, except
    /// that root on a checkout someone else owns runs the agent as that owner, as the action does.
    /// Root on its own checkout (a dev container, `docker run` of the image) keeps root: the user
    /// asked for an agent that edits that checkout, which no other uid could.
    pub fn choose_local(workspace: &Path) -> AgentUser {
        match Self::choose(workspace) {
            AgentUser::Switched {
                why: UidChoice::Dedicated,
                ..
            } => AgentUser::Current { uid: 0 },
            user => user,
        }
    }

    fn pick(owner: Option<(u32, u32)>, docker_gid: Option<u32>) -> AgentUser {
        match owner {
            Some((uid, gid)) if uid != 0 => {
                let gid = if gid == 0 || Some(gid) == docker_gid {
                    // Its own-numbered group: no group access to anything of root's or Docker's.
                    uid
                } else {
                    gid
                };
                AgentUser::Switched {
                    uid,
                    gid,
                    why: UidChoice::WorkspaceOwner,
                }
            }
            _ => AgentUser::Switched {
                uid: DEDICATED_UID,
                gid: DEDICATED_GID,
                why: UidChoice::Dedicated,
            },
        }
    }

    pub fn uid(&self) -> u32 {
        match *self {
            AgentUser::Switched { uid, .. } | AgentUser::Current { uid } => uid,
        }
    }

    pub fn is_switched(&self) -> bool {
        matches!(self, AgentUser::Switched { .. })
    }

    /// One line for the log and the job summary.
    pub fn describe(&self) -> String {
        match self {
            AgentUser::Switched {
                uid,
                gid,
                why: UidChoice::WorkspaceOwner,
            } => format!("the agent runs as uid {uid}, gid {gid} (the workspace's owner)"),
            AgentUser::Switched {
                uid,
                gid,
                why: UidChoice::Dedicated,
            } => format!(
                "the workspace belongs to root, so the agent runs as the dedicated uid {uid}, \
                 gid {gid}: it can read the workspace but not write it"
            ),
            AgentUser::Current { uid: 0 } => {
                "the agent runs as root (uid 0), as fro-bot does: the checkout is root's".into()
            }
            AgentUser::Current { uid } => format!(
                "the agent runs as the current user (uid {uid}), as fro-bot does: no uid switch"
            ),
        }
    }

    /// Sets the child up to drop to this user: own process group, and (when switching) a pre-exec
    /// hook that clears supplementary groups, sets gid then uid, and sets `no_new_privs`. After
    /// the switch from root, no capability remains (`SECBIT_KEEP_CAPS` is never set). The parent
    /// death signal is set last, as a credential change clears it (an exec with the memory group
    /// clears it again: [`watchdog`] covers OpenCode).
    pub fn confine(&self, cmd: &mut tokio::process::Command) {
        self.confine_opencode(cmd, None, None);
    }

    /// [`Self::confine`], with the effective (and saved) gid `memory_group` when given: OpenCode's
    /// way into the memory dir, which its shell wrapper drops ([`memory_group`]). Its real gid
    /// stays the agent's. `network`: the agent's Landlock domain and system-call filter
    /// ([`network`]), entered after `no_new_privs`, so everything OpenCode starts inherits it.
    pub fn confine_opencode(
        &self,
        cmd: &mut tokio::process::Command,
        memory_group: Option<u32>,
        network: Option<network::Enforcement>,
    ) {
        cmd.process_group(0);
        let ids = match *self {
            AgentUser::Switched { uid, gid, .. } => Some((uid, gid, memory_group.unwrap_or(gid))),
            AgentUser::Current { .. } => None,
        };
        // SAFETY: the closure runs between fork and exec: it only makes raw syscalls
        // (async-signal-safe), allocates nothing and touches no lock.
        unsafe {
            cmd.pre_exec(move || {
                if let Some((uid, gid, egid)) = ids {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setresgid(gid, egid, egid) != 0
                        || libc::setresuid(uid, uid, uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    // Never exec as root by accident: a failed switch must not go unnoticed.
                    if libc::getuid() != uid
                        || libc::geteuid() != uid
                        || libc::getgid() != gid
                        || libc::getegid() != egid
                    {
                        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
                    }
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A failure here fails the spawn: the agent never runs unenforced by accident.
                if let Some(network) = &network {
                    network.apply()?;
                }
                #[cfg(target_os = "linux")]
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
}

/// A root-owned, execute-only OpenCode for a switched agent. A process that executes a file it
/// cannot read is not dumpable: other processes of its uid (the agent's shell) cannot read its
/// `/proc/<pid>/environ` or memory. The located binary is used in place when root owns it and its
/// directories and the agent's uid can reach it (its read bits are dropped: the image's copy);
/// otherwise a root-owned copy is made once under `/tmp/fro-bot-agent-bin/` and reused (copying
/// 185 MB costs seconds). Also holds the shell wrapper (see [`PrivateBinary::shell`]).
#[derive(Debug)]
pub struct PrivateBinary {
    dir: tempfile::TempDir,
    path: PathBuf,
    shell: Option<PathBuf>,
    /// The memory group OpenCode starts with: set when the shell wrapper is fro-bot's, which
    /// drops it ([`memory_group`]).
    memory_group: Option<u32>,
}

const BIN_CACHE: &str = "/tmp/fro-bot-agent-bin";

/// `value` as JSON in a fresh fro-bot-owned 0644 file under the system temp dir: the agent's uid
/// (the session and proposal tools run as it) can read it but not change it. It lives as long as
/// the returned handle.
pub fn agent_readable_json<T: serde::Serialize>(
    prefix: &str,
    value: &T,
) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let mut file = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(".json")
        .tempfile()?;
    file.write_all(&serde_json::to_vec(value).map_err(std::io::Error::other)?)?;
    file.flush()?;
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o644))?;
    Ok(file)
}

/// Root-owned and writable by root only.
fn root_only_writable(m: &std::fs::Metadata) -> bool {
    m.uid() == 0 && m.mode() & 0o022 == 0
}

/// `bin` usable in place: root's, and every directory above it root's and enterable by others.
fn usable_in_place(bin: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(bin) else {
        return false;
    };
    m.is_file()
        && root_only_writable(&m)
        && m.mode() & 0o001 != 0
        && bin.ancestors().skip(1).all(|d| {
            std::fs::metadata(d).is_ok_and(|m| root_only_writable(&m) && m.mode() & 0o001 != 0)
        })
}

impl PrivateBinary {
    /// `path_var`: the agent's `PATH`, where its shell is looked up. `fro_bot`: fro-bot as the
    /// agent's uid can start it, to be the shell wrapper's interpreter; without it the wrapper is
    /// a plain script and OpenCode gets no memory group.
    pub fn prepare(
        bin: &Path,
        path_var: Option<&str>,
        fro_bot: Option<&Path>,
    ) -> std::io::Result<PrivateBinary> {
        let dir = tempfile::Builder::new()
            .prefix("fro-bot-agent-shell-")
            .tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let path = if usable_in_place(bin) {
            let mode = std::fs::metadata(bin)?.mode() & 0o7777;
            if mode & 0o044 != 0 {
                std::fs::set_permissions(bin, std::fs::Permissions::from_mode(mode & !0o044))?;
            }
            bin.to_path_buf()
        } else {
            cached_copy(bin, "opencode")?
        };
        let (shell, memory_group) = match Self::shell_wrapper(dir.path(), path_var, fro_bot)? {
            Some((shell, drops_group)) => {
                (Some(shell), drops_group.then_some(memory_group::MEMORY_GID))
            }
            None => (None, None),
        };
        Ok(PrivateBinary {
            dir,
            path,
            shell,
            memory_group,
        })
    }

    /// OpenCode runs its shell tool's commands with `$SHELL` and its own environment: a wrapper
    /// named after the real shell drops OpenCode's variables (and, when fro-bot is its
    /// interpreter, the memory group: the `bool`) before running it. `None` when no `bash` or `sh`
    /// is on `PATH`.
    fn shell_wrapper(
        dir: &Path,
        path_var: Option<&str>,
        fro_bot: Option<&Path>,
    ) -> std::io::Result<Option<(PathBuf, bool)>> {
        let search = path_var.unwrap_or("/usr/bin:/bin");
        let find = |name: &str| {
            search
                .split(':')
                .map(|d| Path::new(d).join(name))
                .find(|p| p.is_file())
        };
        let Some((name, real)) = ["bash", "sh"]
            .into_iter()
            .find_map(|n| find(n).map(|p| (n, p)))
        else {
            return Ok(None);
        };
        let wrapper = dir.join(name);
        let by_fro_bot = fro_bot.and_then(|exe| memory_group::wrapper_script(exe, &real));
        let drops_group = by_fro_bot.is_some();
        let script = by_fro_bot.unwrap_or_else(|| {
            format!(
                "#!{}\nunset {}\nexec {} \"$@\"\n",
                real.display(),
                memory_group::OPENCODE_ONLY.join(" "),
                real.display()
            )
        });
        std::fs::write(&wrapper, script)?;
        // A script must be readable to run; it holds nothing secret.
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(Some((wrapper, drops_group)))
    }

    /// The effective gid OpenCode starts with ([`memory_group`]); `None`: today's same-group shape.
    pub fn memory_group(&self) -> Option<u32> {
        self.memory_group
    }

    /// The `SHELL` for OpenCode.
    pub fn shell(&self) -> Option<&Path> {
        self.shell.as_deref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The fro-bot executable as the agent's uid can start it: OpenCode starts the session tools
/// (`fro-bot session-tools`) as that uid, which may not reach fro-bot's own path (a build under
/// root's 0700 home). Used in place when root owns it and every directory above it lets others
/// through (the image's `/usr/local/bin/fro-bot`); otherwise an execute-only copy under
/// [`BIN_CACHE`]. Each use marks its copy fresh; copies of other builds unused for a day are
/// removed, as each is as large as the binary.
pub fn agent_reachable_exe(exe: &Path) -> std::io::Result<PathBuf> {
    if usable_in_place(exe) {
        return Ok(exe.to_path_buf());
    }
    let path = cached_copy(exe, "fro-bot")?;
    // Read-only is enough for the owner to set times (opening a running binary to write is not).
    std::fs::File::open(&path)?.set_modified(std::time::SystemTime::now())?;
    prune_copies("fro-bot-", &path, std::time::Duration::from_secs(24 * 3600));
    Ok(path)
}

/// Best effort: removes `{prefix}*` copies other than `keep` not modified for `age`.
fn prune_copies(prefix: &str, keep: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(BIN_CACHE) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if stale && path != keep && entry.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A root-owned, execute-only copy of `bin` under [`BIN_CACHE`] named `{name}-{hash}`, made once
/// per build of `bin` and reused.
fn cached_copy(bin: &Path, name: &str) -> std::io::Result<PathBuf> {
    use sha2::{Digest, Sha256};
    let m = std::fs::metadata(bin)?;
    let key = Sha256::digest(format!(
        "{}\0{}\0{:?}",
        bin.display(),
        m.len(),
        m.modified().ok()
    ));
    let cache = Path::new(BIN_CACHE);
    if let Err(e) = std::fs::create_dir(cache) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    let cm = std::fs::symlink_metadata(cache)?;
    if !cm.is_dir() || !root_only_writable(&cm) {
        return Err(std::io::Error::other(format!(
            "{BIN_CACHE} is not a directory only root can write"
        )));
    }
    std::fs::set_permissions(cache, std::fs::Permissions::from_mode(0o711))?;
    let path = cache.join(format!("{name}-{}", &hex::encode(key)[..16]));
    if let Ok(existing) = std::fs::symlink_metadata(&path) {
        if existing.is_file()
            && existing.len() == m.len()
            && root_only_writable(&existing)
            && existing.mode() & 0o7777 == 0o711
        {
            return Ok(path);
        }
    }
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(cache)?;
    std::fs::copy(bin, partial.path())?;
    std::fs::set_permissions(partial.path(), std::fs::Permissions::from_mode(0o711))?;
    partial.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_never_root_nor_in_the_docker_group() {
        let owner = AgentUser::pick(Some((1001, 118)), Some(118));
        assert_eq!(
            owner,
            AgentUser::Switched {
                uid: 1001,
                gid: 1001,
                why: UidChoice::WorkspaceOwner
            }
        );
        assert_eq!(
            AgentUser::pick(Some((1001, 1001)), Some(118)),
            AgentUser::Switched {
                uid: 1001,
                gid: 1001,
                why: UidChoice::WorkspaceOwner
            }
        );
        assert_eq!(
            AgentUser::pick(Some((1001, 0)), None),
            AgentUser::Switched {
                uid: 1001,
                gid: 1001,
                why: UidChoice::WorkspaceOwner
            }
        );
        for root_owned in [Some((0, 0)), None] {
            assert_eq!(
                AgentUser::pick(root_owned, None),
                AgentUser::Switched {
                    uid: DEDICATED_UID,
                    gid: DEDICATED_GID,
                    why: UidChoice::Dedicated
                }
            );
        }
    }
}
