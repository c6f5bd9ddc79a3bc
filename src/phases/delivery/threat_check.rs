//! The threat check's orchestration, between the checks and the delivery
//! (docs/security.md#the-threat-check): the deterministic gate over the change (`threat::gate`),
//! then one model check of what would be delivered — the change and the actions the agent proposes
//! (`threat::model_check`) — and what both make of the delivery under `threat-check`. Delivery
//! (`phases::delivery::change`) asks it about the change, then about the actions; the model is
//! asked at most once a run, and only when there is something to deliver.

use crate::config::safe_outputs::ThreatMode;
use crate::confine::key_proxy::KeyProxyPlan;
use crate::github::GitHub;
use crate::opencode::client::error_chain;
use crate::phases::run_context::Admitted;
use crate::phases::turn::agent::AgentRun;
use crate::safe_outputs::actions::{self, ActionOutcome};
use crate::safe_outputs::branch::{self, Target, TargetInputs};
use crate::safe_outputs::capture::Capture;
use crate::safe_outputs::deliver::PullOutcome;
use crate::safe_outputs::proposals::Proposal;
use crate::threat::gate::{self, GatePolicy, GateReport};
use crate::threat::judge;
use crate::threat::model_check::{self, Asking, JudgeResult, JudgeRun};
use crate::threat::provider::Usage;
use crate::threat::REVIEW_LABEL;

/// The most of a held change's patch the answer carries.
const MAX_HELD_PATCH_CHARS: usize = 50_000;

/// What the check makes of the change.
#[derive(Debug)]
pub(crate) enum ChangeGate {
    Deliver(Terms),
    /// Refused by the gate: the reasons.
    Refuse(Vec<String>),
    /// Held by the model check: the reasons, and the patch the answer carries.
    Hold {
        reasons: Vec<String>,
        patch: Option<String>,
    },
}

/// How a change that is delivered goes out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Terms {
    /// "Needs review": a draft pull request labelled [`REVIEW_LABEL`].
    pub(crate) review: bool,
    /// What the pull request's body says of the threat check (findings, warnings).
    pub(crate) note: Option<String>,
    /// Where it goes instead of the planned target: a needs-review change never lands on a pull
    /// request's own branch, it is proposed into it from fro-bot's.
    pub(crate) target: Option<Target>,
}

/// The threat check of one delivery.
pub(crate) struct ThreatCheck<'a> {
    ctx: &'a Admitted,
    agent_run: &'a AgentRun,
    proposals: &'a [Proposal],
    mode: ThreatMode,
    gate: Option<GateReport>,
    judged: Option<JudgeRun>,
    /// The change was let through as "needs review".
    delivered_for_review: bool,
    /// What delivery should still know (a label that could not be added...).
    notes: Vec<String>,
}

/// What the check did, for the summary, the answer and the outputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ThreatReport {
    /// The "Threat check" row; `None`: it had nothing to check.
    pub(crate) row: Option<String>,
    /// The answer's paragraph (needs review, warnings, allowed binaries).
    pub(crate) answer: Option<String>,
    /// The model check's tokens and cost, to add to the run's.
    pub(crate) usage: Option<(Usage, f64)>,
}

/// Whether a proposal posts the agent's text (what brings in the model check without a change).
fn is_text_action(p: &Proposal) -> bool {
    match p {
        Proposal::Comment { .. }
        | Proposal::CreateIssue { .. }
        | Proposal::ReviewComment { .. }
        | Proposal::SubmitReview { .. }
        | Proposal::ReplyToThread { .. } => true,
        Proposal::DescribeChange { .. }
        | Proposal::DiscardChanges { .. }
        | Proposal::AddLabels { .. }
        | Proposal::RemoveLabels { .. }
        | Proposal::ResolveThread { .. } => false,
    }
}

/// Whether a proposal is an action (carried out after the change), not about the change. The
/// review's are the review phase's, which asks `held`.
fn is_action(p: &Proposal) -> bool {
    match p {
        Proposal::DescribeChange { .. }
        | Proposal::DiscardChanges { .. }
        | Proposal::ReviewComment { .. }
        | Proposal::SubmitReview { .. }
        | Proposal::ReplyToThread { .. }
        | Proposal::ResolveThread { .. } => false,
        Proposal::Comment { .. }
        | Proposal::CreateIssue { .. }
        | Proposal::AddLabels { .. }
        | Proposal::RemoveLabels { .. } => true,
    }
}

impl<'a> ThreatCheck<'a> {
    pub(crate) fn new(
        ctx: &'a Admitted,
        agent_run: &'a AgentRun,
        proposals: &'a [Proposal],
    ) -> Self {
        ThreatCheck {
            ctx,
            agent_run,
            proposals,
            mode: ctx.settings.safe_outputs.threat_check,
            gate: None,
            judged: None,
            delivered_for_review: false,
            notes: Vec::new(),
        }
    }

