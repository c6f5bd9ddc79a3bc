//! Keeps memory visible across shallow checkouts.
//!
//! OpenCode keys sessions by project id: the repository's root commit, cached in
//! `{workspace}/.git/opencode`. A `fetch-depth: 1` checkout has a different "root" at every new
//! commit, which would hide every restored session. Before OpenCode starts, we write the id that the
//! restored sessions of this workspace use into that file.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// File OpenCode reads its cached project id from, inside `.git/`.
pub const PROJECT_ID_FILE: &str = "opencode";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityOutcome {
    /// `.git/opencode` now holds the restored project's id.
    Written {
        id: String,
    },
    /// It already held that id.
    AlreadySet {
        id: String,
    },
    /// No restored project for this workspace: OpenCode derives its own id.
    NoRestoredProject,
    /// Restored projects of this workspace exist, but none has an id OpenCode could have made
    /// (40 or 64 lowercase hex, or `global`): nothing is written (docs/persistence.md).
    Refused {
        count: usize,
    },
    /// The workspace has no `.git` directory (not a checkout, or a worktree/submodule link).
    NotAGitCheckout,
    Failed {
        message: String,
    },
}

pub fn align(workspace: &Path, db: &Path) -> IdentityOutcome {
    let git_dir = workspace.join(".git");
    if !git_dir.is_dir() {
        return IdentityOutcome::NotAGitCheckout;
    }
    if !db.is_file() {
        return IdentityOutcome::NoRestoredProject;
    }
    let candidates = match restored_project_ids(db, workspace) {
        Ok(ids) => ids,
        Err(e) => {
            return IdentityOutcome::Failed {
                message: format!("reading restored projects: {e}"),
            }
        }
    };
    let refused = candidates.iter().filter(|id| !is_valid_id(id)).count();
    if refused > 0 {
        // The ids themselves are never logged: they are attacker-controlled text.
        tracing::warn!(
            "project identity: refused {refused} restored project id(s) that are not a commit hash"
        );
    }
    let Some(id) = candidates.into_iter().find(|id| is_valid_id(id)) else {
        return match refused {
            0 => IdentityOutcome::NoRestoredProject,
            count => IdentityOutcome::Refused { count },
        };
    };
    let file = git_dir.join(PROJECT_ID_FILE);
    if std::fs::read_to_string(&file).is_ok_and(|current| current.trim() == id) {
        return IdentityOutcome::AlreadySet { id };
    }
    match std::fs::write(&file, &id) {
        Ok(()) => IdentityOutcome::Written { id },
        Err(e) => IdentityOutcome::Failed {
            message: format!("writing {}: {e}", file.display()),
        },
    }
}

/// An id OpenCode itself makes: a root commit (SHA-1 or SHA-256, lowercase hex) or `global`.
/// Anything else could steer the path OpenCode builds from it (`snapshot/{id}`).
pub fn is_valid_id(id: &str) -> bool {
    id == "global"
        || (matches!(id.len(), 40 | 64)
            && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The projects whose worktree is this workspace, best first: the one with the most recently
/// updated session (earlier shallow checkouts each made one), then the most sessions.
fn restored_project_ids(db: &Path, workspace: &Path) -> rusqlite::Result<Vec<String>> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let mut stmt = conn.prepare(
        "SELECT p.id FROM project p LEFT JOIN session s ON s.project_id = p.id \
         WHERE p.worktree = ?1 AND p.id <> 'global' \
         GROUP BY p.id \
         ORDER BY max(coalesce(s.time_updated, 0)) DESC, count(s.id) DESC, p.time_updated DESC \
         LIMIT 50",
    )?;
    let rows = stmt.query_map([workspace.to_string_lossy()], |row| row.get::<_, String>(0))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "a".repeat(40));
    static B: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "b".repeat(40));
    static C: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "c".repeat(40));

    fn db_with(dir: &Path, rows: &[(&str, &str, &[i64])]) -> std::path::PathBuf {
        let db = dir.join("opencode.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE project(id text primary key, worktree text not null, time_updated integer not null);
             CREATE TABLE session(id text primary key, project_id text not null, time_updated integer not null);",
        )
        .unwrap();
        for (i, (id, worktree, sessions)) in rows.iter().enumerate() {
            conn.execute(
                "INSERT INTO project VALUES (?1, ?2, ?3)",
                rusqlite::params![id, worktree, i as i64],
            )
            .unwrap();
            for (j, updated) in sessions.iter().enumerate() {
                conn.execute(
                    "INSERT INTO session VALUES (?1, ?2, ?3)",
                    rusqlite::params![format!("{id}-{j}"), id, updated],
                )
                .unwrap();
            }
        }
        db
    }

    #[test]
    fn writes_the_id_of_the_most_recently_used_project_of_this_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        let wss = ws.to_string_lossy().into_owned();
        let db = db_with(
            dir.path(),
            &[
                (&A, &wss, &[100, 200]),
                (&B, &wss, &[300]),
                (&C, "/elsewhere", &[900]),
                ("global", &wss, &[1000]),
            ],
        );
        assert_eq!(align(&ws, &db), IdentityOutcome::Written { id: B.clone() });
        assert_eq!(
            std::fs::read_to_string(ws.join(".git/opencode")).unwrap(),
            *B
        );
        assert_eq!(
            align(&ws, &db),
            IdentityOutcome::AlreadySet { id: B.clone() }
        );
    }

    #[test]
    fn ids_opencode_could_not_have_made_are_never_written() {
        for ok in [&*A, &"0123456789abcdef".repeat(4), "global"] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in [
            "../storage/evil",
            &"A".repeat(40),
            &"a".repeat(39),
            &"a".repeat(41),
            "",
            &format!("{}\n", &*A),
        ] {
            assert!(!is_valid_id(bad), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        let wss = ws.to_string_lossy().into_owned();
        // The poisoned project is the most recently used one: the valid one behind it is taken.
        let db = db_with(
            dir.path(),
            &[(&A, &wss, &[1]), ("../storage/evil", &wss, &[9])],
        );
        assert_eq!(align(&ws, &db), IdentityOutcome::Written { id: A.clone() });
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        let wss = ws.to_string_lossy().into_owned();
        let db = db_with(dir.path(), &[("../storage/evil", &wss, &[9])]);
        assert_eq!(align(&ws, &db), IdentityOutcome::Refused { count: 1 });
        assert!(!ws.join(".git/opencode").exists());
    }

    #[test]
    fn leaves_things_alone_when_there_is_nothing_to_align() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let db = db_with(dir.path(), &[(&A, "/elsewhere", &[1])]);
        assert_eq!(align(&ws, &db), IdentityOutcome::NotAGitCheckout);
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        assert_eq!(align(&ws, &db), IdentityOutcome::NoRestoredProject);
        assert!(!ws.join(".git/opencode").exists());
        assert_eq!(
            align(&ws, &dir.path().join("missing.db")),
            IdentityOutcome::NoRestoredProject
        );
        std::fs::write(dir.path().join("bad.db"), vec![7u8; 4096]).unwrap();
        assert!(matches!(
            align(&ws, &dir.path().join("bad.db")),
            IdentityOutcome::Failed { .. }
        ));
    }
}
