//! The fake GitHub's review endpoints (`support::fake_review`) against GitHub's documented
//! behaviour: real git's diff, reviews that become threads, the 422 that names no comment and
//! creates nothing, replies, resolution and outdated threads.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::action::{fresh_checkout, git};
use crate::support::fake_github::{FakeGitHub, TOKEN};
use crate::support::fake_review::{RESOLVE_MUTATION, THREADS_QUERY};

const PR: u64 = 7;
const BRANCH: &str = "feature";

/// `src.txt` on main: lines `one` to `twenty`.
const WORDS: [&str; 20] = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

fn lines(words: &[&str]) -> String {
    words.iter().map(|w| format!("{w}\n")).collect()
}

/// The feature branch's `src.txt`: `three` becomes `THREE`, `NEW` follows `four`, `seventeen`
/// is gone. Two hunks: old 1-7 / new 1-8, and old 14-20 / new 15-20.
fn feature_text() -> String {
    let mut w: Vec<&str> = WORDS.to_vec();
    w[2] = "THREE";
    w.insert(4, "NEW");
    w.retain(|l| *l != "seventeen");
    lines(&w)
}

struct Api {
    http: reqwest::Client,
    base: String,
    graphql: String,
}

impl Api {
    fn new(fake: &FakeGitHub) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: format!("{}/repos/octo/hello", fake.api_url()),
            graphql: fake.graphql_url(),
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// (status, content type, body) with an `Accept` header.
    async fn get_as(&self, path: &str, accept: &str) -> (u16, String, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let kind = response.headers()["content-type"].to_str().unwrap().into();
        (status, kind, response.text().await.unwrap())
    }

    async fn graphql(&self, query: &str, variables: Value) -> Value {
        let body = json!({"query": query, "variables": variables});
        let response = self.http.post(&self.graphql).bearer_auth(TOKEN).json(&body);
        response.send().await.unwrap().json().await.unwrap()
    }

    async fn threads(&self) -> Value {
        let vars = json!({"owner": "octo", "name": "hello", "number": PR, "cursor": null});
        let answer = self.graphql(THREADS_QUERY, vars).await;
        answer["data"]["repository"]["pullRequest"]["reviewThreads"].clone()
    }
}

/// A fake serving a repository whose pull request 7 (by mona) changes `src.txt` in two hunks.
async fn seeded(tmp: &Path) -> FakeGitHub {
    let checkout = tmp.join("checkout");
    fresh_checkout(&checkout, "hello\n");
    std::fs::write(checkout.join("src.txt"), lines(&WORDS)).unwrap();
    git(&checkout, &["add", "."]);
    git(&checkout, &["commit", "-q", "-m", "src"]);
    let fake = FakeGitHub::start().await;
    fake.seed_git_repo(&checkout);
    fake.add_commit_on_branch(BRANCH, "src.txt", feature_text());
    fake.seed_pull_on_branch(PR, BRANCH, false);
    fake
}

