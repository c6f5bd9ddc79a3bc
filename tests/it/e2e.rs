//! The built binary, run the way the runner runs the container action.

mod restore_safety;

use crate::persistence::killed_writer;
use crate::support::action::{comment_event, explain, Job, Launch, Running, StepResult};
use crate::support::cache_server::CacheServer;

mod hostile;
mod many_sessions;

/// The enterprise-network runs, listed with the scenarios below.
pub(crate) use crate::network;

fn with_cache(job: &mut Job, server: &CacheServer) {
    for (k, v) in server.env_pairs() {
        job.set(&k, v);
    }
}

/// The scenarios run under every launch: here as the built binary (`e2e::binary::*`), and from
/// the action's image in tests/it/container.rs (`container::*`). One list, so both stay in step.
macro_rules! launched_scenarios {
    ($launch:expr) => {
        $crate::e2e::launched_scenarios!($launch;
            post::not_persisted_makes_post_retry_the_cache_save_with_mains_key,
            post::durable_skipped_and_declined_make_post_do_nothing,
            scenarios::a_follow_up_comment_resumes_the_thread_and_another_issue_finds_it_as_prior_work,
            scenarios::a_provider_auth_failure_fails_the_step_answers_once_and_still_saves_memory,
            scenarios::a_comment_without_the_mention_is_skipped_with_the_reason,
            scenarios::a_workspace_owned_by_the_runner_user_still_gets_its_project_identity,
            scenarios::read_only_cache_with_s3_is_store_only_and_the_next_run_restores_from_s3,
            scenarios::post_releases_the_lease_a_killed_main_step_left_behind,
            scenarios::sigterm_mid_turn_saves_memory_within_the_budget,
            scenarios::sigint_mid_turn_saves_and_the_next_run_resumes,
            scenarios::sigint_then_sigterm_mid_turn_saves_memory_within_the_runners_budget,
            scenarios::a_prompt_injected_agent_finds_no_secret_and_reaches_nothing,
            changes::an_issue_gets_a_branch_and_a_draft_pull_request_and_a_follow_up_adds_to_it,
            changes::hooks_and_config_the_agent_plants_in_git_never_run_while_fro_bot_reads_the_change,
            leftovers::what_the_agent_plants_in_git_is_put_back_and_a_later_steps_git_runs_none_of_it,
            leftovers::after_a_sigkill_of_main_post_puts_git_back,
            leftovers::the_agents_home_is_private_and_the_runners_home_and_payload_are_not_its_to_write,
            leftovers::after_a_sigkill_mid_turn_post_gives_back_what_main_took,
            cut_turn::sigkill_during_a_command_on_a_thread_with_memory_is_finished_by_post_and_resumed,
            leftovers::the_agent_cannot_read_or_rewrite_another_threads_memory,
            leftovers::opencodes_tools_never_reach_memory_or_env_files_and_never_wait_for_an_answer,
            network::a_private_ca_in_node_extra_ca_certs_is_trusted_by_fro_bot_and_opencode,
            enterprise::on_enterprise_server_every_call_goes_under_the_api_prefixes_and_every_link_to_the_server,
            cancel::sigterm_while_opencode_starts_stops_it_and_ends_within_the_budget,
            cancel::sigint_during_session_prep_ends_before_the_prompt_within_the_budget,
            cancel::sigint_during_the_restore_stops_it_and_memory_is_kept,
            cancel::sigterm_while_waiting_for_the_threads_turn_ends_without_restoring,
            cancel::sigterm_while_the_publish_waits_for_the_lease_still_saves_to_the_cache,
            cancel::sigterm_during_the_save_says_not_persisted_and_post_saves,
        );
    };
    ($launch:expr; $($module:ident :: $name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            $crate::e2e::$module::$name($launch).await;
        }
    )*};
}
pub(crate) use launched_scenarios;

mod binary {
    super::launched_scenarios!(crate::support::action::Launch::Binary);
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

pub(crate) mod post {
    use super::*;

    pub async fn not_persisted_makes_post_retry_the_cache_save_with_mains_key(launch: Launch) {
        let server = CacheServer::start().await;
        let mut job = Job::launched(4242, launch);
        with_cache(&mut job, &server);
        std::fs::create_dir_all(job.data_dir()).unwrap();
        killed_writer(&job.data_dir().join("opencode.db"), 20);
        // OpenCode's legacy JSON storage, which the scrub does not read: never saved.
        let legacy = job.data_dir().join("storage/session/info");
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(
            legacy.join("leak.json"),
            "{\"token\":\"legacy-storage-canary\"}",
        )
        .unwrap();
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
        assert!(
            result
                .summary
                .contains("Secrets scrubbed: 0 secret(s) replaced"),
            "{}",
            result.summary
        );
        let tar =
            zstd::decode_all(&std::fs::read(server.blob_path(&entries[0])).unwrap()[..]).unwrap();
        assert!(
            memchr::memmem::find(&tar, b"legacy-storage-canary").is_none()
                && memchr::memmem::find(&tar, b"leak.json").is_none(),
            "storage/ reached the cache entry"
        );
        assert!(!job.data_dir().join("storage").exists());
        // The WAL was folded in before the archive was made.
        assert_eq!(
            std::fs::metadata(job.data_dir().join("opencode.db-wal"))
                .map(|m| m.len())
                .unwrap_or(0),
            0
        );
    }

    #[tokio::test]
    async fn post_finds_mains_committed_entry_or_saves_beside_an_abandoned_reservation() {
        post_finds_or_saves_beside(false).await;
    }

    /// The same on an Enterprise Server runner, through the v1 service (whose pending
    /// reservation is a 409 too).
    #[tokio::test]
    async fn on_cache_v1_post_finds_mains_committed_entry_or_saves_beside_an_abandoned_reservation()
    {
        post_finds_or_saves_beside(true).await;
    }

    /// A job on github.com (v2) or on an Enterprise Server runner offering only v1.
    fn cache_job(run_id: u64, server: &CacheServer, v1: bool) -> Job {
        let mut job = Job::new(run_id);
        match v1 {
            false => with_cache(&mut job, server),
            true => {
                for (k, v) in server.env_pairs_v1() {
                    job.set(&k, v);
                }
                job.set("GITHUB_SERVER_URL", "https://ghes.example");
            }
        }
        job
    }

