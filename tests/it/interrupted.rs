//! A turn cut short (docs/persistence.md#a-turn-cut-short), with the real pinned OpenCode and the
//! scripted model. Each test cuts a turn as a CI job is cut: OpenCode SIGKILLed while the agent's
//! `bash` command runs or while the model streams; the turn aborted through OpenCode's API as
//! fro-bot aborts it on a signal or at its timeout (`opencode::turn`, `stop`). It records what
//! OpenCode 1.18.33 leaves in the database (the team's record of its behaviour), repairs it with
//! `memory::repair`, and starts OpenCode again on the repaired database for the follow-up: the
//! model must be shown the cut call as an interrupted call whose outcome is unknown, the command
//! must have run once, and other sessions' rows must be byte for byte as they were.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fro_bot::memory::repair::{
    self, call_error, message_error, Interruption, LeftAs, RepairReport, Scope,
};
use fro_bot::opencode::{Agent, AgentOptions, Isolation, Resolution, TurnOptions, TurnOutcome};
use fro_bot::runner::cancel::Signal;
use fro_bot::runner::{Cancellation, Env};

use crate::support::fake_llm::{FakeLlm, Reply};
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
            cancel: Cancellation::new(),
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

    /// The lines the scripted command wrote: one per time it started.
    fn starts(&self) -> usize {
        std::fs::read_to_string(self.workspace.join("ran.log"))
            .unwrap_or_default()
            .lines()
            .count()
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

fn opts(timeout: Duration) -> TurnOptions {
    TurnOptions {
        timeout: Some(timeout),
        ..Default::default()
    }
}

/// The command the model runs: it records that it started, and its pid (for the test to end
/// it), then sleeps far past the cut.
const COMMAND: &str = "echo started >> ran.log; echo $$ > cmd.pid; exec sleep 30";
const QUESTION: &str = "Run the migration";
const FOLLOW_UP: &str = "Did the migration finish?";

/// How a test cuts the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// OpenCode SIGKILLed while the command runs (a killed job).
    KillDuringTool,
    /// The turn aborted through OpenCode's API while the command runs (fro-bot on a signal).
    AbortDuringTool,
    /// OpenCode SIGKILLed while the model streams its answer.
    KillWhileStreaming,
    /// The turn aborted at fro-bot's timeout while the model streams.
    TimeoutWhileStreaming,
}

impl Cut {
    fn during_tool(self) -> bool {
        matches!(self, Cut::KillDuringTool | Cut::AbortDuringTool)
    }

    /// What the repair is told, and which sessions it reads, as fro-bot's call sites do: a
    /// killed turn is found by the next run's restore, in the whole database; a turn fro-bot
    /// stopped is repaired in cleanup, in its own session.
    fn repair(self, db: &Path, session: &str) -> RepairReport {
        let own = [session];
        let (scope, reason) = match self {
            Cut::KillDuringTool | Cut::KillWhileStreaming => {
                (Scope::Whole, Interruption::EarlierRun)
            }
            Cut::AbortDuringTool => (Scope::Trees(&own), Interruption::Cancelled),
            Cut::TimeoutWhileStreaming => (Scope::Trees(&own), Interruption::TimedOut),
        };
        repair::repair_path(db, scope, reason).unwrap()
    }
}

/// Every message and part row of `session` (or of every other session, `others`), in id order:
/// (id, data as stored).
fn rows(db: &Path, session: &str, others: bool) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open(db).unwrap();
    let op = if others { "IS NOT" } else { "=" };
    let mut out = Vec::new();
    for table in ["message", "part"] {
        let sql = format!("SELECT id, data FROM {table} WHERE session_id {op} ?1 ORDER BY id");
        let mut st = c.prepare(&sql).unwrap();
        let found: Vec<(String, String)> = st
            .query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        out.extend(found);
    }
    out
}

/// The cut turn's answer (its id, its data) and its parts, as OpenCode left them.
fn answer_and_parts(rows: &[(String, String)]) -> (String, Value, Vec<Value>) {
    let parsed: Vec<(&str, Value)> = rows
        .iter()
        .map(|(id, d)| (id.as_str(), serde_json::from_str(d).unwrap()))
        .collect();
    let (id, answer) = parsed
        .iter()
        .find(|(_, r)| r["role"] == "assistant")
        .cloned()
        .expect("an answer");
    let parts = parsed
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.get("type").is_some() && r.get("role").is_none())
        .filter(|r| r["type"] != "text" || r["text"] != QUESTION)
        .collect();
    (id.to_string(), answer, parts)
}

