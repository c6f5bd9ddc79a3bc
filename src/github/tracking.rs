//! The tracking comment (`docs/design.md#the-github-surface`): the one response comment, posted
//! when the run is admitted ("working", with the run link), edited with the agent's progress, and
//! replaced by the final answer. This module holds its bodies and the API calls that post, find and
//! edit it; `phases::tracking_comment` decides when.

use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{ApiError, GitHub, PostedComment};
use super::event::TargetKind;
use super::response::MARKER;
use super::retry::Resend;
use super::route::Thread;

/// One item of the agent's todo list, as the comment shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Todo<'a> {
    pub content: &'a str,
    /// OpenCode's status: `pending`, `in_progress`, `completed` or `cancelled`.
    pub status: &'a str,
}

/// Todo items shown; the rest are counted.
pub const MAX_TODOS: usize = 20;
/// Characters kept of one todo item or of the current step.
pub const MAX_ITEM_CHARS: usize = 150;
/// Pages of 100 issue comments searched for the sticky comment (the newest 1,000 are not
/// reachable beyond this: a thread that long gets a new comment).
pub const STICKY_PAGES: u64 = 10;

/// The body while the agent works: the run link, then its todo list and current step. Progress is
/// agent-written, so every item is one redacted line in a code span, where GitHub renders no
/// markdown or HTML and notifies no one (docs/security.md).
pub fn render_working(run_url: Option<&str>, todos: &[Todo<'_>], step: Option<&str>) -> String {
    let mut body = String::from("⏳ **Working on it…**");
    if let Some(url) = run_url {
        body.push_str(&format!(" Follow the run: {url}"));
    }
    let shown: Vec<&Todo<'_>> = todos
        .iter()
        .filter(|t| !t.content.trim().is_empty())
        .collect();
    if !shown.is_empty() {
        body.push_str("\n\n**Progress**\n");
        for todo in shown.iter().take(MAX_TODOS) {
            let mark = match todo.status {
                "completed" => "✅",
                "in_progress" => "🔄",
                "cancelled" => "🚫",
                _ => "⬜",
            };
            body.push_str(&format!("\n- {mark} {}", inert(todo.content)));
        }
        if shown.len() > MAX_TODOS {
            body.push_str(&format!("\n- … and {} more", shown.len() - MAX_TODOS));
        }
    }
    if let Some(step) = step.filter(|s| !s.trim().is_empty()) {
        body.push_str(&format!("\n\nNow: {}", inert(step)));
    }
    body.push_str(&format!("\n\n{MARKER}\n"));
    // Once more whole, as every body that leaves the run.
    crate::redact::redact(&body)
}

/// Agent text as one inline code span: redacted whole first (flattening could split a secret),
/// one line, cut, and without backticks (which would end the span).
fn inert(text: &str) -> String {
    let flat: String = crate::redact::redact(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('`', "'");
    let cut = match flat.char_indices().nth(MAX_ITEM_CHARS) {
        None => flat,
        Some((i, _)) => format!("{}…", &flat[..i]),
    };
    // `` `x` ``, and a space either side, so a leading or trailing quote cannot touch the fence.
    format!("`` {cut} ``")
}

#[derive(Debug, Deserialize)]
struct Edited {
    id: u64,
    #[serde(default)]
    html_url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ListedComment {
    id: u64,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    html_url: Option<String>,
    #[serde(default)]
    user: Option<Login>,
}

#[derive(Debug, Deserialize)]
struct Login {
    #[serde(default)]
    login: Option<String>,
}

impl GitHub {
    /// A new comment in the thread: REST for an issue or pull request, GraphQL for a discussion.
    pub async fn post_comment(
        &self,
        thread: &Thread,
        body: &str,
    ) -> Result<PostedComment, ApiError> {
        match thread.kind {
            TargetKind::Issue | TargetKind::PullRequest => {
                self.comment_on_issue(thread.number, body).await
            }
            TargetKind::Discussion => match &thread.node_id {
                Some(node_id) => self.comment_on_discussion(node_id, body).await,
                None => Err(ApiError::Unsupported {
                    operation: "add discussion comment",
                    reason: "the discussion has no node id in the payload",
                }),
            },
        }
    }

    /// Replaces the body of a comment fro-bot posted in `kind`'s thread:
    /// `PATCH /issues/comments/{id}`, or GraphQL `updateDiscussionComment`.
    pub async fn edit_comment(
        &self,
        kind: TargetKind,
        comment: &PostedComment,
        body: &str,
    ) -> Result<PostedComment, ApiError> {
        match kind {
            TargetKind::Issue | TargetKind::PullRequest => {
                const OP: &str = "edit comment";
                let id: u64 = comment.id.parse().map_err(|_| ApiError::Unsupported {
                    operation: OP,
                    reason: "the comment id is not a REST id",
                })?;
                // An edit sets the body: sending it again changes nothing.
                let path = format!("{}/issues/comments/{id}", self.repo_path());
                let request = json!({ "body": body });
                let edited: Edited = self
                    .call(Resend::Free, || self.client.patch(&path, Some(&request)))
                    .await
                    .map_err(|e| ApiError::from_octocrab(OP, e))?;
                Ok(PostedComment {
                    id: edited.id.to_string(),
                    url: edited.html_url.or_else(|| comment.url.clone()),
                })
            }
            TargetKind::Discussion => {
                const OP: &str = "update discussion comment";
                let query = "mutation($comment: ID!, $body: String!) { \
                     updateDiscussionComment(input: {commentId: $comment, body: $body}) { \
                     comment { id url } } }";
                let data = self
                    .graphql(
                        OP,
                        Resend::Free,
                        json!({"query": query,
                               "variables": {"comment": comment.id, "body": body}}),
                    )
                    .await?;
                let edited = data
                    .pointer("/updateDiscussionComment/comment")
                    .filter(|c| !c.is_null())
                    .ok_or(ApiError::Graphql {
                        operation: OP,
                        message: "the response has no comment".into(),
                    })?;
                Ok(PostedComment {
                    id: comment.id.clone(),
                    url: edited
                        .get("url")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .or_else(|| comment.url.clone()),
                })
            }
        }
    }

    /// The thread's sticky comment: the newest one that carries [`MARKER`] on a line of its own
    /// AND was written by the token's own identity. A comment by anyone else is never a candidate,
    /// whatever it carries: only our own comment may be overwritten.
    pub async fn find_own_comment(
        &self,
        thread: &Thread,
    ) -> Result<Option<PostedComment>, ApiError> {
        match thread.kind {
            TargetKind::Issue | TargetKind::PullRequest => {
                self.find_own_issue_comment(thread).await
            }
            TargetKind::Discussion => self.find_own_discussion_comment(thread).await,
        }
    }

    async fn find_own_issue_comment(
        &self,
        thread: &Thread,
    ) -> Result<Option<PostedComment>, ApiError> {
        self.own_issue_comment(thread.number, super::marker::carries_marker)
            .await
    }

    /// The newest comment on issue or pull request `number` written by the token's own identity
    /// whose body `wanted` accepts (at most [`STICKY_PAGES`] pages of 100).
    pub(crate) async fn own_issue_comment(
        &self,
        number: u64,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<Option<PostedComment>, ApiError> {
        const PER_PAGE: u64 = 100;
        let me = self.own_login().await?;
        let path = format!("{}/issues/{number}/comments", self.repo_path());
        let mut found = None;
        for page in 1..=STICKY_PAGES {
            let batch: Vec<ListedComment> = self
                .get_with(&path, &[("per_page", PER_PAGE), ("page", page)])
                .await
                .map_err(|e| ApiError::from_octocrab("list comments", e))?;
            let full = batch.len() as u64 == PER_PAGE;
            for c in batch {
                let mine = c
                    .user
                    .and_then(|u| u.login)
                    .is_some_and(|login| login.eq_ignore_ascii_case(&me));
                if mine && c.body.as_deref().is_some_and(&wanted) {
                    found = Some(PostedComment {
                        id: c.id.to_string(),
                        url: c.html_url,
                    });
                }
            }
            if !full {
                break;
            }
        }
        Ok(found)
    }

    /// GraphQL says itself whether the viewer (the token) wrote a comment: `viewerDidAuthor`.
    async fn find_own_discussion_comment(
        &self,
        thread: &Thread,
    ) -> Result<Option<PostedComment>, ApiError> {
        let query = "query($owner: String!, $name: String!, $number: Int!) { \
             repository(owner: $owner, name: $name) { discussion(number: $number) { \
             comments(last: 100) { nodes { id url body viewerDidAuthor } } } } }";
        let vars = json!({"owner": self.owner, "name": self.repo, "number": thread.number});
        let data = self
            .graphql(
                "find own discussion comment",
                Resend::Free,
                json!({"query": query, "variables": vars}),
            )
            .await?;
        Ok(own_among(
            data.pointer("/repository/discussion/comments/nodes"),
            super::marker::carries_marker,
        ))
    }

    /// The newest comment the token wrote on the discussion with node id `discussion` whose body
    /// `wanted` accepts (among its last 100).
    pub(crate) async fn own_discussion_comment(
        &self,
        discussion: &str,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<Option<PostedComment>, ApiError> {
        let query = "query($id: ID!) { node(id: $id) { ... on Discussion { \
             comments(last: 100) { nodes { id url body viewerDidAuthor } } } } }";
        let data = self
            .graphql(
                "find own discussion comment",
                Resend::Free,
                json!({"query": query, "variables": {"id": discussion}}),
            )
            .await?;
        Ok(own_among(data.pointer("/node/comments/nodes"), wanted))
    }
}

/// The last of `nodes` the viewer wrote whose body `wanted` accepts.
fn own_among(nodes: Option<&Value>, wanted: impl Fn(&str) -> bool) -> Option<PostedComment> {
    nodes
        .and_then(Value::as_array)?
        .iter()
        .filter(|n| n.get("viewerDidAuthor").and_then(Value::as_bool) == Some(true))
        .filter(|n| n.get("body").and_then(Value::as_str).is_some_and(&wanted))
        .filter_map(|n| {
            Some(PostedComment {
                id: n.get("id")?.as_str()?.to_string(),
                url: n.get("url").and_then(Value::as_str).map(str::to_string),
            })
        })
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn todo<'a>(content: &'a str, status: &'a str) -> Todo<'a> {
        Todo { content, status }
    }

    #[test]
    fn working_body_has_the_run_link_the_todos_the_step_and_the_marker() {
        let body = render_working(
            Some("https://github.com/o/r/actions/runs/42"),
            &[
                todo("Read the issue", "completed"),
                todo("Fix it", "in_progress"),
            ],
            Some("bash — cargo test"),
        );
        assert!(body.starts_with(
            "⏳ **Working on it…** Follow the run: https://github.com/o/r/actions/runs/42"
        ));
        assert!(body.contains("\n- ✅ `` Read the issue ``"), "{body}");
        assert!(body.contains("\n- 🔄 `` Fix it ``"), "{body}");
        assert!(body.contains("Now: `` bash — cargo test ``"), "{body}");
        assert!(super::super::marker::carries_marker(&body));
        let bare = render_working(None, &[], None);
        assert_eq!(bare, format!("⏳ **Working on it…**\n\n{MARKER}\n"));
    }

    /// What a prompt-injected agent would write into its todo list to break out of the progress
    /// list: close a block, forge the marker, ping people, embed an image, end the code span, or
    /// flood the comment. Each stays inert text inside one code span on one line.
    #[test]
    fn hostile_progress_stays_inert_bounded_and_redacted() {
        crate::redact::register("hostile-progress-secret-value");
        let hostile = [
            "</details>\n\n# Owned\n<details open>",
            "x\n<!-- fro-bot:response -->\ny",
            "@mona @octo/admins please look",
            "![pixel](https://evil.example/p.png) [click](javascript:alert(1))",
            "`` `break` `` out ```",
            "<img src=x onerror=alert(1)> <script>alert(1)</script>",
            "token hostile-progress-secret-value and ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        ];
        let flood = "flood ".repeat(5_000);
        let items: Vec<String> = (0..100).map(|i| format!("item {i}")).collect();
        let mut todos: Vec<Todo> = hostile.iter().map(|h| todo(h, "pending")).collect();
        todos.push(todo(&flood, "in_progress"));
        todos.extend(items.iter().map(|i| todo(i, "pending")));
        let body = render_working(None, &todos, Some("bash — </details> @mona `x`\nnext"));

        assert!(!body.contains("hostile-progress-secret-value"), "{body}");
        assert!(!body.contains("ghp_abcdef"), "{body}");
        assert!(
            body.chars().count() < 6_000,
            "bounded: {}",
            body.chars().count()
        );
        assert!(body.contains(&format!("… and {} more", todos.len() - MAX_TODOS)));
        // Exactly one line is the marker: the forged one is inside a list item.
        assert_eq!(body.lines().filter(|l| l.trim() == MARKER).count(), 1);
        for line in body.lines() {
            let trimmed = line.trim();
            let agent_written = trimmed.starts_with("- ") && !trimmed.starts_with("- … and")
                || trimmed.starts_with("Now:");
            if !agent_written {
                continue;
            }
            // Every agent-written line: a prefix, then exactly one double-backtick span that
            // runs to the end of the line, with no backtick inside it.
            let start = line
                .find("`` ")
                .unwrap_or_else(|| panic!("no code span: {line}"));
            let (prefix, span) = line.split_at(start);
            assert!(!prefix.contains(['<', '@', '[', '!', '`']), "{line}");
            let inner = span
                .strip_prefix("`` ")
                .and_then(|s| s.strip_suffix(" ``"))
                .unwrap_or_else(|| panic!("the span does not end the line: {line}"));
            assert!(
                !inner.contains('`'),
                "a backtick could end the span: {line}"
            );
        }
        // Outside code spans: no HTML, no mention, no image — the neutralizer finds nothing.
        assert_eq!(crate::redact::neutralize_mentions(&body, None), body);
        let outside: String = body
            .lines()
            .map(|l| l.split("`` ").next().unwrap_or(""))
            .collect();
        assert!(
            !outside.contains("</details>") && !outside.contains('@'),
            "{outside}"
        );
    }
}
