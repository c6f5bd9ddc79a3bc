//! A turn cut short, through the built binary (docs/persistence.md#a-turn-cut-short): the cut
//! run's own cleanup repairs a turn fro-bot stopped, the next run's restore repairs a turn a
//! killed run left on new memory, and post finishes the turn of a main step killed on a thread
//! with memory (from the memory guard's copy main handed over, which it believes only as main
//! recorded it); either way the follow-up shows the model the cut call as interrupted with an
//! unknown outcome, the command ran once, and other threads' memory is as it was. The cut run says
//! what was kept; the follow-up's prompt tells the agent, in one fenced paragraph, that the
//! previous turn was cut short (docs/persistence.md#the-next-run-knows), and a run after an
//! answered turn says nothing of it.

use std::path::Path;
use std::time::{Duration, Instant};

use fro_bot::memory::repair::{call_error, Interruption};
use serde_json::{json, Value};

use super::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job, Launch, StepResult};
use crate::support::fake_llm::{request_text, Reply};

/// The runner's user, who owns the checkout (as on a hosted runner): the agent can write it.
const RUNNER_UID: u32 = 1001;

/// Records that it started, and its pid; then sleeps far past the cut.
const COMMAND: &str = "echo started >> ran.log; echo $$ > cmd.pid; exec sleep 30";

/// Starts the main step on a turn whose command the model runs, and sends `signal` once the
/// command is under way.
async fn signalled_during_the_command(world: &World, job: Job, signal: i32) -> (Job, StepResult) {
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": COMMAND, "description": "Run the migration"}),
    ));
    let mut running = job.spawn(&["run"], &[]);
    let pid_file = job.workspace().join("cmd.pid");
    let until = Instant::now() + Duration::from_secs(120);
    while !pid_file.exists() {
        assert!(
            Instant::now() < until && !running.exited(),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.signal(signal);
    tokio::task::spawn_blocking(move || {
        let r = job.finish(running);
        (job, r)
    })
    .await
    .unwrap()
}

/// Ends the sleeping command (nothing does after a SIGKILL of the step), by its own pid.
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

/// What the newest user message of the run's first request to the model says: the prompt this
/// run gave (earlier runs' prompts are history in the same request).
fn this_runs_prompt(world: &World, before: usize) -> String {
    let sent = world.llm.requests()[before].clone();
    let last_user = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["role"] == "user")
        .cloned()
        .unwrap();
    request_text(&json!({"messages": [last_user]}))
}

/// The follow-up run on the thread: the model is told the cut call's outcome is unknown, in the
/// words of the repair for one of `reasons`; the command ran once. Returns its result and the
/// prompt it gave.
async fn follow_up(
    world: &World,
    mut job: Job,
    run_id: u64,
    reasons: &[Interruption],
) -> (Job, StepResult, String) {
    job.next_run(run_id);
    job.event(
        "issue_comment",
        &comment_event(5, run_id, "@fro-bot did the migration finish?"),
    );
    world.llm.push(Reply::text("It did not finish; I checked."));
    let before = world.llm.requests().len();
    let (job, next) = main_step(job).await;
    assert_eq!(next.code, 0, "{}", explain(&next));
    let prompt = this_runs_prompt(world, before);
    let sent = world.llm.requests().last().cloned().unwrap();
    // What the model was told, the system prompt and the tools' definitions aside.
    let messages: Vec<&Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .collect();
    let shown = format!("{messages:#?}");
    let tool: Vec<&&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool.len(), 1, "{shown}");
    assert!(
        reasons
            .iter()
            .any(|reason| tool[0]["content"] == call_error(*reason)),
        "the call is shown as interrupted ({reasons:?}): {shown}"
    );
    let text = shown;
    assert!(
        text.contains("run the migration"),
        "the cut question is kept"
    );
    assert!(!text.contains("User aborted the command"), "{text}");
    let log = std::fs::read_to_string(job.workspace().join("ran.log")).unwrap_or_default();
    assert_eq!(log.lines().count(), 1, "the command ran once: {log:?}");
    (job, next, prompt)
}

