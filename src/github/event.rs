//! The triggering event, normalized once from `GITHUB_EVENT_NAME` and the JSON at
//! `GITHUB_EVENT_PATH`. Nothing downstream reads the raw payload.
//!
//! Parsing walks a `serde_json::Value` with optional accessors instead of deriving strict structs:
//! a webhook payload with an unexpected shape must become `Unsupported`/`Malformed`, never an error
//! that aborts the step and never a panic.

use std::path::PathBuf;

use serde_json::Value;

use crate::runner::env;
use crate::runner::Env;

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("{var} is not set; the action must run inside a GitHub Actions workflow")]
    MissingVar { var: &'static str },
    #[error("cannot read the event payload {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the event payload {} is not valid JSON", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Who did something, as the payload names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub login: String,
    /// The payload's `type`: `User`, `Bot`, `Organization`, ... (`None`: the payload leaves it
    /// out, which GitHub's webhook description allows).
    pub kind: Option<String>,
}

impl Actor {
    /// GitHub marks apps as `type: Bot`; their logins also end in `[bot]`.
    pub fn is_bot(&self) -> bool {
        self.kind
            .as_deref()
            .is_some_and(|k| k.eq_ignore_ascii_case("bot"))
            || self.login.ends_with("[bot]")
    }

    /// Neither the payload nor the login says whether this is a bot: the API must
    /// (`GitHub::check_unverified`), or the run does not start.
    pub fn kind_unknown(&self) -> bool {
        self.kind.is_none() && !self.login.ends_with("[bot]")
    }
}

/// `author_association` of a comment, issue or pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Association {
    Owner,
    Member,
    Collaborator,
    Contributor,
    FirstTimeContributor,
    FirstTimer,
    Mannequin,
    None,
    /// Missing from the payload or a value GitHub may add later: never trusted.
    Unknown(String),
}

impl Association {
    pub fn parse(raw: Option<&str>) -> Self {
        match raw.unwrap_or("") {
            "OWNER" => Self::Owner,
            "MEMBER" => Self::Member,
            "COLLABORATOR" => Self::Collaborator,
            "CONTRIBUTOR" => Self::Contributor,
            "FIRST_TIME_CONTRIBUTOR" => Self::FirstTimeContributor,
            "FIRST_TIMER" => Self::FirstTimer,
            "MANNEQUIN" => Self::Mannequin,
            "NONE" => Self::None,
            other => Self::Unknown(other.to_string()),
        }
    }

    /// Only people with write access to the repository may drive the agent.
    pub fn is_trusted(&self) -> bool {
        match self {
            Self::Owner | Self::Member | Self::Collaborator => true,
            Self::Contributor
            | Self::FirstTimeContributor
            | Self::FirstTimer
            | Self::Mannequin
            | Self::None
            | Self::Unknown(_) => false,
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Owner => "OWNER",
            Self::Member => "MEMBER",
            Self::Collaborator => "COLLABORATOR",
            Self::Contributor => "CONTRIBUTOR",
            Self::FirstTimeContributor => "FIRST_TIME_CONTRIBUTOR",
            Self::FirstTimer => "FIRST_TIMER",
            Self::Mannequin => "MANNEQUIN",
            Self::None => "NONE",
            Self::Unknown(raw) => raw,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    Issue,
    PullRequest,
    Discussion,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Issue => "issue",
            TargetKind::PullRequest => "pull request",
            TargetKind::Discussion => "discussion",
        }
    }
}

/// A fact the payload may not carry (e.g. fork/draft for an `issue_comment` on a pull request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Yes,
    No,
    Unknown,
}

impl Flag {
    fn from_bool(b: Option<bool>) -> Self {
        match b {
            Some(true) => Flag::Yes,
            Some(false) => Flag::No,
            None => Flag::Unknown,
        }
    }
}

/// The issue, pull request or discussion an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: TargetKind,
    pub number: u64,
    /// GraphQL node id (needed for discussions).
    pub node_id: Option<String>,
    pub title: String,
    pub body: String,
    pub author: Option<Actor>,
    pub association: Association,
    /// `Unknown` when the payload leaves `locked` out: checked through the API before a run.
    pub locked: Flag,
    pub draft: Flag,
    /// The head repository differs from the base repository (or is gone).
    pub fork: Flag,
    /// The head commit a `pull_request` event names: what a review of it is pinned to.
    pub head_sha: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    pub id: u64,
    pub node_id: Option<String>,
    pub body: String,
    pub author: Actor,
    pub association: Association,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommentSource {
    IssueComment,
    DiscussionComment,
    PullRequestReviewComment,
}

