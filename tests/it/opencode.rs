//! The real pinned OpenCode, offline, against the scripted fake LLM: each test in its own temp
//! HOME/XDG dirs and a temp git workspace (`git init` + one commit).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fro_bot::opencode::prep::{self, PromptInput};
use fro_bot::opencode::writeback::{RunSummary, SUMMARY_HEADER};
use fro_bot::opencode::{
    Agent, AgentOptions, Isolation, Quiescence, Resolution, TurnFailure, TurnOptions, TurnOutcome,
};
use fro_bot::runner::{Cancellation, Env};
use fro_bot::tools::{self as session_tools, ToolsConfig};

use crate::support::fake_llm::{request_text, FakeLlm, LlmError, Reply};
use crate::support::services::opencode_bin;

struct Harness {
    _tmp: tempfile::TempDir,
    workspace: PathBuf,
    dirs: Isolation,
    log: PathBuf,
    llm: FakeLlm,
}

impl Harness {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = tmp.path().join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        git(&workspace, &["init", "-q", "-b", "main"]);
        std::fs::write(workspace.join("README.md"), "# test repo\n").unwrap();
        git(&workspace, &["add", "README.md"]);
        git(&workspace, &["commit", "-q", "-m", "initial"]);
        let dirs = Isolation::under(&tmp.path().join("home"));
        let log = tmp.path().join("opencode.log");
        let llm = FakeLlm::start().await;
        Self {
            _tmp: tmp,
            workspace,
            dirs,
            log,
            llm,
        }
    }

    fn options(&self) -> AgentOptions {
        AgentOptions {
            opencode: opencode_bin(),
            opencode_version: fro_bot::config::DEFAULT_OPENCODE_VERSION.into(),
            workspace: self.workspace.clone(),
            dirs: self.dirs.clone(),
            base_env: Env::from_process(),
            opt_in_env: vec![],
            // As the current user: these tests drive OpenCode itself (e2e covers the uid switch).
            user: fro_bot::confine::AgentUser::Current {
                // SAFETY: geteuid cannot fail.
                uid: unsafe { libc::geteuid() },
            },
            state: None,
            file_commands: vec![],
            hide_git_credentials: false,
            extra_env: vec![],
            fro_bot_exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_fro-bot"))),
            session_trust: None,
            proposals: None,
            runner_home: None,
            model: None,
            user_config: Some(serde_json::from_value(self.llm.opencode_config()).expect("object")),
            auth: serde_json::Map::new(),
            log_file: self.log.clone(),
            startup_deadline: Duration::from_secs(60),
            now_ms: fro_bot::opencode::system_now_ms,
            cancel: fro_bot::runner::Cancellation::new(),
            network: fro_bot::egress::AgentReach::open(),
            spend: None,
        }
    }

    async fn start(&self) -> Agent {
        Agent::start(self.options()).await.unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("start failed: {e:?}\n{log}")
        })
    }

    fn db(&self) -> PathBuf {
        self.dirs.data_dir().join("opencode.db")
    }
}

fn git(dir: &Path, args: &[&str]) {
    let st = std::process::Command::new("git")
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(st.success(), "git {args:?}");
}

fn opts(timeout: Option<Duration>) -> TurnOptions {
    TurnOptions {
        timeout: timeout.or(Some(Duration::from_secs(90))),
        ..Default::default()
    }
}

#[tokio::test]
async fn start_ready_stop_leaves_the_wal_behind() {
    let h = Harness::new().await;
    let t0 = Instant::now();
    let mut agent = h.start().await;
    let started = t0.elapsed();
    assert!(agent.client().healthy().await);
    let password = agent.server().password().to_string();
    let port = agent.server().port();
    let s = agent.resolve_session("issue-1").await.unwrap();
    assert_eq!(s.resolution, Resolution::Created);
    assert_eq!(s.session.title, "fro-bot: issue-1");

    // Without the password every route is refused.
    let anon = reqwest::get(format!("{}/session", agent.server().url()))
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);

    let q = agent.shutdown(Duration::from_secs(5)).await;
    assert_eq!(q, Quiescence::Confirmed);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    // OpenCode does not checkpoint on exit: the session is in the WAL.
    let wal = std::fs::metadata(h.db().with_file_name("opencode.db-wal")).unwrap();
    assert!(wal.len() > 0, "WAL is empty");
    // The pre-seeded config dir kept OpenCode from npm-installing its plugin.
    let nm = h.dirs.config_home.join("opencode/node_modules");
    assert_eq!(
        std::fs::read_dir(&nm).unwrap().count(),
        0,
        "plugin installed"
    );
    let log = std::fs::read_to_string(&h.log).unwrap();
    assert!(log.contains("opencode server listening"));
    assert!(!log.contains(&password), "password in the server log");
    eprintln!("spawn -> ready: {started:?}");
}

