//! The agent's review tools (docs/design.md#pull-request-review): `review_diff`,
//! `review_comment`, `submit_review`, `list_review_threads`, `reply_to_review_thread`,
//! `resolve_review_thread`. They read fro-bot's view of the pull request (`review::view`), tell
//! the agent at once when a line is not in the diff (with the nearest hunk) or a thread is not
//! fro-bot's, and append proposals like the other proposal tools; fro-bot checks everything again
//! after the turn and posts one review.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::args::{arg_str, arg_usize, required};
use crate::config::review::ReviewEvent;
use crate::opencode::config::ProposalTools;
use crate::review::compose;
use crate::review::diff::PullDiff;
use crate::review::view::{ReviewView, Since};
use crate::safe_outputs::proposals::{Proposal, Side};

/// The most of a diff one `review_diff` answer holds.
const MAX_ANSWER_BYTES: usize = 200_000;

#[derive(Debug, Clone)]
pub struct ReviewTools {
    /// fro-bot's view file (read-only to the agent).
    pub view: PathBuf,
    pub proposals: ProposalTools,
}

pub const NAMES: &[&str] = &[
    "review_diff",
    "review_comment",
    "submit_review",
    "list_review_threads",
    "reply_to_review_thread",
    "resolve_review_thread",
];

pub fn definitions() -> Vec<Value> {
    let side = json!({"type": "string", "enum": ["RIGHT", "LEFT"]});
    vec![
        json!({"name": "review_diff",
         "description": "The pull request's diff to review: the changes since your last review when there was one, else the whole pull request. Optional `path`: one file's part.",
         "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}),
        json!({"name": "review_comment",
         "description": "An inline comment of your review, on a line of the pull request's diff. `line` (and `start_line` for several lines) count in the new file on side RIGHT (added or unchanged lines), in the old file on side LEFT (deleted lines). `suggestion`: what those lines should read instead (RIGHT only); fro-bot writes the suggestion block the author applies with one click. Posted after your turn in one review; a line not in the diff is refused at once with the nearest hunk.",
         "inputSchema": {"type": "object", "required": ["path", "line", "body"], "properties": {
             "path": {"type": "string"}, "line": {"type": "integer"},
             "start_line": {"type": "integer"}, "side": side,
             "body": {"type": "string"}, "suggestion": {"type": "string"}}}}),
        json!({"name": "submit_review",
         "description": "The review's summary and event (COMMENT by default; REQUEST_CHANGES or APPROVE only where the workflow allows them). fro-bot posts it with your inline comments after your turn, as one review.",
         "inputSchema": {"type": "object", "required": ["body"], "properties": {
             "body": {"type": "string"},
             "event": {"type": "string", "enum": ["COMMENT", "REQUEST_CHANGES", "APPROVE"]}}}}),
        json!({"name": "list_review_threads",
         "description": "The review threads you started on this pull request in earlier runs: id, path, line, whether resolved or outdated, what you said. A finding you already raised in an open thread is not posted again.",
         "inputSchema": {"type": "object", "properties": {}}}),
        json!({"name": "reply_to_review_thread",
         "description": "Reply in one of your review threads (an id from list_review_threads).",
         "inputSchema": {"type": "object", "required": ["thread", "body"], "properties": {
             "thread": {"type": "string"}, "body": {"type": "string"}}}}),
        json!({"name": "resolve_review_thread",
         "description": "Resolve one of your review threads (an id from list_review_threads), e.g. when the author fixed what it raised.",
         "inputSchema": {"type": "object", "required": ["thread"], "properties": {
             "thread": {"type": "string"}}}}),
    ]
}

fn side(args: &Value) -> Result<Side, String> {
    match arg_str(args, "side")
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None | Some("RIGHT") => Ok(Side::Right),
        Some("LEFT") => Ok(Side::Left),
        Some(other) => Err(format!("side must be RIGHT or LEFT, not {other:?}")),
    }
}

fn line_arg(args: &Value, name: &str) -> Result<Option<u32>, String> {
    match (&args[name], arg_usize(args, name)) {
        (Value::Null, _) => Ok(None),
        (_, Some(n)) => u32::try_from(n)
            .map(Some)
            .map_err(|_| format!("{name} is too large")),
        (_, None) => Err(format!("{name} must be a line number")),
    }
}

/// The proposal a call makes (`None`: the call only reads).
fn proposal(name: &str, args: &Value) -> Result<Option<Proposal>, String> {
    let text = |n: &str| args[n].as_str().unwrap_or("").to_string();
    Ok(Some(match name {
        "review_comment" => Proposal::ReviewComment {
            path: required(args, "path")?.trim_start_matches("./").to_string(),
            line: line_arg(args, "line")?.ok_or("missing required argument \"line\"")?,
            start_line: line_arg(args, "start_line")?,
            side: side(args)?,
            body: text("body"),
            suggestion: args["suggestion"].as_str().map(str::to_string),
        },
        "submit_review" => Proposal::SubmitReview {
            body: text("body"),
            event: match arg_str(args, "event") {
                None => ReviewEvent::Comment,
                Some(e) => ReviewEvent::parse(e).ok_or_else(|| {
                    format!("event must be COMMENT, REQUEST_CHANGES or APPROVE, not {e:?}")
                })?,
            },
        },
        "reply_to_review_thread" => Proposal::ReplyToThread {
            thread: required(args, "thread")?.to_string(),
            body: text("body"),
        },
        "resolve_review_thread" => Proposal::ResolveThread {
            thread: required(args, "thread")?.to_string(),
        },
        _ => return Ok(None),
    }))
}

impl ReviewTools {
    /// One tool call: the text for the agent, or the error it gets.
    pub fn call(&self, name: &str, args: &Value) -> Result<String, String> {
        let view = ReviewView::read_file(&self.view)
            .ok_or("the pull request's review data is unavailable in this run")?;
        let Some(p) = proposal(name, args)? else {
            return match name {
                "review_diff" => Ok(diff_answer(&view, arg_str(args, "path"))),
                "list_review_threads" => Ok(threads_answer(&view)),
                other => Err(format!("unknown tool {other:?}")),
            };
        };
        let note = check(&view, &p)?;
        let recorded = self.proposals.record(&p)?;
        Ok(match note {
            Some(note) => format!("{note}. {recorded}"),
            None => recorded,
        })
    }
}

/// What the tools can tell at once. A comment off the diff or already said is still recorded —
/// its place is the review's body, or nowhere — and the agent is told (`Ok(Some(note))`); a
/// thread that is not fro-bot's is refused.
fn check(view: &ReviewView, p: &Proposal) -> Result<Option<String>, String> {
    match p {
        Proposal::ReviewComment {
            path,
            line,
            start_line,
            side,
            body,
            suggestion,
        } => {
            let diff = PullDiff::parse(&view.diff);
            let finding = compose::finding_of(body, suggestion.as_deref());
            let print = match compose::placed(&diff, (path, *line, *start_line, *side), finding) {
                Ok(print) => print,
                Err(e) => {
                    return Ok(Some(format!(
                        "Not inline: {}. It goes into the review's body; to put it on the diff instead, call review_comment again with a line of the diff (review_diff shows it) and the body copy is dropped",
                        e.describe()
                    )))
                }
            };
            Ok(view
                .threads
                .iter()
                .find(|t| !t.resolved && t.fingerprint.as_ref() == Some(&print))
                .map(|t| {
                    format!(
                        "You already raised this in your open thread {} (list_review_threads): it is not posted again",
                        t.id
                    )
                }))
        }
        Proposal::ReplyToThread { thread, .. } | Proposal::ResolveThread { thread }
            if view.thread(thread).is_none() =>
        {
            Err(format!(
                "{thread:?} is not a thread you started on this pull request (list_review_threads names yours)"
            ))
        }
        _ => Ok(None),
    }
}

fn diff_answer(view: &ReviewView, path: Option<&str>) -> String {
    let intro = match &view.since {
        Since::FirstReview => "The whole pull request".to_string(),
        Since::Range { from, .. } => format!(
            "The changes since your last review (at {from}); comment on lines of the pull request's whole diff"
        ),
        Since::Rewritten { from } => format!(
            "The whole pull request: its history was rewritten since your last review (at {from})"
        ),
        Since::Unchanged => "The whole pull request (you reviewed this head already)".to_string(),
    };
    let text = view.review_diff();
    let part = match path {
        None => text.to_string(),
        Some(p) => text
            .split_inclusive("\ndiff --git ")
            .filter(|chunk| chunk.contains(&format!(" b/{p}\n")))
            .collect(),
    };
    let (part, cut) = crate::review::view::cap_diff(part, MAX_ANSWER_BYTES);
    // The diff is the pull request's authors' text: data, never instructions.
    let fence = crate::untrusted::Fence::default();
    let author = match view.author.as_str() {
        "" => "unknown",
        a => a,
    };
    let label = crate::untrusted::Label {
        item: "pull request diff",
        author,
        association: "pull request author",
    };
    let mut out = format!(
        "{intro}, at head {}:\n\n{}{}",
        view.head_sha,
        fence.preamble(),
        fence.wrap_code(&label, &part)
    );
    if cut || view.diff_cut {
        out.push_str("\n[the diff is cut here for its size; ask for one file with `path`]");
    }
    out
}

fn threads_answer(view: &ReviewView) -> String {
    let list: Vec<Value> = view
        .threads
        .iter()
        .map(|t| {
            json!({"id": t.id, "path": t.path, "line": t.line, "start_line": t.start_line,
                "side": t.side.as_str(), "resolved": t.resolved, "outdated": t.outdated,
                "replies": t.replies, "said": t.said})
        })
        .collect();
    json!({"threads": list}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safe_outputs::proposals::{self, OutputPolicy, ReviewPolicy};

    const DIFF: &str =
        "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1,2 +1,3 @@\n x\n+y\n z\n";

    #[test]
    fn the_tools_answer_from_the_view_and_record_what_fro_bot_checks_again() {
        let dir = tempfile::tempdir().unwrap();
        let view = ReviewView {
            number: 3,
            head_sha: "abc".into(),
            diff: DIFF.into(),
            since: Since::Range {
                from: "old".into(),
                diff: "diff --git a/a.rs b/a.rs\n+only the new range\n".into(),
            },
            ..ReviewView::default()
        };
        let view_file = view.write_file().unwrap();
        let policy = OutputPolicy {
            review: Some(ReviewPolicy {
                events: vec![ReviewEvent::Comment],
                max_comments: 20,
            }),
            ..OutputPolicy::default()
        };
        let policy_file = policy.write_file().unwrap();
        let tools = ReviewTools {
            view: view_file.path().to_path_buf(),
            proposals: ProposalTools {
                file: dir.path().join("p.jsonl"),
                policy: Some(policy_file.path().to_path_buf()),
                review_view: None,
            },
        };
        let off = tools
            .call(
                "review_comment",
                &json!({"path": "a.rs", "line": 9, "body": "x"}),
            )
            .unwrap();
        assert!(off.contains("nearest hunk there covers lines 1-3"), "{off}");
        let on = tools
            .call(
                "review_comment",
                &json!({"path": "./a.rs", "line": "2", "body": "y?"}),
            )
            .unwrap();
        assert!(on.starts_with("Recorded"), "{on}");
        let approve = tools.call("submit_review", &json!({"body": "ok", "event": "approve"}));
        assert!(approve.unwrap_err().contains("review-events"));
        let theirs = tools.call("resolve_review_thread", &json!({"thread": "PRRT_x"}));
        assert!(theirs.unwrap_err().contains("not a thread you started"));
        let diff = tools.call("review_diff", &json!({})).unwrap();
        assert!(diff.contains("only the new range") && diff.contains("since your last review"));
        assert!(diff.contains("<<<untrusted-") && diff.contains("item=\"pull request diff\""));
        assert_eq!(proposals::read(&tools.proposals.file).proposals.len(), 2);
        let names: Vec<String> = definitions()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, NAMES);
    }
}
