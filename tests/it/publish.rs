//! The store publish as read-merge-write under the lease (docs/design.md#the-store-publish), on
//! real SeaweedFS with databases of OpenCode 1.18.33's real schema.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fro_bot::lease::{Holder, LeaseConfig};
use fro_bot::memory::ledger::StoreContext;
use fro_bot::memory::merge::Snapshot;
use fro_bot::memory::publish::{publish, PublishInputs, PublishReport};
use fro_bot::memory::save_result::StorePublish;
use fro_bot::memory::state_paths::StatePaths;
use fro_bot::object_store::{self as store, ObjectStore, StoreKeys};
use fro_bot::runner::FileCommands;
use rusqlite::{params, Connection};

use crate::support::s3;

const SCHEMA: &str = include_str!("fixtures/opencode-1.18.33-schema.sql");
const MIGRATIONS: &str = include_str!("fixtures/opencode-1.18.33-migrations.txt");
const PROJECT: &str = "cadca77b89a5b7a8d5075e6730ad6b4f59d91881";

/// A database as OpenCode leaves it after its first turn: one project, one session with a message.
fn base_db(path: &Path) {
    let c = Connection::open(path).unwrap();
    c.execute_batch(SCHEMA).unwrap();
    for id in MIGRATIONS.lines().filter(|l| !l.is_empty()) {
        c.execute("INSERT INTO migration VALUES (?1, 1)", [id])
            .unwrap();
    }
    c.execute(
        "INSERT INTO project (id, worktree, vcs, time_created, time_updated, sandboxes) \
         VALUES (?1, '/ws', 'git', 1, 1, '[]')",
        [PROJECT],
    )
    .unwrap();
    add_session(&c, "ses_base", 1_000);
}

/// A root session titled as fro-bot titles them, with one message.
fn add_session(c: &Connection, id: &str, at: i64) {
    c.execute(
        "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, \
         time_updated) VALUES (?1, ?2, 'slug', '/ws', ?3, '1.18.33', ?4, ?4)",
        params![id, PROJECT, format!("fro-bot: issue-{id}"), at],
    )
    .unwrap();
    c.execute(
        "INSERT INTO message (id, session_id, time_created, time_updated, data) \
         VALUES (?1, ?2, ?3, ?3, '{\"role\":\"user\"}')",
        params![format!("msg_{id}"), id, at],
    )
    .unwrap();
}

fn sessions(db: &Path) -> Vec<String> {
    let c = Connection::open(db).unwrap();
    let mut stmt = c.prepare("SELECT id FROM session ORDER BY id").unwrap();
    let ids = stmt.query_map([], |r| r.get(0)).unwrap();
    ids.collect::<Result<_, _>>().unwrap()
}

fn holder(run_id: u64) -> Holder {
    Holder {
        repo: "octo/repo".into(),
        run_id,
        run_attempt: 1,
        identity: None,
    }
}

/// One run's state: its own data dir holding the restored base plus one new session.
struct RunState {
    _root: tempfile::TempDir,
    paths: StatePaths,
    files: FileCommands,
}

/// The marker's entries a run writes for its session: its thread, and a record naming it.
fn thread_of(session: &str) -> String {
    format!("issue-{session}")
}
fn author_of(session: &str) -> String {
    format!("author-{session}")
}

fn run_with_session(base: &Path, session: &str) -> RunState {
    let root = tempfile::tempdir().unwrap();
    let paths = StatePaths::new(root.path().join("opencode"));
    std::fs::create_dir_all(&paths.data_dir).unwrap();
    std::fs::copy(base, paths.db()).unwrap();
    let c = Connection::open(paths.db()).unwrap();
    add_session(&c, session, 2_000);
    drop(c);
    // As the save writes it just before the publish.
    let map = [(thread_of(session), session.to_string())].into();
    let trust = [(
        session.to_string(),
        fro_bot::trust::SessionTrust::new(&author_of(session), "OWNER", false, false),
    )]
    .into();
    fro_bot::memory::state_paths::write_marker(
        &paths,
        "1",
        1,
        Some(&map),
        Some(&trust),
        fro_bot::memory::state_paths::Scrubbed::Whole,
        None,
    )
    .unwrap();
    let files = FileCommands {
        output: None,
        state: Some(root.path().join("state")),
        env: None,
        summary: None,
    };
    RunState {
        _root: root,
        paths,
        files,
    }
}

async fn publish_run(
    ctx: &StoreContext,
    run: &RunState,
    run_id: u64,
    etag: Option<String>,
    restored: &Snapshot,
) -> PublishReport {
    publish(PublishInputs {
        store: ctx,
        cancel: &fro_bot::runner::Cancellation::new(),
        holder: holder(run_id),
        files: &run.files,
        paths: &run.paths,
        workspace: Path::new("/ws"),
        expected_etag: etag,
        restored: Some(restored),
        own_rows: &Default::default(),
        run_id: &run_id.to_string(),
        now_ms: fro_bot::runner::now_ms(),
        lease_config: LeaseConfig::default(),
        lease_wait: Duration::from_secs(300),
    })
    .await
}

async fn published_sessions(store: &ObjectStore, keys: &StoreKeys) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    match store::sync::restore_session_db(store, keys, dir.path()).await {
        store::StoreRestore::Hit { .. } => sessions(&dir.path().join("opencode.db")),
        other => panic!("nothing published: {other:?}"),
    }
}

