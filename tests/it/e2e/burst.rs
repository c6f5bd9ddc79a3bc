//! Same-thread bursts on a brand-new thread with the Actions cache alone (docs/persistence.md
//! #both-runs-continued-one-session, "a new thread mentioned at once"): three mentions whose runs
//! overlap, each starting the thread's first session, ordered by holds on the scripted model and
//! on the cache service into the order of saves that once lost an exchange. Each is answered
//! once, and a follow-up sees every question once, followed by its own answer. The real OpenCode,
//! the scripted model, the cache test server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::concurrent::{
    codeword, codeword_job, follow_up_remembers_every_codeword, CODEWORD_ISSUE,
};
use super::scenarios::{main_step, World};
use crate::support::action::{explain, StepResult};
use crate::support::cache_server::{Entry, Held, FINALIZE};
use crate::support::fake_llm::{request_text, Reply};

/// Mention `i`'s first save key.
fn first_key(i: u64) -> String {
    format!(
        "opencode-storage-octo-hello-main-Linux-{}-1-agent",
        6000 + i
    )
}

fn has(entries: &[Entry], key: &str, committed: bool) -> bool {
    entries
        .iter()
        .any(|e| e.key == key && (e.finalized || !committed))
}

/// Whether a call of the cache service is about mention 0's or 1's first entry.
fn first_of_the_two(body: &serde_json::Value) -> bool {
    [first_key(0), first_key(1)]
        .iter()
        .any(|k| body["key"] == k.as_str())
}

/// The mention whose codeword a request asks about last (its newest user message).
fn asking(body: &serde_json::Value) -> Option<u64> {
    let last = body["messages"].as_array()?.last()?.to_string();
    (0..3).find(|&i| last.contains(&codeword(i)))
}

/// Starts mention `i` (its question names its codeword).
fn mention(world: &World, i: u64) -> tokio::task::JoinHandle<StepResult> {
    let body = format!("@fro-bot remember the codeword {}", codeword(i));
    let job = codeword_job(world, i, &body, None);
    tokio::spawn(async move { main_step(job).await.1 })
}

fn answered_and_saved(i: u64, r: &StepResult) {
    assert_eq!(r.code, 0, "mention {i}: {}", explain(r));
    assert_eq!(
        r.output("cache-save-result"),
        "durable",
        "mention {i}: {}",
        explain(r)
    );
    for line in r.summary.lines().filter(|l| l.contains("Concurrent runs")) {
        println!("mention {i}: {line}");
    }
}

/// Three mentions on a new issue, every run restoring before any saves (each starts the thread's
/// own first session), each turn a command and an answer, all answered after the last asked (the
/// turns interleave in time). Mentions 0 and 1 save at the same moment: each lists the entries before
/// the other's is committed, and each commits before the other looks again, so each sees the
/// other's entry only after its own save. Mention 2 saves after both have finished, merging every
/// entry they left. Each is answered once, and a follow-up sees all three exchanges.
#[tokio::test]
async fn three_new_thread_runs_two_saving_at_once_keep_every_exchange() {
    let world = World::start().await;
    world
        .github
        .seed_issue(CODEWORD_ISSUE, "Codewords", "Remember what I say.");
    // Each turn runs a command, then answers: its second step is created after the others asked,
    // so in OpenCode's order the three turns interleave.
    world.llm.set_default(Reply::Stepwise {
        first: Box::new(Reply::tool(
            "bash",
            serde_json::json!({"command": "true", "description": "look around"}),
        )),
        then: Box::new(Reply::Echo {
            containing: "-narwhal".into(),
        }),
    });
    let two_done = Arc::new(AtomicBool::new(false));
    let done = two_done.clone();
    // Nobody answers before all three asked; mention 2 only once 0 and 1 have finished.
    world.llm.hold_while(move |request, all| {
        let all_asked = (0..3).all(|i| all.iter().any(|r| request_text(r).contains(&codeword(i))));
        !all_asked || (asking(request) == Some(2) && !done.load(Ordering::SeqCst))
    });
    // 0's and 1's first commits wait until both reserved their keys (both listed the entries
    // before either committed), and answer only once both are committed.
    world
        .cache
        .hold_while(FINALIZE, Held::Before, |body, entries| {
            first_of_the_two(body)
                && !(has(entries, &first_key(0), false) && has(entries, &first_key(1), false))
        });
    world
        .cache
        .hold_while(FINALIZE, Held::After, |body, entries| {
            first_of_the_two(body)
                && !(has(entries, &first_key(0), true) && has(entries, &first_key(1), true))
        });
    let mut runs = Vec::new();
    for i in 0..3 {
        runs.push(mention(&world, i));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let third = runs.pop().unwrap();
    for (i, run) in (0..).zip(runs) {
        answered_and_saved(i, &run.await.unwrap());
    }
    two_done.store(true, Ordering::SeqCst);
    answered_and_saved(2, &third.await.unwrap());
    world.llm.release_holds();
    // 0 and 1 each saved once more, for the other's exchange; nobody saved again only to name
    // another of the thread's sessions for exchanges it already held.
    let mut keys: Vec<String> = world.cache.entries().into_iter().map(|e| e.key).collect();
    keys.sort();
    let mut expected = vec![first_key(0), first_key(1), first_key(2)];
    expected.extend([format!("{}-2", first_key(0)), format!("{}-2", first_key(1))]);
    expected.sort();
    assert_eq!(keys, expected);
    follow_up_remembers_every_codeword(&world, None).await;
}
