//! Test service: an in-process fake of the GitHub REST and GraphQL API subset the harness uses,
//! reached through `GITHUB_API_URL`. It records every request (method, path, query, body,
//! authorization header), serves seeded issues, pull requests, comments and discussions, creates
//! comments and reactions, and fails scripted routes with a chosen status.
//!
//! Responses follow GitHub's shapes for the fields the client reads; errors carry GitHub's
//! `{"message", "documentation_url"}` body. Started with `start`, it stands in for github.com:
//! paths are accepted with or without the GitHub Enterprise Server prefix (`/api/v3` for REST,
//! `/api/graphql` for GraphQL) and links in answers point at github.com. Started with
//! `start_enterprise`, it is laid out as GitHub Enterprise Server is at its own URL: the API only
//! under those prefixes, git beside them, any other path the web UI's 404 page, and links in
//! answers pointing at the fake itself.
//!
//! Repository labels, issue labels and issue creation live here; branches, commits, pull
//! requests, `createCommitOnBranch` and git smart HTTP are in [`super::fake_git`], which keeps a
//! real bare repository (`seed_git_repo`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use super::cache_server::{CacheHandle, Entry};
use super::fake_git::{self, GitState};
use super::fake_review::{self, ReviewState};

pub const TOKEN: &str = "ghs_faketoken0123456789";

/// The waits a client's [`Pacing`] was asked for, in order (nothing sleeps).
pub type Waits = Arc<Mutex<Vec<std::time::Duration>>>;

/// Pacing that records each wait instead of sleeping, its clock at `now` (epoch seconds).
pub fn recorded_pacing(now: u64) -> (fro_bot::github::retry::Pacing, Waits) {
    let waits: Waits = Arc::default();
    let seen = waits.clone();
    let pacing = fro_bot::github::retry::Pacing::default()
        .with_sleep(Arc::new(move |d| {
            seen.lock().unwrap().push(d);
            Box::pin(async {})
        }))
        .with_clock(Arc::new(move || now));
    (pacing, waits)
}

/// A client of the fake for `repository`, whose retries do not wait ([`recorded_pacing`]).
pub fn client(url: &str, repository: &str) -> fro_bot::github::GitHub {
    let token = fro_bot::config::Secret::new(TOKEN);
    fro_bot::github::GitHub::new(url, &token, repository)
        .unwrap()
        .with_pacing(recorded_pacing(0).0)
}
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

/// A scripted failure: the first `remaining` requests that match answer `status` instead.
#[derive(Debug, Clone)]
pub struct Fault {
    method: Option<Method>,
    path_contains: String,
    /// GraphQL: only requests whose query contains this.
    query_contains: Option<String>,
    status: u16,
    /// Answer with a non-JSON body, as a load balancer would.
    html: bool,
    /// The request takes effect first and only its answer is lost (a 502 after GitHub acted).
    after: bool,
    /// Extra answer headers (`Retry-After`, `x-ratelimit-*`).
    headers: Vec<(String, String)>,
    remaining: Option<usize>,
}

impl Fault {
    /// `method` (any when `None`) on paths containing `path_contains`, `times` times (`None`:
    /// always), before the request takes effect.
    pub fn new(
        method: Option<Method>,
        path_contains: &str,
        status: u16,
        times: Option<usize>,
    ) -> Fault {
        Fault {
            method,
            path_contains: path_contains.into(),
            query_contains: None,
            status,
            html: false,
            after: false,
            headers: Vec::new(),
            remaining: times,
        }
    }

    /// GraphQL requests whose query contains `operation`, answered with HTTP `status`.
    pub fn graphql(operation: &str, status: u16, times: Option<usize>) -> Fault {
        Fault {
            query_contains: Some(operation.into()),
            ..Fault::new(Some(Method::POST), "/graphql", status, times)
        }
    }

    /// The request takes effect; only the answer is the fault.
    pub fn after_effect(self) -> Fault {
        Fault {
            after: true,
            ..self
        }
    }