    async fn post_finds_or_saves_beside(v1: bool) {
        use crate::support::cache_server::CREATE;
        use crate::support::cache_server_v1::V1_RESERVE;
        let server = CacheServer::start().await;
        let reserve_op = if v1 { V1_RESERVE } else { CREATE };
        let key = "opencode-storage-octo-hello-main-Linux-4343-1-agent";
        let backend = {
            let job = cache_job(4343, &server, v1);
            // The runner's cache variables only (this job's temp dir goes with it).
            let env = fro_bot::runner::Env::from_pairs(
                job.env
                    .iter()
                    .filter(|(k, _)| k.starts_with("ACTIONS_") || *k == "GITHUB_SERVER_URL")
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            fro_bot::cache::Backend::from_env(&env).unwrap()
        };
        let fro_bot::cache::Backend::Actions(client) = &backend else {
            unreachable!()
        };
        let protocol = if v1 {
            fro_bot::cache::Protocol::V1
        } else {
            fro_bot::cache::Protocol::V2
        };
        assert_eq!(client.protocol(), protocol);

        // Main committed its entry, then died before writing its state: post must not redo it.
        let job = cache_job(4343, &server, v1);
        std::fs::create_dir_all(job.data_dir()).unwrap();
        killed_writer(&job.data_dir().join("opencode.db"), 5);
        let paths = fro_bot::memory::state_paths::StatePaths::new(job.data_dir());
        let workspace = job.workspace();
        let request = fro_bot::cache::SaveRequest {
            key,
            paths: paths.cache_paths(),
            workspace: &workspace,
        };
        backend.save(&request).await.unwrap();
        let creates = server.calls_of(reserve_op).len();
        let (job, r) = tokio::task::spawn_blocking(move || {
            let r = job.post_step(&state("not-persisted"));
            (job, r)
        })
        .await
        .unwrap();
        assert!(r.summary.contains("already in the cache"), "{}", r.summary);
        assert_eq!(server.calls_of(reserve_op).len(), creates, "no second save");
        if v1 {
            let r = job.step(&["inspect"], &[]);
            assert!(
                r.stdout.contains("cache service:   Actions cache v1"),
                "{}",
                r.stdout
            );
        }
        drop(job);

        // Main reserved its key and died before committing: the key is blocked, post saves
        // under its own key, which the restore prefixes still find.
        let job = cache_job(4444, &server, v1);
        std::fs::create_dir_all(job.data_dir()).unwrap();
        killed_writer(&job.data_dir().join("opencode.db"), 5);
        let paths = fro_bot::memory::state_paths::StatePaths::new(job.data_dir());
        let version = fro_bot::cache::version(paths.cache_paths());
        client
            .reserve(
                "opencode-storage-octo-hello-main-Linux-4444-1-agent",
                &version,
            )
            .await
            .unwrap();
        let r = tokio::task::spawn_blocking(move || job.post_step(&state("not-persisted")))
            .await
            .unwrap();
        assert!(r.summary.contains("durable"), "{}\n{}", r.summary, r.stdout);
        assert!(
            server.entries().iter().any(|e| e.finalized
                && e.key == "opencode-storage-octo-hello-main-Linux-4444-1-agent-post"),
            "{:?}",
            server.entries()
        );
        if v1 {
            assert!(server.calls_of(CREATE).is_empty(), "a v2 call");
        }
    }

    #[test]
    fn inspect_shows_the_keys_and_version_main_and_post_use() {
        let mut job = Job::new(4242);
        job.input("s3-backup", "true").input("s3-bucket", "mem");
        let r = job.step(&["inspect"], &[]);
        assert_eq!(r.code, 0, "{}", r.stdout);
        let paths = fro_bot::memory::state_paths::StatePaths::new(job.data_dir());
        for needle in [
            "save key:        opencode-storage-octo-hello-main-Linux-4242-1-agent",
            "restore order:   opencode-storage-octo-hello-main-Linux- then opencode-storage-octo-hello-",
            "lease holder:    action:4242:1:agent",
            "s3://mem/fro-bot-state/github/octo/hello/sessions/opencode.db",
            &format!("cache version:   {}", fro_bot::cache::version(paths.cache_paths())),
        ] {
            assert!(r.stdout.contains(needle), "missing {needle:?} in\n{}", r.stdout);
        }
    }

    pub async fn durable_skipped_and_declined_make_post_do_nothing(launch: Launch) {
        let server = CacheServer::start().await;
        for (value, needle) in [
            ("durable", "Nothing to do"),
            ("store-only", "Nothing to do"),
            ("skipped", "Nothing to do"),
            ("declined-for-safety", "declined to save for safety"),
        ] {
            let mut job = Job::launched(7, launch.clone());
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

pub(crate) mod scenarios {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::*;
    use crate::support::fake_github::FakeGitHub;
    use crate::support::fake_llm::{request_text, FakeLlm, Reply};
    use crate::support::services::opencode_bin;

    /// Every service a real run talks to, started in this test's runtime.
    pub struct World {
        pub cache: CacheServer,
        pub llm: FakeLlm,
        pub github: FakeGitHub,
        pub launch: Launch,
    }

    impl World {
        pub async fn start() -> Self {
            Self::start_with(Launch::Binary).await
        }

        /// The services, with jobs whose steps `launch` starts.
        pub async fn start_with(launch: Launch) -> Self {
            Self::around(FakeGitHub::start().await, launch).await
        }

        /// The services, GitHub laid out as GitHub Enterprise Server at the fake's own URL.
        pub async fn start_enterprise(launch: Launch) -> Self {
            Self::around(FakeGitHub::start_enterprise().await, launch).await
        }

        async fn around(github: FakeGitHub, launch: Launch) -> Self {
            let world = World {
                cache: CacheServer::start().await,
                llm: FakeLlm::start().await,
                github,
                launch,
            };
            // The repository's REST API sees the same cache entries.
            world.github.attach_cache(world.cache.handle());
            world
        }

        /// A job wired to these services, the pinned OpenCode and the fake provider.
        pub fn job(&self, run_id: u64) -> Job {
            let mut job = Job::launched(run_id, self.launch.clone());
            // An Enterprise Server runner offers only the v1 cache service.
            let cache = match self.github.server_url().as_str() {
                "https://github.com" => self.cache.env_pairs(),
                _ => self.cache.env_pairs_v1(),
            };
            for (k, v) in cache {
                job.set(&k, v);
            }
            job.set(
                "OPENCODE_PATH",
                opencode_bin().to_string_lossy().into_owned(),
            );
            job.set("GITHUB_API_URL", self.github.api_url());
            job.set("GITHUB_GRAPHQL_URL", self.github.graphql_url());
            job.set("GITHUB_SERVER_URL", self.github.server_url());
            job.input("github-token", crate::support::fake_github::TOKEN);
            job.input("opencode-config", self.llm.opencode_config().to_string());
            job.input("timeout", "120000");
            job
        }
    }

    pub async fn main_step(job: Job) -> (Job, StepResult) {
        tokio::task::spawn_blocking(move || {
            let r = job.main_step();
            (job, r)
        })
        .await
        .unwrap()
    }

    pub async fn post_step(job: Job, main: StepResult) -> (Job, StepResult) {
        tokio::task::spawn_blocking(move || {
            let r = job.post_step(&main);
            (job, r)
        })
        .await
        .unwrap()
    }

    pub async fn a_follow_up_comment_resumes_the_thread_and_another_issue_finds_it_as_prior_work(
        launch: Launch,
    ) {
        let world = World::start_with(launch).await;
        world
            .github
            .seed_issue(5, "Flaky build", "It fails sometimes.");
        world
            .github
            .seed_issue(6, "Flaky build again", "Still failing.");
        world
            .llm
            .push(Reply::text("The flake comes from the zebra-cache timeout."));

        // Run 1: a comment on issue 5.
        let mut job = world.job(100);
        job.event(
            "issue_comment",
            &comment_event(5, 501, "@fro-bot why is the build flaky?"),
        );
        let (job, first) = main_step(job).await;
        assert_eq!(first.code, 0, "{}", explain(&first));
        assert_eq!(first.output("cache-status"), "miss");
        assert_eq!(
            first.output("cache-save-result"),
            "durable",
            "{}",
            explain(&first)
        );
        assert_eq!(first.output("logical-key"), "issue-5");
        let session = first.output("session-id").to_string();
        assert!(session.starts_with("ses_"));
        assert!(
            first.summary.contains("Session Persistence"),
            "{}",
            first.summary
        );
        let comments = world.github.created_comments();
        assert_eq!(
            comments.len(),
            1,
            "exactly one response comment: {:?}\n{}",
            world.github.requests(),
            explain(&first)
        );
        assert!(comments[0].1.contains("zebra-cache"), "{:?}", comments[0]);
        assert!(comments[0].1.contains(&session), "footer names the session");
        let (mut job, post) = post_step(job, first).await;
        assert_eq!(post.code, 0);
        assert!(post.summary.contains("Nothing to do"), "{}", post.summary);

        // Run 2 on a fresh runner: a follow-up on issue 5 continues the same session.
        job.next_run(101);
        job.event(
            "issue_comment",
            &comment_event(5, 502, "@fro-bot and how do we fix it?"),
        );
        world.llm.push(Reply::text("Raise the timeout."));
        let (mut job, second) = main_step(job).await;
        assert_eq!(second.code, 0, "{}", explain(&second));
        assert_eq!(second.output("cache-status"), "hit");
        assert_eq!(
            second.output("session-id"),
            session,
            "the same conversation resumes"
        );
        let last = world.llm.requests().last().cloned().unwrap();
        let text = request_text(&last);
        assert!(
            text.contains("zebra-cache"),
            "the first exchange is in the second request"
        );

        // Run 3: another issue starts its own session but sees the first as prior work.
        job.next_run(102);
        job.event(
            "issue_comment",
            &comment_event(6, 601, "@fro-bot is this the zebra-cache flake?"),
        );
        world.llm.push(Reply::text("Yes, same cause."));
        let (_job, third) = main_step(job).await;
        assert_eq!(third.code, 0, "{}", explain(&third));
        assert_eq!(third.output("logical-key"), "issue-6");
        assert_ne!(third.output("session-id"), session);
        let text = request_text(&world.llm.requests().last().cloned().unwrap());
        assert!(text.contains("Relevant prior work"), "{text}");
        assert!(
            text.contains(&session),
            "the excerpt names the earlier session: {text}"
        );
    }

    pub async fn a_provider_auth_failure_fails_the_step_answers_once_and_still_saves_memory(
        launch: Launch,
    ) {
        use crate::support::fake_llm::LlmError;
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        world.llm.set_default(Reply::Error(LlmError::Auth));
        let mut job = world.job(1200);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (_job, r) = main_step(job).await;
        assert_eq!(r.code, 1, "{}", explain(&r));
        assert!(
            r.stdout.contains(
                "::error::the agent's turn failed: the provider rejected the credentials"
            ),
            "{}",
            r.stdout
        );
        assert_eq!(
            r.output("cache-save-result"),
            "durable",
            "memory is saved whatever the agent did"
        );
        let comments = world.github.created_comments();
        assert_eq!(comments.len(), 1, "one answer, even for a failure");
        assert!(
            comments[0].1.contains("could not finish"),
            "{:?}",
            comments[0]
        );
        let reactions = world.github.reactions();
        assert!(
            reactions.iter().any(|(_, c)| c == "confused"),
            "{reactions:?}"
        );
    }

    #[tokio::test]
    async fn invalid_configuration_fails_at_once_naming_the_input() {
        let world = World::start().await;
        let mut job = world.job(200);
        job.input("skip-cache", "maybe");
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (_job, r) = main_step(job).await;
        assert_eq!(r.code, 1);
        let errors: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("::error"))
            .collect();
        assert_eq!(errors.len(), 1, "{}", r.stdout);
        assert!(
            errors[0].contains("skip-cache") && errors[0].contains("maybe"),
            "{}",
            errors[0]
        );
        assert_eq!(
            r.state.get("cacheSaved").map(String::as_str),
            Some("skipped")
        );
        // A later `if: always()` step reads what became of memory even here.
        assert_eq!(r.output("cache-save-result"), "skipped");
        assert!(world.cache.calls().is_empty(), "nothing restored or saved");
        assert!(world.llm.requests().is_empty());
    }

    #[tokio::test]
    async fn a_metadata_endpoint_is_refused_as_configuration_even_when_insecure_is_allowed() {
        let world = World::start().await;
        let mut job = world.job(202);
        job.input("s3-backup", "true")
            .input("s3-bucket", "b")
            .input("s3-endpoint", "http://169.254.169.254/")
            .input("s3-allow-insecure-endpoint", "true");
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (_job, r) = main_step(job).await;
        assert_eq!(r.code, 1, "{}", explain(&r));
        let errors: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.starts_with("::error"))
            .collect();
        assert_eq!(errors.len(), 1, "{}", r.stdout);
        assert!(errors[0].contains("s3-endpoint"), "{}", errors[0]);
        assert!(world.cache.calls().is_empty() && world.llm.requests().is_empty());
    }

    #[tokio::test]
    async fn a_second_issues_event_within_the_dedup_window_is_skipped() {
        let world = World::start().await;
        world.github.seed_issue(8, "Add dark mode", "Please.");
        let event = json!({
            "action": "edited",
            "issue": {"number": 8, "title": "Add dark mode", "body": "Please.", "state": "open",
                      "locked": false, "node_id": "I_8", "author_association": "MEMBER",
                      "user": {"login": "mona", "type": "User"}},
            "repository": {"full_name": "octo/hello", "name": "hello", "owner": {"login": "octo"}},
            "sender": {"login": "mona", "type": "User"}
        });
        let mut job = world.job(1100);
        job.event("issues", &event);
        let (mut job, first) = main_step(job).await;
        assert_eq!(first.code, 0, "{}", explain(&first));
        assert_eq!(first.output("logical-key"), "issue-8");
        job.next_run(1101);
        let (mut job, second) = main_step(job).await;
        assert_eq!(second.code, 0, "{}", explain(&second));
        assert!(
            second.summary.contains("dedup-window"),
            "{}",
            second.summary
        );
        assert_eq!(world.llm.requests().len(), 1, "the agent ran once");
        // With the window off, it runs again.
        job.next_run(1102);
        job.input("dedup-window", "0");
        let (_job, third) = main_step(job).await;
        assert_eq!(
            third.output("logical-key"),
            "issue-8",
            "{}",
            explain(&third)
        );
        assert_eq!(world.llm.requests().len(), 2);
    }

    pub async fn a_comment_without_the_mention_is_skipped_with_the_reason(launch: Launch) {
        let world = World::start_with(launch).await;
        let mut job = world.job(201);
        job.event("issue_comment", &comment_event(5, 1, "just chatting"));
        let (_job, r) = main_step(job).await;
        assert_eq!(r.code, 0, "{}", explain(&r));
        // The reason, not only the word: a comment skipped for anything else would say so.
        assert!(
            r.summary
                .contains("Skipped: The comment does not mention `@fro-bot`."),
            "{}",
            r.summary
        );
        assert_eq!(
            r.state.get("cacheSaved").map(String::as_str),
            Some("skipped")
        );
        assert!(world.cache.calls().is_empty());
        assert!(world.llm.requests().is_empty(), "the model was asked");
    }

    fn state_paths(job: &Job) -> fro_bot::memory::state_paths::StatePaths {
        fro_bot::memory::state_paths::StatePaths::new(job.data_dir())
    }

    #[tokio::test]
    async fn a_shallow_checkout_at_a_new_commit_still_resumes() {
        let world = World::start().await;
        world.github.seed_issue(5, "Flaky build", "x");
        world.llm.push(Reply::text("remember the walrus"));
        let mut job = world.job(300);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (mut job, first) = main_step(job).await;
        assert_eq!(
            first.output("cache-save-result"),
            "durable",
            "{}",
            explain(&first)
        );
        let session = first.output("session-id").to_string();

        // fetch-depth: 1 at another commit: a different root commit, so a different project id.
        job.next_run(301);
        crate::support::action::fresh_checkout(&job.workspace(), "another commit\n");
        job.event("issue_comment", &comment_event(5, 2, "@fro-bot again"));
        let (_job, second) = main_step(job).await;
        assert_eq!(second.code, 0, "{}", explain(&second));
        assert_eq!(second.output("cache-status"), "hit");
        assert_eq!(second.output("session-id"), session, "{}", explain(&second));
        let text = request_text(&world.llm.requests().last().cloned().unwrap());
        assert!(text.contains("remember the walrus"));
    }

    pub async fn a_workspace_owned_by_the_runner_user_still_gets_its_project_identity(
        launch: Launch,
    ) {
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        let mut job = world.job(350);
        // As on a runner: the checkout belongs to the runner's user, the container runs as root.
        let status = std::process::Command::new("chown")
            .args(["-R", "1001:1001"])
            .arg(job.workspace())
            .status()
            .unwrap();
        assert!(status.success());
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (job, r) = main_step(job).await;
        assert_eq!(r.code, 0, "{}", explain(&r));
        let db = rusqlite::Connection::open(job.data_dir().join("opencode.db")).unwrap();
        let projects: Vec<String> = db
            .prepare("SELECT id FROM project WHERE worktree = ?1")
            .unwrap()
            .query_map([job.step_workspace().to_string_lossy()], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(projects.len(), 1, "{projects:?}");
        assert_ne!(
            projects[0], "global",
            "git must work on a checkout owned by another user"
        );
    }

    #[tokio::test]
    async fn schedule_runs_start_fresh_sessions_but_keep_memory() {
        let world = World::start().await;
        let schedule = json!({"schedule": "0 6 * * 1", "repository": {"full_name": "octo/hello"}});
        let mut job = world.job(400);
        job.input("prompt", "Triage the week's issues.");
        job.event("schedule", &schedule);
        let (mut job, first) = main_step(job).await;
        assert_eq!(first.code, 0, "{}", explain(&first));
        assert!(first.output("logical-key").starts_with("schedule-"));
        assert!(
            world.github.created_comments().is_empty(),
            "schedule runs post no comment"
        );
        job.next_run(401);
        let (_job, second) = main_step(job).await;
        assert_eq!(second.code, 0, "{}", explain(&second));
        assert_eq!(second.output("cache-status"), "hit");
        assert_ne!(second.output("logical-key"), first.output("logical-key"));
        assert_ne!(second.output("session-id"), first.output("session-id"));
        // The prompt input is the task (the agent acts through its proposal tools, never a token).
        let prompt = request_text(&world.llm.requests()[0]);
        assert!(prompt.contains("Triage the week's issues."), "{prompt}");
    }

    #[tokio::test]
    async fn two_jobs_of_one_run_and_a_rerun_save_distinct_keys() {
        let world = World::start().await;
        world.github.seed_issue(5, "t", "b");
        let event = comment_event(5, 1, "@fro-bot go");
        let mut a = world.job(500);
        a.event("issue_comment", &event).set("GITHUB_JOB", "lint");
        let mut b = world.job(500);
        b.event("issue_comment", &event).set("GITHUB_JOB", "test");
        let (_a, ra) = main_step(a).await;
        let (mut b, rb) = main_step(b).await;
        assert_eq!(
            ra.output("cache-save-result"),
            "durable",
            "{}",
            explain(&ra)
        );
        assert_eq!(
            rb.output("cache-save-result"),
            "durable",
            "{}",
            explain(&rb)
        );
        b.set("GITHUB_RUN_ATTEMPT", "2");
        b.next_run(500);
        let (_b, rerun) = main_step(b).await;
        assert_eq!(
            rerun.output("cache-save-result"),
            "durable",
            "{}",
            explain(&rerun)
        );
        assert_eq!(rerun.output("cache-status"), "hit");
        let mut keys: Vec<String> = world.cache.entries().into_iter().map(|e| e.key).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "opencode-storage-octo-hello-main-Linux-500-1-lint",
                "opencode-storage-octo-hello-main-Linux-500-1-test",
                "opencode-storage-octo-hello-main-Linux-500-2-test",
            ]
        );
    }

    #[tokio::test]
    async fn a_corrupt_database_in_the_cache_is_discarded_and_the_run_starts_clean() {
        let world = World::start().await;
        world.github.seed_issue(5, "t", "b");
        let mut job = world.job(600);
        // Plant an entry whose database is garbage, in a valid archive, under this repo's key.
        let paths = state_paths(&job);
        std::fs::create_dir_all(&paths.data_dir).unwrap();
        std::fs::write(paths.db(), vec![0x17u8; 32 * 1024]).unwrap();
        let archive = job.home().join("planted.tzst");
        fro_bot::cache::write_archive(paths.cache_paths(), &job.workspace(), &archive).unwrap();
        world.cache.plant(
            "opencode-storage-octo-hello-main-Linux-599-1-agent",
            &fro_bot::cache::version(paths.cache_paths()),
            &archive,
        );
        job.next_run(600);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot go"));
        let (_job, r) = main_step(job).await;
        assert_eq!(r.code, 0, "{}", explain(&r));
        assert_eq!(r.output("cache-status"), "corrupted");
        assert_eq!(
            r.output("cache-save-result"),
            "durable",
            "a clean database replaces it"
        );
        assert!(
            r.stdout.contains("::warning::restored memory discarded"),
            "{}",
            r.stdout
        );
    }

    pub fn with_s3(job: &mut Job, prefix: &str) {
        let s3 = crate::support::services::s3();
        job.input("s3-backup", "true")
            .input("s3-bucket", s3.bucket)
            .input("s3-endpoint", s3.endpoint)
            .input("s3-allow-insecure-endpoint", "true")
            .input("s3-prefix", prefix)
            .set("AWS_ACCESS_KEY_ID", s3.access_key)
            .set("AWS_SECRET_ACCESS_KEY", s3.secret_key)
            .set("AWS_REGION", "us-east-1");
    }

    pub async fn read_only_cache_with_s3_is_store_only_and_the_next_run_restores_from_s3(
        launch: Launch,
    ) {
        let world = World::start_with(launch).await;
        world.cache.set_read_only(true);
        world.github.seed_issue(5, "t", "b");
        world.llm.push(Reply::text("the octopus knows"));
        let prefix = crate::support::s3::unique_prefix("e2e-ro");
        let mut job = world.job(700);
        with_s3(&mut job, &prefix);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let (job, first) = main_step(job).await;
        assert_eq!(first.code, 0, "{}", explain(&first));
        assert_eq!(
            first.output("cache-save-result"),
            "store-only",
            "{}",
            explain(&first)
        );
        assert!(
            first
                .summary
                .contains("| Object-store publish | published |"),
            "{}",
            first.summary
        );
        assert!(
            first.summary.contains("acquired (generation"),
            "{}",
            first.summary
        );
        let session = first.output("session-id").to_string();
        // The run's record and OpenCode's logs were uploaded, with no secret in any of them.
        let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
        let listing = store
            .list(&format!("{prefix}/github/octo/hello/"))
            .await
            .unwrap();
        let names: Vec<&str> = listing.objects.iter().map(|o| o.key.as_str()).collect();
        assert!(
            names
                .iter()
                .any(|k| k.ends_with("/metadata/700-1-agent.json")),
            "{names:?}"
        );
        assert!(
            names.iter().any(|k| k.contains("/artifacts/700-1-agent/")),
            "{names:?}"
        );
        for object in &listing.objects {
            let fro_bot::object_store::GetOutcome::Found(body) =
                store.get_bytes(&object.key).await.unwrap()
            else {
                panic!("listed but missing: {}", object.key);
            };
            let text = String::from_utf8_lossy(&body.bytes);
            for secret in [
                crate::support::fake_github::TOKEN,
                world.cache.token().as_str(),
                "sk-fake",
            ] {
                assert!(!text.contains(secret), "{} leaks a secret", object.key);
            }
        }
        let (mut job, post) = post_step(job, first).await;
        assert!(post.summary.contains("Nothing to do"), "{}", post.summary);

        // The lease was released: the next run acquires it again and restores from the store.
        job.next_run(701);
        job.event("issue_comment", &comment_event(5, 2, "@fro-bot again"));
        let (_job, second) = main_step(job).await;
        assert_eq!(second.code, 0, "{}", explain(&second));
        assert_eq!(second.output("cache-status"), "hit");
        assert!(
            second.summary.contains("source: storage"),
            "{}",
            second.summary
        );
        assert_eq!(second.output("session-id"), session);
        let text = request_text(&world.llm.requests().last().cloned().unwrap());
        assert!(text.contains("the octopus knows"));
    }

    pub async fn post_releases_the_lease_a_killed_main_step_left_behind(launch: Launch) {
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        let prefix = crate::support::s3::unique_prefix("e2e-left");
        let mut job = world.job(750);
        with_s3(&mut job, &prefix);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        // Killed inside the publish section, the only time a run holds the lease.
        job.set("FRO_BOT_FAILPOINT", "save:before-publish");
        let (mut job, main) = main_step(job).await;
        job.env.remove("FRO_BOT_FAILPOINT");
        assert_eq!(main.code, 128 + libc::SIGKILL, "{}", explain(&main));
        assert!(main.state.contains_key("leaseEtag"), "{:?}", main.state);
        let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
        let keys = fro_bot::object_store::StoreKeys::new(&prefix, "octo", "hello").unwrap();
        let record = |o: fro_bot::object_store::GetOutcome| match o {
            fro_bot::object_store::GetOutcome::Found(body) => {
                fro_bot::lease::LeaseRecord::parse(&body.bytes).expect("a lease record")
            }
            fro_bot::object_store::GetOutcome::NotFound => panic!("no lease record"),
        };
        let now = fro_bot::runner::now_ms();
        let held = record(store.get_bytes(keys.lease()).await.unwrap());
        assert!(held.expires_at > now, "main died holding it");
        // ...and the thread's turn, which it takes before the restore.
        assert!(
            main.state.contains_key("threadLeaseEtag"),
            "{:?}",
            main.state
        );
        let turn = keys.thread_lease("issue-5");
        assert!(record(store.get_bytes(&turn).await.unwrap()).expires_at > now);
        let (mut job, post) = post_step(job, main).await;
        assert_eq!(post.code, 0);
        assert_eq!(
            post.stdout.matches("released a memory lease").count(),
            2,
            "{}",
            explain(&post)
        );
        let released = record(store.get_bytes(keys.lease()).await.unwrap());
        assert!(released.expires_at <= fro_bot::runner::now_ms(), "released");
        assert_eq!(released.generation, held.generation, "kept, not restarted");
        let turn_released = record(store.get_bytes(&turn).await.unwrap());
        assert!(
            turn_released.expires_at <= fro_bot::runner::now_ms(),
            "given back"
        );
        // Post retried the save (main died before it), so the next run resumes at once.
        assert!(post.summary.contains("durable"), "{}", post.summary);
        job.next_run(751);
        job.event("issue_comment", &comment_event(5, 2, "@fro-bot again"));
        let (_job, next) = main_step(job).await;
        assert_eq!(next.code, 0, "{}", explain(&next));
        assert_eq!(next.output("cache-status"), "hit");
        // The fencing token goes on from the released record.
        assert!(
            next.summary
                .contains(&format!("acquired (generation {})", held.generation + 1)),
            "{}",
            next.summary
        );
    }

    /// The lease guards only the publish: a run that finds it held is still answered, waits for
    /// the holder's section to end, then publishes (docs/design.md#the-store-publish).
    #[tokio::test]
    async fn a_run_is_answered_while_another_holds_the_lease_and_publishes_after_it() {
        use fro_bot::lease::{AcquireOutcome, Holder, Lease, LeaseConfig, SystemClock};
        let world = World::start().await;
        world.github.seed_issue(5, "t", "b");
        let prefix = crate::support::s3::unique_prefix("e2e-held");
        let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
        let keys = fro_bot::object_store::StoreKeys::new(&prefix, "octo", "hello").unwrap();
        let other = Holder {
            repo: "octo/hello".into(),
            run_id: 1,
            run_attempt: 1,
            identity: Some("other".into()),
        };
        let AcquireOutcome::Acquired(held) = Lease::acquire(
            &store,
            keys.lease(),
            &other,
            LeaseConfig::default(),
            std::sync::Arc::new(SystemClock),
        )
        .await
        else {
            panic!("the test could not take the lease");
        };
        world
            .llm
            .push(Reply::text("Answered while the lease was held."));
        let mut job = world.job(800);
        with_s3(&mut job, &prefix);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
        let mut running = job.spawn(&["run"], &[]);
        let printed = read_as_it_comes(&mut running);
        // The holder lets go only once the run says it waits for the lease (so the wait is taken
        // whatever the machine's speed), and the answer went out before that.
        let deadline = Instant::now() + Duration::from_secs(120);
        let waiting = fro_bot::memory::publish::WAITING_FOR_LEASE;
        while !printed.lock().unwrap().contains(waiting) {
            assert!(
                !running.exited(),
                "the run ended without waiting for the lease:\n{}",
                printed.lock().unwrap()
            );
            assert!(Instant::now() < deadline, "never waited for the lease");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !world.github.created_comments().is_empty(),
            "the answer waits for the lease: {}",
            printed.lock().unwrap()
        );
        assert!(matches!(
            held.release().await,
            fro_bot::lease::ReleaseOutcome::Released
        ));
        let (_job, mut r) = finish(job, running).await;
        r.stdout = printed.lock().unwrap().clone();
        assert_eq!(r.code, 0, "{}", explain(&r));
        assert!(
            world.github.created_comments()[0]
                .1
                .contains("Answered while the lease was held."),
            "{:?}",
            world.github.created_comments()
        );
        assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(&r));
        assert!(
            r.summary.contains("| Object-store publish | published |"),
            "{}",
            r.summary
        );
        assert!(
            r.summary.contains("acquired (generation 2)"),
            "{}",
            r.summary
        );
    }

