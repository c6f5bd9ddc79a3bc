//! Writing a joined tree (`exchanges` decided it) into the output, which holds the base's rows:
//! this run's sessions the base lacks are copied whole; into each session both continued go this
//! run's new messages and parts (moved ones under their new ids, every reference to them rewritten),
//! its new events after the base's, and the later activity's session row and todos, with the
//! other run's answers added to its totals.

use std::collections::HashMap;

use rusqlite::types::Value;
use rusqlite::{params, Connection};

use super::exchanges::{
    new_event, Events, SessionJoin, TreeJoin, EVENT_TABLE, ONE, PART_TABLE, SEQUENCE_TABLE,
    TODO_TABLE, TOTALS,
};
use super::graph::{Graph, MESSAGE_TABLE};
use super::plan::Side;
use super::rows::{self, column_list, step, OURS};
use super::schema::{quote, Schema, ACTIVITY_COLUMN, SESSION_TABLE};
use super::MergeError;

/// The temp table of sessions copied whole.
pub const WHOLE: &str = "merge_join";

/// Writes `join`; the rows inserted.
pub fn write(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    join: &TreeJoin,
) -> Result<u64, MergeError> {
    let mut inserted = 0;
    if !join.ours_only.is_empty() {
        rows::fill(conn, WHOLE, join.ours_only.iter())?;
        inserted += rows::insert_tied(conn, schema, graph, WHOLE)?;
    }
    for session in &join.sessions {
        inserted += write_session(conn, schema, graph, session)?;
    }
    Ok(inserted)
}

fn write_session(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    s: &SessionJoin,
) -> Result<u64, MergeError> {
    rows::fill(conn, ONE, std::iter::once(&s.id))?;
    step("listing moved messages", || {
        conn.execute("DELETE FROM temp.merge_move", [])?;
        let mut stmt = conn.prepare("INSERT INTO temp.merge_move VALUES (?1, ?2, ?3)")?;
        for m in &s.moved {
            stmt.execute(params![m.old, m.new, m.time])?;
        }
        Ok(())
    })?;
    let mut inserted = insert_messages(conn, schema, s)?;
    inserted += insert_parts(conn, schema, s)?;
    if let Some(events) = s.events {
        inserted += append_events(conn, schema, s, events)?;
    }
    if s.id != s.into {
        // This run's sub-agents (copied whole) answer to the session it was folded into.
        let sql = format!(
            "UPDATE main.{t} SET parent_id = ?2 WHERE parent_id = ?1",
            t = quote(SESSION_TABLE)
        );
        step("moving sub-agent sessions", || {
            conn.execute(&sql, params![s.id, s.into])
        })?;
    } else if s.later == Side::Ours {
        inserted += take_session_row(conn, schema, graph, &s.id)?;
    }
    adjust_session_row(conn, schema, s)?;
    Ok(inserted)
}

/// This run's new messages; a moved one under its new id and time (in its data too, as OpenCode
/// writes `time.created` into both), and an answer to a moved question pointing at the new id.
fn insert_messages(conn: &Connection, schema: &Schema, s: &SessionJoin) -> Result<u64, MergeError> {
    let moved_data = "CASE WHEN r.old IS NULL THEN m.data \
                      ELSE json_set(m.data, '$.time.created', r.at) END";
    let joins = "LEFT JOIN temp.merge_move r ON r.old = m.id \
                 LEFT JOIN temp.merge_move q \
                   ON q.old = (CASE WHEN json_valid(m.data) THEN json_extract(m.data, '$.parentID') END)";
    insert_new(
        conn,
        schema,
        s,
        MESSAGE_TABLE,
        "m",
        joins,
        |column| match column {
            "id" => Some("coalesce(r.new, m.id)".to_string()),
            "time_created" => Some("coalesce(r.at, m.time_created)".to_string()),
            "data" => Some(format!(
                "CASE WHEN q.old IS NULL THEN {moved_data} \
             ELSE json_set({moved_data}, '$.parentID', q.new) END"
            )),
            _ => None,
        },
    )
}

/// This run's new parts, on their message's new id when it moved.
fn insert_parts(conn: &Connection, schema: &Schema, s: &SessionJoin) -> Result<u64, MergeError> {
    let joins = "LEFT JOIN temp.merge_move r ON r.old = p.message_id";
    insert_new(
        conn,
        schema,
        s,
        PART_TABLE,
        "p",
        joins,
        |column| match column {
            "message_id" => Some("coalesce(r.new, p.message_id)".to_string()),
            _ => None,
        },
    )
}

