//! Session-level merge of OpenCode's memory: the newest shared database ("base") plus this run's
//! version of every session tree it created, changed or deleted ("ours"), into a new file.
//!
//! Concurrent runs on different threads touch different sessions, so both survive. When both
//! sides changed the same tree since this run restored it, both runs' new messages are kept
//! (`exchanges`, `join`: [`MergeReport::kept_both`]); when that cannot be done, the later activity
//! wins and the other side's turn is listed in [`MergeReport::conflicts`]. Everything is read from the schema the
//! databases declare (see `schema` for the column-name rules used where OpenCode declares no key);
//! databases with different migration sets or schemas are refused with a typed error, so the
//! caller can fall back to saving this run's database as it is. See docs/persistence.md.
//!
//! Safety: inputs are opened read-only; every connection runs with triggers, views and untrusted
//! schema functions disabled, and any trigger, view or virtual table is refused outright. The
//! output is a new file (a stale `-wal`/`-shm` beside it is removed first); on error it is deleted.

mod exchanges;
mod graph;
mod join;
mod plan;
mod reissue;
mod rows;
mod schema;
mod snapshot;
mod together;
mod write;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};

pub use exchanges::Refusal;
pub use plan::{Change, Decision, Side};
pub use schema::{ACTIVITY_COLUMN, MIGRATION_TABLES, SESSION_TABLE};
pub use snapshot::{messages_added, SessionVersion, Snapshot};
pub use together::keep_together;

/// Which database an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Base,
    Ours,
    /// The database read by [`Snapshot::capture`].
    Restored,
    Output,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Base => "base",
            Role::Ours => "run's own",
            Role::Restored => "restored",
            Role::Output => "merged",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("the {role} database {} does not exist", path.display())]
    Missing { role: Role, path: PathBuf },
    #[error("the {role} database {} is not a SQLite database or is corrupt", path.display())]
    NotADatabase {
        role: Role,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("opening the {role} database {}", path.display())]
    Open {
        role: Role,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("reading the {role} database")]
    Read {
        role: Role,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the {role} database is not an OpenCode session database: no {missing}")]
    NotASessionDatabase { role: Role, missing: String },
    #[error(
        "the {role} database declares a {kind} `{name}`, which OpenCode never does: not merged"
    )]
    UnexpectedSchemaObject {
        role: Role,
        kind: String,
        name: String,
    },
    #[error("different migration sets: only in the base [{only_base}], only in this run's [{only_ours}]")]
    MigrationMismatch {
        only_base: String,
        only_ours: String,
    },
    #[error("same migrations but different schemas; differing objects: {objects}")]
    SchemaMismatch { objects: String },
    #[error("the output {} already exists", path.display())]
    OutputExists { path: PathBuf },
    #[error("copying the base database to {}", path.display())]
    Copy {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("writing the merged database ({step})")]
    Write {
        step: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the merged database fails its check: {detail}")]
    Check { detail: String },
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl MergeError {
    fn read(role: Role, source: rusqlite::Error) -> Self {
        MergeError::Read { role, source }
    }

    /// The databases cannot be merged as they are (different OpenCode versions, or not OpenCode's
    /// schema): the caller saves this run's database as before, with a warning.
    pub fn is_incompatible(&self) -> bool {
        match self {
            MergeError::MigrationMismatch { .. }
            | MergeError::SchemaMismatch { .. }
            | MergeError::NotASessionDatabase { .. }
            | MergeError::UnexpectedSchemaObject { .. } => true,
            MergeError::Missing { .. }
            | MergeError::NotADatabase { .. }
            | MergeError::Open { .. }
            | MergeError::Read { .. }
            | MergeError::OutputExists { .. }
            | MergeError::Copy { .. }
            | MergeError::Write { .. }
            | MergeError::Check { .. }
            | MergeError::Io { .. } => false,
        }
    }
}

/// How much of the result is checked before it is returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Verify {
    /// The foreign keys of every row written (cheap: indexed lookups on the rows moved).
    #[default]
    Written,
    /// Also `PRAGMA integrity_check` and `PRAGMA foreign_key_check` over the whole file (reads
    /// all of it: about as long as copying it again).
    Full,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct MergeOptions<'a> {
    pub verify: Verify,
    /// This run's own new messages (its turn's: no other copy of memory holds them), which the
    /// merge may give new ids to keep each exchange together; `None`: none may move.
    pub own_messages: Option<&'a std::collections::BTreeSet<String>>,
    /// This run's session of its thread and the base's session of the same thread (from their
    /// session maps): when both runs started the thread, this run's is folded into the other's.
    pub same_thread: Option<(&'a str, &'a str)>,
}

/// A tree this run's version was written for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub root: String,
    pub title: Option<String>,
    pub change: Change,
    pub sessions: Vec<String>,
}

