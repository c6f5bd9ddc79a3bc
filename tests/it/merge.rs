//! Session-level merge of databases written by the real pinned OpenCode (fake LLM): two runs
//! restore the same memory, each answers on its own thread, and the merge of both is read back by
//! OpenCode itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use fro_bot::memory::merge::{self, Change, MergeOptions, Side, Snapshot, Verify};
use fro_bot::opencode::{Agent, AgentOptions, Isolation, TurnOptions, TurnOutcome};
use fro_bot::runner::{Cancellation, Env};

use crate::support::fake_llm::{request_text, FakeLlm, Reply};
use crate::support::services::opencode_bin;

/// One repository checkout (one project id) and one fake LLM; each run gets its own HOME/XDG dirs
/// whose data dir starts from a given database, as a restore leaves it.
struct Repo {
    tmp: tempfile::TempDir,
    workspace: PathBuf,
    llm: FakeLlm,
}

impl Repo {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = tmp.path().join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["commit", "-q", "--allow-empty", "-m", "initial"][..],
        ] {
            let st = std::process::Command::new("git")
                .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
                .args(args)
                .current_dir(&workspace)
                .status()
                .unwrap();
            assert!(st.success(), "git {args:?}");
        }
        Repo {
            tmp,
            workspace,
            llm: FakeLlm::start().await,
        }
    }

    /// Dirs for run `name`, its database restored from `from` (if any).
    fn run_dirs(&self, name: &str, from: Option<&Path>) -> Isolation {
        let dirs = Isolation::under(&self.tmp.path().join(name));
        std::fs::create_dir_all(dirs.data_dir()).unwrap();
        if let Some(db) = from {
            std::fs::copy(db, dirs.data_dir().join("opencode.db")).unwrap();
        }
        dirs
    }

    async fn start(&self, dirs: &Isolation) -> Agent {
        let log = dirs.home.join("opencode.log");
        let options = AgentOptions {
            opencode: opencode_bin(),
            opencode_version: fro_bot::config::DEFAULT_OPENCODE_VERSION.into(),
            workspace: self.workspace.clone(),
            dirs: dirs.clone(),
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
            log_file: log.clone(),
            startup_deadline: Duration::from_secs(60),
            now_ms: fro_bot::opencode::system_now_ms,
            cancel: fro_bot::runner::Cancellation::new(),
            network: fro_bot::egress::AgentReach::open(),
            spend: None,
        };
        Agent::start(options).await.unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("start failed: {e:?}\n{log}")
        })
    }

    /// One run: a turn on each `(thread, answer)`, then shutdown and checkpoint, as the action's
    /// cleanup does. Returns the database.
    async fn run(&self, dirs: &Isolation, turns: &[(&str, Vec<Reply>)]) -> PathBuf {
        let mut agent = self.start(dirs).await;
        for (thread, replies) in turns {
            for r in replies {
                self.llm.push(r.clone());
            }
            let s = agent.resolve_session(thread).await.unwrap();
            let r = agent
                .run_turn(
                    s.session,
                    &format!("A question on {thread}"),
                    &TurnOptions {
                        timeout: Some(Duration::from_secs(90)),
                        ..Default::default()
                    },
                    &Cancellation::new(),
                )
                .await;
            assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
        }
        agent.shutdown(Duration::from_secs(5)).await;
        let db = dirs.data_dir().join("opencode.db");
        fro_bot::memory::checkpoint::checkpoint(&db);
        db
    }
}

fn text(answer: &str) -> Vec<Reply> {
    vec![Reply::text(answer)]
}

fn assert_sound(db: &Path) {
    let c = Connection::open(db).unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let fk: i64 = c
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(fk, 0);
}

