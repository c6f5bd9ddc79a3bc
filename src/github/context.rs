//! The conversation the agent is asked about: title, body and recent comments of the issue, pull
//! request or discussion, bounded in size, with truncation marked.

use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{ApiError, GitHub};
use super::event::TargetKind;
use super::route::Thread;

pub const TRUNCATED: &str = "…[truncated]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimits {
    /// How many of the most recent comments to include (≤ 100, one API page).
    pub max_comments: usize,
    /// Characters kept of the body and of each comment.
    pub max_item_chars: usize,
    /// Characters of the rendered context as a whole.
    pub max_total_chars: usize,
}

impl Default for ContextLimits {
    fn default() -> Self {
        ContextLimits {
            max_comments: 20,
            max_item_chars: 4_000,
            max_total_chars: 32_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextComment {
    pub author: String,
    /// `author_association` (`OWNER`, `NONE`...); empty when GitHub did not say.
    pub association: String,
    pub created_at: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub kind: TargetKind,
    pub number: u64,
    pub title: String,
    pub body: String,
    /// Who opened it, and their `author_association` (empty when unknown).
    pub author: String,
    pub author_association: String,
    /// Oldest first, the most recent `max_comments`.
    pub comments: Vec<ContextComment>,
    /// Total comments on the thread (more than `comments.len()` when older ones were left out).
    pub total_comments: u64,
}

#[derive(Debug, Deserialize)]
struct IssueView {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    comments: Option<u64>,
    #[serde(default)]
    user: Option<UserView>,
    #[serde(default)]
    author_association: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CommentView {
    #[serde(default)]
    user: Option<UserView>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    author_association: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UserView {
    #[serde(default)]
    login: Option<String>,
}

impl GitHub {
    /// Fetches the thread's context. Issues and pull requests use REST (a pull request is an
    /// issue there); discussions use GraphQL.
    pub async fn fetch_context(
        &self,
        thread: &Thread,
        limits: ContextLimits,
    ) -> Result<Context, ApiError> {
        match thread.kind {
            TargetKind::Issue | TargetKind::PullRequest => self.issue_context(thread, limits).await,
            TargetKind::Discussion => self.discussion_context(thread, limits).await,
        }
    }

    async fn issue_context(
        &self,
        thread: &Thread,
        limits: ContextLimits,
    ) -> Result<Context, ApiError> {
        let n = thread.number;
        let issue: IssueView = self
            .get(format!("{}/issues/{n}", self.repo_path()))
            .await
            .map_err(|e| ApiError::from_octocrab("get issue", e))?;
        let total = issue.comments.unwrap_or(0);
        let per_page = limits.max_comments.clamp(1, 100) as u64;
        let mut comments = Vec::new();
        if limits.max_comments > 0 && total > 0 {
            // Comments list oldest first; the most recent ones are on the last page(s).
            let last_page = total.div_ceil(per_page);
            let first_page = if last_page > 1 && total % per_page != 0 {
                last_page - 1
            } else {
                last_page
            };
            for page in first_page..=last_page {
                let batch: Vec<CommentView> = self
                    .get_with(
                        format!("{}/issues/{n}/comments", self.repo_path()),
                        &[("per_page", per_page), ("page", page)],
                    )
                    .await
                    .map_err(|e| ApiError::from_octocrab("list comments", e))?;
                comments.extend(batch.into_iter().map(|c| ContextComment {
                    author: c.user.and_then(|u| u.login).unwrap_or_default(),
                    association: c.author_association.unwrap_or_default(),
                    created_at: c.created_at.unwrap_or_default(),
                    body: c.body.unwrap_or_default(),
                }));
            }
            let keep = comments.len().saturating_sub(limits.max_comments);
            comments.drain(..keep);
        }
        Ok(Context {
            kind: thread.kind,
            number: n,
            title: issue.title.unwrap_or_default(),
            body: issue.body.unwrap_or_default(),
            author: issue.user.and_then(|u| u.login).unwrap_or_default(),
            author_association: issue.author_association.unwrap_or_default(),
            total_comments: total.max(comments.len() as u64),
            comments,
        })
    }

    async fn discussion_context(
        &self,
        thread: &Thread,
        limits: ContextLimits,
    ) -> Result<Context, ApiError> {
        const OP: &str = "get discussion";
        let query = "query($owner: String!, $name: String!, $number: Int!, $last: Int!) { \
             repository(owner: $owner, name: $name) { discussion(number: $number) { \
             title body author { login } authorAssociation \
             comments(last: $last) { totalCount nodes { author { login } authorAssociation body createdAt } } } } }";
        let data = self
            .graphql(
                OP,
                super::retry::Resend::Free,
                json!({"query": query, "variables": {
                    "owner": self.owner, "name": self.repo, "number": thread.number,
                    "last": limits.max_comments.clamp(1, 100)}}),
            )
            .await?;
        let d = data
            .pointer("/repository/discussion")
            .filter(|d| !d.is_null())
            .ok_or(ApiError::Graphql {
                operation: OP,
                message: format!("discussion #{} not found", thread.number),
            })?;
        let text = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let mut comments: Vec<ContextComment> = d
            .pointer("/comments/nodes")
            .and_then(Value::as_array)
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|c| ContextComment {
                        author: text(c, "/author/login"),
                        association: text(c, "/authorAssociation"),
                        created_at: text(c, "/createdAt"),
                        body: text(c, "/body"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if limits.max_comments == 0 {
            comments.clear();
        }
        let total = d
            .pointer("/comments/totalCount")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Ok(Context {
            kind: TargetKind::Discussion,
            number: thread.number,
            title: text(d, "/title"),
            body: text(d, "/body"),
            author: text(d, "/author/login"),
            author_association: text(d, "/authorAssociation"),
            total_comments: total.max(comments.len() as u64),
            comments,
        })
    }
}

/// Keeps at most `max` characters, marking a cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(TRUNCATED.chars().count());
    let mut out: String = s.chars().take(keep).collect();
    out.push_str(TRUNCATED);
    out
}

impl Context {
    /// Markdown for the prompt, at most `limits.max_total_chars` characters. The title and body
    /// come first; when the total is exceeded, the oldest included comments are dropped first.
    pub fn render(&self, limits: ContextLimits) -> String {
        let head = format!(
            "## {} #{}: {}\n\n{}\n",
            capitalized(self.kind),
            self.number,
            truncate_chars(&self.title, 512),
            truncate_chars(&self.body, limits.max_item_chars)
        );
        let rendered: Vec<String> = self
            .comments
            .iter()
            .map(|c| {
                format!(
                    "\n### @{} ({})\n\n{}\n",
                    c.author,
                    c.created_at,
                    truncate_chars(&c.body, limits.max_item_chars)
                )
            })
            .collect();
        // Newest comments matter most: add from the end until the budget is used.
        let mut used = head.chars().count();
        let mut kept = Vec::new();
        for r in rendered.iter().rev() {
            let len = r.chars().count();
            if used + len > limits.max_total_chars.saturating_sub(200) {
                break;
            }
            used += len;
            kept.push(r.as_str());
        }
        kept.reverse();
        let omitted = self.total_comments.saturating_sub(kept.len() as u64);
        let mut out = head;
        if omitted > 0 {
            out.push_str(&format!(
                "\n_{omitted} earlier comment(s) omitted {TRUNCATED}_\n"
            ));
        }
        for r in kept {
            out.push_str(r);
        }
        truncate_chars(&out, limits.max_total_chars)
    }
}

fn capitalized(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Issue => "Issue",
        TargetKind::PullRequest => "Pull request",
        TargetKind::Discussion => "Discussion",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(comments: usize, body_len: usize) -> Context {
        Context {
            kind: TargetKind::Issue,
            number: 4,
            title: "Crash on start".into(),
            body: "b".repeat(body_len),
            author: "mona".into(),
            author_association: "OWNER".into(),
            comments: (0..comments)
                .map(|i| ContextComment {
                    author: format!("user{i}"),
                    association: "MEMBER".into(),
                    created_at: "2026-01-01T00:00:00Z".into(),
                    body: format!("comment number {i} {}", "x".repeat(500)),
                })
                .collect(),
            total_comments: comments as u64 + 3,
        }
    }

    #[test]
    fn render_is_bounded_and_keeps_the_newest() {
        let limits = ContextLimits {
            max_comments: 20,
            max_item_chars: 1000,
            max_total_chars: 3000,
        };
        let out = ctx(20, 5000).render(limits);
        assert!(out.chars().count() <= 3000);
        assert!(out.starts_with("## Issue #4: Crash on start"));
        assert!(out.contains(TRUNCATED), "body cut is marked");
        assert!(out.contains("comment number 19 "), "newest kept");
        assert!(!out.contains("comment number 0 "), "oldest dropped");
        assert!(out.contains("earlier comment(s) omitted"));
    }

    #[test]
    fn small_context_is_complete() {
        let limits = ContextLimits::default();
        let mut c = ctx(2, 10);
        c.total_comments = 2;
        let out = c.render(limits);
        assert!(!out.contains(TRUNCATED));
        assert!(out.contains("comment number 0 ") && out.contains("comment number 1 "));
    }

    #[test]
    fn truncate_counts_chars_not_bytes() {
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        let t = truncate_chars(&"é".repeat(100), 20);
        assert_eq!(t.chars().count(), 20);
        assert!(t.ends_with(TRUNCATED));
    }
}
