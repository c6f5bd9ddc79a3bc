//! fro-bot's own record of which OpenCode session continues which conversation: logical key →
//! session id, for the sessions fro-bot created or resumed, kept in the marker (`fro-bot.json`).
//! Restored content cannot add a thread to it: a session someone else made, whatever its title
//! and timestamps, is never resumed. Only memory written before the map existed is resolved by
//! title (docs/persistence.md).

use std::collections::BTreeMap;
use std::path::Path;

pub use crate::opencode::session::Ownership;
use rusqlite::{Connection, OpenFlags};

/// Logical key → session id.
pub type Map = BTreeMap<String, String>;

/// Title prefix fro-bot gives its sessions (`fro-bot: issue-5`).
const TITLE_PREFIX: &str = "fro-bot: ";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionMap {
    /// The restored marker's map (empty for fresh or discarded memory): the only threads resumed.
    Owned(Map),
    /// Restored memory whose marker predates the map, or a store copy without a marker that names
    /// it: threads are found by title, and the map is built from them at save.
    Legacy,
}

impl Default for SessionMap {
    fn default() -> Self {
        SessionMap::Owned(Map::new())
    }
}

impl SessionMap {
    pub fn ownership(&self, logical_key: &str) -> Ownership<'_> {
        match self {
            SessionMap::Owned(map) => Ownership::Mapped(map.get(logical_key).map(String::as_str)),
            SessionMap::Legacy => Ownership::ByTitle,
        }
    }

    /// The map to save after a run that used `session` for `logical_key`. Legacy memory is
    /// migrated: its fro-bot-titled root sessions of this workspace (newest per title) seed it.
    pub fn after_run(
        &self,
        db: &Path,
        workspace: &Path,
        logical_key: &str,
        session: Option<&str>,
    ) -> Map {
        let mut map = match self {
            SessionMap::Owned(map) => map.clone(),
            SessionMap::Legacy => match titled_sessions(db, workspace) {
                Ok(map) => map,
                Err(e) => {
                    tracing::warn!("cannot read legacy session titles: {e}");
                    Map::new()
                }
            },
        };
        if let Some(id) = session {
            map.insert(logical_key.to_string(), id.to_string());
        }
        map
    }
}

/// The map for a database merged from newer shared memory whose marker is not known (none in
/// the store, or one that names another database): that memory's fro-bot-titled threads, found as
/// a store restore without a marker finds them, then this run's map over them.
pub fn after_merge(db: &Path, workspace: &Path, ours: &Map) -> Map {
    let mut map = titled_sessions(db, workspace).unwrap_or_else(|e| {
        tracing::warn!("cannot read the merged memory's session titles: {e}");
        Map::new()
    });
    map.extend(ours.iter().map(|(k, v)| (k.clone(), v.clone())));
    map
}

/// The trust records for a database merged from newer shared memory
/// (docs/security.md#trust-follows-memory): a record holds only for a session whose merged
/// version is this run's (`ours`) or the one it restored (`restored`); a version another run
/// wrote in between came from a run nothing records, so its session gets no record (the lowest).
pub fn trust_after_merge(
    records: &crate::trust::TrustMap,
    ours: &crate::memory::merge::Snapshot,
    restored: &crate::memory::merge::Snapshot,
    merged: &crate::memory::merge::Snapshot,
) -> crate::trust::TrustMap {
    let same = |a: &crate::memory::merge::Snapshot, id: &str, digest: &str| {
        a.sessions.get(id).is_some_and(|v| v.digest == digest)
    };
    records
        .iter()
        .filter(|(id, _)| {
            merged
                .sessions
                .get(id.as_str())
                .is_some_and(|v| same(ours, id, &v.digest) || same(restored, id, &v.digest))
        })
        .map(|(id, r)| (id.clone(), r.clone()))
        .collect()
}

/// The records of sessions a merge joined, both runs' exchanges in one
/// (docs/security.md#trust-follows-memory): the lower of `ours` and `theirs`, none where either
/// has none.
pub fn trust_of_joined<'a>(
    trust: &mut crate::trust::TrustMap,
    ours: &crate::trust::TrustMap,
    theirs: &crate::trust::TrustMap,
    joined: impl IntoIterator<Item = &'a String>,
) {
    for id in joined {
        trust.remove(id);
        if let (Some(o), Some(t)) = (ours.get(id), theirs.get(id)) {
            trust.insert(id.clone(), o.clone().lowered_by(t));
        }
    }
}

