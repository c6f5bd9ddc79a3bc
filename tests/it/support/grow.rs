//! Grows a real OpenCode database: one session OpenCode itself wrote (its real rows: session,
//! messages, parts, events) is cloned into many sessions with new OpenCode-style ids, generated
//! text and shifted times. `benches/run.rs` grows its database to a size with it; the tests grow
//! one to thousands of sessions (tests/it/e2e/many_sessions.rs).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use rusqlite::types::Value as Sql;
use serde_json::Value;

/// How a database is grown.
#[derive(Debug, Clone)]
pub struct Growth {
    /// Stop once the file holds this many bytes...
    pub bytes: u64,
    /// ...or this many new sessions.
    pub sessions: usize,
    /// Exchanges (cloned turns of the template) per session.
    pub exchanges: usize,
    /// When the first new session starts (ms since the epoch); each next one `step_ms` later.
    pub first_ms: i64,
    pub step_ms: i64,
    /// Bytes of generated prose per text part, and of generated source per tool output.
    pub prose: Range<usize>,
    pub code: Range<usize>,
    /// Session `s` is titled `fro-bot: issue-{first_issue + s}`.
    pub first_issue: usize,
}

impl Growth {
    /// The whole-run benchmark's growth: long-ish conversations (12 exchanges), an hour apart from
    /// five days ago, until the file reaches `bytes` (1000 sessions at most).
    pub fn bench(bytes: u64) -> Self {
        Self {
            bytes,
            sessions: 1000,
            exchanges: 12,
            first_ms: epoch_ms() - 5 * 86_400_000,
            step_ms: 3_600_000,
            prose: 400..2_500,
            code: 3_000..9_000,
            first_issue: 100,
        }
    }

    /// `sessions` short conversations (one exchange of little text), `step_ms` apart from
    /// `first_ms`, whatever the size.
    pub fn many(sessions: usize, first_ms: i64, step_ms: i64) -> Self {
        Self {
            bytes: u64::MAX,
            sessions,
            exchanges: 1,
            first_ms,
            step_ms,
            prose: 40..120,
            code: 40..120,
            first_issue: 100,
        }
    }
}

/// What a growth added.
#[derive(Debug, Clone, Default)]
pub struct Grown {
    /// The file's size after it.
    pub bytes: u64,
    pub sessions: usize,
    pub messages: usize,
    pub parts: usize,
    pub events: usize,
    /// The new sessions' ids, in the order they were made (oldest first).
    pub ids: Vec<String>,
}

pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type Row = Vec<(String, Sql)>;

/// The template session's rows, and the texts worth replacing by generated ones.
struct Template {
    id: String,
    session: Row,
    messages: Vec<Row>,
    parts: Vec<Row>,
    events: Vec<Row>,
    sequence: Option<Row>,
    created_ms: i64,
    /// User prompts and assistant answers (text parts: `false`), tool outputs (`true`).
    texts: Vec<(String, bool)>,
}

impl Template {
    fn read(conn: &rusqlite::Connection, id: &str) -> Self {
        let session = rows(conn, "SELECT * FROM session WHERE id = ?1", id)
            .into_iter()
            .next()
            .expect("template session row");
        let parts = rows(
            conn,
            "SELECT * FROM part WHERE session_id = ?1 ORDER BY id",
            id,
        );
        let created_ms = match get(&session, "time_created") {
            Sql::Integer(n) => *n,
            _ => 0,
        };
        Template {
            id: id.to_string(),
            messages: rows(
                conn,
                "SELECT * FROM message WHERE session_id = ?1 ORDER BY id",
                id,
            ),
            events: rows(
                conn,
                "SELECT * FROM event WHERE aggregate_id = ?1 ORDER BY seq",
                id,
            ),
            sequence: rows(
                conn,
                "SELECT * FROM event_sequence WHERE aggregate_id = ?1",
                id,
            )
            .into_iter()
            .next(),
            texts: grow_texts(&parts),
            session,
            parts,
            created_ms,
        }
    }
}