/// A tree both sides changed: the loser's turn, for the run summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub root: String,
    pub title: Option<String>,
    pub winner: Side,
    /// Latest activity (ms) on each side; `None` where that side deleted the tree.
    pub ours_activity: Option<i64>,
    pub base_activity: Option<i64>,
    /// The loser's sessions that the result does not hold.
    pub lost_sessions: Vec<String>,
    /// The loser's messages (rows of `message`) that the result does not hold.
    pub lost_messages: u64,
    /// Why both runs' exchanges could not be kept (`None`: the two were not compared).
    pub refusal: Option<Refusal>,
}

impl Conflict {
    /// Whether the result lacks any of the loser's messages or sessions (else the winner's
    /// version already holds all of the loser's turn).
    pub fn lost_a_turn(&self) -> bool {
        self.lost_messages > 0 || !self.lost_sessions.is_empty()
    }

    /// One line for the run summary. The title comes from a database, so it is shown without
    /// control characters or backticks.
    pub fn describe(&self) -> String {
        let title = shown(self.title.as_deref().unwrap_or("untitled"));
        let kept = match self.winner {
            Side::Ours => "this run's",
            Side::Base => "the other run's",
        };
        let why = match &self.refusal {
            Some(refusal) => format!(" and both exchanges could not be kept ({refusal})"),
            None => String::new(),
        };
        format!(
            "conflict on session `{}` ({title}): both runs changed it{why}; {kept} later turn was kept, the other ({} message(s)) is not in memory",
            self.root, self.lost_messages
        )
    }
}

/// A tree both runs continued, joined: every message of both is in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBoth {
    pub root: String,
    pub title: Option<String>,
    /// Every session of the joined tree.
    pub sessions: Vec<String>,
    /// This run's messages added to the other run's version.
    pub messages: u64,
    /// Of those, the ones given new ids to keep each exchange together.
    pub moved: u64,
}

/// Text from a database, for a summary line: no control characters, no backticks (it is shown in
/// a code span).
pub(crate) fn shown(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() || c == '`' { '?' } else { c })
        .collect()
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeReport {
    pub taken: Vec<Taken>,
    pub conflicts: Vec<Conflict>,
    /// Trees both runs continued whose exchanges are all kept.
    pub kept_both: Vec<KeptBoth>,
    /// This run's messages given new ids (old, new): its database's ids no longer hold in the
    /// result.
    pub reissued: Vec<(String, String)>,
    /// This run's new sessions folded into the other run's session of the same thread (from,
    /// into): the thread's session in the result is `into`.
    pub folded: Vec<(String, String)>,
    /// Trees both sides changed in exactly the same way.
    pub identical: usize,
    pub rows_deleted: u64,
    pub rows_inserted: u64,
    /// Parent and attachment rows (projects, workspaces, ...) added because the base lacked them.
    pub rows_carried: u64,
    /// Time spent copying the base, merging into the copy, and syncing the result to disk.
    pub copy_time: Duration,
    pub merge_time: Duration,
    pub sync_time: Duration,
    /// Roots (with titles) of trees `ours` changed that [`merge_only`] did not take.
    pub refused: Vec<(String, Option<String>)>,
}

pub fn merge(
    base: &Path,
    ours: &Path,
    restored: &Snapshot,
    out: &Path,
) -> Result<MergeReport, MergeError> {
    merge_with(base, ours, restored, out, MergeOptions::default())
}

/// Writes `out` (which must not exist): all of `base`, plus this run's version of every session
/// tree `ours` changed since `restored`. The caller renames `out` into place.
pub fn merge_with(
    base: &Path,
    ours: &Path,
    restored: &Snapshot,
    out: &Path,
    options: MergeOptions<'_>,
) -> Result<MergeReport, MergeError> {
    write_out(out, || write::run(base, ours, restored, out, options, None))
}

