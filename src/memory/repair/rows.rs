//! What the repair reads: the sessions in scope, the answers a cut turn left, and their tool
//! parts. Only the fields it needs are read, by SQLite's JSON functions on rows whose `data` is
//! valid JSON text (anything else is left alone); a row is never loaded whole, whatever its size.

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};

use super::text::{ABORTED_COMMAND_TAIL, ABORTED_ERROR, ABORTED_TOOL_ERROR, MESSAGE_PREFIX};
use super::{LeftAs, RepairError, Scope, MAX_MESSAGES, MAX_PARTS, MAX_TREE};

/// The columns the repair reads and writes, as OpenCode 1.18 declares them.
const TABLES: [(&str, &[&str]); 2] = [
    ("message", &["id", "session_id", "time_created", "data"]),
    (
        "part",
        &["id", "message_id", "session_id", "time_updated", "data"],
    ),
];

/// Ids longer than this are not OpenCode's (its are about 30 characters): such rows are left
/// alone, so no id read is ever large.
pub(super) const ID_LIMIT: i64 = 200;

/// An answer a cut turn left.
#[derive(Debug, Clone)]
pub(super) struct CutMessage {
    pub(super) id: String,
    pub(super) session_id: String,
    /// `time.created`, when it is a number.
    pub(super) created: Option<i64>,
    /// `time.completed`, when it is a number.
    pub(super) completed: Option<i64>,
    pub(super) error: ErrorNow,
    /// The latest `time_updated` of its parts.
    pub(super) last_part: Option<i64>,
    pub(super) superseded: bool,
}

/// The answer's error as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorNow {
    None,
    /// OpenCode's abort: fro-bot stopped the turn.
    Aborted,
    /// Any other: kept.
    Other,
}

/// One tool part of such an answer, with what decides its fate.
#[derive(Debug, Clone, Default)]
pub(super) struct ToolPart {
    pub(super) id: String,
    pub(super) tool: Option<String>,
    pub(super) call_id: Option<String>,
    pub(super) status: Option<String>,
    /// `state.error` is OpenCode's `Tool execution aborted`.
    pub(super) aborted_error: bool,
    /// `state.metadata.exit` is JSON `null`: the command did not exit by itself.
    pub(super) exit_null: bool,
    pub(super) interrupted: bool,
    /// The last characters of `state.output`, when it is text.
    pub(super) output_tail: Option<String>,
    pub(super) started: Option<i64>,
    /// The command, or the input's JSON, cut short.
    pub(super) input: String,
}

pub(super) fn check_schema(conn: &Connection) -> Result<(), RepairError> {
    for (table, columns) in TABLES {
        let mut st = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
        let have: Vec<String> = st
            .query_map([table], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if !columns.iter().all(|c| have.iter().any(|h| h == c)) {
            return Err(RepairError::Schema(table));
        }
    }
    Ok(())
}

/// The sessions of `scope` as a JSON array (`None`: every session). A tree is its roots and every
/// session below them by `session.parent_id`, cycles and all, at most [`MAX_TREE`].
pub(super) fn sessions(conn: &Connection, scope: Scope<'_>) -> rusqlite::Result<Option<String>> {
    let Scope::Trees(roots) = scope else {
        return Ok(None);
    };
    let roots = serde_json::to_string(roots).unwrap_or_else(|_| "[]".into());
    let has_parent: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('session') WHERE name IN ('id', 'parent_id')",
        [],
        |r| Ok(r.get::<_, i64>(0)? == 2),
    )?;
    if !has_parent {
        return Ok(Some(roots));
    }
    // UNION (not UNION ALL) keeps each session once, so a cycle ends.
    let tree: String = conn.query_row(
        "WITH RECURSIVE tree(id) AS (SELECT value FROM json_each(?1) \
           UNION SELECT s.id FROM session s JOIN tree t ON s.parent_id = t.id) \
         SELECT json_group_array(id) FROM (SELECT id FROM tree LIMIT ?2)",
        params![roots, MAX_TREE as i64],
        |r| r.get(0),
    )?;
    Ok(Some(tree))
}