    /// The gate, then the model check, over a change that passed the checks.
    pub(crate) async fn change(&mut self, capture: &Capture, target: &Target) -> ChangeGate {
        let policy = GatePolicy {
            allowed_binary: self.ctx.settings.safe_outputs.allowed_binary_paths.clone(),
        };
        let report = gate::check(&capture.change, &policy);
        let refused = report.refused.lines();
        let review = report.review.lines();
        self.gate = Some(report);
        if !refused.is_empty() {
            return ChangeGate::Refuse(refused);
        }
        if !review.is_empty() && self.mode == ThreatMode::Strict {
            let strict =
                |r: String| format!("{r} (needs review: refused under `threat-check: strict`)");
            return ChangeGate::Refuse(review.into_iter().map(strict).collect());
        }
        match capture.review_diff() {
            Ok(diff) => self.judge(Some(&diff)).await,
            Err(e) => {
                let why = format!("the change's diff could not be read: {}", error_chain(&e));
                self.judged = Some(JudgeRun::failed(None, why));
            }
        }
        if let Some(reasons) = self.blocking() {
            return ChangeGate::Hold {
                reasons,
                patch: held_patch(capture),
            };
        }
        match self.terms(target, &review).await {
            Ok(terms) => {
                self.delivered_for_review = terms.review;
                ChangeGate::Deliver(terms)
            }
            Err(why) => ChangeGate::Refuse(vec![why]),
        }
    }

    /// Whether the actions may be carried out: `Some(outcomes)` when they are held. The model is
    /// asked now if the change did not already take it there and any action posts text.
    pub(crate) async fn actions(&mut self) -> Option<Vec<ActionOutcome>> {
        if self.judged.is_none() && !self.proposals.iter().any(is_text_action) {
            return None;
        }
        self.judge(None).await;
        let why = format!("held by the threat check: {}", self.blocking()?.join("; "));
        Some(
            self.proposals
                .iter()
                .filter(|p| is_action(p))
                .map(|p| ActionOutcome::Refused {
                    what: actions::describe(p),
                    why: why.clone(),
                })
                .collect(),
        )
    }

    /// Why the actions (and the review) are held, once `actions` has asked.
    pub(crate) fn held(&self) -> Option<String> {
        self.blocking()
            .map(|why| format!("held by the threat check: {}", why.join("; ")))
    }

    /// A needs-review pull request gets its label (GitHub creates a label it does not have), and
    /// one opened by an earlier run — whose body this run does not write, and which someone may
    /// have marked ready since — is made a draft again and gets a comment with the findings.
    pub(crate) async fn after_pull(&mut self, gh: &GitHub, terms: &Terms, pull: &PullOutcome) {
        let number = match pull {
            PullOutcome::Opened { number, .. } | PullOutcome::Existing { number, .. } => *number,
            PullOutcome::OnThread { .. }
            | PullOutcome::NotPermitted { .. }
            | PullOutcome::Failed { .. } => return,
        };
        if terms.review {
            if let Err(e) = gh.add_labels(number, &[REVIEW_LABEL.to_string()]).await {
                self.notes.push(format!(
                    "the label `{REVIEW_LABEL}` could not be added to #{number}: {e}"
                ));
            }
        }
        if let (PullOutcome::Existing { .. }, true) = (pull, terms.review) {
            if let Err(e) = gh.convert_to_draft(number).await {
                self.notes.push(format!(
                    "#{number} could not be made a draft again for review: {e}"
                ));
            }
        }
        if let (PullOutcome::Existing { .. }, Some(note)) = (pull, &terms.note) {
            if let Err(e) = gh.comment_on_issue(number, &actions::safe_body(note)).await {
                self.notes.push(format!(
                    "the threat check's note could not be posted on #{number}: {e}"
                ));
            }
        }
    }

    /// The model check, once a run, unless it is off; `diff`: the change's, when there is one.
    async fn judge(&mut self, diff: Option<&str>) {
        if self.mode == ThreatMode::Off || self.judged.is_some() {
            return;
        }
        let actions = judge::actions_text(self.proposals);
        let settings = &self.ctx.settings;
        let asking = Asking {
            model: judge_model(self.ctx, self.agent_run),
            listing: self.agent_run.providers.as_ref(),
            keys: KeyProxyPlan::new(
                &settings.auth,
                settings.opencode_config.as_ref(),
                &self.ctx.env,
            ),
            repository: &self.ctx.repository,
            cancel: &self.ctx.cancel,
            spend: Some(self.ctx.spend.clone()),
        };
        let judged = model_check::ask(&asking, diff.unwrap_or(""), &actions).await;
        self.judged = Some(judged);
    }

