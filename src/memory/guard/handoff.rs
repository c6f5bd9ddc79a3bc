//! The memory guard's copy, handed to the post step (docs/persistence.md#a-turn-cut-short). Main
//! and post run as separate containers that share `RUNNER_TEMP`, which the agent's uid may be
//! able to write: the copy goes into a fresh directory there that only fro-bot's own uid can
//! enter (0700), as one file (its WAL folded in), and main's state — which the agent cannot
//! write — records where it is and its SHA-256 (`Handoff`), as the `.git` guard records its
//! snapshot (`confine::git_guard::persist`). Post believes the copy only when the directory is
//! still a real directory of its own uid with mode 0700 and the file still a plain file of its
//! own whose digest is the recorded one (`Handoff::verify`); anything else is named
//! (`HandoffError`) and nothing is saved.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::memory::checkpoint::{self, CheckpointOutcome};

/// The copy's name inside its directory.
pub(super) const COPY: &str = "opencode.db";
/// The directory's name starts with this.
const PREFIX: &str = "fro-bot-memory-";

/// Where main kept the copy for post, as main's state records it (`state::MEMORY_HANDOFF`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// The directory main made (0700, its own uid), holding the copy.
    pub dir: PathBuf,
    /// The copy's SHA-256, hex.
    pub sha256: String,
    /// The restored memory was fro-bot's scrubbed memory (`Provenance::Scrubbed`), so the rebuild
    /// scrubs only this run's trees, as main's does.
    pub scrubbed: bool,
}

/// Why post does not believe the copy, or cannot read it.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("the main step's record of the memory guard's copy cannot be read ({message})")]
    Record { message: String },
    #[error("the memory guard's copy was kept out of the post step's reach (`RUNNER_TEMP` was not a directory the main step could use)")]
    OutOfReach,
    #[error("the memory guard's directory `{}` is gone ({source})", path.display())]
    Missing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is a link, not the directory the main step made", path.display())]
    Link { path: PathBuf },
    #[error("`{}` is no longer the directory the main step made", path.display())]
    NotADirectory { path: PathBuf },
    #[error("`{}` belongs to uid {uid}, not to fro-bot's", path.display())]
    Owner { path: PathBuf, uid: u32 },
    #[error("`{}` has mode {mode:o}, not 700", path.display())]
    Mode { path: PathBuf, mode: u32 },
    #[error("`{}` is not the plain file the main step wrote", path.display())]
    NotAFile { path: PathBuf },
    #[error("`{}` does not match the SHA-256 the main step recorded", path.display())]
    Mismatch { path: PathBuf },
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the memory guard's copy cannot be read as a database: {message}")]
    Snapshot { message: String },
}

