//! The budget across runs (issue 45 item 2; docs/design.md#the-budget-across-runs):
//! `max-daily-cost` and `max-runs-per-user-per-hour`, counted from the spend ledger kept with
//! memory — through the real OpenCode, the scripted model reporting usage, the cache test server
//! and, for the exact budget, SeaweedFS.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use super::changes::answer;
use super::scenarios::{main_step, with_s3, World};
use crate::support::action::{comment_event, explain, Job, StepResult};
use crate::support::fake_llm::Reply;
use fro_bot::cache::{Backend, RestoreOutcome, RestoreRequest};
use fro_bot::memory::state_paths::{parse_marker, MarkerCheck, StatePaths};
use fro_bot::runner::Env;

const KEY: &str = "opencode-storage-octo-hello-main-Linux";

/// The scripted model, priced at $100 per million prompt tokens, each answer reporting 1,000:
/// $0.10 a model request (the title's included).
fn priced(world: &World) -> String {
    world.llm.set_usage(1000, 0);
    let mut config = world.llm.opencode_config();
    config["provider"]["fake"]["models"]["fake-model"]["cost"] = json!({"input": 100, "output": 0});
    config.to_string()
}

/// Run `run` on issue `issue`, asked by `actor`, at the fixed root (every run sees the same
/// paths, so each restores what the others saved), with the store when `prefix` is given.
fn job(world: &World, run: u64, issue: u64, actor: &str, inputs: &[(&str, &str)]) -> Job {
    world.github.seed_issue(issue, "Look into it", "Please.");
    let mut job = world.job(run);
    job.at_fixed_root();
    for (k, v) in inputs {
        job.input(k, *v);
    }
    let mut event = comment_event(issue, 9000 + run, "@fro-bot look into it");
    event["comment"]["user"]["login"] = json!(actor);
    event["sender"]["login"] = json!(actor);
    job.event("issue_comment", &event);
    job
}

fn store(job: &mut Job, prefix: Option<&str>) {
    if let Some(prefix) = prefix {
        with_s3(job, prefix);
    }
}

