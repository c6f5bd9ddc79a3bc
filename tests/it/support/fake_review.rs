//! Test service: GitHub's pull-request review endpoints, for [`super::fake_github`] (which routes
//! here before [`super::fake_git`]): the `.diff` media type of compare and pull-request requests,
//! `GET`/`POST /pulls/{n}/reviews`, `GET /pulls/{n}/comments`, `POST
//! /pulls/{n}/comments/{id}/replies`, and GraphQL's `reviewThreads` query and
//! `resolveReviewThread` mutation.
//!
//! Diffs are real git's (`git diff` from the merge base in the fake's bare repository), and review
//! comments are placed against them with a hunk parser of this file's own, so the fake shares no
//! code with the client it tests. Behaviours of GitHub it reproduces, because a client can trip on
//! each:
//! - a review is all or nothing: when one comment fails, nothing at all is created;
//! - the 422 for a misplaced comment does not say which comment it is (`Pull request review
//!   thread line must be part of the diff`, `... start line must be part of the same hunk as the
//!   line.`, `Path could not be resolved`), and `reject_review_comments_on` makes GitHub refuse a
//!   line the client believes valid;
//! - a comment's line is a line of the diff of the review's commit on its side (RIGHT: added and
//!   context lines by new number; LEFT: removed and context lines by old number); a multi-line
//!   comment's start line precedes it in the same hunk;
//! - no approving or requesting changes on one's own pull request; COMMENT and REQUEST_CHANGES
//!   need a body or comments; bodies are at most 65536 characters; a review without `event` stays
//!   PENDING (unpublished: its comments start no thread);
//! - a reply is its own review (COMMENTED, empty body) and joins the thread of the comment it
//!   answers, `in_reply_to_id` naming the thread's first comment;
//! - REST logins of the Actions app end in `[bot]`, GraphQL's do not;
//! - lists page with `per_page` (at most 100) and `page`, and say so in a `Link` header.
//!
//! GraphQL answers only the exact operations in [`THREADS_QUERY`] and [`RESOLVE_MUTATION`]
//! (whitespace aside): any other text naming those fields gets a GraphQL error, so a client
//! reading a field it did not ask for cannot pass here and fail on GitHub.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::fake_git::{self, Repo};
use super::fake_github::{error, ok, Data, FakeGitHub, Site};

/// The review-threads query the fake answers.
pub const THREADS_QUERY: &str = "query($owner:String!,$name:String!,$number:Int!,$cursor:String){repository(owner:$owner,name:$name){pullRequest(number:$number){reviewThreads(first:100,after:$cursor){pageInfo{hasNextPage endCursor} nodes{id isResolved isOutdated path line startLine diffSide comments(first:50){nodes{fullDatabaseId body author{login}}}}}}}}";
/// The resolve mutation the fake answers.
pub const RESOLVE_MUTATION: &str =
    "mutation($thread:ID!){resolveReviewThread(input:{threadId:$thread}){thread{id isResolved}}}";

const CREATE_DOCS: &str =
    "https://docs.github.com/rest/pulls/reviews#create-a-review-for-a-pull-request";
const REPLY_DOCS: &str =
    "https://docs.github.com/rest/pulls/comments#create-a-reply-for-a-review-comment";
const MAX_BODY: usize = 65_536;
const LINE_NOT_IN_DIFF: &str = "Pull request review thread line must be part of the diff";
const START_NOT_IN_HUNK: &str =
    "Pull request review thread start line must be part of the same hunk as the line.";
const PATH_UNRESOLVED: &str = "Path could not be resolved";
const TOO_LONG: &str = "Body is too long (maximum is 65536 characters)";
const THREADS_PAGE: usize = 100;
const COMMENTS_PAGE: usize = 50;

/// Reviews, threads and what tests ask about them, kept in the fake's [`Data`].
#[derive(Debug, Default)]
pub(super) struct ReviewState {
    /// Every review of every pull request, oldest first.
    reviews: Vec<Review>,
    /// Every published thread, oldest first.
    threads: Vec<Thread>,
    /// (in_reply_to_id, body) of each reply created.
    replies: Vec<(u64, String)>,
    /// Thread node ids, each time a resolve succeeded.
    resolved: Vec<String>,
    /// Paths whose next review is refused though its lines are valid (one-shot each).
    reject: Vec<String>,
    /// Creations so far: the source of the timestamps, so order shows in them.
    clock: u64,
}

#[derive(Debug, Clone)]
struct Author {
    /// The REST login (`github-actions[bot]` for the Actions app).
    login: String,
    kind: &'static str,
    association: &'static str,
}

impl Author {
    /// GraphQL names a bot without the `[bot]` suffix.
    fn graphql_login(&self) -> &str {
        self.login.strip_suffix("[bot]").unwrap_or(&self.login)
    }

    fn json(&self) -> Value {
        json!({"login": self.login, "type": self.kind})
    }
}

#[derive(Debug, Clone)]
struct Review {
    id: u64,
    pr: u64,
    author: Author,
    body: String,
    state: &'static str,
    commit: String,
    at: String,
}

