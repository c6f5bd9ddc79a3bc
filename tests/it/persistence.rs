//! Persistence: real SQLite files in WAL mode written by a real writer process that is killed with
//! SIGKILL, so the newest rows exist only in the WAL.

use std::path::Path;
use std::process::Command;

use fro_bot::memory::checkpoint::{self, CheckpointOutcome};

/// Writes `rows` rows in WAL mode from a separate Python process (its own SQLite), with automatic
/// checkpoints off, then SIGKILLs itself: nothing gets folded into the main file on exit.
pub fn killed_writer(db: &Path, rows: usize) {
    let script = r#"
import os, signal, sqlite3, sys
db, rows = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("CREATE TABLE IF NOT EXISTS memory(id INTEGER PRIMARY KEY, body TEXT)")
for i in range(rows):
    c.execute("INSERT INTO memory(body) VALUES (?)", ("turn %d " % i + "x" * 200,))
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(db)
        .arg(rows.to_string())
        .status()
        .expect("python3 runs");
    assert!(!status.success(), "the writer must die by SIGKILL");
}

fn count_rows_in_main_file_alone(db: &Path) -> i64 {
    // A copy without its WAL is what a naive save would have uploaded.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    std::fs::copy(db, &copy).unwrap();
    let conn = rusqlite::Connection::open(&copy).unwrap();
    conn.query_row("SELECT count(*) FROM memory", [], |r| r.get(0))
        .unwrap_or(0)
}

#[test]
fn wal_only_rows_are_folded_into_the_main_file_by_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("opencode.db");
    killed_writer(&db, 500);
    let wal = dir.path().join("opencode.db-wal");
    assert!(
        wal.metadata().unwrap().len() > 0,
        "the rows must sit in the WAL"
    );
    assert_eq!(
        count_rows_in_main_file_alone(&db),
        0,
        "the main file alone must miss them (else this test proves nothing)"
    );
    assert_eq!(checkpoint::checkpoint(&db), CheckpointOutcome::Checkpointed);
    assert_eq!(wal.metadata().map(|m| m.len()).unwrap_or(0), 0);
    assert_eq!(count_rows_in_main_file_alone(&db), 500);
}

pub mod phases {
    use std::path::{Path, PathBuf};

    use fro_bot::cache::Backend;
    use fro_bot::memory::report::{CacheStatus, RestoreReport, RestoreSource};
    use fro_bot::memory::restore::{restore, RestoreInputs, StoreAttempt};
    use fro_bot::memory::save::{save, SaveInputs, SaveReport};
    use fro_bot::memory::save_result::{GateInputs, SaveOutcome, StateValue, StorePublish};
    use fro_bot::memory::state_paths::StatePaths;
    use fro_bot::runner::Env;

    use super::{checkpoint, killed_writer};
    use crate::support::cache_server::CacheServer;

    pub const OPEN_GATE: GateInputs = GateInputs {
        agent_still_running: false,
        server_quiescent: true,
        strays_remained: false,
    };

    /// A runner-like job: `/github/workspace` and `/github/home` under one temp root.
    pub struct Job {
        _root: tempfile::TempDir,
        pub workspace: PathBuf,
        pub paths: StatePaths,
    }

    impl Job {
        pub fn new() -> Self {
            let root = tempfile::tempdir().unwrap();
            let workspace = root.path().join("github/workspace");
            std::fs::create_dir_all(&workspace).unwrap();
            let paths = StatePaths::new(root.path().join("github/home/.local/share/opencode"));
            std::fs::create_dir_all(&paths.data_dir).unwrap();
            Job {
                _root: root,
                workspace,
                paths,
            }
        }

        pub async fn save(
            &self,
            backend: Option<&Backend>,
            key: &str,
            gate: GateInputs,
        ) -> SaveReport {
            save(
                SaveInputs {
                    paths: &self.paths,
                    workspace: &self.workspace,
                    skip_cache: false,
                    gate,
                    cache: backend,
                    save_key: key,
                    run_id: "1",
                    now_ms: 1,
                    shadow_guard: None,
                    sessions: None,
                    trust: None,
                    restored: None,
                    cache_merge: None,
                    scrub_scope: &fro_bot::memory::scrub::Scope::Whole,
                },
                || async { StorePublish::Disabled.into() },
            )
            .await
        }

        pub async fn restore(&self, backend: &Backend, prefix: &str) -> RestoreReport {
            restore(
                RestoreInputs {
                    paths: &self.paths,
                    workspace: &self.workspace,
                    skip_cache: false,
                    cache: Some(backend),
                    key: prefix,
                    restore_keys: &[format!("{prefix}-")],
                    catalog: fro_bot::memory::fallback::Catalog::Unavailable { reason: "test" },
                    now_ms: fro_bot::opencode::system_now_ms(),
                },
                async { StoreAttempt::Disabled },
            )
            .await
        }
    }