/// This run's rows of `table` for its session that the output lacks (by id), into the session
/// they join: each column as `column` says, else as it is; `joins` (SQL of this module's own)
/// join the moved messages in.
fn insert_new(
    conn: &Connection,
    schema: &Schema,
    s: &SessionJoin,
    table: &str,
    alias: &str,
    joins: &str,
    column: impl Fn(&str) -> Option<String>,
) -> Result<u64, MergeError> {
    let exprs: Vec<String> = schema.tables[table]
        .columns
        .iter()
        .map(|c| match c.as_str() {
            "session_id" => "?2".to_string(),
            other => column(other).unwrap_or_else(|| format!("{alias}.{}", quote(other))),
        })
        .collect();
    let sql = format!(
        "INSERT INTO main.{t} ({cols}) SELECT {exprs} FROM {OURS}.{t} {alias} {joins} \
         WHERE {alias}.session_id = ?1 AND NOT EXISTS (SELECT 1 FROM main.{t} b WHERE b.id = {alias}.id)",
        t = quote(table),
        cols = column_list(schema, table, None),
        exprs = exprs.join(", "),
    );
    Ok(step(&format!("inserting new rows of {table}"), || {
        conn.execute(&sql, params![s.id, s.into])
    })? as u64)
}

/// This run's new events after the base's, numbered on from its last, with moved ids rewritten
/// in their data; the session's sequence moves to the last. A folded session's own session events
/// stay behind: the session it joins has its own.
fn append_events(
    conn: &Connection,
    schema: &Schema,
    s: &SessionJoin,
    events: Events,
) -> Result<u64, MergeError> {
    let columns = &schema.tables[EVENT_TABLE].columns;
    let at = |name: &str| columns.iter().position(|c| c == name);
    // Invariant: `exchanges` refused a schema without these columns.
    let (seq_at, data_at, aggregate_at) = (
        at("seq").unwrap_or(0),
        at("data").unwrap_or(0),
        at("aggregate_id").unwrap_or(0),
    );
    let mut renamed: HashMap<&str, &str> = s
        .moved
        .iter()
        .map(|m| (m.old.as_str(), m.new.as_str()))
        .collect();
    let folds = s.id != s.into;
    if folds {
        renamed.insert(&s.id, &s.into);
    }
    let t = quote(EVENT_TABLE);
    let cols = column_list(schema, EVENT_TABLE, None);
    let select = format!(
        "SELECT {} FROM {OURS}.{t} e WHERE e.aggregate_id = ?1 AND e.seq >= ?2 AND {} {} ORDER BY e.seq",
        column_list(schema, EVENT_TABLE, Some("e")),
        new_event("main"),
        if folds { "AND e.type NOT LIKE 'session.%'" } else { "" },
    );
    let marks = vec!["?"; columns.len()].join(", ");
    let insert = format!("INSERT INTO main.{t} ({cols}) VALUES ({marks})");
    let last = step("appending new events", || {
        let mut read = conn.prepare(&select)?;
        let mut write = conn.prepare(&insert)?;
        let mut rows = read.query(params![s.id, events.from])?;
        let mut last = events.after;
        while let Some(row) = rows.next()? {
            let mut values: Vec<Value> = (0..columns.len())
                .map(|i| row.get::<_, Value>(i))
                .collect::<rusqlite::Result<_>>()?;
            last = last
                .checked_add(1)
                .ok_or(rusqlite::Error::IntegralValueOutOfRange(seq_at, last))?;
            values[seq_at] = Value::Integer(last);
            values[aggregate_at] = Value::Text(s.into.clone());
            if let Value::Text(data) = &values[data_at] {
                if let Some(new) = rename_ids(data, &renamed) {
                    values[data_at] = Value::Text(new);
                }
            }
            write.execute(rusqlite::params_from_iter(values))?;
        }
        Ok(last)
    })?;
    let sql = format!(
        "UPDATE main.{q} SET seq = max(seq, ?2) WHERE aggregate_id = ?1",
        q = quote(SEQUENCE_TABLE)
    );
    step("moving the event sequence", || {
        conn.execute(&sql, params![s.into, last])
    })?;
    Ok(last.saturating_sub(events.after).max(0) as u64)
}