#[derive(Debug, Clone)]
struct Comment {
    id: u64,
    review: u64,
    author: Author,
    body: String,
    reply_to: Option<u64>,
    at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Left => "LEFT",
            Side::Right => "RIGHT",
        }
    }

    /// `None` when absent; `Err` when not one of GitHub's two values.
    fn parse(v: &Value) -> Result<Option<Side>, ()> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) if s == "LEFT" => Ok(Some(Side::Left)),
            Value::String(s) if s == "RIGHT" => Ok(Some(Side::Right)),
            _ => Err(()),
        }
    }
}

/// Where a comment sits in the diff of the commit it was made on.
#[derive(Debug, Clone)]
struct Placement {
    path: String,
    line: u64,
    side: Side,
    start: Option<(u64, Side)>,
    /// The texts of the diff's lines from the start line to the line, markers aside.
    anchor: Vec<String>,
    /// GitHub's `diff_hunk`: the hunk's header and its lines up to the line.
    diff_hunk: String,
}

#[derive(Debug, Clone)]
struct Thread {
    node: String,
    pr: u64,
    at: Placement,
    /// The commit the thread was started on.
    commit: String,
    resolved: bool,
    comments: Vec<Comment>,
}

// ---------------------------------------------------------------------------------------------
// The diff: real git's output, read by a parser of the fake's own.

/// One line of a hunk: its number in the old file (removed and context lines) and in the new
/// file (added and context lines), its marker and its text.
#[derive(Debug, Clone)]
struct DiffLine {
    old: Option<u64>,
    new: Option<u64>,
    marker: char,
    text: String,
}

#[derive(Debug, Clone)]
struct Hunk {
    header: String,
    lines: Vec<DiffLine>,
}

impl Hunk {
    /// The index of the line numbered `n` on `side`.
    fn find(&self, side: Side, n: u64) -> Option<usize> {
        self.lines.iter().position(|l| match side {
            Side::Left => l.old == Some(n),
            Side::Right => l.new == Some(n),
        })
    }

    /// GitHub's `diff_hunk` for a comment on line `end`.
    fn render(&self, end: usize) -> String {
        let lines = self.lines[..=end]
            .iter()
            .map(|l| format!("{}{}", l.marker, l.text));
        std::iter::once(self.header.clone())
            .chain(lines)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The files of a diff by path (the new one; the old one for a deletion), each with its hunks
/// (none for a binary file or a mode change: in the diff, with no line to comment on).
type Files = BTreeMap<String, Vec<Hunk>>;

/// Undoes git's C-style quoting of a path (`"a/caf\303\251"`).
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
        return s.to_string();
    };
    let (mut out, mut bytes) = (Vec::new(), inner.bytes().peekable());
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    if let Some(d) = bytes.next_if(|d| (b'0'..=b'7').contains(d)) {
                        v = v * 8 + u32::from(d - b'0');
                    }
                }
                out.push(v as u8);
            }
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'r') => out.push(b'\r'),
            Some(c) => out.push(c),
            None => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The path of `diff --git a/P b/P` when both sides name the same one (not a rename).
fn same_path(rest: &str) -> Option<String> {
    let half = rest.len().checked_sub(1)? / 2;
    let (left, right) = (rest.get(..half)?, rest.get(half + 1..)?);
    let a = unquote(left).strip_prefix("a/")?.to_string();
    let b = unquote(right).strip_prefix("b/")?.to_string();
    (rest.get(half..=half) == Some(" ") && a == b).then_some(a)
}

/// `@@ -a,b +c,d @@`: (old start, old count, new start, new count).
fn hunk_header(line: &str) -> Option<(u64, u64, u64, u64)> {
    let mut parts = line.strip_prefix("@@ -")?.split(' ');
    let range = |r: &str| -> Option<(u64, u64)> {
        match r.split_once(',') {
            Some((s, c)) => Some((s.parse().ok()?, c.parse().ok()?)),
            None => Some((r.parse().ok()?, 1)),
        }
    };
    let (a, b) = range(parts.next()?)?;
    let (c, d) = range(parts.next()?.strip_prefix('+')?)?;
    Some((a, b, c, d))
}

