//! GitHub's published API descriptions as the fake GitHub's judge: every request the fake serves is
//! asked of the checker `scripts/test` starts (tests/it/fixtures/github_schema.mjs, over the pinned
//! `@octokit/openapi` and `@octokit/graphql-schema`): the route and method must exist, a JSON body
//! must validate against the operation's request schema, a GraphQL document against the schema with
//! deprecated fields counted as failures. A request GitHub would refuse fails the test that made it.

use serde_json::{json, Value};

/// What the checker says of one request: `Err` names what GitHub's description does not allow.
/// `FRO_BOT_TEST_GITHUB_SCHEMA=off` (the benchmarks: a timed run asks nothing extra) checks nothing.
pub async fn check(enterprise: bool, method: &str, path: &str, body: &Value) -> Result<(), String> {
    let site = if enterprise { "ghes" } else { "github.com" };
    ask(json!({"site": site, "method": method, "path": path, "body": body})).await
}

/// Whether the fake's answer to a request has GitHub's types where it has a field GitHub's
/// description lists (fields may be left out: the fake answers what fro-bot reads).
pub async fn check_answer(
    enterprise: bool,
    method: &str,
    path: &str,
    status: u16,
    body: &Value,
) -> Result<(), String> {
    let site = if enterprise { "ghes" } else { "github.com" };
    ask(
        json!({"kind": "response", "site": site, "method": method, "path": path,
               "status": status, "body": body}),
    )
    .await
}

/// Whether an event payload has the types of GitHub's webhook description for `event`/`action`.
pub async fn check_webhook(event: &str, action: Option<&str>, body: &Value) -> Result<(), String> {
    ask(json!({"kind": "webhook", "event": event, "action": action, "body": body})).await
}

async fn ask(request: Value) -> Result<(), String> {
    let base = crate::support::services::github_schema_url();
    if base == "off" {
        return Ok(());
    }
    let url = format!("{base}/check");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("no HTTP client for the GitHub description checker: {e}"))?;
    let answer: Value = client
        .post(&url)
        .json(&request)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("the GitHub description checker at {url} is unreachable: {e}"))?
        .json()
        .await
        .map_err(|e| format!("the GitHub description checker answered no JSON: {e}"))?;
    match answer["ok"].as_bool() {
        Some(true) => Ok(()),
        _ => Err(answer["why"]
            .as_str()
            .unwrap_or("no reason given")
            .to_string()),
    }
}
