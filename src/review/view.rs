//! What the agent's review tools know of the pull request (`ReviewView`): the diff at the head
//! recorded when the run started, the range since fro-bot's last review, and fro-bot's earlier
//! threads. fro-bot writes it before the turn, readable by the agent's uid but not writable
//! (`confine::agent_readable_json`), and keeps its own copy: after the turn every proposal is
//! checked again against that copy, never against anything the agent could have changed.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::safe_outputs::proposals::Side;

/// The most of a diff the view carries; a larger pull request's diff is cut at a file boundary
/// and the agent is told (`ReviewView::diff_cut`).
pub const MAX_DIFF_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewView {
    pub number: u64,
    /// The head the review is pinned to (`commit_id`).
    pub head_sha: String,
    /// Who opened the pull request (fro-bot never approves its own).
    pub author: String,
    /// The pull request's whole diff at `head_sha`, what comments are anchored in.
    pub diff: String,
    /// Files left out of `diff` for its size.
    pub diff_cut: bool,
    pub since: Since,
    /// fro-bot's own threads on the pull request, oldest first.
    pub threads: Vec<ThreadView>,
}

/// What this review covers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Since {
    /// No earlier review of fro-bot's: the whole pull request.
    #[default]
    FirstReview,
    /// fro-bot reviewed `from` and the head has moved on from it: the commits after it.
    Range { from: String, diff: String },
    /// fro-bot reviewed `from`, which the head no longer contains (a force-push): the whole pull
    /// request again.
    Rewritten { from: String },
    /// fro-bot already reviewed this very head.
    Unchanged,
}

/// One of fro-bot's threads, as `list_review_threads` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadView {
    /// The GraphQL node id the agent names it by.
    pub id: String,
    /// The REST id of its first comment (replies go to it).
    pub comment_id: u64,
    pub path: String,
    /// `None` once the line is gone from the diff (outdated).
    pub line: Option<u32>,
    pub start_line: Option<u32>,
    pub side: Side,
    pub resolved: bool,
    pub outdated: bool,
    /// The first comment's text, its marker taken off, capped.
    pub said: String,
    pub fingerprint: Option<super::fingerprint::Fingerprint>,
    /// Comments after the first.
    pub replies: usize,
}

impl ReviewView {
    /// The view as the tools read it (fro-bot's file; a missing or unreadable one is no view).
    pub fn read_file(path: &Path) -> Option<ReviewView> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    pub fn write_file(&self) -> std::io::Result<tempfile::NamedTempFile> {
        crate::confine::agent_readable_json("fro-bot-review-view-", self)
    }

    /// The diff the agent is asked to review: the range since the last review, else the whole.
    pub fn review_diff(&self) -> &str {
        match &self.since {
            Since::Range { diff, .. } => diff,
            Since::FirstReview | Since::Rewritten { .. } | Since::Unchanged => &self.diff,
        }
    }

    pub fn thread(&self, id: &str) -> Option<&ThreadView> {
        self.threads.iter().find(|t| t.id == id.trim())
    }
}

/// `text` cut to at most `max` bytes at a file boundary (`diff --git`), else at a line; whether
/// it was cut.
pub fn cap_diff(text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    let starts = || head.match_indices('\n').map(|(i, _)| i + 1).rev();
    let at = starts()
        .find(|&i| text[i..].starts_with("diff --git "))
        .or_else(|| starts().next())
        .unwrap_or(0);
    (text[..at].to_string(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_diff_is_cut_at_a_file_boundary() {
        let file = |n: u32| format!("diff --git a/f{n} b/f{n}\n@@ -1 +1 @@\n-a\n+b\n");
        let text: String = (0..10).map(file).collect();
        let (cut, was) = cap_diff(text.clone(), file(0).len() * 3 + 5);
        assert!(was);
        assert_eq!(cut, (0..3).map(file).collect::<String>());
        assert_eq!(cap_diff(text.clone(), text.len()), (text, false));
    }
}