    /// Answers carry this header too.
    pub fn header(mut self, name: &str, value: &str) -> Fault {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn matches(&self, method: &Method, path: &str, body: &Value) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && path.contains(&self.path_contains)
            && self.query_contains.as_ref().is_none_or(|q| {
                body["query"]
                    .as_str()
                    .is_some_and(|text| text.contains(q.as_str()))
            })
            && self.remaining != Some(0)
    }

    fn answer(&self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap();
        let mut response = if self.html {
            (status, "<html><body><h1>502 Bad Gateway</h1></body></html>").into_response()
        } else {
            let message = match self.status {
                403 | 429 if !self.headers.is_empty() => {
                    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
                }
                403 => "Resource not accessible by integration",
                404 => "Not Found",
                422 => "Validation Failed",
                _ => "Server Error",
            };
            error(status, message)
        };
        for (name, value) in &self.headers {
            response.headers_mut().insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                axum::http::HeaderValue::from_str(value).unwrap(),
            );
        }
        response
    }
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

/// Where the fake's API is and what its answers link to.
#[derive(Debug, Clone)]
pub(super) struct Site {
    /// `GITHUB_SERVER_URL`: the base of `html_url` and the GraphQL `url` fields.
    pub(super) web: String,
    /// `GITHUB_API_URL`: the base of the REST `url` fields.
    pub(super) api: String,
    /// Enterprise Server's layout only: REST under `/api/v3`, GraphQL at `/api/graphql`, git at
    /// `/{owner}/{repo}.git/`; nothing else answers as the API.
    pub(super) enterprise: bool,
}

impl Default for Site {
    fn default() -> Self {
        Site {
            web: "https://github.com".into(),
            api: "https://api.github.com".into(),
            enterprise: false,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Data {
    pub(super) site: Site,
    pub(super) requests: Vec<Recorded>,
    faults: Vec<Fault>,
    pub(super) issues: BTreeMap<u64, Value>,
    comments: BTreeMap<u64, Vec<SeedComment>>,
    pub(super) pulls: BTreeMap<u64, Value>,
    /// Discussion number → (node id, title, body, comments).
    discussions: BTreeMap<u64, (String, String, String, Vec<SeedComment>)>,
    /// (subject path or node id, content).
    reactions: Vec<(String, String)>,
    /// Every comment edit that succeeded: (comment id — REST id or discussion node id, new body).
    edits: Vec<(String, String)>,
    /// GraphQL operations to fail: (text the query contains, times left; `None`: always).
    graphql_faults: Vec<(String, Option<usize>)>,
    /// Permissions by login (`GET /collaborators/{login}/permission`); unlisted logins are admins.
    permissions: BTreeMap<String, String>,
    /// `GET /user`'s login: set, the token is a personal token of that user; unset, it is an
    /// installation token, which GitHub refuses there (403).
    pub(super) user: Option<String>,
    pub(super) next_id: u64,
    /// The Actions cache behind `/actions/caches` (none: those routes answer 404).
    cache: Option<CacheHandle>,
    /// The repository's labels: (name, color).
    labels: Vec<(String, String)>,
    /// Labels on each issue or pull request, by name, in the order they were added.
    issue_labels: BTreeMap<u64, Vec<String>>,
    /// Bodies of `POST /issues` requests that created an issue.
    created_issues: Vec<Value>,
    /// The bare repository and what goes with it.
    pub(super) git: GitState,
    /// Pull-request reviews, review threads and their comments.
    pub(super) review: ReviewState,
    /// How long every answer waits, as a round trip to github.com would (zero: at once).
    latency: std::time::Duration,
    /// Logins `GET /users/{login}` answers as `type: Bot` (every other login is a `User`).
    bots: Vec<String>,
    /// Requests GitHub's API descriptions do not allow (`support::github_schema`): each fails the
    /// test whose fake served it.
    undescribed: Vec<String>,
}

type Shared = Arc<Mutex<Data>>;

pub struct FakeGitHub {
    /// Where it listens: `GITHUB_API_URL` for `start`, `GITHUB_SERVER_URL` for `start_enterprise`.
    pub url: String,
    data: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.task.abort();
        let undescribed = std::mem::take(&mut self.lock().undescribed);
        // A test already failing says why on its own; a second panic would abort the process.
        if !undescribed.is_empty() && !std::thread::panicking() {
            panic!(
                "fro-bot made requests GitHub's API descriptions do not allow:\n{}",
                undescribed.join("\n")
            );
        }
    }
}

impl FakeGitHub {
    /// github.com's API at the fake's URL.
    pub async fn start() -> FakeGitHub {
        Self::start_laid_out(false).await
    }

    /// A GitHub Enterprise Server at the fake's URL: `server_url`, `api_url`, `graphql_url`.
    pub async fn start_enterprise() -> FakeGitHub {
        Self::start_laid_out(true).await
    }

    async fn start_laid_out(enterprise: bool) -> FakeGitHub {
        let data: Shared = Arc::new(Mutex::new(Data {
            next_id: 9_000_000_001,
            ..Data::default()
        }));
        let app = Router::new().fallback(handle).with_state(data.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}");
        if enterprise {
            data.lock().unwrap().site = Site {
                web: url.clone(),
                api: format!("{url}/api/v3"),
                enterprise,
            };
        }
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeGitHub { url, data, task }
    }

    /// The requests refused as not in GitHub's API descriptions so far, taken: a test that sends
    /// one on purpose says so, and the fake then does not fail it when dropped.
    pub fn take_undescribed(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().undescribed)
    }

    /// Every answer from now on waits `latency` first (a round trip to github.com is 100-300 ms).
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.lock().latency = latency;
    }

