//! Merges of databases built from OpenCode 1.18.33's real schema and migration list.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection};

use super::*;

const SCHEMA: &str = include_str!("../../../tests/it/fixtures/opencode-1.18.33-schema.sql");
const MIGRATIONS: &str = include_str!("../../../tests/it/fixtures/opencode-1.18.33-migrations.txt");
const PROJECT: &str = "cadca77b89a5b7a8d5075e6730ad6b4f59d91881";

struct Dir {
    tmp: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        Dir {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// An empty OpenCode database in WAL mode, as OpenCode leaves it.
    fn db(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        let c = Connection::open(&p).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.execute_batch(SCHEMA).unwrap();
        for id in MIGRATIONS.lines().filter(|l| !l.is_empty()) {
            c.execute("INSERT INTO migration VALUES (?1, 1)", [id])
                .unwrap();
        }
        p
    }

    fn copy(&self, from: &Path, name: &str) -> PathBuf {
        let p = self.path(name);
        let src = Connection::open(from).unwrap();
        src.execute("VACUUM INTO ?1", [p.to_str().unwrap()])
            .unwrap();
        // VACUUM INTO writes a rollback-journal file; OpenCode's are WAL.
        Connection::open(&p)
            .unwrap()
            .pragma_update(None, "journal_mode", "WAL")
            .unwrap();
        p
    }
}

fn project(c: &Connection, id: &str) {
    c.execute(
        "INSERT INTO project (id, worktree, vcs, time_created, time_updated, sandboxes) \
         VALUES (?1, '/ws', 'git', 1, 1, '[]')",
        [id],
    )
    .unwrap();
    c.execute(
        "INSERT INTO project_directory (project_id, directory, time_created) VALUES (?1, '/ws', 1)",
        [id],
    )
    .unwrap();
}

/// A session with `turns` user+assistant messages, a part each, its events, a todo and a context
/// epoch, as a turn of OpenCode writes them.
fn session(c: &Connection, id: &str, parent: Option<&str>, project: &str, at: i64, turns: usize) {
    c.execute(
        "INSERT INTO session (id, project_id, parent_id, slug, directory, title, version, \
         time_created, time_updated) VALUES (?1, ?2, ?3, 'slug', '/ws', ?4, '1.18.33', ?5, ?5)",
        params![id, project, parent, format!("fro-bot: {id}"), at],
    )
    .unwrap();
    c.execute(
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES (?1, -1)",
        [id],
    )
    .unwrap();
    c.execute(
        "INSERT INTO session_context_epoch VALUES (?1, 'b', 's', 0)",
        [id],
    )
    .unwrap();
    for _ in 0..turns {
        turn(c, id, at);
    }
}

fn turn(c: &Connection, id: &str, at: i64) {
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM message WHERE session_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    for role in ["user", "assistant"] {
        let m = format!("msg_{id}_{n:03}_{role}");
        c.execute(
            "INSERT INTO message VALUES (?1, ?2, ?3, ?3, ?4)",
            params![m, id, at, format!("{{\"role\":\"{role}\"}}")],
        )
        .unwrap();
        c.execute(
            "INSERT INTO part VALUES (?1, ?2, ?3, ?4, ?4, '{\"type\":\"text\",\"text\":\"hi\"}')",
            params![format!("prt_{m}"), m, id, at],
        )
        .unwrap();
        let seq: i64 = c
            .query_row(
                "UPDATE event_sequence SET seq = seq + 1 WHERE aggregate_id = ?1 RETURNING seq",
                [id],
                |r| r.get(0),
            )
            .unwrap();
        c.execute(
            "INSERT INTO event VALUES (?1, ?2, ?3, 'message.updated.1', '{}')",
            params![format!("evt_{id}_{seq}"), id, seq],
        )
        .unwrap();
    }
    c.execute(
        "INSERT OR REPLACE INTO todo VALUES (?1, 'do it', 'pending', 'high', 0, ?2, ?2)",
        params![id, at],
    )
    .unwrap();
    c.execute(
        "UPDATE session SET time_updated = ?2 WHERE id = ?1",
        params![id, at],
    )
    .unwrap();
}

fn open(p: &Path) -> Connection {
    Connection::open(p).unwrap()
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn sessions(p: &Path) -> Vec<String> {
    let c = open(p);
    let mut s = c.prepare("SELECT id FROM session ORDER BY id").unwrap();
    s.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn messages(p: &Path, session: &str) -> i64 {
    let c = open(p);
    c.query_row(
        "SELECT count(*) FROM message WHERE session_id = ?1",
        [session],
        |r| r.get(0),
    )
    .unwrap()
}

fn assert_sound(p: &Path) {
    let c = open(p);
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let fk = count(&c, "SELECT count(*) FROM pragma_foreign_key_check");
    assert_eq!(fk, 0, "foreign_key_check found violations");
    let orphans = count(
        &c,
        "SELECT count(*) FROM part WHERE session_id NOT IN (SELECT id FROM session)",
    ) + count(
        &c,
        "SELECT count(*) FROM event_sequence WHERE aggregate_id NOT IN (SELECT id FROM session)",
    ) + count(
        &c,
        "SELECT count(*) FROM session WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT id FROM session)",
    );
    assert_eq!(orphans, 0, "rows tied to a missing session");
}

fn full() -> MergeOptions<'static> {
    MergeOptions {
        verify: Verify::Full,
        ..Default::default()
    }
}

/// A base with session `a`, restored by two runs: returns (dir, restored db, snapshot).
fn common() -> (Dir, PathBuf, Snapshot) {
    let d = Dir::new();
    let restored = d.db("restored.db");
    let c = open(&restored);
    project(&c, PROJECT);
    session(&c, "ses_a", None, PROJECT, 100, 2);
    drop(c);
    let snap = Snapshot::capture(&restored).unwrap();
    (d, restored, snap)
}

#[test]
fn disjoint_sessions_from_two_runs_both_survive() {
    let (d, restored, snap) = common();
    // Run 1 answered issue B and published first: that is the base.
    let base = d.copy(&restored, "base.db");
    session(&open(&base), "ses_b", None, PROJECT, 200, 1);
    // Run 2 (this one) answered issue C and continued A.
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    session(&c, "ses_c", None, PROJECT, 300, 1);
    turn(&c, "ses_a", 310);
    drop(c);

    let out = d.path("out.db");
    // A stale WAL from an earlier attempt would be replayed into the new file.
    std::fs::write(d.path("out.db-wal"), vec![0x5au8; 4096]).unwrap();
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert!(!d.path("out.db-wal").exists(), "the result is one file");
    assert_eq!(sessions(&out), ["ses_a", "ses_b", "ses_c"]);
    assert_eq!(messages(&out, "ses_a"), 6, "A has this run's extra turn");
    assert_eq!(messages(&out, "ses_b"), 2);
    assert_eq!(messages(&out, "ses_c"), 2);
    let c = open(&out);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM event WHERE aggregate_id = 'ses_a'"
        ),
        6
    );
    assert_eq!(
        count(
            &c,
            "SELECT seq FROM event_sequence WHERE aggregate_id = 'ses_a'"
        ),
        5
    );
    let changes: Vec<(&str, Change)> = report
        .taken
        .iter()
        .map(|t| (t.root.as_str(), t.change))
        .collect();
    assert_eq!(
        changes,
        [("ses_a", Change::Updated), ("ses_c", Change::Added)]
    );
    assert!(report.conflicts.is_empty());
    assert_sound(&out);
    // The output keeps the base's WAL mode, as a single file.
    assert_eq!(
        c.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .unwrap(),
        "wal"
    );
}

