//! After the turn, with the agent's processes gone (docs/design.md#safe-outputs): fro-bot reads
//! what the agent proposed — its work-tree change and its tool calls — checks it, and carries out
//! what passes with its own token. Nothing here fails the run; every outcome is reported.

use crate::github::event::TargetKind;
use crate::github::GitHub;
use crate::phases::delivery::prepare::{ChangesPlan, OutputsPlan};
use crate::phases::delivery::threat_check::{ChangeGate, Terms, ThreatCheck, ThreatReport};
use crate::phases::run_context::Admitted;
use crate::phases::turn::agent::AgentRun;
use crate::safe_outputs::actions::{self, ActionOutcome};
use crate::safe_outputs::branch::Target;
use crate::safe_outputs::capture::{self, Capture};
use crate::safe_outputs::checks::{self, ChangePolicy};
use crate::safe_outputs::deliver::{self as commit, Committed, Message, PullInputs, PullOutcome};
use crate::safe_outputs::proposals::{self, Proposal};

/// The most patch text an answer carries for a pull request fro-bot may not push to.
const MAX_PATCH_CHARS: usize = 50_000;

/// What became of the agent's file changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangesOutcome {
    Off {
        why: String,
    },
    None {
        why: String,
    },
    Delivered {
        committed: Committed,
        pull: PullOutcome,
        stats: Stats,
    },
    Patch {
        number: u64,
        why: String,
        patch: String,
        stats: Stats,
    },
    Refused {
        reasons: Vec<String>,
        stats: Stats,
    },
    /// The threat check's model check stopped it (docs/security.md#the-threat-check).
    Held {
        reasons: Vec<String>,
        /// The patch the answer carries, collapsed (`None`: too long).
        patch: Option<String>,
        stats: Stats,
    },
    Failed {
        why: String,
        stats: Stats,
    },
}

/// Files and lines of a change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub(crate) files: usize,
    pub(crate) added: usize,
    pub(crate) removed: usize,
}

impl Stats {
    fn of(change: &capture::ChangeSet) -> Stats {
        let mut s = Stats {
            files: change.files.len(),
            ..Stats::default()
        };
        for f in &change.files {
            let (a, r) = line_delta(&f.old_content, &f.content);
            s.added += a;
            s.removed += r;
        }
        s
    }

    fn text(&self) -> String {
        format!("{} file(s), +{} −{}", self.files, self.added, self.removed)
    }
}

fn lines(b: &[u8]) -> Vec<&[u8]> {
    match b.is_empty() {
        true => Vec::new(),
        false => b
            .strip_suffix(b"\n")
            .unwrap_or(b)
            .split(|c| *c == b'\n')
            .collect(),
    }
}

/// Lines only in `new` and only in `old` (as multisets; a cheap stand-in for a diff's counts).
fn line_delta(old: &[u8], new: &[u8]) -> (usize, usize) {
    let mut counts: std::collections::HashMap<&[u8], i64> = Default::default();
    for l in lines(old) {
        *counts.entry(l).or_default() -= 1;
    }
    for l in lines(new) {
        *counts.entry(l).or_default() += 1;
    }
    let added = counts
        .values()
        .filter(|v| **v > 0)
        .map(|v| *v as usize)
        .sum();
    let removed = counts
        .values()
        .filter(|v| **v < 0)
        .map(|v| (-v) as usize)
        .sum();
    (added, removed)
}

impl ChangesOutcome {
    /// The `changes` output.
    pub(crate) fn output(&self) -> &'static str {
        match self {
            ChangesOutcome::Off { .. } => "off",
            ChangesOutcome::None { .. } => "none",
            ChangesOutcome::Delivered { .. } => "delivered",
            ChangesOutcome::Patch { .. } => "patch",
            ChangesOutcome::Refused { .. } => "refused",
            ChangesOutcome::Held { .. } => "held",
            ChangesOutcome::Failed { .. } => "failed",
        }
    }
}