impl CommentSource {
    pub fn event_name(self) -> &'static str {
        match self {
            CommentSource::IssueComment => "issue_comment",
            CommentSource::DiscussionComment => "discussion_comment",
            CommentSource::PullRequestReviewComment => "pull_request_review_comment",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuesAction {
    Opened,
    Edited,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullRequestAction {
    Opened,
    Synchronize,
    Reopened,
    ReadyForReview,
    ReviewRequested,
}

impl PullRequestAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Opened => "opened",
            Self::Synchronize => "synchronize",
            Self::Reopened => "reopened",
            Self::ReadyForReview => "ready_for_review",
            Self::ReviewRequested => "review_requested",
        }
    }
}

/// A supported event, or why it is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new comment (`action: created`) on an issue, pull request (conversation or review diff)
    /// or discussion.
    Comment {
        source: CommentSource,
        comment: Comment,
        target: Target,
        sender: Option<Actor>,
    },
    Issues {
        action: IssuesAction,
        target: Target,
        sender: Option<Actor>,
    },
    PullRequest {
        action: PullRequestAction,
        target: Target,
        sender: Option<Actor>,
    },
    /// `issues` or `pull_request` with action `labeled`: someone added `label` to the target.
    Labeled {
        label: String,
        target: Target,
        sender: Option<Actor>,
    },
    /// `schedule`: the cron expression that fired (empty when the payload lacks it).
    Schedule {
        cron: String,
    },
    WorkflowDispatch {
        sender: Option<Actor>,
    },
    /// An event or action this action does not handle.
    Unsupported {
        event: String,
        action: Option<String>,
    },
    /// A supported event/action whose payload lacks a field we need.
    Malformed {
        event: String,
        action: Option<String>,
        missing: &'static str,
    },
}

impl Event {
    /// Reads `GITHUB_EVENT_NAME` and the payload at `GITHUB_EVENT_PATH`.
    pub fn from_env(env: &Env) -> Result<Event, EventError> {
        let name = env
            .get(env::GITHUB_EVENT_NAME)
            .ok_or(EventError::MissingVar {
                var: env::GITHUB_EVENT_NAME,
            })?;
        let path = PathBuf::from(env.get(env::GITHUB_EVENT_PATH).ok_or(
            EventError::MissingVar {
                var: env::GITHUB_EVENT_PATH,
            },
        )?);
        let raw = std::fs::read(&path).map_err(|source| EventError::Read {
            path: path.clone(),
            source,
        })?;
        let payload: Value =
            serde_json::from_slice(&raw).map_err(|source| EventError::Json { path, source })?;
        Ok(Event::parse(name, &payload))
    }

    /// Normalizes a payload. Total: every input gives an `Event`.
    pub fn parse(name: &str, payload: &Value) -> Event {
        let action = str_at(payload, "/action");
        let sender = actor_at(payload, "/sender");
        let parsed = match name {
            "issue_comment" | "discussion_comment" | "pull_request_review_comment" => {
                comment_event(name, action, payload, sender)
            }
            "issues" | "pull_request" if action == Some("labeled") => {
                labeled_event(name, payload, sender)
            }
            "issues" => issues_event(action, payload, sender),
            "pull_request" => pull_request_event(action, payload, sender),
            "schedule" => Ok(Event::Schedule {
                cron: str_at(payload, "/schedule").unwrap_or("").to_string(),
            }),
            "workflow_dispatch" => Ok(Event::WorkflowDispatch { sender }),
            _ => Err(NotHandled::Unsupported),
        };
        parsed.unwrap_or_else(|why| {
            let event = name.to_string();
            let action = action.map(str::to_string);
            match why {
                NotHandled::Unsupported => Event::Unsupported { event, action },
                NotHandled::Missing(missing) => Event::Malformed {
                    event,
                    action,
                    missing,
                },
            }
        })
    }