fn grow_texts(parts: &[Row]) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for p in parts {
        let Ok(j) = serde_json::from_str::<Value>(text(get(p, "data"))) else {
            continue;
        };
        match j["type"].as_str() {
            Some("text") => {
                if let Some(t) = j["text"].as_str().filter(|t| !t.starts_with("--- Fro Bot")) {
                    out.push((t.to_string(), false));
                }
            }
            Some("tool") => {
                if let Some(t) = j["state"]["output"].as_str() {
                    out.push((t.to_string(), true));
                }
            }
            _ => {}
        }
    }
    out
}

/// Grows `db` by cloning session `template` (its real rows) into new sessions as `growth` says.
pub fn grow(db: &Path, template: &str, growth: &Growth) -> Grown {
    let mut conn = rusqlite::Connection::open(db).expect("open the session database");
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page size");
    let tpl = Template::read(&conn, template);
    let tx = conn.transaction().expect("transaction");
    let mut counter: u64 = 1;
    let mut grown = Grown::default();
    for s in 0..growth.sessions {
        let used: i64 = tx
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .expect("page count");
        if (used * page_size) as u64 >= growth.bytes {
            break;
        }
        clone_session(&tx, &tpl, growth, s, &mut counter, &mut grown);
    }
    tx.commit().expect("commit");
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .expect("checkpoint");
    drop(conn);
    grown.bytes = std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
    grown
}

/// Session `s`: the template's session row under a new id, title and times, then its exchanges.
fn clone_session(
    tx: &rusqlite::Transaction<'_>,
    tpl: &Template,
    growth: &Growth,
    s: usize,
    counter: &mut u64,
    grown: &mut Grown,
) {
    let session_ms = growth.first_ms + (s as i64) * growth.step_ms;
    let sid = new_id("ses_", session_ms, *counter, true);
    *counter += 1;
    let mut row = tpl.session.clone();
    rewrite(&mut row, &[], &HashMap::new(), session_ms - tpl.created_ms);
    set(&mut row, "id", Sql::Text(sid.clone()));
    let title = format!("fro-bot: issue-{}", growth.first_issue + s);
    set(&mut row, "title", Sql::Text(title));
    set(&mut row, "slug", Sql::Text(format!("grown-{s}")));
    let updated = session_ms + (growth.exchanges as i64) * 60_000;
    set(&mut row, "time_updated", Sql::Integer(updated));
    insert(tx, "session", &row);
    // Events reference their sequence row, so it goes first; its seq is set at the end.
    if let Some(tpl_seq) = &tpl.sequence {
        let mut row = tpl_seq.clone();
        set(&mut row, "aggregate_id", Sql::Text(sid.clone()));
        insert(tx, "event_sequence", &row);
    }
    let mut seq: i64 = 0;
    for x in 0..growth.exchanges {
        let shift = session_ms + (x as i64) * 60_000 - tpl.created_ms;
        clone_exchange(tx, tpl, growth, &sid, shift, counter, &mut seq);
        grown.messages += tpl.messages.len();
        grown.parts += tpl.parts.len();
        grown.events += tpl.events.len();
    }
    tx.execute(
        "UPDATE event_sequence SET seq = ?1 WHERE aggregate_id = ?2",
        rusqlite::params![seq - 1, sid],
    )
    .expect("event sequence");
    grown.sessions += 1;
    grown.ids.push(sid);
}

