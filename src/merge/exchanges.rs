//! Both runs continued the same session tree from the same memory (docs/persistence.md
//! #session-level-merge): instead of keeping only the later turn, the merge keeps both runs' new
//! messages and parts, the session row of the later activity, and every sub-agent session.
//!
//! This module only decides: it reads both sides (the output, a copy of the base, as `main`; this
//! run's database as `ours`) and says how to join each session, or why it cannot
//! ([`Refusal`]: the tree then goes to the later activity, as before, and the summary says why).
//! `join` writes the decision.
//!
//! OpenCode reads a session's history ordered by `(time_created, id)`. Two turns that overlapped
//! in time interleave in that order (a question, a tool step, the other run's question and answer,
//! then the first run's answer), so each exchange is kept together: this run's new messages go
//! after the other run's exchange under way when this run's began, and before the other run's
//! next question; when they do not already fall there, they get new ids and times in OpenCode's
//! format (`reissue`). Only this run's own new messages are ever moved (`Sides::movable`): every
//! other row may also be in memory elsewhere, where a moved copy would come back as a duplicate.

use std::collections::BTreeSet;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection};

use super::graph::{Graph, MESSAGE_TABLE};
use super::plan::{Side, TreePlan, Versions};
use super::reissue::{self, Key};
use super::rows::{self, step, OURS};
use super::schema::{quote, Schema, ACTIVITY_COLUMN, SESSION_TABLE};
use super::MergeError;

pub const PART_TABLE: &str = "part";
pub const EVENT_TABLE: &str = "event";
pub const SEQUENCE_TABLE: &str = "event_sequence";
pub const TODO_TABLE: &str = "todo";
/// The temp table listing the one session being looked at.
pub const ONE: &str = "merge_one";

/// Event types a turn writes (OpenCode 1.18). Any other among a run's new events (a removal, a
/// compaction) is a change the union cannot reconcile.
const TURN_EVENTS: &[&str] = &[
    "message.updated.1",
    "message.part.updated.1",
    "session.updated.1",
];

/// New messages read per side at most; more are refused (bounded work on a hostile database).
const MAX_NEW_MESSAGES: usize = 100_000;

/// Totals OpenCode keeps on the session row as sums over its answers: the column, the path in an
/// assistant message's data, and whether it counts (integer) or costs (real).
pub const TOTALS: &[(&str, &str, bool)] = &[
    ("cost", "$.cost", false),
    ("tokens_input", "$.tokens.input", true),
    ("tokens_output", "$.tokens.output", true),
    ("tokens_reasoning", "$.tokens.reasoning", true),
    ("tokens_cache_read", "$.tokens.cache.read", true),
    ("tokens_cache_write", "$.tokens.cache.write", true),
];
/// A total added is clamped to this (a hostile number must not overflow the row).
const MAX_TOTAL: f64 = 1e15;

/// Columns the union reads or writes, by table.
const NEEDED: &[(&str, &[&str])] = &[
    (
        SESSION_TABLE,
        &["id", "title", "revert", "time_compacting", ACTIVITY_COLUMN],
    ),
    (MESSAGE_TABLE, &["id", "session_id", "time_created", "data"]),
    (PART_TABLE, &["id", "message_id", "session_id", "data"]),
    (EVENT_TABLE, &["id", "aggregate_id", "seq", "type", "data"]),
    (SEQUENCE_TABLE, &["aggregate_id", "seq"]),
    (TODO_TABLE, &["session_id"]),
];
/// Tables the union joins itself; every other table tied to a session must be equal on both sides.
const JOINED: &[&str] = &[
    SESSION_TABLE,
    MESSAGE_TABLE,
    PART_TABLE,
    EVENT_TABLE,
    SEQUENCE_TABLE,
    TODO_TABLE,
];