/// Everything delivery did, for the answer, the summary and the outputs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeliveryReport {
    pub(crate) changes: ChangesOutcome,
    pub(crate) actions: Vec<ActionOutcome>,
    /// Proposals fro-bot could not read (malformed lines, an unreadable file).
    pub(crate) notes: Vec<String>,
    pub(crate) threat: ThreatReport,
    /// Why the threat check holds what the agent wrote: the review is not posted either.
    pub(crate) held: Option<String>,
}

/// Reads, checks and carries out what the agent proposed.
pub(crate) async fn deliver(
    ctx: &Admitted,
    plan: &OutputsPlan,
    agent_run: &AgentRun,
) -> DeliveryReport {
    let read = plan
        .proposals_file()
        .map(|f| proposals::read(&f))
        .unwrap_or_default();
    let mut notes = read_notes(&read);
    if !agent_run.proposals_stand() {
        let why = "the agent's turn did not complete, so nothing it proposed is carried out";
        return DeliveryReport {
            changes: ChangesOutcome::None { why: why.into() },
            actions: Vec::new(),
            notes,
            threat: ThreatReport::default(),
            held: None,
        };
    }
    let Some(gh) = ctx.gh.as_ref() else {
        let why = "there is no GitHub token".to_string();
        return DeliveryReport {
            changes: ChangesOutcome::Off { why },
            actions: Vec::new(),
            notes,
            threat: ThreatReport::default(),
            held: None,
        };
    };
    let mut threat = ThreatCheck::new(ctx, agent_run, &read.proposals);
    let changes = match &plan.changes {
        ChangesPlan::Off { why } => ChangesOutcome::Off { why: why.clone() },
        ChangesPlan::Deliver { target, base } => {
            let describe = described(&read.proposals);
            match describe {
                Described::Discarded => ChangesOutcome::None {
                    why: "the agent chose to deliver nothing (discard_changes)".into(),
                },
                Described::Titled { .. } | Described::Plain => {
                    deliver_changes(ctx, gh, (target, base), &describe, &mut threat).await
                }
            }
        }
    };
    let actions = match threat.actions().await {
        Some(held) => held,
        None => actions::carry_out(gh, &read.proposals, &plan.policy).await,
    };
    let held = threat.held();
    let threat = threat.report(&mut notes);
    DeliveryReport {
        changes,
        actions,
        notes,
        threat,
        held,
    }
}

fn read_notes(read: &proposals::ReadProposals) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(why) = &read.unreadable {
        notes.push(format!("the agent's proposals could not be read: {why}"));
    }
    if read.malformed > 0 {
        notes.push(format!(
            "{} malformed proposal line(s) ignored",
            read.malformed
        ));
    }
    if read.truncated {
        notes.push(format!(
            "the proposals file was over {} bytes; only its start was read",
            proposals::MAX_PROPOSALS_BYTES
        ));
    }
    notes
}

/// The agent's last word on its change.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Described {
    Titled { title: String, body: String },
    Discarded,
    Plain,
}

fn described(ps: &[Proposal]) -> Described {
    ps.iter()
        .rev()
        .find_map(|p| match p {
            Proposal::DescribeChange { title, body } => Some(Described::Titled {
                title: title.clone(),
                body: body.clone(),
            }),
            Proposal::DiscardChanges { .. } => Some(Described::Discarded),
            _ => None,
        })
        .unwrap_or(Described::Plain)
}