/// The summary's line for a thread whose session both runs continued and the merge kept whole,
/// named by its logical key when fro-bot titled it.
pub fn kept_both_note(kept: &crate::memory::merge::KeptBoth) -> String {
    let thread = match kept.title.as_deref() {
        Some(title) => title.strip_prefix(TITLE_PREFIX).unwrap_or(title),
        None => &kept.root,
    };
    format!(
        "kept both exchanges of `{}` (a run beside this one answered too)",
        crate::memory::merge::shown(thread)
    )
}

/// Drops entries whose session no longer exists (pruned or deleted), so the map stays bounded by
/// the sessions kept. On a read error the map is kept as it is.
pub fn retain_existing(db: &Path, map: &mut Map) {
    match existing_ids(db) {
        Ok(ids) => map.retain(|_, id| ids.contains(id)),
        Err(e) => tracing::debug!("session map kept unfiltered: {e}"),
    }
}

/// The same for the trust records (session id → who wrote it).
pub fn retain_existing_trust(db: &Path, map: &mut crate::trust::TrustMap) {
    match existing_ids(db) {
        Ok(ids) => map.retain(|id, _| ids.contains(id)),
        Err(e) => tracing::debug!("trust records kept unfiltered: {e}"),
    }
}

fn existing_ids(db: &Path) -> rusqlite::Result<std::collections::BTreeSet<String>> {
    let conn = open_read_only(db)?;
    let mut stmt = conn.prepare("SELECT id FROM session")?;
    let ids = stmt.query_map([], |row| row.get::<_, String>(0))?;
    ids.collect()
}