/// Which answers need repair: an assistant message without a numeric `time.completed`, or with
/// OpenCode's abort error and not repaired yet. At most [`MAX_MESSAGES`] (then `true`).
const CUT_FILTER: &str = "CASE WHEN typeof(data) = 'text' AND json_valid(data) THEN \
      json_extract(data, '$.role') = 'assistant' AND ( \
        json_type(data, '$.time.completed') IS NOT 'integer' \
        OR (json_extract(data, '$.error.name') = ?2 \
            AND substr(coalesce(json_extract(data, '$.error.data.message'), ''), 1, length(?3)) \
                IS NOT ?3)) \
    ELSE 0 END";

const CUT_COLUMNS: &str = "id, session_id, time_created, json_extract(data, '$.time.created'), \
     json_extract(data, '$.time.completed'), json_type(data, '$.error'), \
     json_extract(data, '$.error.name') = ?2";

pub(super) fn cut_messages(
    conn: &Connection,
    sessions: Option<&str>,
) -> rusqlite::Result<(Vec<CutMessage>, bool)> {
    let within = match sessions {
        Some(_) => "session_id IN (SELECT value FROM json_each(?1)) AND",
        None => "?1 IS NULL AND",
    };
    let sql = format!(
        "SELECT {CUT_COLUMNS} FROM message WHERE {within} \
           length(id) <= ?5 AND length(session_id) <= ?5 AND {CUT_FILTER} \
         ORDER BY session_id, time_created, id LIMIT ?4"
    );
    let mut st = conn.prepare(&sql)?;
    let limit = MAX_MESSAGES as i64 + 1;
    let bound = params![sessions, ABORTED_ERROR, MESSAGE_PREFIX, limit, ID_LIMIT];
    let found = st
        .query_map(bound, cut_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let limited = found.len() > MAX_MESSAGES;
    let mut out = Vec::with_capacity(found.len().min(MAX_MESSAGES));
    for (mut m, created_column) in found.into_iter().take(MAX_MESSAGES) {
        m.superseded = superseded(conn, &m, &created_column)?;
        m.last_part = last_part(conn, &m)?;
        out.push(m);
    }
    Ok((out, limited))
}

/// One row of `cut_messages`, with its `time_created` column as stored.
fn cut_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(CutMessage, Value)> {
    let aborted = matches!(r.get::<_, Value>(6)?, Value::Integer(1));
    let error = match (r.get::<_, Option<String>>(5)?.as_deref(), aborted) {
        (None | Some("null"), _) => ErrorNow::None,
        (Some(_), true) => ErrorNow::Aborted,
        (Some(_), false) => ErrorNow::Other,
    };
    let message = CutMessage {
        id: r.get(0)?,
        session_id: r.get(1)?,
        created: integer(r.get(3)?),
        completed: integer(r.get(4)?),
        error,
        last_part: None,
        superseded: false,
    };
    Ok((message, r.get(2)?))
}

/// A newer message of the same session exists (OpenCode orders a session by `time_created, id`).
fn superseded(conn: &Connection, m: &CutMessage, created: &Value) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM message WHERE session_id = ?1 \
           AND (time_created > ?2 OR (time_created = ?2 AND id > ?3)))",
        params![m.session_id, created, m.id],
        |r| r.get(0),
    )
}

