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

/// An agent that says something, runs a command, and asks again, forever; each answer reports
/// 1,000 prompt tokens.
fn looping_agent(world: &World) {
    world.llm.set_usage(1000, 10);
    world.llm.set_default(Reply::Narrated {
        text: "Still digging into the flake.".into(),
        call: Box::new(bash("echo again")),
    });
}

/// Asserts a capped run: its partial answer and the cap's line posted, memory saved, the model
/// asked no more after the cap.
fn assert_capped(world: &World, r: &StepResult, line: &[&str]) {
    assert_eq!(r.code, 1, "{}", explain(r));
    assert_eq!(r.output("outcome"), "capped", "{}", explain(r));
    assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(r));
    let text = answer(world);
    assert!(text.contains("Still digging into the flake."), "{text}");
    for said in line {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    assert!(r.summary.contains("Spend cap"), "{}", r.summary);
    assert!(
        world.llm.requests().len() < 10,
        "stopped at the cap, not by the timeout: {} requests",
        world.llm.requests().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_agent_is_stopped_at_max_tokens_with_its_partial_answer_posted_and_memory_saved()
{
    let world = World::start().await;
    looping_agent(&world);
    let r = run(&world, 21, &[("max-tokens", "3000")]).await;
    assert_capped(
        &world,
        &r,
        &["stopped at the token cap: ", " of 3000 tokens"],
    );
    let tokens: serde_json::Value = serde_json::from_str(r.output("tokens")).unwrap();
    let spent = tokens["input"].as_u64().unwrap() + tokens["output"].as_u64().unwrap();
    assert!(
        (3000..6000).contains(&spent),
        "counted at the proxy, the stopped turn included: {tokens}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_agent_is_stopped_at_max_cost_priced_from_opencodes_model_list() {
    let world = World::start().await;
    looping_agent(&world);
    // $100 per million prompt tokens: $0.10 an answer.
    let mut config = world.llm.opencode_config();
    config["provider"]["fake"]["models"]["fake-model"]["cost"] =
        serde_json::json!({"input": 100, "output": 0});
    let config = config.to_string();
    let r = run(
        &world,
        22,
        &[("max-cost", "0.25"), ("opencode-config", &config)],
    )
    .await;
    assert_capped(&world, &r, &["stopped at the spend cap: $", " of $0.25"]);
    let cost: f64 = r.output("cost").parse().unwrap();
    assert!((0.25..0.6).contains(&cost), "cost {cost}");
    assert!(r.summary.contains("of $0.25 — reached"), "{}", r.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_shell_cannot_reach_the_model_around_the_key_proxy() {
    let world = World::start().await;
    let port = world
        .llm
        .base_url()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let direct = format!(
        "(exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'POST /v1/chat/completions HTTP/1.0\\r\\nContent-Type: application/json\\r\\nContent-Length: 15\\r\\n\\r\\n{{\"direct\":true}}' >&3 && cat <&3) 2>&1; echo \"exit=$?\""
    );
    world.llm.push(bash(&direct));
    world.llm.push(Reply::text("Tried."));
    let r = run(&world, 23, &[("max-tokens", "100000")]).await;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    let asked = world.llm.requests();
    assert!(
        asked.iter().all(|b| b.get("direct").is_none()),
        "the shell's request reached the model"
    );
    let result = crate::support::fake_llm::request_text(asked.last().unwrap());
    assert!(result.contains("exit=1"), "{result}");
    assert!(!result.contains("chatcmpl"), "{result}");
}

/// A looping agent whose first step writes `notes.txt`; the threat check's answers report 50,000
/// prompt tokens, so its spend shows apart from the agent's (1,010 an answer).
fn looping_writer(world: &World) {
    looping_agent(world);
    world.llm.set_judge_usage(50_000, 7);
    world.llm.push(Reply::Narrated {
        text: "Still digging into the flake.".into(),
        call: Box::new(bash("echo new > notes.txt")),
    });
}

/// The run's `tokens` output, input and output added.
fn tokens_of(r: &StepResult) -> u64 {
    let tokens: serde_json::Value = serde_json::from_str(r.output("tokens")).unwrap();
    tokens["input"].as_u64().unwrap() + tokens["output"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_turns_change_goes_through_the_threat_check_whose_request_is_counted_never_refused(
) {
    let world = World::start().await;
    looping_writer(&world);
    let r = run(&world, 31, &[("max-tokens", "3000")]).await;
    assert_capped(
        &world,
        &r,
        &["stopped at the token cap: ", " of 3000 tokens"],
    );
    assert_eq!(r.output("changes"), "delivered", "{}", explain(&r));
    let files = world.github.branch_files("fro-bot/issue-31");
    assert_eq!(
        files.get("notes.txt").map(Vec::as_slice),
        Some(&b"new\n"[..])
    );
    assert_eq!(
        world.llm.judge_requests().len(),
        1,
        "judged after the cap, not refused by it"
    );
    let spent = tokens_of(&r);
    assert!(
        (53_000..56_000).contains(&spent),
        "the threat check's 50,007 tokens counted with the agent's: {spent}"
    );
    assert!(
        r.summary
            .contains(&format!("{spent} of 3000 tokens — reached")),
        "the summary's spend is the outputs': {}",
        r.summary
    );
    assert!(
        r.stdout.contains("::error::") && r.stdout.contains("stopped at the token cap"),
        "the cap is an error annotation: {}",
        r.stdout
    );

    // A change the model check flags is held, capped or not.
    looping_writer(&world);
    world.llm.push_verdict(Reply::text(
        r#"{"prompt_injection": false, "secret_leak": false, "malicious_patch": true, "reasons": ["notes.txt is suspicious"]}"#,
    ));
    let r = run(&world, 32, &[("max-tokens", "3000")]).await;
    assert_eq!(r.output("outcome"), "capped", "{}", explain(&r));
    assert_eq!(r.output("changes"), "held", "{}", explain(&r));
    assert!(world.github.branch_head("fro-bot/issue-32").is_none());
    assert!(answer(&world).contains("notes.txt is suspicious"));
}

/// An agent that answers twice with a command (1,010 tokens each), then stalls in an answer whose
/// first chunk reports 1,010 more (which OpenCode never counts: the answer never completes); its
/// first command writes `notes.txt`.
fn two_steps_then_stall(world: &World) {
    world.llm.set_usage(1000, 10);
    world.llm.push(bash("echo new > notes.txt"));
    world.llm.push(bash("echo again"));
    world.llm.push(Reply::StallReporting);
}

/// The proxy's count: the two answers and the stalled one's reported start (OpenCode's own count,
/// from the messages it completed, holds the first two only).
const COUNTED_AT_THE_PROXY: u64 = 3 * 1010;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_turn_reports_what_the_proxy_counted_and_delivers_nothing() {
    let world = World::start().await;
    two_steps_then_stall(&world);
    let r = run(&world, 41, &[("timeout", "6000")]).await;
    assert_eq!(
        (r.code, r.output("outcome")),
        (1, "timed-out"),
        "{}",
        explain(&r)
    );
    assert_eq!(
        tokens_of(&r),
        COUNTED_AT_THE_PROXY,
        "{}",
        r.output("tokens")
    );
    assert_eq!(
        r.output("changes"),
        "none",
        "a timed-out turn proposes nothing"
    );
    assert!(world.github.branch_head("fro-bot/issue-41").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_reports_what_the_proxy_counted() {
    use std::time::{Duration, Instant};
    let world = World::start().await;
    two_steps_then_stall(&world);
    let job = issue_job(&world, 42, &[]);
    let running = job.spawn(&["run"], &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while world.llm.requests().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the turn never reached its stall"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.signal(libc::SIGTERM);
    let r = tokio::task::spawn_blocking(move || job.finish(running))
        .await
        .unwrap();
    assert_eq!(r.output("outcome"), "cancelled", "{}", explain(&r));
    assert_eq!(
        tokens_of(&r),
        COUNTED_AT_THE_PROXY,
        "{}",
        r.output("tokens")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_shows_the_spend_against_both_caps_and_names_a_model_with_no_price() {
    let world = World::start().await;
    world.llm.set_usage(1000, 10);
    world.llm.push(Reply::text("Here is what I found."));
    let r = run(
        &world,
        51,
        &[("max-cost", "1.00"), ("max-tokens", "100000")],
    )
    .await;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    let spent = tokens_of(&r);
    assert!(spent >= 1010, "{spent}");
    let row = format!(
        "| Spend cap | $0.0000 of $1.00, {spent} of 100000 tokens — not reached; no price known for fake/fake-model (counted by tokens only) |"
    );
    assert!(r.summary.contains(&row), "{row:?} not in:\n{}", r.summary);
}
