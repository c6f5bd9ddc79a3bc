//! The runner's home and the event payload are not the agent's
//! (docs/security.md#what-it-leaves-behind). Later container steps of the job read `/github/home`
//! (`.gitconfig`, `.bashrc`, `.npmrc`, `.ssh/`) and `/github/workflow` (the event payload): for the
//! turn, everything there that the agent's uid owns — except fro-bot's memory directories, which
//! are handed to the agent separately — becomes fro-bot's without group/other write, and is given
//! back exactly afterwards. The agent's own `HOME` is a private directory of the run's.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use super::handover::{Taken, TakenOver};

/// At most this many paths are taken (a home with more is left as it is, and the summary says so).
const MAX_TAKEN: usize = 200_000;

#[derive(Debug, thiserror::Error)]
pub enum HomeGuardError {
    #[error("cannot take {} over for the turn", path.display())]
    Take {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} holds over {MAX_TAKEN} paths", root.display())]
    TooMany { root: PathBuf },
    #[error("cannot give the runner's home back")]
    GiveBack {
        #[source]
        source: super::handover::HandoverError,
    },
}

/// Takes over everything under each root owned by `agent_uid`, except the subtrees in `keep`.
/// On error, what was taken so far is given back before returning.
pub fn take(
    roots: &[PathBuf],
    keep: &[PathBuf],
    agent_uid: u32,
) -> Result<TakenOver, HomeGuardError> {
    let mut out = TakenOver::default();
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let me = unsafe { (libc::geteuid(), libc::getegid()) };
    for root in roots {
        if let Err(e) = walk(root, keep, agent_uid, me, &mut out) {
            let _ = give_back(&out);
            return Err(e);
        }
    }
    Ok(out)
}

fn walk(
    path: &Path,
    keep: &[PathBuf],
    agent_uid: u32,
    me: (u32, u32),
    out: &mut TakenOver,
) -> Result<(), HomeGuardError> {
    if keep.iter().any(|k| path == k) {
        return Ok(());
    }
    let err = |source| HomeGuardError::Take {
        path: path.to_path_buf(),
        source,
    };
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let ft = m.file_type();
    if m.uid() == agent_uid {
        if out.taken.len() >= MAX_TAKEN {
            return Err(HomeGuardError::TooMany {
                root: path.to_path_buf(),
            });
        }
        let mode = (!ft.is_symlink()).then_some(m.mode() & 0o7777);
        out.taken.push(Taken {
            path: path.to_path_buf(),
            uid: m.uid(),
            gid: m.gid(),
            mode,
        });
        std::os::unix::fs::lchown(path, Some(me.0), Some(me.1)).map_err(err)?;
        if let Some(mode) = mode {
            let strict = mode & !0o022 & !0o6000;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(strict)).map_err(err)?;
        }
    }
    if ft.is_dir() {
        for e in std::fs::read_dir(path).map_err(err)?.flatten() {
            walk(&e.path(), keep, agent_uid, me, out)?;
        }
    }
    Ok(())
}

/// Gives every taken path back its owner and mode ([`give_back`] of the handover).
pub fn give_back(t: &TakenOver) -> Result<(), HomeGuardError> {
    super::handover::give_back(t).map_err(|source| HomeGuardError::GiveBack { source })
}

/// A private home for the agent: a fresh 0700 directory owned by `uid:gid`, removed with the value.
pub fn private_home(uid: u32, gid: u32) -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("fro-bot-agent-home-")
        .tempdir()?;
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_agent_owns_is_taken_except_memory_and_given_back_exactly() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        let memory = home.join(".local/share/opencode");
        std::fs::create_dir_all(&memory).unwrap();
        std::fs::create_dir_all(home.join(".config/git")).unwrap();
        std::fs::write(home.join(".bashrc"), "x").unwrap();
        std::fs::write(memory.join("opencode.db"), "db").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", home.join("link")).unwrap();
        let status = std::process::Command::new("chown")
            .args(["-hR", "1001:1001"])
            .arg(&home)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::set_permissions(home.join(".bashrc"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let taken = take(
            std::slice::from_ref(&home),
            std::slice::from_ref(&memory),
            1001,
        )
        .unwrap();
        let m = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        assert_eq!(m(&home).uid(), 0);
        assert_eq!(m(&home.join(".bashrc")).uid(), 0);
        assert_eq!(
            m(&home.join(".bashrc")).mode() & 0o777,
            0o644,
            "no group/other write"
        );
        assert_eq!(m(&home.join("link")).uid(), 0);
        assert_eq!(m(&memory).uid(), 1001, "memory stays the agent's");
        assert_eq!(m(&memory.join("opencode.db")).uid(), 1001);
        give_back(&taken).unwrap();
        for p in [
            &home,
            &home.join(".bashrc"),
            &home.join(".config/git"),
            &home.join("link"),
        ] {
            assert_eq!(m(p).uid(), 1001, "{}", p.display());
        }
        assert_eq!(
            m(&home.join(".bashrc")).mode() & 0o777,
            0o666,
            "mode back exactly"
        );
    }
}
