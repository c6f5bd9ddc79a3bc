//! The built binary, run the way the runner runs the container action.

use crate::persistence::killed_writer;
use crate::support::action::{Job, StepResult};
use crate::support::cache_server::CacheServer;

fn with_cache(job: &mut Job, server: &CacheServer) {
    for (k, v) in server.env_pairs() {
        job.set(&k, v);
    }
}

fn state(value: &str) -> StepResult {
    StepResult {
        code: 0,
        stdout: String::new(),
        stderr: String::new(),
        outputs: Default::default(),
        state: [("cacheSaved".to_string(), value.to_string())].into(),
        summary: String::new(),
    }
}

mod post {
    use super::*;

    #[tokio::test]
    async fn not_persisted_makes_post_retry_the_cache_save_with_mains_key() {
        let server = CacheServer::start().await;
        let mut job = Job::new(4242);
        with_cache(&mut job, &server);
        std::fs::create_dir_all(job.data_dir()).unwrap();
        killed_writer(&job.data_dir().join("opencode.db"), 20);
        let post = tokio::task::spawn_blocking(move || {
            let r = job.post_step(&state("not-persisted"));
            (job, r)
        });
        let (job, result) = post.await.unwrap();
        assert_eq!(result.code, 0, "{}\n{}", result.stdout, result.stderr);
        let entries = server.entries();
        assert_eq!(entries.len(), 1, "{}", result.stdout);
        assert_eq!(
            entries[0].key,
            "opencode-storage-octo-hello-main-Linux-4242-1-agent"
        );
        assert!(result.summary.contains("durable"), "{}", result.summary);
        // The WAL was folded in before the archive was made.
        assert_eq!(
            std::fs::metadata(job.data_dir().join("opencode.db-wal"))
                .map(|m| m.len())
                .unwrap_or(0),
            0
        );
    }

    #[tokio::test]
    async fn durable_skipped_and_declined_make_post_do_nothing() {
        let server = CacheServer::start().await;
        for (value, needle) in [
            ("durable", "Nothing to do"),
            ("store-only", "Nothing to do"),
            ("skipped", "Nothing to do"),
            ("declined-for-safety", "declined to save for safety"),
        ] {
            let mut job = Job::new(7);
            with_cache(&mut job, &server);
            std::fs::create_dir_all(job.data_dir()).unwrap();
            killed_writer(&job.data_dir().join("opencode.db"), 3);
            let result = tokio::task::spawn_blocking(move || job.post_step(&state(value)))
                .await
                .unwrap();
            assert_eq!(result.code, 0);
            assert!(
                result.summary.contains(needle),
                "{value}: {}",
                result.summary
            );
        }
        assert!(server.calls().is_empty(), "post must not touch the cache");
    }

    #[tokio::test]
    async fn post_always_exits_zero_even_when_the_retry_fails() {
        let server = CacheServer::start().await;
        server.set_read_only(true);
        let mut job = Job::new(9);
        with_cache(&mut job, &server);
        std::fs::create_dir_all(job.data_dir()).unwrap();
        killed_writer(&job.data_dir().join("opencode.db"), 3);
        // Unknown state means not persisted.
        let result = tokio::task::spawn_blocking(move || job.post_step(&state("garbage")))
            .await
            .unwrap();
        assert_eq!(result.code, 0);
        assert!(result.stdout.contains("::warning::"), "{}", result.stdout);
        assert!(
            result.summary.contains("not-persisted"),
            "{}",
            result.summary
        );
    }
}
