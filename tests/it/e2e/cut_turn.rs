//! A turn cut short, through the built binary (docs/persistence.md#a-turn-cut-short): the cut
//! run's own cleanup repairs a turn fro-bot stopped, and the next run's restore repairs a turn a
//! killed run left; either way the follow-up shows the model the cut call as interrupted with an
//! unknown outcome, and the command ran once. The cut run says what was kept; the follow-up's
//! prompt tells the agent, in one fenced paragraph, that the previous turn was cut short
//! (docs/persistence.md#the-next-run-knows), and a run after an answered turn says nothing of it.

use std::path::Path;
use std::time::{Duration, Instant};

use fro_bot::memory::repair::{call_error, Interruption};
use serde_json::{json, Value};

use super::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job, StepResult};
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
/// words of the repair that `reason` names; the command ran once. Returns its result and the
/// prompt it gave.
async fn follow_up(
    world: &World,
    mut job: Job,
    run_id: u64,
    reason: Interruption,
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
    assert_eq!(tool[0]["content"], call_error(reason), "{shown}");
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
    let (job, next, prompt) = follow_up(&world, job, 2101, Interruption::Cancelled).await;
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
    let (_, _, prompt) = follow_up(&world, job, 2102, Interruption::Cancelled).await;
    // (The thread's own comments, quoted as context, still say it was.)
    assert!(
        !prompt.contains("## The previous turn was cut short")
            && !prompt.contains("what memory records of the previous turn"),
        "{prompt}"
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
    let (_, next, prompt) = follow_up(&world, job, 2111, Interruption::EarlierRun).await;
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