/// The notice in `prompt`: one fenced paragraph that names the cut call by its command, then the
/// request to check the work tree, outside the fence.
fn assert_notice(prompt: &str, said: &[&str]) {
    let at = prompt
        .find("## The previous turn was cut short\n<<<untrusted-")
        .unwrap_or_else(|| panic!("no notice in the prompt:\n{prompt}"));
    let lines: Vec<&str> = prompt[at..].lines().collect();
    assert!(lines[1].contains("item=\"what memory records of the previous turn on this thread\""));
    assert!(
        lines[3].starts_with(">>>untrusted-"),
        "one paragraph: {prompt}"
    );
    let paragraph = lines[2];
    for s in said {
        assert!(paragraph.contains(s), "{s:?} in {paragraph}");
    }
    assert!(
        paragraph.contains(&format!("bash `{COMMAND}`")),
        "{paragraph}"
    );
    assert!(paragraph.ends_with("The question it was answering was not answered."));
    assert!(lines[4].contains("Check the work tree before repeating anything."));
}

#[tokio::test]
async fn sigint_during_a_command_keeps_the_turn_with_its_call_as_unknown() {
    let world = World::start().await;
    world.github.seed_issue(5, "Migrate", "Please migrate.");
    let mut job = world.job(2100);
    job.owned_by_runner_user(RUNNER_UID);
    job.event(
        "issue_comment",
        &comment_event(5, 1, "@fro-bot run the migration"),
    );
    let (job, cut) = signalled_during_the_command(&world, job, libc::SIGINT).await;
    end_command(&job.workspace());
    assert_eq!(
        cut.state.get("cacheSaved").map(String::as_str),
        Some("durable"),
        "{}",
        explain(&cut)
    );
    assert!(
        cut.summary.contains(
            "| Turn cut short | repaired a turn cut short (the workflow run was cancelled): the \
             turn was kept; its last command's outcome is unknown |"
        ),
        "{}",
        cut.summary
    );
    let told = world.github.comment_versions().last().cloned().unwrap();
    assert!(
        told.contains("I was stopped before I could finish: the run was cancelled.")
            && told.contains(
                "This run's memory holds what I did so far: the turn was kept; its last \
                 command's outcome is unknown."
            ),
        "{told}"
    );
    let (job, next, prompt) = follow_up(&world, job, 2101, &[Interruption::Cancelled]).await;
    assert!(!next.summary.contains("Turn cut short"), "{}", next.summary);
    assert_notice(
        &prompt,
        &[
            "The previous turn on this thread was cut short, in run 2100 (attempt 1), started 20",
            ": the workflow run was cancelled; the call whose outcome is unknown (it was not run \
             again): ",
        ],
    );
    // The follow-up answered: the run after it is told nothing of the cut turn.
    let (_, _, prompt) = follow_up(&world, job, 2102, &[Interruption::Cancelled]).await;
    // (The thread's own comments, quoted as context, still say it was.)
    assert!(
        !prompt.contains("## The previous turn was cut short")
            && !prompt.contains("what memory records of the previous turn"),
        "{prompt}"
    );
}

/// The runner's cancel (SIGTERM) while the agent's command runs, on a thread that already has
/// memory: OpenCode records the aborted call as a completed `User aborted the command`; fro-bot's
/// repair makes it an unknown outcome, the turn is saved beside the earlier exchange, and the
/// follow-up is shown the call as interrupted by the cancel, never as the user's abort.
#[tokio::test]
async fn sigterm_during_a_command_on_a_thread_with_memory_keeps_both_turns_with_the_call_as_unknown(
) {
    let world = World::start().await;
    let mut job = world.job(2170);
    job.owned_by_runner_user(RUNNER_UID);
    let (mut job, thread) = thread_with_memory(&world, job, 2170, "@fro-bot what changes?").await;
    job.event(
        "issue_comment",
        &comment_event(5, 2, "@fro-bot run the migration"),
    );
    let (job, cut) = signalled_during_the_command(&world, job, libc::SIGTERM).await;
    end_command(&job.workspace());
    assert_eq!(cut.output("session-id"), thread, "{}", explain(&cut));
    assert_eq!(
        cut.state.get("cacheSaved").map(String::as_str),
        Some("durable"),
        "{}",
        explain(&cut)
    );
    // The runner's 2.5 s budget after SIGTERM: when the save needs what is left, the cut run
    // saves the turn unrepaired and the follow-up's restore repairs it (`cut::SAVE_RESERVE`).
    let (_, _, _) = follow_up(
        &world,
        job,
        2172,
        &[Interruption::Cancelled, Interruption::EarlierRun],
    )
    .await;
    let sent = world.llm.requests().last().cloned().unwrap().to_string();
    assert!(
        sent.contains("what changes?") && sent.contains("It renames the zebra column."),
        "the earlier exchange is kept beside the cut turn: {sent}"
    );
}

