//! What became of the run's review: the summary's "Review" row, the line the answer (and so the
//! tracking comment) carries, and the `review-url` output.

use crate::config::review::ReviewEvent;

/// Replies and resolves in fro-bot's threads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadActs {
    pub replied: usize,
    pub resolved: usize,
    /// What GitHub refused, a line each.
    pub failed: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewOutcome {
    /// The run is not about a pull request fro-bot can review.
    NotOffered,
    /// The pull request could not be read before the turn: no review tools.
    Unavailable {
        why: String,
    },
    /// The agent proposed nothing for a review.
    NothingProposed,
    Posted {
        url: String,
        event: ReviewEvent,
        comments: usize,
        moved: usize,
        repeated: usize,
        /// GitHub refused the first try (its 422) and the review went again.
        retried: Option<String>,
        threads: ThreadActs,
        refused: Vec<String>,
    },
    /// No review, only replies and resolves (or findings all already said).
    ThreadsOnly {
        repeated: usize,
        threads: ThreadActs,
        refused: Vec<String>,
    },
    /// The pull request's head moved during the run: a newer run reviews the newer head.
    HeadMoved {
        recorded: String,
        now: String,
    },
    Failed {
        why: String,
        refused: Vec<String>,
    },
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

fn threads_text(t: &ThreadActs) -> String {
    let mut parts = Vec::new();
    if t.replied > 0 {
        parts.push(format!("{} replied", t.replied));
    }
    if t.resolved > 0 {
        parts.push(format!("{} resolved", t.resolved));
    }
    if !t.failed.is_empty() {
        parts.push(format!(
            "{} failed ({})",
            t.failed.len(),
            t.failed.join("; ")
        ));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!("; threads: {}", parts.join(", ")),
    }
}

fn refused_text(refused: &[String]) -> String {
    match refused.is_empty() {
        true => String::new(),
        false => format!("; refused: {}", refused.join("; ")),
    }
}

impl ReviewOutcome {
    pub fn url(&self) -> Option<&str> {
        match self {
            ReviewOutcome::Posted { url, .. } if !url.is_empty() => Some(url),
            _ => None,
        }
    }

    /// The summary's "Review" row; `None` when there was nothing to review.
    pub fn summary_row(&self) -> Option<(String, String)> {
        let text = match self {
            ReviewOutcome::NotOffered | ReviewOutcome::NothingProposed => return None,
            ReviewOutcome::Unavailable { why } => format!("no review tools: {why}"),
            ReviewOutcome::Posted {
                event,
                comments,
                moved,
                repeated,
                retried,
                threads,
                refused,
                ..
            } => format!(
                "posted ({}): {comments} comments, {moved} moved to the body, {repeated} skipped as already said{}{}{}",
                event.as_str(),
                retried
                    .as_ref()
                    .map_or(String::new(), |why| format!("; posted again after GitHub refused: {why}")),
                threads_text(threads),
                refused_text(refused)
            ),
            ReviewOutcome::ThreadsOnly {
                repeated,
                threads,
                refused,
            } => format!(
                "no new review: {repeated} skipped as already said{}{}",
                threads_text(threads),
                refused_text(refused)
            ),
            ReviewOutcome::HeadMoved { recorded, now } => format!(
                "not posted: the head moved from {} to {} during the run (the run for {} reviews it)",
                short(recorded),
                short(now),
                short(now)
            ),
            ReviewOutcome::Failed { why, refused } => {
                format!("failed: {why}{}", refused_text(refused))
            }
        };
        Some(("Review".into(), text))
    }

    /// The line the answer carries.
    pub fn answer_line(&self) -> Option<String> {
        match self {
            ReviewOutcome::Posted {
                url,
                comments,
                moved,
                ..
            } => Some(format!(
                "**Review**: [posted]({url}) with {comments} inline comment{}{}.",
                if *comments == 1 { "" } else { "s" },
                match moved {
                    0 => String::new(),
                    n => format!(", {n} in its body (not on the diff)"),
                }
            )),
            ReviewOutcome::HeadMoved { .. } | ReviewOutcome::Failed { .. } => self
                .summary_row()
                .map(|(_, text)| format!("**Review**: {text}")),
            ReviewOutcome::NotOffered
            | ReviewOutcome::Unavailable { .. }
            | ReviewOutcome::NothingProposed
            | ReviewOutcome::ThreadsOnly { .. } => None,
        }
    }
}
