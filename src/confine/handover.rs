//! Ownership for the turn. OpenCode's directories (the data dir with `opencode.db`, and its config,
//! cache and state dirs) are handed to the agent's uid and taken back before the checkpoint:
//! everything in them becomes fro-bot's again, without group/other write or set-id bits, and
//! whatever is not a plain file or directory (a symlink planted to make the save read another
//! file, a FIFO, a socket) is removed. The job's file-command files (and their directory when the
//! agent's uid owns it) are taken over for the turn ([`Take::ReadOnly`]) and given back as they
//! were; credentials are taken with [`Take::Hide`].

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("cannot hand {} to the agent", path.display())]
    Give {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot take {} back from the agent", path.display())]
    Take {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A path's owner and mode before the turn.
#[derive(Debug, Clone, Copy)]
struct Was {
    uid: u32,
    gid: u32,
    mode: u32,
}

/// One path taken for the turn, as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taken {
    pub path: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// `None` for a symlink (its mode is not its own).
    pub mode: Option<u32>,
}

/// Everything taken; [`give_back`] undoes it. Main keeps it in its state, so post can give back
/// what a killed main could not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakenOver {
    pub taken: Vec<Taken>,
}

/// How a file is taken for the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The agent must not read it (a credential): root, 0600.
    Hide,
    /// The agent must not write it, and the runner must still read it if the step is killed
    /// before it is given back (a file command): root, 0644. Its directory, when the agent's uid
    /// owns it, becomes root's for the turn with the sticky bit and group write, so the agent
    /// cannot replace the file and the runner's user (the directory's group) can still make the
    /// next step's files.
    ReadOnly,
}

fn lchown(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

/// What was handed over or taken over; [`Handover::restore`] undoes it (also on drop, as a net).
#[derive(Debug)]
pub struct Handover {
    /// Handed to the agent; taken back to `owner`.
    given: Vec<(PathBuf, Was)>,
    /// Taken from the runner's user; given back as they were.
    taken: TakenOver,
    owner: (u32, u32),
    done: bool,
}

impl Handover {
    pub fn new() -> Handover {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let owner = unsafe { (libc::geteuid(), libc::getegid()) };
        Handover {
            given: Vec::new(),
            taken: TakenOver::default(),
            owner,
            done: false,
        }
    }

    /// Creates `dir` if needed and gives it, and everything in it, to `uid:gid`.
    pub fn give_dir(&mut self, dir: &Path, uid: u32, gid: u32) -> Result<(), HandoverError> {
        let err = |source| HandoverError::Give {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let m = std::fs::symlink_metadata(dir).map_err(err)?;
        self.given.push((
            dir.to_path_buf(),
            Was {
                uid: m.uid(),
                gid: m.gid(),
                mode: m.mode() & 0o7777,
            },
        ));
        walk(dir, &mut |p, _| lchown(p, uid, gid)).map_err(err)
    }

    /// Hands `dir` to the memory group (docs/security.md#who-it-runs-as): the directory becomes
    /// `root:group 2770` (only a process holding the group enters it; what is made in it keeps
    /// the group), everything under it `uid:group`. Taken back like [`Self::give_dir`].
    pub fn give_dir_to_group(
        &mut self,
        dir: &Path,
        uid: u32,
        group: u32,
    ) -> Result<(), HandoverError> {
        self.give_dir(dir, uid, group)?;
        let err = |source| HandoverError::Give {
            path: dir.to_path_buf(),
            source,
        };
        lchown(dir, 0, group).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2770)).map_err(err)
    }

    /// Takes a file over for the turn, as `how` says. A missing file is skipped.
    pub fn take_file(
        &mut self,
        file: &Path,
        agent_uid: u32,
        how: Take,
    ) -> Result<(), HandoverError> {
        let err = |source| HandoverError::Give {
            path: file.to_path_buf(),
            source,
        };
        let Ok(m) = std::fs::symlink_metadata(file) else {
            return Ok(());
        };
        let mode = match how {
            Take::Hide => 0o600,
            Take::ReadOnly => 0o644,
        };
        if let Some(dir) = file.parent().filter(|_| how == Take::ReadOnly) {
            if let Ok(d) = std::fs::metadata(dir) {
                let already = self.taken.taken.iter().any(|t| t.path == dir);
                if d.uid() == agent_uid && !already {
                    let mode = (d.mode() & 0o755) | 0o1070;
                    self.take(dir, d, mode).map_err(err)?;
                }
            }
        }
        self.take(file, m, mode).map_err(err)
    }

    fn take(&mut self, path: &Path, m: std::fs::Metadata, mode: u32) -> std::io::Result<()> {
        self.taken.taken.push(Taken {
            path: path.to_path_buf(),
            uid: m.uid(),
            gid: m.gid(),
            mode: Some(m.mode() & 0o7777),
        });
        // The group stays: for a file command's directory it is the runner's user's.
        std::os::unix::fs::lchown(path, Some(self.owner.0), None)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    /// What is taken over for the turn (to give back when this process is killed first).
    pub fn taken(&self) -> &TakenOver {
        &self.taken
    }

    /// How many paths are handed or taken over.
    pub fn len(&self) -> usize {
        self.given.len() + self.taken.taken.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the directories back and gives the file-command files back. Call only when no
    /// process of the agent is left (a live one could race the walk). Every path is attempted;
    /// the first error is returned.
    pub fn restore(&mut self) -> Result<(), HandoverError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut first = None;
        let (uid, gid) = self.owner;
        for (dir, was) in std::mem::take(&mut self.given) {
            let r = walk(&dir, &mut |p, m| take_back(p, m, uid, gid)).and_then(|()| {
                lchown(&dir, was.uid, was.gid)?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(was.mode))
            });
            if let Err(source) = r {
                first.get_or_insert(HandoverError::Take { path: dir, source });
            }
        }
        if let Err(e) = give_back(&std::mem::take(&mut self.taken)) {
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }
}

impl Default for Handover {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Handover {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("{e}");
        }
    }
}