async fn deliver_changes(
    ctx: &Admitted,
    gh: &GitHub,
    (target, base): (&Target, &capture::Base),
    describe: &Described,
    threat: &mut ThreatCheck<'_>,
) -> ChangesOutcome {
    let capture = match capture::capture(&ctx.workspace, base) {
        Ok(c) => c,
        Err(e) => {
            let why = crate::opencode::client::error_chain(&e);
            crate::runner::log::warning(&format!("cannot read the agent's change: {why}"));
            return ChangesOutcome::Failed {
                why,
                stats: Stats::default(),
            };
        }
    };
    if capture.change.is_empty() {
        return ChangesOutcome::None {
            why: "the agent changed no file".into(),
        };
    }
    let stats = Stats::of(&capture.change);
    let so = &ctx.settings.safe_outputs;
    let policy = ChangePolicy {
        protected: so.protected_paths.clone(),
        max_files: so.max_change_files,
        max_bytes: so.max_change_bytes,
    };
    let refusals = checks::check(&capture.change, &policy);
    if !refusals.is_empty() {
        let reasons = refusals.iter().map(checks::Refusal::describe).collect();
        return ChangesOutcome::Refused { reasons, stats };
    }
    let terms = match threat.change(&capture, target).await {
        ChangeGate::Deliver(terms) => terms,
        ChangeGate::Refuse(reasons) => return ChangesOutcome::Refused { reasons, stats },
        ChangeGate::Hold { reasons, patch } => {
            return ChangesOutcome::Held {
                reasons,
                patch,
                stats,
            }
        }
    };
    let target = terms.target.as_ref().unwrap_or(target);
    if let Target::Patch { number, why } = target {
        return patch_outcome(&capture, *number, why, stats);
    }
    let (title, body) = texts(ctx, describe);
    let change = (target, &capture, stats);
    commit_and_open(ctx, gh, change, (&title, &body), (&terms, threat)).await
}

fn patch_outcome(capture: &Capture, number: u64, why: &str, stats: Stats) -> ChangesOutcome {
    match capture.patch() {
        Ok(patch) if patch.chars().count() <= MAX_PATCH_CHARS => ChangesOutcome::Patch {
            number,
            why: why.to_string(),
            patch: crate::redact::redact(&patch),
            stats,
        },
        Ok(patch) => ChangesOutcome::Refused {
            reasons: vec![format!(
                "the patch ({} characters) is too long to carry in a comment ({MAX_PATCH_CHARS}), and {why}",
                patch.chars().count()
            )],
            stats,
        },
        Err(e) => ChangesOutcome::Failed {
            why: crate::opencode::client::error_chain(&e),
            stats,
        },
    }
}