    /// The event name as GitHub spells it.
    pub fn name(&self) -> &str {
        match self {
            Event::Comment { source, .. } => source.event_name(),
            Event::Issues { .. } => "issues",
            Event::PullRequest { .. } => "pull_request",
            Event::Labeled { target, .. } => match target.kind {
                TargetKind::PullRequest => "pull_request",
                TargetKind::Issue | TargetKind::Discussion => "issues",
            },
            Event::Schedule { .. } => "schedule",
            Event::WorkflowDispatch { .. } => "workflow_dispatch",
            Event::Unsupported { event, .. } | Event::Malformed { event, .. } => event,
        }
    }

    pub fn target(&self) -> Option<&Target> {
        match self {
            Event::Comment { target, .. }
            | Event::Issues { target, .. }
            | Event::PullRequest { target, .. }
            | Event::Labeled { target, .. } => Some(target),
            Event::Schedule { .. }
            | Event::WorkflowDispatch { .. }
            | Event::Unsupported { .. }
            | Event::Malformed { .. } => None,
        }
    }
}

/// Why a payload is not an event this action handles.
enum NotHandled {
    /// An event or action it does not handle.
    Unsupported,
    /// A handled event whose payload lacks this field.
    Missing(&'static str),
}

/// A new comment (`action: created`) on an issue, a pull request's review diff or a discussion.
fn comment_event(
    name: &str,
    action: Option<&str>,
    payload: &Value,
    sender: Option<Actor>,
) -> Result<Event, NotHandled> {
    if action != Some("created") {
        return Err(NotHandled::Unsupported);
    }
    let (source, target) = match name {
        "issue_comment" => (CommentSource::IssueComment, issue_target(payload)),
        "discussion_comment" => (CommentSource::DiscussionComment, discussion_target(payload)),
        _ => (
            CommentSource::PullRequestReviewComment,
            pull_request_target(payload),
        ),
    };
    Ok(Event::Comment {
        source,
        target: target.map_err(NotHandled::Missing)?,
        comment: comment_at(payload).map_err(NotHandled::Missing)?,
        sender,
    })
}

/// `issues` or `pull_request` with action `labeled`.
fn labeled_event(name: &str, payload: &Value, sender: Option<Actor>) -> Result<Event, NotHandled> {
    let target = match name {
        "issues" => issue_target(payload),
        _ => pull_request_target(payload),
    };
    let label = str_at(payload, "/label/name").ok_or(NotHandled::Missing("label.name"))?;
    Ok(Event::Labeled {
        label: label.to_string(),
        target: target.map_err(NotHandled::Missing)?,
        sender,
    })
}

fn issues_event(
    action: Option<&str>,
    payload: &Value,
    sender: Option<Actor>,
) -> Result<Event, NotHandled> {
    let action = match action {
        Some("opened") => IssuesAction::Opened,
        Some("edited") => IssuesAction::Edited,
        _ => return Err(NotHandled::Unsupported),
    };
    Ok(Event::Issues {
        action,
        target: issue_target(payload).map_err(NotHandled::Missing)?,
        sender,
    })
}

fn pull_request_event(
    action: Option<&str>,
    payload: &Value,
    sender: Option<Actor>,
) -> Result<Event, NotHandled> {
    let action = match action {
        Some("opened") => PullRequestAction::Opened,
        Some("synchronize") => PullRequestAction::Synchronize,
        Some("reopened") => PullRequestAction::Reopened,
        Some("ready_for_review") => PullRequestAction::ReadyForReview,
        Some("review_requested") => PullRequestAction::ReviewRequested,
        _ => return Err(NotHandled::Unsupported),
    };
    Ok(Event::PullRequest {
        action,
        target: pull_request_target(payload).map_err(NotHandled::Missing)?,
        sender,
    })
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn u64_at(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer).and_then(Value::as_u64)
}

fn bool_at(v: &Value, pointer: &str) -> Option<bool> {
    v.pointer(pointer).and_then(Value::as_bool)
}

fn actor_at(v: &Value, pointer: &str) -> Option<Actor> {
    let user = v.pointer(pointer)?;
    Some(Actor {
        login: str_at(user, "/login")?.to_string(),
        kind: str_at(user, "/type").map(str::to_string),
    })
}

fn comment_at(payload: &Value) -> Result<Comment, &'static str> {
    let id = u64_at(payload, "/comment/id").ok_or("comment.id")?;
    let author = actor_at(payload, "/comment/user").ok_or("comment.user.login")?;
    Ok(Comment {
        id,
        node_id: str_at(payload, "/comment/node_id").map(str::to_string),
        body: str_at(payload, "/comment/body").unwrap_or("").to_string(),
        author,
        association: Association::parse(str_at(payload, "/comment/author_association")),
    })
}

