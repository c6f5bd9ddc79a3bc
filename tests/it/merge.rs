//! Session-level merge of databases written by the real pinned OpenCode (fake LLM): two runs
//! restore the same memory, each answers on its own thread, and the merge of both is read back by
//! OpenCode itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use fro_bot::merge::{self, Change, MergeOptions, Side, Snapshot, Verify};
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
        fro_bot::checkpoint::checkpoint(&db);
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
    let sessions = agent.client().list_sessions().await.unwrap();
    let s = sessions
        .iter()
        .find(|s| s.title == title)
        .unwrap_or_else(|| panic!("no session {title} in {sessions:?}"));
    let msgs = agent.client().messages(&s.id, None).await.unwrap();
    msgs.iter().map(|m| m.text()).collect::<Vec<_>>().join("\n")
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
    let s = agent.resolve_session("issue-2").await.unwrap();
    assert_eq!(s.resolution, fro_bot::opencode::Resolution::Resumed);
    let r = agent
        .run_turn(
            s.session,
            "Follow-up on issue 2",
            &TurnOptions::default(),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    let last = request_text(repo.llm.requests().last().unwrap());
    assert!(last.contains("ALPHA-2222"), "the follow-up saw: {last}");
    agent.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn two_real_runs_on_the_same_thread_keep_the_later_turn_and_report_the_other() {
    let repo = Repo::new().await;
    let d0 = repo.run_dirs("run0", None);
    let restored = repo.run(&d0, &[("issue-7", text("BEFORE-7"))]).await;
    let snap = Snapshot::capture(&restored).unwrap();
    let da = repo.run_dirs("run-a", Some(&restored));
    let db = repo.run_dirs("run-b", Some(&restored));
    let a = repo.run(&da, &[("issue-7", text("EARLIER-AAAA"))]).await;
    let b = repo.run(&db, &[("issue-7", text("LATER-BBBB"))]).await;

    let out = repo.tmp.path().join("merged.db");
    let report = merge::merge(&a, &b, &snap, &out).unwrap();
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    let c = &report.conflicts[0];
    assert_eq!(c.winner, Side::Ours, "B's turn is the later one");
    assert_eq!(c.title.as_deref(), Some("fro-bot: issue-7"));
    assert!(c.lost_messages >= 2, "A's question and answer: {c:?}");
    assert!(c.base_activity < c.ours_activity);
    assert_sound(&out);

    // The other order: A is ours, B already published; B's later turn stays.
    let out2 = repo.tmp.path().join("merged2.db");
    let report = merge::merge(&b, &a, &snap, &out2).unwrap();
    assert_eq!(report.conflicts[0].winner, Side::Base);
    let dm = repo.run_dirs("merged", Some(&out2));
    let mut agent = repo.start(&dm).await;
    let text = thread_text(&agent, "issue-7").await;
    assert!(
        text.contains("BEFORE-7") && text.contains("LATER-BBBB") && !text.contains("EARLIER-AAAA"),
        "{text}"
    );
    agent.shutdown(Duration::from_secs(5)).await;
}