/// Why a tree both runs changed cannot be joined message by message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A run compacted the session (OpenCode summarised and pruned its history).
    Compacted,
    /// A run reverted part of the session.
    Reverted,
    /// A run recorded an event no turn writes (OpenCode's event type, e.g. a removal).
    Event { kind: String },
    /// A row of `table` both hold differs: a run rewrote shared history.
    Rewritten { table: String },
    /// A message one run lacks is older than their shared history: the other removed it.
    Removed,
    /// A session of the tree that one run lacks was there when this run restored.
    SessionDeleted,
    /// Both runs gave the session a title of their own.
    Retitled,
    /// Rows of `table`, which the union does not join, differ.
    Unjoinable { table: String },
    /// A run's new answer whose question is not among that run's new messages.
    Unanswered,
    /// A new message without a readable id, time or role.
    Malformed,
    /// The exchanges interleave, and this run's cannot be moved next to the other's.
    Interleaved,
    /// More new messages than the merge reads.
    TooLarge,
    /// The schema lacks a column the union needs.
    Schema { table: String, column: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Compacted => f.write_str("one run compacted the session"),
            Refusal::Reverted => f.write_str("one run reverted part of it"),
            Refusal::Event { kind } => write!(
                f,
                "one run recorded `{}`, which no turn writes",
                super::shown(kind)
            ),
            Refusal::Rewritten { table } => write!(
                f,
                "a `{table}` row both hold differs: one run rewrote earlier history"
            ),
            Refusal::Removed => f.write_str("one run removed an earlier message"),
            Refusal::SessionDeleted => f.write_str("one run deleted a session of the thread"),
            Refusal::Retitled => f.write_str("both runs retitled it"),
            Refusal::Unjoinable { table } => write!(f, "their `{table}` rows differ"),
            Refusal::Unanswered => f.write_str("a new answer lacks its question"),
            Refusal::Malformed => f.write_str("a new message cannot be read"),
            Refusal::Interleaved => f.write_str(
                "the exchanges interleave and this run's cannot be moved next to the other's",
            ),
            Refusal::TooLarge => f.write_str("too many new messages to place"),
            Refusal::Schema { table, column } => {
                write!(f, "the schema lacks `{table}.{column}`")
            }
        }
    }
}

