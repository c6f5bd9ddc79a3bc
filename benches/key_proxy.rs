//! Benchmark: the key proxy's cost. The scripted fake LLM streams a long answer (16-byte deltas,
//! one SSE event each — a "token" here); the same requests go straight to it and through
//! `fro-bot`'s key proxy (`src/confine/key_proxy.rs`), alternating, and both rates are printed side
//! by side with the time to the first event. Knobs: FRO_BOT_BENCH_TOKENS (events per answer,
//! default 4000), FRO_BOT_BENCH_RUNS (requests per path, default 20).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use fro_bot::confine::key_proxy::{KeyProxy, KeyProxyPlan};
use fro_bot::runner::Env;
use support::fake_llm::{FakeLlm, Reply};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One streamed answer: (events, time to first event, total).
async fn one(http: &reqwest::Client, base: &str) -> (usize, Duration, Duration) {
    let t0 = Instant::now();
    let resp = http
        .post(format!("{base}/chat/completions"))
        .bearer_auth("k")
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "go"}]}),
        )
        .send()
        .await
        .expect("request");
    let mut stream = resp.bytes_stream();
    let (mut events, mut first) = (0, None);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        first.get_or_insert_with(|| t0.elapsed());
        events += chunk.windows(6).filter(|w| w == b"data: ").count();
    }
    (events, first.unwrap_or_default(), t0.elapsed())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let tokens = env_num("FRO_BOT_BENCH_TOKENS", 4000);
        let runs = env_num("FRO_BOT_BENCH_RUNS", 20);
        let llm = FakeLlm::start().await;
        llm.set_default(Reply::text("x".repeat(16 * tokens)));
        let user: Map<String, Value> = serde_json::from_value(json!({"provider": {"fake": {
            "options": {"baseURL": llm.base_url(), "apiKey": "sk-bench"}}}}))
        .expect("object");
        let plan = KeyProxyPlan::new(&Map::new(), Some(&user), &Env::default());
        let proxy = KeyProxy::start(plan.routes.clone()).await.expect("proxy");
        let http = reqwest::Client::new();
        let paths = [
            ("direct", llm.base_url()),
            ("proxy", proxy.base_url("fake")),
        ];
        // Warm-up: connections, allocations.
        for (_, base) in &paths {
            one(&http, base).await;
        }
        let mut totals = [(0usize, Duration::ZERO, Duration::ZERO); 2];
        for _ in 0..runs {
            for (i, (_, base)) in paths.iter().enumerate() {
                let (e, first, total) = one(&http, base).await;
                totals[i].0 += e;
                totals[i].1 += first;
                totals[i].2 += total;
            }
        }
        println!("key proxy: {runs} streamed answers of ~{tokens} events each, per path");
        println!(
            "{:<8} {:>14} {:>16} {:>14}",
            "path", "events/s", "first event ms", "answer ms"
        );
        let mut rates = Vec::new();
        for (i, (name, _)) in paths.iter().enumerate() {
            let (e, first, total) = totals[i];
            let rate = e as f64 / total.as_secs_f64();
            rates.push(rate);
            println!(
                "{name:<8} {rate:>14.0} {:>16.2} {:>14.2}",
                first.as_secs_f64() * 1000.0 / runs as f64,
                total.as_secs_f64() * 1000.0 / runs as f64
            );
        }
        println!("proxy/direct throughput: {:.2}", rates[1] / rates[0]);
    });
}
