//! What the agent proposes through its tools (`describe_change`, `discard_changes`, `add_labels`,
//! `remove_labels`, `comment`, `create_issue`, and the review tools: `review_comment`,
//! `submit_review`, `reply_to_review_thread`, `resolve_review_thread`, whose lines count on one
//! [`Side`] of the diff), and the policy it proposes against.
//!
//! The tools run as the agent's uid (OpenCode starts them), so anything they write the agent could
//! write itself: they only check the arguments' shape, tell the agent early what the policy will
//! refuse, and append one JSON line per proposal to a file in a per-run directory the agent owns
//! (`FRO_BOT_PROPOSALS`). After the turn — the agent's processes dead — fro-bot reads that file
//! (no symlink followed, size-capped) and checks every proposal again against the policy it
//! holds itself. The policy file (`FRO_BOT_OUTPUT_POLICY`) is fro-bot's, read-only to the agent.

use std::io::{Read as _, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::review::ReviewEvent;

/// The most a proposals file may hold; the rest is not read (and the summary says so).
pub const MAX_PROPOSALS_BYTES: u64 = 1 << 20;
/// GitHub's limit for a comment or issue body.
pub const MAX_BODY_CHARS: usize = 65_536;
pub const MAX_TITLE_CHARS: usize = 256;
pub const MAX_LABELS_PER_CALL: usize = 20;

/// Which version of the file a review comment's line number counts in (GitHub's `side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Side {
    /// The base: deleted and unchanged lines.
    Left,
    /// The head: added and unchanged lines.
    Right,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Left => "LEFT",
            Side::Right => "RIGHT",
        }
    }
}

/// One proposal, one JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum Proposal {
    DescribeChange {
        title: String,
        body: String,
    },
    DiscardChanges {
        reason: String,
    },
    AddLabels {
        number: u64,
        labels: Vec<String>,
    },
    RemoveLabels {
        number: u64,
        labels: Vec<String>,
    },
    Comment {
        number: u64,
        body: String,
    },
    CreateIssue {
        title: String,
        body: String,
        labels: Vec<String>,
    },
    /// An inline comment of the run's review.
    ReviewComment {
        path: String,
        line: u32,
        #[serde(default)]
        start_line: Option<u32>,
        side: Side,
        body: String,
        /// What the lines should read: fro-bot writes the suggestion block itself.
        #[serde(default)]
        suggestion: Option<String>,
    },
    /// The review's body and event; the last one counts.
    SubmitReview {
        body: String,
        event: ReviewEvent,
    },
    ReplyToThread {
        thread: String,
        body: String,
    },
    ResolveThread {
        thread: String,
    },
}

impl Proposal {
    /// Whether the review phase carries it out (not `actions` or `deliver`).
    pub fn is_review(&self) -> bool {
        match self {
            Proposal::ReviewComment { .. }
            | Proposal::SubmitReview { .. }
            | Proposal::ReplyToThread { .. }
            | Proposal::ResolveThread { .. } => true,
            Proposal::DescribeChange { .. }
            | Proposal::DiscardChanges { .. }
            | Proposal::AddLabels { .. }
            | Proposal::RemoveLabels { .. }
            | Proposal::Comment { .. }
            | Proposal::CreateIssue { .. } => false,
        }
    }
}

/// What fro-bot allows this run, as the tools read it (fro-bot checks again after the turn).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPolicy {
    /// Whether file changes are delivered (`changes: pull-request`).
    pub changes: bool,
    /// Labels the agent may add or remove; `None`: any label the repository has.
    pub labels: Option<Vec<String>>,
    pub max_comments: u64,
    pub max_issues: u64,
    /// `None`: the run has no pull request to review.
    #[serde(default)]
    pub review: Option<ReviewPolicy>,
}

/// What a review may carry this run (`review-events`, `max-review-comments`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewPolicy {
    pub events: Vec<ReviewEvent>,
    pub max_comments: u64,
}

impl OutputPolicy {
    pub fn allows_label(&self, label: &str) -> bool {
        self.labels
            .as_ref()
            .is_none_or(|l| l.iter().any(|a| a.eq_ignore_ascii_case(label)))
    }

    /// Writes it where the tools read it: fro-bot's file, readable by the agent's uid, which cannot
    /// change it. It lives as long as the returned handle.
    pub fn write_file(&self) -> std::io::Result<tempfile::NamedTempFile> {
        crate::confine::agent_readable_json("fro-bot-output-policy-", self)
    }