/// One exchange: the template's messages, parts and events under new ids, with new texts.
fn clone_exchange(
    tx: &rusqlite::Transaction<'_>,
    tpl: &Template,
    growth: &Growth,
    sid: &str,
    shift: i64,
    counter: &mut u64,
    seq: &mut i64,
) {
    let mut ids = vec![(tpl.id.clone(), sid.to_string())];
    for r in tpl.messages.iter().chain(&tpl.parts).chain(&tpl.events) {
        let old = text(get(r, "id")).to_string();
        let new = new_id(&old[..4], tpl.created_ms + shift, *counter, false);
        ids.push((old, new));
        *counter += 1;
    }
    let mut rng = rand::rng();
    let texts: HashMap<String, String> = tpl
        .texts
        .iter()
        .map(|(t, is_code)| {
            let new = match is_code {
                true => code(rng.random_range(growth.code.clone())),
                false => prose(rng.random_range(growth.prose.clone())),
            };
            (t.clone(), new)
        })
        .collect();
    for (table, list) in [
        ("message", &tpl.messages),
        ("part", &tpl.parts),
        ("event", &tpl.events),
    ] {
        for r in list {
            let mut row = r.clone();
            rewrite(&mut row, &ids, &texts, shift);
            if table == "event" {
                set(&mut row, "seq", Sql::Integer(*seq));
                *seq += 1;
            }
            insert(tx, table, &row);
        }
    }
}

fn rows(conn: &rusqlite::Connection, sql: &str, key: &str) -> Vec<Row> {
    let mut stmt = conn.prepare(sql).expect("prepare");
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    stmt.query_map([key], |r| {
        (0..names.len())
            .map(|i| Ok((names[i].clone(), r.get::<_, Sql>(i)?)))
            .collect::<Result<Row, _>>()
    })
    .expect("query")
    .collect::<Result<Vec<_>, _>>()
    .expect("rows")
}

fn insert(conn: &rusqlite::Connection, table: &str, row: &Row) {
    let cols: Vec<String> = row.iter().map(|(c, _)| format!("`{c}`")).collect();
    let marks: Vec<&str> = row.iter().map(|_| "?").collect();
    let sql = format!(
        "INSERT INTO `{table}` ({}) VALUES ({})",
        cols.join(","),
        marks.join(",")
    );
    conn.prepare_cached(&sql)
        .expect("prepare insert")
        .execute(rusqlite::params_from_iter(row.iter().map(|(_, v)| v)))
        .expect("insert");
}

fn get<'a>(row: &'a Row, col: &str) -> &'a Sql {
    &row.iter().find(|(c, _)| c == col).expect("column").1
}

fn set(row: &mut Row, col: &str, v: Sql) {
    if let Some(slot) = row.iter_mut().find(|(c, _)| c == col) {
        slot.1 = v;
    }
}

fn text(v: &Sql) -> &str {
    match v {
        Sql::Text(s) => s,
        _ => "",
    }
}

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// An OpenCode-style id: prefix, 12 hex digits of (ms × 4096 + counter) (bit-inverted for
/// sessions, which sort newest first), 14 random base62 characters.
pub fn new_id(prefix: &str, ms: i64, counter: u64, descending: bool) -> String {
    let mut n = ((ms as u64) << 12).wrapping_add(counter) & 0xFFFF_FFFF_FFFF;
    if descending {
        n = !n & 0xFFFF_FFFF_FFFF;
    }
    let mut rng = rand::rng();
    let tail: String = (0..14)
        .map(|_| BASE62[rng.random_range(0..BASE62.len())] as char)
        .collect();
    format!("{prefix}{n:012x}{tail}")
}

const WORDS_TEXT: &str =
    "the cache build timeout flaky test runner session database restore save retry because \
     when error commit branch workflow function module returns value config parser thread \
     lock queue request response status handler struct field pointer buffer async await \
     future stream token header client server port socket file path directory archive zstd \
     tar sqlite checkpoint WAL page index query insert update delete row column schema \
     migration version release deploy pipeline job step matrix linux memory CPU latency \
     throughput p99 regression benchmark fix patch review comment issue pull merge conflict \
     rebase upstream fork permission secret mask log trace warning panic unwrap result option \
     enum match trait impl generic lifetime borrow clone copy drop arc mutex channel zebra \
     walrus otter heron maple cedar granite cobalt amber quartz";