#[test]
fn the_same_session_changed_on_both_sides_goes_to_the_later_activity_and_is_reported() {
    let (d, restored, snap) = common();
    let base = d.copy(&restored, "base.db");
    turn(&open(&base), "ses_a", 500);
    let ours = d.copy(&restored, "ours.db");
    turn(&open(&ours), "ses_a", 400);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert_eq!(report.conflicts.len(), 1);
    let c = &report.conflicts[0];
    assert_eq!(c.winner, Side::Base);
    assert_eq!((c.ours_activity, c.base_activity), (Some(400), Some(500)));
    // Both added message 2 under the same synthetic id; ours has nothing the base lacks.
    assert_eq!(c.title.as_deref(), Some("fro-bot: ses_a"));
    assert!(report.taken.is_empty());
    let t: i64 = count(
        &open(&out),
        "SELECT time_updated FROM session WHERE id = 'ses_a'",
    );
    assert_eq!(t, 500, "the base's later turn is kept");
    assert_sound(&out);

    // The other way round: this run's later turn wins and the base's turn is counted as lost.
    let ours2 = d.copy(&restored, "ours2.db");
    let c2 = open(&ours2);
    turn(&c2, "ses_a", 600);
    c2.pragma_update(None, "foreign_keys", false).unwrap();
    c2.execute(
        "UPDATE message SET id = id || '_x' WHERE time_created = 600",
        [],
    )
    .unwrap();
    c2.execute(
        "UPDATE part SET message_id = message_id || '_x', id = id || '_x' WHERE time_created = 600",
        [],
    )
    .unwrap();
    drop(c2);
    let out2 = d.path("out2.db");
    let report = merge_with(&base, &ours2, &snap, &out2, full()).unwrap();
    let c = &report.conflicts[0];
    assert_eq!(c.winner, Side::Ours);
    assert_eq!(
        c.lost_messages, 2,
        "the base's turn is not silently dropped"
    );
    assert_eq!(
        count(
            &open(&out2),
            "SELECT time_updated FROM session WHERE id = 'ses_a'"
        ),
        600
    );
    assert_eq!(messages(&out2, "ses_a"), 6);
    assert_sound(&out2);
}

#[test]
fn child_sessions_follow_their_parent_and_a_new_project_is_carried() {
    let d = Dir::new();
    let restored = d.db("restored.db");
    let snap = Snapshot::capture(&restored).unwrap();
    assert!(snap.sessions.is_empty());
    let base = d.copy(&restored, "base.db");
    let c = open(&base);
    project(&c, "other");
    session(&c, "ses_b", None, "other", 10, 1);
    drop(c);
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    project(&c, PROJECT);
    c.execute(
        "INSERT INTO workspace VALUES ('wrk_1', 'local', 'w', NULL, '/ws', NULL, ?1, 5)",
        [PROJECT],
    )
    .unwrap();
    session(&c, "ses_p", None, PROJECT, 20, 1);
    session(&c, "ses_k", Some("ses_p"), PROJECT, 21, 1);
    session(&c, "ses_g", Some("ses_k"), PROJECT, 22, 1);
    c.execute(
        "UPDATE session SET workspace_id = 'wrk_1' WHERE id = 'ses_k'",
        [],
    )
    .unwrap();
    drop(c);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert_eq!(report.taken.len(), 1, "one tree");
    assert_eq!(report.taken[0].sessions, ["ses_g", "ses_k", "ses_p"]);
    assert_eq!(sessions(&out), ["ses_b", "ses_g", "ses_k", "ses_p"]);
    let c = open(&out);
    assert_eq!(count(&c, "SELECT count(*) FROM project"), 2);
    assert_eq!(count(&c, "SELECT count(*) FROM project_directory"), 2);
    assert_eq!(count(&c, "SELECT count(*) FROM workspace"), 1);
    assert_eq!(report.rows_carried, 3);
    assert_sound(&out);
}

#[test]
fn a_session_this_run_pruned_is_deleted_unless_the_base_moved_on() {
    let (d, restored, snap) = common();
    let base = d.copy(&restored, "base.db");
    let ours = d.copy(&restored, "ours.db");
    open(&ours)
        .execute_batch(
            "DELETE FROM part; DELETE FROM message; DELETE FROM event; DELETE FROM event_sequence;
             DELETE FROM todo; DELETE FROM session_context_epoch; DELETE FROM session;",
        )
        .unwrap();
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert_eq!(report.taken[0].change, Change::Deleted);
    assert!(sessions(&out).is_empty());
    let c = open(&out);
    assert_eq!(count(&c, "SELECT count(*) FROM part"), 0);
    assert_eq!(count(&c, "SELECT count(*) FROM event"), 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM project"),
        1,
        "projects stay"
    );
    assert_sound(&out);

    turn(&open(&base), "ses_a", 900);
    let out2 = d.path("out2.db");
    let report = merge_with(&base, &ours, &snap, &out2, full()).unwrap();
    assert_eq!(report.conflicts[0].winner, Side::Base);
    assert_eq!(report.conflicts[0].ours_activity, None);
    assert_eq!(sessions(&out2), ["ses_a"]);
}

#[test]
fn merging_the_same_run_twice_changes_nothing_the_second_time() {
    let (d, restored, snap) = common();
    let ours = d.copy(&restored, "ours.db");
    session(&open(&ours), "ses_c", None, PROJECT, 300, 1);
    let out = d.path("out.db");
    merge(&restored, &ours, &snap, &out).unwrap();
    let again = d.path("again.db");
    let report = merge(&out, &ours, &snap, &again).unwrap();
    assert_eq!(report.identical, 1);
    assert!(report.taken.is_empty() && report.conflicts.is_empty());
    assert_eq!((report.rows_inserted, report.rows_deleted), (0, 0));
    assert_eq!(sessions(&again), ["ses_a", "ses_c"]);
}