/// Real git's `git diff <merge-base> <head>` in the fake's bare repository.
fn git_diff(fake: &FakeGitHub, base: &str, head: &str) -> String {
    let run = |args: &[&str]| {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(fake.bare_repo_path())
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let merge_base = run(&["merge-base", base, head]);
    run(&["diff", "--no-color", merge_base.trim(), head])
}

fn comment(path: &str, line: u64, extra: Value) -> Value {
    let mut c = json!({"path": path, "line": line, "body": format!("on {line}")});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

/// The diff media type answers real git's diff, the JSON one the JSON; the head commit.
async fn assert_diffs(fake: &FakeGitHub, api: &Api) -> String {
    let head = fake.branch_head(BRANCH).unwrap();
    let want = git_diff(fake, "main", BRANCH);
    assert!(
        want.contains("+THREE\n") && want.contains("-seventeen\n"),
        "{want}"
    );
    let plain = "text/plain; charset=utf-8".to_string();
    let pull = api.get_as("/pulls/7", "application/vnd.github.diff").await;
    assert_eq!(pull, (200, plain.clone(), want.clone()));
    let compare = "/compare/main...feature";
    let cmp = api.get_as(compare, "application/vnd.github.v3.diff").await;
    assert_eq!(cmp, (200, plain, want));
    assert_eq!(api.get(compare).await.1["status"], "ahead");
    assert_eq!(api.get("/pulls/7").await.1["head"]["sha"], head.as_str());
    let unknown = format!("/compare/main...{}", "1".repeat(40));
    let (status, _, body) = api.get_as(&unknown, "application/vnd.github.diff").await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["message"],
        "Not Found"
    );
    head
}

#[tokio::test]
async fn diffs_are_real_gits_and_a_valid_review_becomes_its_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = seeded(tmp.path()).await;
    let api = Api::new(&fake);
    let head = assert_diffs(&fake, &api).await;

    let comments = json!([
        comment("src.txt", 3, json!({"side": "RIGHT"})),
        comment("src.txt", 5, json!({"start_line": 2})),
        comment("src.txt", 17, json!({"side": "LEFT"})),
    ]);
    let review = json!({"commit_id": head, "body": "Looks close", "event": "COMMENT",
                        "comments": comments});
    let (status, created) = api.post("/pulls/7/reviews", review).await;
    assert_eq!(
        (status, &created["state"]),
        (200, &json!("COMMENTED")),
        "{created}"
    );
    let id = created["id"].as_u64().unwrap();
    let url = format!("https://github.com/octo/hello/pull/7#pullrequestreview-{id}");
    assert_eq!(created["html_url"], url.as_str());
    assert_eq!(created["node_id"], format!("PRR_{id}").as_str());
    assert_eq!(
        created["user"],
        json!({"login": "github-actions[bot]", "type": "Bot"})
    );
    assert_eq!(
        api.get("/pulls/7/reviews").await.1,
        json!([created.clone()])
    );
    assert_eq!(fake.reviews(PR), [created]);

    let (_, listed) = api.get("/pulls/7/comments?per_page=2&page=2").await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let (_, listed) = api.get("/pulls/7/comments").await;
    let placed: Vec<(Value, Value, Value)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["line"].clone(),
                c["start_line"].clone(),
                c["side"].clone(),
            )
        })
        .collect();
    let want = [
        (3, Value::Null, "RIGHT"),
        (5, json!(2), "RIGHT"),
        (17, Value::Null, "LEFT"),
    ];
    let want: Vec<(Value, Value, Value)> = want
        .iter()
        .map(|(l, s, d)| (json!(l), s.clone(), json!(d)))
        .collect();
    assert_eq!(placed, want);
    assert_eq!(listed[0]["pull_request_review_id"], id);
    assert!(listed[0].get("in_reply_to_id").is_none());
    assert!(listed[0]["diff_hunk"]
        .as_str()
        .unwrap()
        .ends_with("\n+THREE"));

    let threads = api.threads().await;
    assert_eq!(threads["pageInfo"]["hasNextPage"], false);
    let nodes = threads["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[1]["startLine"], 2);
    assert_eq!(nodes[2]["diffSide"], "LEFT");
    assert!(nodes
        .iter()
        .all(|n| n["isOutdated"] == false && n["isResolved"] == false));
    let first = &nodes[0]["comments"]["nodes"][0];
    assert_eq!(first["author"]["login"], "github-actions");
    // `fullDatabaseId` is a `BigInt`: a string, the REST id's digits (past 2³¹ here, as on
    // github.com).
    assert_eq!(first["fullDatabaseId"], listed[0]["id"].to_string());
    assert!(listed[0]["id"].as_u64().unwrap() > i32::MAX as u64);
    assert!(first.get("databaseId").is_none());
    assert_eq!(fake.review_threads(PR).len(), 3);
}

#[tokio::test]
async fn a_refused_review_gets_githubs_422_naming_no_comment_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = seeded(tmp.path()).await;
    let api = Api::new(&fake);
    let refused = |message: &str| {
        json!({"message": "Unprocessable Entity", "errors": [message],
               "documentation_url":
                   "https://docs.github.com/rest/pulls/reviews#create-a-review-for-a-pull-request",
               "status": "422"})
    };
    let line = "Pull request review thread line must be part of the diff";
    let review = |comments: Value| json!({"body": "b", "event": "COMMENT", "comments": comments});
    let cases = [
        // Line 12 is between the hunks: in the file, not in the diff.
        (
            json!([
                comment("src.txt", 3, json!({})),
                comment("src.txt", 12, json!({})),
                comment("src.txt", 5, json!({}))
            ]),
            line,
        ),
        (
            json!([comment("src.txt", 16, json!({"start_line": 5}))]),
            "Pull request review thread start line must be part of the same hunk as the line.",
        ),
        (
            json!([comment("README.md", 1, json!({}))]),
            "Path could not be resolved",
        ),
        (json!([comment("src.txt", 21, json!({}))]), line),
    ];
    for (comments, message) in &cases {
        let (status, body) = api.post("/pulls/7/reviews", review(comments.clone())).await;
        assert_eq!((status, body), (422, refused(message)), "{comments}");
    }
    let commit = json!({"commit_id": "1".repeat(40), "body": "b", "event": "COMMENT"});
    let answer = api.post("/pulls/7/reviews", commit).await;
    assert_eq!(answer, (422, refused("Commit could not be resolved")));
    let blank = json!({"body": "", "event": "REQUEST_CHANGES"});
    let answer = api.post("/pulls/7/reviews", blank).await;
    assert_eq!(answer, (422, refused("Review body can't be blank")));

    fake.reject_review_comments_on("src.txt");
    let valid = review(json!([comment("src.txt", 3, json!({}))]));
    let answer = api.post("/pulls/7/reviews", valid.clone()).await;
    assert_eq!(answer, (422, refused(line)));
    assert_eq!(
        (fake.reviews(PR).len(), fake.review_threads(PR).len()),
        (0, 0)
    );
    assert_eq!(api.get("/pulls/7/comments").await.1, json!([]));
    assert_eq!(api.post("/pulls/7/reviews", valid).await.0, 200);
    assert_eq!(fake.review_threads(PR).len(), 1);

    // Pull request 7 is mona's: her own token may not approve it.
    fake.set_user("mona");
    let approve = json!({"event": "APPROVE"});
    let answer = api.post("/pulls/7/reviews", approve.clone()).await;
    assert_eq!(
        answer,
        (422, refused("Can not approve your own pull request"))
    );
    assert_eq!(api.post("/pulls/8/reviews", approve).await.0, 404);
    assert_eq!(fake.review_posts().len(), cases.len() + 6);
    assert_eq!(fake.reviews(PR).len(), 1);
}