#[tokio::test]
async fn sigkill_during_a_command_on_new_memory_is_repaired_by_the_next_runs_restore() {
    let world = World::start().await;
    world.github.seed_issue(5, "Migrate", "Please migrate.");
    let mut job = world.job(2110);
    job.owned_by_runner_user(RUNNER_UID);
    job.event(
        "issue_comment",
        &comment_event(5, 1, "@fro-bot run the migration"),
    );
    let (job, killed) = signalled_during_the_command(&world, job, libc::SIGKILL).await;
    end_command(&job.workspace());
    assert_eq!(killed.code, 128 + libc::SIGKILL, "{}", explain(&killed));
    // A thread's first memory has no guard to wait for: post saves what the turn left.
    let (job, post) = post_step(job, killed).await;
    assert!(post.summary.contains("durable"), "{}", explain(&post));
    // Post told the thread before its save: what was kept is not known then.
    let told = world.github.comment_versions().last().cloned().unwrap();
    assert!(
        told.contains("What I did so far is not known to be kept in memory"),
        "{told}"
    );
    let (_, next, prompt) = follow_up(&world, job, 2111, &[Interruption::EarlierRun]).await;
    assert!(
        next.summary.contains(
            "| Turn cut short | repaired a turn cut short (an earlier workflow run was stopped): \
             the turn was kept; its last command's outcome is unknown |"
        ),
        "{}",
        next.summary
    );
    // Nothing recorded which run it was, or why it ended: the notice says so.
    assert_notice(
        &prompt,
        &[
            "cut short, in a run that is not recorded, started 20",
            "why it ended is not recorded",
        ],
    );
}

/// Every column of a session's row, its messages and its parts, in order: what another thread's
/// memory is, compared before and after.
fn tree_rows(db: &Path, session: &str) -> Vec<String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut out = Vec::new();
    for (table, key) in [
        ("session", "id"),
        ("message", "session_id"),
        ("part", "session_id"),
    ] {
        let mut stmt = c
            .prepare(&format!(
                "SELECT * FROM {table} WHERE {key} = ?1 ORDER BY id"
            ))
            .unwrap();
        let columns = stmt.column_count();
        let rows = stmt
            .query_map([session], |r| {
                let values: Vec<rusqlite::types::Value> =
                    (0..columns).map(|i| r.get(i)).collect::<Result<_, _>>()?;
                Ok(format!("{table}: {values:?}"))
            })
            .unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    assert!(out.len() >= 3, "a session with an exchange: {out:?}");
    out
}

/// What a cut turn must never leave: a call still `running`/`pending`, an answer not completed.
fn open_rows(db: &Path) -> (i64, i64) {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let count = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    (
        count(
            "SELECT count(*) FROM part WHERE json_extract(data, '$.state.status') \
             IN ('running', 'pending')",
        ),
        count(
            "SELECT count(*) FROM message WHERE json_extract(data, '$.role') = 'assistant' \
             AND json_extract(data, '$.time.completed') IS NULL",
        ),
    )
}

/// The memory guard's directories left in the job's `RUNNER_TEMP`.
fn guard_dirs(job: &Job) -> Vec<String> {
    std::fs::read_dir(job.root.path().join("runner_temp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fro-bot-memory-"))
        .collect()
}

