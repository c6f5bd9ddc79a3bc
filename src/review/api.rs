//! GitHub's review calls: the pull request and its diff pinned to a commit, fro-bot's earlier
//! reviews and threads, the one review a run posts, replies and resolving. Like every call in
//! `github`, a failure is an `ApiError` for the caller to report; none fails a run.

use serde_json::{json, Value};

use super::view::{cap_diff, Since, MAX_DIFF_BYTES};
use crate::github::api::{one_line, same_body, ApiError, GitHub};
use crate::github::retry::Resend;
use crate::runner::log;
use crate::safe_outputs::proposals::Side;

/// The pull request as a review reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    pub number: u64,
    pub head_sha: String,
    pub base_sha: String,
    pub author: String,
    pub open: bool,
}

/// One of the reviews on the pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastReview {
    pub author: String,
    pub commit_id: String,
    pub body: String,
}

/// One review thread with its comments, as GraphQL lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub id: String,
    pub resolved: bool,
    pub outdated: bool,
    pub path: String,
    pub line: Option<u32>,
    pub start_line: Option<u32>,
    pub side: Side,
    /// (REST id, author login, body), oldest first.
    pub comments: Vec<(u64, String, String)>,
}

/// A review GitHub accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub id: u64,
    pub url: String,
}

/// Why a review was not posted.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// GitHub's 422: it names what it refused, never which comment.
    #[error("GitHub refused the review (HTTP 422): {errors}")]
    Rejected { errors: String },
    #[error(transparent)]
    Api(#[from] ApiError),
}

const THREADS_QUERY: &str = "query($owner:String!,$name:String!,$number:Int!,$cursor:String){repository(owner:$owner,name:$name){pullRequest(number:$number){reviewThreads(first:100,after:$cursor){pageInfo{hasNextPage endCursor} nodes{id isResolved isOutdated path line startLine diffSide comments(first:50){nodes{fullDatabaseId body author{login}}}}}}}}";
const RESOLVE_MUTATION: &str =
    "mutation($thread:ID!){resolveReviewThread(input:{threadId:$thread}){thread{id isResolved}}}";
/// Pages of threads read at most (100 each).
const MAX_THREAD_PAGES: usize = 10;

fn op(operation: &'static str) -> impl Fn(octocrab::Error) -> ApiError {
    move |e| ApiError::from_octocrab(operation, e)
}

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

pub async fn pull(gh: &GitHub, number: u64) -> Result<Pull, ApiError> {
    let v: Value = gh
        .get(format!("{}/pulls/{number}", gh.repo_path()))
        .await
        .map_err(op("get pull request"))?;
    let pull = Pull {
        number,
        head_sha: str_at(&v, "/head/sha"),
        base_sha: str_at(&v, "/base/sha"),
        author: str_at(&v, "/user/login"),
        open: v["state"] == "open",
    };
    match pull.head_sha.is_empty() || pull.base_sha.is_empty() {
        true => Err(ApiError::Transport {
            operation: "get pull request",
            message: "the answer lacks head.sha or base.sha".into(),
        }),
        false => Ok(pull),
    }
}

/// `base...head` as a unified diff (from their merge base, as a pull request's diff is).
pub async fn diff(gh: &GitHub, base: &str, head: &str) -> Result<String, ApiError> {
    raw_diff(gh, format!("{}/compare/{base}...{head}", gh.repo_path())).await
}

/// The pull request's own diff as GitHub serves it now (the check after a 422).
pub async fn pull_diff(gh: &GitHub, number: u64) -> Result<String, ApiError> {
    raw_diff(gh, format!("{}/pulls/{number}", gh.repo_path())).await
}

async fn raw_diff(gh: &GitHub, uri: String) -> Result<String, ApiError> {
    const OP: &str = "get the diff";
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/vnd.github.diff"),
    );
    let read = || async {
        let response = gh
            .client
            ._get_with_headers(&uri, Some(headers.clone()))
            .await?;
        let response = octocrab::map_github_error(response).await?;
        gh.client.body_to_string(response).await
    };
    gh.call(Resend::Free, read).await.map_err(op(OP))
}

