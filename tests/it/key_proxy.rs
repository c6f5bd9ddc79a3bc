//! The key proxy (`src/confine/key_proxy.rs`) in front of the scripted fake LLM: the real key is
//! added, the agent's own credential never reaches the provider, streams pass through as they
//! arrive, and no path reaches another host.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use fro_bot::confine::key_proxy::{KeyProxy, KeyProxyPlan, PLACEHOLDER_KEY};
use fro_bot::runner::Env;

use crate::support::fake_llm::{FakeLlm, Reply};

async fn proxied(llm: &FakeLlm) -> (KeyProxy, String) {
    let user: Map<String, Value> = serde_json::from_value(json!({"provider": {"fake": {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": llm.base_url(), "apiKey": "sk-real-key"}}}}))
    .unwrap();
    let plan = KeyProxyPlan::new(&Map::new(), Some(&user), &Env::default());
    let proxy = KeyProxy::start(plan.routes.clone()).await.unwrap();
    let base = proxy.base_url("fake");
    (proxy, base)
}

fn chat() -> Value {
    json!({"model": "fake-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn the_real_key_replaces_the_agents_and_streams_pass_through_unbuffered() {
    let llm = FakeLlm::start().await;
    let (_proxy, base) = proxied(&llm).await;
    let http = reqwest::Client::new();
    llm.push(Reply::text("hello through the proxy"));
    let body = http
        .post(format!("{base}/chat/completions"))
        .bearer_auth(PLACEHOLDER_KEY)
        .header("x-api-key", "agent-supplied")
        .json(&chat())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("hello through"), "{body}");
    assert_eq!(llm.auth_headers(), [Some("Bearer sk-real-key".to_string())]);

    // A stream that never ends: its first chunk still arrives at once.
    llm.push(Reply::Stall);
    let resp = http
        .post(format!("{base}/chat/completions"))
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the first chunk is not held back")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("Thinking"));
}

#[tokio::test]
async fn no_path_or_provider_leads_anywhere_else() {
    let llm = FakeLlm::start().await;
    let (proxy, base) = proxied(&llm).await;
    let http = reqwest::Client::new();
    for path in [
        format!("{base}/../../other/v1/chat/completions"),
        format!("{base}/%2e%2e/x"),
        format!("{base}//evil.example/v1/chat/completions"),
        proxy.base_url("unknown") + "/chat/completions",
        base.replace("/p/fake", "/elsewhere"),
    ] {
        let resp = http.post(&path).json(&chat()).send().await.unwrap();
        assert!(
            matches!(resp.status().as_u16(), 400 | 404),
            "{path}: {}",
            resp.status()
        );
    }
    assert!(llm.requests().is_empty(), "nothing was forwarded");
}