/// Run `run_id` on issue 5 asks `question` and is answered and saved: the thread has memory to
/// resume. The job is ready for the next run; the thread's session id.
async fn thread_with_memory(
    world: &World,
    mut job: Job,
    run_id: u64,
    question: &str,
) -> (Job, String) {
    world.github.seed_issue(5, "Migrate", "Please migrate.");
    job.event("issue_comment", &comment_event(5, 1, question));
    world.llm.push(Reply::text("It renames the zebra column."));
    let (job, first) = main_step(job).await;
    assert_eq!(first.code, 0, "{}", explain(&first));
    let thread = first.output("session-id").to_string();
    let (mut job, _) = post_step(job, first).await;
    job.next_run(run_id + 1);
    (job, thread)
}

/// The main step, SIGKILLed at its kill point `point` (`runner::failpoint`).
async fn killed_at(mut job: Job, point: &str) -> (Job, StepResult) {
    job.set("FRO_BOT_FAILPOINT", point);
    let (mut job, killed) = main_step(job).await;
    job.env.remove("FRO_BOT_FAILPOINT");
    assert_eq!(killed.code, 128 + libc::SIGKILL, "{}", explain(&killed));
    (job, killed)
}

/// Run 1 on issue 5 and run 2 on issue 6, each answered and saved: thread A (issue 5) has memory
/// to resume, and thread B (issue 6) is another thread's memory. The job is ready for run 3; the
/// ids of A's and B's sessions, and B's rows.
async fn two_threads_with_memory(
    world: &World,
    job: Job,
    run_id: u64,
) -> (Job, String, String, Vec<String>) {
    world.github.seed_issue(6, "Other", "Something else.");
    let (mut job, thread_a) = thread_with_memory(
        world,
        job,
        run_id,
        "@fro-bot what will the migration change?",
    )
    .await;
    job.event(
        "issue_comment",
        &comment_event(6, 4, "@fro-bot hello there"),
    );
    world.llm.push(Reply::text("Hello from issue six."));
    let (job, second) = main_step(job).await;
    assert_eq!(second.code, 0, "{}", explain(&second));
    let thread_b = second.output("session-id").to_string();
    assert_ne!(thread_a, thread_b);
    let rows_b = tree_rows(&job.data_dir().join("opencode.db"), &thread_b);
    let (mut job, _) = post_step(job, second).await;
    job.next_run(run_id + 2);
    (job, thread_a, thread_b, rows_b)
}

/// The database as post left it, kept aside (the next run starts from an empty home).
fn keep_db(job: &Job, into: &Path) -> std::path::PathBuf {
    let kept = into.join("opencode.db");
    for suffix in ["", "-wal"] {
        let from = job.data_dir().join(format!("opencode.db{suffix}"));
        if from.exists() {
            std::fs::copy(&from, into.join(format!("opencode.db{suffix}"))).unwrap();
        }
    }
    kept
}

