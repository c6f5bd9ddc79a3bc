//! Concurrent runs (docs/design.md#concurrent-runs): runs on different threads overlap, every one
//! is answered, and a follow-up on every thread resumes its own conversation — with the object
//! store and without it. The real OpenCode, the scripted model, the cache test server and SeaweedFS.

use super::scenarios::{main_step, with_s3, World};
use crate::support::action::{comment_event, explain, StepResult};
use crate::support::fake_llm::request_text;

const FIRST_ISSUE: u64 = 20;

fn word(i: u64) -> String {
    format!("zebra-{i}-okapi")
}

/// `n` runs, one per issue, all at once; then a follow-up on each, one after the other.
async fn overlapping_threads_all_resume(n: u64, prefix: Option<&str>) {
    let world = World::start().await;
    for i in 0..n {
        world
            .github
            .seed_issue(FIRST_ISSUE + i, &format!("Thread {i}"), "Body.");
    }
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut job = world.job(3000 + i);
        job.at_fixed_root();
        if let Some(prefix) = prefix {
            with_s3(&mut job, prefix);
        }
        let body = format!("@fro-bot remember the word {}", word(i));
        job.event(
            "issue_comment",
            &comment_event(FIRST_ISSUE + i, 500 + i, &body),
        );
        runs.spawn(async move { (i, main_step(job).await.1) });
        stagger().await;
    }
    let mut sessions = vec![String::new(); n as usize];
    let mut notes = Vec::new();
    while let Some(joined) = runs.join_next().await {
        let (i, r): (u64, StepResult) = joined.unwrap();
        assert_eq!(r.code, 0, "run {i}: {}", explain(&r));
        assert_eq!(
            r.output("cache-save-result"),
            "durable",
            "run {i}: {}",
            explain(&r)
        );
        sessions[i as usize] = r.output("session-id").to_string();
        notes.extend(
            r.summary
                .lines()
                .filter(|l| l.contains("Concurrent runs"))
                .map(str::to_string),
        );
    }
    let answered = world.github.created_comments();
    for i in 0..n {
        let thread = format!("issue-{}", FIRST_ISSUE + i);
        assert_eq!(
            answered.iter().filter(|(t, _)| *t == thread).count(),
            1,
            "{thread} answered once: {answered:?}"
        );
    }
    println!("{n} overlapping runs: {} concurrency note(s)", notes.len());
    for note in &notes {
        println!("  {note}");
    }
    // The follow-ups overlap too; each asks in words of its own, to find its request.
    let mut follow_ups = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut job = world.job(4000 + i);
        job.at_fixed_root();
        if let Some(prefix) = prefix {
            with_s3(&mut job, prefix);
        }
        job.event(
            "issue_comment",
            &comment_event(FIRST_ISSUE + i, 600 + i, &question(i)),
        );
        follow_ups.spawn(async move { (i, main_step(job).await.1) });
        stagger().await;
    }
    while let Some(joined) = follow_ups.join_next().await {
        let (i, r): (u64, StepResult) = joined.unwrap();
        assert_eq!(r.code, 0, "follow-up {i}: {}", explain(&r));
        assert_eq!(r.output("cache-status"), "hit", "{}", explain(&r));
        assert_eq!(
            r.output("session-id"),
            sessions[i as usize],
            "follow-up {i} resumes its own session: {}",
            explain(&r)
        );
    }
    let requests = world.llm.requests();
    for i in 0..n {
        // The request whose newest message is this question (others may quote it as prior work).
        let asked = requests
            .iter()
            .find(|body| {
                let last = body["messages"].as_array().and_then(|m| m.last());
                last.is_some_and(|m| m.to_string().contains(&question(i)))
            })
            .map(request_text)
            .unwrap_or_else(|| panic!("follow-up {i} reached the model"));
        assert!(
            asked.contains(&format!("remember the word {}", word(i))),
            "follow-up {i} sees its thread's first exchange"
        );
    }
}

/// Starts are spread a little: sixteen OpenCode servers starting in the same second on two cores
/// outlast its 60 s startup deadline. Each run still overlaps the next several (a run takes far
/// longer than the spacing), which is what matters: they restore before the others save.
async fn stagger() {
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
}

fn question(i: u64) -> String {
    format!("@fro-bot which word was it on thread {i}?")
}

#[tokio::test]
async fn two_overlapping_runs_without_the_store_are_answered_and_both_threads_resume() {
    overlapping_threads_all_resume(2, None).await;
}

#[tokio::test]
async fn two_overlapping_runs_with_the_store_are_answered_and_both_threads_resume() {
    let prefix = crate::support::s3::unique_prefix("e2e-concurrent2");
    overlapping_threads_all_resume(2, Some(&prefix)).await;
}

#[tokio::test]
async fn sixteen_overlapping_runs_without_the_store_are_answered_and_every_thread_resumes() {
    overlapping_threads_all_resume(16, None).await;
}

#[tokio::test]
async fn sixteen_overlapping_runs_with_the_store_are_answered_and_every_thread_resumes() {
    let prefix = crate::support::s3::unique_prefix("e2e-concurrent16");
    overlapping_threads_all_resume(16, Some(&prefix)).await;
}