/// What the union does with one tree, or why it does not.
#[derive(Debug, Clone, PartialEq)]
pub enum Joining {
    Joined(TreeJoin),
    Refused(Refusal),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TreeJoin {
    /// Sessions only this run holds (a sub-agent it ran): copied whole.
    pub ours_only: Vec<String>,
    /// Sessions both runs continued.
    pub sessions: Vec<SessionJoin>,
    /// Every session of the joined tree.
    pub members: Vec<String>,
}

impl TreeJoin {
    pub fn moved(&self) -> impl Iterator<Item = &Moved> {
        self.sessions.iter().flat_map(|s| &s.moved)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionJoin {
    pub id: String,
    /// Whose session row and todos the result keeps: the later activity's.
    pub later: Side,
    /// The later of both activities.
    pub activity: i64,
    /// The title, when only one run changed it (the other kept the one restored).
    pub title: Option<String>,
    /// Added to the kept row's totals: the other run's new answers' ([`TOTALS`]).
    pub totals: Vec<(&'static str, f64)>,
    /// This run's new messages, copied into the result.
    pub new_messages: usize,
    /// Those of them given a new id and time.
    pub moved: Vec<Moved>,
    /// Where the two event logs part (`None`: they do not): this run's new events are appended
    /// after the base's.
    pub events: Option<Events>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub old: String,
    pub new: String,
    pub time: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// This run's first sequence number the base does not share.
    pub from: i64,
    /// The base's last sequence number: this run's new events follow it.
    pub after: i64,
}

/// Everything the decision reads.
pub struct Sides<'a> {
    pub conn: &'a Connection,
    pub schema: &'a Schema,
    pub graph: &'a Graph,
    pub ours: &'a Versions,
    pub base: &'a Versions,
    pub restored: &'a Versions,
    /// This run's own new messages: only its database holds them, so they may be moved.
    pub movable: &'a BTreeSet<String>,
}

/// A decision that is either made or refused; errors are the database's.
type Checked<T> = Result<Result<T, Refusal>, MergeError>;

macro_rules! refuse_if {
    ($cond:expr, $refusal:expr) => {
        if $cond {
            return Ok(Err($refusal));
        }
    };
}

/// How to join `tree`, which both sides changed; `later` is the side with the later activity.
pub fn plan(sides: &Sides<'_>, tree: &TreePlan, later: Side) -> Result<Joining, MergeError> {
    Ok(match plan_tree(sides, tree, later)? {
        Ok(join) => Joining::Joined(join),
        Err(refusal) => Joining::Refused(refusal),
    })
}

fn plan_tree(sides: &Sides<'_>, tree: &TreePlan, later: Side) -> Checked<TreeJoin> {
    if let Some(refusal) = missing_column(sides.schema) {
        return Ok(Err(refusal));
    }
    let (ours, base) = (&tree.ours_members, &tree.base_members);
    // A session one side lacks is new on the other, unless this run restored it: then one side
    // deleted it (an empty snapshot, the cache's case, knows of no such session).
    let deleted = ours
        .iter()
        .chain(base)
        .any(|id| !(ours.contains(id) && base.contains(id)) && sides.restored.contains_key(id));
    refuse_if!(deleted, Refusal::SessionDeleted);
    let mut sessions = Vec::new();
    for id in ours.iter().filter(|id| base.contains(id)) {
        let same = sides.ours.get(id).map(|v| &v.digest) == sides.base.get(id).map(|v| &v.digest);
        if !same {
            match plan_session(sides, id, later)? {
                Ok(join) => sessions.push(join),
                Err(refusal) => return Ok(Err(refusal)),
            }
        }
    }
    let members: BTreeSet<&String> = ours.iter().chain(base).collect();
    Ok(Ok(TreeJoin {
        ours_only: ours
            .iter()
            .filter(|id| !base.contains(id))
            .cloned()
            .collect(),
        sessions,
        members: members.into_iter().cloned().collect(),
    }))
}

fn missing_column(schema: &Schema) -> Option<Refusal> {
    NEEDED.iter().find_map(|(table, columns)| {
        let t = schema.tables.get(*table);
        columns
            .iter()
            .find(|c| !t.is_some_and(|t| t.has_column(c)))
            .map(|c| Refusal::Schema {
                table: table.to_string(),
                column: c.to_string(),
            })
    })
}

/// One session both runs continued.
fn plan_session(sides: &Sides<'_>, id: &str, later: Side) -> Checked<SessionJoin> {
    let conn = sides.conn;
    rows::fill(conn, ONE, std::iter::once(&id.to_string()))?;
    let title = match session_rows(sides, id)? {
        Ok(title) => title,
        Err(r) => return Ok(Err(r)),
    };
    for table in [MESSAGE_TABLE, PART_TABLE] {
        refuse_if!(
            rewritten(sides, table, id)?,
            Refusal::Rewritten {
                table: table.into()
            }
        );
    }
    if let Some(table) = unjoinable(sides)? {
        return Ok(Err(Refusal::Unjoinable { table }));
    }
    let events = match plan_events(conn, id)? {
        Ok(events) => events,
        Err(r) => return Ok(Err(r)),
    };
    let (ours_new, base_new) = match (
        new_messages(conn, OURS, id)?,
        new_messages(conn, "main", id)?,
    ) {
        (Ok(o), Ok(b)) => (o, b),
        (Err(r), _) | (_, Err(r)) => return Ok(Err(r)),
    };
    for side in [OURS, "main"] {
        if let Some(r) = new_parts(conn, side, id)? {
            return Ok(Err(r));
        }
    }
    let new: Vec<&Message> = ours_new.iter().chain(&base_new).collect();
    if let Err(r) = removed(conn, id, events.map(|e| e.from), &new)? {
        return Ok(Err(r));
    }
    let moved = match place(sides, id, &ours_new, &base_new)? {
        Ok(moved) => moved,
        Err(r) => return Ok(Err(r)),
    };
    let activity = [sides.ours, sides.base]
        .iter()
        .filter_map(|v| v.get(id).map(|s| s.activity))
        .max()
        .unwrap_or_default();
    let other = match later {
        Side::Ours => "main",
        Side::Base => OURS,
    };
    Ok(Ok(SessionJoin {
        id: id.to_string(),
        later,
        activity,
        title,
        totals: totals(sides, other, id)?,
        new_messages: ours_new.len(),
        moved,
        events,
    }))
}

/// Neither run compacted or reverted the session; the title to set, when only one changed it.
fn session_rows(sides: &Sides<'_>, id: &str) -> Checked<Option<String>> {
    let mut titles = Vec::new();
    for db in [OURS, "main"] {
        let sql = format!(
            "SELECT revert IS NOT NULL, time_compacting IS NOT NULL, title FROM {db}.{t} WHERE id = ?1",
            t = quote(SESSION_TABLE)
        );
        let (reverted, compacting, title): (bool, bool, Option<String>) =
            step("reading the session", || {
                sides.conn.query_row(&sql, [id], |r| {
                    Ok((r.get(0)?, r.get(1)?, text(r.get_ref(2)?)))
                })
            })?;
        refuse_if!(reverted, Refusal::Reverted);
        refuse_if!(compacting, Refusal::Compacted);
        titles.push(title);
    }
    let (ours, base) = (&titles[0], &titles[1]);
    if ours == base {
        return Ok(Ok(None));
    }
    let restored = sides.restored.get(id).map(|v| &v.title);
    Ok(match restored {
        Some(r) if r == ours => Ok(base.clone()),
        Some(r) if r == base => Ok(ours.clone()),
        Some(_) | None => Err(Refusal::Retitled),
    })
}

/// Whether a row of `table` (keyed `id`, tied by `session_id`) that both sides hold differs.
fn rewritten(sides: &Sides<'_>, table: &str, session: &str) -> Result<bool, MergeError> {
    let t = quote(table);
    let same: Vec<String> = sides.schema.tables[table]
        .columns
        .iter()
        .map(|c| format!("o.{c} IS m.{c}", c = quote(c)))
        .collect();
    for (x, y) in [(OURS, "main"), ("main", OURS)] {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {x}.{t} m WHERE m.session_id = ?1 \
               AND EXISTS (SELECT 1 FROM {y}.{t} o WHERE o.id = m.id) \
               AND NOT EXISTS (SELECT 1 FROM {y}.{t} o WHERE o.id = m.id AND {same}))",
            same = same.join(" AND ")
        );
        let differs: bool = step(&format!("comparing {table}"), || {
            sides.conn.query_row(&sql, [session], |r| r.get(0))
        })?;
        if differs {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first tied table the union does not join whose rows for the session differ.
fn unjoinable(sides: &Sides<'_>) -> Result<Option<String>, MergeError> {
    for table in sides.graph.tied_order() {
        let columns: Vec<&str> = sides.schema.tables[table]
            .columns
            .iter()
            .map(String::as_str)
            // Both sequences moved on; the union sets the joined one.
            .filter(|c| !(table == SEQUENCE_TABLE && *c == "seq"))
            .collect();
        let joined = JOINED.contains(&table.as_str()) && table != SEQUENCE_TABLE;
        if !joined && rows::differing_rows(sides.conn, sides.graph, table, &columns, ONE)? > 0 {
            return Ok(Some(table.clone()));
        }
    }
    Ok(None)
}

/// Where the two event logs part (both share the base's events, with the same ids at the same
/// sequence numbers), whether the new events are a turn's, and where this run's go. An event id
/// is OpenCode's random one: an event of this run's that the base already holds (this run's
/// version merged into it before) is not new.
fn plan_events(conn: &Connection, id: &str) -> Checked<Option<Events>> {
    let t = quote(EVENT_TABLE);
    let side = |db: &str| format!("SELECT seq, id FROM {db}.{t} WHERE aggregate_id = ?1");
    let (o, b) = (side(OURS), side("main"));
    let sql = format!(
        "SELECT min(s) FROM (SELECT min(seq) AS s FROM ({o} EXCEPT {b}) \
         UNION ALL SELECT min(seq) FROM ({b} EXCEPT {o}))"
    );
    let from = step("comparing events", || {
        conn.query_row(&sql, [id], |r| Ok(int(r.get_ref(0)?)))
    })?;
    let Some(from) = from else {
        return Ok(Ok(None));
    };
    for (x, y) in [(OURS, "main"), ("main", OURS)] {
        let sql = format!(
            "SELECT DISTINCT e.type FROM {x}.{t} e WHERE e.aggregate_id = ?1 AND e.seq >= ?2 \
               AND {new} LIMIT 16",
            new = new_event(y)
        );
        let kinds: Vec<Option<String>> = step("reading event types", || {
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(params![id, from], |r| Ok(text(r.get_ref(0)?)))?;
            rows.collect()
        })?;
        if let Some(kind) = kinds
            .into_iter()
            .find(|k| !k.as_deref().is_some_and(|k| TURN_EVENTS.contains(&k)))
        {
            return Ok(Err(Refusal::Event {
                kind: kind.unwrap_or_default(),
            }));
        }
    }
    let sql = format!(
        "SELECT max(coalesce((SELECT max(seq) FROM main.{t} WHERE aggregate_id = ?1), -1), \
             coalesce((SELECT max(seq) FROM main.{s} WHERE aggregate_id = ?1), -1))",
        s = quote(SEQUENCE_TABLE),
    );
    let after = step("reading events", || {
        conn.query_row(&sql, [id], |r| Ok(int(r.get_ref(0)?)))
    })?;
    let Some(after) = after else {
        return Ok(Err(Refusal::Malformed));
    };
    Ok(Ok(Some(Events { from, after })))
}

/// SQL: the event `e` is not in `other`'s log.
pub fn new_event(other: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM {other}.{t} x WHERE x.id = e.id)",
        t = quote(EVENT_TABLE)
    )
}

/// A message as far as placing one needs.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    time: i64,
    user: bool,
}

impl Message {
    fn key(&self) -> (i64, &str) {
        (self.time, &self.id)
    }
}

/// The messages' columns read for placing them: id, time, and the role and whether it is a
/// compaction's summary from its data (never parsed when the data is not JSON).
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
) -> Result<Result<Vec<MessageRow>, Refusal>, MergeError> {
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

/// `side`'s messages of the session the other side lacks, in OpenCode's order: each run's new
/// exchanges, each a question followed by its answers, none of them a compaction's summary.
fn new_messages(conn: &Connection, side: &str, id: &str) -> Checked<Vec<Message>> {
    let other = if side == OURS { "main" } else { OURS };
    let sql = format!(
        "SELECT {cols} FROM {side}.{t} m \
         WHERE m.session_id = ?1 AND NOT EXISTS (SELECT 1 FROM {other}.{t} o WHERE o.id = m.id) \
         ORDER BY m.time_created, m.id LIMIT ?2",
        cols = message_columns(),
        t = quote(MESSAGE_TABLE),
    );
    let rows = match read_messages(conn, &sql, params![id, MAX_NEW_MESSAGES as i64 + 1])? {
        Ok(rows) => rows,
        Err(r) => return Ok(Err(r)),
    };
    let mut out = Vec::with_capacity(rows.len());
    let mut questions = BTreeSet::new();
    for (id, time, role, parent, summary) in rows {
        let Some(m) = message(id, time, role) else {
            return Ok(Err(Refusal::Malformed));
        };
        refuse_if!(
            !m.user && summary.as_deref() == Some("true"),
            Refusal::Compacted
        );
        // The first new message asks; every answer answers one of this run's new questions.
        let answered = parent.as_ref().is_some_and(|p| questions.contains(p));
        refuse_if!(!m.user && !answered, Refusal::Unanswered);
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

/// A refusal for `side`'s new parts: one on a message both hold (a rewrite of shared history), or
/// a compaction's.
fn new_parts(conn: &Connection, side: &str, id: &str) -> Result<Option<Refusal>, MergeError> {
    let other = if side == OURS { "main" } else { OURS };
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {side}.{p} n WHERE n.session_id = ?1 AND {new} \
           AND EXISTS (SELECT 1 FROM {other}.{m} o WHERE o.id = n.message_id)), \
         EXISTS (SELECT 1 FROM {side}.{p} n WHERE n.session_id = ?1 AND {new} \
           AND (CASE WHEN json_valid(n.data) THEN json_extract(n.data, '$.type') END) = 'compaction')",
        p = quote(PART_TABLE),
        m = quote(MESSAGE_TABLE),
        new = format!(
            "NOT EXISTS (SELECT 1 FROM {other}.{p} o WHERE o.id = n.id)",
            p = quote(PART_TABLE)
        ),
    );
    let (shared, compaction): (bool, bool) = step("reading new parts", || {
        conn.query_row(&sql, [id], |r| Ok((r.get(0)?, r.get(1)?)))
    })?;
    Ok(if compaction {
        Some(Refusal::Compacted)
    } else if shared {
        Some(Refusal::Rewritten {
            table: PART_TABLE.into(),
        })
    } else {
        None
    })
}

/// Whether a message one side lacks was created in the part of the event log both share: then the
/// side that lacks it removed it (OpenCode logs a message's creation as `message.updated.1`).
fn removed(conn: &Connection, id: &str, events_from: Option<i64>, new: &[&Message]) -> Checked<()> {
    let Some(from) = events_from else {
        return Ok(Ok(()));
    };
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
        t = quote(EVENT_TABLE)
    );
    let found: bool = step("reading shared events", || {
        conn.query_row(&sql, params![id, from], |r| r.get(0))
    })?;
    Ok(if found { Err(Refusal::Removed) } else { Ok(()) })
}