fn last_part(conn: &Connection, m: &CutMessage) -> rusqlite::Result<Option<i64>> {
    let v: Option<Value> = conn
        .query_row(
            "SELECT max(time_updated) FROM part WHERE message_id = ?1 AND session_id = ?2",
            params![m.id, m.session_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(integer))
}

const PART_COLUMNS: &str = "id, substr(json_extract(data, '$.tool'), 1, 400), \
     substr(json_extract(data, '$.callID'), 1, 400), \
     substr(json_extract(data, '$.state.status'), 1, 32), \
     json_extract(data, '$.state.error') = ?4, \
     json_type(data, '$.state.metadata.exit'), json_extract(data, '$.state.metadata.interrupted'), \
     CASE json_type(data, '$.state.output') \
       WHEN 'text' THEN substr(json_extract(data, '$.state.output'), -64) END, \
     json_extract(data, '$.state.time.start'), \
     substr(CASE json_type(data, '$.state.input.command') \
       WHEN 'text' THEN json_extract(data, '$.state.input.command') \
       ELSE json_extract(data, '$.state.input') END, 1, 400)";

/// The tool parts of `m`: only rows of its session (a part of another session pointing at it is
/// not its), in id order, at most [`MAX_PARTS`] (then `true`).
pub(super) fn tool_parts(
    conn: &Connection,
    m: &CutMessage,
) -> rusqlite::Result<(Vec<ToolPart>, bool)> {
    let sql = format!(
        "SELECT {PART_COLUMNS} FROM part WHERE message_id = ?1 AND session_id = ?2 \
           AND length(id) <= ?5 AND \
         CASE WHEN typeof(data) = 'text' AND json_valid(data) \
           THEN json_extract(data, '$.type') = 'tool' ELSE 0 END \
         ORDER BY id LIMIT ?3"
    );
    let mut st = conn.prepare(&sql)?;
    let parts = st
        .query_map(
            params![
                m.id,
                m.session_id,
                MAX_PARTS as i64 + 1,
                ABORTED_TOOL_ERROR,
                ID_LIMIT
            ],
            |r| {
                Ok(ToolPart {
                    id: r.get(0)?,
                    tool: text(r.get(1)?),
                    call_id: text(r.get(2)?),
                    status: text(r.get(3)?),
                    aborted_error: matches!(r.get::<_, Value>(4)?, Value::Integer(1)),
                    exit_null: r.get::<_, Option<String>>(5)?.as_deref() == Some("null"),
                    interrupted: matches!(r.get::<_, Value>(6)?, Value::Integer(1)),
                    output_tail: text(r.get(7)?),
                    started: integer(r.get(8)?),
                    input: text(r.get(9)?).unwrap_or_default(),
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let limited = parts.len() > MAX_PARTS;
    Ok((parts.into_iter().take(MAX_PARTS).collect(), limited))
}

/// What a part of an answer in `error` state was left as, when the repair must rewrite it:
/// `pending`/`running` always; under OpenCode's abort only, `bash` recorded as completed with
/// the tool's own abort trailer and no exit code, and the processor's `Tool execution aborted`.
/// Any other status, known or not, is left as it is.
pub(super) fn left_as(part: &ToolPart, error: ErrorNow) -> Option<LeftAs> {
    let aborted = error == ErrorNow::Aborted;
    match part.status.as_deref() {
        Some("pending") => Some(LeftAs::Pending),
        Some("running") => Some(LeftAs::Running),
        Some("completed")
            if aborted
                && part.tool.as_deref() == Some("bash")
                && part.exit_null
                && part
                    .output_tail
                    .as_deref()
                    .is_some_and(|t| t.ends_with(ABORTED_COMMAND_TAIL)) =>
        {
            Some(LeftAs::AbortedCommand)
        }
        Some("error") if aborted && part.interrupted && part.aborted_error => {
            Some(LeftAs::AbortedTool)
        }
        _ => None,
    }
}

pub(super) fn text(v: Value) -> Option<String> {
    match v {
        Value::Text(s) => Some(s),
        Value::Null | Value::Integer(_) | Value::Real(_) | Value::Blob(_) => None,
    }
}

pub(super) fn integer(v: Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(i),
        Value::Null | Value::Real(_) | Value::Text(_) | Value::Blob(_) => None,
    }
}