    pub fn read_file(path: &Path) -> Option<OutputPolicy> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }
}

/// Checks a proposal's shape; the error is what the tool tells the agent.
pub fn validate(p: &Proposal, policy: &OutputPolicy) -> Result<(), String> {
    let title = |t: &str| match t.trim().chars().count() {
        0 => Err("the title is empty".to_string()),
        n if n > MAX_TITLE_CHARS => Err(format!("the title is over {MAX_TITLE_CHARS} characters")),
        _ => Ok(()),
    };
    let body = |b: &str| match b.chars().count() {
        n if n > MAX_BODY_CHARS => Err(format!("the body is over {MAX_BODY_CHARS} characters")),
        _ => Ok(()),
    };
    let labels = |ls: &[String]| {
        if ls.is_empty() || ls.len() > MAX_LABELS_PER_CALL {
            return Err(format!("give 1 to {MAX_LABELS_PER_CALL} labels"));
        }
        match ls.iter().find(|l| !policy.allows_label(l)) {
            Some(l) => Err(format!(
                "the label {l:?} is not allowed (allowed: the `allowed-labels` input, else the repository's existing labels)"
            )),
            None => Ok(()),
        }
    };
    let number = |n: u64| match n {
        0 => Err("the issue or pull request number must be positive".to_string()),
        _ => Ok(()),
    };
    match p {
        Proposal::DescribeChange { title: t, body: b } => {
            if !policy.changes {
                return Err("file changes are not delivered in this run (`changes: off`)".into());
            }
            title(t).and(body(b))
        }
        Proposal::DiscardChanges { .. } => Ok(()),
        Proposal::AddLabels {
            number: n,
            labels: l,
        }
        | Proposal::RemoveLabels {
            number: n,
            labels: l,
        } => number(*n).and(labels(l)),
        Proposal::Comment { number: n, body: b } => {
            number(*n).and(body(b)).and(match b.trim().is_empty() {
                true => Err("the body is empty".into()),
                false => Ok(()),
            })
        }
        Proposal::CreateIssue {
            title: t,
            body: b,
            labels: l,
        } => title(t)
            .and(body(b))
            .and(if l.is_empty() { Ok(()) } else { labels(l) }),
        review => validate_review(review, policy.review.as_ref()).and_then(|()| match review {
            Proposal::ReviewComment { body: b, .. }
            | Proposal::SubmitReview { body: b, .. }
            | Proposal::ReplyToThread { body: b, .. } => body(b),
            _ => Ok(()),
        }),
    }
}

/// The review proposals' own checks (anchoring and thread ownership are the tools' and
/// `review::compose`'s, against the pull request's diff and threads).
fn validate_review(p: &Proposal, policy: Option<&ReviewPolicy>) -> Result<(), String> {
    let Some(policy) = policy else {
        return Err("this run has no pull request to review".into());
    };
    let filled = |what: &str, text: &str| match text.trim().is_empty() {
        true => Err(format!("the {what} is empty")),
        false => Ok(()),
    };
    match p {
        Proposal::ReviewComment {
            line,
            start_line,
            side,
            body,
            suggestion,
            ..
        } => {
            if *line == 0 || *start_line == Some(0) {
                return Err("line numbers start at 1".into());
            }
            if suggestion.is_some() && *side == Side::Left {
                return Err(
                    "a suggestion replaces lines of the new version: use side RIGHT".into(),
                );
            }
            match suggestion {
                Some(_) => Ok(()),
                None => filled("body", body),
            }
        }
        Proposal::SubmitReview { event, .. } if !policy.events.contains(event) => Err(format!(
            "`{}` is not allowed in this run (the `review-events` input allows {})",
            event.as_str(),
            policy
                .events
                .iter()
                .map(|e| e.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Proposal::SubmitReview { .. } => Ok(()),
        Proposal::ReplyToThread { thread, body } => {
            filled("thread", thread).and(filled("body", body))
        }
        Proposal::ResolveThread { thread } => filled("thread", thread),
        _ => Ok(()),
    }
}

/// Appends one proposal to the file at `path` (the tools' side).
pub fn append(path: &Path, p: &Proposal) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut line = serde_json::to_vec(p).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(&line)
}

/// The proposals as fro-bot reads them after the turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadProposals {
    pub proposals: Vec<Proposal>,
    /// Lines that were not a proposal (the agent may write the file directly).
    pub malformed: usize,
    /// The file was over [`MAX_PROPOSALS_BYTES`]: only the first part was read.
    pub truncated: bool,
    /// Why the file could not be read at all (a symlink, not a regular file, ...).
    pub unreadable: Option<String>,
}

/// Reads the proposals file: never through a symlink, only a regular file, at most
/// [`MAX_PROPOSALS_BYTES`]. A missing file is no proposal.
pub fn read(path: &Path) -> ReadProposals {
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = ReadProposals::default();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.unreadable = Some(format!("cannot open {}: {e}", path.display()));
            return out;
        }
    };
    match file.metadata() {
        Ok(m) if m.is_file() => out.truncated = m.len() > MAX_PROPOSALS_BYTES,
        Ok(_) => {
            out.unreadable = Some(format!("{} is not a regular file", path.display()));
            return out;
        }
        Err(e) => {
            out.unreadable = Some(format!("cannot stat {}: {e}", path.display()));
            return out;
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_PROPOSALS_BYTES).read_to_end(&mut bytes) {
        out.unreadable = Some(format!("cannot read {}: {e}", path.display()));
        return out;
    }
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<Proposal>(line) {
            Ok(p) => out.proposals.push(p),
            Err(_) => out.malformed += 1,
        }
    }
    out
}

