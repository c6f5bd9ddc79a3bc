//! The turns cut short that the next run on a thread is told of
//! (docs/persistence.md#the-next-run-knows): the repaired answers of the thread's session tree
//! that no later answer of the thread followed. A completed answer after them means a later
//! turn went on past them (and was told of them then): nothing more is said. What is read came
//! from memory, which anyone who can write a cache entry can shape: it is bounded here (at most
//! [`MAX_UNANSWERED`] turns, strings as `read_back` bounds them, a run only when it reads as
//! one), and the prompt fences it.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::read_back::{repaired, Repaired};
use super::rows::{integer, ID_LIMIT};
use super::{CutTurn, RepairError, RunRef, Scope};

/// At most this many turns (the newest) are told of.
pub const MAX_UNANSWERED: usize = 3;

/// A turn cut short that no later answer on its thread followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    pub turn: CutTurn,
    /// When the cut answer was started (its row's `time_created`, epoch ms).
    pub at_ms: i64,
    /// The run it was cut in, when that run's own repair recorded it.
    pub run: Option<RunRef>,
}

/// [`unanswered`] on `db`, opened read-only (absent: nothing).
pub fn unanswered_path(db: &Path, thread: &str) -> Result<Vec<Unanswered>, RepairError> {
    if !db.is_file() {
        return Ok(Vec::new());
    }
    let conn = super::open(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    super::harden(&conn).map_err(RepairError::Open)?;
    unanswered(&conn, thread)
}

/// The repaired answers in the tree of `thread` (the thread's session) newer than the thread's
/// last answer that completed without an error, oldest first, at most the newest
/// [`MAX_UNANSWERED`]. An answer whose time is not a number cannot be placed, and is left out.
pub fn unanswered(conn: &Connection, thread: &str) -> Result<Vec<Unanswered>, RepairError> {
    let found = repaired(conn, Scope::Trees(&[thread]))?;
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let answered = last_answer(conn, thread)?;
    let mut out: Vec<Unanswered> = found
        .into_iter()
        .filter_map(|Repaired { turn, created, run }| {
            let at_ms = created?;
            let after = answered
                .as_ref()
                .is_none_or(|(t, id)| (at_ms, turn.message_id.as_str()) > (*t, id.as_str()));
            after.then_some(Unanswered { turn, at_ms, run })
        })
        .collect();
    let newest = out.len().saturating_sub(MAX_UNANSWERED);
    Ok(out.split_off(newest))
}

/// The thread's newest answer that completed without an error (OpenCode orders a session by
/// `time_created, id`): its time and id.
fn last_answer(conn: &Connection, thread: &str) -> rusqlite::Result<Option<(i64, String)>> {
    let found: Option<(rusqlite::types::Value, String)> = conn
        .query_row(
            "SELECT time_created, id FROM message WHERE session_id = ?1 AND length(id) <= ?2 \
               AND typeof(time_created) = 'integer' AND \
             CASE WHEN typeof(data) = 'text' AND json_valid(data) THEN \
               json_extract(data, '$.role') = 'assistant' \
               AND json_type(data, '$.time.completed') = 'integer' \
               AND coalesce(json_type(data, '$.error'), 'null') = 'null' \
             ELSE 0 END \
             ORDER BY time_created DESC, id DESC LIMIT 1",
            params![thread, ID_LIMIT],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(found.and_then(|(t, id)| Some((integer(t)?, id))))
}

/// What the next run on the thread whose session is `thread` is told of, read off the async
/// runtime; a database that cannot be read tells of nothing (said in the log).
pub async fn on_thread(db: PathBuf, thread: String) -> Vec<Unanswered> {
    let task = tokio::task::spawn_blocking(move || unanswered_path(&db, &thread));
    match task.await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            tracing::warn!("cannot read whether this thread's last turn was cut short: {e}");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!("the read of this thread's turns cut short failed: {e}");
            Vec::new()
        }
    }
}
