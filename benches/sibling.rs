//! Benchmark: what running the agent's commands in the sibling container costs
//! (docs/security.md#the-agents-network), each figure beside its baseline in the same run.
//!
//! 1. **A command's round trip**: the shell wrapper (`fro-bot --agent-shell=/bin/sh`) running
//!    `true`, N times, handing it to an exec relay (`fro-bot sibling-relay`, started here as root
//!    on a directory of its own) against the wrapper becoming the shell itself (the process path).
//!    Target: ≤ 20 ms added per command.
//! 2. **The turn's start**: the main step from the action's image with `agent-isolation: process`
//!    and with `auto` (the sibling), alternating, each until the model's first request. Target:
//!    ≤ 1 s added per turn.
//!
//! Run with `scripts/bench-sibling` (Docker, the image, the pinned OpenCode). Knobs:
//! FRO_BOT_BENCH_COMMANDS (default 100), FRO_BOT_BENCH_RUNS (default 3).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::action::{comment_event, explain, Job, Launch};
use support::cache_server::CacheServer;
use support::fake_github::FakeGitHub;
use support::fake_llm::{FakeLlm, Reply};

const COMMAND_TARGET: Duration = Duration::from_millis(20);
const TURN_TARGET: Duration = Duration::from_secs(1);

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs `script -c true` `n` times; the mean per command.
fn commands(script: &Path, n: u64, sibling: Option<&Path>) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        let mut c = Command::new(script);
        c.args(["-c", "true"])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(sock) = sibling {
            c.env("FRO_BOT_AGENT_SIBLING", sock);
        }
        let status = c.status().expect("the wrapper starts");
        assert!(status.success(), "the command failed: {status}");
    }
    t.elapsed() / n as u32
}

fn round_trip() {
    let n = env_num("FRO_BOT_BENCH_COMMANDS", 100);
    let relay = support::relay::Relay::start(65534, None).expect("the benchmark runs as root");
    let (script, exec) = (relay.wrapper(), relay.exec());
    // Warm both paths once, then alternate halves so drift hits both alike.
    commands(&script, 3, None);
    commands(&script, 3, Some(&exec));
    let (mut local, mut relayed) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        local.push(commands(&script, n / 2, None));
        relayed.push(commands(&script, n / 2, Some(&exec)));
    }
    drop(relay);
    let (local, relayed) = (median(local), median(relayed));
    let added = relayed.saturating_sub(local);
    println!(
        "command round trip ({n} × `true`): wrapper as the shell {:.2} ms, through the relay \
         {:.2} ms ({:.2}×): {:.2} ms added per command (target ≤ {} ms): {}",
        ms(local),
        ms(relayed),
        relayed.as_secs_f64() / local.as_secs_f64(),
        ms(added),
        COMMAND_TARGET.as_millis(),
        if added <= COMMAND_TARGET {
            "met"
        } else {
            "MISSED"
        }
    );
}

/// One main step from the image until the model's first request.
async fn turn_start(isolation: &str, run_id: u64) -> (Duration, String) {
    let cache = CacheServer::start().await;
    let llm = FakeLlm::start().await;
    let github = FakeGitHub::start().await;
    github.seed_issue(5, "Bench", "x");
    let mut job = Job::launched(run_id, Launch::container());
    for (k, v) in cache.env_pairs() {
        job.set(&k, v);
    }
    job.set("GITHUB_API_URL", github.url.clone());
    job.input("github-token", support::fake_github::TOKEN);
    job.input("opencode-config", llm.opencode_config().to_string());
    job.input("agent-isolation", isolation);
    job.owned_by_runner_user(1001);
    llm.push(Reply::tool(
        "bash",
        json!({"command": "true", "description": "x"}),
    ));
    llm.push(Reply::text("ok"));
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot go"));
    let t = Instant::now();
    let r = tokio::task::spawn_blocking(move || job.main_step())
        .await
        .unwrap();
    assert_eq!(r.code, 0, "{}", explain(&r));
    let first = llm
        .request_times()
        .first()
        .map(|at| *at - t)
        .expect("asked");
    let started = r
        .stdout
        .split("with no network (started in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("-")
        .to_string();
    (first, started)
}

async fn turn() {
    let runs = env_num("FRO_BOT_BENCH_RUNS", 3);
    let (mut process, mut sibling, mut starts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        process.push(turn_start("process", 7000 + 2 * i).await.0);
        let (t, started) = turn_start("auto", 7001 + 2 * i).await;
        sibling.push(t);
        starts.push(started);
    }
    let (p, s) = (median(process), median(sibling));
    let added = s.saturating_sub(p);
    println!(
        "turn start (image, step start → the model's first request, median of {runs}): process \
         {:.0} ms, sibling {:.0} ms ({:.2}×): {:.0} ms added per turn (target ≤ {} ms): {}; the \
         sibling's own start (log): {} ms",
        ms(p),
        ms(s),
        s.as_secs_f64() / p.as_secs_f64(),
        ms(added),
        TURN_TARGET.as_millis(),
        if added <= TURN_TARGET {
            "met"
        } else {
            "MISSED"
        },
        starts.join(", ")
    );
}

#[tokio::main]
async fn main() {
    round_trip();
    turn().await;
}
