//! The GitHub API client ([`GitHub`]) and the calls the harness makes around a run: the 👀 and
//! 🎉/😕 reactions, a comment on an issue or discussion, the token's own login (so fro-bot never
//! answers itself) and the pull-request flags a comment payload lacks. Every failure is returned as
//! an `ApiError` the caller logs as a warning: nothing here may fail a run. Every call goes through
//! `GitHub::call` (`super::retry`), which retries transient faults where that cannot double a write.
//!
//! Requests go through octocrab's untyped `get`/`post` with small local response structs, so a
//! field GitHub adds or omits cannot break deserialization of what we do not read.

use std::time::Duration;

use octocrab::Octocrab;
use serde::Deserialize;
use serde_json::{json, Value};

use super::endpoints::Endpoints;
use super::event::{Flag, TargetKind};
use super::retry::{Pacing, Resend, Retrier};
use super::route::Subject;
use crate::config::Secret;
use crate::runner::env;
use crate::runner::{log, Env};

const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{var} {value:?} is not 'owner/name'", var = env::GITHUB_REPOSITORY)]
    Repository { value: String },
    #[error("cannot build the GitHub client for {api_url}")]
    Client {
        api_url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("GitHub API {operation} failed with HTTP {status}: {message}")]
    Status {
        operation: &'static str,
        status: u16,
        message: String,
    },
    #[error("GitHub API {operation} failed: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },
    #[error("GitHub GraphQL {operation} failed: {message}")]
    Graphql {
        operation: &'static str,
        message: String,
    },
    #[error("{operation} is not possible: {reason}")]
    Unsupported {
        operation: &'static str,
        reason: &'static str,
    },
}

impl ApiError {
    /// The HTTP status, when GitHub answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            ApiError::Repository { .. }
            | ApiError::Client { .. }
            | ApiError::Transport { .. }
            | ApiError::Graphql { .. }
            | ApiError::Unsupported { .. } => None,
        }
    }

    /// Maps an octocrab error, keeping only a redacted, one-line message (octocrab's `Display`
    /// includes backtraces for some variants).
    pub(crate) fn from_octocrab(operation: &'static str, err: octocrab::Error) -> ApiError {
        match err {
            octocrab::Error::GitHub { source, .. } => ApiError::Status {
                operation,
                status: source.status_code.as_u16(),
                message: one_line(&source.message),
            },
            octocrab::Error::Graphql { source, .. } => ApiError::Graphql {
                operation,
                message: one_line(&source.to_string()),
            },
            other => ApiError::Transport {
                operation,
                message: one_line(&other.to_string()),
            },
        }
    }
}

pub(crate) fn one_line(s: &str) -> String {
    let first = s.lines().next().unwrap_or("");
    let mut out = log::redact(first);
    if out.len() > 300 {
        let mut cut = 300;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// 👀 when a run starts, 🎉 or 😕 when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    Eyes,
    Hooray,
    Confused,
}

impl Reaction {
    /// The REST `content` value.
    pub fn rest(self) -> &'static str {
        match self {
            Reaction::Eyes => "eyes",
            Reaction::Hooray => "hooray",
            Reaction::Confused => "confused",
        }
    }

    /// The GraphQL `ReactionContent` value.
    pub fn graphql(self) -> &'static str {
        match self {
            Reaction::Eyes => "EYES",
            Reaction::Hooray => "HOORAY",
            Reaction::Confused => "CONFUSED",
        }
    }
}

/// A client for one repository.
#[derive(Debug, Clone)]
pub struct GitHub {
    pub(crate) client: Octocrab,
    /// GraphQL is not under the REST base on GitHub Enterprise Server (`/api/graphql` beside
    /// `/api/v3`): a second client, based at the GraphQL URL itself.
    graphql_client: Octocrab,
    /// Where GraphQL requests are posted (`Endpoints::graphql`).
    graphql_url: String,
    pub(crate) owner: String,
    pub(crate) repo: String,
    /// The token's own login, looked up once per run (`own_login`).
    own_login: std::sync::Arc<tokio::sync::OnceCell<String>>,
    /// How transient faults are retried (`retry`); its tally is shared by the clones.
    retrier: Retrier,
}