fn open_read_only(db: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

/// Newest live root session per `fro-bot: {key}` title in this workspace.
fn titled_sessions(db: &Path, workspace: &Path) -> rusqlite::Result<Map> {
    if !db.is_file() {
        return Ok(Map::new());
    }
    let conn = open_read_only(db)?;
    let mut stmt = conn.prepare(
        "SELECT title, id FROM session \
         WHERE directory = ?1 AND parent_id IS NULL AND time_archived IS NULL \
           AND time_compacting IS NULL AND substr(title, 1, ?2) = ?3 \
         ORDER BY time_updated ASC, id ASC",
    )?;
    let rows = stmt.query_map(
        rusqlite::params![
            workspace.to_string_lossy(),
            TITLE_PREFIX.len() as i64,
            TITLE_PREFIX
        ],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
    )?;
    let mut map = Map::new();
    // Ascending order: the newest per title is inserted last and wins.
    for row in rows {
        let (title, id) = row?;
        if let Some(key) = title.strip_prefix(TITLE_PREFIX) {
            map.insert(key.to_string(), id);
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("opencode.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE session(id text primary key, parent_id text, directory text not null,
               title text not null, time_updated integer not null, time_compacting integer,
               time_archived integer);
             INSERT INTO session VALUES ('ses_a', NULL, '/ws', 'fro-bot: issue-1', 10, NULL, NULL);
             INSERT INTO session VALUES ('ses_b', NULL, '/ws', 'fro-bot: issue-1', 20, NULL, NULL);
             INSERT INTO session VALUES ('ses_c', 'ses_b', '/ws', 'fro-bot: issue-2', 30, NULL, NULL);
             INSERT INTO session VALUES ('ses_d', NULL, '/other', 'fro-bot: issue-3', 30, NULL, NULL);
             INSERT INTO session VALUES ('ses_e', NULL, '/ws', 'fro-bot: pr-4', 5, NULL, 6);
             INSERT INTO session VALUES ('ses_f', NULL, '/ws', 'something else', 50, NULL, NULL);",
        )
        .unwrap();
        path
    }

    #[test]
    fn a_joined_session_gets_the_lower_of_both_records_and_its_note_names_the_thread() {
        use crate::trust::{SessionTrust, TrustMap};
        let (mona, eve) = (
            SessionTrust::new("mona", "OWNER", false, false),
            SessionTrust::new("eve", "NONE", false, false),
        );
        let ours = TrustMap::from([("ses_a".into(), mona.clone()), ("ses_b".into(), mona)]);
        let theirs = TrustMap::from([("ses_a".into(), eve)]);
        let mut trust = ours.clone();
        let joined = ["ses_a".to_string(), "ses_b".to_string()];
        trust_of_joined(&mut trust, &ours, &theirs, &joined);
        assert_eq!(trust["ses_a"].author, "eve");
        assert!(!trust.contains_key("ses_b"), "theirs has none: {trust:?}");
        let kept = crate::memory::merge::KeptBoth {
            root: "ses_a".into(),
            title: Some("fro-bot: issue-12`\n".into()),
            sessions: vec!["ses_a".into()],
            messages: 2,
            moved: 0,
        };
        assert_eq!(
            kept_both_note(&kept),
            "kept both exchanges of `issue-12??` (a run beside this one answered too)"
        );
    }

    #[test]
    fn owned_maps_resolve_only_what_they_hold() {
        let map = SessionMap::Owned(Map::from([("issue-1".into(), "ses_a".into())]));
        assert_eq!(map.ownership("issue-1"), Ownership::Mapped(Some("ses_a")));
        assert_eq!(map.ownership("issue-2"), Ownership::Mapped(None));
        assert_eq!(SessionMap::Legacy.ownership("issue-1"), Ownership::ByTitle);
    }

    #[test]
    fn legacy_memory_is_migrated_from_titles_and_the_run_overlays_its_session() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(dir.path());
        let map = SessionMap::Legacy.after_run(&db, Path::new("/ws"), "pr-9", Some("ses_new"));
        assert_eq!(
            map,
            Map::from([
                ("issue-1".into(), "ses_b".into()),
                ("pr-9".into(), "ses_new".into()),
            ])
        );
        let owned = SessionMap::Owned(Map::from([("issue-1".into(), "ses_a".into())]));
        let map = owned.after_run(&db, Path::new("/ws"), "issue-1", Some("ses_b"));
        assert_eq!(map, Map::from([("issue-1".into(), "ses_b".into())]));
    }

    #[test]
    fn after_a_merge_only_versions_this_run_knows_keep_their_trust() {
        use crate::memory::merge::{SessionVersion, Snapshot};
        let snap = |pairs: &[(&str, &str)]| Snapshot {
            sessions: pairs
                .iter()
                .map(|(id, d)| {
                    (
                        id.to_string(),
                        SessionVersion {
                            parent: None,
                            activity: 1,
                            title: None,
                            digest: d.to_string(),
                        },
                    )
                })
                .collect(),
        };
        let owner = crate::trust::SessionTrust::new("mona", "OWNER", false, false);
        let records: crate::trust::TrustMap = ["ses_mine", "ses_kept", "ses_theirs", "ses_gone"]
            .into_iter()
            .map(|id| (id.to_string(), owner.clone()))
            .collect();
        let restored = snap(&[("ses_kept", "k"), ("ses_theirs", "t0"), ("ses_gone", "g")]);
        let ours = snap(&[("ses_mine", "m1"), ("ses_kept", "k"), ("ses_theirs", "t0")]);
        // Another run changed ses_theirs (perhaps after reading an outsider) and deleted ses_gone.
        let merged = snap(&[("ses_mine", "m1"), ("ses_kept", "k"), ("ses_theirs", "t1")]);
        let kept = trust_after_merge(&records, &ours, &restored, &merged);
        assert_eq!(
            kept.keys().map(String::as_str).collect::<Vec<_>>(),
            ["ses_kept", "ses_mine"]
        );
    }

    #[test]
    fn entries_of_deleted_sessions_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(dir.path());
        let mut map = Map::from([
            ("issue-1".into(), "ses_a".into()),
            ("issue-9".into(), "ses_gone".into()),
        ]);
        retain_existing(&db, &mut map);
        assert_eq!(map, Map::from([("issue-1".into(), "ses_a".into())]));
    }
}