/// The text of every message of the thread's session, as OpenCode serves it.
async fn thread_text(agent: &Agent, thread: &str) -> String {
    let title = fro_bot::opencode::session::title_for(thread);
    let sessions = agent.client().list_sessions().await.unwrap().sessions;
    let s = sessions
        .iter()
        .find(|s| s.title == title)
        .unwrap_or_else(|| panic!("no session {title} in {sessions:?}"));
    let msgs = agent.client().messages(&s.id, None).await.unwrap();
    msgs.iter().map(|m| m.text()).collect::<Vec<_>>().join("\n")
}

/// A follow-up turn on `thread`, which resumes its session.
async fn follow_up(agent: &mut Agent, thread: &str, prompt: &str) {
    let s = agent.resolve_session(thread).await.unwrap();
    assert_eq!(s.resolution, fro_bot::opencode::Resolution::Resumed);
    let r = agent
        .run_turn(
            s.session,
            prompt,
            &TurnOptions::default(),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
}

#[tokio::test]
async fn two_real_runs_on_different_threads_merge_and_opencode_resumes_both() {
    let repo = Repo::new().await;
    let d0 = repo.run_dirs("run0", None);
    let restored = repo.run(&d0, &[("issue-1", text("FIRST-ANSWER-1"))]).await;
    let snap = Snapshot::capture(&restored).unwrap();
    assert_eq!(snap.sessions.len(), 1);

    // Two concurrent runs restore the same memory; A answers issue 2, B issue 3 and issue 1 again.
    let da = repo.run_dirs("run-a", Some(&restored));
    let db = repo.run_dirs("run-b", Some(&restored));
    let a = repo.run(&da, &[("issue-2", text("ALPHA-2222"))]).await;
    // On issue 3 the agent delegates to a sub-agent: a child session.
    let delegate = vec![
        Reply::tool(
            "task",
            serde_json::json!({"description": "Look it up", "prompt": "Find the answer",
                "subagent_type": "general"}),
        ),
        Reply::text("SUB-AGENT-FOUND-IT"),
        Reply::text("BRAVO-3333"),
    ];
    let b = repo
        .run(
            &db,
            &[("issue-3", delegate), ("issue-1", text("ONE-AGAIN-1111"))],
        )
        .await;

    // A published first; B merges its sessions into A's copy.
    let out = repo.tmp.path().join("merged.db");
    let report = merge::merge_with(
        &a,
        &b,
        &snap,
        &out,
        MergeOptions {
            verify: Verify::Full,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(report.conflicts.is_empty(), "{report:?}");
    let mut changes: Vec<(Option<&str>, Change)> = report
        .taken
        .iter()
        .map(|t| (t.title.as_deref(), t.change))
        .collect();
    changes.sort_by_key(|c| c.0);
    assert_eq!(
        changes,
        [
            (Some("fro-bot: issue-1"), Change::Updated),
            (Some("fro-bot: issue-3"), Change::Added)
        ]
    );
    let issue3 = report
        .taken
        .iter()
        .find(|t| t.title.as_deref() == Some("fro-bot: issue-3"))
        .unwrap();
    assert_eq!(
        issue3.sessions.len(),
        2,
        "the sub-agent's child session follows"
    );
    let c = Connection::open(&out).unwrap();
    let children: i64 = c
        .query_row(
            "SELECT count(*) FROM session WHERE parent_id = ?1",
            [&issue3.root],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(children, 1);
    drop(c);
    assert_sound(&out);

    // OpenCode reads the merged memory: every thread is there and resumes its own conversation.
    let dm = repo.run_dirs("merged", Some(&out));
    let mut agent = repo.start(&dm).await;
    let one = thread_text(&agent, "issue-1").await;
    assert!(
        one.contains("FIRST-ANSWER-1") && one.contains("ONE-AGAIN-1111"),
        "{one}"
    );
    assert!(thread_text(&agent, "issue-2").await.contains("ALPHA-2222"));
    assert!(thread_text(&agent, "issue-3").await.contains("BRAVO-3333"));
    repo.llm.push(Reply::text("follow-up answered"));
    follow_up(&mut agent, "issue-2", "Follow-up on issue 2").await;
    let last = request_text(repo.llm.requests().last().unwrap());
    assert!(last.contains("ALPHA-2222"), "the follow-up saw: {last}");
    agent.shutdown(Duration::from_secs(5)).await;
}

/// One run continuing `thread` with `prompt`: its database, and the messages its turn added.
async fn turn_on(
    repo: &Repo,
    dirs: &Isolation,
    thread: &str,
    prompt: &str,
) -> (PathBuf, std::collections::BTreeSet<String>) {
    let before = dirs.home.join("before.db");
    let db = dirs.data_dir().join("opencode.db");
    std::fs::copy(&db, &before).unwrap();
    let mut agent = repo.start(dirs).await;
    let s = agent.resolve_session(thread).await.unwrap();
    assert_eq!(s.resolution, fro_bot::opencode::Resolution::Resumed);
    let options = TurnOptions {
        timeout: Some(Duration::from_secs(90)),
        ..Default::default()
    };
    let r = agent
        .run_turn(s.session, prompt, &options, &Cancellation::new())
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    agent.shutdown(Duration::from_secs(5)).await;
    fro_bot::memory::checkpoint::checkpoint(&db);
    let own = merge::messages_added(Some(&before), &db).unwrap();
    (db, own)
}

/// Where `needle` first appears among a request's messages (by index), if it does.
fn position(request: &serde_json::Value, needle: &str) -> Option<usize> {
    request["messages"]
        .as_array()?
        .iter()
        .position(|m| m.to_string().contains(needle))
}

/// Two runs continue one thread at once: A asks first and works through a tool step, and B asks
/// while A works (A's tool step is held until B's question reached the model), so in OpenCode's
/// order their messages interleave.
async fn two_overlapping_turns(
    repo: &Repo,
    restored: &Path,
) -> (
    (PathBuf, std::collections::BTreeSet<String>),
    (PathBuf, std::collections::BTreeSet<String>),
) {
    let da = repo.run_dirs("run-a", Some(restored));
    let db = repo.run_dirs("run-b", Some(restored));
    repo.llm.push(Reply::tool(
        "bash",
        serde_json::json!({"command": "echo looked", "description": "look"}),
    ));
    repo.llm.push(Reply::text("LATER-BBBB"));
    repo.llm.push(Reply::text("EARLIER-AAAA"));
    repo.llm.hold_while(|request, all| {
        let asked = request_text(request);
        asked.contains("QUESTION-A")
            && !asked.contains("looked")
            && !all.iter().any(|r| request_text(r).contains("QUESTION-B"))
    });
    let b = async {
        // B starts once A's question is at the model.
        while !repo
            .llm
            .requests()
            .iter()
            .any(|r| request_text(r).contains("QUESTION-A"))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        turn_on(repo, &db, "issue-7", "QUESTION-B").await
    };
    let pair = tokio::join!(turn_on(repo, &da, "issue-7", "QUESTION-A"), b);
    repo.llm.release_holds();
    pair
}

#[tokio::test]
async fn two_real_runs_on_the_same_thread_keep_both_exchanges_each_answer_after_its_question() {
    let repo = Repo::new().await;
    let d0 = repo.run_dirs("run0", None);
    let restored = repo.run(&d0, &[("issue-7", text("BEFORE-7"))]).await;
    let snap = Snapshot::capture(&restored).unwrap();
    let ((a, own_a), (b, own_b)) = two_overlapping_turns(&repo, &restored).await;
    assert_eq!((own_a.len(), own_b.len()), (3, 2), "{own_a:?} {own_b:?}");

    // A saved first; B merges into A's entry (the cache's case: an empty snapshot), and the other
    // way round: whichever saves later keeps both, each question followed by its answer.
    for (name, base, ours, own, snapshot) in [
        ("b-into-a", &a, &b, &own_b, Snapshot::empty()),
        ("a-into-b", &b, &a, &own_a, snap.clone()),
    ] {
        let out = repo.tmp.path().join(format!("{name}.db"));
        let options = MergeOptions {
            verify: Verify::Full,
            own_messages: Some(own),
            ..Default::default()
        };
        let report = merge::merge_with(base, ours, &snapshot, &out, options).unwrap();
        assert!(report.conflicts.is_empty(), "{name}: {report:?}");
        assert_eq!(report.kept_both.len(), 1, "{name}: {report:?}");
        assert!(
            report.kept_both[0].moved > 0,
            "{name}: the turns interleaved: {report:?}"
        );
        assert_sound(&out);

        // OpenCode reads the merged memory, and a follow-up's request carries both exchanges.
        let dm = repo.run_dirs(&format!("merged-{name}"), Some(&out));
        let mut agent = repo.start(&dm).await;
        let all = thread_text(&agent, "issue-7").await;
        for word in ["BEFORE-7", "EARLIER-AAAA", "LATER-BBBB"] {
            assert!(all.contains(word), "{name}: {all}");
        }
        repo.llm.push(Reply::text("FOLLOW-UP"));
        follow_up(&mut agent, "issue-7", "QUESTION-C").await;
        let request = repo.llm.requests().last().unwrap().clone();
        let at = |needle: &str| {
            position(&request, needle)
                .unwrap_or_else(|| panic!("{name}: {needle} not in {request:#}"))
        };
        let order = [
            at("QUESTION-A"),
            at("looked"),
            at("EARLIER-AAAA"),
            at("QUESTION-B"),
            at("LATER-BBBB"),
            at("QUESTION-C"),
        ];
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{name}: each question followed by its own answer: {order:?} in {request:#}"
        );
        agent.shutdown(Duration::from_secs(5)).await;
    }

    // Without knowing which messages are this run's own, none may move: the later turn is kept
    // and the other reported, as before, saying why.
    let out = repo.tmp.path().join("unknown.db");
    let report = merge::merge(&a, &b, &Snapshot::empty(), &out).unwrap();
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    let c = &report.conflicts[0];
    assert_eq!(
        c.winner,
        Side::Base,
        "A worked on after B answered: its turn is the later one"
    );
    assert!(c.lost_messages >= 2, "B's question and answer: {c:?}");
    assert!(c.describe().contains("interleave"), "{}", c.describe());
}

#[tokio::test]
async fn a_run_that_compacted_the_thread_falls_back_to_the_later_turn_and_says_so() {
    let repo = Repo::new().await;
    let d0 = repo.run_dirs("run0", None);
    let restored = repo.run(&d0, &[("issue-7", text("BEFORE-7"))]).await;
    let da = repo.run_dirs("run-a", Some(&restored));
    let db = repo.run_dirs("run-b", Some(&restored));
    let (a, _) = turn_on(&repo, &da, "issue-7", "QUESTION-A").await;
    // B's model overflows its context: OpenCode compacts the session (a summary), then answers.
    repo.llm.push(Reply::Error(
        crate::support::fake_llm::LlmError::ContextOverflow,
    ));
    repo.llm.push(Reply::text("SUMMARY-OF-IT"));
    repo.llm.push(Reply::text("LATER-BBBB"));
    let (b, own_b) = turn_on(&repo, &db, "issue-7", "QUESTION-B").await;
    let out = repo.tmp.path().join("merged.db");
    let options = MergeOptions {
        verify: Verify::Full,
        own_messages: Some(&own_b),
        ..Default::default()
    };
    let report = merge::merge_with(&a, &b, &Snapshot::empty(), &out, options).unwrap();
    assert!(report.kept_both.is_empty(), "{report:?}");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    let c = &report.conflicts[0];
    assert_eq!(c.refusal, Some(merge::Refusal::Compacted), "{c:?}");
    assert!(c.lost_a_turn());
    assert!(
        c.describe().contains("one run compacted the session"),
        "{}",
        c.describe()
    );
    assert_sound(&out);
}
