//! Each side's new messages, and where this run's go among the other's (docs/persistence.md
//! #session-level-merge).
//!
//! OpenCode reads a session's history ordered by `(time_created, id)`. Two turns that overlapped
//! in time interleave in that order (a question, a tool step, the other run's question and answer,
//! then the first run's answer), so each exchange of this run's goes after the exchange under way
//! when it began and before the next question; one that does not already fall there gets new ids
//! and times in OpenCode's format (`reissue`). Only this run's own new messages ever move
//! (`Sides::movable`): every other row may be in memory elsewhere too, where a moved copy would
//! come back as a duplicate.

use std::collections::BTreeSet;

use rusqlite::{params, Connection};

use super::{int, step, text, Checked, Moved, Pair, Refusal, Sides, MAX_NEW_MESSAGES};
use crate::memory::merge::graph::MESSAGE_TABLE;
use crate::memory::merge::reissue::{self, Key};
use crate::memory::merge::rows::OURS;
use crate::memory::merge::schema::quote;
use crate::memory::merge::MergeError;

/// A message as far as placing one needs.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    time: i64,
    user: bool,
}

impl Message {
    fn key(&self) -> (i64, &str) {
        (self.time, &self.id)
    }
}

/// The messages' columns read for placing them: id, time, and the role, the question answered
/// and whether it is a compaction's summary from its data (never parsed when it is not JSON).
fn message_columns() -> String {
    let json = |path: &str| format!("CASE WHEN json_valid(m.data) THEN {path} END");
    format!(
        "m.id, m.time_created, {}, {}, {}",
        json("json_extract(m.data, '$.role')"),
        json("json_extract(m.data, '$.parentID')"),
        json("json_type(m.data, '$.summary')"),
    )
}

