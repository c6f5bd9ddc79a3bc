//! What the repair writes, as OpenCode 1.18.33 writes the same states: the answer completed with
//! `MessageAbortedError` (the one error under which OpenCode still shows the answer's parts to
//! the model), each cut call an `error` with its input kept. Times are taken from the rows
//! themselves, never the clock: two runs repairing the same restored rows write the same bytes.
//! Every statement names the row by its id and its owners' ids, as read.

use rusqlite::{params, Connection};
use serde_json::json;

use super::rows::{left_as, CutMessage, ErrorNow, ToolPart};
use super::text::{self, ABORTED_ERROR};
use super::{CutTurn, Interruption, LeftAs, RunRef, UnknownCall};

/// Repairs one answer and its cut calls, recording the run it was cut in when known; `None` when
/// the row is gone.
pub(super) fn repair_message(
    conn: &Connection,
    m: &CutMessage,
    parts: &[ToolPart],
    (reason, run): (Interruption, Option<&RunRef>),
) -> rusqlite::Result<Option<CutTurn>> {
    let completed = completion(m);
    let mut calls = Vec::new();
    for part in parts {
        let Some(left) = left_as(part, m.error) else {
            continue;
        };
        if write_call(conn, m, part, reason, left, completed)? {
            calls.push(UnknownCall {
                part_id: part.id.clone(),
                call_id: part.call_id.as_deref().map(text::summary),
                tool: part
                    .tool
                    .as_deref()
                    .map_or_else(|| "unknown".into(), text::summary),
                input: text::summary(&part.input),
                left,
            });
        }
    }
    if !write_message(conn, m, (reason, run), completed)? {
        return Ok(None);
    }
    Ok(Some(CutTurn {
        session_id: m.session_id.clone(),
        message_id: m.id.clone(),
        reason,
        calls,
        superseded: m.superseded,
    }))
}

/// When the answer ended: as recorded, else the latest time it or its parts carry.
fn completion(m: &CutMessage) -> i64 {
    m.completed
        .unwrap_or_else(|| m.created.max(m.last_part).unwrap_or(0))
}

/// The answer's `time.completed` (when missing) and its error (unless it holds one other than
/// OpenCode's abort, which is kept: OpenCode then shows the model nothing of it, as before), with
/// the run it was cut in beside the error's message when known.
fn write_message(
    conn: &Connection,
    m: &CutMessage,
    (reason, run): (Interruption, Option<&RunRef>),
    completed: i64,
) -> rusqlite::Result<bool> {
    let mut written = false;
    if m.completed.is_none() {
        let time = json!({"created": m.created.unwrap_or(completed), "completed": completed});
        // A `time` that is not an object (hostile) is replaced whole.
        written |= conn.execute(
            "UPDATE message SET data = CASE json_type(data, '$.time') \
               WHEN 'object' THEN json_set(data, '$.time.completed', ?3) \
               ELSE json_set(data, '$.time', json(?4)) END \
             WHERE id = ?1 AND session_id = ?2",
            params![m.id, m.session_id, completed, time.to_string()],
        )? == 1;
    }
    if matches!(m.error, ErrorNow::None | ErrorNow::Aborted) {
        let mut error =
            json!({"name": ABORTED_ERROR, "data": {"message": text::message_error(reason)}});
        if let Some(run) = run {
            error["data"][text::MARKER] = text::message_marker(reason, run);
        }
        written |= conn.execute(
            "UPDATE message SET data = json_set(data, '$.error', json(?3)) \
             WHERE id = ?1 AND session_id = ?2",
            params![m.id, m.session_id, error.to_string()],
        )? == 1;
    }
    Ok(written)
}

/// The call as an error: its input kept (an input that is not an object, which OpenCode cannot
/// send, becomes `{}`), its output and title gone, its metadata kept without OpenCode's
/// `interrupted` (under which OpenCode would show a partial output as the call's result) and
/// with the repair's marker.
fn write_call(
    conn: &Connection,
    m: &CutMessage,
    part: &ToolPart,
    reason: Interruption,
    left: LeftAs,
    completed: i64,
) -> rusqlite::Result<bool> {
    let start = part.started.unwrap_or(completed);
    let time = json!({"start": start, "end": completed.max(start)});
    let changed = conn.execute(
        "UPDATE part SET data = json_set( \
           json_remove(data, '$.state.output', '$.state.title', '$.state.attachments', \
             '$.state.raw'), \
           '$.state.status', 'error', \
           '$.state.input', json(CASE json_type(data, '$.state.input') \
             WHEN 'object' THEN json_extract(data, '$.state.input') ELSE '{}' END), \
           '$.state.error', ?4, \
           '$.state.time', json(?5), \
           '$.state.metadata', json_set(json_remove(CASE json_type(data, '$.state.metadata') \
             WHEN 'object' THEN json_extract(data, '$.state.metadata') ELSE '{}' END, \
             '$.interrupted'), '$.' || ?6, json(?7))) \
         WHERE id = ?1 AND message_id = ?2 AND session_id = ?3",
        params![
            part.id,
            m.id,
            m.session_id,
            text::call_error(reason),
            time.to_string(),
            text::MARKER,
            text::marker(reason, left),
        ],
    )?;
    Ok(changed == 1)
}