async fn commit_and_open(
    ctx: &Admitted,
    gh: &GitHub,
    (target, capture, stats): (&Target, &Capture, Stats),
    (title, body): (&str, &str),
    (terms, threat): (&Terms, &mut ThreatCheck<'_>),
) -> ChangesOutcome {
    let run_url = crate::github::response::run_url(&ctx.env).unwrap_or_default();
    let message = Message {
        headline: title.to_string(),
        body: body.to_string(),
        requester: ctx.plan.author.clone(),
        noreply_domain: crate::github::noreply_domain(&crate::github::server_url(&ctx.env)),
        run_url: run_url_without_attempt(&run_url),
    };
    let committed = match commit::commit(gh, target, &capture.change, &message).await {
        Ok(c) => c,
        Err(e) => {
            crate::runner::log::warning(&format!("the agent's change was not committed: {e}"));
            return ChangesOutcome::Failed {
                why: e.to_string(),
                stats,
            };
        }
    };
    let server = crate::github::server_url(&ctx.env);
    let pr_body = pull_body(ctx, body, terms.note.as_deref(), &run_url);
    let inputs = PullInputs {
        title,
        body: &pr_body,
        // A change that needs review is never opened ready to merge.
        draft: ctx.settings.safe_outputs.pr_draft || terms.review,
        repo_url: &format!("{server}/{}", ctx.repository),
    };
    let pull = commit::pull_request(gh, target, &committed.branch, &inputs).await;
    threat.after_pull(gh, terms, &pull).await;
    ChangesOutcome::Delivered {
        committed,
        pull,
        stats,
    }
}

/// Attempt 2 of a run names the same run: its commit is recognised by the run's own URL.
fn run_url_without_attempt(url: &str) -> String {
    match url.find("/attempts/") {
        Some(i) => url[..i].to_string(),
        None => url.to_string(),
    }
}

/// The commit headline and body: the agent's `describe_change` (redacted, the headline one line),
/// or a plain title from the thread.
fn texts(ctx: &Admitted, describe: &Described) -> (String, String) {
    // The thread's title (redacted, one line) names the change when the agent did not.
    let thread_title = ctx
        .event
        .target()
        .map(|t| one_line(&crate::redact::redact(&t.title)))
        .filter(|t| !t.is_empty());
    let plain = match (&ctx.plan.thread, thread_title) {
        (Some(t), Some(title)) => format!("{title} (#{})", t.number),
        (Some(t), None) => format!("Changes for {} #{} (fro-bot)", t.kind.as_str(), t.number),
        (None, _) => format!("Changes from fro-bot run {}", ctx.run_id),
    };
    match describe {
        Described::Titled { title, body } => {
            let title = crate::outbound::links(&one_line(&crate::redact::redact(title)));
            let title = if title.is_empty() { plain } else { title };
            let body = crate::outbound::prose(body, None);
            (title, body)
        }
        Described::Discarded | Described::Plain => (plain, String::new()),
    }
}

/// The pull request's body: the agent's description as `texts` made it (redacted, links and
/// mentions inert), the threat check's note, `Closes #N` for an issue thread, and a footer naming
/// the run.
fn pull_body(ctx: &Admitted, body: &str, note: Option<&str>, run_url: &str) -> String {
    let mut out = body.to_string();
    if let Some(note) = note {
        out.push_str(&format!("\n\n{note}"));
    }
    if let Some(t) = ctx
        .plan
        .thread
        .as_ref()
        .filter(|t| t.kind == TargetKind::Issue)
    {
        out.push_str(&format!("\n\nCloses #{}", t.number));
    }
    let who = ctx
        .plan
        .author
        .as_deref()
        .map(|a| format!(" for @{a}"))
        .unwrap_or_default();
    out.push_str(&format!(
        "\n\n---\nProposed by the agent and committed by fro-bot{who} in [this run]({run_url}) after its checks (protected paths, size limits, secrets, the threat check)."
    ));
    out.trim_start().to_string()
}

/// The first line of `text`, without control characters, at most the title limit.
fn one_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(proposals::MAX_TITLE_CHARS)
        .collect::<String>()
        .trim()
        .to_string()
}

impl DeliveryReport {
    /// What the answer says about delivery (`None`: nothing to say).
    pub(crate) fn answer_section(&self) -> Option<String> {
        let mut out = Vec::new();
        if let Some(c) = changes_text(&self.changes) {
            out.push(c);
        }
        out.extend(self.threat.answer.clone());
        if !self.actions.is_empty() {
            let lines: Vec<String> = self
                .actions
                .iter()
                .map(|a| format!("- {}", a.line()))
                .collect();
            out.push(format!("**Requested actions**\n{}", lines.join("\n")));
        }
        (!out.is_empty()).then(|| out.join("\n\n"))
    }

    /// Whether fro-bot carried out anything the agent proposed: its change committed (or its
    /// patch put in the answer), or an action done.
    pub(crate) fn delivered(&self) -> bool {
        matches!(
            self.changes,
            ChangesOutcome::Delivered { .. } | ChangesOutcome::Patch { .. }
        ) || self
            .actions
            .iter()
            .any(|a| matches!(a, ActionOutcome::Done { .. }))
    }