/// `from...to`'s status: whether `to` still contains `from` (`ahead` or `identical`).
pub async fn contains(gh: &GitHub, to: &str, from: &str) -> Result<bool, ApiError> {
    match gh.compare(from, to).await {
        Ok((status, _)) => Ok(matches!(status.as_str(), "ahead" | "identical")),
        // A commit a force-push dropped may be gone from the repository.
        Err(e) if e.status() == Some(404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What a review at `head` covers, from the head fro-bot last reviewed: the commits after it when
/// `head` still contains it, else (a force-push, or GitHub cannot say) the whole pull request.
pub async fn since(gh: &GitHub, last: Option<String>, head: &str) -> Since {
    let Some(from) = last else {
        return Since::FirstReview;
    };
    if from == head {
        return Since::Unchanged;
    }
    match contains(gh, head, &from).await {
        Ok(true) => match diff(gh, &from, head).await {
            Ok(diff) => Since::Range {
                from,
                diff: cap_diff(diff, MAX_DIFF_BYTES).0,
            },
            Err(e) => {
                log::warning(&format!(
                    "cannot read the changes since the last review: {e}"
                ));
                Since::Rewritten { from }
            }
        },
        Ok(false) => Since::Rewritten { from },
        Err(e) => {
            log::warning(&format!("cannot compare with the last reviewed head: {e}"));
            Since::Rewritten { from }
        }
    }
}

pub async fn reviews(gh: &GitHub, number: u64) -> Result<Vec<PastReview>, ApiError> {
    let mut out = Vec::new();
    for page in 1..=10u32 {
        let list: Vec<Value> = gh
            .get_with(
                format!("{}/pulls/{number}/reviews", gh.repo_path()),
                &[("per_page", "100"), ("page", &page.to_string())],
            )
            .await
            .map_err(op("list reviews"))?;
        let full = list.len() == 100;
        out.extend(list.iter().map(|r| PastReview {
            author: str_at(r, "/user/login"),
            commit_id: str_at(r, "/commit_id"),
            body: str_at(r, "/body"),
        }));
        if !full {
            break;
        }
    }
    Ok(out)
}

/// A review comment's REST id: GraphQL's `fullDatabaseId`, a `BigInt` GitHub serves as a string
/// (ids are past 2³¹, which the deprecated 32-bit `databaseId` cannot carry).
fn comment_id(comment: &Value) -> Option<u64> {
    comment["fullDatabaseId"].as_str()?.parse().ok()
}

/// A thread as GraphQL lists it; `None` when a comment's id cannot be read (a reply could not
/// name the comment it answers).
fn thread_from(node: &Value) -> Option<Thread> {
    let number = |p: &str| node[p].as_u64().and_then(|n| u32::try_from(n).ok());
    let comments = node
        .pointer("/comments/nodes")?
        .as_array()?
        .iter()
        .map(|c| {
            Some((
                comment_id(c)?,
                str_at(c, "/author/login"),
                str_at(c, "/body"),
            ))
        })
        .collect::<Option<Vec<_>>>();
    let Some(comments) = comments else {
        log::warning(&format!(
            "review thread {} left out: a comment has no readable fullDatabaseId",
            node["id"].as_str().unwrap_or("?")
        ));
        return None;
    };
    Some(Thread {
        id: node["id"].as_str()?.to_string(),
        resolved: node["isResolved"].as_bool().unwrap_or(false),
        outdated: node["isOutdated"].as_bool().unwrap_or(false),
        path: node["path"].as_str()?.to_string(),
        line: number("line"),
        start_line: number("startLine"),
        side: match node["diffSide"].as_str() {
            Some("LEFT") => Side::Left,
            _ => Side::Right,
        },
        comments,
    })
}

/// Every review thread on the pull request (up to [`MAX_THREAD_PAGES`] pages).
pub async fn threads(gh: &GitHub, number: u64) -> Result<Vec<Thread>, ApiError> {
    let mut out = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..MAX_THREAD_PAGES {
        let vars = json!({"owner": gh.owner, "name": gh.repo, "number": number, "cursor": cursor});
        let data = gh
            .graphql(
                "list review threads",
                Resend::Free,
                json!({"query": THREADS_QUERY, "variables": vars}),
            )
            .await?;
        let page = data
            .pointer("/repository/pullRequest/reviewThreads")
            .ok_or_else(|| ApiError::Graphql {
                operation: "list review threads",
                message: "the answer has no pull request".into(),
            })?;
        out.extend(
            page["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(thread_from),
        );
        if page.pointer("/pageInfo/hasNextPage") != Some(&Value::Bool(true)) {
            break;
        }
        cursor = page
            .pointer("/pageInfo/endCursor")
            .cloned()
            .unwrap_or(Value::Null);
    }
    Ok(out)
}

/// One `POST /pulls/{n}/reviews`: the body, the event and every inline comment at once.
pub async fn post_review(gh: &GitHub, number: u64, request: &Value) -> Result<Posted, PostError> {
    let path = format!("{}/pulls/{number}/reviews", gh.repo_path());
    let answer = gh
        .create_once(
            || gh.client.post::<_, Value>(&path, Some(request)),
            || posted_already(gh, number, request),
        )
        .await;
    match answer {
        Ok(v) => Ok(Posted {
            id: v["id"].as_u64().unwrap_or(0),
            url: str_at(&v, "/html_url"),
        }),
        Err(octocrab::Error::GitHub { source, .. }) if source.status_code.as_u16() == 422 => {
            let errors = source
                .errors
                .unwrap_or_default()
                .iter()
                .map(|e| match e {
                    Value::String(s) => s.clone(),
                    other => other["message"].as_str().unwrap_or("").to_string(),
                })
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            let errors = if errors.is_empty() {
                source.message
            } else {
                errors
            };
            Err(PostError::Rejected {
                errors: one_line(&errors),
            })
        }
        Err(e) => Err(PostError::Api(ApiError::from_octocrab("post review", e))),
    }
}

/// The review fro-bot's token already posted with this request's commit and body (its answer was
/// lost to a transient fault), from the newest 100.
async fn posted_already(
    gh: &GitHub,
    number: u64,
    request: &Value,
) -> Result<Option<Value>, ApiError> {
    let me = gh.own_login().await?;
    let total = gh
        .get_with::<Vec<Value>, _>(
            format!("{}/pulls/{number}/reviews", gh.repo_path()),
            &[("per_page", "100")],
        )
        .await
        .map_err(op("list reviews"))?;
    let sent = request["body"].as_str().unwrap_or("");
    Ok(total.into_iter().rev().find(|r| {
        r.pointer("/user/login")
            .and_then(Value::as_str)
            .is_some_and(|l| l.eq_ignore_ascii_case(&me))
            && r["commit_id"] == request["commit_id"]
            && same_body(r["body"].as_str().unwrap_or(""), sent)
    }))
}

/// A reply in the thread whose first comment is `comment_id`.
pub async fn reply(gh: &GitHub, number: u64, comment_id: u64, body: &str) -> Result<(), ApiError> {
    // Not looked up: a reply whose answer was lost is reported, never sent twice blind.
    let path = format!(
        "{}/pulls/{number}/comments/{comment_id}/replies",
        gh.repo_path()
    );
    let request = json!({"body": body});
    gh.call(Resend::Refused, || {
        gh.client.post::<_, Value>(&path, Some(&request))
    })
    .await
    .map(drop)
    .map_err(op("reply to review thread"))
}

pub async fn resolve(gh: &GitHub, thread: &str) -> Result<(), ApiError> {
    gh.graphql(
        "resolve review thread",
        Resend::Free,
        json!({"query": RESOLVE_MUTATION, "variables": {"thread": thread}}),
    )
    .await
    .map(drop)
}