/// Who an Actions `GITHUB_TOKEN` (an installation token, which `GET /user` refuses) posts as.
pub const APP_BOT_LOGIN: &str = "github-actions[bot]";

#[derive(Debug, Deserialize)]
struct Created {
    id: u64,
    #[serde(default)]
    html_url: Option<String>,
}

/// A comment the harness posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostedComment {
    /// REST id, or the GraphQL node id for a discussion comment.
    pub id: String,
    pub url: Option<String>,
}

/// Fork and draft state of a pull request, fetched when the payload does not carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullRequestFlags {
    pub fork: Flag,
    pub draft: Flag,
}

impl GitHub {
    /// From `GITHUB_API_URL`, `GITHUB_GRAPHQL_URL` (`Endpoints::from_env`) and `GITHUB_REPOSITORY`.
    pub fn from_env(env: &Env, token: &Secret) -> Result<GitHub, ApiError> {
        let repository = env.get(env::GITHUB_REPOSITORY).unwrap_or("");
        GitHub::connect(&Endpoints::from_env(env), token, repository)
            .map(|gh| gh.with_pacing(Pacing::from_env(env)))
    }

    /// The same client, waiting out transient faults as `pacing` says.
    pub fn with_pacing(mut self, pacing: Pacing) -> GitHub {
        self.retrier.pacing = pacing;
        self
    }

    /// The retries this client (and its clones) made so far, and how long they waited.
    pub fn retries(&self) -> (u64, std::time::Duration) {
        self.retrier.retries()
    }