/// No call left open and no answer left incomplete anywhere in the database.
fn assert_nothing_open(db: &Path) {
    let c = rusqlite::Connection::open(db).unwrap();
    let open: i64 = c
        .query_row(
            "SELECT count(*) FROM part WHERE json_extract(data, '$.type') = 'tool' \
             AND json_extract(data, '$.state.status') IN ('pending', 'running')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let incomplete: i64 = c
        .query_row(
            "SELECT count(*) FROM message WHERE json_extract(data, '$.role') = 'assistant' \
             AND json_type(data, '$.time.completed') IS NOT 'integer'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!((open, incomplete), (0, 0), "calls open, answers incomplete");
}

/// Kills the sleeping command, by the pid it wrote (OpenCode does it on an abort; nothing does
/// after a SIGKILL).
fn end_command(ws: &Path) {
    let pid = std::fs::read_to_string(ws.join("cmd.pid")).unwrap_or_default();
    let Ok(pid) = pid.trim().parse::<i32>() else {
        return;
    };
    // Only while that pid is still the command's sleep (OpenCode may have ended it, and the pid
    // been reused since).
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if cmdline.starts_with(b"sleep\0") {
        // SAFETY: a plain syscall, on the pid this test's own command wrote.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Another thread's finished exchange, so the repair is seen to leave it alone.
async fn other_thread(h: &Harness, agent: &Agent) {
    h.llm.push(Reply::text("The other thread's answer."));
    let other = agent.resolve_session("issue-9").await.unwrap();
    let r = agent
        .run_turn(
            other.session.clone(),
            "Another question",
            &opts(Duration::from_secs(60)),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
}

/// Runs the turn on issue-1 and cuts it; returns its session and the outcome fro-bot saw.
async fn cut_turn(h: &Harness, agent: &mut Agent, cut: Cut) -> (String, TurnOutcome) {
    match cut.during_tool() {
        true => h.llm.push(Reply::tool(
            "bash",
            json!({"command": COMMAND, "description": "Migrate"}),
        )),
        false => h.llm.push(Reply::Stall),
    }
    let s = agent.resolve_session("issue-1").await.unwrap();
    let pid = agent.server().pid().expect("running") as i32;
    let cancel = Cancellation::new();
    let timeout = match cut {
        Cut::TimeoutWhileStreaming => Duration::from_secs(3),
        _ => Duration::from_secs(90),
    };
    let options = opts(timeout);
    let turn = agent.run_turn(s.session.clone(), QUESTION, &options, &cancel);
    let strike = async {
        let until = Instant::now() + Duration::from_secs(60);
        let under_way = || match cut.during_tool() {
            true => h.workspace.join("cmd.pid").exists(),
            false => h.llm.requests().len() >= 2,
        };
        while !under_way() {
            assert!(Instant::now() < until, "the cut point never came");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Well into the command (or the stream) before the cut.
        tokio::time::sleep(Duration::from_millis(500)).await;
        match cut {
            // SAFETY: a plain syscall on our own child, not yet reaped.
            Cut::KillDuringTool | Cut::KillWhileStreaming => unsafe {
                libc::kill(pid, libc::SIGKILL);
            },
            Cut::AbortDuringTool => cancel.cancel_with(Signal::Terminate, Instant::now()),
            Cut::TimeoutWhileStreaming => {}
        }
    };
    let (report, ()) = tokio::join!(turn, strike);
    agent.shutdown(Duration::from_secs(5)).await;
    (s.session.id, report.outcome)
}

/// What OpenCode 1.18.33 left, exactly as observed (the record, confirmed).
fn assert_left_by_opencode(cut: Cut, outcome: &TurnOutcome, answer: &Value, parts: &[Value]) {
    let types: Vec<&str> = parts.iter().map(|p| p["type"].as_str().unwrap()).collect();
    match cut {
        Cut::KillDuringTool | Cut::KillWhileStreaming => {
            assert!(matches!(outcome, TurnOutcome::Failed(_)), "{outcome:?}");
            assert!(answer["time"].get("completed").is_none(), "{answer}");
            assert!(answer.get("error").is_none() && answer.get("finish").is_none());
        }
        Cut::AbortDuringTool | Cut::TimeoutWhileStreaming => {
            assert!(answer["time"]["completed"].is_i64(), "{answer}");
            assert_eq!(
                answer["error"],
                json!({"name": "MessageAbortedError", "data": {"message": "Aborted"}})
            );
            assert!(answer.get("finish").is_none(), "{answer}");
        }
    }
    let last = parts.last().expect("parts");
    match cut {
        Cut::KillDuringTool => {
            assert_eq!(types, ["step-start", "tool"]);
            assert_eq!(last["state"]["status"], "running");
            assert_eq!(last["state"]["input"]["command"], COMMAND);
            assert_eq!(last["state"]["metadata"], json!({"output": ""}));
            assert!(
                last["state"]["time"]["start"].is_i64() && last["state"].get("output").is_none()
            );
        }
        Cut::AbortDuringTool => {
            assert_eq!(*outcome, TurnOutcome::Cancelled);
            assert_eq!(types, ["step-start", "tool"]);
            let out =
                "(no output)\n\n<shell_metadata>\nUser aborted the command\n</shell_metadata>";
            assert_eq!(last["state"]["status"], "completed");
            assert_eq!(last["state"]["output"], out);
            assert_eq!(
                last["state"]["metadata"],
                json!({"exit": null, "output": out, "truncated": false})
            );
            assert_eq!(last["state"]["title"], COMMAND);
        }
        Cut::KillWhileStreaming => {
            // The deltas are only events: the part holds what `text-start` wrote.
            assert_eq!(types, ["step-start", "text"]);
            assert_eq!(last["text"], "");
            assert!(last["time"].get("end").is_none());
        }
        Cut::TimeoutWhileStreaming => {
            assert_eq!(*outcome, TurnOutcome::TimedOut);
            // The abort's cleanup writes what had streamed.
            assert_eq!(types, ["step-start", "text"]);
            assert_eq!(last["text"], "Thinking");
            assert!(last["time"]["end"].is_i64());
        }
    }
}

/// The follow-up on the repaired database; returns what the model was sent (system prompt aside).
async fn follow_up(h: &Harness, session: &str) -> Vec<Value> {
    h.llm.push(Reply::text("Checked: it did not finish."));
    let agent = h.start().await;
    let s = agent.resolve_session("issue-1").await.unwrap();
    assert_eq!(
        (s.resolution, s.session.id.as_str()),
        (Resolution::Resumed, session)
    );
    let r = agent
        .run_turn(
            s.session.clone(),
            FOLLOW_UP,
            &opts(Duration::from_secs(60)),
            &Cancellation::new(),
        )
        .await;
    assert_eq!(r.outcome, TurnOutcome::Completed, "{r:?}");
    assert_eq!(r.reply.unwrap().text, "Checked: it did not finish.");
    let mut agent = agent;
    agent.shutdown(Duration::from_secs(5)).await;
    let last = h.llm.requests().last().cloned().unwrap();
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .cloned()
        .collect()
}

async fn cut_repair_and_follow_up(cut: Cut) {
    let h = Harness::new().await;
    let mut agent = h.start().await;
    other_thread(&h, &agent).await;
    let (session, outcome) = cut_turn(&h, &mut agent, cut).await;
    end_command(&h.workspace);
    let (answer_id, answer, parts) = answer_and_parts(&rows(&h.db(), &session, false));
    eprintln!("OPENCODE LEFT ({cut:?}): {answer}\n{parts:#?}");
    assert_left_by_opencode(cut, &outcome, &answer, &parts);
    let others = rows(&h.db(), &session, true);
    assert!(others.iter().any(|(id, _)| id.starts_with("msg_")));

    let report = cut.repair(&h.db(), &session);
    assert_repaired(cut, &report, &session, &answer_id);
    let (_, repaired, _) = answer_and_parts(&rows(&h.db(), &session, false));
    assert_eq!(
        repaired["error"],
        json!({"name": "MessageAbortedError", "data": {"message": message_error(reason_of(cut))}})
    );
    assert_nothing_open(&h.db());
    assert_eq!(
        rows(&h.db(), &session, true),
        others,
        "other sessions' rows"
    );
    let read = repair::read_back_path(&h.db(), Scope::Trees(&[&session])).unwrap();
    assert_eq!(read, report.turns, "read back from the repaired database");

    let sent = follow_up(&h, &session).await;
    assert_follow_up(cut, &sent, &report);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let starts = if cut.during_tool() { 1 } else { 0 };
    assert_eq!(
        h.starts(),
        starts,
        "the command ran once and was not run again"
    );
}

fn reason_of(cut: Cut) -> Interruption {
    match cut {
        Cut::KillDuringTool | Cut::KillWhileStreaming => Interruption::EarlierRun,
        Cut::AbortDuringTool => Interruption::Cancelled,
        Cut::TimeoutWhileStreaming => Interruption::TimedOut,
    }
}

fn assert_repaired(cut: Cut, report: &RepairReport, session: &str, answer: &str) {
    assert_eq!(report.turns.len(), 1, "{report:?}");
    let turn = &report.turns[0];
    assert_eq!(turn.session_id, session);
    assert_eq!(turn.message_id, answer);
    assert_eq!(turn.reason, reason_of(cut));
    assert!(!turn.superseded);
    match cut {
        Cut::KillDuringTool | Cut::AbortDuringTool => {
            assert_eq!(turn.calls.len(), 1);
            let call = &turn.calls[0];
            assert_eq!((call.tool.as_str(), call.input.as_str()), ("bash", COMMAND));
            let left = match cut {
                Cut::KillDuringTool => LeftAs::Running,
                _ => LeftAs::AbortedCommand,
            };
            assert_eq!(call.left, left);
        }
        Cut::KillWhileStreaming | Cut::TimeoutWhileStreaming => assert!(turn.calls.is_empty()),
    }
}

/// The model sees the cut question, then the cut call as an error in the repair's words (never a
/// result, never the user's abort), then the follow-up; streamed text as it was kept.
fn assert_follow_up(cut: Cut, sent: &[Value], report: &RepairReport) {
    let shown: Vec<String> = sent.iter().map(Value::to_string).collect();
    let roles: Vec<&str> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        sent.first().map(|m| &m["content"]),
        Some(&json!(QUESTION)),
        "{shown:#?}"
    );
    assert_eq!(
        sent.last().map(|m| &m["content"]),
        Some(&json!(FOLLOW_UP)),
        "{shown:#?}"
    );
    match cut {
        Cut::KillDuringTool | Cut::AbortDuringTool => {
            assert_eq!(roles, ["user", "assistant", "tool", "user"], "{shown:#?}");
            let call = &sent[1]["tool_calls"][0];
            assert_eq!(call["function"]["name"], "bash");
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(args["command"], COMMAND, "the call's input is kept");
            assert_eq!(sent[2]["tool_call_id"], call["id"]);
            assert_eq!(
                sent[2]["content"],
                call_error(report.turns[0].reason),
                "{shown:#?}"
            );
        }
        Cut::KillWhileStreaming => {
            assert_eq!(roles, ["user", "assistant", "user"], "{shown:#?}");
            assert_eq!(sent[1]["content"], "");
        }
        Cut::TimeoutWhileStreaming => {
            assert_eq!(roles, ["user", "assistant", "user"], "{shown:#?}");
            assert_eq!(sent[1]["content"], "Thinking", "streamed text is kept");
        }
    }
    let all = shown.join("\n");
    for never in [
        "User aborted the command",
        "[Tool execution was interrupted]",
        "(no output)",
    ] {
        assert!(!all.contains(never), "{never:?} reached the model: {all}");
    }
}

#[tokio::test]
async fn sigkill_during_a_tool_leaves_a_running_call_the_repair_makes_an_unknown_error() {
    cut_repair_and_follow_up(Cut::KillDuringTool).await;
}

#[tokio::test]
async fn an_abort_during_a_tool_leaves_user_aborted_the_repair_makes_an_unknown_error() {
    cut_repair_and_follow_up(Cut::AbortDuringTool).await;
}

#[tokio::test]
async fn sigkill_while_streaming_leaves_an_open_answer_the_repair_completes() {
    cut_repair_and_follow_up(Cut::KillWhileStreaming).await;
}

#[tokio::test]
async fn a_timeout_while_streaming_keeps_the_streamed_text_and_the_repair_names_the_timeout() {
    cut_repair_and_follow_up(Cut::TimeoutWhileStreaming).await;
}
