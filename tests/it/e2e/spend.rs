//! What a run reports of how it ended and what it spent (issue 45): the `outcome` output on the main
//! paths, an empty answer that says what the turn did (and, with `fail-on-empty`, fails the step),
//! and the spend caps the key proxy enforces — through the real OpenCode and the scripted model.

use super::changes::{answer, bash};
use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, Job, StepResult};
use crate::support::fake_llm::Reply;

const RUNNER_UID: u32 = 1001;

/// A job on issue `n` of the fake GitHub's repository, its checkout the runner user's.
fn issue_job(world: &World, n: u64, inputs: &[(&str, &str)]) -> Job {
    world.github.seed_issue(n, "Look into it", "Please.");
    let mut job = world.job(4500 + n);
    job.set("GITHUB_SERVER_URL", world.github.url.clone());
    job.owned_by_runner_user(RUNNER_UID);
    for (k, v) in inputs {
        job.input(k, *v);
    }
    world.github.seed_git_repo(&job.workspace());
    job.event(
        "issue_comment",
        &comment_event(n, 700 + n, "@fro-bot look into it"),
    );
    job
}

async fn run(world: &World, n: u64, inputs: &[(&str, &str)]) -> StepResult {
    main_step(issue_job(world, n, inputs)).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_says_what_the_turn_did_sets_outcome_empty_and_fails_only_with_fail_on_empty(
) {
    let world = World::start().await;
    world.llm.push(bash("echo looked"));
    world.llm.push(bash("ls"));
    world.llm.push(Reply::text(""));
    let r = run(&world, 1, &[]).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(r.output("outcome"), "empty", "{}", explain(&r));
    let text = answer(&world);
    for said in [
        "without a written answer",
        "ran 2 tool call(s) (`bash` ×2)",
        "changes: none: the agent changed no file",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }

    world.llm.push(Reply::text(""));
    let r = run(&world, 2, &[("fail-on-empty", "true")]).await;
    assert_eq!(r.code, 1, "{}", explain(&r));
    assert_eq!(r.output("outcome"), "empty");
    assert!(r.stdout.contains("::error::") && r.stdout.contains("fail-on-empty"));
    assert!(answer(&world).contains("ran no tool"), "{}", answer(&world));
    assert_eq!(
        r.output("cache-save-result"),
        "durable",
        "memory is saved either way"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outcome_output_names_how_each_main_path_ended() {
    let world = World::start().await;
    world.llm.push(Reply::text("Here is what I found."));
    let r = run(&world, 11, &[]).await;
    assert_eq!(
        (r.code, r.output("outcome")),
        (0, "answered"),
        "{}",
        explain(&r)
    );

    world.llm.push(bash("echo new > notes.txt"));
    world.llm.push(Reply::text("Wrote the notes."));
    let r = run(&world, 12, &[]).await;
    assert_eq!(r.output("changes"), "delivered", "{}", explain(&r));
    assert_eq!(r.output("outcome"), "delivered");

    world.llm.push(Reply::Stall);
    let r = run(&world, 13, &[("timeout", "3000")]).await;
    assert_eq!(
        (r.code, r.output("outcome")),
        (1, "timed-out"),
        "{}",
        explain(&r)
    );

    world
        .llm
        .push(Reply::Error(crate::support::fake_llm::LlmError::Auth));
    let r = run(&world, 14, &[]).await;
    assert_eq!((r.code, r.output("outcome")), (1, "failed"));

    let r = run(&world, 15, &[("skip-cache", "maybe")]).await;
    assert_eq!((r.code, r.output("outcome")), (1, "failed"));

    let mut job = issue_job(&world, 16, &[]);
    job.event("issue_comment", &comment_event(16, 716, "no mention here"));
    let (_job, r) = main_step(job).await;
    assert_eq!((r.code, r.output("outcome")), (0, "skipped"));
}
