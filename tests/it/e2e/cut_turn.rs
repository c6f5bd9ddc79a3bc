//! A turn cut short, through the built binary (docs/persistence.md#a-turn-cut-short): the cut
//! run's own cleanup repairs a turn fro-bot stopped, and the next run's restore repairs a turn a
//! killed run left; either way the follow-up shows the model the cut call as interrupted with an
//! unknown outcome, and the command ran once.

use std::path::Path;
use std::time::{Duration, Instant};

use fro_bot::memory::repair::{call_error, Interruption};
use serde_json::{json, Value};

use super::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job, StepResult};
use crate::support::fake_llm::Reply;

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

/// The follow-up run on the thread: the model is told the cut call's outcome is unknown, in the
/// words of the repair that `reason` names; the command ran once.
async fn follow_up(world: &World, mut job: Job, run_id: u64, reason: Interruption) -> StepResult {
    job.next_run(run_id);
    job.event(
        "issue_comment",
        &comment_event(5, 2, "@fro-bot did the migration finish?"),
    );
    world.llm.push(Reply::text("It did not finish; I checked."));
    let (job, next) = main_step(job).await;
    assert_eq!(next.code, 0, "{}", explain(&next));
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
    next
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
            "| Turn cut short | repaired a turn cut short (the workflow run was cancelled): 1 call \
             with unknown outcome |"
        ),
        "{}",
        cut.summary
    );
    let next = follow_up(&world, job, 2101, Interruption::Cancelled).await;
    assert!(!next.summary.contains("Turn cut short"), "{}", next.summary);
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
    let next = follow_up(&world, job, 2111, Interruption::EarlierRun).await;
    assert!(
        next.summary.contains(
            "| Turn cut short | repaired a turn cut short (an earlier workflow run was stopped): \
             1 call with unknown outcome |"
        ),
        "{}",
        next.summary
    );
}
