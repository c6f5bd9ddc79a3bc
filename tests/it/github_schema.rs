//! The fake GitHub is held to GitHub's own API descriptions (`support::github_schema`): the checker
//! refuses what GitHub would, and the suite's event payloads have the types of GitHub's webhook
//! descriptions.

use serde_json::{json, Value};

use crate::support::github_schema::{check, check_answer, check_webhook};

#[tokio::test]
async fn the_checker_refuses_what_githubs_description_does_not_allow() {
    let comment = json!({"body": "hi"});
    let ok = check(false, "POST", "/repos/o/r/issues/1/comments", &comment).await;
    assert_eq!(ok, Ok(()));
    let refused = [
        ("GET", "/repos/o/r/no-such-route", Value::Null, "no route"),
        (
            "PUT",
            "/repos/o/r/issues/1/comments",
            Value::Null,
            "not an operation",
        ),
        (
            "POST",
            "/repos/o/r/issues/1/comments",
            json!({"bdy": "x"}),
            "required property 'body'",
        ),
    ];
    for (method, path, body, said) in refused {
        let why = check(false, method, path, &body).await.unwrap_err();
        assert!(why.contains(said), "{method} {path}: {why}");
    }
    // The deprecated 32-bit id, and a 64-bit id given where GraphQL says `Int`.
    let deprecated = json!({"query": "query { repository(owner: \"o\", name: \"r\") { pullRequest(number: 1) { reviewThreads(first: 1) { nodes { comments(first: 1) { nodes { databaseId } } } } } } }"});
    let why = check(false, "POST", "/graphql", &deprecated)
        .await
        .unwrap_err();
    assert!(why.contains("fullDatabaseId"), "{why}");
    let wide = json!({"query": "query($n: Int!) { repository(owner: \"o\", name: \"r\") { pullRequest(number: $n) { id } } }",
                      "variables": {"n": 9_000_000_001_u64}});
    let why = check(false, "POST", "/graphql", &wide).await.unwrap_err();
    assert!(why.contains("32-bit"), "{why}");
    // An answer: a field may be left out, one that is there has GitHub's type.
    let path = "/repos/o/r/issues/comments/5";
    let partial = json!({"id": 5, "body": "hi"});
    assert_eq!(
        check_answer(false, "GET", path, 200, &partial).await,
        Ok(())
    );
    let as_text = json!({"id": "5", "body": "hi"});
    let why = check_answer(false, "GET", path, 200, &as_text)
        .await
        .unwrap_err();
    assert!(why.contains("/id must be integer"), "{why}");
    // Enterprise Server is held to its own description.
    let caches = check(true, "GET", "/repos/o/r/actions/caches", &Value::Null).await;
    assert_eq!(caches, Ok(()));
}

/// `{event}[.{action}[.variant]].json`
fn event_of(file: &std::path::Path) -> (String, Option<String>) {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let mut parts = name.trim_end_matches(".json").split('.');
    let event = parts.next().unwrap().to_string();
    (event, parts.next().map(str::to_string))
}

#[tokio::test]
async fn the_suites_event_payloads_have_githubs_webhook_types() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/github");
    let mut payloads = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().path();
        let (event, action) = event_of(&file);
        // A schedule's payload is the runner's own (`{"schedule": cron}`), not a webhook.
        if event == "schedule" {
            continue;
        }
        let body: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        payloads.push((file.display().to_string(), event, action, body));
    }
    assert!(payloads.len() >= 10, "{payloads:?}");
    let built = [
        (
            "comment_event",
            "issue_comment",
            crate::support::action::comment_event(1, 2, "@fro-bot hi"),
        ),
        (
            "pull_comment",
            "issue_comment",
            crate::e2e::changes::pull_comment(3, 4, "@fro-bot hi"),
        ),
    ];
    for (name, event, body) in built {
        payloads.push((name.into(), event.into(), Some("created".into()), body));
    }
    let mut wrong = Vec::new();
    for (name, event, action, body) in &payloads {
        if let Err(why) = check_webhook(event, action.as_deref(), body).await {
            wrong.push(format!("{name}: {why}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The check can fail: a comment id as text is not GitHub's type.
    let mut forged = payloads[0].3.clone();
    forged["sender"]["id"] = json!("1");
    let why = check_webhook(&payloads[0].1, payloads[0].2.as_deref(), &forged).await;
    assert!(why.is_err(), "{why:?}");
}
