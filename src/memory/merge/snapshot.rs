//! Per-session versions: what a database holds for each session, cheap to read and to compare.
//!
//! A session's version is a digest of its `session` row and of its one-row-per-session companions
//! (tables keyed by the session link: `event_sequence`, whose `seq` moves on every event,
//! `session_context_epoch`, `session_share`). OpenCode bumps `session.time_updated` on every
//! message and the event sequence on every part update, so any turn changes the digest without our
//! reading the (large) message and part tables.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::graph::{Graph, MESSAGE_TABLE};
use super::schema::{quote, Schema, ACTIVITY_COLUMN, SESSION_TABLE};
use super::{open_read_only, MergeError, Role};

/// Column holding the session's title (for the report only).
const TITLE_COLUMN: &str = "title";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionVersion {
    pub parent: Option<String>,
    /// `time_updated` (ms): the latest activity.
    pub activity: i64,
    pub title: Option<String>,
    /// Hex SHA-256 prefix of the session's rows (see the module docs).
    pub digest: String,
}

/// The sessions a run started from (captured right after restore), to tell what the run changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub sessions: BTreeMap<String, SessionVersion>,
}

impl Snapshot {
    /// Nothing was restored: every session of this run is new.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Reads the versions of every session in `db` (opened read-only).
    pub fn capture(db: &Path) -> Result<Snapshot, MergeError> {
        let conn = open_read_only(db, Role::Restored)?;
        let schema = Schema::read(&conn, Role::Restored)?;
        let graph = Graph::new(&schema);
        Ok(Snapshot {
            sessions: read_versions(&conn, &schema, &graph, Role::Restored)?,
        })
    }
}

/// The ids of the messages `after` holds and `before` does not (`None`: nothing before, so every
/// message of `after`): what a turn wrote, when `before` is the database as it was before it.
pub fn messages_added(
    before: Option<&Path>,
    after: &Path,
) -> Result<std::collections::BTreeSet<String>, MergeError> {
    let mut added = message_ids(after, Role::Ours)?;
    if let Some(before) = before {
        for id in message_ids(before, Role::Restored)? {
            added.remove(&id);
        }
    }
    Ok(added)
}

fn message_ids(db: &Path, role: Role) -> Result<std::collections::BTreeSet<String>, MergeError> {
    let conn = open_read_only(db, role)?;
    let schema = Schema::read(&conn, role)?;
    let Some(key) = schema
        .tables
        .get(MESSAGE_TABLE)
        .and_then(|t| t.single_key())
    else {
        return Ok(Default::default());
    };
    let read = |source| MergeError::read(role, source);
    let sql = format!(
        "SELECT CAST({} AS TEXT) FROM main.{}",
        quote(key),
        quote(MESSAGE_TABLE)
    );
    let mut stmt = conn.prepare(&sql).map_err(read)?;
    let ids = stmt
        .query_map([], |r| r.get::<_, Option<String>>(0))
        .map_err(read)?;
    let mut out = std::collections::BTreeSet::new();
    for id in ids {
        out.extend(id.map_err(read)?);
    }
    Ok(out)
}

pub(crate) fn read_versions(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    role: Role,
) -> Result<BTreeMap<String, SessionVersion>, MergeError> {
    let read = |source| MergeError::read(role, source);
    let session = schema.session();
    let col = |name: &str| session.columns.iter().position(|c| c == name);
    // Invariants: `Schema::read` checked the key and activity columns exist.
    let key_at = col(session.single_key().unwrap_or_default()).unwrap_or(0);
    let activity_at = col(ACTIVITY_COLUMN).unwrap_or(0);
    let parent_at = graph.parent_column().and_then(col);
    let title_at = col(TITLE_COLUMN);

    let mut hashers: BTreeMap<String, (Sha256, SessionVersion)> = BTreeMap::new();
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM main.{}", quote(SESSION_TABLE)))
        .map_err(read)?;
    let mut rows = stmt.query([]).map_err(read)?;
    while let Some(row) = rows.next().map_err(read)? {
        let text = |i: Option<usize>| -> Option<String> {
            i.and_then(|i| match row.get_ref(i) {
                Ok(ValueRef::Text(t)) => Some(String::from_utf8_lossy(t).into_owned()),
                Ok(ValueRef::Integer(n)) => Some(n.to_string()),
                _ => None,
            })
        };
        let Some(id) = text(Some(key_at)) else {
            continue; // A NULL key cannot be linked to anything.
        };
        let activity = match row.get_ref(activity_at) {
            Ok(ValueRef::Integer(n)) => n,
            Ok(ValueRef::Real(f)) => f as i64,
            _ => 0,
        };
        let mut h = Sha256::new();
        hash_row(&mut h, row, session.columns.len()).map_err(read)?;
        let version = SessionVersion {
            parent: text(parent_at).filter(|p| !p.is_empty()),
            activity,
            title: text(title_at),
            digest: String::new(),
        };
        hashers.insert(id, (h, version));
    }
    drop(rows);
    for (table, column) in graph.singletons(schema) {
        let sql = format!(
            "SELECT CAST({c} AS TEXT), * FROM main.{t}",
            c = quote(column),
            t = quote(&table.name)
        );
        let mut stmt = conn.prepare(&sql).map_err(read)?;
        let mut rows = stmt.query([]).map_err(read)?;
        while let Some(row) = rows.next().map_err(read)? {
            let id: Option<String> = row.get(0).map_err(read)?;
            if let Some((h, _)) = id.and_then(|id| hashers.get_mut(&id)) {
                h.update(table.name.as_bytes());
                hash_row(h, row, table.columns.len() + 1).map_err(read)?;
            }
        }
    }
    Ok(hashers
        .into_iter()
        .map(|(id, (h, mut v))| {
            v.digest = hex::encode(&h.finalize()[..16]);
            (id, v)
        })
        .collect())
}

/// Hashes every value with a type tag and length, so `("ab","c")` and `("a","bc")` differ.
fn hash_row(h: &mut Sha256, row: &rusqlite::Row<'_>, n: usize) -> rusqlite::Result<()> {
    for i in 0..n {
        let (tag, bytes): (u8, Vec<u8>) = match row.get_ref(i)? {
            ValueRef::Null => (0, vec![]),
            ValueRef::Integer(v) => (1, v.to_le_bytes().to_vec()),
            ValueRef::Real(v) => (2, v.to_le_bytes().to_vec()),
            ValueRef::Text(t) => (3, t.to_vec()),
            ValueRef::Blob(b) => (4, b.to_vec()),
        };
        h.update([tag]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(())
}
