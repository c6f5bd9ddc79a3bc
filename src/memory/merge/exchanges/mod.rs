//! Both runs continued the same session tree from the same memory (docs/persistence.md
//! #session-level-merge): instead of keeping only the later turn, the merge keeps both runs' new
//! messages and parts, the session row of the later activity, and every sub-agent session. Runs
//! that each started a thread's first session (a new issue mentioned at once) are joined the same
//! way: this run's session is folded into the other run's, a union of the rows both hold.
//!
//! This module only decides: it reads both sides (the output, a copy of the base, as `main`; this
//! run's database as `ours`) and says how to join each session, or why it cannot ([`Refusal`]:
//! the tree then goes to the later activity, as before, and the summary says why). Where each of
//! this run's exchanges goes is `placing`'s; `join` writes the decision.

use std::collections::BTreeSet;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection};

mod placing;

use super::graph::{Graph, MESSAGE_TABLE};
use super::plan::{Side, TreePlan, Versions};
use super::rows::{self, step, OURS};
use super::schema::{quote, Schema, ACTIVITY_COLUMN, SESSION_TABLE};
use super::MergeError;
use placing::Message;

pub const PART_TABLE: &str = "part";
pub const EVENT_TABLE: &str = "event";
pub const SEQUENCE_TABLE: &str = "event_sequence";
pub const TODO_TABLE: &str = "todo";
/// The temp table listing the one session being looked at.
pub const ONE: &str = "merge_one";

/// Event types a turn writes (OpenCode 1.18). Any other among a run's new events (a removal, a
/// compaction) is a change the union cannot reconcile. A new session's log starts with
/// `session.created.1` ([`SESSION_STARTED`]).
const TURN_EVENTS: &[&str] = &[
    "message.updated.1",
    "message.part.updated.1",
    "session.updated.1",
];

const SESSION_STARTED: &str = "session.created.1";

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
        &[
            "id",
            "parent_id",
            "title",
            "revert",
            "time_compacting",
            ACTIVITY_COLUMN,
        ],
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
    /// The joined tree's root in the result.
    pub root: String,
    /// This run's new root session folded into the other run's (`root`), when it was.
    pub folded: Option<String>,
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
    /// This run's session.
    pub id: String,
    /// The base's session it joins: the same one, or the other run's session of the same thread
    /// that this run's new one is folded into.
    pub into: String,
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

/// The session of each side being joined.
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    pub ours: &'a str,
    pub base: &'a str,
}

impl Pair<'_> {
    /// This run's new session folded into the other run's (else both continued one session).
    fn folds(&self) -> bool {
        self.ours != self.base
    }

    fn on(&self, db: &str) -> &str {
        if db == OURS {
            self.ours
        } else {
            self.base
        }
    }
}

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