/// A fresh directory under `parent` only this uid can enter.
pub(super) fn make_dir(parent: &Path) -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix(PREFIX).tempdir_in(parent)?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// Folds the copy's WAL into it and removes its sidecars: the copy is then one file, whose digest
/// is all of it.
pub(super) fn single_file(copy: &Path) -> std::io::Result<()> {
    if let CheckpointOutcome::Failed { message, .. } = checkpoint::checkpoint(copy) {
        return Err(std::io::Error::other(message));
    }
    for suffix in ["-wal", "-shm"] {
        let side = checkpoint::sibling(copy, suffix);
        match std::fs::metadata(&side) {
            Ok(m) if suffix == "-wal" && m.len() > 0 => {
                return Err(std::io::Error::other("the copy's WAL was not folded in"))
            }
            Ok(_) => std::fs::remove_file(&side)?,
            Err(_) => {}
        }
    }
    Ok(())
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

fn own_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

impl Handoff {
    /// The record of `copy` in `dir`.
    pub(super) fn of(dir: &Path, copy: &Path, scrubbed: bool) -> std::io::Result<Handoff> {
        Ok(Handoff {
            dir: dir.to_path_buf(),
            sha256: sha256_file(copy)?,
            scrubbed,
        })
    }

    /// As main's state holds it (JSON).
    pub fn to_state(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Main's state: `None` when main handed nothing over (no copy, or put back already), an
    /// error when it kept the copy out of post's reach or the record is unreadable.
    pub fn from_state(
        guard: Option<&str>,
        handoff: Option<&str>,
    ) -> Option<Result<Self, HandoffError>> {
        if guard != Some("pending") {
            return None;
        }
        Some(match handoff.filter(|h| !h.is_empty()) {
            None => Err(HandoffError::OutOfReach),
            Some(json) => serde_json::from_str(json).map_err(|e| HandoffError::Record {
                message: e.to_string(),
            }),
        })
    }

    /// The copy's path, once the directory is still the one main made (a real directory of this
    /// uid, 0700, not a link), the copy a plain file of this uid beside no WAL, and its digest the
    /// recorded one.
    pub fn verify(&self) -> Result<PathBuf, HandoffError> {
        check_dir(&self.dir)?;
        let copy = self.dir.join(COPY);
        let meta = std::fs::symlink_metadata(&copy).map_err(|source| HandoffError::Read {
            path: copy.clone(),
            source,
        })?;
        if !meta.file_type().is_file() || meta.uid() != own_uid() || meta.nlink() != 1 {
            return Err(HandoffError::NotAFile { path: copy });
        }
        let wal = checkpoint::sibling(&copy, "-wal");
        if std::fs::symlink_metadata(&wal).is_ok_and(|m| !m.file_type().is_file() || m.len() > 0) {
            return Err(HandoffError::NotAFile { path: wal });
        }
        let sha = sha256_file(&copy).map_err(|source| HandoffError::Read {
            path: copy.clone(),
            source,
        })?;
        if !sha.eq_ignore_ascii_case(&self.sha256) {
            return Err(HandoffError::Mismatch { path: copy });
        }
        Ok(copy)
    }

    /// Removes the directory and the copy, when the directory is still the one main made (a
    /// link or another's directory at its path is left alone: nothing is followed or removed
    /// through it). Whether it is gone.
    pub fn discard(&self) -> bool {
        match check_dir(&self.dir) {
            Ok(()) => match std::fs::remove_dir_all(&self.dir) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "cannot remove the memory guard's copy {}: {e}",
                        self.dir.display()
                    );
                    false
                }
            },
            Err(HandoffError::Missing { .. }) => true,
            Err(e) => {
                tracing::warn!("the memory guard's copy is not removed: {e}");
                false
            }
        }
    }
}