/// Starts every run from the same published base, as concurrent runs do.
async fn published_base(ctx: &StoreContext) -> (tempfile::TempDir, PathBuf, String, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    base_db(&base);
    let store::PublishOutcome::Published { etag } =
        store::sync::publish_session_db(&ctx.store, &ctx.keys, &base, None).await
    else {
        panic!("the base could not be published");
    };
    let snapshot = Snapshot::capture(&base).unwrap();
    (dir, base, etag, snapshot)
}

/// Issue 15's figure: sixteen runs that restored the same copy each publish one new session at
/// once; every one of them ends up in the store, and the puts each needed are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_publishers_each_adding_a_session_leave_all_sixteen() {
    const RUNS: u64 = 16;
    let (store, keys) = s3::fresh("publish16").await;
    let ctx = Arc::new(StoreContext { store, keys });
    let (_dir, base, etag, snapshot) = published_base(&ctx).await;
    let snapshot = Arc::new(snapshot);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..RUNS {
        let run = run_with_session(&base, &format!("ses_run{i:02}"));
        let (ctx, etag, snapshot) = (ctx.clone(), etag.clone(), snapshot.clone());
        tasks.spawn(async move {
            let report = publish_run(&ctx, &run, 100 + i, Some(etag), &snapshot).await;
            // The run's own database is now what it published: the cache entry holds the same.
            let local = sessions(&run.paths.db());
            (i, report, local)
        });
    }
    let mut puts = Vec::new();
    let mut waits = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, report, local) = joined.unwrap();
        assert_eq!(
            report.outcome,
            StorePublish::Published,
            "run {i}: {report:?}"
        );
        assert!(local.contains(&format!("ses_run{i:02}")), "{local:?}");
        assert!(report.merges.iter().all(|m| m.conflicts.is_empty()));
        puts.push(report.puts);
        waits += report.lease_waits;
    }
    let took = started.elapsed();
    let mut expected: Vec<String> = (0..RUNS).map(|i| format!("ses_run{i:02}")).collect();
    expected.push("ses_base".into());
    expected.sort();
    assert_eq!(published_sessions(&ctx.store, &ctx.keys).await, expected);
    // The marker beside the store's copy names it, and holds every run's thread and record: each
    // publish that merged carried over those of the copy it merged into.
    let store::GetOutcome::Found(db) = ctx.store.get_bytes(&ctx.keys.session_db()).await.unwrap()
    else {
        panic!("no store copy");
    };
    let marker = store::sync::fetch_marker(&ctx.store, &ctx.keys)
        .await
        .unwrap()
        .expect("a marker beside the store's copy");
    use sha2::Digest;
    let marker = fro_bot::memory::state_paths::marker_naming(
        &marker,
        &hex::encode(sha2::Sha256::digest(&db.bytes)),
    )
    .unwrap();
    let (map, trust) = (marker.sessions.unwrap(), marker.trust.unwrap());
    for i in 0..RUNS {
        let session = format!("ses_run{i:02}");
        assert_eq!(map.get(&thread_of(&session)), Some(&session), "{map:?}");
        assert_eq!(
            trust.get(&session).map(|r| r.author.clone()),
            Some(author_of(&session)),
            "{trust:?}"
        );
    }
    puts.sort();
    println!(
        "16 concurrent publishers in {took:.1?}: puts per run {puts:?} (total {}), lease waits {waits}",
        puts.iter().sum::<u32>()
    );
    // Under the lease a run needs at most one put more than the first.
    assert!(puts.iter().all(|&p| p <= 2), "{puts:?}");
}

/// A copy that cannot be merged (another migration set) is never overwritten: the publish reports
/// a conflict and the store keeps what it had.
#[tokio::test]
async fn a_newer_copy_that_cannot_be_merged_is_not_overwritten() {
    let (store, keys) = s3::fresh("publish-nomerge").await;
    let ctx = StoreContext { store, keys };
    let (_dir, base, etag, snapshot) = published_base(&ctx).await;
    // Another run published a database of another OpenCode release in between.
    let other_dir = tempfile::tempdir().unwrap();
    let other = other_dir.path().join("other.db");
    std::fs::copy(&base, &other).unwrap();
    let c = Connection::open(&other).unwrap();
    c.execute("INSERT INTO migration VALUES ('99999999_future', 1)", [])
        .unwrap();
    add_session(&c, "ses_other", 3_000);
    drop(c);
    assert!(matches!(
        store::sync::publish_session_db(&ctx.store, &ctx.keys, &other, Some(&etag)).await,
        store::PublishOutcome::Published { .. }
    ));
    let run = run_with_session(&base, "ses_mine");
    let report = publish_run(&ctx, &run, 7, Some(etag), &snapshot).await;
    assert_eq!(report.outcome, StorePublish::Conflict, "{report:?}");
    assert_eq!(
        published_sessions(&ctx.store, &ctx.keys).await,
        vec!["ses_base".to_string(), "ses_other".into()]
    );
    // This run's own database is untouched: the cache entry still gets its session.
    assert!(sessions(&run.paths.db()).contains(&"ses_mine".to_string()));
}