#[tokio::test]
async fn replies_resolution_and_outdated_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = seeded(tmp.path()).await;
    let api = Api::new(&fake);
    let (human, human_comment) =
        fake.seed_review_thread(PR, "src.txt", 3, "RIGHT", "octocat", "Why caps?", false);
    let review = json!({"event": "COMMENT", "body": "",
                        "comments": [comment("src.txt", 15, json!({}))]});
    assert_eq!(api.post("/pulls/7/reviews", review).await.0, 200);

    let path = format!("/pulls/7/comments/{human_comment}/replies");
    let (status, reply) = api.post(&path, json!({"body": "For emphasis"})).await;
    assert_eq!(
        (status, &reply["in_reply_to_id"]),
        (201, &json!(human_comment))
    );
    assert_eq!(reply["path"], "src.txt");
    assert_eq!(
        fake.review_replies(),
        [(human_comment, "For emphasis".to_string())]
    );
    assert_eq!(api.post(&path, json!({"body": ""})).await.0, 422);
    let elsewhere = format!("/pulls/7/comments/{}/replies", human_comment + 1000);
    assert_eq!(api.post(&elsewhere, json!({"body": "x"})).await.0, 404);

    let resolve = |thread: &str| json!({"thread": thread});
    fake.fail_graphql("resolveReviewThread", Some(1));
    let failed = api.graphql(RESOLVE_MUTATION, resolve(&human)).await;
    assert!(failed["errors"][0]["message"].is_string(), "{failed}");
    let done = api.graphql(RESOLVE_MUTATION, resolve(&human)).await;
    let want =
        json!({"data": {"resolveReviewThread": {"thread": {"id": human, "isResolved": true}}}});
    assert_eq!(done, want);
    let unknown = api.graphql(RESOLVE_MUTATION, resolve("PRRT_nope")).await;
    assert_eq!(unknown["data"], json!({"resolveReviewThread": null}));
    let error = &unknown["errors"][0];
    assert_eq!(
        (&error["type"], &error["path"]),
        (&json!("NOT_FOUND"), &json!(["resolveReviewThread"]))
    );
    let message = "Could not resolve to a node with the global id of 'PRRT_nope'";
    assert_eq!(error["message"], message);
    assert_eq!(fake.resolved_threads(), std::slice::from_ref(&human));

    let threads = api.threads().await;
    let nodes = &threads["nodes"];
    assert_eq!(
        (&nodes[0]["id"], &nodes[0]["isResolved"]),
        (&json!(human), &json!(true))
    );
    let authors: Vec<&Value> = nodes[0]["comments"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["author"]["login"])
        .collect();
    assert_eq!(authors, [&json!("octocat"), &json!("github-actions")]);

    // A new commit rewrites line 3: the human's thread is outdated, line 15's is not.
    let mut text = feature_text().replacen("THREE\n", "Three\n", 1);
    text.push_str("twenty-one\n");
    fake.add_commit_on_branch(BRANCH, "src.txt", text);
    let threads = api.threads().await;
    let nodes = &threads["nodes"];
    assert_eq!(
        (&nodes[0]["isOutdated"], &nodes[0]["line"]),
        (&json!(true), &Value::Null)
    );
    assert_eq!(
        (&nodes[1]["isOutdated"], &nodes[1]["line"]),
        (&json!(false), &json!(15))
    );
    let (_, listed) = api.get("/pulls/7/comments").await;
    assert_eq!(
        (&listed[0]["line"], &listed[0]["original_line"]),
        (&Value::Null, &json!(3))
    );

    let vars = json!({"owner": "octo", "name": "hello", "number": 99, "cursor": null});
    let missing = api.graphql(THREADS_QUERY, vars).await;
    assert_eq!(
        missing["data"],
        json!({"repository": {"pullRequest": null}})
    );
    assert_eq!(missing["errors"][0]["type"], "NOT_FOUND");
    // A document GitHub's schema does not have is refused before the fake reads it, and named.
    let other = api
        .graphql("query { reviewThreads { nodes { id } } }", json!({}))
        .await;
    let said = other["message"].as_str().unwrap_or_default();
    assert!(said.contains("not in GitHub's API description"), "{other}");
    let refused = fake.take_undescribed();
    assert!(
        refused.len() == 1 && refused[0].contains("reviewThreads"),
        "{refused:?}"
    );
}