/// Reads a `git diff`: hunk lines are counted by their header, so a removed line that reads
/// like a file header (`--- x`) is still a line.
fn parse_diff(text: &str) -> Files {
    let mut files = Files::new();
    let mut path: Option<String> = None;
    let (mut old, mut new, mut old_left, mut new_left) = (0u64, 0u64, 0u64, 0u64);
    for raw in text.split('\n') {
        if old_left > 0 || new_left > 0 {
            let marker = raw.chars().next().unwrap_or(' ');
            let (o, n) = match marker {
                ' ' => (Some(old), Some(new)),
                '-' => (Some(old), None),
                '+' => (None, Some(new)),
                '\\' => continue,
                _ => (None, None),
            };
            if let (Some(p), true) = (&path, o.is_some() || n.is_some()) {
                let hunk = files.entry(p.clone()).or_default().last_mut();
                hunk.expect("a hunk").lines.push(DiffLine {
                    old: o,
                    new: n,
                    marker,
                    text: raw.get(1..).unwrap_or("").to_string(),
                });
                old += u64::from(o.is_some());
                new += u64::from(n.is_some());
                old_left = old_left.saturating_sub(u64::from(o.is_some()));
                new_left = new_left.saturating_sub(u64::from(n.is_some()));
                continue;
            }
            (old_left, new_left) = (0, 0);
        }
        if let Some(rest) = raw.strip_prefix("diff --git ") {
            path = same_path(rest);
        } else if let Some(p) = raw.strip_prefix("+++ ").filter(|p| *p != "/dev/null") {
            // git ends the name with a tab when it has a space (as GNU diff does).
            let p = p.strip_suffix('\t').unwrap_or(p);
            path = unquote(p).strip_prefix("b/").map(str::to_string);
        } else if let Some(p) = raw.strip_prefix("rename to ") {
            path = Some(unquote(p));
        } else if let (Some((a, b, c, d)), Some(p)) = (hunk_header(raw), &path) {
            let header = raw.to_string();
            files.entry(p.clone()).or_default().push(Hunk {
                header,
                lines: Vec::new(),
            });
            (old, old_left, new, new_left) = (a, b, c, d);
            continue;
        }
        if let Some(p) = &path {
            files.entry(p.clone()).or_default();
        }
    }
    files
}

/// `git diff` from the merge base of `base` and `head` to `head`, as GitHub's `.diff` shows a
/// three-dot comparison; `None` when either commit is unknown.
fn diff_bytes(repo: &Repo, base: &str, head: &str) -> Option<Vec<u8>> {
    let (base, head) = (repo.resolve(base)?, repo.resolve(head)?);
    let merge_base = repo.git(&["merge-base", &base, &head]).ok()?;
    let args = ["diff", "--no-color", "--no-ext-diff", &merge_base, &head];
    repo.git_with(&args, None, &[]).ok()
}

fn files_between(repo: &Repo, base: &str, head: &str) -> Files {
    let bytes = diff_bytes(repo, base, head).unwrap_or_default();
    parse_diff(&String::from_utf8_lossy(&bytes))
}

// ---------------------------------------------------------------------------------------------
// Answers.

fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "Not Found")
}

/// GitHub's review 422: `errors` are sentences that name no comment.
fn unprocessable(errors: &[&str], docs: &str) -> Response {
    let body = json!({"message": "Unprocessable Entity", "errors": errors,
                      "documentation_url": docs, "status": "422"});
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response()
}

/// GitHub's answer to a request its schema rejects.
fn invalid(detail: &str, docs: &str) -> Response {
    let body = json!({"message": format!("Invalid request.\n\n{detail}"),
                      "documentation_url": docs, "status": "422"});
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response()
}

fn diff_response(bytes: Vec<u8>) -> Response {
    let kind = [("content-type", "text/plain; charset=utf-8")];
    (StatusCode::OK, kind, bytes).into_response()
}

/// Whether `Accept` asks for the diff media type.
fn wants_diff(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|t| {
            let t = t
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            t == "application/vnd.github.diff" || t == "application/vnd.github.v3.diff"
        })
    })
}

/// One page of `items` by `per_page` (default 30, at most 100) and `page`, with GitHub's `Link`.
fn paginate(
    site: &Site,
    path: &str,
    query: &BTreeMap<String, String>,
    items: Vec<Value>,
) -> Response {
    let number = |k: &str, default: usize| {
        query
            .get(k)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(default)
    };
    let per_page = number("per_page", 30).clamp(1, 100);
    let page = number("page", 1).max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let list: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut response = ok(StatusCode::OK, Value::Array(list));
    let link = |p: usize, rel: &str| {
        format!(
            "<{}{path}?per_page={per_page}&page={p}>; rel=\"{rel}\"",
            site.api
        )
    };
    let mut links = Vec::new();
    if page < last {
        links.extend([link(page + 1, "next"), link(last, "last")]);
    }
    if page > 1 {
        links.extend([link(1, "first"), link(page.min(last + 1) - 1, "prev")]);
    }
    if let Ok(v) = HeaderValue::from_str(&links.join(", ")) {
        if !links.is_empty() {
            response.headers_mut().insert("link", v);
        }
    }
    response
}

/// Who the token is: a personal token's user, else the Actions app.
fn token_author(d: &Data) -> Author {
    match &d.user {
        Some(login) => Author {
            login: login.clone(),
            kind: "User",
            association: "OWNER",
        },
        None => Author {
            login: fake_git::BOT_NAME.into(),
            kind: "Bot",
            association: "NONE",
        },
    }
}

fn next_id(d: &mut Data) -> u64 {
    let id = d.next_id;
    d.next_id += 1;
    id
}

/// A timestamp later than every earlier one.
fn tick(d: &mut Data) -> String {
    d.review.clock += 1;
    let s = d.review.clock;
    format!("2026-11-29T10:{:02}:{:02}Z", s / 60 % 60, s % 60)
}

fn review_json(site: &Site, full: &str, r: &Review) -> Value {
    let submitted = (r.state != "PENDING").then(|| r.at.clone());
    json!({"id": r.id, "node_id": format!("PRR_{}", r.id), "user": r.author.json(),
           "body": r.body, "state": r.state, "commit_id": r.commit,
           "author_association": r.author.association,
           "html_url": format!("{}/{full}/pull/{}#pullrequestreview-{}", site.web, r.pr, r.id),
           "pull_request_url": format!("{}/repos/{full}/pulls/{}", site.api, r.pr),
           "submitted_at": submitted})
}