/// The usual case (docs/persistence.md#a-turn-cut-short): a thread with memory, its follow-up's
/// main step SIGKILLed while the agent's command runs. Post finishes what the memory guard started
/// from the copy main handed over: the turn is kept, its call repaired as killed; the next run
/// resumes it with the call shown as interrupted, the command run once, thread B untouched.
async fn a_killed_main_on_a_thread_with_memory_is_finished_by_post(
    launch: Launch,
    run_id: u64,
    store: bool,
) {
    let world = World::start_with(launch).await;
    let mut job = world.job(run_id);
    job.owned_by_runner_user(RUNNER_UID);
    if store {
        super::scenarios::with_s3(&mut job, &crate::support::s3::unique_prefix("e2e-killed"));
    }
    let (mut job, thread_a, thread_b, rows_b) = two_threads_with_memory(&world, job, run_id).await;
    job.event(
        "issue_comment",
        &comment_event(5, 3, "@fro-bot run the migration"),
    );
    let (job, killed) = signalled_during_the_command(&world, job, libc::SIGKILL).await;
    end_command(&job.workspace());
    assert_eq!(killed.code, 128 + libc::SIGKILL, "{}", explain(&killed));
    let left = crate::support::action::until_nothing_runs_in(&job.workspace()).await;
    assert!(left.is_empty(), "left running after the SIGKILL: {left:?}");
    assert_eq!(killed.state["memoryGuard"], "pending", "{:?}", killed.state);
    assert_eq!(killed.state["memoryOwn"], format!("[\"{thread_a}\"]"));
    let (job, post) = post_step(job, killed).await;
    assert_eq!(post.code, 0, "{}", explain(&post));
    let aside = tempfile::tempdir().unwrap();
    let db = keep_db(&job, aside.path());
    let (job, next, prompt) = follow_up(&world, job, run_id + 3, &[Interruption::Killed]).await;
    assert_notice(
        &prompt,
        &[
            format!(
                "The previous turn on this thread was cut short, in run {} (attempt 1), started 20",
                run_id + 2
            )
            .as_str(),
            ": the workflow run was killed; the call whose outcome is unknown (it was not run \
            again): ",
        ],
    );
    // Run 3 was told run 1's exchange, and (`follow_up`) run 2's question and its cut call.
    let sent = format!("{:#?}", world.llm.requests().last().unwrap()["messages"]);
    assert!(
        sent.contains("what will the migration change?")
            && sent.contains("It renames the zebra column."),
        "{sent}"
    );
    assert_eq!(next.output("session-id"), thread_a, "{}", explain(&next));
    assert!(
        post.summary.contains(&format!(
            "post did it from the copy the main step kept: memory is as restored plus this run's \
             conversation (`{thread_a}`); repaired a turn cut short (the workflow run was killed): \
             the turn was kept; its last command's outcome is unknown."
        )) && post.summary.contains("**durable**"),
        "{}",
        explain(&post)
    );
    // Post repaired it: the follow-up's restore found nothing left to repair.
    assert!(!next.summary.contains("Turn cut short"), "{}", next.summary);
    assert_eq!(open_rows(&db), (0, 0), "nothing left running or incomplete");
    assert_eq!(
        tree_rows(&db, &thread_b),
        rows_b,
        "thread B as it was, after post"
    );
    let saved = job.data_dir().join("opencode.db");
    assert_eq!(
        tree_rows(&saved, &thread_b),
        rows_b,
        "thread B as it was, after the follow-up"
    );
}

/// With the Actions cache alone; as the binary and from the action's image (`launched_scenarios`),
/// where main and post are separate containers that share only `RUNNER_TEMP` and the state.
pub(crate) async fn sigkill_during_a_command_on_a_thread_with_memory_is_finished_by_post_and_resumed(
    launch: Launch,
) {
    a_killed_main_on_a_thread_with_memory_is_finished_by_post(launch, 2120, false).await;
}

/// With the object store: post saves to the cache only, and the follow-up merges that newer entry
/// into the store's copy before the turn.
#[tokio::test]
async fn sigkill_during_a_command_on_a_thread_with_memory_is_finished_by_post_with_the_store() {
    a_killed_main_on_a_thread_with_memory_is_finished_by_post(Launch::Binary, 2130, true).await;
}

