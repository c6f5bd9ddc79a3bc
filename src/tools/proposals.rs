//! The agent's proposal tools, served beside the session tools by `fro-bot session-tools`
//! (`tools`), on the files OpenCode's config hands them (`opencode::config::ProposalTools`). Each
//! checks its arguments, appends the proposal (`safe_outputs::proposals::append`) and tells the
//! agent what happens next: nothing is done during the turn.

use std::path::Path;

use serde_json::{json, Value};

use crate::opencode::config::ProposalTools;
use crate::safe_outputs::proposals::{self, OutputPolicy, Proposal};

/// The tools' names, for the dispatcher.
pub const NAMES: &[&str] = &[
    "describe_change",
    "discard_changes",
    "add_labels",
    "remove_labels",
    "comment",
    "create_issue",
];

pub fn definitions() -> Vec<Value> {
    let labels = json!({"type": "array", "items": {"type": "string"}});
    vec![
        json!({"name": "describe_change",
         "description": "Describe the file changes you made in the work tree: fro-bot commits them after your turn to this thread's branch and opens (or updates) a draft pull request with this title and body. The title is also the commit's headline. Without it fro-bot writes a plain title.",
         "inputSchema": {"type": "object", "required": ["title"], "properties": {
             "title": {"type": "string"}, "body": {"type": "string"}}}}),
        json!({"name": "discard_changes",
         "description": "Say that nothing you changed in the work tree should be delivered (no commit, no pull request).",
         "inputSchema": {"type": "object", "properties": {"reason": {"type": "string"}}}}),
        json!({"name": "add_labels",
         "description": "Propose adding labels to an issue or pull request; fro-bot applies allowed labels after your turn.",
         "inputSchema": {"type": "object", "required": ["number", "labels"], "properties": {
             "number": {"type": "integer"}, "labels": labels}}}),
        json!({"name": "remove_labels",
         "description": "Propose removing labels from an issue or pull request; fro-bot applies it after your turn.",
         "inputSchema": {"type": "object", "required": ["number", "labels"], "properties": {
             "number": {"type": "integer"}, "labels": labels}}}),
        json!({"name": "comment",
         "description": "Propose a comment on an issue or pull request (not the one you are answering: your reply there is posted for you). fro-bot posts it after your turn, within the run's limit.",
         "inputSchema": {"type": "object", "required": ["number", "body"], "properties": {
             "number": {"type": "integer"}, "body": {"type": "string"}}}}),
        json!({"name": "create_issue",
         "description": "Propose a new issue; fro-bot opens it after your turn, within the run's limit.",
         "inputSchema": {"type": "object", "required": ["title"], "properties": {
             "title": {"type": "string"}, "body": {"type": "string"}, "labels": labels}}}),
    ]
}

fn string(args: &Value, name: &str) -> String {
    args[name].as_str().unwrap_or("").to_string()
}

fn number(args: &Value) -> Result<u64, String> {
    match &args["number"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().trim_start_matches('#').parse().ok(),
        _ => None,
    }
    .ok_or_else(|| "missing or invalid argument \"number\"".to_string())
}

fn labels(args: &Value) -> Vec<String> {
    match &args["labels"] {
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        Value::String(s) => s
            .split(',')
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

/// The proposal a call makes.
pub fn proposal(name: &str, args: &Value) -> Result<Proposal, String> {
    Ok(match name {
        "describe_change" => Proposal::DescribeChange {
            title: string(args, "title"),
            body: string(args, "body"),
        },
        "discard_changes" => Proposal::DiscardChanges {
            reason: string(args, "reason"),
        },
        "add_labels" => Proposal::AddLabels {
            number: number(args)?,
            labels: labels(args),
        },
        "remove_labels" => Proposal::RemoveLabels {
            number: number(args)?,
            labels: labels(args),
        },
        "comment" => Proposal::Comment {
            number: number(args)?,
            body: string(args, "body"),
        },
        "create_issue" => Proposal::CreateIssue {
            title: string(args, "title"),
            body: string(args, "body"),
            labels: labels(args),
        },
        other => return Err(format!("unknown tool {other:?}")),
    })
}

/// The tools themselves, on the files OpenCode's config handed over.
impl ProposalTools {
    fn policy(&self) -> OutputPolicy {
        self.policy
            .as_deref()
            .and_then(OutputPolicy::read_file)
            .unwrap_or_default()
    }

    /// One tool call: the text for the agent, or the error it gets.
    pub fn call(&self, name: &str, args: &Value) -> Result<String, String> {
        self.record(&proposal(name, args)?)
    }

    /// Checks a proposal against the policy and appends it; what the agent is told.
    pub fn record(&self, p: &Proposal) -> Result<String, String> {
        proposals::validate(p, &self.policy())?;
        write(&self.file, p)?;
        Ok(match p {
            Proposal::DescribeChange { .. } => "Recorded. After your turn fro-bot checks your work-tree changes (protected paths, size limits, secrets) and commits them to this thread's branch with a draft pull request; your reply is told the result.".into(),
            Proposal::DiscardChanges { .. } => "Recorded: nothing from the work tree will be delivered.".into(),
            p if p.is_review() => "Recorded: fro-bot posts it with this run's one review after your turn; do not repeat it.".into(),
            _ => "Recorded. fro-bot carries it out after your turn if the run's policy allows it; do not repeat it.".into(),
        })
    }
}

fn write(file: &Path, p: &Proposal) -> Result<(), String> {
    proposals::append(file, p).map_err(|e| format!("cannot record the proposal: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_records_a_checked_proposal_and_a_refused_one_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let policy = OutputPolicy {
            changes: true,
            labels: Some(vec!["bug".into()]),
            max_comments: 1,
            max_issues: 1,
            review: None,
        };
        let policy_file = policy.write_file().unwrap();
        let tools = ProposalTools {
            file: dir.path().join("p.jsonl"),
            policy: Some(policy_file.path().to_path_buf()),
            review_view: None,
        };
        let ok = tools.call("add_labels", &json!({"number": "#4", "labels": "bug"}));
        assert!(ok.unwrap().starts_with("Recorded"));
        let refused = tools.call("add_labels", &json!({"number": 4, "labels": ["wontfix"]}));
        assert!(refused.unwrap_err().contains("not allowed"));
        assert!(
            tools.call("comment", &json!({"body": "x"})).is_err(),
            "no number"
        );
        let read = proposals::read(&tools.file);
        assert_eq!(
            read.proposals,
            [Proposal::AddLabels {
                number: 4,
                labels: vec!["bug".into()]
            }]
        );
        let names: Vec<String> = definitions()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, NAMES);
    }
}
