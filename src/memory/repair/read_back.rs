//! The turns a repair recorded, read back from a database (this run's, or one an earlier run
//! repaired and saved): answers whose error is the repair's own text, and their calls that carry
//! its marker. What it returns came from memory, which anyone who can write a cache entry can
//! shape: its strings are bounded and free of control characters, and a reader fences them.

use std::path::Path;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags};

use super::rows::{self, text, ID_LIMIT};
use super::text::{summary, ABORTED_ERROR, MARKER, MESSAGE_PREFIX};
use super::{CutTurn, Interruption, LeftAs, RepairError, RunRef, Scope, UnknownCall, MAX_PARTS};

/// At most this many repaired answers are read back (the newest).
pub const MAX_READ: usize = 100;

/// [`read_back`] on `db`, opened read-only (absent: nothing).
pub fn read_back_path(db: &Path, scope: Scope<'_>) -> Result<Vec<CutTurn>, RepairError> {
    if !db.is_file() {
        return Ok(Vec::new());
    }
    let conn = super::open(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    super::harden(&conn).map_err(RepairError::Open)?;
    read_back(&conn, scope)
}

/// The repaired answers in `scope`, oldest first (the newest [`MAX_READ`]).
pub fn read_back(conn: &Connection, scope: Scope<'_>) -> Result<Vec<CutTurn>, RepairError> {
    Ok(repaired(conn, scope)?.into_iter().map(|r| r.turn).collect())
}

/// A repaired answer as read back, with what places it.
pub(super) struct Repaired {
    pub(super) turn: CutTurn,
    /// Its row's `time_created`, when it is a number.
    pub(super) created: Option<i64>,
    /// The run it was cut in, when the repair recorded one that reads as a run.
    pub(super) run: Option<RunRef>,
}

/// An answer's row as read: id, session, `time_created`, error message, the run recorded.
type AnswerRow = (String, String, Value, Option<String>, Option<RunRef>);

/// [`read_back`], with each answer's time and run.
pub(super) fn repaired(conn: &Connection, scope: Scope<'_>) -> Result<Vec<Repaired>, RepairError> {
    rows::check_schema(conn)?;
    let sessions = rows::sessions(conn, scope)?;
    let within = match sessions {
        Some(_) => "session_id IN (SELECT value FROM json_each(?1)) AND",
        None => "?1 IS NULL AND",
    };
    let sql = format!(
        "SELECT id, session_id, time_created, \
           substr(json_extract(data, '$.error.data.message'), 1, 400), \
           substr(json_extract(data, '$.error.data.' || ?6 || '.run'), 1, 32), \
           substr(json_extract(data, '$.error.data.' || ?6 || '.attempt'), 1, 32) \
         FROM message WHERE {within} length(id) <= ?5 AND length(session_id) <= ?5 AND \
         CASE WHEN typeof(data) = 'text' AND json_valid(data) THEN \
           json_extract(data, '$.role') = 'assistant' AND json_extract(data, '$.error.name') = ?2 \
           AND substr(json_extract(data, '$.error.data.message'), 1, length(?3)) = ?3 \
         ELSE 0 END \
         ORDER BY time_created DESC, id DESC LIMIT ?4"
    );
    let mut st = conn.prepare(&sql)?;
    let bound = params![
        sessions,
        ABORTED_ERROR,
        MESSAGE_PREFIX,
        MAX_READ as i64,
        ID_LIMIT,
        MARKER
    ];
    let found: Vec<AnswerRow> = st
        .query_map(bound, |r| {
            let attempt = text(r.get(5)?);
            let run = text(r.get(4)?).and_then(|id| RunRef::new(&id, attempt.as_deref()));
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, text(r.get(3)?), run))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::new();
    for (message_id, session_id, created, error, run) in found.into_iter().rev() {
        let Some(reason) = error.as_deref().and_then(Interruption::from_message) else {
            continue;
        };
        let calls = repaired_calls(conn, &message_id, &session_id)?;
        let superseded = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM message WHERE session_id = ?1 \
               AND (time_created > ?2 OR (time_created = ?2 AND id > ?3)))",
            params![session_id, created, message_id],
            |r| r.get(0),
        )?;
        let turn = CutTurn {
            session_id,
            message_id,
            reason,
            calls,
            superseded,
        };
        let created = rows::integer(created);
        out.push(Repaired { turn, created, run });
    }
    Ok(out)
}

/// The answer's calls the repair rewrote (its marker in their metadata), in id order.
fn repaired_calls(
    conn: &Connection,
    message_id: &str,
    session_id: &str,
) -> rusqlite::Result<Vec<UnknownCall>> {
    let mut st = conn.prepare(
        "SELECT id, substr(json_extract(data, '$.tool'), 1, 400), \
           substr(json_extract(data, '$.callID'), 1, 400), \
           substr(json_extract(data, '$.state.metadata.' || ?3 || '.was'), 1, 32), \
           substr(CASE json_type(data, '$.state.input.command') \
             WHEN 'text' THEN json_extract(data, '$.state.input.command') \
             ELSE json_extract(data, '$.state.input') END, 1, 400) \
         FROM part WHERE message_id = ?1 AND session_id = ?2 AND length(id) <= ?5 AND \
         CASE WHEN typeof(data) = 'text' AND json_valid(data) THEN \
           json_extract(data, '$.type') = 'tool' AND json_extract(data, '$.state.status') = 'error' \
           AND json_type(data, '$.state.metadata.' || ?3) = 'object' \
         ELSE 0 END \
         ORDER BY id LIMIT ?4",
    )?;
    let calls = st
        .query_map(
            params![message_id, session_id, MARKER, MAX_PARTS as i64, ID_LIMIT],
            |r| {
                let Some(left) = text(r.get(3)?).as_deref().and_then(LeftAs::parse) else {
                    return Ok(None);
                };
                Ok(Some(UnknownCall {
                    part_id: r.get(0)?,
                    tool: text(r.get(1)?)
                        .map(|t| summary(&t))
                        .unwrap_or_else(|| "unknown".into()),
                    call_id: text(r.get(2)?).map(|c| summary(&c)),
                    input: text(r.get(4)?).map(|i| summary(&i)).unwrap_or_default(),
                    left,
                }))
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(calls.into_iter().flatten().collect())
}