    fn blocking(&self) -> Option<Vec<String>> {
        stops(self.mode, self.judged.as_ref())
    }

    /// What the model check found that `threat-check: warn` let through.
    fn warning(&self) -> Option<String> {
        let concerns = match self.mode {
            ThreatMode::Warn => self.judged.as_ref()?.concerns()?,
            ThreatMode::Block | ThreatMode::Strict | ThreatMode::Off => return None,
        };
        Some(format!(
            "**Threat check warning** (`threat-check: warn` delivers it anyway):\n{}",
            bullets(&concerns)
        ))
    }

    /// The needs-review findings and any `warn` warning, and where a needs-review change goes.
    async fn terms(&self, target: &Target, review: &[String]) -> Result<Terms, String> {
        let mut note = Vec::new();
        if !review.is_empty() {
            note.push(format!(
                "**Needs review**: fro-bot's threat check found what a person must look at before this is merged or installed, so this pull request is a draft labelled `{REVIEW_LABEL}`:\n{}",
                bullets(review)
            ));
        }
        if let Some(w) = self.warning() {
            note.push(w);
        }
        let target = match (target, review.is_empty()) {
            (Target::PullBranch { pull }, false) => Some(self.own_branch(pull).await?),
            _ => None,
        };
        Ok(Terms {
            review: !review.is_empty(),
            note: (!note.is_empty()).then(|| note.join("\n\n")),
            target,
        })
    }

    async fn own_branch(&self, pull: &crate::github::repo::PullRequest) -> Result<Target, String> {
        let gh = self
            .ctx
            .gh
            .as_ref()
            .ok_or("there is no GitHub token to choose a branch with")?;
        let so = &self.ctx.settings.safe_outputs;
        let inputs = TargetInputs {
            gh,
            plan: &self.ctx.plan,
            prefix: &so.branch_prefix,
            push_to_pr_branch: false,
            run_id: &self.ctx.run_id,
            repository: &self.ctx.repository,
        };
        branch::own_branch_for_pull(&inputs, pull)
            .await
            .map_err(|e| {
                format!(
                    "it needs review, and no branch of fro-bot's own could be chosen for it: {e}"
                )
            })
    }

    /// The "Threat check" row, the answer's paragraph and the model's usage; what delivery should
    /// still say goes to `notes`.
    pub(crate) fn report(&self, notes: &mut Vec<String>) -> ThreatReport {
        notes.extend(self.notes.iter().cloned());
        if self.gate.is_none() && self.judged.is_none() {
            return ThreatReport::default();
        }
        let mut row = vec![format!("`{}`", self.mode.as_str())];
        let mut answer = Vec::new();
        if let Some(g) = &self.gate {
            row.push(gate_text(g));
            if self.delivered_for_review {
                answer.push(format!(
                    "**Needs review**: fro-bot's threat check found what a person must look at before this change is merged or installed (a pull request fro-bot opens for it or adds it to is a draft labelled `{REVIEW_LABEL}`):\n{}",
                    bullets(&g.review.lines())
                ));
            }
            if !g.allowed_binaries.is_empty() {
                let list: Vec<String> = g
                    .allowed_binaries
                    .iter()
                    .map(|p| crate::safe_outputs::checks::code(p))
                    .collect();
                answer.push(format!(
                    "Binary files carried as `allowed-binary-paths` lists them: {}.",
                    list.join(", ")
                ));
            }
        }
        row.push(match (&self.judged, self.mode) {
            (_, ThreatMode::Off) => "model check off".into(),
            (None, _) => "model check not run (nothing it would deliver)".into(),
            (Some(j), _) => judge_text(j),
        });
        answer.extend(self.warning());
        ThreatReport {
            row: Some(row.join("; ")),
            answer: (!answer.is_empty()).then(|| answer.join("\n\n")),
            usage: self
                .judged
                .as_ref()
                .filter(|j| j.requests > 0)
                .map(|j| (j.usage, j.cost.unwrap_or(0.0))),
        }
    }
}

/// What the model check's result stops under `mode` (under `warn` nothing is: it warns).
fn stops(mode: ThreatMode, judged: Option<&JudgeRun>) -> Option<Vec<String>> {
    let concerns = judged?.concerns()?;
    match mode {
        ThreatMode::Block | ThreatMode::Strict => Some(concerns),
        ThreatMode::Warn | ThreatMode::Off => None,
    }
}

