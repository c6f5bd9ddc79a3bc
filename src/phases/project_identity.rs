//! Keeps memory visible across shallow checkouts.
//!
//! OpenCode keys sessions by project id: the repository's root commit, cached in
//! `{workspace}/.git/opencode`. A `fetch-depth: 1` checkout has a different "root" at every new
//! commit, which would hide every restored session. Before OpenCode starts, we write the id that the
//! restored sessions of this workspace use into that file.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

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
    let id = match restored_project_id(db, workspace) {
        Ok(Some(id)) => id,
        Ok(None) => return IdentityOutcome::NoRestoredProject,
        Err(e) => {
            return IdentityOutcome::Failed {
                message: format!("reading restored projects: {e}"),
            }
        }
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

/// The project whose worktree is this workspace; if several (earlier shallow checkouts each made
/// one), the one with the most recently updated session, then the most sessions.
fn restored_project_id(db: &Path, workspace: &Path) -> rusqlite::Result<Option<String>> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.query_row(
        "SELECT p.id FROM project p LEFT JOIN session s ON s.project_id = p.id \
         WHERE p.worktree = ?1 AND p.id <> 'global' \
         GROUP BY p.id \
         ORDER BY max(coalesce(s.time_updated, 0)) DESC, count(s.id) DESC, p.time_updated DESC \
         LIMIT 1",
        [workspace.to_string_lossy()],
        |row| row.get::<_, String>(0),
    )
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

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
                ("aaaa", &wss, &[100, 200]),
                ("bbbb", &wss, &[300]),
                ("cccc", "/elsewhere", &[900]),
                ("global", &wss, &[1000]),
            ],
        );
        assert_eq!(
            align(&ws, &db),
            IdentityOutcome::Written { id: "bbbb".into() }
        );
        assert_eq!(
            std::fs::read_to_string(ws.join(".git/opencode")).unwrap(),
            "bbbb"
        );
        assert_eq!(
            align(&ws, &db),
            IdentityOutcome::AlreadySet { id: "bbbb".into() }
        );
    }

    #[test]
    fn leaves_things_alone_when_there_is_nothing_to_align() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let db = db_with(dir.path(), &[("aaaa", "/elsewhere", &[1])]);
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