/// Runs `write` into `out`, which must not exist; on error nothing is left where the caller
/// might pick it up.
fn write_out(
    out: &Path,
    write: impl FnOnce() -> Result<MergeReport, MergeError>,
) -> Result<MergeReport, MergeError> {
    if out.exists() {
        return Err(MergeError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    // A stale WAL beside a new file would be replayed into it.
    crate::memory::checkpoint::remove_stale_sidecars(out).map_err(|source| MergeError::Io {
        action: "removing a stale -wal/-shm beside",
        path: out.to_path_buf(),
        source,
    })?;
    let result = write();
    if result.is_err() {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = out.as_os_str().to_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    }
    result
}

/// Like [`merge_with`], but only the trees holding one of `own` sessions are taken from `ours`:
/// every other tree is the base's, whatever `ours` did to it (the second wall of
/// docs/security.md#what-it-leaves-behind: a run's memory may change only its own conversation).
/// Trees `ours` changed and that were not taken are listed in [`MergeReport::refused`].
pub fn merge_only(
    base: &Path,
    ours: &Path,
    restored: &Snapshot,
    out: &Path,
    own: &std::collections::BTreeSet<String>,
) -> Result<MergeReport, MergeError> {
    write_out(out, || {
        write::run(
            base,
            ours,
            restored,
            out,
            MergeOptions::default(),
            Some(own),
        )
    })
}

/// Which rows of a database belong to which session trees, read from the schema it declares
/// (the scrub of what a run wrote reads only those of its trees: `scrub::Scope::Changed`).
pub struct TreeRows {
    graph: graph::Graph,
    key: String,
    parent: Option<String>,
}

impl TreeRows {
    /// Reads the schema of `conn`'s main database: refused as the merge refuses it (not OpenCode's
    /// session schema, or a trigger, view or virtual table).
    pub fn read(conn: &Connection) -> Result<TreeRows, MergeError> {
        let schema = schema::Schema::read(conn, Role::Ours)?;
        let graph = graph::Graph::new(&schema);
        let key = schema.session().single_key().unwrap_or("id").to_string();
        let parent = graph.parent_column().map(str::to_string);
        Ok(TreeRows { graph, key, parent })
    }

    /// Whether `table`'s rows belong to session trees (else it is one of OpenCode's other tables).
    pub fn is_tied(&self, table: &str) -> bool {
        self.graph.is_tied(table)
    }

    /// SQL condition selecting `table`'s rows (in `main`) of the sessions listed in
    /// `temp.<ids>(id)`; `None` for a table not tied to sessions.
    pub fn predicate(&self, table: &str, ids: &str) -> Option<String> {
        self.is_tied(table)
            .then(|| self.graph.predicate("main", table, ids))
    }

    /// SQL that fills `temp.<ids>(id)` with every session of the trees (root, children,
    /// grandchildren: a subagent's session is a child) holding one of the ids in `temp.<seeds>(id)`.
    pub fn expand_trees_sql(&self, seeds: &str, ids: &str) -> String {
        let (t, k) = (schema::quote(SESSION_TABLE), schema::quote(&self.key));
        let Some(p) = self.parent.as_deref().map(schema::quote) else {
            return format!(
                "INSERT OR IGNORE INTO temp.{ids} SELECT id FROM temp.{seeds}",
                ids = schema::quote(ids),
                seeds = schema::quote(seeds)
            );
        };
        format!(
            "WITH RECURSIVE up(id) AS (SELECT id FROM temp.{seeds} \
               UNION SELECT s.{p} FROM main.{t} s JOIN up ON s.{k} = up.id WHERE s.{p} IS NOT NULL), \
             down(id) AS (SELECT id FROM up \
               UNION SELECT s.{k} FROM main.{t} s JOIN down ON s.{p} = down.id) \
             INSERT OR IGNORE INTO temp.{ids} SELECT id FROM down",
            seeds = schema::quote(seeds),
            ids = schema::quote(ids),
        )
    }
}

/// Hardening for every connection: no triggers, no views, no functions with side effects from the
/// schema, no schema writes; foreign-key actions off (we delete and insert explicitly).
fn harden(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_VIEW, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.pragma_update(None, "foreign_keys", false)?;
    conn.pragma_update(None, "cell_size_check", true)?;
    conn.busy_timeout(Duration::from_secs(2))?;
    Ok(())
}

fn open_error(role: Role, path: &Path, source: rusqlite::Error) -> MergeError {
    if crate::memory::checkpoint::is_structural(&source) {
        MergeError::NotADatabase {
            role,
            path: path.to_path_buf(),
            source,
        }
    } else {
        MergeError::Open {
            role,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `file:` URI for a path: `?`, `#` and `%` would end or escape the path, and bytes beyond ASCII
/// are percent-encoded so any path (UTF-8 or not) reaches SQLite byte for byte.
fn file_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'?' | b'#' | b'%' | 0x80..=0xff | 0..=0x1f => uri.push_str(&format!("%{b:02X}")),
            _ => uri.push(char::from(b)),
        }
    }
    uri.push_str("?mode=ro");
    uri
}

/// Opens `path` read-only (never creating it) and makes SQLite read its header and schema, so a
/// file that is not a database fails here.
fn open_read_only(path: &Path, role: Role) -> Result<Connection, MergeError> {
    if !path.is_file() {
        return Err(MergeError::Missing {
            role,
            path: path.to_path_buf(),
        });
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_error(role, path, e))?;
    harden(&conn).map_err(|e| open_error(role, path, e))?;
    conn.query_row("SELECT count(*) FROM main.sqlite_schema", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(|e| open_error(role, path, e))?;
    Ok(conn)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod describe_tests {
    use super::*;

    #[test]
    fn a_conflict_line_names_who_won_and_cannot_break_out_of_its_code_span() {
        let c = Conflict {
            root: "ses_1".into(),
            title: Some("fro-bot: issue-5`\n::error::x".into()),
            winner: Side::Base,
            ours_activity: Some(1),
            base_activity: Some(2),
            lost_sessions: vec![],
            lost_messages: 2,
            refusal: None,
        };
        assert!(c.lost_a_turn());
        let line = c.describe();
        assert!(
            line.contains("the other run's later turn was kept"),
            "{line}"
        );
        assert!(line.contains("fro-bot: issue-5??::error::x"), "{line}");
        assert!(!line.contains('\n'));
        let kept_all = Conflict {
            lost_messages: 0,
            ..c
        };
        assert!(!kept_all.lost_a_turn());
    }
}