    pub fn rows(db: &Path) -> i64 {
        rusqlite::Connection::open(db)
            .unwrap()
            .query_row("SELECT count(*) FROM memory", [], |r| r.get(0))
            .unwrap()
    }

    pub fn backend(server: &CacheServer) -> Backend {
        Backend::from_env(&Env::from_pairs(server.env_pairs())).unwrap()
    }

    #[tokio::test]
    async fn wal_only_rows_survive_save_then_restore_in_a_new_job() {
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let first = Job::new();
        killed_writer(&first.paths.db(), 300);
        std::fs::write(
            first.paths.auth_file(),
            r#"{"p":{"type":"api","key":"sk-x"}}"#,
        )
        .unwrap();
        let report = first
            .save(
                Some(&backend),
                "opencode-storage-o-r-main-Linux-1-1",
                OPEN_GATE,
            )
            .await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::Persisted,
            "{:?}",
            report.result
        );
        assert_eq!(report.result.state_value(), StateValue::Durable);
        assert!(
            !first.paths.auth_file().exists(),
            "auth.json must be deleted before saving"
        );

        // A new job on a runner has the same absolute paths and an empty home.
        let second = first;
        std::fs::remove_dir_all(&second.paths.data_dir).unwrap();
        let restored = second
            .restore(&backend, "opencode-storage-o-r-main-Linux")
            .await;
        assert_eq!(restored.status, CacheStatus::Hit, "{:?}", restored.notes);
        assert_eq!(restored.source, RestoreSource::Cache);
        assert_eq!(rows(&second.paths.db()), 300);
        assert!(!second.paths.auth_file().exists());
        assert!(second.paths.marker().exists());
    }

    /// The save reads the database once for "unchanged since restore" and the marker: the
    /// marker must name the database as saved, not the one restored.
    #[tokio::test]
    async fn a_save_after_a_restore_writes_a_marker_naming_the_database_it_saved() {
        use fro_bot::memory::ledger::RestoredCopy;
        use fro_bot::memory::state_paths::{check_marker, MarkerCheck};
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let job = Job::new();
        killed_writer(&job.paths.db(), 5);
        checkpoint::checkpoint(&job.paths.db());
        let restored = RestoredCopy {
            sha256: fro_bot::memory::state_paths::FileDigest::of(&job.paths.db())
                .unwrap()
                .sha256,
            cache_key: Some("k-main-0".into()),
        };
        killed_writer(&job.paths.db(), 7);
        let report = save(
            SaveInputs {
                paths: &job.paths,
                workspace: &job.workspace,
                skip_cache: false,
                gate: OPEN_GATE,
                cache: Some(&backend),
                save_key: "k-main-1",
                run_id: "1",
                now_ms: 1,
                shadow_guard: None,
                sessions: None,
                trust: None,
                restored: Some(&restored),
                cache_merge: None,
                scrub_scope: &fro_bot::memory::scrub::Scope::Whole,
            },
            || async { StorePublish::Disabled.into() },
        )
        .await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::Persisted,
            "{:?}",
            report.result
        );
        let saved = fro_bot::memory::state_paths::FileDigest::of(&job.paths.db()).unwrap();
        assert_ne!(saved.sha256, restored.sha256, "the run changed memory");
        let MarkerCheck::Compatible(marker) = check_marker(&job.paths.marker()) else {
            panic!("no marker");
        };
        assert_eq!(marker.db_sha256, hex::encode(saved.sha256));
        assert_eq!(marker.db_size, saved.size);
    }

    #[tokio::test]
    async fn garbage_database_in_an_entry_is_discarded_and_the_run_starts_clean() {
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let job = Job::new();
        std::fs::write(job.paths.db(), vec![0x5au8; 64 * 1024]).unwrap();
        // The save refuses to store it (it would become the newest entry and hide good memory)...
        let report = job.save(Some(&backend), "k-main-1", OPEN_GATE).await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::CheckpointDeclined,
            "{:?}",
            report.result
        );
        assert!(
            report.result.detail.contains("corrupt"),
            "{}",
            report.result.detail
        );
        assert!(server.entries().is_empty());
        // ...and an entry that holds one anyway (another writer's) is recognised at restore.
        let archive = job.workspace.join("planted.tzst");
        fro_bot::cache::write_archive(job.paths.cache_paths(), &job.workspace, &archive).unwrap();
        server.plant(
            "k-main-2",
            &fro_bot::cache::version(job.paths.cache_paths()),
            &archive,
        );
        std::fs::remove_dir_all(&job.paths.data_dir).unwrap();
        let restored = job.restore(&backend, "k-main").await;
        assert_eq!(
            restored.status,
            CacheStatus::Corrupted,
            "{:?}",
            restored.notes
        );
        assert!(!job.paths.db().exists());
    }

    #[tokio::test]
    async fn read_only_token_is_rejected_not_an_error_and_post_would_retry() {
        let server = CacheServer::start().await;
        server.set_read_only(true);
        let backend = backend(&server);
        let job = Job::new();
        killed_writer(&job.paths.db(), 5);
        let report = job.save(Some(&backend), "k-ro-1", OPEN_GATE).await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::CacheRejected,
            "{:?}",
            report.result
        );
        assert_eq!(report.result.state_value(), StateValue::NotPersisted);
        assert!(
            report.result.detail.contains("cache write denied"),
            "{}",
            report.result.detail
        );
    }

    #[tokio::test]
    async fn server_errors_after_retries_are_cache_errors() {
        use crate::support::cache_server::{Fault, CREATE};
        let server = CacheServer::start().await;
        server.inject(CREATE, (0..5).map(|_| Fault::status(503)));
        let mut backend = backend(&server);
        if let Backend::Actions(client) = &mut backend {
            client.set_retry(fro_bot::cache::RetryPolicy {
                base_delay: std::time::Duration::from_millis(1),
                ..Default::default()
            });
        }
        let job = Job::new();
        killed_writer(&job.paths.db(), 5);
        let report = job.save(Some(&backend), "k-5xx-1", OPEN_GATE).await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::CacheError,
            "{:?}",
            report.result
        );
        assert_eq!(report.result.state_value(), StateValue::NotPersisted);
    }

    #[tokio::test]
    async fn the_safety_gate_refuses_before_touching_anything() {
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let job = Job::new();
        killed_writer(&job.paths.db(), 5);
        let wal_before = std::fs::metadata(job.paths.data_dir.join("opencode.db-wal"))
            .unwrap()
            .len();
        for gate in [
            GateInputs {
                agent_still_running: true,
                ..OPEN_GATE
            },
            GateInputs {
                server_quiescent: false,
                ..OPEN_GATE
            },
            GateInputs {
                strays_remained: true,
                ..OPEN_GATE
            },
        ] {
            let report = job.save(Some(&backend), "k-gate-1", gate).await;
            assert_eq!(report.result.outcome, SaveOutcome::OwnershipDeclined);
            assert_eq!(report.result.state_value(), StateValue::DeclinedForSafety);
            assert!(
                report.checkpoint.is_none(),
                "the gate comes before the checkpoint"
            );
        }
        // Nothing checkpointed, nothing uploaded.
        let wal_after = std::fs::metadata(job.paths.data_dir.join("opencode.db-wal"))
            .unwrap()
            .len();
        assert_eq!(wal_before, wal_after);
        assert!(server.entries().is_empty());
    }

    #[tokio::test]
    async fn nothing_to_save_is_skipped_empty() {
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let job = Job::new();
        let report = job.save(Some(&backend), "k-empty-1", OPEN_GATE).await;
        assert_eq!(report.result.outcome, SaveOutcome::SkippedEmpty);
        assert_eq!(report.result.state_value(), StateValue::Skipped);
        assert!(server.calls().is_empty(), "the service must not be asked");
    }

    /// `chattr +i` makes a file unwritable even for root (the tests run as root, which ignores
    /// permission bits). Undone on drop, also when the test fails.
    struct Immutable(std::path::PathBuf);

    impl Immutable {
        /// Needs root, as the suite does (README "Test"): without it the test fails saying so, as
        /// for every other missing prerequisite, instead of passing untested.
        fn set(path: &Path) -> Self {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            assert_eq!(
                uid, 0,
                "chattr +i needs root: run the suite as root (scripts/test, README \"Test\")"
            );
            let status = std::process::Command::new("chattr")
                .arg("+i")
                .arg(path)
                .status()
                .unwrap();
            assert!(status.success(), "chattr +i must work for root (ext4)");
            Immutable(path.to_path_buf())
        }
    }

    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.0)
                .status();
        }
    }

    #[tokio::test]
    async fn an_unwritable_database_is_never_deleted_nor_called_corrupt() {
        let server = CacheServer::start().await;
        let backend = backend(&server);
        let job = Job::new();
        killed_writer(&job.paths.db(), 40);
        let db = job.paths.db();
        let wal = job.paths.data_dir.join("opencode.db-wal");
        let before = std::fs::read(&db).unwrap();
        let _db_lock = Immutable::set(&db);
        let _wal_lock = Immutable::set(&wal);
        // Checkpointing needs to write: it fails, and says it is not corruption.
        match fro_bot::memory::checkpoint::checkpoint(&db) {
            fro_bot::memory::checkpoint::CheckpointOutcome::Failed {
                structural: false, ..
            } => {}
            other => panic!("an unwritable database must fail softly: {other:?}"),
        }
        // The save declines (saving the main file alone would lose the WAL's rows)...
        let report = job.save(Some(&backend), "k-ro-db-1", OPEN_GATE).await;
        assert_eq!(
            report.result.outcome,
            SaveOutcome::CheckpointDeclined,
            "{:?}",
            report.result
        );
        assert!(server.entries().is_empty());
        // ...and nothing was deleted or changed.
        assert_eq!(std::fs::read(&db).unwrap(), before);
        assert!(wal.exists());
    }
}