    /// The summary's "Changes" row (and one row for the actions).
    pub(crate) fn summary_rows(&self) -> Vec<(String, String)> {
        let changes = match &self.changes {
            ChangesOutcome::Off { why } => format!("off: {why}"),
            ChangesOutcome::None { why } => format!("none: {why}"),
            ChangesOutcome::Delivered {
                committed,
                pull,
                stats,
            } => format!(
                "delivered: {} on `{}` ({}){}",
                short(&committed.sha),
                committed.branch,
                stats.text(),
                match pull {
                    PullOutcome::Opened { number, .. } => format!(", opened #{number}"),
                    PullOutcome::Existing { number, .. } | PullOutcome::OnThread { number, .. } => {
                        format!(", on #{number}")
                    }
                    PullOutcome::NotPermitted { .. } =>
                        ", no pull request (Actions may not open one)".into(),
                    PullOutcome::Failed { why } => format!(", no pull request ({why})"),
                }
            ),
            ChangesOutcome::Patch { number, stats, .. } => {
                format!("patch in the answer for #{number} ({})", stats.text())
            }
            ChangesOutcome::Refused { reasons, stats } => {
                format!("refused ({}): {}", stats.text(), reasons.join("; "))
            }
            ChangesOutcome::Held { reasons, stats, .. } => {
                format!("held ({}): {}", stats.text(), reasons.join("; "))
            }
            ChangesOutcome::Failed { why, stats } => format!("failed ({}): {why}", stats.text()),
        };
        let mut rows = vec![("Changes".to_string(), changes)];
        rows.extend(
            self.threat
                .row
                .clone()
                .map(|r| ("Threat check".to_string(), r)),
        );
        if !self.actions.is_empty() {
            let lines: Vec<String> = self.actions.iter().map(ActionOutcome::line).collect();
            rows.push(("Requested actions".into(), lines.join("; ")));
        }
        for n in &self.notes {
            rows.push(("Proposals".into(), n.clone()));
        }
        rows
    }
}

fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or(sha)
}

/// The answer's paragraph on the change.
fn changes_text(c: &ChangesOutcome) -> Option<String> {
    Some(match c {
        ChangesOutcome::Off { .. } | ChangesOutcome::None { .. } => return None,
        ChangesOutcome::Delivered {
            committed,
            pull,
            stats,
        } => {
            let commit = match &committed.url {
                Some(url) => format!("[`{}`]({url})", short(&committed.sha)),
                None => format!("`{}`", short(&committed.sha)),
            };
            let verb = match committed.already {
                true => "was already committed by an earlier attempt of this run as",
                false => "committed as",
            };
            let pr = match pull {
                PullOutcome::Opened { url, number } => format!("Opened pull request [#{number}]({url})."),
                PullOutcome::Existing { url, number } => format!("Added to pull request [#{number}]({url})."),
                PullOutcome::OnThread { url, number } => format!("Pushed to this pull request ([#{number}]({url}))."),
                PullOutcome::NotPermitted { compare_url } => format!(
                    "This repository does not let GitHub Actions open pull requests: [open it here]({compare_url}), or allow it under Settings → Actions → General → Workflow permissions → \"Allow GitHub Actions to create and approve pull requests\"."
                ),
                PullOutcome::Failed { why } => format!("The pull request could not be opened: {why}"),
            };
            format!(
                "**Changes** ({}) {verb} {commit} on `{}`. {pr}",
                stats.text(),
                committed.branch
            )
        }
        ChangesOutcome::Patch { why, patch, stats, .. } => format!(
            "**Changes** ({}) are not pushed: {why}. Apply them with `git apply`:\n\n<details>\n<summary>patch</summary>\n\n````diff\n{}\n````\n\n</details>",
            stats.text(),
            patch.replace("````", "` ` ` `")
        ),
        ChangesOutcome::Refused { reasons, stats } => format!(
            "**Changes** ({}) were not delivered, and nothing was written to the repository:\n{}",
            stats.text(),
            reasons.iter().map(|r| format!("- {r}")).collect::<Vec<_>>().join("\n")
        ),
        ChangesOutcome::Held {
            reasons,
            patch,
            stats,
        } => crate::phases::delivery::threat_check::held_text(reasons, patch.as_deref(), &stats.text()),
        ChangesOutcome::Failed { why, stats } => format!(
            "**Changes** ({}) could not be delivered: {why}",
            stats.text()
        ),
    })
}
