//! Writeback: after the turn, a synthetic user message (`noReply: true`) that records the run in
//! the session itself, so later runs find it by search (prep, `session_search`).

use std::time::Duration;

use super::client::{ApiError, Client, Tokens};

pub const SUMMARY_HEADER: &str = "--- Fro Bot Run Summary ---";

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    pub event: String,
    pub repo: String,
    pub git_ref: String,
    pub run_id: String,
    pub cache_status: String,
    pub session_id: String,
    pub logical_key: String,
    pub duration: Duration,
    pub tokens: Tokens,
    pub cost: f64,
    pub errors: Vec<String>,
}

pub fn summary_text(s: &RunSummary) -> String {
    let errors = if s.errors.is_empty() {
        "none".to_string()
    } else {
        s.errors.join("; ")
    };
    format!(
        "{SUMMARY_HEADER}\n\
         Event: {}\nRepository: {}\nRef: {}\nRun ID: {}\nCache status: {}\nSession ID: {}\n\
         Logical key: {}\nDuration: {}s\nTokens: input {}, output {}, reasoning {}, cache read {}, \
         cache write {}\nCost: {:.4}\nErrors: {errors}",
        s.event,
        s.repo,
        s.git_ref,
        s.run_id,
        s.cache_status,
        s.session_id,
        s.logical_key,
        s.duration.as_secs(),
        s.tokens.input,
        s.tokens.output,
        s.tokens.reasoning,
        s.tokens.cache.read,
        s.tokens.cache.write,
        s.cost,
    )
}

/// Appends the summary to the session without starting a turn.
pub async fn write_summary(client: &Client, summary: &RunSummary) -> Result<(), ApiError> {
    client
        .append_message(&summary.session_id, &summary_text(summary))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_every_field() {
        let t = summary_text(&RunSummary {
            event: "issue_comment".into(),
            repo: "o/r".into(),
            git_ref: "main".into(),
            run_id: "42".into(),
            cache_status: "hit".into(),
            session_id: "ses_1".into(),
            logical_key: "issue-7".into(),
            duration: Duration::from_millis(61_900),
            tokens: Tokens {
                input: 10,
                output: 5,
                ..Default::default()
            },
            cost: 0.5,
            errors: vec!["APIError: boom".into()],
        });
        assert!(t.starts_with(SUMMARY_HEADER));
        for part in [
            "Event: issue_comment",
            "Repository: o/r",
            "Ref: main",
            "Run ID: 42",
            "Cache status: hit",
            "Session ID: ses_1",
            "Logical key: issue-7",
            "Duration: 61s",
            "input 10, output 5",
            "Errors: APIError: boom",
        ] {
            assert!(t.contains(part), "{part}");
        }
    }
}