/// How to fold `tree`, this run's session of a thread, into `into`, the base's session of the
/// same thread; `None` when it is not that (then it is added beside it).
///
/// The fold is a union: this run's session may hold exchanges other runs wrote (an entry merged
/// before, itself the fold of two others), and the base may hold some of them already, in `into`
/// (another copy folded them there). Those rows are the same rows whichever session holds them
/// (`rewritten` compares them but for `session_id`), so each is written once, and every
/// copy that folds the thread's sessions, in any order, ends up holding each exchange once.
pub fn plan_fold(
    sides: &Sides<'_>,
    tree: &TreePlan,
    into: &str,
) -> Result<Option<Joining>, MergeError> {
    let root = tree.root.as_str();
    let theirs = sides.base.get(into);
    // Only a thread's root session the base lacks, into one only the base holds.
    let eligible = root != into
        && theirs.is_some_and(|v| v.parent.is_none())
        && !sides.ours.contains_key(into)
        && !sides.restored.contains_key(into)
        && !sides.restored.contains_key(root)
        && tree.base_members.is_empty();
    if !eligible {
        return Ok(None);
    }
    if let Some(refusal) = missing_column(sides.schema) {
        return Ok(Some(Joining::Refused(refusal)));
    }
    let pair = Pair {
        ours: root,
        base: into,
    };
    Ok(Some(match plan_session(sides, pair, Side::Base)? {
        Ok(session) => {
            let mut members: Vec<String> = tree
                .ours_members
                .iter()
                .filter(|m| *m != root)
                .cloned()
                .collect();
            let ours_only = members.clone();
            members.push(into.to_string());
            members.sort();
            Joining::Joined(TreeJoin {
                root: into.to_string(),
                folded: Some(root.to_string()),
                ours_only,
                sessions: vec![session],
                members,
            })
        }
        Err(refusal) => Joining::Refused(refusal),
    }))
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
            let pair = Pair { ours: id, base: id };
            match plan_session(sides, pair, later)? {
                Ok(join) => sessions.push(join),
                Err(refusal) => return Ok(Err(refusal)),
            }
        }
    }
    let members: BTreeSet<&String> = ours.iter().chain(base).collect();
    Ok(Ok(TreeJoin {
        root: tree.root.clone(),
        folded: None,
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

/// One session both runs continued, or this run's new one folded into the other's (then `later`
/// is the base: the session it joins keeps its own row).
fn plan_session(sides: &Sides<'_>, pair: Pair<'_>, later: Side) -> Checked<SessionJoin> {
    let conn = sides.conn;
    rows::fill(conn, ONE, std::iter::once(&pair.ours.to_string()))?;
    let title = match session_rows(sides, pair)? {
        Ok(title) => title,
        Err(r) => return Ok(Err(r)),
    };
    for table in [MESSAGE_TABLE, PART_TABLE] {
        let refusal = Refusal::Rewritten {
            table: table.into(),
        };
        refuse_if!(rewritten(sides, table, pair)?, refusal);
    }
    if let Some(table) = unjoinable(sides, pair)? {
        return Ok(Err(Refusal::Unjoinable { table }));
    }
    let events = match plan_events(conn, pair)? {
        Ok(events) => events,
        Err(r) => return Ok(Err(r)),
    };
    let (ours_new, base_new) = match (
        placing::new_messages(conn, OURS, pair.ours)?,
        placing::new_messages(conn, "main", pair.base)?,
    ) {
        (Ok(o), Ok(b)) => (o, b),
        (Err(r), _) | (_, Err(r)) => return Ok(Err(r)),
    };
    for side in [OURS, "main"] {
        if let Some(r) = new_parts(conn, side, pair.on(side))? {
            return Ok(Err(r));
        }
    }
    if let Some(from) = events.filter(|_| !pair.folds()).map(|e| e.from) {
        let new: Vec<&Message> = ours_new.iter().chain(&base_new).collect();
        refuse_if!(
            placing::removed(conn, pair.base, from, &new)?,
            Refusal::Removed
        );
    }
    let moved = match placing::place(sides, pair, &ours_new, &base_new)? {
        Ok(moved) => moved,
        Err(r) => return Ok(Err(r)),
    };
    let activity = [(sides.ours, pair.ours), (sides.base, pair.base)]
        .iter()
        .filter_map(|(v, id)| v.get(*id).map(|s| s.activity))
        .max()
        .unwrap_or_default();
    let other = match later {
        Side::Ours => "main",
        Side::Base => OURS,
    };
    Ok(Ok(SessionJoin {
        id: pair.ours.to_string(),
        into: pair.base.to_string(),
        later,
        activity,
        title,
        totals: totals(sides, other, pair.on(other))?,
        new_messages: ours_new.len(),
        moved,
        events,
    }))
}

/// Neither run compacted or reverted the session; the title to set, when only one changed it.
fn session_rows(sides: &Sides<'_>, pair: Pair<'_>) -> Checked<Option<String>> {
    let mut titles = Vec::new();
    for db in [OURS, "main"] {
        let sql = format!(
            "SELECT revert IS NOT NULL, time_compacting IS NOT NULL, title FROM {db}.{t} WHERE id = ?1",
            t = quote(SESSION_TABLE)
        );
        let (reverted, compacting, title): (bool, bool, Option<String>) =
            step("reading the session", || {
                sides.conn.query_row(&sql, [pair.on(db)], |r| {
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
    // Two new sessions of one thread carry its one title; they are not folded otherwise.
    let restored = sides
        .restored
        .get(pair.ours)
        .filter(|_| !pair.folds())
        .map(|v| &v.title);
    Ok(match restored {
        Some(r) if r == ours => Ok(base.clone()),
        Some(r) if r == base => Ok(ours.clone()),
        Some(_) | None => Err(Refusal::Retitled),
    })
}

/// Whether a row of `table` (keyed `id`, tied by `session_id`) of one side's session that the
/// other side holds differs there: in any column, or by lying elsewhere than in the other side's
/// session of the pair (for a fold, a row both hold is the same row in either session).
fn rewritten(sides: &Sides<'_>, table: &str, pair: Pair<'_>) -> Result<bool, MergeError> {
    let t = quote(table);
    let same: Vec<String> = sides.schema.tables[table]
        .columns
        .iter()
        .filter(|c| *c != "session_id")
        .map(|c| format!("o.{c} IS m.{c}", c = quote(c)))
        .chain(std::iter::once("o.session_id = ?2".to_string()))
        .collect();
    for (x, y) in [(OURS, "main"), ("main", OURS)] {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {x}.{t} m WHERE m.session_id = ?1 \
               AND EXISTS (SELECT 1 FROM {y}.{t} o WHERE o.id = m.id) \
               AND NOT EXISTS (SELECT 1 FROM {y}.{t} o WHERE o.id = m.id AND {same}))",
            same = same.join(" AND ")
        );
        let differs: bool = step(&format!("comparing {table}"), || {
            sides
                .conn
                .query_row(&sql, params![pair.on(x), pair.on(y)], |r| r.get(0))
        })?;
        if differs {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first tied table the union does not join whose rows for the session differ (for a fold:
/// where this run's session has any).
fn unjoinable(sides: &Sides<'_>, pair: Pair<'_>) -> Result<Option<String>, MergeError> {
    for table in sides.graph.tied_order() {
        let joined = JOINED.contains(&table.as_str());
        let differs = match (pair.folds(), joined) {
            // A session folded in brings only its messages, parts, events and sub-agents.
            (true, true) => false,
            (true, false) => {
                let sql = format!(
                    "SELECT EXISTS (SELECT 1 FROM {OURS}.{} WHERE {})",
                    quote(table),
                    sides.graph.predicate(OURS, table, ONE)
                );
                step(&format!("reading {table}"), || {
                    sides.conn.query_row(&sql, [], |r| r.get::<_, bool>(0))
                })?
            }
            (false, true) if table != SEQUENCE_TABLE => false,
            (false, _) => {
                // Both sequences moved on; the union sets the joined one.
                let columns: Vec<&str> = sides.schema.tables[table]
                    .columns
                    .iter()
                    .map(String::as_str)
                    .filter(|c| !(table == SEQUENCE_TABLE && *c == "seq"))
                    .collect();
                rows::differing_rows(sides.conn, sides.graph, table, &columns, ONE)? > 0
            }
        };
        if differs {
            return Ok(Some(table.clone()));
        }
    }
    Ok(None)
}

/// Where the two event logs part (both share the base's events, with the same ids at the same
/// sequence numbers; a folded session's log is all new), whether the new events are a turn's, and
/// where this run's go. An event id is OpenCode's random one: an event of this run's that the base
/// already holds (this run's version merged into it before) is not new.
fn plan_events(conn: &Connection, pair: Pair<'_>) -> Checked<Option<Events>> {
    let t = quote(EVENT_TABLE);
    let from = if pair.folds() {
        Some(i64::MIN)
    } else {
        let side = |db: &str| format!("SELECT seq, id FROM {db}.{t} WHERE aggregate_id = ?1");
        let (o, b) = (side(OURS), side("main"));
        let sql = format!(
            "SELECT min(s) FROM (SELECT min(seq) AS s FROM ({o} EXCEPT {b}) \
             UNION ALL SELECT min(seq) FROM ({b} EXCEPT {o}))"
        );
        step("comparing events", || {
            conn.query_row(&sql, [pair.ours], |r| Ok(int(r.get_ref(0)?)))
        })?
    };
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
            let rows = stmt.query_map(params![pair.on(x), from], |r| Ok(text(r.get_ref(0)?)))?;
            rows.collect()
        })?;
        let turn = |k: &str| TURN_EVENTS.contains(&k) || (pair.folds() && k == SESSION_STARTED);
        if let Some(kind) = kinds.into_iter().find(|k| !k.as_deref().is_some_and(turn)) {
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
        conn.query_row(&sql, [pair.base], |r| Ok(int(r.get_ref(0)?)))
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

/// A refusal for `side`'s new parts of `session`: one on a message both hold (a rewrite of shared
/// history), or a compaction's.
fn new_parts(conn: &Connection, side: &str, session: &str) -> Result<Option<Refusal>, MergeError> {
    let other = if side == OURS { "main" } else { OURS };
    let p = quote(PART_TABLE);
    let new = format!("NOT EXISTS (SELECT 1 FROM {other}.{p} o WHERE o.id = n.id)");
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {side}.{p} n WHERE n.session_id = ?1 AND {new} \
           AND EXISTS (SELECT 1 FROM {other}.{m} o WHERE o.id = n.message_id)), \
         EXISTS (SELECT 1 FROM {side}.{p} n WHERE n.session_id = ?1 AND {new} \
           AND (CASE WHEN json_valid(n.data) THEN json_extract(n.data, '$.type') END) = 'compaction')",
        m = quote(MESSAGE_TABLE),
    );
    let (shared, compaction): (bool, bool) = step("reading new parts", || {
        conn.query_row(&sql, [session], |r| Ok((r.get(0)?, r.get(1)?)))
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

/// What the other run's new answers (`other`'s session `session`) add to the kept row's totals:
/// one pass over them.
fn totals(
    sides: &Sides<'_>,
    other: &str,
    session: &str,
) -> Result<Vec<(&'static str, f64)>, MergeError> {
    let kept = if other == OURS { "main" } else { OURS };
    let columns = sides.schema.session();
    let wanted: Vec<(&'static str, &'static str)> = TOTALS
        .iter()
        .filter(|t| columns.has_column(t.0))
        .map(|t| (t.0, t.1))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    // Paths are this module's constants, never a database's text.
    let sums: Vec<String> = wanted
        .iter()
        .map(|(_, path)| {
            format!(
                "total({})",
                json(&format!("json_extract(m.data, '{path}')"))
            )
        })
        .collect();
    let sql = format!(
        "SELECT {sums} FROM {other}.{t} m WHERE m.session_id = ?1 \
           AND NOT EXISTS (SELECT 1 FROM {kept}.{t} o WHERE o.id = m.id) \
           AND {role} = 'assistant'",
        sums = sums.join(", "),
        role = json("json_extract(m.data, '$.role')"),
        t = quote(MESSAGE_TABLE)
    );
    let found: Vec<f64> = step("adding totals", || {
        sides.conn.query_row(&sql, [session], |r| {
            (0..wanted.len()).map(|i| r.get::<_, f64>(i)).collect()
        })
    })?;
    Ok(wanted
        .iter()
        .zip(found)
        .map(|((column, _), sum)| {
            let sum = if sum.is_finite() {
                sum.clamp(0.0, MAX_TOTAL)
            } else {
                0.0
            };
            (*column, sum)
        })
        .filter(|(_, sum)| *sum > 0.0)
        .collect())
}

/// `expr` (reading `m.data`) only when `m.data` is JSON: SQLite's JSON functions fail on text that
/// is not, and restored rows may hold any.
fn json(expr: &str) -> String {
    format!("(CASE WHEN json_valid(m.data) THEN {expr} END)")
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