/// Where this run's new exchanges go (docs/persistence.md#session-level-merge): each after the
/// exchange under way when it began, before the next question. One that does not already fall
/// there is moved: new ids and times between its neighbours.
fn place(sides: &Sides<'_>, id: &str, ours: &[Message], base: &[Message]) -> Checked<Vec<Moved>> {
    let Some(first) = ours.first() else {
        return Ok(Ok(Vec::new()));
    };
    // What this run's messages must not split: the base's new ones and the shared history from
    // the last message before this run's first.
    let mut fixed = match shared_from(sides.conn, id, first)? {
        Ok(shared) => shared,
        Err(r) => return Ok(Err(r)),
    };
    fixed.extend(base.iter().cloned());
    fixed.sort_by(|a, b| a.key().cmp(&b.key()));
    let mut moved = Vec::new();
    for exchange in ours.chunk_by(|_, next| !next.user) {
        let placed = match place_exchange(sides, &fixed, exchange)? {
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
        let at = fixed.partition_point(|m| m.key() < placed[0].key());
        fixed.splice(at..at, placed);
    }
    Ok(Ok(moved))
}

/// One exchange of this run's, as it stays or moved among `fixed` (sorted).
fn place_exchange(
    sides: &Sides<'_>,
    fixed: &[Message],
    exchange: &[Message],
) -> Result<Result<Vec<Message>, Refusal>, MergeError> {
    let (first, last) = (&exchange[0], &exchange[exchange.len() - 1]);
    let next = fixed.iter().position(|m| m.user && m.key() > first.key());
    let before = next.map(|at| &fixed[at]);
    let after = fixed[..next.unwrap_or(fixed.len())].last();
    let fits =
        after.is_none_or(|a| first.key() > a.key()) && before.is_none_or(|b| last.key() < b.key());
    if fits {
        return Ok(Ok(exchange.to_vec()));
    }
    if !exchange.iter().all(|m| sides.movable.contains(&m.id)) {
        return Ok(Err(Refusal::Interleaved));
    }
    let bound = |m: Option<&Message>| -> Result<Option<Key>, Refusal> {
        m.map(|m| {
            reissue::tick(&m.id, "msg")
                .map(|tick| Key { time: m.time, tick })
                .ok_or(Refusal::Interleaved)
        })
        .transpose()
    };
    let (after, before) = match (bound(after), bound(before)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(r), _) | (_, Err(r)) => return Ok(Err(r)),
    };
    let times: Vec<i64> = exchange.iter().map(|m| m.time).collect();
    let Some(keys) = reissue::place(&times, after, before) else {
        return Ok(Err(Refusal::Interleaved));
    };
    Ok(Ok(exchange
        .iter()
        .zip(keys)
        .map(|(m, k)| Message {
            id: reissue::id("msg", k.tick),
            time: k.time,
            user: m.user,
        })
        .collect()))
}