    /// Runs `attempt`, sent again on a transient fault as `resend` allows (`Retrier::call`).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        resend: Resend,
        attempt: F,
    ) -> Result<T, octocrab::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, octocrab::Error>>,
    {
        self.retrier.call(resend, attempt).await
    }

    /// A write a repetition could double, looked up before it is sent again
    /// (`Retrier::create_once`).
    pub(crate) async fn create_once<T, F, Fut, L, LFut>(
        &self,
        attempt: F,
        lookup: L,
    ) -> Result<T, octocrab::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, octocrab::Error>>,
        L: FnMut() -> LFut,
        LFut: std::future::Future<Output = Result<Option<T>, ApiError>>,
    {
        self.retrier.create_once(attempt, lookup).await
    }

    /// A client for the REST base `api_url`, GraphQL beside it (`Endpoints::for_api`).
    pub fn new(api_url: &str, token: &Secret, repository: &str) -> Result<GitHub, ApiError> {
        GitHub::connect(&Endpoints::for_api(api_url), token, repository)
    }

    pub fn connect(
        endpoints: &Endpoints,
        token: &Secret,
        repository: &str,
    ) -> Result<GitHub, ApiError> {
        let (owner, repo) = repository
            .split_once('/')
            .filter(|(o, r)| !o.is_empty() && !r.is_empty() && !r.contains('/'))
            .ok_or_else(|| ApiError::Repository {
                value: repository.to_string(),
            })?;
        // reqwest, not octocrab's own client: that one ignores the runner proxy
        // (`crate::net::external`). Redirects stay octocrab's, which drops the token off-host.
        let http = crate::net::external()
            .connect_timeout(TIMEOUT)
            .read_timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ApiError::Client {
                api_url: endpoints.api.to_string(),
                source: e.into(),
            })?;
        let build = |base: &str| {
            let client_err = |source: Box<dyn std::error::Error + Send + Sync>| ApiError::Client {
                api_url: base.to_string(),
                source,
            };
            Octocrab::builder()
                .base_uri(base)
                .map_err(|e| client_err(e.into()))?
                .personal_token(token.expose().to_string())
                .build_with_reqwest(http.clone())
                .map_err(|e| client_err(e.into()))
        };
        Ok(GitHub {
            client: build(&endpoints.api)?,
            graphql_client: build(&endpoints.graphql)?,
            graphql_url: endpoints.graphql.clone(),
            owner: owner.to_string(),
            repo: repo.to_string(),
            own_login: Default::default(),
            retrier: Retrier::default(),
        })
    }

    pub(crate) fn repo_path(&self) -> String {
        format!("/repos/{}/{}", self.owner, self.repo)
    }

    /// Adds a reaction. Discussion comments go through GraphQL (`addReaction`).
    pub async fn react(&self, subject: &Subject, reaction: Reaction) -> Result<(), ApiError> {
        const OP: &str = "add reaction";
        let path = match subject {
            Subject::IssueComment { id } => {
                format!("{}/issues/comments/{id}/reactions", self.repo_path())
            }
            Subject::ReviewComment { id } => {
                format!("{}/pulls/comments/{id}/reactions", self.repo_path())
            }
            Subject::Issue { number } => format!("{}/issues/{number}/reactions", self.repo_path()),
            Subject::DiscussionComment { node_id } => {
                let Some(node_id) = node_id else {
                    return Err(ApiError::Unsupported {
                        operation: OP,
                        reason: "the discussion comment has no node id in the payload",
                    });
                };
                let query = "mutation($subject: ID!, $content: ReactionContent!) { \
                     addReaction(input: {subjectId: $subject, content: $content}) { \
                     reaction { content } } }";
                return self
                    .graphql(
                        OP,
                        Resend::Free,
                        json!({"query": query,
                               "variables": {"subject": node_id, "content": reaction.graphql()}}),
                    )
                    .await
                    .map(drop);
            }
        };
        // GitHub answers 200 with the existing reaction for a repeat: free to send again.
        let body = json!({"content": reaction.rest()});
        self.call(Resend::Free, || {
            self.client.post::<_, Value>(&path, Some(&body))
        })
        .await
        .map(drop)
        .map_err(|e| ApiError::from_octocrab(OP, e))
    }

    /// Posts a comment on an issue or pull request conversation. A post whose answer was lost is
    /// looked for (the token's own comment with this body) before it is sent again.
    pub async fn comment_on_issue(
        &self,
        number: u64,
        body: &str,
    ) -> Result<PostedComment, ApiError> {
        let path = format!("{}/issues/{number}/comments", self.repo_path());
        let request = json!({ "body": body });
        let post = || async {
            let created: Created = self.client.post(&path, Some(&request)).await?;
            Ok(PostedComment {
                id: created.id.to_string(),
                url: created.html_url,
            })
        };
        let lookup = || self.own_issue_comment(number, |b| same_body(b, body));
        self.create_once(post, lookup)
            .await
            .map_err(|e| ApiError::from_octocrab("create comment", e))
    }

    /// Posts a discussion comment through GraphQL (`addDiscussionComment`); like
    /// [`GitHub::comment_on_issue`], a post whose answer was lost is looked for first.
    pub async fn comment_on_discussion(
        &self,
        discussion_node_id: &str,
        body: &str,
    ) -> Result<PostedComment, ApiError> {
        const OP: &str = "add discussion comment";
        let query = "mutation($discussion: ID!, $body: String!) { \
             addDiscussionComment(input: {discussionId: $discussion, body: $body}) { \
             comment { id url } } }";
        let payload = json!({"query": query,
                             "variables": {"discussion": discussion_node_id, "body": body}});
        let post = || self.graphql_raw(payload.clone());
        let lookup = || async {
            let found = self
                .own_discussion_comment(discussion_node_id, |b| same_body(b, body))
                .await?;
            Ok(found.map(|c| {
                json!({"data": {"addDiscussionComment": {"comment": {
                "id": c.id, "url": c.url}}}})
            }))
        };
        let answer = self
            .create_once(post, lookup)
            .await
            .map_err(|e| ApiError::from_octocrab(OP, e))?;
        let data = data_of(OP, answer)?;
        let comment = data.pointer("/addDiscussionComment/comment");
        let id = comment
            .and_then(|c| c.get("id"))
            .and_then(Value::as_str)
            .ok_or(ApiError::Graphql {
                operation: OP,
                message: "the response has no comment id".into(),
            })?;
        Ok(PostedComment {
            id: id.to_string(),
            url: comment
                .and_then(|c| c.get("url"))
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// The login the token acts as (`GET /user`), looked up once and cached for the run. An
    /// installation token (`GITHUB_TOKEN`) gets 403 there: it posts as [`APP_BOT_LOGIN`].
    pub async fn own_login(&self) -> Result<String, ApiError> {
        const OP: &str = "get authenticated user";
        self.own_login
            .get_or_try_init(|| async {
                let user = self.call(Resend::Free, || {
                    self.client.get::<Value, _, _>("/user", None::<&()>)
                });
                match user.await {
                    Ok(user) => user
                        .get("login")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or(ApiError::Transport {
                            operation: OP,
                            message: "the answer has no login".into(),
                        }),
                    Err(e) => match ApiError::from_octocrab(OP, e) {
                        e if e.status() == Some(403) => Ok(APP_BOT_LOGIN.to_string()),
                        e => Err(e),
                    },
                }
            })
            .await
            .cloned()
    }

    /// Fork and draft state of a pull request (`GET /pulls/{n}`).
    pub async fn pull_request_flags(&self, number: u64) -> Result<PullRequestFlags, ApiError> {
        let pr: Value = self
            .get(format!("{}/pulls/{number}", self.repo_path()))
            .await
            .map_err(|e| ApiError::from_octocrab("get pull request", e))?;
        let draft = match pr.get("draft").and_then(Value::as_bool) {
            Some(true) => Flag::Yes,
            Some(false) => Flag::No,
            None => Flag::Unknown,
        };
        let base = pr.pointer("/base/repo/full_name").and_then(Value::as_str);
        let fork = match (pr.pointer("/head/repo"), base) {
            (Some(Value::Null), _) => Flag::Yes,
            (Some(head), Some(base)) => match head.get("full_name").and_then(Value::as_str) {
                Some(h) if h.eq_ignore_ascii_case(base) => Flag::No,
                Some(_) => Flag::Yes,
                None => Flag::Unknown,
            },
            _ => Flag::Unknown,
        };
        Ok(PullRequestFlags { fork, draft })
    }

    /// Settles what the payload left out (`plan.unverified`): whether the target is locked (the
    /// issue or pull request read again) and whether each actor of unknown type is a bot
    /// (`GET /users/{login}`). `Ok(Some(reason))` means skip; what GitHub cannot answer is a
    /// skip too (`UnverifiedLock`, `UnverifiedActor`): an unknown fails closed.
    pub async fn check_unverified(
        &self,
        plan: &super::route::RunPlan,
    ) -> Option<super::route::SkipReason> {
        use super::route::SkipReason;
        if let Some((kind, number)) = plan.unverified.locked {
            match self.locked(kind, number).await {
                Ok(false) => {}
                Ok(true) => return Some(SkipReason::Locked { kind, number }),
                Err(why) => return Some(SkipReason::UnverifiedLock { kind, number, why }),
            }
        }
        for login in &plan.unverified.actors {
            match self.user_kind(login).await {
                Ok(kind) if kind.eq_ignore_ascii_case("bot") => {
                    return Some(SkipReason::BotAuthor {
                        login: login.clone(),
                    })
                }
                Ok(_) => {}
                Err(why) => {
                    return Some(SkipReason::UnverifiedActor {
                        login: login.clone(),
                        why,
                    })
                }
            }
        }
        None
    }

    /// `locked` of an issue or pull request, read again (a discussion's is not read: unknown).
    async fn locked(&self, kind: TargetKind, number: u64) -> Result<bool, String> {
        if kind == TargetKind::Discussion {
            return Err("a discussion's lock is not read through the API".into());
        }
        let issue: Value = self
            .get(format!("{}/issues/{number}", self.repo_path()))
            .await
            .map_err(|e| ApiError::from_octocrab("get issue", e).to_string())?;
        issue["locked"]
            .as_bool()
            .ok_or_else(|| "its answer has no `locked`".to_string())
    }

    /// A user's `type` (`User`, `Bot`, `Organization`).
    async fn user_kind(&self, login: &str) -> Result<String, String> {
        let user: Value = self
            .get(format!("/users/{login}"))
            .await
            .map_err(|e| ApiError::from_octocrab("get user", e).to_string())?;
        user["type"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "its answer has no `type`".to_string())
    }

    /// Posts a GraphQL request and returns the whole answer (`data` and `errors`), for callers
    /// that must tell one error type from another.
    pub(crate) async fn graphql_raw(&self, payload: Value) -> Result<Value, octocrab::Error> {
        // The whole URL: octocrab keeps a request path that already starts with the base's path,
        // where its own `graphql()` would append `/graphql` to it.
        self.graphql_client
            .post(&self.graphql_url, Some(&payload))
            .await
    }

    /// A GET, retried freely.
    pub(crate) async fn get<R: octocrab::FromResponse>(
        &self,
        path: impl AsRef<str>,
    ) -> Result<R, octocrab::Error> {
        let path = path.as_ref();
        self.call(Resend::Free, || self.client.get(path, None::<&()>))
            .await
    }

    /// A GET with query parameters, retried freely.
    pub(crate) async fn get_with<R, P>(
        &self,
        path: impl AsRef<str>,
        query: &P,
    ) -> Result<R, octocrab::Error>
    where
        R: octocrab::FromResponse,
        P: serde::Serialize + ?Sized,
    {
        let path = path.as_ref();
        self.call(Resend::Free, || self.client.get(path, Some(query)))
            .await
    }

    /// Runs a GraphQL request (sent again on a transient fault as `resend` allows) and returns its
    /// `data`; any error in the answer fails it.
    pub(crate) async fn graphql(
        &self,
        operation: &'static str,
        resend: Resend,
        payload: Value,
    ) -> Result<Value, ApiError> {
        let answer = self
            .call(resend, || self.graphql_raw(payload.clone()))
            .await
            .map_err(|e| ApiError::from_octocrab(operation, e))?;
        data_of(operation, answer)
    }
}

/// The messages of a GraphQL answer's `errors`, joined.
pub(crate) fn error_messages(errors: &[Value]) -> String {
    let messages: Vec<&str> = errors
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    messages.join("; ")
}

/// A GraphQL answer's `data`; any error in it fails it.
fn data_of(operation: &'static str, answer: Value) -> Result<Value, ApiError> {
    if let Some(errors) = answer["errors"].as_array().filter(|e| !e.is_empty()) {
        return Err(ApiError::Graphql {
            operation,
            message: one_line(&error_messages(errors)),
        });
    }
    Ok(answer.get("data").cloned().unwrap_or(Value::Null))
}

/// Whether a comment GitHub lists is the one fro-bot sent with `sent` (trailing space aside).
pub(crate) fn same_body(listed: &str, sent: &str) -> bool {
    listed.trim_end() == sent.trim_end()
}

/// Per-run conveniences over the plan routing produced.
impl GitHub {
    /// 👀 on whatever triggered the run. `Ok(false)` when there is nothing to react to.
    pub async fn acknowledge(&self, plan: &super::route::RunPlan) -> Result<bool, ApiError> {
        match &plan.trigger {
            Some(subject) => self.react(subject, Reaction::Eyes).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// 🎉 or 😕 on the trigger when the run ends.
    pub async fn conclude(
        &self,
        plan: &super::route::RunPlan,
        succeeded: bool,
    ) -> Result<bool, ApiError> {
        let reaction = if succeeded {
            Reaction::Hooray
        } else {
            Reaction::Confused
        };
        match &plan.trigger {
            Some(subject) => self.react(subject, reaction).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Skips a comment the token's own identity wrote: with a personal token fro-bot's replies are
    /// a `User`'s, and one that mentions the bot would start the next run (docs/security.md).
    /// `Ok(None)` when the run was not triggered by a comment.
    pub async fn check_self_trigger(
        &self,
        plan: &super::route::RunPlan,
    ) -> Result<Option<super::route::SkipReason>, ApiError> {
        let (Some(_), Some(author)) = (plan.trigger_comment_id, plan.author.as_deref()) else {
            return Ok(None);
        };
        let me = self.own_login().await?;
        Ok(author
            .eq_ignore_ascii_case(&me)
            .then_some(super::route::SkipReason::SelfAuthored { login: me }))
    }

    /// Resolves the fork/draft gates a comment payload could not (`plan.pull_request_unchecked`).
    /// `Ok(Some(reason))` means skip. On `Err` the caller skips too: unknown provenance fails
    /// closed.
    pub async fn check_pull_request(
        &self,
        plan: &super::route::RunPlan,
    ) -> Result<Option<super::route::SkipReason>, ApiError> {
        let Some(thread) = plan.thread.as_ref().filter(|_| plan.pull_request_unchecked) else {
            return Ok(None);
        };
        let flags = self.pull_request_flags(thread.number).await?;
        Ok(super::route::gate_pull_request(
            thread.number,
            flags.fork,
            flags.draft,
        ))
    }
}