/// Main killed between the guard's copy and its put-back (its kill point after OpenCode stopped),
/// with another thread's rows rewritten meanwhile, as the agent could have (through OpenCode's
/// file tools, docs/security.md#what-it-leaves-behind): post's rebuild keeps this run's exchange
/// and puts thread B back as restored, then saves.
#[tokio::test]
async fn a_kill_between_the_guards_copy_and_its_put_back_is_finished_by_post_and_other_threads_put_back(
) {
    let world = World::start().await;
    let mut job = world.job(2140);
    job.owned_by_runner_user(RUNNER_UID);
    let (mut job, thread_a, thread_b, rows_b) = two_threads_with_memory(&world, job, 2140).await;
    job.event(
        "issue_comment",
        &comment_event(5, 3, "@fro-bot and the second step?"),
    );
    world
        .llm
        .push(Reply::text("The second step drops the old table."));
    let (job, killed) = killed_at(job, "run:after-shutdown").await;
    let db = job.data_dir().join("opencode.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    let changed = c
        .execute(
            "UPDATE part SET data = json_set(data, '$.text', 'EVIL rewritten') \
             WHERE session_id = ?1 AND json_extract(data, '$.type') = 'text'",
            [&thread_b],
        )
        .unwrap();
    c.execute(
        "UPDATE session SET title = 'EVIL title' WHERE id = ?1",
        [&thread_b],
    )
    .unwrap();
    drop(c);
    assert!(changed > 0);
    assert_ne!(tree_rows(&db, &thread_b), rows_b);
    let before = world.cache.entries().len();
    let (job, post) = post_step(job, killed).await;
    assert_eq!(post.code, 0, "{}", explain(&post));
    assert!(
        post.summary.contains(&format!(
            "the agent changed 1 conversation(s) other than this run's (`{thread_b}`): put back \
             as restored."
        )) && post.summary.contains("**durable**"),
        "{}",
        explain(&post)
    );
    assert_eq!(world.cache.entries().len(), before + 1, "post saved");
    assert_eq!(tree_rows(&db, &thread_b), rows_b, "thread B as restored");
    let a = tree_rows(&db, &thread_a).join("\n");
    assert!(
        a.contains("and the second step?") && a.contains("The second step drops the old table."),
        "this run's exchange is kept: {a}"
    );
    assert!(guard_dirs(&job).is_empty(), "{:?}", guard_dirs(&job));
}

/// Main killed before its put-back; the copy it handed over is then tampered with where the
/// agent's uid can reach it (`RUNNER_TEMP`): its directory swapped for a link to one the agent
/// made, then the copy itself changed. Post believes neither, says why, and saves nothing.
#[tokio::test]
async fn post_refuses_a_memory_guard_copy_that_is_not_the_one_main_recorded() {
    let world = World::start().await;
    let mut job = world.job(2150);
    job.owned_by_runner_user(RUNNER_UID);
    let (mut job, _) = thread_with_memory(&world, job, 2150, "@fro-bot what changes?").await;
    job.event("issue_comment", &comment_event(5, 2, "@fro-bot and then?"));
    world.llm.push(Reply::text("Then it drops the old table."));
    let (job, killed) = killed_at(job, "run:after-shutdown").await;
    let handoff: Value = serde_json::from_str(&killed.state["memoryHandoff"]).unwrap();
    let dir = std::path::PathBuf::from(handoff["dir"].as_str().unwrap());
    assert!(
        dir.starts_with(job.root.path().join("runner_temp")),
        "{dir:?}"
    );
    let before = world.cache.entries().len();
    // The agent's move: main's directory renamed, its own (with a forged copy) linked in its place.
    let moved = dir.with_extension("moved");
    let forged = job.root.path().join("runner_temp/forged");
    std::fs::rename(&dir, &moved).unwrap();
    std::fs::create_dir(&forged).unwrap();
    std::fs::copy(
        job.data_dir().join("opencode.db"),
        forged.join("opencode.db"),
    )
    .unwrap();
    crate::support::action::chown_r(&forged, RUNNER_UID);
    std::os::unix::fs::symlink(&forged, &dir).unwrap();
    let (job, killed, post) = post_again(job, killed).await;
    assert!(
        post.summary.contains(&format!(
            "Not saved: the main step was killed before it limited the agent's changes to memory \
             to its own conversation, and post could not do it: `{}` is a link, not the directory \
             the main step made; what the agent left is not saved.",
            dir.display()
        )),
        "{}",
        explain(&post)
    );
    assert!(moved.join("opencode.db").exists() && forged.join("opencode.db").exists());
    // Main's directory back in place, but the copy in it changed.
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    let mut copy = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("opencode.db"))
        .unwrap();
    std::io::Write::write_all(&mut copy, b"x").unwrap();
    let (_job, _killed, post) = post_again(job, killed).await;
    assert!(
        post.summary.contains(&format!(
            "and post could not do it: `{}` does not match the SHA-256 the main step recorded; \
             what the agent left is not saved.",
            dir.join("opencode.db").display()
        )),
        "{}",
        explain(&post)
    );
    assert_eq!(world.cache.entries().len(), before, "nothing saved");
    assert!(
        !dir.exists(),
        "post's own directory is removed once it is done"
    );
}

/// Post, on the same main state again.
async fn post_again(job: Job, main: StepResult) -> (Job, StepResult, StepResult) {
    tokio::task::spawn_blocking(move || {
        let r = job.post_step(&main);
        (job, main, r)
    })
    .await
    .unwrap()
}