/// The messages both sides hold from the last one before `first` on (in OpenCode's order).
fn shared_from(conn: &Connection, id: &str, first: &Message) -> Checked<Vec<Message>> {
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
        read_messages(conn, &before, params![id, first.time, first.id])?,
        read_messages(conn, &after, params![id, first.time, first.id, limit])?,
    ];
    let mut out = Vec::new();
    for part in rows {
        let part = match part {
            Ok(rows) => rows,
            Err(r) => return Ok(Err(r)),
        };
        for (id, time, role, _, _) in part {
            // Shared rows are equal on both sides (`rewritten`); one that cannot be read is not
            // this run's to judge, only to stay clear of.
            match message(id.clone(), time, role) {
                Some(m) => out.push(m),
                None => return Ok(Err(Refusal::Malformed)),
            }
        }
    }
    Ok(Ok(out))
}

/// What the other run's new answers add to the kept row's totals.
fn totals(
    sides: &Sides<'_>,
    other: &str,
    id: &str,
) -> Result<Vec<(&'static str, f64)>, MergeError> {
    let kept = if other == OURS { "main" } else { OURS };
    let session = sides.schema.session();
    let mut out = Vec::new();
    for &(column, path, _) in TOTALS.iter().filter(|t| session.has_column(t.0)) {
        let sql = format!(
            "SELECT total(CASE WHEN json_valid(m.data) THEN json_extract(m.data, ?2) END) \
             FROM {other}.{t} m WHERE m.session_id = ?1 \
               AND NOT EXISTS (SELECT 1 FROM {kept}.{t} o WHERE o.id = m.id) \
               AND (CASE WHEN json_valid(m.data) THEN json_extract(m.data, '$.role') END) = 'assistant'",
            t = quote(MESSAGE_TABLE)
        );
        let sum: f64 = step("adding totals", || {
            sides.conn.query_row(&sql, params![id, path], |r| r.get(0))
        })?;
        let sum = if sum.is_finite() {
            sum.clamp(0.0, MAX_TOTAL)
        } else {
            0.0
        };
        if sum > 0.0 {
            out.push((column, sum));
        }
    }
    Ok(out)
}

fn text(v: ValueRef<'_>) -> Option<String> {
    match v {
        ValueRef::Text(t) => std::str::from_utf8(t).ok().map(str::to_string),
        ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) | ValueRef::Blob(_) => None,
    }
}

fn int(v: ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(n) => Some(n),
        ValueRef::Null | ValueRef::Real(_) | ValueRef::Text(_) | ValueRef::Blob(_) => None,
    }
}