/// A review comment in REST's shape; `head` is the pull request's head when the thread still
/// applies there (GitHub then shows it on that commit), `None` when it is outdated (no `line`).
fn comment_json(site: &Site, full: &str, t: &Thread, c: &Comment, head: Option<&str>) -> Value {
    let (id, at) = (c.id, &t.at);
    let start = at.start.map(|s| s.0);
    let (line, start_line, commit) = match head {
        Some(head) => (json!(at.line), json!(start), head.to_string()),
        None => (Value::Null, Value::Null, t.commit.clone()),
    };
    let mut v = json!({"id": id, "node_id": format!("PRRC_{id}"),
        "pull_request_review_id": c.review, "diff_hunk": at.diff_hunk, "path": at.path,
        "commit_id": commit, "original_commit_id": t.commit, "user": c.author.json(),
        "body": c.body, "created_at": c.at, "updated_at": c.at,
        "html_url": format!("{}/{full}/pull/{}#discussion_r{id}", site.web, t.pr),
        "pull_request_url": format!("{}/repos/{full}/pulls/{}", site.api, t.pr),
        "author_association": c.author.association, "start_line": start_line,
        "original_start_line": start, "start_side": at.start.map(|s| s.1.name()),
        "line": line, "original_line": at.line, "side": at.side.name(), "subject_type": "line"});
    if let Some(to) = c.reply_to {
        v["in_reply_to_id"] = json!(to);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Outdated threads.

/// The pull request's head and its diff now.
fn current(d: &Data, pr: u64) -> Option<(String, Files)> {
    let repo = d.git.repo()?;
    let pull = d.pulls.get(&pr)?;
    let head = pull["head"]["sha"].as_str()?.to_string();
    let base = pull["base"]["sha"]
        .as_str()
        .or(pull["base"]["ref"].as_str())?;
    let files = files_between(&repo, base, &head);
    Some((head, files))
}

/// Whether a thread still applies to the pull request's current diff. An approximation of
/// GitHub's, which follows a line through later commits: here the thread is current when its
/// file is still in the diff and the lines from its start line to its line are still in one
/// hunk, at the same numbers on their sides, with the same texts; anything else is outdated
/// (the line edited, moved by an edit above it, or its change undone).
fn applies(at: &Placement, files: &Files) -> bool {
    let Some(hunks) = files.get(&at.path) else {
        return false;
    };
    hunks.iter().any(|h| {
        span(h, at).is_some_and(|(begin, end)| {
            let texts = h.lines[begin..=end].iter().map(|l| l.text.as_str());
            texts.eq(at.anchor.iter().map(String::as_str))
        })
    })
}

/// The indexes of a placement's start line and line in `h`, both there and in order.
fn span(h: &Hunk, at: &Placement) -> Option<(usize, usize)> {
    let end = h.find(at.side, at.line)?;
    let begin = match at.start {
        Some((n, side)) => h.find(side, n)?,
        None => end,
    };
    (begin <= end).then_some((begin, end))
}

/// Each thread of `pr` with the head it applies at (`None`: outdated).
fn threads_now(d: &Data, pr: u64) -> Vec<(&Thread, Option<String>)> {
    let now = current(d, pr);
    d.review
        .threads
        .iter()
        .filter(|t| t.pr == pr)
        .map(|t| {
            let head = now
                .as_ref()
                .filter(|(_, files)| applies(&t.at, files))
                .map(|(head, _)| head.clone());
            (t, head)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// REST.

/// The review routes and the diff media type; `None` for any other request.
pub(super) fn route(
    d: &mut Data,
    method: &Method,
    segments: &[&str],
    query: &BTreeMap<String, String>,
    body: &Value,
    accept: Option<&str>,
) -> Option<Response> {
    let ["repos", o, r, rest @ ..] = segments else {
        return None;
    };
    let full = format!("{o}/{r}");
    let pr = |d: &Data, n: &str| n.parse::<u64>().ok().filter(|n| d.pulls.contains_key(n));
    let site = d.site.clone();
    let path = format!("/{}", segments.join("/"));
    let response = match (method.clone(), rest) {
        (Method::GET, ["compare", spec @ ..]) if wants_diff(accept) && !spec.is_empty() => {
            compare_diff(d, &fake_git::decode(&spec.join("/")))
        }
        (Method::GET, ["pulls", n]) if wants_diff(accept) => {
            let diff = pr(d, n).and_then(|n| current_diff(d, n));
            diff.map_or_else(not_found, diff_response)
        }
        (Method::GET, ["pulls", n, "reviews"]) => match pr(d, n) {
            Some(n) => {
                let list = d.review.reviews.iter().filter(|r| r.pr == n);
                let list = list.map(|r| review_json(&site, &full, r)).collect();
                paginate(&site, &path, query, list)
            }
            None => not_found(),
        },
        (Method::POST, ["pulls", n, "reviews"]) => match pr(d, n) {
            Some(n) => create_review(d, &full, n, body),
            None => not_found(),
        },
        (Method::GET, ["pulls", n, "comments"]) => match pr(d, n) {
            Some(n) => paginate(&site, &path, query, comments_of(d, &full, n)),
            None => not_found(),
        },
        (Method::POST, ["pulls", n, "comments", id, "replies"]) => match pr(d, n) {
            Some(n) => reply(d, &full, n, id.parse().unwrap_or(0), body),
            None => not_found(),
        },
        _ => return None,
    };
    Some(response)
}

/// `GET /compare/{base}...{head}` as a diff.
fn compare_diff(d: &Data, spec: &str) -> Response {
    let Some((base, head)) = spec.split_once("...") else {
        return not_found();
    };
    // `owner:branch` names a branch of a repository in the network; there is only this one.
    let strip = |s: &str| s.split_once(':').map_or(s, |(_, b)| b).to_string();
    let diff = d
        .git
        .repo()
        .and_then(|repo| diff_bytes(&repo, &strip(base), &strip(head)));
    diff.map_or_else(not_found, diff_response)
}

fn current_diff(d: &Data, pr: u64) -> Option<Vec<u8>> {
    let pull = d.pulls.get(&pr)?;
    let head = pull["head"]["sha"].as_str()?;
    let base = pull["base"]["sha"].as_str()?;
    diff_bytes(&d.git.repo()?, base, head)
}

/// Every review comment of `pr`, oldest first, in REST's shape.
fn comments_of(d: &Data, full: &str, pr: u64) -> Vec<Value> {
    let mut list: Vec<(u64, Value)> = threads_now(d, pr)
        .into_iter()
        .flat_map(|(t, head)| {
            t.comments.iter().map(move |c| {
                let v = comment_json(&d.site, full, t, c, head.as_deref());
                (c.id, v)
            })
        })
        .collect();
    list.sort_by_key(|(id, _)| *id);
    list.into_iter().map(|(_, v)| v).collect()
}

/// GitHub's refusal of a request, boxed: a `Response` is large for an `Err`.
type Refusal = Box<Response>;

/// What a `POST /reviews` body asks for, once its shape is valid.
struct ReviewRequest {
    commit: Option<String>,
    body: String,
    /// `None`: no `event`, a pending review.
    event: Option<&'static str>,
    comments: Vec<Value>,
}

impl ReviewRequest {
    fn parse(body: &Value) -> Result<ReviewRequest, Refusal> {
        let bad = |field: &str, what: &str| {
            Box::new(invalid(
                &format!("For 'properties/{field}', {} is not {what}.", body[field]),
                CREATE_DOCS,
            ))
        };
        let text = |field: &str| match &body[field] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(bad(field, "a string")),
        };
        let event = match text("event")?.as_deref() {
            None => None,
            Some("COMMENT") => Some("COMMENTED"),
            Some("REQUEST_CHANGES") => Some("CHANGES_REQUESTED"),
            Some("APPROVE") => Some("APPROVED"),
            Some(_) => {
                return Err(bad(
                    "event",
                    "a member of [\"APPROVE\", \"REQUEST_CHANGES\", \"COMMENT\"]",
                ))
            }
        };
        let comments = match &body["comments"] {
            Value::Null => Vec::new(),
            Value::Array(list) if list.iter().all(Value::is_object) => list.clone(),
            _ => return Err(bad("comments", "an array of objects")),
        };
        Ok(ReviewRequest {
            commit: text("commit_id")?,
            body: text("body")?.unwrap_or_default(),
            event,
            comments,
        })
    }
}

/// Where one requested comment goes in `files`, or GitHub's refusal.
fn place(files: &Files, c: &Value) -> Result<(Placement, String), Refusal> {
    let bad = |field: &str, what: &str| {
        Box::new(invalid(
            &format!("For 'items/{field}', {} is not {what}.", c[field]),
            CREATE_DOCS,
        ))
    };
    let sides = "a member of [\"LEFT\", \"RIGHT\"]";
    let Some(path) = c["path"].as_str() else {
        return Err(bad("path", "a string"));
    };
    let Some(body) = c["body"].as_str() else {
        return Err(bad("body", "a string"));
    };
    let side = Side::parse(&c["side"])
        .map_err(|()| bad("side", sides))?
        .unwrap_or(Side::Right);
    let start_side = Side::parse(&c["start_side"]).map_err(|()| bad("start_side", sides))?;
    let start_line = match &c["start_line"] {
        Value::Null => None,
        v => Some(v.as_u64().ok_or_else(|| bad("start_line", "an integer"))?),
    };
    let fail = |message: &str| Err(Box::new(unprocessable(&[message], CREATE_DOCS)));
    if body.chars().count() > MAX_BODY {
        return fail(TOO_LONG);
    }
    let Some(hunks) = files.get(path) else {
        return fail(PATH_UNRESOLVED);
    };
    let line = c["line"].as_u64().unwrap_or(0);
    let found = hunks
        .iter()
        .find_map(|h| h.find(side, line).map(|end| (h, end)));
    let Some((hunk, end)) = found else {
        return fail(LINE_NOT_IN_DIFF);
    };
    let start = start_line.map(|n| (n, start_side.unwrap_or(side)));
    let begin = match start {
        None => end,
        Some((n, s)) => match hunk.find(s, n).filter(|b| n < line && *b <= end) {
            Some(b) => b,
            None => return fail(START_NOT_IN_HUNK),
        },
    };
    let placement = Placement {
        path: path.to_string(),
        line,
        side,
        start,
        anchor: hunk.lines[begin..=end]
            .iter()
            .map(|l| l.text.clone())
            .collect(),
        diff_hunk: hunk.render(end),
    };
    Ok((placement, body.to_string()))
}

/// The review-level checks, in the order GitHub makes them; the commit the review is on.
fn check_review(d: &Data, pr: u64, req: &ReviewRequest) -> Result<String, Refusal> {
    let (Some(repo), Some(pull)) = (d.git.repo(), d.pulls.get(&pr)) else {
        return Err(Box::new(not_found()));
    };
    let fail = |message: &str| Err(Box::new(unprocessable(&[message], CREATE_DOCS)));
    let head = pull["head"]["sha"].as_str().unwrap_or("");
    let wanted = req.commit.as_deref().unwrap_or(head);
    let Some(commit) = repo.resolve(wanted).filter(|c| repo.is_ancestor(c, head)) else {
        return fail("Commit could not be resolved");
    };
    let own = pull["user"]["login"].as_str() == Some(token_author(d).login.as_str());
    match req.event {
        Some("APPROVED") if own => return fail("Can not approve your own pull request"),
        Some("CHANGES_REQUESTED") if own => {
            return fail("Can not request changes on your own pull request")
        }
        Some("COMMENTED" | "CHANGES_REQUESTED")
            if req.body.trim().is_empty() && req.comments.is_empty() =>
        {
            return fail("Review body can't be blank")
        }
        _ => {}
    }
    if req.body.chars().count() > MAX_BODY {
        return fail(TOO_LONG);
    }
    Ok(commit)
}

/// `POST /pulls/{n}/reviews`: every check first, then everything is created, or nothing.
fn create_review(d: &mut Data, full: &str, pr: u64, body: &Value) -> Response {
    let req = match ReviewRequest::parse(body) {
        Ok(req) => req,
        Err(response) => return *response,
    };
    let commit = match check_review(d, pr, &req) {
        Ok(commit) => commit,
        Err(response) => return *response,
    };
    let (Some(repo), Some(pull)) = (d.git.repo(), d.pulls.get(&pr)) else {
        return not_found();
    };
    let base = pull["base"]["sha"].as_str().unwrap_or("").to_string();
    let files = files_between(&repo, &base, &commit);
    let mut placed = Vec::new();
    for c in &req.comments {
        match place(&files, c) {
            Ok(p) => placed.push(p),
            Err(response) => return *response,
        }
        if let Some(i) = d.review.reject.iter().position(|p| c["path"] == p.as_str()) {
            d.review.reject.remove(i);
            return unprocessable(&[LINE_NOT_IN_DIFF], CREATE_DOCS);
        }
    }
    let author = token_author(d);
    let state = req.event.unwrap_or("PENDING");
    let review = add_review(d, pr, &author, &req.body, state, &commit);
    // A pending review's comments are drafts: nobody else sees them, no thread is started.
    if state != "PENDING" {
        for (at, text) in placed {
            open_thread(d, pr, review.id, &author, at, &commit, &text);
        }
    }
    ok(StatusCode::OK, review_json(&d.site, full, &review))
}

fn add_review(
    d: &mut Data,
    pr: u64,
    author: &Author,
    body: &str,
    state: &'static str,
    commit: &str,
) -> Review {
    let review = Review {
        id: next_id(d),
        pr,
        author: author.clone(),
        body: body.to_string(),
        state,
        commit: commit.to_string(),
        at: tick(d),
    };
    d.review.reviews.push(review.clone());
    review
}

/// A new thread and its first comment: (thread node id, comment id).
fn open_thread(
    d: &mut Data,
    pr: u64,
    review: u64,
    author: &Author,
    at: Placement,
    commit: &str,
    body: &str,
) -> (String, u64) {
    let node = format!("PRRT_{}", next_id(d));
    let comment = Comment {
        id: next_id(d),
        review,
        author: author.clone(),
        body: body.to_string(),
        reply_to: None,
        at: tick(d),
    };
    let id = comment.id;
    d.review.threads.push(Thread {
        node: node.clone(),
        pr,
        at,
        commit: commit.to_string(),
        resolved: false,
        comments: vec![comment],
    });
    (node, id)
}

/// `POST /pulls/{n}/comments/{id}/replies`: a one-comment review in the comment's thread.
fn reply(d: &mut Data, full: &str, pr: u64, id: u64, body: &Value) -> Response {
    let Some(i) = d
        .review
        .threads
        .iter()
        .position(|t| t.pr == pr && t.comments.iter().any(|c| c.id == id))
    else {
        return not_found();
    };
    let Some(text) = body["body"].as_str() else {
        let detail = format!("For 'properties/body', {} is not a string.", body["body"]);
        return invalid(&detail, REPLY_DOCS);
    };
    if text.trim().is_empty() {
        return unprocessable(&["Body can't be blank"], REPLY_DOCS);
    }
    if text.chars().count() > MAX_BODY {
        return unprocessable(&[TOO_LONG], REPLY_DOCS);
    }
    let author = token_author(d);
    let head = d.pulls[&pr]["head"]["sha"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let review = add_review(d, pr, &author, "", "COMMENTED", &head);
    let first = d.review.threads[i].comments[0].id;
    let comment = Comment {
        id: next_id(d),
        review: review.id,
        author,
        body: text.to_string(),
        reply_to: Some(first),
        at: tick(d),
    };
    d.review.threads[i].comments.push(comment.clone());
    d.review.replies.push((first, text.to_string()));
    let thread = d.review.threads[i].clone();
    let now = current(d, pr).filter(|(_, files)| applies(&thread.at, files));
    let head = now.as_ref().map(|(head, _)| head.as_str());
    let v = comment_json(&d.site, full, &thread, &comment, head);
    ok(StatusCode::CREATED, v)
}

// ---------------------------------------------------------------------------------------------
// GraphQL.

/// GraphQL's text with insignificant whitespace (and commas, which GraphQL ignores) taken out.
fn normalize(query: &str) -> String {
    let punct = |c: char| "{}()[]:!$=@".contains(c);
    let mut out = String::new();
    let mut space = false;
    for c in query.chars() {
        if c.is_whitespace() || c == ',' {
            space = true;
            continue;
        }
        if space && !punct(c) && out.chars().last().is_some_and(|l| !punct(l)) {
            out.push(' ');
        }
        space = false;
        out.push(c);
    }
    out
}

/// The review operations; `None` for a query that is neither.
pub(super) fn graphql(d: &mut Data, query: &str, vars: &Value) -> Option<Response> {
    let op = if query.contains("reviewThreads") {
        THREADS_QUERY
    } else if query.contains("resolveReviewThread") {
        RESOLVE_MUTATION
    } else {
        return None;
    };
    if normalize(query) != normalize(op) {
        let message = format!("The fake GitHub answers only this operation: {op}");
        return Some(ok(
            StatusCode::OK,
            json!({"errors": [{"message": message}]}),
        ));
    }
    Some(match op {
        THREADS_QUERY => review_threads_query(d, vars),
        _ => resolve_thread(d, vars),
    })
}

/// GraphQL's answer to a variable of the wrong type.
fn variable_error(name: &str, kind: &str, value: &Value) -> Response {
    let message = format!("Variable ${name} of type {kind} was provided invalid value");
    ok(
        StatusCode::OK,
        json!({"errors": [{"extensions": {"value": value, "problems": [{"path": [],
               "explanation": format!("Could not coerce value {value} to {kind}")}]},
               "locations": [{"line": 1, "column": 7}], "message": message}]}),
    )
}

fn review_threads_query(d: &Data, vars: &Value) -> Response {
    for (name, kind) in [("owner", "String!"), ("name", "String!")] {
        if !vars[name].is_string() {
            return variable_error(name, kind, &vars[name]);
        }
    }
    let Some(number) = vars["number"].as_u64() else {
        return variable_error("number", "Int!", &vars["number"]);
    };
    let start = match &vars["cursor"] {
        Value::Null => 0,
        Value::String(c) => match c.parse::<usize>() {
            Ok(i) => i + 1,
            Err(_) => {
                let message = format!("`{c}` does not appear to be a valid cursor.");
                return ok(
                    StatusCode::OK,
                    json!({"data": {"repository": {"pullRequest": {"reviewThreads": null}}},
                           "errors": [{"path": ["repository", "pullRequest", "reviewThreads"],
                                       "message": message}]}),
                );
            }
        },
        v => return variable_error("cursor", "String", v),
    };
    if !d.pulls.contains_key(&number) {
        let message = format!("Could not resolve to a PullRequest with the number of {number}.");
        return ok(
            StatusCode::OK,
            json!({"data": {"repository": {"pullRequest": null}},
                   "errors": [{"type": "NOT_FOUND", "path": ["repository", "pullRequest"],
                               "locations": [{"line": 1, "column": 104}], "message": message}]}),
        );
    }
    let all = threads_now(d, number);
    let page: Vec<Value> = all
        .iter()
        .skip(start)
        .take(THREADS_PAGE)
        .map(|(t, head)| thread_node(t, head.is_some()))
        .collect();
    let end = start + page.len();
    let cursor = (!page.is_empty()).then(|| (end - 1).to_string());
    ok(
        StatusCode::OK,
        json!({"data": {"repository": {"pullRequest": {"reviewThreads": {
               "pageInfo": {"hasNextPage": end < all.len(), "endCursor": cursor},
               "nodes": page}}}}}),
    )
}

fn thread_node(t: &Thread, current: bool) -> Value {
    let comments: Vec<Value> = t
        .comments
        .iter()
        .take(COMMENTS_PAGE)
        .map(|c| {
            // `BigInt`, as GitHub serializes it: a string (ids here are past 2³¹, as on
            // github.com, which no GraphQL `Int` can carry).
            json!({"fullDatabaseId": c.id.to_string(), "body": c.body,
                   "author": {"login": c.author.graphql_login()}})
        })
        .collect();
    json!({"id": t.node, "isResolved": t.resolved, "isOutdated": !current, "path": t.at.path,
           "line": current.then_some(t.at.line),
           "startLine": t.at.start.filter(|_| current).map(|s| s.0),
           "diffSide": t.at.side.name(), "comments": {"nodes": comments}})
}

fn resolve_thread(d: &mut Data, vars: &Value) -> Response {
    let Some(node) = vars["thread"].as_str().map(str::to_string) else {
        return variable_error("thread", "ID!", &vars["thread"]);
    };
    let Some(thread) = d.review.threads.iter_mut().find(|t| t.node == node) else {
        let message = format!("Could not resolve to a node with the global id of '{node}'");
        return ok(
            StatusCode::OK,
            json!({"data": {"resolveReviewThread": null},
                   "errors": [{"type": "NOT_FOUND", "path": ["resolveReviewThread"],
                               "locations": [{"line": 1, "column": 22}], "message": message}]}),
        );
    };
    thread.resolved = true;
    d.review.resolved.push(node.clone());
    ok(
        StatusCode::OK,
        json!({"data": {"resolveReviewThread": {"thread": {"id": node, "isResolved": true}}}}),
    )
}

// ---------------------------------------------------------------------------------------------
// Tests' setup and accessors.

impl FakeGitHub {
    /// A thread someone else (`author_login`; a bot when it ends in `[bot]`) started on the pull
    /// request's current head, in a review of its own: (thread node id, comment id). `side` is
    /// `RIGHT` or `LEFT`; the line must be in the diff.
    #[allow(clippy::too_many_arguments)] // the thread's fields, as tests name them
    pub fn seed_review_thread(
        &self,
        pr: u64,
        path: &str,
        line: u64,
        side: &str,
        author_login: &str,
        body: &str,
        resolved: bool,
    ) -> (String, u64) {
        let mut d = self.lock();
        let (head, files) = current(&d, pr).expect("a pull request on the git repository");
        let c = json!({"path": path, "line": line, "side": side, "body": body});
        let Ok((at, text)) = place(&files, &c) else {
            panic!("{path}:{line} ({side}) is not in pull request {pr}'s diff");
        };
        let bot = author_login.ends_with("[bot]");
        let author = Author {
            login: author_login.to_string(),
            kind: if bot { "Bot" } else { "User" },
            association: if bot { "NONE" } else { "MEMBER" },
        };
        let review = add_review(&mut d, pr, &author, "", "COMMENTED", &head);
        let (node, id) = open_thread(&mut d, pr, review.id, &author, at, &head, &text);
        if resolved {
            let thread = d.review.threads.last_mut().expect("the thread");
            thread.resolved = true;
        }
        (node, id)
    }

    /// The reviews of `pr`, as `GET /pulls/{pr}/reviews` answers them (seeded threads' and
    /// replies' reviews among them).
    pub fn reviews(&self, pr: u64) -> Vec<Value> {
        let d = self.lock();
        d.review
            .reviews
            .iter()
            .filter(|r| r.pr == pr)
            .map(|r| review_json(&d.site, fake_git::REPO, r))
            .collect()
    }

    /// Every `POST /pulls/{n}/reviews` body received, accepted, refused or failed by a scripted
    /// fault, in order.
    pub fn review_posts(&self) -> Vec<Value> {
        let d = self.lock();
        d.requests
            .iter()
            .filter(|r| {
                let s: Vec<&str> = r.path.trim_matches('/').split('/').collect();
                r.method == "POST" && matches!(s.as_slice(), ["repos", _, _, "pulls", _, "reviews"])
            })
            .map(|r| r.body.clone())
            .collect()
    }

    /// The threads of `pr` now: node id, place, whether resolved and outdated, and their comments
    /// in REST's shape.
    pub fn review_threads(&self, pr: u64) -> Vec<Value> {
        let d = self.lock();
        threads_now(&d, pr)
            .into_iter()
            .map(|(t, head)| {
                let comments: Vec<Value> = t
                    .comments
                    .iter()
                    .map(|c| comment_json(&d.site, fake_git::REPO, t, c, head.as_deref()))
                    .collect();
                json!({"node_id": t.node, "path": t.at.path, "line": t.at.line,
                       "side": t.at.side.name(), "start_line": t.at.start.map(|s| s.0),
                       "start_side": t.at.start.map(|s| s.1.name()), "commit_id": t.commit,
                       "resolved": t.resolved, "outdated": head.is_none(), "comments": comments})
            })
            .collect()
    }

    /// Replies created, in order: (the thread's first comment id, body).
    pub fn review_replies(&self) -> Vec<(u64, String)> {
        self.lock().review.replies.clone()
    }

    /// Node ids of the threads resolved through GraphQL, in order.
    pub fn resolved_threads(&self) -> Vec<String> {
        self.lock().review.resolved.clone()
    }

    /// The next review with a comment on `path` is refused with GitHub's "line must be part of
    /// the diff" 422 whatever its lines (once).
    pub fn reject_review_comments_on(&self, path: &str) {
        self.lock().review.reject.push(path.to_string());
    }
}