/// Main killed after the guard's copy but before the prompt was sent (OpenCode just started): the
/// agent had no turn, memory is as restored, and post has nothing to save; the copy is removed.
#[tokio::test]
async fn a_main_killed_before_the_prompt_leaves_post_nothing_to_save() {
    let world = World::start().await;
    let mut job = world.job(2160);
    job.owned_by_runner_user(RUNNER_UID);
    let (mut job, _) = thread_with_memory(&world, job, 2160, "@fro-bot what changes?").await;
    job.event("issue_comment", &comment_event(5, 2, "@fro-bot and then?"));
    let (job, killed) = killed_at(job, "agent:started").await;
    assert_eq!(killed.state["memoryGuard"], "pending", "{:?}", killed.state);
    assert!(
        !killed.state.contains_key("memoryOwn"),
        "{:?}",
        killed.state
    );
    assert_eq!(guard_dirs(&job).len(), 1, "the copy, in post's reach");
    let before = world.cache.entries().len();
    let (job, post) = post_step(job, killed).await;
    assert!(
        post.summary.contains(
            "Nothing to do: the main step was killed before the agent's turn was sent, so memory \
             is as restored and the cache and the store keep it."
        ),
        "{}",
        explain(&post)
    );
    assert_eq!(world.cache.entries().len(), before, "nothing saved");
    assert!(guard_dirs(&job).is_empty(), "{:?}", guard_dirs(&job));
}

/// A thread with memory, its follow-up's main step SIGKILLed while the model streams its answer
/// (no call yet). Post keeps the turn: the question and an answer completed by the repair as
/// killed, beside the earlier exchange; the next run is told, resumes the thread and is answered.
#[tokio::test]
async fn sigkill_while_the_model_streams_on_a_thread_with_memory_keeps_the_question() {
    let world = World::start().await;
    let mut job = world.job(2180);
    job.owned_by_runner_user(RUNNER_UID);
    let (mut job, thread) = thread_with_memory(&world, job, 2180, "@fro-bot what changes?").await;
    job.event(
        "issue_comment",
        &comment_event(5, 2, "@fro-bot summarise the plan"),
    );
    world.llm.push(Reply::Stall);
    let mut running = job.spawn(&["run"], &[]);
    let until = Instant::now() + Duration::from_secs(120);
    let streaming = || {
        world
            .llm
            .requests()
            .iter()
            .any(|r| r.to_string().contains("summarise the plan"))
    };
    while !streaming() {
        assert!(
            Instant::now() < until && !running.exited(),
            "the answer never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.signal(libc::SIGKILL);
    let (job, killed) = tokio::task::spawn_blocking(move || {
        let r = job.finish(running);
        (job, r)
    })
    .await
    .unwrap();
    assert_eq!(killed.code, 128 + libc::SIGKILL, "{}", explain(&killed));
    let (mut job, post) = post_step(job, killed).await;
    assert!(post.summary.contains("**durable**"), "{}", explain(&post));
    let aside = tempfile::tempdir().unwrap();
    assert_eq!(open_rows(&keep_db(&job, aside.path())), (0, 0));
    job.next_run(2182);
    job.event(
        "issue_comment",
        &comment_event(5, 3, "@fro-bot are you done?"),
    );
    world
        .llm
        .push(Reply::text("Not yet; the plan has two steps."));
    let before = world.llm.requests().len();
    let (_, next) = main_step(job).await;
    assert_eq!(next.code, 0, "{}", explain(&next));
    assert_eq!(next.output("session-id"), thread, "{}", explain(&next));
    let prompt = this_runs_prompt(&world, before);
    assert!(
        prompt.contains("cut short, in run 2181 (attempt 1)")
            && prompt.contains("the workflow run was killed"),
        "{prompt}"
    );
    let sent = format!("{:#?}", world.llm.requests().last().unwrap()["messages"]);
    assert!(
        sent.contains("It renames the zebra column.") && sent.contains("summarise the plan"),
        "the earlier exchange and the cut question are kept: {sent}"
    );
}