/// `data` with every quoted message or session id of `renamed` replaced (one pass; `None` when none
/// is in it).
fn rename_ids(data: &str, renamed: &HashMap<&str, &str>) -> Option<String> {
    if renamed.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(data.len());
    let mut rest = data;
    let mut changed = false;
    let next = |rest: &str| {
        ["\"msg_", "\"ses_"]
            .iter()
            .filter_map(|p| rest.find(p))
            .min()
    };
    while let Some(at) = next(rest) {
        out.push_str(&rest[..=at]);
        let token = &rest[at + 1..];
        let Some(end) = token.find('"') else {
            out.push_str(token);
            rest = "";
            break;
        };
        match renamed.get(&token[..end]) {
            Some(new) => {
                out.push_str(new);
                changed = true;
            }
            None => out.push_str(&token[..end]),
        }
        rest = &token[end..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// This run's session row over the base's, and its todos for the base's.
fn take_session_row(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    id: &str,
) -> Result<u64, MergeError> {
    let session = schema.session();
    let key = session.single_key().unwrap_or("id");
    let cols: Vec<String> = session
        .columns
        .iter()
        .filter(|c| *c != key)
        .map(|c| quote(c))
        .collect();
    let sql = format!(
        "UPDATE main.{t} SET ({cols}) = (SELECT {cols} FROM {OURS}.{t} WHERE {k} = ?1) WHERE {k} = ?1",
        t = quote(SESSION_TABLE),
        cols = cols.join(", "),
        k = quote(key),
    );
    step("taking this run's session row", || conn.execute(&sql, [id]))?;
    let todo = quote(TODO_TABLE);
    let cols = column_list(schema, TODO_TABLE, None);
    let delete = format!(
        "DELETE FROM main.{todo} WHERE {}",
        graph.predicate("main", TODO_TABLE, ONE)
    );
    let insert = format!(
        "INSERT INTO main.{todo} ({cols}) SELECT {cols} FROM {OURS}.{todo} WHERE {}",
        graph.predicate(OURS, TODO_TABLE, ONE)
    );
    step("taking this run's todos", || {
        conn.execute(&delete, [])?;
        conn.execute(&insert, [])
    })
    .map(|n| n as u64)
}

/// The later activity, the title only one run changed, and the other run's answers in the totals.
fn adjust_session_row(
    conn: &Connection,
    schema: &Schema,
    s: &SessionJoin,
) -> Result<(), MergeError> {
    let session = schema.session();
    let key = quote(session.single_key().unwrap_or("id"));
    let activity = quote(ACTIVITY_COLUMN);
    let mut sets = vec![format!("{activity} = max({activity}, ?2)")];
    let mut values: Vec<Value> = vec![Value::Text(s.into.clone()), Value::Integer(s.activity)];
    if let Some(title) = &s.title {
        values.push(Value::Text(title.clone()));
        sets.push(format!("title = ?{}", values.len()));
    }
    for (column, sum) in &s.totals {
        let counts = TOTALS.iter().any(|t| t.0 == *column && t.2);
        values.push(if counts {
            Value::Integer(sum.round() as i64)
        } else {
            Value::Real(*sum)
        });
        let c = quote(column);
        sets.push(format!("{c} = coalesce({c}, 0) + ?{}", values.len()));
    }
    let sql = format!(
        "UPDATE main.{t} SET {sets} WHERE {key} = ?1",
        t = quote(SESSION_TABLE),
        sets = sets.join(", ")
    );
    step("joining the session row", || {
        conn.execute(&sql, rusqlite::params_from_iter(values))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quoted_moved_ids_are_renamed() {
        let renamed = HashMap::from([("msg_old", "msg_new")]);
        let data =
            r#"{"info":{"id":"msg_old","parentID":"msg_other"},"text":"msg_old is \"msg_old2\""}"#;
        assert_eq!(
            rename_ids(data, &renamed).unwrap(),
            r#"{"info":{"id":"msg_new","parentID":"msg_other"},"text":"msg_old is \"msg_old2\""}"#
        );
        assert_eq!(rename_ids(r#"{"id":"msg_other"}"#, &renamed), None);
        assert_eq!(
            rename_ids(r#"{"id":"msg_old"#, &renamed),
            None,
            "an unclosed quote"
        );
        assert_eq!(rename_ids("\"msg_", &renamed), None);
    }
}