    /// `GITHUB_API_URL`.
    pub fn api_url(&self) -> String {
        match self.lock().site.enterprise {
            true => format!("{}/api/v3", self.url),
            false => self.url.clone(),
        }
    }

    /// `GITHUB_GRAPHQL_URL`.
    pub fn graphql_url(&self) -> String {
        match self.lock().site.enterprise {
            true => format!("{}/api/graphql", self.url),
            false => format!("{}/graphql", self.url),
        }
    }

    /// `GITHUB_SERVER_URL`: where the answers' links point (github.com unless enterprise).
    pub fn server_url(&self) -> String {
        self.lock().site.web.clone()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Data> {
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

    /// `GET /users/{login}` answers `type: Bot` for `login` from now on.
    pub fn seed_bot(&self, login: &str) {
        self.lock().bots.push(login.to_string());
    }

    /// Locks issue `number` (`locked: true` when it is read).
    pub fn lock_issue(&self, number: u64) {
        self.lock().issues.get_mut(&number).expect("a seeded issue")["locked"] = json!(true);
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

    /// What `GET /collaborators/{login}/permission` says for `login` (`read`, `write`, ...).
    pub fn set_permission(&self, login: &str, permission: &str) {
        self.lock()
            .permissions
            .insert(login.to_string(), permission.to_string());
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
        self.inject(Fault::new(method, path_contains, status, times));
    }

    /// Adds a scripted failure ([`Fault`]).
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Like `fail`, with an HTML body instead of GitHub's JSON error.
    pub fn fail_html(&self, path_contains: &str, status: u16) {
        self.inject(Fault {
            html: true,
            ..Fault::new(None, path_contains, status, None)
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

    /// The repository's labels (colors from GitHub's defaults, in turn).
    pub fn seed_labels(&self, names: &[&str]) {
        let mut d = self.lock();
        for name in names {
            let color = LABEL_COLORS[d.labels.len() % LABEL_COLORS.len()];
            d.labels.push((name.to_string(), color.to_string()));
        }
    }

    /// The repository's labels now, seeded ones first, then any created through the API.
    pub fn labels(&self) -> Vec<String> {
        self.lock().labels.iter().map(|(l, _)| l.clone()).collect()
    }

    /// The labels on an issue or pull request, in the order they were added.
    pub fn issue_labels(&self, number: u64) -> Vec<String> {
        self.lock()
            .issue_labels
            .get(&number)
            .cloned()
            .unwrap_or_default()
    }

    /// Bodies of the `POST /issues` requests that created an issue.
    pub fn created_issues(&self) -> Vec<Value> {
        self.lock().created_issues.clone()
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

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"message": message, "documentation_url": DOCS, "status": status.as_u16().to_string()})),
    )
        .into_response()
}

pub(super) fn ok(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

const REACTIONS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

/// Every request: checked against GitHub's API description, served, and the answer's types checked
/// too (`support::github_schema`); what GitHub would not do fails the test that caused it.
async fn handle(
    State(data): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let enterprise = data.lock().unwrap().site.enterprise;
    let (path, routes) = locate(enterprise, uri.path());
    let api_call = routes != Routes::Git && !fake_git::is_smart_http(&path);
    let body_json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if api_call {
        let described =
            crate::support::github_schema::check(enterprise, method.as_str(), &path, &body_json)
                .await;
        if let Err(why) = described {
            let refused = format!("{method} {}: {why}", uri.path());
            eprintln!("the fake GitHub refused a request GitHub's API description does not allow: {refused}");
            data.lock().unwrap().undescribed.push(refused.clone());
            return error(
                StatusCode::BAD_REQUEST,
                &format!("not in GitHub's API description: {refused}"),
            );
        }
    }
    let request = Request {
        method: method.clone(),
        uri: uri.clone(),
        headers,
        body,
        body_json,
        path: path.clone(),
        routes,
    };
    let answer = serve(&data, request).await;
    if !api_call || path == "/graphql" || !answer.status().is_success() {
        return answer;
    }
    let (parts, answer_body) = answer.into_parts();
    let bytes = axum::body::to_bytes(answer_body, usize::MAX)
        .await
        .unwrap_or_default();
    if let Ok(json) = serde_json::from_slice::<Value>(&bytes) {
        let status = parts.status.as_u16();
        let checked = crate::support::github_schema::check_answer(
            enterprise,
            method.as_str(),
            &path,
            status,
            &json,
        )
        .await;
        if let Err(why) = checked {
            let wrong = format!("the fake's answer to {method} {}: {why}", uri.path());
            eprintln!("{wrong}");
            data.lock().unwrap().undescribed.push(wrong);
        }
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// One request as [`handle`] read it: the path the routes read and which routes may answer it.
struct Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    body_json: Value,
    path: String,
    routes: Routes,
}

async fn serve(data: &Shared, request: Request) -> Response {
    let Request {
        method,
        uri,
        headers,
        body,
        body_json,
        path,
        routes,
    } = request;
    let raw_path = uri.path().to_string();
    let latency = data.lock().unwrap().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // The lock is released before git http-backend is awaited.
    let cgi = {
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

        let fault = d
            .faults
            .iter()
            .position(|f| f.matches(&method, &path, &body_json))
            .map(|i| {
                let fault = &mut d.faults[i];
                if let Some(n) = fault.remaining.as_mut() {
                    *n -= 1;
                }
                fault.clone()
            });
        if let Some(fault) = fault.as_ref().filter(|f| !f.after) {
            return fault.answer();
        }

        // Git smart HTTP authenticates with Basic credentials, not the API's bearer token.
        let git = match routes {
            Routes::Api => None,
            Routes::Git | Routes::Any => {
                fake_git::smart_http(&mut d, &method, &path, uri.query(), &headers, &body)
            }
        };
        match git {
            Some(Ok(cgi)) => cgi,
            Some(Err(response)) => return response,
            None if routes == Routes::Git => return web_not_found(),
            None => {
                let accept = headers.get("accept").and_then(|v| v.to_str().ok());
                let answer = api(
                    &mut d,
                    method,
                    &uri,
                    &path,
                    auth.as_deref(),
                    accept,
                    &body_json,
                );
                // A fault after the effect: GitHub acted, the answer is lost.
                return match fault {
                    Some(fault) => fault.answer(),
                    None => answer,
                };
            }
        }
    };
    fake_git::run_http_backend(cgi).await
}

/// Which routes may answer a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routes {
    Api,
    Git,
    Any,
}

/// The path the routes read (the API's prefix taken off) and which routes it is for. Enterprise
/// Server answers the API only under its prefixes; github.com's fake takes either.
fn locate(enterprise: bool, raw: &str) -> (String, Routes) {
    if raw == "/api/graphql" {
        let routes = if enterprise { Routes::Api } else { Routes::Any };
        return ("/graphql".into(), routes);
    }
    match (
        raw.strip_prefix("/api/v3").filter(|p| p.starts_with('/')),
        enterprise,
    ) {
        // Enterprise Server has no GraphQL under the REST prefix: no route matches it whole.
        (Some("/graphql"), true) => (raw.to_string(), Routes::Api),
        (Some(path), true) => (path.to_string(), Routes::Api),
        (None, true) => (raw.to_string(), Routes::Git),
        (path, false) => (path.unwrap_or(raw).to_string(), Routes::Any),
    }
}

/// What Enterprise Server's web UI answers for a path it does not know.
fn web_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [("content-type", "text/html; charset=utf-8")],
        "<!DOCTYPE html><html><body><h1>Page not found</h1></body></html>",
    )
        .into_response()
}

/// The API's routes (bearer token), after recording and fault injection.
fn api(
    d: &mut Data,
    method: Method,
    uri: &Uri,
    path: &str,
    auth: Option<&str>,
    accept: Option<&str>,
    body_json: &Value,
) -> Response {
    if auth != Some(&format!("Bearer {TOKEN}")) {
        return error(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    let web = d.site.web.clone();

    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let query: BTreeMap<String, String> = uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();

    if let Some(response) = fake_review::route(d, &method, &segments, &query, body_json, accept)
        .or_else(|| fake_git::route(d, &method, &segments, &query, body_json))
        .or_else(|| labels_route(d, &method, &segments, &query, body_json))
    {
        return response;
    }

    match (method.clone(), segments.as_slice()) {
        (Method::POST, ["graphql"]) => graphql(d, body_json),
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
        (Method::GET, ["users", login]) => ok(
            StatusCode::OK,
            json!({"login": login, "id": 7, "type": if d.bots.iter().any(|b| b == login) { "Bot" } else { "User" }}),
        ),
        (Method::GET, ["repos", _, _, "issues", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match d.issues.get(&n).cloned() {
                Some(mut issue) => {
                    issue["comments"] = json!(d.comments.get(&n).map_or(0, Vec::len));
                    issue["labels"] = issue_label_objects(d, n);
                    ok(StatusCode::OK, issue)
                }
                None => error(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        (Method::GET, ["repos", o, r, "issues", n, "comments"]) => {
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
                                "html_url": format!("{web}/{o}/{r}/issues/{n}#issuecomment-{}", c.id),
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
                       "html_url": format!("{web}/{o}/{r}/issues/{n}#issuecomment-{id}"),
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
                       "html_url": format!("{web}/{o}/{r}/issues/{n}#issuecomment-{id}"),
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
            d.reactions.push((path.to_string(), content.to_string()));
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
        _ => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// Colors of seeded labels, in turn (GitHub's defaults for a new repository's labels).
const LABEL_COLORS: [&str; 8] = [
    "d73a4a", "0075ca", "cfd3d7", "a2eeef", "7057ff", "008672", "e4e669", "d876e3",
];
/// The color GitHub gives a label it creates because an issue was given an unknown one.
const NEW_LABEL_COLOR: &str = "ededed";

fn label_object(d: &Data, name: &str) -> Value {
    let (i, color) = d
        .labels
        .iter()
        .enumerate()
        .find(|(_, (l, _))| l == name)
        .map_or((0, NEW_LABEL_COLOR), |(i, (_, c))| (i + 1, c.as_str()));
    json!({"id": 7_000_000 + i as u64, "node_id": format!("LA_{i}"), "name": name,
           "color": color, "default": false, "description": null})
}

fn issue_label_objects(d: &Data, n: u64) -> Value {
    let names = d.issue_labels.get(&n).cloned().unwrap_or_default();
    Value::Array(names.iter().map(|l| label_object(d, l)).collect())
}

/// The repository's label called `name` (GitHub matches label names ignoring case); an unknown
/// one is created, as GitHub creates it when an issue is given it.
fn ensure_label(d: &mut Data, name: &str) -> String {
    if let Some((l, _)) = d.labels.iter().find(|(l, _)| l.eq_ignore_ascii_case(name)) {
        return l.clone();
    }
    d.labels.push((name.to_string(), NEW_LABEL_COLOR.into()));
    name.to_string()
}

/// Adds labels (strings, or objects with a `name`) to an issue; `None` when one is malformed.
fn add_labels(d: &mut Data, n: u64, labels: &[Value]) -> Option<()> {
    for l in labels {
        let name = l.as_str().or_else(|| l["name"].as_str())?;
        let name = ensure_label(d, name);
        let list = d.issue_labels.entry(n).or_default();
        if !list.contains(&name) {
            list.push(name);
        }
    }
    Some(())
}

/// Repository labels, issue labels and issue creation; `None` for any other route.
fn labels_route(
    d: &mut Data,
    method: &Method,
    segments: &[&str],
    query: &BTreeMap<String, String>,
    body: &Value,
) -> Option<Response> {
    let known = |d: &Data, n: &str| {
        n.parse::<u64>()
            .ok()
            .filter(|n| d.issues.contains_key(n) || d.pulls.contains_key(n))
    };
    let response = match (method.clone(), segments) {
        // A user's permission: the seeded one (`set_permission`), else `admin`.
        (Method::GET, ["repos", _, _, "collaborators", login, "permission"]) => {
            let permission = d
                .permissions
                .get(*login)
                .cloned()
                .unwrap_or_else(|| "admin".into());
            ok(
                StatusCode::OK,
                json!({"permission": permission, "user": {"login": login}}),
            )
        }
        (Method::GET, ["repos", _, _, "labels"]) => {
            let number = |k: &str, default: usize| {
                query.get(k).and_then(|v| v.parse().ok()).unwrap_or(default)
            };
            let per_page = number("per_page", 30).clamp(1, 100);
            let page = number("page", 1).max(1);
            let names: Vec<String> = d.labels.iter().map(|(l, _)| l.clone()).collect();
            let list = names
                .iter()
                .skip((page - 1) * per_page)
                .take(per_page)
                .map(|l| label_object(d, l))
                .collect();
            ok(StatusCode::OK, Value::Array(list))
        }
        (Method::GET, ["repos", _, _, "issues", n, "labels"]) => match known(d, n) {
            Some(n) => ok(StatusCode::OK, issue_label_objects(d, n)),
            None => error(StatusCode::NOT_FOUND, "Not Found"),
        },
        (Method::POST, ["repos", _, _, "issues", n, "labels"]) => {
            let Some(n) = known(d, n) else {
                return Some(error(StatusCode::NOT_FOUND, "Not Found"));
            };
            let labels = body["labels"].as_array().or(body.as_array()).cloned();
            match labels.and_then(|l| add_labels(d, n, &l)) {
                Some(()) => ok(StatusCode::OK, issue_label_objects(d, n)),
                None => error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed"),
            }
        }
        (Method::DELETE, ["repos", _, _, "issues", n, "labels", name @ ..]) if !name.is_empty() => {
            let Some(n) = known(d, n) else {
                return Some(error(StatusCode::NOT_FOUND, "Not Found"));
            };
            let name = fake_git::decode(&name.join("/"));
            let list = d.issue_labels.entry(n).or_default();
            match list.iter().position(|l| l.eq_ignore_ascii_case(&name)) {
                Some(i) => {
                    list.remove(i);
                    ok(StatusCode::OK, issue_label_objects(d, n))
                }
                None => error(StatusCode::NOT_FOUND, "Label does not exist"),
            }
        }
        (Method::POST, ["repos", o, r, "issues"]) => create_issue(d, o, r, body),
        _ => return None,
    };
    Some(response)
}

fn create_issue(d: &mut Data, o: &str, r: &str, body: &Value) -> Response {
    let Some(title) = body["title"].as_str().filter(|t| !t.trim().is_empty()) else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
    };
    let text = body["body"].as_str().unwrap_or("");
    let labels = body["labels"].as_array().cloned().unwrap_or_default();
    let number = d
        .issues
        .keys()
        .chain(d.pulls.keys())
        .max()
        .map_or(1, |n| n + 1);
    if add_labels(d, number, &labels).is_none() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
    }
    let user = json!({"login": "github-actions[bot]", "type": "Bot"});
    d.issues.insert(
        number,
        json!({"number": number, "title": title, "body": text, "state": "open",
               "locked": false, "user": user, "author_association": "NONE"}),
    );
    d.created_issues.push(body.clone());
    ok(
        StatusCode::CREATED,
        json!({"id": 8_000_000 + number, "node_id": format!("I_{number}"), "number": number,
               "html_url": format!("{}/{o}/{r}/issues/{number}", d.site.web),
               "title": title, "body": text, "state": "open", "user": user,
               "labels": issue_label_objects(d, number)}),
    )
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
    if let Some(response) = fake_review::graphql(d, query, &vars) {
        return response;
    }
    if query.contains("createCommitOnBranch") {
        return fake_git::create_commit_on_branch(d, &vars);
    }
    if query.contains("convertPullRequestToDraft") {
        return fake_git::convert_to_draft(d, &vars);
    }
    // Who the token is in GraphQL: a personal token's user, else the Actions app (no `[bot]`).
    let viewer = d.user.clone().unwrap_or_else(|| "github-actions".into());
    let web = d.site.web.clone();
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
            "{web}/o/r/discussions/{number}#discussioncomment-{}",
            comment.id
        );
        d.edits.push((node.clone(), text));
        return ok(
            StatusCode::OK,
            json!({"data": {"updateDiscussionComment": {"comment": {"id": node, "url": url}}}}),
        );
    }
    if query.contains("viewerDidAuthor") && query.contains("node(id:") {
        // The same comments, the discussion named by its node id (a lost post's look-up).
        let node = vars["id"].as_str().unwrap_or("");
        let Some((_, _, _, comments)) = d.discussions.values().find(|(n, ..)| n == node) else {
            return gql_error(&format!(
                "Could not resolve to a node with the global id of '{node}'"
            ));
        };
        let nodes: Vec<Value> = comments
            .iter()
            .skip(comments.len().saturating_sub(100))
            .map(|c| {
                json!({"id": format!("DC_{}", c.id), "body": c.body,
                       "url": format!("{web}/o/r/discussions#discussioncomment-{}", c.id),
                       "viewerDidAuthor": c.author == viewer})
            })
            .collect();
        return ok(
            StatusCode::OK,
            json!({"data": {"node": {"comments": {"nodes": nodes}}}}),
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
                       "url": format!("{web}/o/r/discussions/{number}#discussioncomment-{}", c.id),
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
        let url = format!("{web}/o/r/discussions/{number}#discussioncomment-{id}");
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