/// A run the budget refused: answered on the thread with `said`, no model request (the agent never
/// started), nothing saved, `outcome` over-budget, and the summary says why.
fn assert_refused(world: &World, r: &StepResult, asked_before: (usize, usize), said: &[&str]) {
    assert_eq!(r.code, 0, "{}", explain(r));
    assert_eq!(r.output("outcome"), "over-budget", "{}", explain(r));
    let asked = (world.llm.requests().len(), world.llm.title_requests());
    assert_eq!(asked, asked_before, "the agent started");
    assert_eq!(r.output("cache-save-result"), "skipped", "{}", explain(r));
    let text = answer(world);
    for said in said.iter().chain(&["I did not start the agent."]) {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    assert!(r.summary.contains("Not run: "), "{}", r.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_a_spent_daily_budget_is_answered_without_starting_the_agent() {
    let world = World::start().await;
    let config = priced(&world);
    let inputs = [
        ("opencode-config", config.as_str()),
        ("max-daily-cost", "0.35"),
        ("max-cost", "0.30"),
    ];
    world
        .llm
        .push(Reply::text("The flake is the cache timeout."));
    let r = main_step(job(&world, 4501, 1, "mona", &inputs)).await.1;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    let cost: f64 = r.output("cost").parse().unwrap();
    assert!((0.09..0.25).contains(&cost), "cost {cost}");
    assert!(r.summary.contains("Budget"), "{}", r.summary);

    // What is left of the day ($0.35 less what run 1 spent) cannot hold another run's $0.30.
    let asked = (world.llm.requests().len(), world.llm.title_requests());
    let r = main_step(job(&world, 4502, 2, "mona", &inputs)).await.1;
    assert_refused(
        &world,
        &r,
        asked,
        &[
            "The daily budget of this repository is spent; it resets at ",
            " 00:00 UTC (in ",
            " of $0.35 (`max-daily-cost`); a run may spend up to $0.30 (`max-cost`)",
        ],
    );
    assert!(
        r.summary.contains("the daily budget is spent; resets at"),
        "{}",
        r.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_user_hourly_limit_refuses_that_users_next_run_and_not_anothers() {
    let world = World::start().await;
    let inputs = [("max-runs-per-user-per-hour", "1")];
    world.llm.push(Reply::text("First."));
    let r = main_step(job(&world, 4511, 11, "mona", &inputs)).await.1;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));

    let asked = (world.llm.requests().len(), world.llm.title_requests());
    let r = main_step(job(&world, 4512, 12, "mona", &inputs)).await.1;
    assert_refused(
        &world,
        &r,
        asked,
        &[
            "@mona has started 1 run(s) in the last hour",
            "; it resets at ",
        ],
    );

    world.llm.push(Reply::text("Another user's answer."));
    let r = main_step(job(&world, 4513, 13, "hubot", &inputs)).await.1;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    assert!(
        r.summary.contains("@hubot: 1 of 1 run(s) this hour"),
        "{}",
        r.summary
    );
}

/// Two runs started together with the store, on different threads (the thread turn does not order
/// them), with a budget that fits one: one passes and holds its share under the lease, the other
/// is refused while the first still runs (the model holds the first's answer until the other has
/// ended). Without the store's ledger both would pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_runs_with_the_store_cannot_both_pass_a_budget_that_fits_one() {
    let world = World::start().await;
    let config = priced(&world);
    let prefix = crate::support::s3::unique_prefix("e2e-budget");
    let ended = Arc::new(AtomicUsize::new(0));
    let seen = ended.clone();
    world
        .llm
        .hold_while(move |_, _| seen.load(Ordering::SeqCst) == 0);
    world.llm.set_default(Reply::text("Looked into it."));
    let inputs = [
        ("opencode-config", config.as_str()),
        ("max-daily-cost", "0.40"),
        ("max-cost", "0.25"),
    ];
    let mut steps = Vec::new();
    for (run, issue) in [(4521, 21), (4522, 22)] {
        let mut job = job(&world, run, issue, "mona", &inputs);
        store(&mut job, Some(&prefix));
        let ended = ended.clone();
        steps.push(tokio::spawn(async move {
            let r = main_step(job).await.1;
            ended.fetch_add(1, Ordering::SeqCst);
            r
        }));
    }
    let mut results = Vec::new();
    for step in steps {
        results.push(step.await.unwrap());
    }
    let outcomes: Vec<&str> = results.iter().map(|r| r.output("outcome")).collect();
    let refused = results
        .iter()
        .filter(|r| r.output("outcome") == "over-budget");
    assert_eq!(
        refused.count(),
        1,
        "{outcomes:?}\n{}\n{}",
        explain(&results[0]),
        explain(&results[1])
    );
    assert!(outcomes.contains(&"answered"), "{outcomes:?}");
    let refused = results
        .iter()
        .find(|r| r.output("outcome") == "over-budget")
        .unwrap();
    assert!(
        refused.summary.contains("held by 1 run(s) under way"),
        "{}",
        refused.summary
    );
    assert!(
        refused
            .summary
            .contains("exact: counted under the object store's lease"),
        "{}",
        refused.summary
    );

    // The store's ledger: the run that passed, settled at what the key proxy counted.
    let ledger = store_ledger(&prefix).await;
    let lines = ledger.as_array().unwrap();
    assert_eq!(lines.len(), 1, "{ledger}");
    assert_eq!(lines[0]["actor"], "mona");
    assert!(lines[0].get("running").is_none(), "settled: {ledger}");
    assert!(lines[0]["cost"].as_f64().unwrap() > 0.05, "{ledger}");
}

async fn store_ledger(prefix: &str) -> Value {
    let store = crate::support::s3::connect(&crate::support::s3::settings(prefix)).await;
    let keys = fro_bot::object_store::StoreKeys::new(prefix, "octo", "hello").unwrap();
    match store.get_bytes(&keys.spend_ledger()).await.unwrap() {
        fro_bot::object_store::GetOutcome::Found(body) => {
            serde_json::from_slice(&body.bytes).unwrap()
        }
        fro_bot::object_store::GetOutcome::NotFound => panic!("the store holds no spend ledger"),
    }
}

/// The newest cache entry's marker (what the next run restores), its `spend`.
async fn saved_ledger(world: &World) -> Vec<Value> {
    let mut job = Job::new(0);
    job.at_fixed_root();
    let paths = StatePaths::new(job.step_path(&job.data_dir()));
    let backend = Backend::from_env(&Env::from_pairs(world.cache.env_pairs())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let request = RestoreRequest {
        key: KEY,
        restore_keys: &[format!("{KEY}-")],
        paths: paths.restore_targets(),
        workspace: &job.step_workspace(),
        into: Some(dir.path()),
    };
    let found = backend.restore(&request).await.unwrap();
    assert!(matches!(found, RestoreOutcome::Hit { .. }), "{found:?}");
    let text = std::fs::read_to_string(dir.path().join("fro-bot.json")).unwrap();
    let MarkerCheck::Compatible(marker) = parse_marker(&text) else {
        panic!("unreadable marker: {text}");
    };
    marker
        .spend
        .and_then(|s| s.as_array().cloned())
        .unwrap_or_default()
}

/// Replaces the `spend` of the marker a finished job left, and plants its memory as the newest
/// cache entry (run `run`'s): a restored ledger anyone with cache write access could have shaped.
fn plant_ledger(world: &World, job: &Job, run: u64, spend: Value) {
    let paths = StatePaths::new(job.data_dir());
    let mut marker: Value =
        serde_json::from_slice(&std::fs::read(paths.marker()).unwrap()).unwrap();
    marker["spend"] = spend;
    std::fs::write(paths.marker(), marker.to_string()).unwrap();
    let archive = job.home().join("planted.tzst");
    fro_bot::cache::write_archive(paths.cache_paths(), &job.workspace(), &archive).unwrap();
    let version =
        fro_bot::cache::version(StatePaths::new(job.step_path(&job.data_dir())).cache_paths());
    world
        .cache
        .plant(&format!("{KEY}-{run}-1-agent"), &version, &archive);
}

fn now_ms() -> u64 {
    fro_bot::runner::now_ms()
}

fn line(run: &str, actor: &str, at: u64, cost: Value) -> Value {
    json!({"run": run, "actor": actor, "at": at, "cost": cost, "tokens": 1})
}

/// Two runs overlap without the store (each restores before the other saves): the entry saved
/// last holds both runs' lines, joined by the cache merge, and the lines of earlier runs too —
/// but not a line from two days ago, pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_survives_a_cache_merge_and_is_pruned_past_its_window() {
    let world = World::start().await;
    world.llm.push(Reply::text("Setting up."));
    let (first, r) = main_step(job(&world, 4530, 30, "mona", &[])).await;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    let old = now_ms() - 2 * 24 * 3_600_000;
    let spend = json!([
        line("4000-1", "old", old, json!(1.0)),
        line("4529-1", "today", now_ms() - 1000, json!(0.02))
    ]);
    plant_ledger(&world, &first, 4529, spend);

    world.llm.hold_while(|_, all| all.len() < 3);
    world.llm.set_default(Reply::text("Looked into it."));
    let mut steps = Vec::new();
    for (run, issue, actor) in [(4531, 31, "mona"), (4532, 32, "hubot")] {
        let job = job(&world, run, issue, actor, &[]);
        steps.push(tokio::spawn(async move { main_step(job).await.1 }));
    }
    for step in steps {
        let r = step.await.unwrap();
        assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(&r));
    }
    let saved = saved_ledger(&world).await;
    let runs: Vec<&str> = saved.iter().filter_map(|l| l["run"].as_str()).collect();
    for run in ["4529-1", "4531-1-agent", "4532-1-agent"] {
        assert!(
            runs.iter().any(|r| r.starts_with(run)),
            "{run} not in {runs:?}"
        );
    }
    assert!(!runs.contains(&"4000-1"), "not pruned: {runs:?}");
    assert!(
        saved.iter().all(|l| l.get("running").is_none()),
        "{saved:?}"
    );
    let text = serde_json::to_string(&saved).unwrap();
    assert!(
        !text.contains("look into it") && !text.contains("sk-"),
        "{text}"
    );
}

/// A restored ledger shaped to lift the budget (a negative cost, a cost that is no number, an
/// absurd one, a line dated next year) among 6,000 lines: what cannot be believed is left out and
/// said, the believable spend still counts (the run is refused), and nothing crashes. A ledger
/// that is no list is counted from zero, and said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_restored_ledger_neither_crashes_nor_lifts_the_budget_silently() {
    let world = World::start().await;
    world.llm.push(Reply::text("Setting up."));
    let (first, r) = main_step(job(&world, 4540, 40, "mona", &[])).await;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    let now = now_ms();
    let mut spend: Vec<Value> = (0..6000)
        .map(|i| line(&format!("flood-{i}"), "flood", now - 600_000 + i, json!(0)))
        .collect();
    spend.extend([
        line("spent", "mona", now - 1000, json!(0.20)),
        line("negative", "mona", now - 1000, json!(-1000.0)),
        line("nan", "mona", now - 1000, json!("NaN")),
        line("absurd", "mona", now - 1000, json!(1e300)),
        line("next-year", "mona", now + 365 * 24 * 3_600_000, json!(0.0)),
        json!("a string"),
    ]);
    plant_ledger(&world, &first, 4539, Value::Array(spend));
    let inputs = [("max-daily-cost", "0.25"), ("max-cost", "0.10")];
    let asked = (world.llm.requests().len(), world.llm.title_requests());
    let r = main_step(job(&world, 4541, 41, "mona", &inputs)).await.1;
    assert_refused(&world, &r, asked, &["Today: $0.20 spent of $0.25"]);
    for said in [
        "5 line(s) that cannot be believed",
        "a time in the future: 1",
        "the newest 5000 were kept",
    ] {
        assert!(r.stdout.contains(said), "{said:?} not in:\n{}", r.stdout);
    }

    plant_ledger(&world, &first, 4542, json!({"not": "a list"}));
    world.llm.push(Reply::text("Counted from zero."));
    let r = main_step(job(&world, 4543, 43, "mona", &inputs)).await.1;
    assert_eq!(r.output("outcome"), "answered", "{}", explain(&r));
    assert!(
        r.stdout.contains(
            "::warning::the spend ledger in memory is not a list: it was counted from zero"
        ),
        "{}",
        r.stdout
    );
    assert!(r.summary.contains("counted from zero"), "{}", r.summary);
}