type MessageRow = (
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Runs `sql` (selecting [`message_columns`]) with `args`: at most [`MAX_NEW_MESSAGES`] rows.
fn read_messages(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Checked<Vec<MessageRow>> {
    let rows: Vec<MessageRow> = step("reading messages", || {
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt.query_map(args, |r| {
            Ok((
                text(r.get_ref(0)?),
                int(r.get_ref(1)?),
                text(r.get_ref(2)?),
                text(r.get_ref(3)?),
                text(r.get_ref(4)?),
            ))
        })?;
        rows.collect()
    })?;
    Ok(if rows.len() > MAX_NEW_MESSAGES {
        Err(Refusal::TooLarge)
    } else {
        Ok(rows)
    })
}

/// `side`'s messages of `session` the other side lacks, in OpenCode's order: each run's new
/// exchanges, each a question followed by its answers, none of them a compaction's summary.
pub fn new_messages(conn: &Connection, side: &str, session: &str) -> Checked<Vec<Message>> {
    let other = if side == OURS { "main" } else { OURS };
    let sql = format!(
        "SELECT {cols} FROM {side}.{t} m \
         WHERE m.session_id = ?1 AND NOT EXISTS (SELECT 1 FROM {other}.{t} o WHERE o.id = m.id) \
         ORDER BY m.time_created, m.id LIMIT ?2",
        cols = message_columns(),
        t = quote(MESSAGE_TABLE),
    );
    let limit = MAX_NEW_MESSAGES as i64 + 1;
    let rows = match read_messages(conn, &sql, params![session, limit])? {
        Ok(rows) => rows,
        Err(r) => return Ok(Err(r)),
    };
    let mut out = Vec::with_capacity(rows.len());
    let mut questions = BTreeSet::new();
    for (id, time, role, parent, summary) in rows {
        let Some(m) = message(id, time, role) else {
            return Ok(Err(Refusal::Malformed));
        };
        if !m.user && summary.as_deref() == Some("true") {
            return Ok(Err(Refusal::Compacted));
        }
        // The first new message asks; every answer answers one of this run's new questions.
        let answered = parent.as_ref().is_some_and(|p| questions.contains(p));
        if !m.user && !answered {
            return Ok(Err(Refusal::Unanswered));
        }
        if m.user {
            questions.insert(m.id.clone());
        }
        out.push(m);
    }
    Ok(Ok(out))
}

fn message(id: Option<String>, time: Option<i64>, role: Option<String>) -> Option<Message> {
    let user = match role.as_deref()? {
        "user" => true,
        "assistant" => false,
        _ => return None,
    };
    Some(Message {
        id: id?,
        time: time?,
        user,
    })
}

/// Where this run's new exchanges go: each after the exchange under way when it began, before
/// the next question. One that does not already fall there is moved: new ids and times between
/// its neighbours. One walk over both lists (a hostile base may hold many new messages).
pub fn place(
    sides: &Sides<'_>,
    pair: Pair<'_>,
    ours: &[Message],
    base: &[Message],
) -> Checked<Vec<Moved>> {
    let Some(first) = ours.first() else {
        return Ok(Ok(Vec::new()));
    };
    // What this run's messages must not split: the base's new ones and the shared history from
    // the last message before this run's first.
    let mut fixed = match shared_from(sides.conn, pair.base, first)? {
        Ok(shared) => shared,
        Err(r) => return Ok(Err(r)),
    };
    fixed.extend(base.iter().cloned());
    fixed.sort_by(|a, b| a.key().cmp(&b.key()));
    // The first question at or after each index.
    let mut next_question = vec![fixed.len(); fixed.len() + 1];
    for i in (0..fixed.len()).rev() {
        next_question[i] = if fixed[i].user {
            i
        } else {
            next_question[i + 1]
        };
    }
    let mut moved = Vec::new();
    let (mut cursor, mut last): (usize, Option<Message>) = (0, None);
    for exchange in ours.chunk_by(|_, next| !next.user) {
        // Invariant: `chunk_by` yields no empty slice.
        let start = exchange[0].key();
        while cursor < fixed.len() && fixed[cursor].key() < start {
            cursor += 1;
        }
        let next = next_question[cursor];
        let before = fixed.get(next);
        // After the last message before that question, and after this run's exchange before.
        let after = match (next.checked_sub(1).map(|i| &fixed[i]), last.as_ref()) {
            (Some(f), Some(l)) => Some(if f.key() > l.key() { f } else { l }),
            (f, l) => f.or(l),
        };
        let placed = match place_exchange(sides, after, before, exchange) {
            Ok(placed) => placed,
            Err(r) => return Ok(Err(r)),
        };
        moved.extend(
            exchange
                .iter()
                .zip(&placed)
                .filter(|(o, p)| o.id != p.id)
                .map(|(o, p)| Moved {
                    old: o.id.clone(),
                    new: p.id.clone(),
                    time: p.time,
                }),
        );
        last = placed.last().cloned();
    }
    Ok(Ok(moved))
}

/// One exchange of this run's (a question and its answers), as it stays or moved between `after`
/// and `before`.
fn place_exchange(
    sides: &Sides<'_>,
    after: Option<&Message>,
    before: Option<&Message>,
    exchange: &[Message],
) -> Result<Vec<Message>, Refusal> {
    // Invariant: the caller passes a non-empty exchange.
    let (first, last) = (&exchange[0], &exchange[exchange.len() - 1]);
    let fits =
        after.is_none_or(|a| first.key() > a.key()) && before.is_none_or(|b| last.key() < b.key());
    if fits {
        return Ok(exchange.to_vec());
    }
    if !exchange.iter().all(|m| sides.movable.contains(&m.id)) {
        return Err(Refusal::Interleaved);
    }
    let bound = |m: Option<&Message>| -> Result<Option<Key>, Refusal> {
        m.map(|m| {
            reissue::tick(&m.id, "msg")
                .map(|tick| Key { time: m.time, tick })
                .ok_or(Refusal::Interleaved)
        })
        .transpose()
    };
    let times: Vec<i64> = exchange.iter().map(|m| m.time).collect();
    let keys = reissue::place(&times, bound(after)?, bound(before)?).ok_or(Refusal::Interleaved)?;
    Ok(exchange
        .iter()
        .zip(keys)
        .map(|(m, k)| Message {
            id: reissue::id("msg", k.tick),
            time: k.time,
            user: m.user,
        })
        .collect())
}

/// The messages of `session` both sides hold from the last one before `first` on (in OpenCode's
/// order).
fn shared_from(conn: &Connection, session: &str, first: &Message) -> Checked<Vec<Message>> {
    let t = quote(MESSAGE_TABLE);
    let shared = format!(
        "SELECT {cols} FROM main.{t} m WHERE m.session_id = ?1 \
           AND EXISTS (SELECT 1 FROM {OURS}.{t} o WHERE o.id = m.id)",
        cols = message_columns()
    );
    let before = format!(
        "{shared} AND (m.time_created, m.id) < (?2, ?3) \
         ORDER BY m.time_created DESC, m.id DESC LIMIT 1"
    );
    let after = format!(
        "{shared} AND (m.time_created, m.id) > (?2, ?3) ORDER BY m.time_created, m.id LIMIT ?4"
    );
    let limit = MAX_NEW_MESSAGES as i64 + 1;
    let rows = [
        read_messages(conn, &before, params![session, first.time, first.id])?,
        read_messages(conn, &after, params![session, first.time, first.id, limit])?,
    ];
    let mut out = Vec::new();
    for part in rows {
        let part = match part {
            Ok(rows) => rows,
            Err(r) => return Ok(Err(r)),
        };
        for (id, time, role, _, _) in part {
            // Shared rows are equal on both sides (`rewritten`); one that cannot be read cannot
            // be placed around.
            match message(id, time, role) {
                Some(m) => out.push(m),
                None => return Ok(Err(Refusal::Malformed)),
            }
        }
    }
    Ok(Ok(out))
}

/// Whether a message one side lacks was created in the part of the event log both share: then the
/// side that lacks it removed it (OpenCode logs a message's creation as `message.updated.1`).
pub fn removed(
    conn: &Connection,
    session: &str,
    events_from: i64,
    new: &[&Message],
) -> Result<bool, MergeError> {
    step("listing new messages", || {
        conn.execute("DELETE FROM temp.merge_new", [])?;
        let mut stmt = conn.prepare("INSERT OR IGNORE INTO temp.merge_new VALUES (?1)")?;
        for m in new {
            stmt.execute([&m.id])?;
        }
        Ok(())
    })?;
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM main.{t} e WHERE e.aggregate_id = ?1 \
           AND e.type = 'message.updated.1' AND e.seq < ?2 \
           AND (CASE WHEN json_valid(e.data) THEN json_extract(e.data, '$.info.id') END) \
               IN (SELECT id FROM temp.merge_new))",
        t = quote(super::EVENT_TABLE)
    );
    step("reading shared events", || {
        conn.query_row(&sql, params![session, events_from], |r| r.get(0))
    })
}