/// Gives every taken path back its owner and mode, last taken first (files before their
/// directory). Every path is attempted; the first error is returned. A path that is gone, or that
/// is now a symlink where a file was (never followed), is skipped.
pub fn give_back(t: &TakenOver) -> Result<(), HandoverError> {
    let mut first = None;
    for taken in t.taken.iter().rev() {
        let r = std::fs::symlink_metadata(&taken.path).and_then(|now| {
            if now.file_type().is_symlink() && taken.mode.is_some() {
                return Ok(());
            }
            lchown(&taken.path, taken.uid, taken.gid)?;
            match taken.mode {
                Some(mode) => {
                    std::fs::set_permissions(&taken.path, std::fs::Permissions::from_mode(mode))
                }
                None => Ok(()),
            }
        });
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                first.get_or_insert(HandoverError::Take {
                    path: taken.path.clone(),
                    source,
                });
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// One entry of the agent's tree back to fro-bot: plain files and directories are chowned and lose
/// group/other write and the set-id bits; anything else is removed.
fn take_back(path: &Path, m: &std::fs::Metadata, uid: u32, gid: u32) -> std::io::Result<()> {
    let ft = m.file_type();
    if !(ft.is_file() || ft.is_dir()) {
        tracing::warn!(
            "removed {} from OpenCode's directories: not a plain file or directory",
            path.display()
        );
        return std::fs::remove_file(path);
    }
    lchown(path, uid, gid)?;
    let mode = m.mode() & 0o0755;
    if mode != m.mode() & 0o7777 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Visits `root` and everything under it (never following a symlink), children before their
/// directory, so a visit may remove what it sees.
pub(super) fn walk(
    root: &Path,
    visit: &mut dyn FnMut(&Path, &std::fs::Metadata) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(root)?;
    if m.is_dir() {
        for entry in std::fs::read_dir(root)? {
            let entry = entry?;
            // `.` and `..` never appear; a name with a slash cannot exist.
            debug_assert!(!entry.file_name().as_bytes().contains(&b'/'));
            walk(&entry.path(), visit)?;
        }
    }
    visit(root, &m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_handed_dir_comes_back_owned_and_without_planted_links() {
        if !is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("data/opencode");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("opencode.db"), "db").unwrap();
        let mut h = Handover::new();
        h.give_dir(&dir, 1001, 1001).unwrap();
        assert_eq!(
            std::fs::metadata(dir.join("opencode.db")).unwrap().uid(),
            1001
        );
        // What an agent could leave: a world-writable setuid file and a link to a secret.
        std::fs::write(dir.join("new"), "x").unwrap();
        std::fs::set_permissions(dir.join("new"), std::fs::Permissions::from_mode(0o4777)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.join("opencode.db-wal")).unwrap();
        h.restore().unwrap();
        let m = std::fs::metadata(dir.join("new")).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755));
        assert!(std::fs::symlink_metadata(dir.join("opencode.db-wal")).is_err());
        assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 0);
    }

    #[test]
    fn the_memory_dir_is_the_groups_for_the_turn_and_roots_after() {
        if !is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("opencode");
        std::fs::create_dir_all(dir.join("log")).unwrap();
        std::fs::write(dir.join("opencode.db"), "db").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut h = Handover::new();
        h.give_dir_to_group(&dir, 1001, 65533).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 65533, 0o2770));
        let db = std::fs::metadata(dir.join("opencode.db")).unwrap();
        assert_eq!((db.uid(), db.gid()), (1001, 65533));
        h.restore().unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o755));
        let db = std::fs::metadata(dir.join("opencode.db")).unwrap();
        assert_eq!((db.uid(), db.gid()), (0, 0));
    }

    #[test]
    fn file_commands_are_taken_for_the_turn_and_given_back() {
        if !is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("file_commands");
        std::fs::create_dir(&dir).unwrap();
        let f = dir.join("set_env");
        std::fs::write(&f, "").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        lchown(&dir, 1001, 1001).unwrap();
        lchown(&f, 1001, 1001).unwrap();
        let mut h = Handover::new();
        h.take_file(&f, 1001, Take::ReadOnly).unwrap();
        h.take_file(&dir.join("missing"), 1001, Take::ReadOnly)
            .unwrap();
        let (fm, dm) = (
            std::fs::metadata(&f).unwrap(),
            std::fs::metadata(&dir).unwrap(),
        );
        assert_eq!(
            (fm.uid(), fm.mode() & 0o777),
            (0, 0o644),
            "the runner can still read it if the step is killed"
        );
        assert_eq!(
            (dm.uid(), dm.gid(), dm.mode() & 0o7777),
            (0, 1001, 0o1775),
            "the agent cannot replace the file; the runner's group can make new ones"
        );
        drop(h);
        let (fm, dm) = (
            std::fs::metadata(&f).unwrap(),
            std::fs::metadata(&dir).unwrap(),
        );
        assert_eq!((fm.uid(), fm.gid(), fm.mode() & 0o777), (1001, 1001, 0o644));
        assert_eq!(dm.uid(), 1001);
    }
}