fn bullets(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| format!("- {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn gate_text(g: &GateReport) -> String {
    let mut parts = vec![format!("gate read {} file(s)", g.files)];
    if !g.refused.is_empty() {
        parts.push(format!("{} refusing finding(s)", g.refused.total));
    }
    if !g.review.is_empty() {
        parts.push(format!("{} needs-review finding(s)", g.review.total));
    }
    if g.refused.is_empty() && g.review.is_empty() {
        parts.push("nothing found".into());
    }
    parts.join(", ")
}

fn judge_text(j: &JudgeRun) -> String {
    let verdict = match &j.result {
        JudgeResult::Clear => "clear".to_string(),
        JudgeResult::Flagged(v) => format!("flagged ({})", v.flags().join(", ")),
        JudgeResult::Unreadable => "no readable verdict (counts as flagged)".into(),
        JudgeResult::Failed(why) => format!("could not run: {why}"),
    };
    let cost = match j.cost {
        Some(c) => format!("${c:.4}"),
        None => "cost unknown".into(),
    };
    format!(
        "model check ({}, {} request(s), {} in, {} out / {cost}): {verdict}",
        j.model.as_deref().unwrap_or("no model"),
        j.requests,
        j.usage.input,
        j.usage.output
    )
}

/// The answer's paragraph on a held change: the reasons, and the patch collapsed in a fence
/// nothing in it can close.
pub(crate) fn held_text(reasons: &[String], patch: Option<&str>, stats: &str) -> String {
    let list: Vec<String> = reasons.iter().map(|r| format!("- {r}")).collect();
    let patch = match patch {
        Some(p) => format!(
            "\n\n<details>\n<summary>the held patch</summary>\n\n{}\n\n</details>",
            judge::fence(p, "diff")
        ),
        None => "\n\nThe patch is too long to carry here.".into(),
    };
    format!(
        "**Changes** ({stats}) were held by the threat check and not delivered; nothing was written to the repository:\n{}{patch}",
        list.join("\n")
    )
}

/// The change's patch for the answer of a held change (redacted), when it is short enough.
fn held_patch(capture: &Capture) -> Option<String> {
    let patch = capture.patch().ok()?;
    (patch.chars().count() <= MAX_HELD_PATCH_CHARS).then(|| crate::redact::redact(&patch))
}

/// The model that answered the turn (else the configured one), as `provider/model`.
fn judge_model(ctx: &Admitted, agent_run: &AgentRun) -> Option<String> {
    agent_run
        .model
        .clone()
        .or_else(|| {
            ctx.settings
                .model
                .as_ref()
                .map(|m| format!("{}/{}", m.provider, m.model))
        })
        .or_else(|| {
            let config = ctx.settings.opencode_config.as_ref()?;
            config.get("model")?.as_str().map(str::to_string)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threat::judge::Verdict;

    fn run(result: JudgeResult) -> JudgeRun {
        JudgeRun {
            result,
            ..JudgeRun::failed(Some("p/m".into()), "")
        }
    }

    #[test]
    fn block_and_strict_hold_what_is_flagged_unreadable_or_failed_and_warn_lets_it_through() {
        let flagged = Verdict {
            prompt_injection: false,
            secret_leak: true,
            malicious_patch: false,
            reasons: vec!["a.sh line 2 posts the environment".into()],
        };
        let cases = [
            JudgeResult::Flagged(flagged),
            JudgeResult::Unreadable,
            JudgeResult::Failed("the provider answered 502: bad gateway".into()),
        ];
        for result in cases {
            let j = run(result.clone());
            for mode in [ThreatMode::Block, ThreatMode::Strict] {
                let held = stops(mode, Some(&j)).unwrap_or_else(|| panic!("{result:?}"));
                assert!(!held.is_empty());
            }
            assert_eq!(stops(ThreatMode::Warn, Some(&j)), None, "{result:?}");
        }
        assert_eq!(
            stops(ThreatMode::Block, Some(&run(JudgeResult::Clear))),
            None
        );
        assert_eq!(
            stops(ThreatMode::Block, None),
            None,
            "not asked: nothing to hold"
        );
        let failed = run(JudgeResult::Failed("x".into())).concerns().unwrap();
        assert_eq!(failed, ["the model check could not run: x"]);
        let flagged = run(JudgeResult::Flagged(Verdict {
            prompt_injection: true,
            secret_leak: false,
            malicious_patch: true,
            reasons: vec!["`x` @y".into()],
        }));
        assert_eq!(
            flagged.concerns().unwrap(),
            [
                "the model check flagged it: prompt injection, malicious patch",
                "`?x? @y`"
            ]
        );
    }

    #[test]
    fn the_summary_names_the_model_its_requests_tokens_cost_and_verdict() {
        let mut j = run(JudgeResult::Clear);
        j.requests = 2;
        j.usage = Usage {
            input: 300,
            output: 20,
        };
        j.cost = None;
        assert_eq!(
            judge_text(&j),
            "model check (p/m, 2 request(s), 300 in, 20 out / cost unknown): clear"
        );
    }
}