/// The per-run directory the proposals file lives in: the agent's uid owns it for the turn.
pub struct ProposalsDir {
    dir: tempfile::TempDir,
}

impl ProposalsDir {
    /// A fresh 0700 directory under the system temp dir, handed to `uid:gid` when fro-bot is root.
    pub fn create(owner: Option<(u32, u32)>) -> std::io::Result<ProposalsDir> {
        let dir = tempfile::Builder::new()
            .prefix("fro-bot-proposals-")
            .tempdir()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        Ok(ProposalsDir { dir })
    }

    pub fn file(&self) -> PathBuf {
        self.dir.path().join("proposals.jsonl")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> OutputPolicy {
        OutputPolicy {
            changes: true,
            labels: Some(vec!["bug".into()]),
            max_comments: 1,
            max_issues: 1,
            review: None,
        }
    }

    #[test]
    fn proposals_round_trip_and_malformed_lines_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.jsonl");
        let p = Proposal::AddLabels {
            number: 3,
            labels: vec!["bug".into()],
        };
        append(&f, &p).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .unwrap()
            .write_all(b"{\"tool\":\"rm_rf\"}\nnot json\n")
            .unwrap();
        let read = read(&f);
        assert_eq!(read.proposals, [p]);
        assert_eq!(read.malformed, 2);
        assert_eq!(read.unreadable, None);
        assert_eq!(
            super::read(&dir.path().join("absent")),
            ReadProposals::default()
        );
    }

    #[test]
    fn a_symlink_or_a_fifo_is_never_read_and_a_huge_file_only_in_part() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "{\"tool\":\"discard_changes\",\"reason\":\"x\"}\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let r = read(&link);
        assert!(r.proposals.is_empty());
        assert!(r.unreadable.is_some(), "{r:?}");
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let r = read(&fifo);
        assert!(r.unreadable.unwrap().contains("not a regular file"));
        let big = dir.path().join("big");
        let line = "{\"tool\":\"discard_changes\",\"reason\":\"x\"}\n";
        std::fs::write(
            &big,
            line.repeat((MAX_PROPOSALS_BYTES as usize) / line.len() + 10),
        )
        .unwrap();
        let r = read(&big);
        assert!(r.truncated);
        assert!(r.proposals.len() < (MAX_PROPOSALS_BYTES as usize) / line.len() + 1);
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let p = policy();
        let bad_label = Proposal::AddLabels {
            number: 1,
            labels: vec!["BUG".into(), "evil".into()],
        };
        assert!(validate(&bad_label, &p).unwrap_err().contains("\"evil\""));
        let long = Proposal::CreateIssue {
            title: "t".repeat(MAX_TITLE_CHARS + 1),
            body: String::new(),
            labels: vec![],
        };
        assert!(validate(&long, &p).unwrap_err().contains("title"));
        let off = OutputPolicy {
            changes: false,
            ..policy()
        };
        let describe = Proposal::DescribeChange {
            title: "x".into(),
            body: String::new(),
        };
        assert!(validate(&describe, &off)
            .unwrap_err()
            .contains("changes: off"));
        assert!(validate(&describe, &p).is_ok());
        let empty = Proposal::Comment {
            number: 1,
            body: " ".into(),
        };
        assert!(validate(&empty, &p).is_err());
    }
}
