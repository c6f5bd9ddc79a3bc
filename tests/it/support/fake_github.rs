//! Test service: an in-process fake of the GitHub REST and GraphQL API subset the harness uses,
//! reached through `GITHUB_API_URL`. It records every request (method, path, query, body,
//! authorization header), serves seeded issues, pull requests, comments and discussions, creates
//! comments and reactions, and fails scripted routes with a chosen status.
//!
//! Responses follow GitHub's shapes for the fields the client reads; errors carry GitHub's
//! `{"message", "documentation_url"}` body. Paths are accepted with or without the GitHub
//! Enterprise Server prefix (`/api/v3` for REST, `/api/graphql` for GraphQL).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use super::cache_server::{CacheHandle, Entry};

pub const TOKEN: &str = "ghs_faketoken0123456789";
const DOCS: &str = "https://docs.github.com/rest";

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The path as received (with any `/api/v3` prefix).
    pub raw_path: String,
    /// The path without the GHES prefix.
    pub path: String,
    pub query: Option<String>,
    pub body: Value,
    pub auth: Option<String>,
    /// When it arrived.
    pub at: std::time::Instant,
}

#[derive(Debug, Clone)]
struct Fault {
    method: Option<Method>,
    path_contains: String,
    status: u16,
    /// Answer with a non-JSON body, as a load balancer would.
    html: bool,
    remaining: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct SeedComment {
    pub id: u64,
    pub author: String,
    /// `author_association` GitHub reports for the author.
    pub association: String,
    pub body: String,
    pub created_at: String,
}

#[derive(Debug, Default)]
struct Data {
    requests: Vec<Recorded>,
    faults: Vec<Fault>,
    issues: BTreeMap<u64, Value>,
    comments: BTreeMap<u64, Vec<SeedComment>>,
    pulls: BTreeMap<u64, Value>,
    /// Discussion number → (node id, title, body, comments).
    discussions: BTreeMap<u64, (String, String, String, Vec<SeedComment>)>,
    /// (subject path or node id, content).
    reactions: Vec<(String, String)>,
    /// Every comment edit that succeeded: (comment id — REST id or discussion node id, new body).
    edits: Vec<(String, String)>,
    /// GraphQL operations to fail: (text the query contains, times left; `None`: always).
    graphql_faults: Vec<(String, Option<usize>)>,
    /// `GET /user`'s login: set, the token is a personal token of that user; unset, it is an
    /// installation token, which GitHub refuses there (403).
    user: Option<String>,
    next_id: u64,
    /// The Actions cache behind `/actions/caches` (none: those routes answer 404).
    cache: Option<CacheHandle>,
}

type Shared = Arc<Mutex<Data>>;

pub struct FakeGitHub {
    /// Base URL for `GITHUB_API_URL`.
    pub url: String,
    data: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGitHub {
    pub async fn start() -> FakeGitHub {
        let data: Shared = Arc::new(Mutex::new(Data {
            next_id: 9_000_000_001,
            ..Data::default()
        }));
        let app = Router::new().fallback(handle).with_state(data.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeGitHub {
            url: format!("http://{addr}"),
            data,
            task,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap()
    }

    pub fn seed_issue(&self, number: u64, title: &str, body: &str) {
        self.lock().issues.insert(
            number,
            json!({"number": number, "title": title, "body": body, "state": "open",
                   "locked": false, "user": {"login": "mona", "type": "User"},
                   "author_association": "OWNER"}),
        );
    }

    /// An issue opened by `login` with that `author_association` (`seed_issue`: mona, OWNER).
    pub fn seed_issue_by(
        &self,
        number: u64,
        title: &str,
        body: &str,
        login: &str,
        association: &str,
    ) {
        self.lock().issues.insert(
            number,
            json!({"number": number, "title": title, "body": body, "state": "open",
                   "locked": false, "user": {"login": login, "type": "User"},
                   "author_association": association}),
        );
    }

    /// `n` comments on an issue, ids from 1000, oldest first.
    pub fn seed_comments(&self, number: u64, n: usize) {
        let comments = (0..n)
            .map(|i| SeedComment {
                id: 1000 + i as u64,
                author: format!("user{i}"),
                association: "MEMBER".into(),
                body: format!("comment {i}"),
                created_at: format!("2026-11-01T00:{:02}:{:02}Z", i / 60, i % 60),
            })
            .collect();
        self.lock().comments.insert(number, comments);
    }

    pub fn seed_pull(&self, number: u64, head_repo: Option<&str>, base_repo: &str, draft: bool) {
        let head = match head_repo {
            Some(full) => json!({"full_name": full}),
            None => Value::Null,
        };
        self.lock().pulls.insert(
            number,
            json!({"number": number, "draft": draft, "state": "open",
                   "head": {"ref": "feature", "repo": head},
                   "base": {"ref": "main", "repo": {"full_name": base_repo}}}),
        );
    }

    pub fn seed_discussion(
        &self,
        number: u64,
        node_id: &str,
        title: &str,
        body: &str,
        comments: usize,
    ) {
        let comments = (0..comments)
            .map(|i| SeedComment {
                id: 5000 + i as u64,
                author: format!("member{i}"),
                association: "MEMBER".into(),
                body: format!("discussion reply {i}"),
                created_at: "2026-11-02T00:00:00Z".into(),
            })
            .collect();
        self.lock().discussions.insert(
            number,
            (node_id.into(), title.into(), body.into(), comments),
        );
    }

    /// Makes the token a personal token of `login` (`GET /user` answers with it).
    pub fn set_user(&self, login: &str) {
        self.lock().user = Some(login.to_string());
    }

    /// Adds one comment to an issue (after any seeded ones).
    pub fn add_comment(&self, number: u64, id: u64, author: &str, association: &str, body: &str) {
        self.lock()
            .comments
            .entry(number)
            .or_default()
            .push(SeedComment {
                id,
                author: author.into(),
                association: association.into(),
                body: body.into(),
                created_at: "2026-11-01T01:00:00Z".into(),
            });
    }

    /// Fails requests whose path contains `path_contains` (and method, when given) with
    /// `status`, `times` times (`None`: always).
    pub fn fail(
        &self,
        method: Option<Method>,
        path_contains: &str,
        status: u16,
        times: Option<usize>,
    ) {
        self.lock().faults.push(Fault {
            method,
            path_contains: path_contains.into(),
            status,
            html: false,
            remaining: times,
        });
    }

    /// Like `fail`, with an HTML body instead of GitHub's JSON error.
    pub fn fail_html(&self, path_contains: &str, status: u16) {
        self.lock().faults.push(Fault {
            method: None,
            path_contains: path_contains.into(),
            status,
            html: true,
            remaining: None,
        });
    }

    /// Serves the repository's cache entries (`GET`/`DELETE /actions/caches`) from `cache`.
    pub fn attach_cache(&self, cache: CacheHandle) {
        self.lock().cache = Some(cache);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Comments created through the API on an issue/PR, or on a discussion (by node id).
    pub fn created_comments(&self) -> Vec<(String, String)> {
        let d = self.lock();
        let mut out = Vec::new();
        for (n, list) in &d.comments {
            for c in list.iter().filter(|c| c.id >= 9_000_000_000) {
                out.push((format!("issue-{n}"), c.body.clone()));
            }
        }
        for (n, (_, _, _, list)) in &d.discussions {
            for c in list.iter().filter(|c| c.id >= 9_000_000_000) {
                out.push((format!("discussion-{n}"), c.body.clone()));
            }
        }
        out
    }

    pub fn reactions(&self) -> Vec<(String, String)> {
        self.lock().reactions.clone()
    }

    /// The id of the comment created through the API whose body starts with `prefix`.
    pub fn comment_id_starting(&self, prefix: &str) -> Option<u64> {
        let d = self.lock();
        d.comments
            .values()
            .flatten()
            .find(|c| c.id >= 9_000_000_000 && c.body.starts_with(prefix))
            .map(|c| c.id)
    }

    /// Comment edits that succeeded, in order: (REST id or discussion node id, new body).
    pub fn edits(&self) -> Vec<(String, String)> {
        self.lock().edits.clone()
    }

    /// Every body any comment created through the API has shown: each creation and each edit.
    pub fn comment_versions(&self) -> Vec<String> {
        let d = self.lock();
        d.requests
            .iter()
            .filter(|r| {
                r.method == "POST" && r.path.ends_with("/comments")
                    || r.method == "PATCH" && r.path.contains("/comments/")
                    || r.path == "/graphql"
                        && r.body["query"].as_str().is_some_and(|q| {
                            q.contains("addDiscussionComment")
                                || q.contains("updateDiscussionComment")
                        })
            })
            .filter_map(|r| {
                r.body
                    .get("body")
                    .or_else(|| r.body.pointer("/variables/body"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    }

    /// Requests that created or edited a comment, as `(method, path or GraphQL operation)`.
    pub fn comment_writes(&self) -> Vec<(String, String)> {
        let d = self.lock();
        d.requests
            .iter()
            .filter_map(|r| {
                let q = r.body["query"].as_str().unwrap_or("");
                match (r.method.as_str(), r.path.as_str()) {
                    ("POST", p) if p.ends_with("/comments") => Some(("POST".into(), p.into())),
                    ("PATCH", p) if p.contains("/comments/") => Some(("PATCH".into(), p.into())),
                    ("POST", "/graphql") if q.contains("addDiscussionComment") => {
                        Some(("POST".into(), "addDiscussionComment".into()))
                    }
                    ("POST", "/graphql") if q.contains("updateDiscussionComment") => {
                        Some(("PATCH".into(), "updateDiscussionComment".into()))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Fails GraphQL requests whose query contains `operation` with a `NOT_FOUND` error,
    /// `times` times (`None`: always).
    pub fn fail_graphql(&self, operation: &str, times: Option<usize>) {
        self.lock()
            .graphql_faults
            .push((operation.to_string(), times));
    }

    /// Adds one comment to a discussion (after any seeded ones); its node id is `DC_{id}`.
    pub fn add_discussion_comment(&self, number: u64, id: u64, author: &str, body: &str) {
        let mut d = self.lock();
        let entry = d.discussions.get_mut(&number).expect("a seeded discussion");
        entry.3.push(SeedComment {
            id,
            author: author.into(),
            association: "MEMBER".into(),
            body: body.into(),
            created_at: "2026-11-02T01:00:00Z".into(),
        });
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"message": message, "documentation_url": DOCS, "status": status.as_u16().to_string()})),
    )
        .into_response()
}

fn ok(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

const REACTIONS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

async fn handle(
    State(data): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw_path = uri.path().to_string();
    let path = raw_path
        .strip_prefix("/api/v3")
        .or_else(|| raw_path.strip_prefix("/api").filter(|p| *p == "/graphql"))
        .unwrap_or(&raw_path)
        .to_string();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body_json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut d = data.lock().unwrap();
    d.requests.push(Recorded {
        method: method.to_string(),
        raw_path: raw_path.clone(),
        path: path.clone(),
        query: uri.query().map(str::to_string),
        body: body_json.clone(),
        auth: auth.clone(),
        at: std::time::Instant::now(),
    });

    if let Some(i) = d.faults.iter().position(|f| {
        f.method.as_ref().is_none_or(|m| *m == method)
            && path.contains(&f.path_contains)
            && f.remaining != Some(0)
    }) {
        let fault = &mut d.faults[i];
        if let Some(n) = fault.remaining.as_mut() {
            *n -= 1;
        }
        let status = StatusCode::from_u16(fault.status).unwrap();
        if fault.html {
            return (status, "<html><body><h1>502 Bad Gateway</h1></body></html>").into_response();
        }
        let message = match fault.status {
            403 => "Resource not accessible by integration",
            404 => "Not Found",
            422 => "Validation Failed",
            _ => "Server Error",
        };
        return error(status, message);
    }

    if auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        return error(StatusCode::UNAUTHORIZED, "Bad credentials");
    }

    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let query: BTreeMap<String, String> = uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();

    match (method.clone(), segments.as_slice()) {
        (Method::POST, ["graphql"]) => graphql(&mut d, &body_json),
        (Method::GET, ["user"]) => match &d.user {
            Some(login) => ok(
                StatusCode::OK,
                json!({"login": login, "id": 1, "type": "User"}),
            ),
            None => error(
                StatusCode::FORBIDDEN,
                "Resource not accessible by integration",
            ),
        },
        (Method::GET, ["repos", _, _, "issues", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match d.issues.get(&n).cloned() {
                Some(mut issue) => {
                    issue["comments"] = json!(d.comments.get(&n).map_or(0, Vec::len));
                    ok(StatusCode::OK, issue)
                }
                None => error(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        (Method::GET, ["repos", _, _, "issues", n, "comments"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            if !d.issues.contains_key(&n) {
                return error(StatusCode::NOT_FOUND, "Not Found");
            }
            let per_page: usize = query
                .get("per_page")
                .and_then(|v| v.parse().ok())
                .unwrap_or(30);
            let page: usize = query
                .get("page")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
                .max(1);
            let list = d.comments.get(&n).cloned().unwrap_or_default();
            let items: Vec<Value> = list
                .iter()
                .skip((page - 1) * per_page)
                .take(per_page)
                .map(|c| {
                    json!({"id": c.id, "body": c.body, "created_at": c.created_at,
                                "html_url": format!("https://github.com/o/r/issues/{n}#issuecomment-{}", c.id),
                                "user": {"login": c.author, "type": "User"},
                                "author_association": c.association})
                })
                .collect();
            ok(StatusCode::OK, Value::Array(items))
        }
        (Method::POST, ["repos", o, r, "issues", n, "comments"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            if !d.issues.contains_key(&n) {
                return error(StatusCode::NOT_FOUND, "Not Found");
            }
            let Some(text) = body_json.get("body").and_then(Value::as_str) else {
                return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
            };
            if text.chars().count() > 65_536 {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Body is too long (maximum is 65536 characters)",
                );
            }
            let id = d.next_id;
            d.next_id += 1;
            let author = d
                .user
                .clone()
                .unwrap_or_else(|| "github-actions[bot]".into());
            // A personal token's user owns the repository here; the app bot has no association.
            let association = if d.user.is_some() { "OWNER" } else { "NONE" };
            d.comments.entry(n).or_default().push(SeedComment {
                id,
                author,
                association: association.into(),
                body: text.into(),
                created_at: "2026-11-29T09:00:00Z".into(),
            });
            ok(
                StatusCode::CREATED,
                json!({"id": id, "node_id": format!("IC_{id}"), "body": text,
                       "html_url": format!("https://github.com/{o}/{r}/issues/{n}#issuecomment-{id}"),
                       "user": {"login": "github-actions[bot]", "type": "Bot"}}),
            )
        }
        (Method::PATCH, ["repos", o, r, "issues", "comments", id]) => {
            let id: u64 = id.parse().unwrap_or(0);
            let Some(text) = body_json.get("body").and_then(Value::as_str) else {
                return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
            };
            if text.chars().count() > 65_536 {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Body is too long (maximum is 65536 characters)",
                );
            }
            // A token with `issues: write` may edit anyone's comment in the repository, as GitHub
            // allows maintainers to: only the harness's own check keeps it to its own.
            let Some((n, comment)) = d
                .comments
                .iter_mut()
                .find_map(|(n, list)| list.iter_mut().find(|c| c.id == id).map(|c| (*n, c)))
            else {
                return error(StatusCode::NOT_FOUND, "Not Found");
            };
            comment.body = text.to_string();
            let author = comment.author.clone();
            d.edits.push((id.to_string(), text.to_string()));
            ok(
                StatusCode::OK,
                json!({"id": id, "node_id": format!("IC_{id}"), "body": text,
                       "html_url": format!("https://github.com/{o}/{r}/issues/{n}#issuecomment-{id}"),
                       "user": {"login": author, "type": "Bot"}}),
            )
        }
        (Method::POST, ["repos", _, _, "issues", "comments", _, "reactions"])
        | (Method::POST, ["repos", _, _, "pulls", "comments", _, "reactions"])
        | (Method::POST, ["repos", _, _, "issues", _, "reactions"]) => {
            let content = body_json
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !REACTIONS.contains(&content) {
                return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
            }
            let id = d.next_id;
            d.next_id += 1;
            d.reactions.push((path.clone(), content.to_string()));
            ok(
                StatusCode::CREATED,
                json!({"id": id, "content": content, "user": {"login": "github-actions[bot]"}}),
            )
        }
        (Method::GET, ["repos", _, _, "actions", "caches"]) => {
            let Some(cache) = d.cache.clone() else {
                return error(StatusCode::NOT_FOUND, "Not Found");
            };
            let prefix = query.get("key").cloned().unwrap_or_default();
            let per_page: usize = query
                .get("per_page")
                .and_then(|v| v.parse().ok())
                .unwrap_or(30)
                .min(100);
            let all = cache.list(&prefix);
            if query.get("sort").map(String::as_str) != Some("created_at")
                || query.get("direction").map(String::as_str) != Some("desc")
            {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "the client must ask for newest first",
                );
            }
            let page: Vec<Value> = all.iter().take(per_page).map(rest_cache).collect();
            ok(
                StatusCode::OK,
                json!({"total_count": all.len(), "actions_caches": page}),
            )
        }
        (Method::DELETE, ["repos", _, _, "actions", "caches"]) => {
            let Some(cache) = d.cache.clone() else {
                return error(StatusCode::NOT_FOUND, "Not Found");
            };
            let Some(key) = query.get("key") else {
                return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
            };
            let gone = cache.delete(key);
            if gone.is_empty() {
                return error(StatusCode::NOT_FOUND, "Not Found");
            }
            let list: Vec<Value> = gone.iter().map(rest_cache).collect();
            ok(
                StatusCode::OK,
                json!({"total_count": list.len(), "actions_caches": list}),
            )
        }
        (Method::GET, ["repos", _, _, "pulls", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match d.pulls.get(&n) {
                Some(pr) => ok(StatusCode::OK, pr.clone()),
                None => error(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// A cache entry in the REST shape; creation order stands in for the creation time.
fn rest_cache(e: &Entry) -> Value {
    let s = e.seq;
    let at = format!(
        "2026-11-01T{:02}:{:02}:{:02}Z",
        s / 3600 % 24,
        s / 60 % 60,
        s % 60
    );
    json!({"id": e.id, "ref": "refs/heads/main", "key": e.key, "version": e.version,
           "created_at": at, "last_accessed_at": at, "size_in_bytes": e.size.unwrap_or(0)})
}

/// The GraphQL operations the client sends, told apart by their root field.
fn graphql(d: &mut Data, body: &Value) -> Response {
    let query = body.get("query").and_then(Value::as_str).unwrap_or("");
    let vars = body.get("variables").cloned().unwrap_or(Value::Null);
    let gql_error = |message: &str| {
        ok(
            StatusCode::OK,
            json!({"data": null, "errors": [{"type": "NOT_FOUND", "message": message,
                   "locations": [{"line": 1, "column": 1}], "path": ["node"]}]}),
        )
    };
    if let Some(i) = d
        .graphql_faults
        .iter()
        .position(|(op, left)| query.contains(op.as_str()) && *left != Some(0))
    {
        if let Some(n) = d.graphql_faults[i].1.as_mut() {
            *n -= 1;
        }
        return gql_error("Could not resolve to a node (scripted fault)");
    }
    // Who the token is in GraphQL: a personal token's user, else the Actions app (no `[bot]`).
    let viewer = d.user.clone().unwrap_or_else(|| "github-actions".into());
    if query.contains("updateDiscussionComment") {
        let node = vars["comment"].as_str().unwrap_or("").to_string();
        let text = vars["body"].as_str().unwrap_or("").to_string();
        let found = d.discussions.iter_mut().find_map(|(number, entry)| {
            entry
                .3
                .iter_mut()
                .find(|c| format!("DC_{}", c.id) == node)
                .map(|c| (*number, c))
        });
        let Some((number, comment)) = found else {
            return gql_error(&format!(
                "Could not resolve to a node with the global id of '{node}'"
            ));
        };
        // Like REST: a maintainer's token may edit anyone's comment.
        comment.body = text.clone();
        let url = format!(
            "https://github.com/o/r/discussions/{number}#discussioncomment-{}",
            comment.id
        );
        d.edits.push((node.clone(), text));
        return ok(
            StatusCode::OK,
            json!({"data": {"updateDiscussionComment": {"comment": {"id": node, "url": url}}}}),
        );
    }
    if query.contains("viewerDidAuthor") {
        let number = vars["number"].as_u64().unwrap_or(0);
        let Some((_, _, _, comments)) = d.discussions.get(&number) else {
            return gql_error(&format!(
                "Could not resolve to a Discussion with the number of {number}."
            ));
        };
        let nodes: Vec<Value> = comments
            .iter()
            .skip(comments.len().saturating_sub(100))
            .map(|c| {
                json!({"id": format!("DC_{}", c.id), "body": c.body,
                       "url": format!("https://github.com/o/r/discussions/{number}#discussioncomment-{}", c.id),
                       "viewerDidAuthor": c.author == viewer})
            })
            .collect();
        return ok(
            StatusCode::OK,
            json!({"data": {"repository": {"discussion": {"comments": {"nodes": nodes}}}}}),
        );
    }
    if query.contains("addReaction") {
        let subject = vars["subject"].as_str().unwrap_or("").to_string();
        let content = vars["content"].as_str().unwrap_or("").to_string();
        if ![
            "EYES",
            "HOORAY",
            "CONFUSED",
            "THUMBS_UP",
            "THUMBS_DOWN",
            "LAUGH",
            "HEART",
            "ROCKET",
        ]
        .contains(&content.as_str())
        {
            return gql_error("invalid ReactionContent");
        }
        let known =
            d.discussions.values().any(|(node, ..)| *node == subject) || subject.starts_with("DC_");
        if !known {
            return gql_error(&format!(
                "Could not resolve to a node with the global id of '{subject}'"
            ));
        }
        d.reactions.push((subject, content.clone()));
        return ok(
            StatusCode::OK,
            json!({"data": {"addReaction": {"reaction": {"content": content}}}}),
        );
    }
    if query.contains("addDiscussionComment") {
        let discussion = vars["discussion"].as_str().unwrap_or("");
        let text = vars["body"].as_str().unwrap_or("").to_string();
        let id = d.next_id;
        d.next_id += 1;
        let Some((number, entry)) = d
            .discussions
            .iter_mut()
            .find(|(_, (node, ..))| node == discussion)
        else {
            return gql_error(&format!(
                "Could not resolve to a node with the global id of '{discussion}'"
            ));
        };
        let url = format!("https://github.com/o/r/discussions/{number}#discussioncomment-{id}");
        entry.3.push(SeedComment {
            id,
            author: viewer,
            association: "NONE".into(),
            body: text,
            created_at: "2026-11-29T09:00:00Z".into(),
        });
        return ok(
            StatusCode::OK,
            json!({"data": {"addDiscussionComment": {"comment": {"id": format!("DC_{id}"), "url": url}}}}),
        );
    }
    if query.contains("discussion(number") {
        let number = vars["number"].as_u64().unwrap_or(0);
        let last = vars["last"].as_u64().unwrap_or(10) as usize;
        return match d.discussions.get(&number) {
            Some((_, title, body, comments)) => {
                let nodes: Vec<Value> = comments
                    .iter()
                    .skip(comments.len().saturating_sub(last))
                    .map(|c| {
                        json!({"author": {"login": c.author}, "authorAssociation": c.association,
                                    "body": c.body, "createdAt": c.created_at})
                    })
                    .collect();
                ok(
                    StatusCode::OK,
                    json!({"data": {"repository": {"discussion": {"title": title, "body": body,
                           "author": {"login": "mona"}, "authorAssociation": "OWNER",
                           "comments": {"totalCount": comments.len(), "nodes": nodes}}}}}),
                )
            }
            None => ok(
                StatusCode::OK,
                json!({"data": {"repository": {"discussion": null}},
                       "errors": [{"type": "NOT_FOUND", "message": format!("Could not resolve to a Discussion with the number of {number}."), "path": ["repository", "discussion"]}]}),
            ),
        };
    }
    gql_error("unknown operation")
}
