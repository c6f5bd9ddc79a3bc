//! The GitHub actions the agent proposed through its tools — labels, comments, issues — checked
//! against the run's policy and carried out with fro-bot's token after the turn. Every body goes
//! through the redactor and mention neutralization, and carries fro-bot's response marker (so a
//! comment that mentions the bot never starts a run).

use super::proposals::{self, OutputPolicy, Proposal};
use crate::github::GitHub;

/// What became of one proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    Done { what: String },
    Refused { what: String, why: String },
    Failed { what: String, why: String },
}

impl ActionOutcome {
    pub fn line(&self) -> String {
        match self {
            ActionOutcome::Done { what } => format!("{what}: done"),
            ActionOutcome::Refused { what, why } => format!("{what}: refused ({why})"),
            ActionOutcome::Failed { what, why } => format!("{what}: failed ({why})"),
        }
    }
}

/// Inert text for GitHub: redacted, links and mentions made inert, the response marker last.
pub fn safe_body(text: &str) -> String {
    let text = crate::outbound::prose(text, None);
    format!("{}\n\n{}", text.trim_end(), crate::github::response::MARKER)
}

fn label_list(labels: &[String]) -> String {
    labels
        .iter()
        .map(|l| super::checks::code(l))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Carries out the proposals that are not about file changes, in order, within the policy.
pub async fn carry_out(
    gh: &GitHub,
    proposals: &[Proposal],
    policy: &OutputPolicy,
) -> Vec<ActionOutcome> {
    let mut out = Vec::new();
    let (mut comments, mut issues) = (0u64, 0u64);
    for p in proposals.iter().filter(|p| !p.is_review()) {
        let what = describe(p);
        if let Err(why) = proposals::validate(p, policy) {
            out.push(ActionOutcome::Refused { what, why });
            continue;
        }
        let counter = match p {
            Proposal::Comment { .. } => Some((&mut comments, policy.max_comments, "max-comments")),
            Proposal::CreateIssue { .. } => Some((&mut issues, policy.max_issues, "max-issues")),
            _ => None,
        };
        if let Some((count, limit, input)) = counter {
            if *count >= limit {
                let why = format!("over `{input}` ({limit}) for this run");
                out.push(ActionOutcome::Refused { what, why });
                continue;
            }
            *count += 1;
        }
        let Some(result) = act(gh, p).await else {
            continue;
        };
        out.push(match result {
            Ok(()) => ActionOutcome::Done { what },
            Err(why) => ActionOutcome::Failed { what, why },
        });
    }
    out
}

/// One proposal carried out; `None` for the change proposals, which `deliver` handles, and the
/// review's, which `phases::delivery::pr_review` does.
async fn act(gh: &GitHub, p: &Proposal) -> Option<Result<(), String>> {
    let r = match p {
        Proposal::DescribeChange { .. }
        | Proposal::DiscardChanges { .. }
        | Proposal::ReviewComment { .. }
        | Proposal::SubmitReview { .. }
        | Proposal::ReplyToThread { .. }
        | Proposal::ResolveThread { .. } => return None,
        Proposal::AddLabels { number, labels } => gh.add_labels(*number, labels).await,
        Proposal::RemoveLabels { number, labels } => {
            let mut r = Ok(());
            for l in labels {
                if let Err(e) = gh.remove_label(*number, l).await {
                    r = Err(e);
                }
            }
            r
        }
        Proposal::Comment { number, body } => gh
            .comment_on_issue(*number, &safe_body(body))
            .await
            .map(drop),
        Proposal::CreateIssue {
            title,
            body,
            labels,
        } => {
            let title = crate::outbound::links(&crate::redact::redact(title.trim()));
            gh.create_issue(&title, &safe_body(body), labels)
                .await
                .map(drop)
        }
    };
    Some(r.map_err(|e| e.to_string()))
}

/// One line naming the proposal (agent-chosen text shown inert).
pub fn describe(p: &Proposal) -> String {
    match p {
        Proposal::DescribeChange { .. } => "describe the change".into(),
        Proposal::DiscardChanges { .. } => "discard the changes".into(),
        Proposal::AddLabels { number, labels } => {
            format!("add {} to #{number}", label_list(labels))
        }
        Proposal::RemoveLabels { number, labels } => {
            format!("remove {} from #{number}", label_list(labels))
        }
        Proposal::Comment { number, .. } => format!("comment on #{number}"),
        Proposal::CreateIssue { title, .. } => {
            format!(
                "open the issue {}",
                super::checks::code(&crate::redact::redact(title))
            )
        }
        Proposal::ReviewComment { path, line, .. } => format!(
            "comment on {}",
            super::checks::code(&format!("{path}:{line}"))
        ),
        Proposal::SubmitReview { event, .. } => format!("submit the review ({})", event.as_str()),
        Proposal::ReplyToThread { thread, .. } => {
            format!("reply in the thread {}", super::checks::code(thread))
        }
        Proposal::ResolveThread { thread } => {
            format!("resolve the thread {}", super::checks::code(thread))
        }
    }
}