static WORDS: LazyLock<Vec<&str>> = LazyLock::new(|| WORDS_TEXT.split_whitespace().collect());

const SYLLABLES_TEXT: &str =
    "ka lo mi ren tor vax qui zel dra pon sil mur gex fa bri nok tul wen yas hep cor dun lix \
     mav ost pra sek tiv ulm vor jab kel nim rou sha thr ep ix ob ag";
static SYLLABLES: LazyLock<Vec<&str>> =
    LazyLock::new(|| SYLLABLES_TEXT.split_whitespace().collect());

/// A word for generated text: mostly common words, often a project-specific identifier, a number
/// or a hash, as in real transcripts (which compress about 3–5× with zstd).
fn word(rng: &mut impl Rng) -> String {
    match rng.random_range(0..10) {
        0..=5 => WORDS[rng.random_range(0..WORDS.len())].to_string(),
        6..=8 => (0..rng.random_range(2..4))
            .map(|_| SYLLABLES[rng.random_range(0..SYLLABLES.len())])
            .collect(),
        _ => {
            if rng.random_bool(0.5) {
                rng.random_range(0..100_000u32).to_string()
            } else {
                format!("{:08x}", rng.random::<u32>())
            }
        }
    }
}

/// Prose-like text of about `len` bytes (compresses roughly like real transcripts, ~3×).
pub fn prose(len: usize) -> String {
    let mut rng = rand::rng();
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        let n = rng.random_range(6..18);
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(&word(&mut rng));
        }
        s.push_str(if rng.random_bool(0.2) { ".\n\n" } else { ". " });
    }
    s
}

/// Source-like text of about `len` bytes, as a `read` tool's output (numbered lines).
pub fn code(len: usize) -> String {
    let mut rng = rand::rng();
    let mut s = String::with_capacity(len + 64);
    let mut line = 1;
    while s.len() < len {
        let indent = "    ".repeat(rng.random_range(0..4));
        let (a, b, c) = (word(&mut rng), word(&mut rng), word(&mut rng));
        let n: u32 = rng.random_range(0..10_000);
        let body = match rng.random_range(0..5) {
            0 => format!("let {a}_{b} = {c}(&{a}, {n})?;"),
            1 => format!("fn {a}_{b}({c}: &str) -> Result<u64, Error> {{"),
            2 => format!("// {a} {b} {c}: keep {n} for the {b}"),
            3 => format!("if {a}.{b}() > {n} {{ return Err({c}); }}"),
            _ => "}".to_string(),
        };
        s.push_str(&format!("{line:05}| {indent}{body}\n"));
        line += 1;
    }
    s
}

/// Replaces every string in `v` that is a key of `map` (template texts → generated texts).
fn swap_strings(v: &mut Value, map: &HashMap<String, String>) {
    match v {
        Value::String(s) => {
            if let Some(new) = map.get(s.as_str()) {
                *s = new.clone();
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| swap_strings(x, map)),
        Value::Object(o) => o.values_mut().for_each(|x| swap_strings(x, map)),
        _ => {}
    }
}

/// Rewrites a cloned row: ids, JSON texts, and timestamps shifted by `shift` ms.
fn rewrite(row: &mut Row, ids: &[(String, String)], texts: &HashMap<String, String>, shift: i64) {
    for (col, v) in row.iter_mut() {
        match v {
            Sql::Text(s) => {
                let mut out = s.clone();
                for (old, new) in ids {
                    if out.contains(old.as_str()) {
                        out = out.replace(old.as_str(), new);
                    }
                }
                if col == "data" {
                    if let Ok(mut j) = serde_json::from_str::<Value>(&out) {
                        swap_strings(&mut j, texts);
                        out = j.to_string();
                    }
                }
                *s = out;
            }
            Sql::Integer(n) if col.starts_with("time_") => *n += shift,
            _ => {}
        }
    }
}