/// The `issue` object; an issue with a `pull_request` key is a pull request's conversation.
fn issue_target(payload: &Value) -> Result<Target, &'static str> {
    let issue = payload.get("issue").ok_or("issue")?;
    let is_pr = issue.get("pull_request").is_some_and(|v| !v.is_null());
    let mut target = entity(issue, "issue.number")?;
    if is_pr {
        target.kind = TargetKind::PullRequest;
        // The issue view of a pull request carries `draft` but not the head repository.
        target.draft = Flag::from_bool(bool_at(issue, "/draft"));
        target.fork = Flag::Unknown;
    }
    Ok(target)
}

fn pull_request_target(payload: &Value) -> Result<Target, &'static str> {
    let pr = payload.get("pull_request").ok_or("pull_request")?;
    let mut target = entity(pr, "pull_request.number")?;
    target.kind = TargetKind::PullRequest;
    target.draft = Flag::from_bool(bool_at(pr, "/draft"));
    target.head_sha = str_at(pr, "/head/sha").map(str::to_string);
    let base = str_at(pr, "/base/repo/full_name");
    target.fork = match (pr.pointer("/head/repo"), base) {
        // A deleted head repository is a fork that went away: never trust it.
        (Some(Value::Null), _) => Flag::Yes,
        (Some(head), Some(base)) => match str_at(head, "/full_name") {
            Some(head) => Flag::from_bool(Some(!head.eq_ignore_ascii_case(base))),
            None => Flag::Unknown,
        },
        _ => Flag::Unknown,
    };
    Ok(target)
}

fn discussion_target(payload: &Value) -> Result<Target, &'static str> {
    let discussion = payload.get("discussion").ok_or("discussion")?;
    let mut target = entity(discussion, "discussion.number")?;
    target.kind = TargetKind::Discussion;
    target.draft = Flag::No;
    target.fork = Flag::No;
    Ok(target)
}

fn entity(v: &Value, number_field: &'static str) -> Result<Target, &'static str> {
    Ok(Target {
        kind: TargetKind::Issue,
        number: u64_at(v, "/number").ok_or(number_field)?,
        node_id: str_at(v, "/node_id").map(str::to_string),
        title: str_at(v, "/title").unwrap_or("").to_string(),
        body: str_at(v, "/body").unwrap_or("").to_string(),
        author: actor_at(v, "/user"),
        association: Association::parse(str_at(v, "/author_association")),
        locked: Flag::from_bool(bool_at(v, "/locked")),
        draft: Flag::No,
        fork: Flag::No,
        head_sha: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bots_are_recognized_by_type_or_login() {
        let bot = |login: &str, kind: &str| Actor {
            login: login.into(),
            kind: Some(kind.into()),
        };
        assert!(bot("renovate", "Bot").is_bot());
        assert!(bot("github-actions[bot]", "User").is_bot());
        assert!(!bot("octocat", "User").is_bot());
    }

    #[test]
    fn pull_request_fork_detection() {
        let pr = |head: Value| {
            json!({"action": "opened", "pull_request": {"number": 3, "head": {"repo": head},
                   "base": {"repo": {"full_name": "o/r"}}}})
        };
        let fork = |p: &Value| match Event::parse("pull_request", p) {
            Event::PullRequest { target, .. } => target.fork,
            other => panic!("{other:?}"),
        };
        assert_eq!(fork(&pr(json!({"full_name": "o/r"}))), Flag::No);
        assert_eq!(fork(&pr(json!({"full_name": "x/r"}))), Flag::Yes);
        assert_eq!(fork(&pr(Value::Null)), Flag::Yes);
        assert_eq!(fork(&pr(json!({}))), Flag::Unknown);
    }

    #[test]
    fn wrong_shapes_are_malformed_not_errors() {
        let p = json!({"action": "created", "issue": {"number": "7"}, "comment": {}});
        assert_eq!(
            Event::parse("issue_comment", &p),
            Event::Malformed {
                event: "issue_comment".into(),
                action: Some("created".into()),
                missing: "issue.number"
            }
        );
        assert!(matches!(
            Event::parse("issue_comment", &json!([1, 2])),
            Event::Unsupported { .. }
        ));
        assert!(matches!(
            Event::parse("push", &json!({})),
            Event::Unsupported { action: None, .. }
        ));
    }
}