#[test]
fn a_different_migration_set_is_refused_as_incompatible() {
    let (d, restored, snap) = common();
    let ours = d.copy(&restored, "ours.db");
    open(&ours)
        .execute(
            "INSERT INTO migration VALUES ('20990101000000_future', 2)",
            [],
        )
        .unwrap();
    let out = d.path("out.db");
    let err = merge(&restored, &ours, &snap, &out).unwrap_err();
    assert!(
        matches!(&err, MergeError::MigrationMismatch { only_ours, .. } if only_ours == "migration:20990101000000_future"),
        "{err:?}"
    );
    assert!(err.is_incompatible());
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn an_extra_column_in_one_side_is_a_schema_mismatch() {
    let (d, restored, snap) = common();
    let ours = d.copy(&restored, "ours.db");
    open(&ours)
        .execute("ALTER TABLE session ADD COLUMN extra text", [])
        .unwrap();
    let err = merge(&restored, &ours, &snap, &d.path("out.db")).unwrap_err();
    assert!(
        matches!(&err, MergeError::SchemaMismatch { objects } if objects == "session"),
        "{err:?}"
    );
}

#[test]
fn a_base_that_is_not_sqlite_is_a_clear_error() {
    let (d, restored, snap) = common();
    let junk = d.path("junk.db");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let out = d.path("out.db");
    let err = merge(&junk, &restored, &snap, &out).unwrap_err();
    assert!(
        matches!(
            err,
            MergeError::NotADatabase {
                role: Role::Base,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("junk.db"), "{err}");
    assert!(!out.exists());
    let err = merge(&d.path("absent.db"), &restored, &snap, &out).unwrap_err();
    assert!(matches!(
        err,
        MergeError::Missing {
            role: Role::Base,
            ..
        }
    ));
    let err = Snapshot::capture(&junk).unwrap_err();
    assert!(matches!(
        err,
        MergeError::NotADatabase {
            role: Role::Restored,
            ..
        }
    ));
}

#[test]
fn a_trigger_in_the_base_is_refused_and_never_fires() {
    let (d, restored, snap) = common();
    let base = d.copy(&restored, "base.db");
    // Would wipe every session as soon as anything is inserted or deleted.
    open(&base)
        .execute_batch(
            "CREATE TRIGGER wipe AFTER INSERT ON message BEGIN DELETE FROM session; END;
             CREATE TRIGGER wipe2 AFTER DELETE ON message BEGIN DELETE FROM project; END;",
        )
        .unwrap();
    let ours = d.copy(&restored, "ours.db");
    session(&open(&ours), "ses_c", None, PROJECT, 300, 1);
    let out = d.path("out.db");
    let err = merge(&base, &ours, &snap, &out).unwrap_err();
    assert!(
        matches!(&err, MergeError::UnexpectedSchemaObject { role: Role::Base, kind, name } if kind == "trigger" && name == "wipe"),
        "{err:?}"
    );
    assert!(err.is_incompatible());
    assert!(!out.exists());
    // The base is untouched (opened read-only).
    assert_eq!(sessions(&base), ["ses_a"]);
    assert_eq!(count(&open(&base), "SELECT count(*) FROM project"), 1);
}

#[test]
fn triggers_are_off_on_our_connections() {
    // Defence in depth: even if a trigger got past the schema check, it could not fire.
    let d = Dir::new();
    let p = d.db("t.db");
    let c = open(&p);
    c.execute_batch("CREATE TABLE log(x); CREATE TRIGGER t AFTER INSERT ON project BEGIN INSERT INTO log VALUES (1); END;")
        .unwrap();
    drop(c);
    let c = Connection::open(&p).unwrap();
    harden(&c).unwrap();
    project(&c, "p");
    assert_eq!(count(&c, "SELECT count(*) FROM log"), 0);
}

#[test]
fn unknown_tables_present_on_both_sides_are_kept_from_the_base() {
    let d = Dir::new();
    let restored = d.db("restored.db");
    let c = open(&restored);
    c.execute_batch(
        "CREATE TABLE plugin_note(session_id text, note text);
         CREATE TABLE unrelated(k text primary key, v text);",
    )
    .unwrap();
    project(&c, PROJECT);
    session(&c, "ses_a", None, PROJECT, 1, 1);
    drop(c);
    let snap = Snapshot::capture(&restored).unwrap();
    let base = d.copy(&restored, "base.db");
    open(&base)
        .execute("INSERT INTO unrelated VALUES ('base', 'kept')", [])
        .unwrap();
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    session(&c, "ses_c", None, PROJECT, 3, 1);
    c.execute_batch(
        "INSERT INTO plugin_note VALUES ('ses_c', 'tied by name');
         INSERT INTO unrelated VALUES ('ours', 'not carried');",
    )
    .unwrap();
    drop(c);
    let out = d.path("out.db");
    merge_with(&base, &ours, &snap, &out, full()).unwrap();
    let c = open(&out);
    assert_eq!(count(&c, "SELECT count(*) FROM plugin_note"), 1);
    assert_eq!(
        count(&c, "SELECT count(*) FROM unrelated WHERE k = 'base'"),
        1
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM unrelated WHERE k = 'ours'"),
        0
    );
}

#[test]
fn an_existing_output_is_refused_and_left_alone() {
    let (d, restored, snap) = common();
    let out = d.path("out.db");
    std::fs::write(&out, b"precious").unwrap();
    let err = merge(&restored, &restored, &snap, &out).unwrap_err();
    assert!(matches!(err, MergeError::OutputExists { .. }));
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
}

#[test]
fn the_snapshot_round_trips_through_json() {
    let (_d, _restored, snap) = common();
    let json = serde_json::to_string(&snap).unwrap();
    let back: Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    assert_eq!(snap.sessions["ses_a"].activity, 100);
}

#[test]
fn a_base_with_its_newest_rows_still_in_the_wal_is_copied_whole() {
    let (d, restored, snap) = common();
    let base = d.copy(&restored, "base.db");
    let writer = open(&base);
    writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    session(&writer, "ses_b", None, PROJECT, 200, 1);
    let wal = d.path("base.db-wal");
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    let ours = d.copy(&restored, "ours.db");
    session(&open(&ours), "ses_c", None, PROJECT, 300, 1);
    let out = d.path("out.db");
    merge_with(&base, &ours, &snap, &out, full()).unwrap();
    drop(writer);
    assert_eq!(sessions(&out), ["ses_a", "ses_b", "ses_c"]);
    assert_sound(&out);
}

#[test]
fn paths_with_uri_characters_and_non_ascii_names_are_attached_as_themselves() {
    let (d, restored, snap) = common();
    let dir = d.path("odd dir?#%é");
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("our s?#é.db");
    std::fs::copy(d.copy(&restored, "tmp.db"), &ours).unwrap();
    session(&open(&ours), "ses_c", None, PROJECT, 300, 1);
    let out = dir.join("out?.db");
    merge(&restored, &ours, &snap, &out).unwrap();
    assert_eq!(sessions(&out), ["ses_a", "ses_c"]);
}

#[test]
fn a_trigger_in_this_runs_database_is_refused_too() {
    let (d, restored, snap) = common();
    let ours = d.copy(&restored, "ours.db");
    open(&ours)
        .execute_batch("CREATE TRIGGER t AFTER DELETE ON part BEGIN DELETE FROM project; END;")
        .unwrap();
    let err = merge(&restored, &ours, &snap, &d.path("out.db")).unwrap_err();
    assert!(
        matches!(
            err,
            MergeError::UnexpectedSchemaObject {
                role: Role::Ours,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn with_an_empty_snapshot_two_copies_are_unioned_and_a_shared_session_goes_to_the_later() {
    // Restore's case: the store copy and a cache entry each hold sessions the other lacks.
    let (d, restored, _) = common();
    let store = d.copy(&restored, "store.db");
    let c = open(&store);
    session(&c, "ses_s", None, PROJECT, 200, 1);
    turn(&c, "ses_a", 250);
    drop(c);
    let cache = d.copy(&restored, "cache.db");
    let c = open(&cache);
    session(&c, "ses_c", None, PROJECT, 300, 1);
    turn(&c, "ses_a", 350);
    drop(c);
    let out = d.path("out.db");
    let report = merge_with(&store, &cache, &Snapshot::empty(), &out, full()).unwrap();
    assert_eq!(sessions(&out), ["ses_a", "ses_c", "ses_s"]);
    assert_eq!(report.conflicts.len(), 1);
    assert_eq!(report.conflicts[0].winner, Side::Ours);
    assert_eq!(
        count(
            &open(&out),
            "SELECT time_updated FROM session WHERE id = 'ses_a'"
        ),
        350
    );
    assert_sound(&out);
}

// ---- Both runs continued one session: the union of their exchanges ----

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An id of OpenCode's shape (`{prefix}_` + 12 hex of ms × 4096 + a counter + 14 base62) made at
/// `ms`, unique in the test binary.
fn oc_id(prefix: &str, ms: i64) -> String {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tick = (ms as u64 * 4096 + 1) % (1 << 48);
    format!("{prefix}_{tick:012x}{n:014}")
}

/// Appends one event to the session's log, as OpenCode's sync events do.
fn event(c: &Connection, session: &str, kind: &str, data: &str) {
    let seq: i64 = c
        .query_row(
            "UPDATE event_sequence SET seq = seq + 1 WHERE aggregate_id = ?1 RETURNING seq",
            [session],
            |r| r.get(0),
        )
        .unwrap();
    c.execute(
        "INSERT INTO event VALUES (?1, ?2, ?3, ?4, ?5)",
        params![oc_id("evt", 1), session, seq, kind, data],
    )
    .unwrap();
}

/// A message and its text part as OpenCode 1.18 writes them (with their events); its id.
fn message(c: &Connection, session: &str, at: i64, parent: Option<&str>, text: &str) -> String {
    let id = oc_id("msg", at);
    let data = match parent {
        None => serde_json::json!({"role": "user", "time": {"created": at}, "agent": "build"}),
        Some(q) => serde_json::json!({"parentID": q, "role": "assistant", "time": {"created": at},
            "cost": 0.25, "tokens": {"input": 120, "output": 8, "reasoning": 0,
            "cache": {"read": 0, "write": 0}}, "finish": "stop"}),
    };
    c.execute(
        "INSERT INTO message VALUES (?1, ?2, ?3, ?3, ?4)",
        params![id, session, at, data.to_string()],
    )
    .unwrap();
    let part = oc_id("prt", at);
    c.execute(
        "INSERT INTO part VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
        params![
            part,
            id,
            session,
            at,
            serde_json::json!({"type": "text", "text": text}).to_string()
        ],
    )
    .unwrap();
    let info = serde_json::json!({"sessionID": session, "info": {"id": id, "sessionID": session}});
    event(c, session, "message.updated.1", &info.to_string());
    let part = serde_json::json!({"sessionID": session, "part": {"id": part, "messageID": id}});
    event(c, session, "message.part.updated.1", &part.to_string());
    if parent.is_some() {
        c.execute(
            "UPDATE session SET cost = cost + 0.25, tokens_input = tokens_input + 120, \
             tokens_output = tokens_output + 8 WHERE id = ?1",
            [session],
        )
        .unwrap();
    }
    c.execute(
        "UPDATE session SET time_updated = max(time_updated, ?2) WHERE id = ?1",
        params![session, at],
    )
    .unwrap();
    id
}

/// A question at `at` and one answer per step time; the ids, question first.
fn exchange(c: &Connection, session: &str, at: i64, steps: &[i64], word: &str) -> Vec<String> {
    let q = message(c, session, at, None, &format!("question {word}"));
    let mut ids = vec![q.clone()];
    for (i, &t) in steps.iter().enumerate() {
        ids.push(message(
            c,
            session,
            t,
            Some(&q),
            &format!("answer {word} step {i}"),
        ));
    }
    event(c, session, "session.updated.1", "{}");
    ids
}

/// Memory with thread `ses_t`'s first exchange, as both runs restored it.
fn thread() -> (Dir, PathBuf, Snapshot) {
    let d = Dir::new();
    let restored = d.db("restored.db");
    let c = open(&restored);
    project(&c, PROJECT);
    c.execute(
        "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, \
         time_updated) VALUES ('ses_t', ?1, 'slug', '/ws', 'fro-bot: issue-12', '1.18.33', 10, 10)",
        [PROJECT],
    )
    .unwrap();
    c.execute(
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('ses_t', -1)",
        [],
    )
    .unwrap();
    exchange(&c, "ses_t", 100, &[110], "zero");
    drop(c);
    let snap = Snapshot::capture(&restored).unwrap();
    (d, restored, snap)
}

/// The session's history as OpenCode reads it: (role, first part's text), by `(time_created, id)`.
fn history(p: &Path) -> Vec<(Option<String>, Option<String>)> {
    let c = open(p);
    let mut s = c
        .prepare(
            "SELECT CASE WHEN json_valid(m.data) THEN json_extract(m.data, '$.role') END, \
               (SELECT json_extract(p.data, '$.text') FROM part p WHERE p.message_id = m.id ORDER BY p.id LIMIT 1) \
             FROM message m WHERE m.session_id = 'ses_t' ORDER BY m.time_created, m.id",
        )
        .unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Each question is followed by its own answers, and every answer's parent is the question
/// before it; the texts in order.
fn contiguous(p: &Path) -> Vec<String> {
    let c = open(p);
    let mut s = c
        .prepare(
            "SELECT id, json_extract(data, '$.role'), json_extract(data, '$.parentID') FROM message \
             WHERE session_id = 'ses_t' ORDER BY time_created, id",
        )
        .unwrap();
    let rows: Vec<(String, String, Option<String>)> = s
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut question = None;
    for (id, role, parent) in &rows {
        match role.as_str() {
            "user" => question = Some(id.clone()),
            _ => assert_eq!(
                parent, &question,
                "an answer away from its question: {rows:?}"
            ),
        }
    }
    history(p)
        .into_iter()
        .map(|(_, t)| t.unwrap_or_default())
        .collect()
}

fn own(ids: &[Vec<String>]) -> std::collections::BTreeSet<String> {
    ids.iter().flatten().cloned().collect()
}

fn with_own(own: &std::collections::BTreeSet<String>) -> MergeOptions<'_> {
    MergeOptions {
        verify: Verify::Full,
        own_messages: Some(own),
        ..Default::default()
    }
}

/// Every seq of the session's log is used once, and the sequence is at the last.
fn events_sound(p: &Path) {
    let c = open(p);
    let (n, distinct, max): (i64, i64, i64) = c
        .query_row(
            "SELECT count(*), count(DISTINCT seq), max(seq) FROM event WHERE aggregate_id = 'ses_t'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((n, distinct, max), (n, n, n - 1), "seq 0..n, each once");
    let seq: i64 = count(
        &c,
        "SELECT seq FROM event_sequence WHERE aggregate_id = 'ses_t'",
    );
    assert_eq!(seq, max);
}

#[test]
fn two_runs_that_continued_one_session_keep_both_exchanges_in_order() {
    let (d, restored, snap) = thread();
    // The other run asked at 1000 and saved first; this run asked at 2000.
    let base = d.copy(&restored, "base.db");
    exchange(&open(&base), "ses_t", 1000, &[1010], "alpha");
    let ours = d.copy(&restored, "ours.db");
    exchange(&open(&ours), "ses_t", 2000, &[2010], "bravo");
    for (name, snapshot) in [("cache.db", Snapshot::empty()), ("store.db", snap.clone())] {
        let out = d.path(name);
        let report = merge_with(&base, &ours, &snapshot, &out, full()).unwrap();
        assert!(report.conflicts.is_empty(), "{report:?}");
        assert_eq!(report.kept_both.len(), 1, "{report:?}");
        let kept = &report.kept_both[0];
        assert_eq!((kept.messages, kept.moved), (2, 0));
        assert_eq!(kept.title.as_deref(), Some("fro-bot: issue-12"));
        assert_eq!(
            contiguous(&out),
            [
                "question zero",
                "answer zero step 0",
                "question alpha",
                "answer alpha step 0",
                "question bravo",
                "answer bravo step 0"
            ]
        );
        let c = open(&out);
        // The later run's row, with the other run's answer added to the totals.
        let (updated, tokens, cost): (i64, i64, f64) = c
            .query_row(
                "SELECT time_updated, tokens_input, cost FROM session WHERE id = 'ses_t'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((updated, tokens, cost), (2010, 360, 0.75));
        events_sound(&out);
        assert_sound(&out);
    }
    // Merged again with this run's database (a second save): nothing changes.
    let out = d.path("cache.db");
    let again = d.path("again.db");
    let report = merge_with(&out, &ours, &Snapshot::empty(), &again, full()).unwrap();
    assert_eq!(report.kept_both.len(), 1, "{report:?}");
    assert_eq!(report.rows_inserted, 0, "{report:?}");
    assert_eq!(history(&again), history(&out));
}

/// Every text column of every row of `p`, for looking for an id anywhere.
fn everything(p: &Path) -> String {
    let c = open(p);
    let mut out = String::new();
    for (table, cols) in [
        ("message", "id || data"),
        ("part", "id || message_id || data"),
        ("event", "id || data"),
    ] {
        let mut s = c.prepare(&format!("SELECT {cols} FROM {table}")).unwrap();
        for row in s.query_map([], |r| r.get::<_, String>(0)).unwrap() {
            out.push_str(&row.unwrap());
            out.push('\n');
        }
    }
    out
}

/// The other run's exchange with its tool step, then this run's, as the history reads after the
/// merge.
const ALPHA_THEN_BRAVO: [&str; 5] = [
    "question alpha",
    "answer alpha step 0",
    "answer alpha step 1",
    "question bravo",
    "answer bravo step 0",
];

#[test]
fn interleaved_turns_keep_each_exchange_together_by_moving_this_runs_after_the_other() {
    let (d, restored, _) = thread();
    // The other run asked at 1000 and worked until 3000 (a tool step between); this run asked
    // at 2000, while it worked.
    let base = d.copy(&restored, "base.db");
    exchange(&open(&base), "ses_t", 1000, &[1010, 3000], "alpha");
    let ours = d.copy(&restored, "ours.db");
    let mine = vec![exchange(&open(&ours), "ses_t", 2000, &[2010], "bravo")];
    let movable = own(&mine);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, with_own(&movable)).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(report.kept_both[0].moved, 2, "{report:?}");
    let mut expected = vec!["question zero", "answer zero step 0"];
    expected.extend(ALPHA_THEN_BRAVO);
    assert_eq!(contiguous(&out), expected);
    // New ids in OpenCode's format, after the other run's last message, every reference moved.
    let c = open(&out);
    let renamed: std::collections::BTreeMap<&str, &str> = report
        .reissued
        .iter()
        .map(|(o, n)| (o.as_str(), n.as_str()))
        .collect();
    assert_eq!(renamed.len(), 2);
    let all = everything(&out);
    for (old, new) in &renamed {
        assert!(!all.contains(old), "{old} is still referenced");
        assert!(all.contains(new));
        assert!(reissue::tick(new, "msg").is_some(), "{new}");
        let (time, created): (i64, i64) = c
            .query_row(
                "SELECT time_created, json_extract(data, '$.time.created') FROM message WHERE id = ?1",
                [new],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!(time > 3000, "{time}");
        assert_eq!(time, created, "the row and its data agree");
    }
    let parts: i64 = count(
        &c,
        "SELECT count(*) FROM part p JOIN message m ON m.id = p.message_id WHERE m.session_id = 'ses_t'",
    );
    assert_eq!(parts, 7);
    events_sound(&out);
    assert_sound(&out);

    // Without knowing which messages are this run's own, nothing may move: today's rule, said.
    let out2 = d.path("out2.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out2, full()).unwrap();
    assert!(report.kept_both.is_empty());
    let conflict = &report.conflicts[0];
    assert_eq!(conflict.refusal, Some(Refusal::Interleaved));
    assert!(
        conflict.describe().contains("interleave"),
        "{}",
        conflict.describe()
    );
}

#[test]
fn this_runs_exchange_that_began_first_goes_before_the_other_runs_question() {
    let (d, restored, _) = thread();
    let base = d.copy(&restored, "base.db");
    exchange(&open(&base), "ses_t", 2000, &[2010], "alpha");
    let ours = d.copy(&restored, "ours.db");
    let mine = vec![exchange(
        &open(&ours),
        "ses_t",
        1000,
        &[1010, 3000],
        "bravo",
    )];
    let movable = own(&mine);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, with_own(&movable)).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(
        contiguous(&out),
        [
            "question zero",
            "answer zero step 0",
            "question bravo",
            "answer bravo step 0",
            "answer bravo step 1",
            "question alpha",
            "answer alpha step 0"
        ]
    );
    events_sound(&out);
    assert_sound(&out);
}

#[test]
fn a_third_run_placed_between_two_others_is_joined_again_by_a_fourth() {
    let (d, restored, _) = thread();
    // A (1000-3000), B (2000-2010, moved after A), then C (2500, moved between A and B).
    let a = d.copy(&restored, "a.db");
    exchange(&open(&a), "ses_t", 1000, &[1010, 3000], "alpha");
    let b = d.copy(&restored, "b.db");
    let mine = own(&[exchange(&open(&b), "ses_t", 2000, &[2010], "bravo")]);
    let ab = d.path("ab.db");
    merge_with(&a, &b, &Snapshot::empty(), &ab, with_own(&mine)).unwrap();
    let cdb = d.copy(&restored, "c.db");
    let mine = own(&[exchange(&open(&cdb), "ses_t", 2500, &[2600], "charlie")]);
    let abc = d.path("abc.db");
    let report = merge_with(&ab, &cdb, &Snapshot::empty(), &abc, with_own(&mine)).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    // D restored A+B and answered later; it saves after C.
    let dd = d.copy(&ab, "d.db");
    let mine = own(&[exchange(&open(&dd), "ses_t", 9000, &[9010], "delta")]);
    let abcd = d.path("abcd.db");
    let report = merge_with(&abc, &dd, &Snapshot::empty(), &abcd, with_own(&mine)).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    let texts = contiguous(&abcd);
    let questions: Vec<&String> = texts.iter().filter(|t| t.starts_with("question")).collect();
    assert_eq!(
        questions,
        [
            "question zero",
            "question alpha",
            "question charlie",
            "question bravo",
            "question delta"
        ]
    );
    assert_eq!(texts.len(), 11);
    events_sound(&abcd);
    assert_sound(&abcd);
}

#[test]
fn a_sub_agent_session_of_either_run_is_kept() {
    let (d, restored, _) = thread();
    let base = d.copy(&restored, "base.db");
    let c = open(&base);
    exchange(&c, "ses_t", 1000, &[1010], "alpha");
    session(&c, "ses_kb", Some("ses_t"), PROJECT, 1005, 1);
    drop(c);
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    exchange(&c, "ses_t", 2000, &[2010], "bravo");
    session(&c, "ses_ko", Some("ses_t"), PROJECT, 2005, 1);
    drop(c);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, full()).unwrap();
    assert_eq!(report.kept_both[0].sessions, ["ses_kb", "ses_ko", "ses_t"]);
    assert_eq!(sessions(&out), ["ses_kb", "ses_ko", "ses_t"]);
    assert_eq!(messages(&out, "ses_ko"), 2);
    assert_eq!(history(&out).len(), 6);
    assert_sound(&out);
}

/// Both runs answered on the thread; then `change` does something to this run's copy: the merge
/// falls back to the later activity and says why.
fn refused(change: impl FnOnce(&Connection), snapshot: bool) -> Conflict {
    let (d, restored, snap) = thread();
    let base = d.copy(&restored, "base.db");
    exchange(&open(&base), "ses_t", 1000, &[1010], "alpha");
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    exchange(&c, "ses_t", 2000, &[2010], "bravo");
    change(&c);
    drop(c);
    let out = d.path("out.db");
    let snap = if snapshot { snap } else { Snapshot::empty() };
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert!(report.kept_both.is_empty(), "{report:?}");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    let conflict = report.conflicts[0].clone();
    assert_eq!(conflict.winner, Side::Ours);
    assert!(conflict.lost_a_turn(), "{conflict:?}");
    // Today's rule: this run's later tree whole, the other's answer not in it.
    assert!(!history(&out)
        .iter()
        .any(|(_, t)| t.as_deref().is_some_and(|t| t.contains("alpha"))));
    assert_sound(&out);
    conflict
}

#[test]
fn a_run_that_compacted_the_session_falls_back_and_is_reported() {
    let conflict = refused(
        |c| {
            let q = message(c, "ses_t", 3000, None, "compact");
            c.execute(
                "UPDATE part SET data = '{\"type\":\"compaction\",\"auto\":true}' WHERE message_id = ?1",
                [&q],
            )
            .unwrap();
            let a = message(c, "ses_t", 3010, Some(&q), "summary");
            c.execute(
                "UPDATE message SET data = json_set(data, '$.summary', json('true')) WHERE id = ?1",
                [&a],
            )
            .unwrap();
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Compacted));
    assert!(
        conflict
            .describe()
            .contains("one run compacted the session"),
        "{}",
        conflict.describe()
    );
    // OpenCode marks the session while it compacts; old tool output is pruned in place.
    let conflict = refused(
        |c| {
            c.execute("UPDATE session SET time_compacting = 2500", [])
                .unwrap();
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Compacted));
    let conflict = refused(
        |c| {
            c.execute(
                "UPDATE part SET data = json_set(data, '$.time.compacted', 2500) \
                 WHERE message_id IN (SELECT id FROM message WHERE time_created < 1000)",
                [],
            )
            .unwrap();
        },
        false,
    );
    assert_eq!(
        conflict.refusal,
        Some(Refusal::Rewritten {
            table: "part".into()
        })
    );
}

/// The message `pick` (an ORDER BY … LIMIT clause) selects, removed with its parts.
fn remove_message(c: &Connection, pick: &str) {
    let id: String = c
        .query_row(&format!("SELECT id FROM message {pick}"), [], |r| r.get(0))
        .unwrap();
    c.execute("DELETE FROM part WHERE message_id = ?1", [&id])
        .unwrap();
    c.execute("DELETE FROM message WHERE id = ?1", [&id])
        .unwrap();
}

#[test]
fn a_revert_or_a_removed_message_falls_back() {
    let conflict = refused(
        |c| {
            c.execute(
                "UPDATE session SET revert = '{\"messageID\":\"msg_x\"}'",
                [],
            )
            .unwrap();
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Reverted));
    // OpenCode logs the removal.
    let conflict = refused(
        |c| {
            remove_message(c, "ORDER BY time_created DESC LIMIT 1 OFFSET 2");
            event(c, "ses_t", "message.removed.1", "{}");
        },
        false,
    );
    assert_eq!(
        conflict.refusal,
        Some(Refusal::Event {
            kind: "message.removed.1".into()
        })
    );
    // Removed without a trace in the log: the log still tells it was made before both parted.
    let conflict = refused(
        |c| {
            remove_message(c, "ORDER BY time_created LIMIT 1");
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Removed));
}

#[test]
fn a_title_changed_by_both_falls_back_and_one_changed_by_one_is_kept() {
    let retitle = |c: &Connection| {
        c.execute("UPDATE session SET title = 'fro-bot: renamed'", [])
            .unwrap();
    };
    // Without knowing the restored title (the cache's case) a different title is a change by both.
    assert_eq!(refused(retitle, false).refusal, Some(Refusal::Retitled));
    let (d, restored, snap) = thread();
    let base = d.copy(&restored, "base.db");
    let c = open(&base);
    exchange(&c, "ses_t", 1000, &[1010], "alpha");
    c.execute("UPDATE session SET title = 'their title'", [])
        .unwrap();
    drop(c);
    let ours = d.copy(&restored, "ours.db");
    exchange(&open(&ours), "ses_t", 2000, &[2010], "bravo");
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &snap, &out, full()).unwrap();
    assert_eq!(report.kept_both.len(), 1, "{report:?}");
    let title: String = open(&out)
        .query_row("SELECT title FROM session", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        title, "their title",
        "this run's row, with the one change made"
    );
    retitle(&open(&ours));
    let report = merge_with(&base, &ours, &snap, &d.path("out2.db"), full()).unwrap();
    assert_eq!(report.conflicts[0].refusal, Some(Refusal::Retitled));
}

#[test]
fn an_answer_without_its_question_or_an_unreadable_message_falls_back() {
    let conflict = refused(
        |c| {
            let old: String = c
                .query_row(
                    "SELECT id FROM message ORDER BY time_created LIMIT 1",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            message(
                c,
                "ses_t",
                3000,
                Some(&old),
                "late answer to an old question",
            );
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Unanswered));
    let conflict = refused(
        |c| {
            let q = message(c, "ses_t", 3000, None, "x");
            c.execute("UPDATE message SET data = '{not json' WHERE id = ?1", [&q])
                .unwrap();
        },
        false,
    );
    assert_eq!(conflict.refusal, Some(Refusal::Malformed));
}

#[test]
fn restored_text_is_data_in_the_union() {
    let (d, restored, _) = thread();
    let base = d.copy(&restored, "base.db");
    exchange(&open(&base), "ses_t", 1000, &[1010], "alpha");
    let ours = d.copy(&restored, "ours.db");
    let c = open(&ours);
    let hostile = "x'); DELETE FROM session; -- \"msg_";
    let q = message(&c, "ses_t", 2000, None, hostile);
    let a = message(&c, "ses_t", 2010, Some(&q), hostile);
    // Totals no row could hold.
    c.execute(
        "UPDATE message SET data = json_set(data, '$.tokens.input', 1e300, '$.cost', -5) WHERE id = ?1",
        [&a],
    )
    .unwrap();
    drop(c);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, full()).unwrap();
    assert_eq!(report.kept_both.len(), 1, "{report:?}");
    assert_eq!(sessions(&out), ["ses_t"]);
    assert!(contiguous(&out).iter().any(|t| t == hostile));
    let tokens: i64 = count(&open(&out), "SELECT tokens_input FROM session");
    assert!(tokens > 0 && tokens <= 1_000_000_000_000_000, "{tokens}");
    assert_sound(&out);
}

#[test]
fn the_messages_a_turn_added_are_those_the_database_did_not_hold_before() {
    let (d, restored, _) = thread();
    let after = d.copy(&restored, "after.db");
    let ids = exchange(&open(&after), "ses_t", 2000, &[2010], "bravo");
    let added = messages_added(Some(&restored), &after).unwrap();
    assert_eq!(added, ids.iter().cloned().collect());
    assert_eq!(messages_added(None, &after).unwrap().len(), 4);
}

/// A thread's first session, as a run that found none starts it.
fn fresh(c: &Connection, id: &str, at: i64) {
    c.execute(
        "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, \
         time_updated) VALUES (?1, ?2, 'slug', '/ws', 'fro-bot: issue-12', '1.18.33', ?3, ?3)",
        params![id, PROJECT, at],
    )
    .unwrap();
    c.execute(
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES (?1, -1)",
        [id],
    )
    .unwrap();
    event(
        c,
        id,
        "session.created.1",
        &format!("{{\"sessionID\":\"{id}\"}}"),
    );
}

fn thread_history(p: &Path, session: &str) -> Vec<String> {
    let c = open(p);
    let mut s = c
        .prepare(
            "SELECT (SELECT json_extract(p.data, '$.text') FROM part p WHERE p.message_id = m.id \
               ORDER BY p.id LIMIT 1) FROM message m WHERE m.session_id = ?1 \
             ORDER BY m.time_created, m.id",
        )
        .unwrap();
    s.query_map([session], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn two_runs_that_each_started_the_thread_are_folded_into_one_session() {
    // A new issue mentioned twice: neither run found a session, each started one.
    let d = Dir::new();
    let empty = d.db("empty.db");
    project(&open(&empty), PROJECT);
    let base = d.copy(&empty, "base.db");
    let c = open(&base);
    fresh(&c, "ses_theirs", 990);
    exchange(&c, "ses_theirs", 1000, &[1010, 3000], "alpha");
    drop(c);
    let ours = d.copy(&empty, "ours.db");
    let c = open(&ours);
    fresh(&c, "ses_mine", 1990);
    let mine = exchange(&c, "ses_mine", 2000, &[2010], "bravo");
    session(&c, "ses_sub", Some("ses_mine"), PROJECT, 2005, 1);
    let sub: Vec<String> = {
        let mut s = c
            .prepare("SELECT id FROM message WHERE session_id = 'ses_sub'")
            .unwrap();
        s.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    drop(c);
    let movable = own(&[mine, sub]);
    let out = d.path("out.db");
    let options = MergeOptions {
        same_thread: Some(("ses_mine", "ses_theirs")),
        ..with_own(&movable)
    };
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, options).unwrap();
    assert!(
        report.conflicts.is_empty() && report.taken.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        report.folded,
        [("ses_mine".to_string(), "ses_theirs".to_string())]
    );
    assert_eq!(report.kept_both[0].root, "ses_theirs");
    assert_eq!(
        report.kept_both[0].moved, 2,
        "bravo asked while alpha worked"
    );
    assert_eq!(sessions(&out), ["ses_sub", "ses_theirs"]);
    assert_eq!(thread_history(&out, "ses_theirs"), ALPHA_THEN_BRAVO);
    let c = open(&out);
    let parent: String = c
        .query_row(
            "SELECT parent_id FROM session WHERE id = 'ses_sub'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(parent, "ses_theirs");
    assert!(
        !everything(&out).contains("ses_mine"),
        "no row names the folded session"
    );
    let (n, distinct, max): (i64, i64, i64) = c
        .query_row(
            "SELECT count(*), count(DISTINCT seq), max(seq) FROM event WHERE aggregate_id = 'ses_theirs'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((n, distinct), (n, n));
    assert_eq!(
        count(
            &c,
            "SELECT seq FROM event_sequence WHERE aggregate_id = 'ses_theirs'"
        ),
        max
    );
    assert_eq!(
        count(
            &c,
            "SELECT tokens_input FROM session WHERE id = 'ses_theirs'"
        ),
        360
    );
    assert_sound(&out);

    // A session whose exchange interleaves with the other's and may not move (not this run's
    // own: another copy may hold it) is not folded: both stay, as before.
    let out2 = d.path("out2.db");
    let options = MergeOptions {
        same_thread: Some(("ses_mine", "ses_theirs")),
        ..full()
    };
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out2, options).unwrap();
    assert!(
        report.folded.is_empty() && report.kept_both.is_empty(),
        "{report:?}"
    );
    assert_eq!(sessions(&out2), ["ses_mine", "ses_sub", "ses_theirs"]);
}

#[test]
fn many_interleaved_exchanges_each_land_after_the_one_under_way() {
    let (d, restored, _) = thread();
    // Fifty exchanges each, this run's question always asked while the other run's was answered.
    let base = d.copy(&restored, "base.db");
    let ours = d.copy(&restored, "ours.db");
    let (b, o) = (open(&base), open(&ours));
    let mut mine = Vec::new();
    for i in 0..50 {
        let at = 10_000 + 1_000 * i;
        exchange(&b, "ses_t", at, &[at + 50], &format!("b{i:02}"));
        mine.push(exchange(
            &o,
            "ses_t",
            at + 20,
            &[at + 30],
            &format!("o{i:02}"),
        ));
    }
    drop((b, o));
    let movable = own(&mine);
    let out = d.path("out.db");
    let report = merge_with(&base, &ours, &Snapshot::empty(), &out, with_own(&movable)).unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(report.kept_both[0].moved, 100);
    let questions: Vec<String> = contiguous(&out)
        .into_iter()
        .filter(|t| t.starts_with("question"))
        .collect();
    let mut expected = vec!["question zero".to_string()];
    for i in 0..50 {
        expected.push(format!("question b{i:02}"));
        expected.push(format!("question o{i:02}"));
    }
    assert_eq!(questions, expected);
    events_sound(&out);
    assert_sound(&out);
}

/// A run's new thread session: its first exchange at `at`, answered at `answered` (after the other
/// runs asked), kept together as the guard keeps a turn's (`keep_together`); the exchange's ids.
fn started(
    d: &Dir,
    empty: &Path,
    name: &str,
    id: &str,
    at: i64,
    word: &str,
) -> (PathBuf, Vec<String>) {
    let db = d.copy(empty, name);
    let c = open(&db);
    fresh(&c, id, at - 10);
    let ids = exchange(&c, id, at, &[5000 + at], word);
    drop(c);
    let moved = keep_together(&db, &own(std::slice::from_ref(&ids))).unwrap();
    assert_eq!(moved, 1, "the answer takes its question's time");
    (db, ids)
}

/// Merges `ours` into `base` as the cache merge does: this run's thread session `mine`, its own
/// messages `own` (the turn's), and the base's session of the thread `theirs`; the result and the
/// thread's session in it.
fn fold_step(
    d: &Dir,
    name: &str,
    (base, ours): (&Path, &Path),
    (mine, theirs): (&str, &str),
    own: &std::collections::BTreeSet<String>,
) -> (PathBuf, String) {
    let out = d.path(name);
    let options = MergeOptions {
        same_thread: (mine != theirs).then_some((mine, theirs)),
        ..with_own(own)
    };
    let report = merge_with(base, ours, &Snapshot::empty(), &out, options).unwrap();
    assert!(report.conflicts.is_empty(), "{name}: {report:?}");
    assert!(
        report.reissued.is_empty(),
        "{name}: nothing moves: {report:?}"
    );
    let thread = report
        .folded
        .iter()
        .find(|(from, _)| from == mine)
        .map_or(mine.to_string(), |(_, into)| into.clone());
    assert_sound(&out);
    (out, thread)
}

const THREE: [&str; 6] = [
    "question alpha",
    "answer alpha step 0",
    "question bravo",
    "answer bravo step 0",
    "question charlie",
    "answer charlie step 0",
];

#[test]
fn three_runs_that_each_started_the_thread_converge_on_one_session_holding_each_exchange_once() {
    // A new issue mentioned three times: each run started the thread's session, and all three
    // answered after the last asked (the turns overlapped).
    let d = Dir::new();
    let empty = d.db("empty.db");
    project(&open(&empty), PROJECT);
    let (a, alpha) = started(&d, &empty, "a.db", "ses_a", 1000, "alpha");
    let (b, bravo) = started(&d, &empty, "b.db", "ses_b", 1200, "bravo");
    let (c, charlie) = started(&d, &empty, "c.db", "ses_c", 1400, "charlie");
    let (alpha, bravo, charlie) = (own(&[alpha]), own(&[bravo]), own(&[charlie]));
    // The first two saved at once, so each then merged the other's entry (A folds into B's
    // session, B into A's): two entries holding both exchanges, the thread in different sessions.
    let (a2, at) = fold_step(&d, "a2.db", (&b, &a), ("ses_a", "ses_b"), &alpha);
    let (b2, bt) = fold_step(&d, "b2.db", (&a, &b), ("ses_b", "ses_a"), &bravo);
    assert_eq!((at.as_str(), bt.as_str()), ("ses_b", "ses_a"));
    for (db, session) in [(&a2, "ses_b"), (&b2, "ses_a")] {
        assert_eq!(thread_history(db, session), THREE[..4]);
    }
    // The third merges every entry, oldest first: the thread's session changes at each fold,
    // and what it folds already holds exchanges of the others, some of them twice over.
    let (c1, t) = fold_step(&d, "c1.db", (&a, &c), ("ses_c", "ses_a"), &charlie);
    let (c2, t) = fold_step(&d, "c2.db", (&b, &c1), (&t, "ses_b"), &charlie);
    let (c3, t) = fold_step(&d, "c3.db", (&a2, &c2), (&t, "ses_b"), &charlie);
    let (c4, t) = fold_step(&d, "c4.db", (&b2, &c3), (&t, "ses_a"), &charlie);
    assert_eq!(t, "ses_a");
    assert_eq!(sessions(&c4), ["ses_a"]);
    assert_eq!(thread_history(&c4, "ses_a"), THREE);
    // Every exchange once: the copies' rows are the same rows in whichever session.
    assert_eq!(messages(&c4, "ses_a"), 6);
    // And the first two, merging the third's entry, hold the same.
    for (name, ours, mine, own) in [
        ("a3.db", &a2, "ses_b", &alpha),
        ("b3.db", &b2, "ses_a", &bravo),
    ] {
        let (out, t) = fold_step(&d, name, (&c4, ours), (mine, "ses_a"), own);
        assert_eq!(t, "ses_a");
        assert_eq!(thread_history(&out, "ses_a"), THREE, "{name}");
        assert_eq!(sessions(&out), ["ses_a"], "{name}");
    }
}

#[test]
fn a_turns_answers_take_their_questions_time_and_others_rows_are_left_alone() {
    let (d, restored, _) = thread();
    let db = d.copy(&restored, "db.db");
    let c = open(&db);
    let before: Vec<(String, i64, String)> = {
        let mut s = c
            .prepare("SELECT id, time_created, data FROM message ORDER BY id")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let ids = exchange(&c, "ses_t", 2000, &[2500, 2600], "bravo");
    drop(c);
    let moved = keep_together(&db, &own(std::slice::from_ref(&ids))).unwrap();
    assert_eq!(moved, 2);
    let c = open(&db);
    for id in &ids {
        let (at, created): (i64, i64) = c
            .query_row(
                "SELECT time_created, json_extract(data, '$.time.created') FROM message WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((at, created), (2000, 2000), "{id}");
    }
    // The restored exchange (not this turn's) is untouched; so is a database without the turn.
    for (id, at, data) in &before {
        let now: (i64, String) = c
            .query_row(
                "SELECT time_created, data FROM message WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(&now, &(*at, data.clone()));
    }
    assert_eq!(
        contiguous(&db),
        [
            "question zero",
            "answer zero step 0",
            "question bravo",
            "answer bravo step 0",
            "answer bravo step 1"
        ]
    );
    assert_eq!(keep_together(&db, &own(&[ids])).unwrap(), 0, "once only");
    assert_sound(&db);
}