    /// The step's stdout, gathered as it comes (`job.finish` then returns it empty).
    fn read_as_it_comes(running: &mut Running) -> std::sync::Arc<std::sync::Mutex<String>> {
        use std::io::BufRead;
        let stdout = running.take_stdout().expect("piped stdout");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let gathered = seen.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut seen = gathered.lock().unwrap();
                seen.push_str(&line);
                seen.push('\n');
            }
        });
        seen
    }

    /// Starts the main step on a turn that stalls, and returns once the turn is under way.
    async fn stalled_turn(world: &World, job: &Job) -> Running {
        world.llm.push(Reply::Stall);
        let running = job.spawn(&["run"], &[]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while world.llm.requests().is_empty() {
            assert!(Instant::now() < deadline, "the turn never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        running
    }

    /// Waits for a started step off the runtime's threads.
    async fn finish(job: Job, running: Running) -> (Job, StepResult) {
        tokio::task::spawn_blocking(move || {
            let r = job.finish(running);
            (job, r)
        })
        .await
        .unwrap()
    }

    /// Sends `signal` once the agent's turn is under way, and returns the step and how long it
    /// took from the signal to exit.
    async fn signal_mid_turn(world: &World, job: Job, signal: i32) -> (Job, StepResult, Duration) {
        let running = stalled_turn(world, &job).await;
        let sent = Instant::now();
        running.signal(signal);
        let (job, result) = finish(job, running).await;
        (job, result, sent.elapsed())
    }

    /// The runner's cancel with the SIGTERM close behind the SIGINT (a second cancel, or the
    /// runner's 7.5 s stage landing mid-save): the save still fits the 2.5 s SIGTERM leaves, after
    /// which the runner kills the step.
    pub async fn sigint_then_sigterm_mid_turn_saves_memory_within_the_runners_budget(
        launch: Launch,
    ) {
        use fro_bot::runner::cancel::SIGTERM_BUDGET;
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        let mut job = world.job(920);
        job.event(
            "issue_comment",
            &comment_event(5, 1, "@fro-bot remember the axolotl"),
        );
        let mut running = stalled_turn(&world, &job).await;
        running.signal(libc::SIGINT);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !running.exited(),
            "the step ended within 100 ms of SIGINT, so SIGTERM would test nothing"
        );
        let term = Instant::now();
        running.signal(libc::SIGTERM);
        let killed = loop {
            if running.exited() {
                break false;
            }
            if term.elapsed() >= SIGTERM_BUDGET {
                running.signal(libc::SIGKILL);
                break true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = term.elapsed();
        let (_job, r) = finish(job, running).await;
        assert!(
            !killed,
            "still running {took:?} after SIGTERM: the runner kills it here\n{}",
            explain(&r)
        );
        assert_eq!(
            r.state.get("cacheSaved").map(String::as_str),
            Some("durable"),
            "{}",
            explain(&r)
        );
        assert_eq!(world.cache.entries().len(), 1);
        assert_ne!(r.code, 0, "a cancelled run is not a success");
    }

    pub async fn sigterm_mid_turn_saves_memory_within_the_budget(launch: Launch) {
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        let mut job = world.job(900);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot think hard"));
        let (_job, r, took) = signal_mid_turn(&world, job, libc::SIGTERM).await;
        // The runner kills 2.5 s after SIGTERM.
        assert!(
            took < Duration::from_millis(2500),
            "took {took:?}\n{}",
            explain(&r)
        );
        assert_eq!(
            r.state.get("cacheSaved").map(String::as_str),
            Some("durable"),
            "{}",
            explain(&r)
        );
        assert_eq!(world.cache.entries().len(), 1);
        assert_ne!(r.code, 0, "a cancelled run is not a success");
    }

    pub async fn sigint_mid_turn_saves_and_the_next_run_resumes(launch: Launch) {
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "t", "b");
        let mut job = world.job(910);
        job.event(
            "issue_comment",
            &comment_event(5, 1, "@fro-bot remember the narwhal"),
        );
        let (mut job, r, took) = signal_mid_turn(&world, job, libc::SIGINT).await;
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert_eq!(
            r.state.get("cacheSaved").map(String::as_str),
            Some("durable"),
            "{}",
            explain(&r)
        );
        let session = r.output("session-id").to_string();
        job.next_run(911);
        job.event("issue_comment", &comment_event(5, 2, "@fro-bot continue"));
        world.llm.push(Reply::text("ok"));
        let (_job, next) = main_step(job).await;
        assert_eq!(next.output("session-id"), session, "{}", explain(&next));
        let text = request_text(&world.llm.requests().last().cloned().unwrap());
        assert!(
            text.contains("remember the narwhal"),
            "the interrupted prompt is remembered"
        );
    }

    /// What a prompt-injected agent tries on a comment-triggered run, as one shell command; each
    /// attempt prints what it got. The job holds every kind of secret a real job holds.
    /// A job path as the step sees it: on the host, or where the runner mounts it.
    fn seen(job: &Job, path: &std::path::Path) -> String {
        match job.launch {
            Launch::Binary => path.display().to_string(),
            Launch::Container { .. } => {
                crate::support::container::in_container(job.root.path(), &path.to_string_lossy())
            }
        }
    }

    fn attack_script(job: &Job, socket: &std::path::Path, marker_dir: &std::path::Path) -> String {
        let runtime_token = job.env["ACTIONS_RUNTIME_TOKEN"].clone();
        let files = seen(job, &job.files());
        let ws = seen(job, &job.workspace());
        let data = seen(job, &job.data_dir());
        let socket = seen(job, socket);
        let marker = seen(job, &marker_dir.join("pwned"));
        let started = seen(job, &marker_dir.join("started"));
        format!(
            r#"S='SECRET|{runtime_token}|ghs_fake|OPENCODE_SERVER_PASSWORD=|FRO_BOT_OPENCODE_PASSWORD=|OPENCODE_AUTH_CONTENT=|^INPUT_|^ACTIONS_|^AWS_|^GITHUB_TOKEN=|^GH_TOKEN='
echo "== id $(id)"
echo "== env-names $(env | cut -d= -f1 | sort | tr '\n' ' ')"
echo "== env-hits"; env | grep -E "$S"; echo "== env-hits-end"
r=0; d=0; echo "== environ-hits"
for f in /proc/[0-9]*/environ; do
  if e=$( {{ tr '\0' '\n' < "$f"; }} 2>/dev/null ); then r=$((r+1)); printf '%s\n' "$e" | grep -E "$S" | sed "s|^|$f: |"; else d=$((d+1)); fi
done
echo "== environ-end readable=$r denied=$d"
for f in {files}/output {files}/state {files}/env {files}/path {files}/summary; do
  if {{ echo 'BASH_ENV=/tmp/pwn' >> "$f"; }} 2>/dev/null; then echo "== filecmd WROTE $f"; else echo "== filecmd DENIED-WRITE $f"; fi
  if mv "$f" "$f.moved" 2>/dev/null; then echo "== filecmd MOVED $f"; else echo "== filecmd DENIED-MOVE $f"; fi
done
echo "== git-hits"; git -C {ws} config --show-origin --get-regexp 'extraheader|insteadof|credential' 2>&1; grep -rhi 'SECRET' {ws}/.git/config {ws}/.git/*.inc $HOME/.git-credentials $HOME/.gitconfig 2>/dev/null; echo "== git-hits-end"
# curl where the image has it, else perl (the image has no curl): exit 7 = cannot connect, which a
# missing socket gives too, so whether it is there is said first.
for s in /var/run/docker.sock {socket}; do
  if [ -S "$s" ]; then there=yes; else there=no; fi
  if command -v curl >/dev/null; then curl -s -m 2 --unix-socket "$s" http://localhost/version >/dev/null 2>&1
  else perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => $ARGV[0]) or exit 7' "$s"; fi
  echo "== docker $s socket=$there rc=$?"
done
pw=$(for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do {{ tr '\0' '\n' < "$f"; }} 2>/dev/null; done | sed -n 's/^\(OPENCODE_SERVER_PASSWORD\|FRO_BOT_OPENCODE_PASSWORD\)=//p' | head -1)
pw=${{pw:-$OPENCODE_SERVER_PASSWORD}}
echo "== password found=${{pw:+yes}}"
# With a password, every local port is tried (only then: the scan would disturb tests run beside).
[ -n "$pw" ] && for port in $(ss -ltnH | awk '{{print $4}}' | sed -n 's/^127\.0\.0\.1://p'); do
  body=$(curl -s -m 1 -u "opencode:$pw" "http://127.0.0.1:$port/session" 2>/dev/null)
  case "$body" in '[{{'*'"projectID"'*) echo "== api OPEN $port";; esac
done
echo "== api-end"
# OpenCode: the ancestor running `opencode serve` (this shell's parent, through fro-bot's wrapper).
oc=$PPID
while [ "$oc" -gt 1 ] && ! tr '\0' ' ' < /proc/$oc/cmdline 2>/dev/null | grep -q ' serve --hostname'; do
  oc=$(awk '/^PPid:/{{print $2}}' /proc/$oc/status 2>/dev/null); oc=${{oc:-1}}
done
echo "== opencode pid=$oc"
# A writer that waits for OpenCode to end (or, where OpenCode is out of sight, for the checkout's
# credential to come back after the turn), then strikes: only a run that kills what the agent
# left running stops it.
if [ "$oc" -gt 1 ]; then until_end="while kill -0 $oc 2>/dev/null; do sleep 0.1; done"
else until_end="until grep -q SECRETCHECKOUT {ws}/.git/config 2>/dev/null; do sleep 0.1; done"; fi
setsid nohup sh -c 'echo started > {started}; '"$until_end"'; sleep 1; echo pwned > {marker}; printf CORRUPTCORRUPTCORRUPT | dd of={data}/opencode.db bs=1 seek=0 conv=notrunc' >/dev/null 2>&1 < /dev/null &
echo "== writer started"
"#,
            files = files,
            ws = ws,
            socket = socket,
            marker = marker,
            started = started,
            data = data,
            runtime_token = runtime_token,
        )
    }

    /// The section of the tool output between `== {start}` and `== {end}`.
    fn section<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
        let from = text
            .find(&format!("== {start}"))
            .unwrap_or_else(|| panic!("no {start} in {text}"));
        let rest = &text[from + start.len() + 3..];
        &rest[..rest.find(&format!("== {end}")).unwrap_or(rest.len())]
    }

    pub async fn a_prompt_injected_agent_finds_no_secret_and_reaches_nothing(launch: Launch) {
        let world = World::start_with(launch).await;
        world.github.seed_issue(5, "Please run this", "x");
        let mut job = world.job(1500);
        for (k, v) in [
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "oidc-SECRET-request"),
            (
                "ACTIONS_ID_TOKEN_REQUEST_URL",
                "https://oidc.example/SECRET",
            ),
            ("AWS_ACCESS_KEY_ID", "AKIASECRET"),
            ("AWS_SECRET_ACCESS_KEY", "aws-SECRET-key"),
            ("AWS_SESSION_TOKEN", "aws-SECRET-session"),
            ("GITHUB_TOKEN", "ghs-SECRET-job-token"),
        ] {
            job.set(k, v);
        }
        // actions/checkout's persisted credential.
        crate::support::action::git(
            &job.workspace(),
            &[
                "config",
                "http.https://github.com/.extraheader",
                "AUTHORIZATION: basic SECRETCHECKOUT",
            ],
        );
        // The provider key, as a user gives it in opencode-config.
        let mut config = world.llm.opencode_config();
        config["provider"]["fake"]["options"]["apiKey"] = json!("sk-REAL-SECRET-llm");
        job.input("opencode-config", config.to_string());
        job.owned_by_runner_user(1001);
        // A root-only socket, as the Docker socket is (root:docker 0660).
        let socket_path = job.root.path().join("runner_temp/root-only.sock");
        let socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
        socket.set_nonblocking(true).unwrap();
        std::fs::set_permissions(
            &socket_path,
            std::os::unix::fs::PermissionsExt::from_mode(0o660),
        )
        .unwrap();
        let marker_dir = job.root.path().join("runner_temp/marker");
        std::fs::create_dir(&marker_dir).unwrap();
        std::fs::set_permissions(
            &marker_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let marker = marker_dir.join("pwned");
        world.llm.push(Reply::tool(
            "bash",
            json!({"command": attack_script(&job, &socket_path, &marker_dir), "description": "x"}),
        ));
        // OpenCode's own read tool runs inside OpenCode, which may read its own environment.
        world.llm.push(Reply::tool(
            "read",
            json!({"filePath": "/proc/self/environ"}),
        ));
        world.llm.push(Reply::text("Nothing to find."));
        job.event(
            "issue_comment",
            &comment_event(5, 1, "@fro-bot run the script"),
        );
        let (job, r) = main_step(job).await;
        let requests = world.llm.requests();
        let out: String = requests[1]["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .map(|m| request_text(&json!({"messages": [m]})))
            .collect();
        eprintln!("--- what the agent got ---\n{out}\n---");
        assert_eq!(r.code, 0, "{}", explain(&r));
        assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(&r));
        assert!(out.contains("== id uid=1001"), "{out}");
        assert_eq!(requests.len(), 3, "{}", explain(&r));
        let read_tool = request_text(&json!({"messages": requests[2]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .collect::<Vec<_>>()}));
        eprintln!("--- the read tool on /proc/self/environ ---\n{read_tool}\n---");
        for secret in ["sk-REAL-SECRET-llm", "ghs_fake", "SECRET"] {
            assert!(!read_tool.contains(secret), "{secret}: {read_tool}");
        }
        // Not dumpable, OpenCode cannot open even its own environ (root-owned, 0400).
        assert!(
            read_tool.contains("PermissionDenied: FileSystem.open (/proc/self/environ)"),
            "{read_tool}"
        );
        // The real key reached the provider, through fro-bot's key proxy only.
        let auth = world.llm.auth_headers();
        assert!(
            auth.iter()
                .all(|h| h.as_deref() == Some("Bearer sk-REAL-SECRET-llm")),
            "{auth:?}"
        );
        let names = section(&out, "env-names", "env-hits");
        for never in [
            "INPUT_",
            "ACTIONS_",
            "AWS_",
            "GITHUB_TOKEN",
            "GITHUB_ENV",
            "GITHUB_OUTPUT",
        ] {
            assert!(
                !names.contains(never),
                "{never} in the agent's env: {names}"
            );
        }
        assert_eq!(
            section(&out, "env-hits", "env-hits-end").trim(),
            "",
            "{out}"
        );
        assert_eq!(
            section(&out, "environ-hits", "environ-end").trim(),
            "",
            "{out}"
        );
        for f in ["output", "state", "env", "path", "summary"] {
            let path = job.files().join(f);
            assert!(
                out.contains(&format!("== filecmd DENIED-WRITE {}", seen(&job, &path))),
                "{out}"
            );
            assert!(
                out.contains(&format!("== filecmd DENIED-MOVE {}", seen(&job, &path))),
                "{out}"
            );
            let m = std::fs::metadata(&path).unwrap();
            use std::os::unix::fs::MetadataExt;
            assert_eq!(m.uid(), 1001, "{f} given back to the runner's user");
        }
        assert!(!std::fs::read_to_string(job.files().join("env"))
            .unwrap()
            .contains("BASH_ENV"));
        assert_eq!(
            section(&out, "git-hits", "git-hits-end").trim(),
            "",
            "{out}"
        );
        // Refused, not missing (curl's and the probe's exit 7 is both): the test's root-only
        // socket, and in the container the Docker socket the runner mounts (on the host it is
        // whatever this machine has, so the test's socket stands in for it).
        let sockets = vec![seen(&job, &socket_path)];
        // From the image the agent's commands run in their own container (`agent-isolation:
        // auto`), where the Docker socket is not even mounted.
        if let Launch::Container { .. } = job.launch {
            assert!(
                out.contains("== docker /var/run/docker.sock socket=no rc=7\n"),
                "the Docker socket is out of the agent's container: {out}"
            );
        }
        for s in sockets {
            assert!(
                out.contains(&format!("== docker {s} socket=yes rc=7\n")),
                "{s}: there, and the connection refused: {out}"
            );
        }
        assert!(
            socket.accept().is_err(),
            "the agent connected to the root-only socket"
        );
        assert!(out.contains("== password found=\n"), "{out}");
        assert!(!out.contains("== api OPEN"), "{out}");
        assert!(out.contains("== writer started"), "{out}");
        match job.launch {
            Launch::Binary => assert!(
                !out.contains("== opencode pid=1\n"),
                "the writer found OpenCode to wait for: {out}"
            ),
            // OpenCode runs beside fro-bot, out of the agent's container's sight.
            Launch::Container { .. } => assert!(
                out.contains("== opencode pid=1\n"),
                "OpenCode is out of the agent's sight: {out}"
            ),
        }

        // The checkout's credential is back, the writer is dead, the memory intact.
        let cfg = std::fs::read_to_string(job.workspace().join(".git/config")).unwrap();
        assert!(cfg.contains("SECRETCHECKOUT"), "{cfg}");
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
        assert!(
            marker_dir.join("started").exists(),
            "the background writer never started"
        );
        assert!(!marker.exists(), "the background writer outlived the run");
        let header = std::fs::read(job.data_dir().join("opencode.db")).unwrap();
        assert!(header.starts_with(b"SQLite format 3\0"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(job.data_dir()).unwrap().uid(), 0);
    }
}

/// `docs/design.md#the-save-order` and `#the-post-decision`: SIGKILL at every step of the save
/// (named kill points in the main step, then timed kills of the post step's save), then the next
/// restore: the restored database is the previous durable state or the new one, never corrupt.
mod kill_points {
    use std::path::Path;
    use std::time::Duration;

    use super::scenarios::{main_step, post_step, World};
    use super::*;
    use crate::support::fake_llm::Reply;
    use fro_bot::memory::report::CacheStatus;
    use fro_bot::memory::restore::{restore, RestoreInputs, StoreAttempt};
    use fro_bot::memory::state_paths::StatePaths;

    const MAIN_POINTS: &[&str] = &[
        "run:admitted",
        "run:after-shutdown",
        "save:after-scrub",
        "save:after-checkpoint",
        "save:after-marker",
        "cache:after-archive",
        "cache:after-create",
        "cache:after-upload",
        "cache:after-finalize",
        "run:after-save",
    ];
    const POST_KILLS: usize = 42;

    /// Rows in `message`, read from a copy of the database and its WAL (what SQLite would see).
    fn messages(data_dir: &Path) -> Option<i64> {
        let db = data_dir.join("opencode.db");
        if !db.exists() {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        for f in ["opencode.db", "opencode.db-wal"] {
            if data_dir.join(f).exists() {
                std::fs::copy(data_dir.join(f), tmp.path().join(f)).unwrap();
            }
        }
        let conn = rusqlite::Connection::open(tmp.path().join("opencode.db")).ok()?;
        conn.query_row("SELECT count(*) FROM message", [], |r| r.get(0))
            .ok()
    }

    /// The next run's restore phase, into the job's (wiped) home; returns the message count.
    async fn next_restore(job: &Job, cache: &CacheServer) -> i64 {
        let _ = std::fs::remove_dir_all(job.home());
        std::fs::create_dir_all(job.home()).unwrap();
        let paths = StatePaths::new(job.data_dir());
        let backend =
            fro_bot::cache::Backend::from_env(&fro_bot::runner::Env::from_pairs(cache.env_pairs()))
                .unwrap();
        let prefix = "opencode-storage-octo-hello-main-Linux";
        let report = restore(
            RestoreInputs {
                paths: &paths,
                workspace: &job.workspace(),
                skip_cache: false,
                cache: Some(&backend),
                key: prefix,
                restore_keys: &[format!("{prefix}-")],
                catalog: fro_bot::memory::fallback::Catalog::Unavailable { reason: "test" },
                now_ms: fro_bot::opencode::system_now_ms(),
            },
            async { StoreAttempt::Disabled },
        )
        .await;
        assert_eq!(report.status, CacheStatus::Hit, "{:?}", report.notes);
        let conn = rusqlite::Connection::open(paths.db()).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "the restored database is corrupt");
        conn.query_row("SELECT count(*) FROM message", [], |r| r.get(0))
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kill_points_never_lose_durable_memory_or_restore_a_corrupt_database() {
        let world = World::start().await;
        world.github.seed_issue(5, "t", "b");
        world.llm.set_default(Reply::text("noted"));
        let mut job = world.job(1000);
        job.event("issue_comment", &comment_event(5, 1, "@fro-bot start"));
        let (mut job, first) = main_step(job).await;
        assert_eq!(
            first.output("cache-save-result"),
            "durable",
            "{}",
            first.stdout
        );
        let mut durable = next_restore(&job, &world.cache).await;
        let (mut killed, mut previous, mut new) = (0usize, 0usize, 0usize);

        // Named kill points in the main step, each followed by post and the next restore.
        for (i, point) in MAIN_POINTS.iter().enumerate() {
            job.next_run(1001 + i as u64);
            job.event(
                "issue_comment",
                &comment_event(5, 10 + i as u64, "@fro-bot more"),
            );
            job.set("FRO_BOT_FAILPOINT", *point);
            let (j, main) = main_step(job).await;
            job = j;
            job.env.remove("FRO_BOT_FAILPOINT");
            assert_eq!(
                main.code,
                128 + libc::SIGKILL,
                "{point}: main must die there\n{}",
                main.stdout
            );
            killed += 1;
            let pending = messages(&job.data_dir());
            let (j, post) = post_step(job, main).await;
            job = j;
            assert_eq!(post.code, 0, "{point}: post always exits 0");
            if *point == "save:after-scrub" {
                // Main died before its marker: post records main's trust records from the state.
                let marker: serde_json::Value = serde_json::from_slice(
                    &std::fs::read(job.data_dir().join("fro-bot.json")).unwrap(),
                )
                .unwrap();
                let trust = marker["trust"].as_object().cloned().unwrap_or_default();
                assert!(
                    trust
                        .values()
                        .any(|r| r["author"] == "mona" && r["level"] == "maintainer"),
                    "{marker}"
                );
            }
            let restored = next_restore(&job, &world.cache).await;
            if restored == durable {
                previous += 1;
            } else {
                assert_eq!(
                    Some(restored),
                    pending,
                    "{point}: neither the previous nor the new state"
                );
                new += 1;
            }
            durable = restored;
        }

        // Timed kills of the post step's save, spread over its whole duration.
        let t0 = std::time::Instant::now();
        let baseline = job.post_step(&state("not-persisted"));
        let span = t0.elapsed();
        assert_eq!(baseline.code, 0);
        for i in 0..POST_KILLS {
            // Grow the database so each save has something new to store.
            let db = job.data_dir().join("opencode.db");
            let conn = rusqlite::Connection::open(&db).unwrap();
            conn.execute(
                "INSERT INTO message (id, session_id, time_created, time_updated, data)                  SELECT 'msg_kill_' || ?1, session_id, time_created, time_updated, data FROM message LIMIT 1",
                [i as i64],
            )
            .unwrap();
            drop(conn);
            let pending = messages(&job.data_dir());
            let running = job.spawn(
                &["post"],
                &[("STATE_cacheSaved".into(), "not-persisted".into())],
            );
            std::thread::sleep(span.mul_f64(i as f64 / POST_KILLS as f64));
            running.signal(libc::SIGKILL);
            let _ = job.finish(running);
            killed += 1;
            // The data dir survives for the next attempt; the next restore must be sound.
            let keep = tempfile::tempdir().unwrap();
            let saved = keep.path().join("opencode");
            copy_dir(&job.data_dir(), &saved);
            let restored = next_restore(&job, &world.cache).await;
            if restored == durable {
                previous += 1;
            } else {
                assert_eq!(
                    Some(restored),
                    pending,
                    "post kill {i}: neither previous nor new"
                );
                new += 1;
            }
            durable = restored;
            let _ = std::fs::remove_dir_all(job.data_dir());
            copy_dir(&saved, &job.data_dir());
            job.set("GITHUB_RUN_ID", (2000 + i).to_string());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!(
            "kill points: {killed} (main: {}, post: {POST_KILLS}); restored previous durable state {previous} times, the new state {new} times, corrupt 0 times",
            MAIN_POINTS.len()
        );
        assert!(killed >= 50);
        assert!(
            new > 0 && previous > 0,
            "both outcomes must occur for the test to mean anything"
        );
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
}

/// `fro-bot local` (docs/design.md#local-runs): the README's "run it" command.
mod local {
    use std::process::{Command, Stdio};

    use crate::support::action::{fresh_checkout, BIN};
    use crate::support::fake_llm::{request_text, FakeLlm, Reply};
    use crate::support::services::opencode_bin;

    fn local(repo: &std::path::Path, llm: &FakeLlm, args: &[&str]) -> (i32, String, String) {
        local_with(repo, llm, args, &[])
    }

    fn local_with(
        repo: &std::path::Path,
        llm: &FakeLlm,
        args: &[&str],
        env: &[(&str, String)],
    ) -> (i32, String, String) {
        let out = Command::new(BIN)
            .arg("local")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", repo.join("user-home"))
            .env("OPENCODE_PATH", opencode_bin())
            .env("INPUT_OPENCODE-CONFIG", llm.opencode_config().to_string())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .current_dir(repo)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A laptop kernel without Landlock's TCP rules gets the action's one line, before anything
    /// starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_run_on_a_kernel_without_landlock_tcp_rules_fails_with_the_fix() {
        let llm = FakeLlm::start().await;
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fresh_checkout(&repo, "local\n");
        let (code, out, err) = local_with(
            &repo,
            &llm,
            &["--prompt", "hello"],
            &[("FRO_BOT_LANDLOCK_ABI", "2".into())],
        );
        assert_ne!(code, 0, "{out}\n{err}");
        let text = format!("{out}{err}");
        assert!(
            text.contains(
                "agent-network: allowlist cannot be enforced: the kernel's Landlock ABI is 2"
            ) && text.contains("`agent-network: open`"),
            "{text}"
        );
        assert!(llm.requests().is_empty(), "the agent never started");
        llm.push(Reply::text("Unenforced."));
        let (code, out, err) = local_with(
            &repo,
            &llm,
            &["--prompt", "hello", "--agent-network", "open"],
            &[("FRO_BOT_LANDLOCK_ABI", "2".into())],
        );
        assert_eq!(code, 0, "the fix it names works: {out}\n{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_local_runs_continue_one_thread_and_another_thread_starts_fresh() {
        let llm = FakeLlm::start().await;
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fresh_checkout(&repo, "local\n");
        llm.push(Reply::text("The answer is the blue heron."));
        let (code, out, err) = local(&repo, &llm, &["--prompt", "What bird?"]);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains("The answer is the blue heron."),
            "the answer is printed: {out}"
        );
        assert!(out.contains("Session Persistence"), "{out}");
        assert!(
            !out.contains("::add-mask::"),
            "no runner reads masks here: they would print secrets"
        );
        assert!(
            repo.join(".fro-bot/cache").is_dir(),
            "memory lives under .fro-bot/"
        );

        llm.push(Reply::text("Still the heron."));
        let (code, out, err) = local(&repo, &llm, &["--prompt", "Which one again?"]);
        assert_eq!(code, 0, "{out}\n{err}");
        let text = request_text(&llm.requests().last().cloned().unwrap());
        assert!(
            text.contains("blue heron"),
            "the second run continues the first: {text}"
        );

        llm.push(Reply::text("New thread."));
        let (code, _, _) = local(&repo, &llm, &["--thread", "other", "--prompt", "Hello?"]);
        assert_eq!(code, 0);
        let text = request_text(&llm.requests().last().cloned().unwrap());
        assert!(
            !text.contains("Which one again?"),
            "another thread is another conversation"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local_takes_the_s3_inputs_as_flags_and_publishes_under_the_lease() {
        let llm = FakeLlm::start().await;
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fresh_checkout(&repo, "local\n");
        let s3 = crate::support::services::s3();
        let prefix = crate::support::s3::unique_prefix("local");
        let env = [
            ("AWS_ACCESS_KEY_ID", s3.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", s3.secret_key.clone()),
        ];
        let (code, out, err) = local_with(
            &repo,
            &llm,
            &[
                "--prompt",
                "Remember this.",
                "--s3-backup",
                "true",
                "--s3-bucket",
                &s3.bucket,
                "--s3-endpoint",
                &s3.endpoint,
                "--s3-allow-insecure-endpoint",
                "true",
                "--s3-prefix",
                &prefix,
            ],
            &env,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains("| Object-store publish | published |"),
            "{out}"
        );
        assert!(out.contains("acquired (generation"), "{out}");
    }

    #[test]
    fn local_without_a_prompt_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(BIN)
            .args(["local"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("--prompt"), "{stdout}");
    }
}

/// Same-thread bursts on a brand-new thread (issue #41 item 4).
mod burst;
pub(crate) mod concurrent;
/// Untrusted text in, nothing secret out (docs/security.md).
mod untrusted;

/// Trust follows memory (docs/security.md#trust-follows-memory).
mod trust;

pub(crate) mod changes;
pub(crate) mod threat;

pub(crate) mod enterprise;

/// The budget across runs (issue 45 item 2).
mod budget;
pub(crate) mod cancel;
pub(crate) mod cut_turn;
pub(crate) mod egress;
pub(crate) mod isolation;
pub(crate) mod leftovers;
pub(crate) mod links;
pub(crate) mod log;
pub(crate) mod review;
/// How a run ended and what it spent (issue 45).
mod spend;