/// `dir` is a real directory (not a link) of this uid, with mode 0700.
fn check_dir(dir: &Path) -> Result<(), HandoffError> {
    let path = dir.to_path_buf();
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(source) => return Err(HandoffError::Missing { path, source }),
    };
    if meta.file_type().is_symlink() {
        return Err(HandoffError::Link { path });
    }
    if !meta.file_type().is_dir() {
        return Err(HandoffError::NotADirectory { path });
    }
    if meta.uid() != own_uid() {
        return Err(HandoffError::Owner {
            path,
            uid: meta.uid(),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        return Err(HandoffError::Mode { path, mode });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy as main hands it over: its directory, and the record main's state keeps.
    fn handed() -> (tempfile::TempDir, Handoff) {
        let parent = tempfile::tempdir().unwrap();
        let dir = make_dir(parent.path()).unwrap().keep();
        let copy = dir.join(COPY);
        rusqlite::Connection::open(&copy)
            .unwrap()
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        single_file(&copy).unwrap();
        let handoff = Handoff::of(&dir, &copy, true).unwrap();
        (parent, handoff)
    }

    #[test]
    fn the_copy_main_kept_is_believed_and_removed_once_post_is_done() {
        let (_parent, handoff) = handed();
        assert!(!checkpoint::sibling(&handoff.dir.join(COPY), "-wal").exists());
        let state = handoff.to_state();
        let back = Handoff::from_state(Some("pending"), Some(&state))
            .unwrap()
            .unwrap();
        assert_eq!(back, handoff);
        assert_eq!(back.verify().unwrap(), handoff.dir.join(COPY));
        assert!(back.discard());
        assert!(!handoff.dir.exists());
        assert!(back.discard(), "already gone is gone");
    }

    #[test]
    fn main_state_without_a_pending_guard_hands_nothing_over_and_a_copy_out_of_reach_is_named() {
        assert!(Handoff::from_state(None, None).is_none());
        assert!(Handoff::from_state(Some(""), Some("{}")).is_none());
        assert!(matches!(
            Handoff::from_state(Some("pending"), Some("")),
            Some(Err(HandoffError::OutOfReach))
        ));
        assert!(matches!(
            Handoff::from_state(Some("pending"), Some("{not json")),
            Some(Err(HandoffError::Record { .. }))
        ));
    }

    #[test]
    fn a_copy_changed_since_main_recorded_it_is_not_believed() {
        let (_parent, handoff) = handed();
        let copy = handoff.dir.join(COPY);
        rusqlite::Connection::open(&copy)
            .unwrap()
            .execute_batch("PRAGMA journal_mode=DELETE; INSERT INTO t VALUES (2);")
            .unwrap();
        let e = handoff.verify().unwrap_err();
        assert!(matches!(e, HandoffError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("does not match the SHA-256"), "{e}");
        // A directory of its own uid is still removed.
        assert!(handoff.discard());
    }

    #[test]
    fn a_wal_beside_the_copy_a_hard_link_or_a_link_for_the_copy_is_not_believed() {
        let (_parent, handoff) = handed();
        let copy = handoff.dir.join(COPY);
        let wal = checkpoint::sibling(&copy, "-wal");
        std::fs::write(&wal, b"frames").unwrap();
        assert!(matches!(
            handoff.verify(),
            Err(HandoffError::NotAFile { .. })
        ));
        std::fs::remove_file(&wal).unwrap();
        let linked = handoff.dir.join("second-name");
        std::fs::hard_link(&copy, &linked).unwrap();
        assert!(matches!(
            handoff.verify(),
            Err(HandoffError::NotAFile { .. })
        ));
        std::fs::remove_file(&linked).unwrap();
        let real = handoff.dir.join("real.db");
        std::fs::rename(&copy, &real).unwrap();
        std::os::unix::fs::symlink(&real, &copy).unwrap();
        assert!(matches!(
            handoff.verify(),
            Err(HandoffError::NotAFile { .. })
        ));
    }

    #[test]
    fn a_directory_replaced_by_a_link_or_opened_up_is_not_believed_and_never_removed_through() {
        let (parent, handoff) = handed();
        // The agent's move: main's directory renamed, a link to its own in its place.
        let moved = parent.path().join("moved");
        std::fs::rename(&handoff.dir, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &handoff.dir).unwrap();
        let e = handoff.verify().unwrap_err();
        assert!(matches!(e, HandoffError::Link { .. }), "{e}");
        assert!(!handoff.discard());
        assert!(
            moved.join(COPY).exists(),
            "nothing removed through the link"
        );
        std::fs::remove_file(&handoff.dir).unwrap();
        std::fs::rename(&moved, &handoff.dir).unwrap();
        std::fs::set_permissions(&handoff.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = handoff.verify().unwrap_err();
        assert!(matches!(e, HandoffError::Mode { mode: 0o777, .. }), "{e}");
        assert!(!handoff.discard(), "not fro-bot's directory any more");
        std::fs::set_permissions(&handoff.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::remove_dir_all(&handoff.dir).unwrap();
        std::fs::write(&handoff.dir, b"a file").unwrap();
        assert!(matches!(
            handoff.verify(),
            Err(HandoffError::NotADirectory { .. })
        ));
        std::fs::remove_file(&handoff.dir).unwrap();
        assert!(matches!(
            handoff.verify(),
            Err(HandoffError::Missing { .. })
        ));
    }

    #[test]
    fn a_directory_of_another_uid_is_not_believed() {
        if own_uid() != 0 {
            return;
        }
        let (_parent, handoff) = handed();
        std::os::unix::fs::chown(&handoff.dir, Some(1001), Some(1001)).unwrap();
        let e = handoff.verify().unwrap_err();
        assert!(matches!(e, HandoffError::Owner { uid: 1001, .. }), "{e}");
        assert!(!handoff.discard());
    }
}