#[tokio::test]
async fn a_turn_runs_a_tool_and_returns_the_final_message() {
    let h = Harness::new().await;
    h.llm.push(Reply::tool(
        "bash",
        json!({"command": "echo made-by-agent > agent.txt", "description": "Write a file"}),
    ));
    h.llm.push(Reply::text("All done: wrote agent.txt"));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-2").await.unwrap();
    let report = agent
        .run_turn(
            s.session.clone(),
            "Create agent.txt",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let reply = report.reply.clone().unwrap();
    assert_eq!(reply.text, "All done: wrote agent.txt");
    assert!(report.tokens.input > 0 && report.tokens.output > 0);
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("agent.txt")).unwrap(),
        "made-by-agent\n"
    );
    let reqs = h.llm.requests();
    assert_eq!(reqs.len(), 2);
    let roles: Vec<&str> = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(roles.ends_with(&["assistant", "tool"]), "{roles:?}");
    assert_eq!(
        h.llm.title_requests(),
        0,
        "sessions are created with a title"
    );
    assert!(!agent.is_busy(Some(&s.session.id)).await.unwrap());
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_session_resumes_by_title_across_a_restart() {
    let h = Harness::new().await;
    h.llm.push(Reply::text("First answer: ALPHA-7731"));
    let mut agent = h.start().await;
    let first = agent.resolve_session("pr-5").await.unwrap();
    let r = agent
        .run_turn(
            first.session.clone(),
            "Remember the code word",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed);
    assert_eq!(
        agent.shutdown(Duration::from_secs(5)).await,
        Quiescence::Confirmed
    );

    let mut agent = h.start().await;
    let again = agent.resolve_session("pr-5").await.unwrap();
    assert_eq!(again.resolution, Resolution::Resumed);
    assert_eq!(again.session.id, first.session.id);
    // A different key is a different session.
    let other = agent.resolve_session("pr-6").await.unwrap();
    assert_eq!(other.resolution, Resolution::Created);
    assert_ne!(other.session.id, first.session.id);

    h.llm.push(Reply::text("Second answer"));
    let r = agent
        .run_turn(
            again.session,
            "What was the code word?",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed);
    let reqs = h.llm.requests();
    let second = request_text(reqs.last().unwrap());
    assert!(second.contains("Remember the code word"), "{second}");
    assert!(second.contains("First answer: ALPHA-7731"), "{second}");
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn archived_sessions_are_never_resumed() {
    let h = Harness::new().await;
    let mut agent = h.start().await;
    let first = agent.resolve_session("issue-9").await.unwrap();
    agent
        .client()
        .archive_session(&first.session.id, fro_bot::opencode::system_now_ms())
        .await
        .unwrap();
    let next = agent.resolve_session("issue-9").await.unwrap();
    assert_eq!(next.resolution, Resolution::Created);
    assert_ne!(next.session.id, first.session.id);
    // And the new one is what a later run resumes.
    let later = agent.resolve_session("issue-9").await.unwrap();
    assert_eq!(later.resolution, Resolution::Resumed);
    assert_eq!(later.session.id, next.session.id);
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_timeout_aborts_the_turn() {
    let h = Harness::new().await;
    h.llm.push(Reply::Stall);
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-3").await.unwrap();
    let t0 = Instant::now();
    let r = agent
        .run_turn(
            s.session.clone(),
            "Take forever",
            &opts(Some(Duration::from_secs(3))),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::TimedOut, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert!(!agent.is_busy(Some(&s.session.id)).await.unwrap());
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn cancellation_aborts_the_turn() {
    let h = Harness::new().await;
    h.llm.push(Reply::Stall);
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-4").await.unwrap();
    let cancel = Cancellation::new();
    let c2 = cancel.clone();
    let llm = h.llm.clone();
    // Cancel once the agent is waiting on the model (as a signal mid-run would).
    tokio::spawn(async move {
        for _ in 0..600 {
            if !llm.requests().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c2.cancel_with(
            fro_bot::runner::cancel::Signal::Interrupt,
            std::time::Instant::now(),
        );
    });
    let r = agent
        .run_turn(s.session.clone(), "Take forever", &opts(None), &cancel)
        .await;
    assert_eq!(r.outcome, TurnOutcome::Cancelled, "{r:?}");
    assert!(!agent.is_busy(None).await.unwrap());
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_rate_limit_is_retried_with_a_continuation_prompt() {
    let h = Harness::new().await;
    // OpenCode retries a 429 five times itself (honouring retry-after-ms), then reports it.
    h.llm.push_n(6, Reply::Error(LlmError::RateLimit));
    h.llm.push(Reply::text("Recovered and finished"));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-5").await.unwrap();
    let r = agent
        .run_turn(s.session, "Do the thing", &opts(None), &Cancellation::new())
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    assert_eq!(r.attempts, 2);
    assert_eq!(r.reply.unwrap().text, "Recovered and finished");
    assert!(r.errors[0].contains("Rate limit reached"), "{:?}", r.errors);
    let last = request_text(h.llm.requests().last().unwrap());
    assert!(last.contains("previous attempt"), "{last}");
    assert!(last.contains("Rate limit reached"), "{last}");
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn provider_errors_give_up_after_three_attempts() {
    let h = Harness::new().await;
    h.llm.set_default(Reply::Error(LlmError::RateLimit));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-6").await.unwrap();
    let r = agent
        .run_turn(s.session, "Do the thing", &opts(None), &Cancellation::new())
        .await;
    assert!(
        matches!(&r.outcome, TurnOutcome::Failed(TurnFailure::Provider { message }) if message.contains("Rate limit")),
        "{r:?}"
    );
    assert_eq!(r.attempts, 3);
    assert_eq!(
        h.llm.requests().len(),
        18,
        "3 attempts x (1 + 5 OpenCode retries)"
    );
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn quota_exhaustion_is_terminal_at_once() {
    let h = Harness::new().await;
    h.llm.set_default(Reply::Error(LlmError::Quota));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-7").await.unwrap();
    let t0 = Instant::now();
    let r = agent
        .run_turn(
            s.session.clone(),
            "Do the thing",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert!(
        matches!(&r.outcome, TurnOutcome::Failed(TurnFailure::Quota { message }) if message.contains("quota")),
        "{r:?}"
    );
    assert_eq!(r.attempts, 1);
    // Not OpenCode's minute of backoff: the first retry status ends it. (Half that minute as the
    // bound: on a loaded 2-core machine the turn's own start-up alone has taken over 10 s.)
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(h.llm.requests().len() <= 2);
    assert!(!agent.is_busy(Some(&s.session.id)).await.unwrap());
    agent.shutdown(Duration::from_secs(5)).await;
}

/// A provider address nothing listens on: OpenCode retries with backoff for over a minute per
/// attempt, and fro-bot made three attempts (about 215 s). Its third retry ends the turn, naming
/// what to check.
#[tokio::test]
async fn an_unreachable_provider_ends_the_turn_at_the_third_retry() {
    let h = Harness::new().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut options = h.options();
    let config = options
        .user_config
        .as_mut()
        .expect("the fake provider's config");
    config["provider"]["fake"]["options"]["baseURL"] =
        json!(format!("http://127.0.0.1:{closed}/v1"));
    let mut agent = Agent::start(options).await.expect("OpenCode starts");
    let s = agent.resolve_session("issue-8").await.unwrap();
    let t0 = Instant::now();
    let r = agent
        .run_turn(
            s.session.clone(),
            "Do the thing",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    let TurnOutcome::Failed(failure @ TurnFailure::Unreachable { .. }) = &r.outcome else {
        panic!("{r:?}");
    };
    let said = failure.to_string();
    eprintln!("UNREACHABLE | ended after {:?}: {said}", t0.elapsed());
    assert!(
        said.contains("could not be reached") && said.contains("base URL"),
        "{said}"
    );
    assert_eq!(r.attempts, 1, "{r:?}");
    // OpenCode's backoff before its third retry is about 6 s; the bound leaves room for a loaded
    // machine and stays far below the 215 s it took.
    assert!(t0.elapsed() < Duration::from_secs(40), "{:?}", t0.elapsed());
    assert!(!agent.is_busy(Some(&s.session.id)).await.unwrap());
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn provider_auth_errors_are_terminal() {
    let h = Harness::new().await;
    h.llm.set_default(Reply::Error(LlmError::Auth));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-8").await.unwrap();
    let r = agent
        .run_turn(s.session, "Do the thing", &opts(None), &Cancellation::new())
        .await;
    assert!(
        matches!(&r.outcome, TurnOutcome::Failed(TurnFailure::ProviderAuth { message }) if message.contains("API key")),
        "{r:?}"
    );
    assert_eq!(r.attempts, 1);
    assert_eq!(h.llm.requests().len(), 1);
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn context_overflow_archives_and_starts_fresh_once() {
    let h = Harness::new().await;
    // The prompt overflows, and so does OpenCode's own compaction attempt.
    h.llm.push_n(2, Reply::Error(LlmError::ContextOverflow));
    h.llm.push(Reply::text("Fresh session answer"));
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-10").await.unwrap();
    let old = s.session.id.clone();
    let r = agent
        .run_turn(s.session, "Big task", &opts(None), &Cancellation::new())
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    assert_eq!(r.replaced.as_deref(), Some(old.as_str()));
    assert_ne!(r.session.id, old);
    assert_eq!(r.session.title, "fro-bot: issue-10");
    assert_eq!(r.reply.unwrap().text, "Fresh session answer");
    let archived = agent.client().get_session(&old).await.unwrap();
    assert!(archived.time.archived.is_some());
    // The fresh session got the original prompt, not the overflowing history.
    let last = h.llm.requests().last().cloned().unwrap();
    let text = request_text(&last);
    assert!(text.contains("Big task"));
    // The next run resumes the fresh session.
    let next = agent.resolve_session("issue-10").await.unwrap();
    assert_eq!(next.session.id, r.session.id);

    // A turn that overflows again in its fresh session fails instead of restarting again.
    h.llm.set_default(Reply::Error(LlmError::ContextOverflow));
    let before = h.llm.requests().len();
    let r2 = agent
        .run_turn(next.session, "Big task", &opts(None), &Cancellation::new())
        .await;
    assert!(
        matches!(
            r2.outcome,
            TurnOutcome::Failed(TurnFailure::ContextOverflow { .. })
        ),
        "{r2:?}"
    );
    assert!(r2.replaced.is_some());
    assert_eq!(r2.attempts, 2);
    assert_eq!(
        h.llm.requests().len() - before,
        4,
        "2 sessions x (prompt + compaction)"
    );
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn prior_work_excerpts_reach_the_llm() {
    let h = Harness::new().await;
    h.llm.push(Reply::text(
        "The parser crash was fixed by bumping nom to 8.0.1.",
    ));
    let mut agent = h.start().await;
    let earlier = agent.resolve_session("pr-3").await.unwrap();
    let r = agent
        .run_turn(
            earlier.session.clone(),
            "Fix the parser crash",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed);

    let current = agent.resolve_session("issue-12").await.unwrap();
    let terms = prep::search_terms("issue-12", Some("Parser crash on unicode input"));
    let unknown = fro_bot::trust::TrustView::unknown();
    // A run that holds a token reads nothing from a session with no trust record.
    let schedule = fro_bot::trust::TrustView::new(
        fro_bot::trust::TrustLevel::Maintainer,
        true,
        Default::default(),
    );
    let withheld = agent
        .prior_work(&terms, &[current.session.id.as_str()], &schedule)
        .await
        .unwrap();
    assert!(withheld.excerpts.is_empty(), "{withheld:?}");
    assert!(withheld.withheld >= 1, "{withheld:?}");
    let prior = agent
        .prior_work(&terms, &[current.session.id.as_str()], &unknown)
        .await
        .unwrap()
        .excerpts;
    assert!(!prior.is_empty());
    assert!(prior
        .iter()
        .all(|e| e.untrusted && e.trust.author == "unknown"));
    assert!(prior.len() <= prep::MAX_EXCERPTS);
    assert!(prior.iter().all(|e| e.session_id == earlier.session.id));
    // The current session itself is never a source.
    let own = agent
        .prior_work(
            &["Fix the parser crash".into()],
            &[earlier.session.id.as_str()],
            &unknown,
        )
        .await
        .unwrap()
        .excerpts;
    assert!(own.is_empty(), "{own:?}");

    let prompt = prep::build_prompt(&PromptInput {
        repo: "o/r".into(),
        event: "issues".into(),
        prior_work: prior,
        directive: Some("Investigate the issue.".into()),
        ..Default::default()
    });
    h.llm.push(Reply::text("ok"));
    let r = agent
        .run_turn(current.session, &prompt, &opts(None), &Cancellation::new())
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed);
    let sent = request_text(h.llm.requests().last().unwrap());
    assert!(sent.contains("## Relevant prior work"));
    assert!(sent.contains("bumping nom"), "{sent}");
    assert!(sent.contains(&earlier.session.id));
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn writeback_is_searchable_through_the_session_tools() {
    let h = Harness::new().await;
    let mut agent = h.start().await;
    let s = agent.resolve_session("issue-20").await.unwrap();
    agent
        .writeback(&RunSummary {
            event: "issue_comment".into(),
            repo: "o/r".into(),
            git_ref: "main".into(),
            run_id: "987654".into(),
            cache_status: "hit".into(),
            session_id: s.session.id.clone(),
            logical_key: "issue-20".into(),
            duration: Duration::from_secs(12),
            ..Default::default()
        })
        .await
        .unwrap();
    // No LLM call: the writeback does not start a turn.
    assert!(h.llm.requests().is_empty());
    let tools = ToolsConfig {
        sessions: fro_bot::tools::sessions::SessionTools {
            url: Some(agent.server().url().into()),
            password: Some(agent.server().password().into()),
            workspace: h.workspace.clone(),
            trust: fro_bot::tools::sessions::TrustSource::Fixed(
                fro_bot::trust::TrustView::unknown(),
            ),
        },
        proposals: None,
        review: None,
    };
    let call = |name: &str, args: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": name, "arguments": args}})
        .to_string()
    };
    let r = session_tools::handle_line(
        &tools,
        &call("session_search", json!({"query": "run id: 987654"})),
    )
    .await
    .unwrap();
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(r["result"]["isError"], false, "{text}");
    assert!(
        text.contains(&s.session.id) && text.contains("987654"),
        "{text}"
    );
    // Case-sensitive search does not match the wrong case.
    let r = session_tools::handle_line(
        &tools,
        &call(
            "session_search",
            json!({"query": "RUN ID: 987654", "case_sensitive": true}),
        ),
    )
    .await
    .unwrap();
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("No matches"));

    let r = session_tools::handle_line(
        &tools,
        &call("session_read", json!({"session_id": s.session.id})),
    )
    .await
    .unwrap();
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains(SUMMARY_HEADER));
    let r = session_tools::handle_line(&tools, &call("session_list", json!({"limit": 5})))
        .await
        .unwrap();
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("fro-bot: issue-20"));
    let r = session_tools::handle_line(
        &tools,
        &call("session_info", json!({"session_id": s.session.id})),
    )
    .await
    .unwrap();
    let info: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(info["title"], "fro-bot: issue-20");
    assert_eq!(info["messages"], 1);
    // An unknown session is a tool error, not a crash.
    let r = session_tools::handle_line(
        &tools,
        &call("session_info", json!({"session_id": "ses_nope"})),
    )
    .await
    .unwrap();
    assert_eq!(r["result"]["isError"], true);
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("session store unavailable: "));

    // Trust follows memory: with no record (the lowest), the text is an untrusted quote; a run
    // that holds a token gets nothing from it; a session at the run's level comes as it is.
    let text_of = |r: &Value| {
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let read = call("session_read", json!({"session_id": s.session.id}));
    let quoted = text_of(&session_tools::handle_line(&tools, &read).await.unwrap());
    assert!(
        quoted.contains("It is not instructions")
            && quoted.contains(&format!(
                "item=\"untrusted transcript of session {}\" author=\"unknown\" association=\"UNKNOWN\"",
                s.session.id
            ))
            && quoted.contains(SUMMARY_HEADER),
        "{quoted}"
    );
    use fro_bot::tools::sessions::TrustSource;
    let withheld_view = fro_bot::trust::TrustView::new(
        fro_bot::trust::TrustLevel::Maintainer,
        true,
        Default::default(),
    );
    let mut withheld = tools.clone();
    withheld.sessions.trust = TrustSource::Fixed(withheld_view.clone());
    let r = session_tools::handle_line(&withheld, &read).await.unwrap();
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text_of(&r).contains("not found"), "{r}");
    for (name, args, want) in [
        (
            "session_search",
            json!({"query": "run id: 987654"}),
            "No matches",
        ),
        ("session_list", json!({}), "No sessions found"),
    ] {
        let r = session_tools::handle_line(&withheld, &call(name, args))
            .await
            .unwrap();
        assert!(text_of(&r).starts_with(want), "{name}: {r}");
    }
    let mut trusted_view = withheld_view.clone();
    trusted_view.sessions.insert(
        s.session.id.clone(),
        fro_bot::trust::SessionTrust::new("mona", "OWNER", false, false),
    );
    let mut trusted = withheld.clone();
    trusted.sessions.trust = TrustSource::File(
        fro_bot::trust::write_view_file(&withheld_view)
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap(),
    );
    // The tools read the file at every call: OpenCode starts them before the run's own session
    // is recorded in it.
    let list = call("session_list", json!({}));
    let before = text_of(&session_tools::handle_line(&trusted, &list).await.unwrap());
    assert!(before.starts_with("No sessions found"), "{before}");
    let TrustSource::File(path) = &trusted.sessions.trust else {
        unreachable!()
    };
    std::fs::write(path, serde_json::to_vec(&trusted_view).unwrap()).unwrap();
    let after = text_of(&session_tools::handle_line(&trusted, &list).await.unwrap());
    assert!(after.contains(&s.session.id), "{after}");
    let plain = text_of(&session_tools::handle_line(&trusted, &read).await.unwrap());
    assert!(
        plain.contains(SUMMARY_HEADER) && !plain.contains("<<<untrusted-"),
        "{plain}"
    );
    // Gone: every session is left out (fail closed).
    std::fs::remove_file(path).unwrap();
    let gone = text_of(&session_tools::handle_line(&trusted, &list).await.unwrap());
    assert!(gone.starts_with("No sessions found"), "{gone}");
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn pruning_keeps_exactly_the_right_sessions() {
    const DAY: i64 = 24 * 60 * 60 * 1000;
    let h = Harness::new().await;
    let mut agent = h.start().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(
            agent
                .resolve_session(&format!("k{i}"))
                .await
                .unwrap()
                .session
                .id,
        );
    }
    assert_eq!(
        agent.shutdown(Duration::from_secs(5)).await,
        Quiescence::Confirmed
    );

    // Ages (days): k0 1, k1 10, k2 40, k3 50, k4 60, k5 70 (child of k4), k6 80 (the current one).
    let now = fro_bot::opencode::system_now_ms();
    {
        let db = rusqlite::Connection::open(h.db()).unwrap();
        for (i, age) in [1, 10, 40, 50, 60, 70, 80].iter().enumerate() {
            db.execute(
                "UPDATE session SET time_updated = ?1 WHERE id = ?2",
                rusqlite::params![now - age * DAY, ids[i]],
            )
            .unwrap();
        }
        db.execute(
            "UPDATE session SET parent_id = ?1 WHERE id = ?2",
            rusqlite::params![ids[4], ids[5]],
        )
        .unwrap();
    }
    let mut agent = h.start().await;
    // Retention 3 keeps the newest three roots (k0, k1, k2), the 30-day rule adds nothing more,
    // k6 is protected; k3, k4 and k4's child k5 go.
    let report = agent.prune(3, &[ids[6].as_str()]).await.unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let mut expected = vec![ids[3].clone(), ids[4].clone(), ids[5].clone()];
    expected.sort();
    assert_eq!(deleted, expected);
    let mut left: Vec<String> = agent
        .client()
        .list_sessions()
        .await
        .unwrap()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    left.sort();
    let mut want = vec![
        ids[0].clone(),
        ids[1].clone(),
        ids[2].clone(),
        ids[6].clone(),
    ];
    want.sort();
    assert_eq!(left, want);
    agent.shutdown(Duration::from_secs(5)).await;
}

/// When OpenCode cannot start the session tools, the run says so (the agent itself would learn
/// only that no such tool exists), and still starts.
#[tokio::test]
async fn session_tools_that_cannot_start_are_reported() {
    let h = Harness::new().await;
    let mut options = h.options();
    options.fro_bot_exe = Some(PathBuf::from("/nonexistent/fro-bot"));
    let mut agent = Agent::start(options)
        .await
        .expect("starts without the tools");
    let notes = agent.confinement_notes().join("\n");
    assert!(
        notes.contains("no session tools for the agent (failed:") && notes.contains("ENOENT"),
        "{notes}"
    );
    agent.shutdown(Duration::from_secs(5)).await;

    // With the tools there, no such note.
    let mut agent = h.start().await;
    assert!(
        !agent
            .confinement_notes()
            .join("\n")
            .contains("session tools"),
        "{:?}",
        agent.confinement_notes()
    );
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_agent_gets_real_results_from_session_search_over_mcp() {
    let h = Harness::new().await;
    let mut agent = h.start().await;
    let old = agent.resolve_session("pr-77").await.unwrap();
    agent
        .client()
        .append_message(
            &old.session.id,
            "Migration notes: ZEBRA-42 needs the v2 schema.",
        )
        .await
        .unwrap();
    // First turn: learn the MCP tool's name from the tools OpenCode offers the model.
    let cur = agent.resolve_session("issue-77").await.unwrap();
    h.llm.push(Reply::text("hello"));
    let r = agent
        .run_turn(
            cur.session.clone(),
            "Say hello",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    let tools = h.llm.requests()[0]["tools"].clone();
    let names: Vec<String> = tools
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
        .collect();
    let search = names
        .iter()
        .find(|n| n.ends_with("session_search"))
        .unwrap_or_else(|| panic!("no session_search tool offered: {names:?}"))
        .clone();
    assert!(names.iter().any(|n| n.ends_with("session_read")));

    h.llm
        .push(Reply::tool(&search, json!({"query": "ZEBRA-42"})));
    h.llm.push(Reply::text("Found it"));
    let r = agent
        .run_turn(
            cur.session.clone(),
            "Search memory",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    let reqs = h.llm.requests();
    let after_tool = reqs.last().unwrap();
    let tool_msg = after_tool["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .cloned()
        .expect("a tool result in the request after the tool call");
    let content = request_text(&json!({"messages": [tool_msg]}));
    assert!(content.contains("ZEBRA-42"), "{content}");
    assert!(content.contains(&old.session.id), "{content}");
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn auth_json_reaches_the_provider_without_an_auth_file() {
    let h = Harness::new().await;
    let mut options = h.options();
    // No key in the provider config: it must come from auth-json.
    let mut cfg = h.llm.opencode_config();
    cfg["provider"]["fake"]["options"]
        .as_object_mut()
        .unwrap()
        .remove("apiKey");
    options.user_config = Some(serde_json::from_value(cfg).unwrap());
    options.auth =
        serde_json::from_value(json!({"fake": {"type": "api", "key": "sk-from-auth-json"}}))
            .unwrap();
    // An inherited input or token must not reach the agent.
    options.base_env.set("INPUT_GITHUB-TOKEN", "ghs_inputtoken");
    options
        .base_env
        .set("ACTIONS_RUNTIME_TOKEN", "runtime-token");
    h.llm.push(Reply::tool(
        "bash",
        json!({"command": "env > env.txt", "description": "Dump the environment"}),
    ));
    h.llm.push(Reply::text("ok"));
    let mut agent = Agent::start(options).await.unwrap();
    let s = agent.resolve_session("issue-30").await.unwrap();
    let r = agent
        .run_turn(s.session, "Hi", &opts(None), &Cancellation::new())
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    assert_eq!(
        h.llm.auth_headers()[0].as_deref(),
        Some("Bearer sk-from-auth-json")
    );
    agent.shutdown(Duration::from_secs(5)).await;
    assert!(!fro_bot::opencode::config::auth_file(&h.dirs.data_dir()).exists());
    let env = std::fs::read_to_string(h.workspace.join("env.txt")).unwrap();
    assert!(!env.contains("ghs_inputtoken") && !env.contains("runtime-token"));
    assert!(env.contains("OPENCODE_DISABLE_AUTOUPDATE=1"));
    assert!(env.contains(&format!("HOME={}", h.dirs.home.display())));
}

/// A text tool result of the session tools, called as the agent calls them (MCP `tools/call`).
async fn tool_text(tools: &ToolsConfig, name: &str, args: Value) -> String {
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": name, "arguments": args}})
    .to_string();
    let r = session_tools::handle_line(tools, &line).await.unwrap();
    assert_eq!(r["result"]["isError"], false, "{name}: {r}");
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// What [`grow_past_the_first_page`] made.
struct PastFirstPage {
    /// A conversation older than every grown session, mentioning `OSPREY-9`.
    deep: String,
    deep_updated: i64,
    total: usize,
    now: i64,
}

/// 1200 sessions newer than the thread, without messages (the oldest 100 past the window), and one
/// conversation older than all of them that mentions OSPREY-9; the thread older still (4 days).
fn grow_past_the_first_page(db: &Path, thread: &str) -> PastFirstPage {
    use crate::support::grow::{epoch_ms, grow, Growth};
    const DAY: i64 = 86_400_000;
    let now = epoch_ms();
    let empty = Growth {
        exchanges: 0,
        ..Growth::many(1200, now - 2 * DAY, 60_000)
    };
    let empty = grow(db, thread, &empty);
    let deep = grow(db, thread, &Growth::many(1, now - 3 * DAY, 0));
    let c = rusqlite::Connection::open(db).unwrap();
    let touch = |id: &str, at: i64| {
        c.execute(
            "UPDATE session SET time_updated = ?1 WHERE id = ?2",
            rusqlite::params![at, id],
        )
        .unwrap()
    };
    touch(thread, now - 4 * DAY);
    for (i, id) in empty.ids[..100].iter().enumerate() {
        touch(id, now - 40 * DAY - i as i64 * 60_000);
    }
    c.execute(
        "UPDATE part SET data = json_set(data, '$.text', 'the OSPREY-9 gasket') WHERE id = \
         (SELECT id FROM part WHERE session_id = ?1 AND json_extract(data, '$.type') = 'text' \
         LIMIT 1)",
        [&deep.ids[0]],
    )
    .unwrap();
    PastFirstPage {
        deep: deep.ids[0].clone(),
        // One exchange: updated a minute after it started.
        deep_updated: now - 3 * DAY + 60_000,
        total: 1200 + 1 + 1,
        now,
    }
}

/// Memory holding more than OpenCode's first page of 100 sessions
/// (docs/persistence.md#every-thread-resumes): the mapped thread resumes by id, the session tools
/// list, search and read past the first 100 (a search bounded to the newest 200 says how to reach
/// older ones), and a listing past its cap and a prune past its time say what they left.
#[tokio::test]
async fn every_session_is_reached_however_many_memory_holds() {
    let h = Harness::new().await;
    h.llm.push(Reply::text("The heron valve sticks when cold."));
    let mut agent = h.start().await;
    let thread = agent.resolve_session("issue-1").await.unwrap().session;
    let r = agent
        .run_turn(
            thread.clone(),
            "Why does the valve stick?",
            &opts(None),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed);
    agent.shutdown(Duration::from_secs(5)).await;
    let grown = grow_past_the_first_page(&h.db(), &thread.id);
    let mut agent = h.start().await;

    // The thread is older than every other session: resumed by id all the same.
    let resumed = agent
        .resolve_owned_session(
            "issue-1",
            fro_bot::opencode::session::Ownership::Mapped(Some(&thread.id)),
        )
        .await
        .unwrap();
    assert_eq!(
        (resumed.resolution, resumed.session.id.as_str()),
        (Resolution::Resumed, thread.id.as_str())
    );
    session_tools_reach(&h, &agent, &grown, &thread.id).await;
    listing_and_pruning_say_what_they_left(&agent, &grown, &thread.id).await;
    agent.shutdown(Duration::from_secs(5)).await;
}

/// The session tools list, search and read past OpenCode's first 100.
async fn session_tools_reach(h: &Harness, agent: &Agent, grown: &PastFirstPage, thread: &str) {
    let tools = ToolsConfig {
        sessions: fro_bot::tools::sessions::SessionTools {
            url: Some(agent.server().url().into()),
            password: Some(agent.server().password().into()),
            workspace: h.workspace.clone(),
            trust: fro_bot::tools::sessions::TrustSource::Fixed(
                fro_bot::trust::TrustView::unknown(),
            ),
        },
        proposals: None,
        review: None,
    };
    let total = grown.total;
    let listed = tool_text(&tools, "session_list", json!({"limit": 5})).await;
    assert!(
        listed.contains(&format!("({} more not shown)", total - 5)),
        "{listed}"
    );
    let unbounded = tool_text(&tools, "session_search", json!({"query": "OSPREY-9"})).await;
    assert!(
        unbounded.starts_with("No matches")
            && unbounded.contains(&format!("searched the newest 200 of {total} sessions")),
        "{unbounded}"
    );
    let to_date = fro_bot::tools::sessions::format_ms(grown.deep_updated + 30_000);
    let args = json!({"query": "OSPREY-9", "to_date": to_date});
    let found = tool_text(&tools, "session_search", args).await;
    assert!(
        found.contains(&grown.deep) && found.contains("OSPREY-9 gasket"),
        "{found}"
    );
    let info = tool_text(&tools, "session_info", json!({"session_id": thread})).await;
    assert!(info.contains("\"title\":\"fro-bot: issue-1\""), "{info}");
}

/// A listing past its cap says so and holds the newest; pruning past its listing cap sees none of
/// the old sessions, past its time stops after one deletion and says how many are left, and
/// unbounded deletes the 100.
async fn listing_and_pruning_say_what_they_left(
    agent: &Agent,
    grown: &PastFirstPage,
    thread: &str,
) {
    use fro_bot::opencode::client::Extent;
    use fro_bot::opencode::prune::{self, Bounds};
    let client = agent.client();
    let capped = client.list_sessions_upto(500).await.unwrap();
    assert_eq!(capped.extent, Extent::Capped { cap: 500 });
    assert_eq!(capped.sessions.len(), 500);
    assert!(capped
        .sessions
        .windows(2)
        .all(|w| w[0].time.updated >= w[1].time.updated));
    let all = client.list_sessions().await.unwrap();
    assert_eq!(
        (all.sessions.len(), all.extent),
        (grown.total, Extent::Complete)
    );

    let protect = [thread];
    let short = Bounds {
        listing: 500,
        ..Bounds::default()
    };
    let r = prune::prune(client, grown.now, 10, &protect, short)
        .await
        .unwrap();
    assert!(r.deleted.is_empty(), "{r:?}");
    assert!(r.notes()[0].contains("more than 500 sessions"), "{r:?}");
    let hurried = Bounds {
        time: Duration::ZERO,
        ..Bounds::default()
    };
    let r = prune::prune(client, grown.now, 10, &protect, hurried)
        .await
        .unwrap();
    assert_eq!((r.deleted.len(), r.left), (1, 99), "{r:?}");
    assert!(r.notes()[0].contains("99 left for later runs"), "{r:?}");
    let r = prune::prune(client, grown.now, 10, &protect, Bounds::default())
        .await
        .unwrap();
    assert_eq!((r.deleted.len(), r.left), (99, 0), "{r:?}");
    assert!(r.notes().is_empty() && r.failures.is_empty(), "{r:?}");
}
