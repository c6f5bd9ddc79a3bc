//! The one response comment (`response-mode: github`): the agent's final answer and a collapsible
//! run footer.

use super::api::{ApiError, GitHub, PostedComment};
use super::route::Thread;
use crate::config::ResponseMode;
use crate::runner::env;
use crate::runner::Env;

/// GitHub rejects comment bodies over 65536 characters; keep room for the footer.
pub const MAX_BODY_CHARS: usize = 65_536;
pub use super::marker::{carries_marker, MARKER};

/// What the footer reports about the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFooter {
    pub run_url: Option<String>,
    pub session_id: Option<String>,
    /// `hit` | `miss` | `corrupted` (the `cache-status` output).
    pub cache_status: Option<String>,
    pub logical_key: Option<String>,
    pub duration_secs: Option<u64>,
}

/// `{GITHUB_SERVER_URL}/{repo}/actions/runs/{id}[/attempts/{n}]`.
pub fn run_url(env: &Env) -> Option<String> {
    let server = super::endpoints::server_url(env);
    let repo = env.get(env::GITHUB_REPOSITORY)?;
    let run_id = env.get(env::GITHUB_RUN_ID)?;
    Some(match env.get(env::GITHUB_RUN_ATTEMPT) {
        Some(attempt) if attempt != "1" => {
            format!("{server}/{repo}/actions/runs/{run_id}/attempts/{attempt}")
        }
        _ => format!("{server}/{repo}/actions/runs/{run_id}"),
    })
}

/// The comment body: answer, then the footer in a `<details>` block, then [`MARKER`]. The answer's
/// mentions are made inert (except `requester`'s) and the whole body goes through the redactor.
pub fn render(answer: &str, footer: &RunFooter, requester: Option<&str>) -> String {
    let mut rows = Vec::new();
    if let Some(url) = &footer.run_url {
        rows.push(format!("- Run: {url}"));
    }
    if let Some(id) = &footer.session_id {
        rows.push(format!("- Session: `{}`", code(id)));
    }
    if let Some(key) = &footer.logical_key {
        rows.push(format!("- Thread: `{}`", code(key)));
    }
    if let Some(status) = &footer.cache_status {
        rows.push(format!("- Cache: `{}`", code(status)));
    }
    if let Some(secs) = footer.duration_secs {
        rows.push(format!("- Duration: {secs} s"));
    }
    let details = format!(
        "\n\n<details>\n<summary>fro-bot run details</summary>\n\n{}\n\n</details>\n{MARKER}\n",
        rows.join("\n")
    );
    let answer = answer.trim();
    let answer = if answer.is_empty() {
        "_The agent finished without a written answer._"
    } else {
        answer
    };
    // The agent's part has been through `outbound::links` already (`phases::finalize`).
    let answer = crate::redact::neutralize_mentions(&crate::redact::redact(answer), requester);
    let room = MAX_BODY_CHARS.saturating_sub(details.chars().count());
    let body = format!("{}{details}", super::context::truncate_chars(&answer, room));
    // Once more whole: a cut may not leave half a token shape behind unredacted, and the footer
    // is not exempt.
    crate::redact::redact(&body)
}

/// Backticks would end the inline code span.
fn code(s: &str) -> String {
    s.replace('`', "'")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOutcome {
    Posted(PostedComment),
    /// `response-mode: none`.
    Disabled,
    /// Schedule/dispatch runs have no thread to answer in.
    NoThread,
}

impl GitHub {
    /// Posts the response for a run, exactly once. Errors are non-fatal: log them as warnings.
    pub async fn respond(
        &self,
        mode: ResponseMode,
        thread: Option<&Thread>,
        answer: &str,
        footer: &RunFooter,
        requester: Option<&str>,
    ) -> Result<ResponseOutcome, ApiError> {
        match mode {
            ResponseMode::None => return Ok(ResponseOutcome::Disabled),
            ResponseMode::Github => {}
        }
        let Some(thread) = thread else {
            return Ok(ResponseOutcome::NoThread);
        };
        let body = render(answer, footer, requester);
        let posted = self.post_comment(thread, &body).await?;
        Ok(ResponseOutcome::Posted(posted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_url_from_env() {
        let mut e = Env::from_pairs([
            ("GITHUB_SERVER_URL", "https://github.com"),
            ("GITHUB_REPOSITORY", "o/r"),
            ("GITHUB_RUN_ID", "42"),
            ("GITHUB_RUN_ATTEMPT", "1"),
        ]);
        assert_eq!(
            run_url(&e).as_deref(),
            Some("https://github.com/o/r/actions/runs/42")
        );
        e.set("GITHUB_RUN_ATTEMPT", "3");
        assert_eq!(
            run_url(&e).as_deref(),
            Some("https://github.com/o/r/actions/runs/42/attempts/3")
        );
        e.remove("GITHUB_RUN_ID");
        assert_eq!(run_url(&e), None);
    }

    #[test]
    fn body_has_answer_and_collapsible_footer_and_fits() {
        let footer = RunFooter {
            run_url: Some("https://github.com/o/r/actions/runs/42".into()),
            session_id: Some("ses_abc".into()),
            cache_status: Some("hit".into()),
            logical_key: Some("issue-4".into()),
            duration_secs: Some(12),
        };
        let body = render("Fixed it.", &footer, None);
        assert!(body.starts_with("Fixed it.\n\n<details>"));
        assert!(body.contains("- Run: https://github.com/o/r/actions/runs/42"));
        assert!(body.contains("- Session: `ses_abc`"));
        assert!(body.contains("- Cache: `hit`"));
        assert!(body.contains("</details>"));

        let huge = "y".repeat(100_000);
        let body = render(&huge, &footer, None);
        assert!(body.chars().count() <= MAX_BODY_CHARS);
        assert!(body.contains(super::super::context::TRUNCATED));
        assert!(body.contains("- Session: `ses_abc`"), "footer survives");
    }
}
