//! Before the turn (docs/design.md#safe-outputs): where the agent's proposals will go. Chooses the
//! thread's branch (and starts the agent on it when an earlier run made it), records the commit the
//! change will be taken against, fetches the labels the agent may use, and makes the directory its
//! proposal tools write to.

use crate::config::safe_outputs::ChangesMode;
use crate::opencode::config::ProposalTools;
use crate::phases::delivery::pr_review::ReviewPrep;
use crate::phases::run_context::{Admitted, Mode};
use crate::runner::log;
use crate::safe_outputs::branch::{self, Target, TargetInputs};
use crate::safe_outputs::capture::{self, Base};
use crate::safe_outputs::proposals::{OutputPolicy, ProposalsDir};

/// What the run will do with the agent's file changes.
#[derive(Debug)]
pub(crate) enum ChangesPlan {
    /// Nothing is delivered: `why` (the answer and summary say it when the agent changed files).
    Off {
        why: String,
    },
    Deliver {
        target: Target,
        base: Base,
    },
}

/// What the turn proposes into, and what delivery reads after it.
pub(crate) struct OutputsPlan {
    pub(crate) changes: ChangesPlan,
    pub(crate) policy: OutputPolicy,
    /// Kept alive for the turn: the tools read them.
    policy_file: Option<tempfile::NamedTempFile>,
    proposals: Option<ProposalsDir>,
    /// The pull request the turn may review (`phases::delivery::pr_review`).
    pub(crate) review: ReviewPrep,
}

impl OutputsPlan {
    /// The proposal tools' paths, for OpenCode's config.
    pub(crate) fn tools(&self) -> Option<ProposalTools> {
        Some(ProposalTools {
            file: self.proposals.as_ref()?.file(),
            policy: self.policy_file.as_ref().map(|f| f.path().to_path_buf()),
            review_view: self.review.view_file(),
        })
    }

    /// Whether the agent's file changes will be delivered.
    pub(crate) fn delivers_changes(&self) -> bool {
        matches!(self.changes, ChangesPlan::Deliver { .. })
    }

    /// The proposals file (`None`: there were no tools).
    pub(crate) fn proposals_file(&self) -> Option<std::path::PathBuf> {
        self.proposals.as_ref().map(ProposalsDir::file)
    }

    /// A plan that delivers nothing and offers no tools.
    pub(crate) fn none(why: &str) -> OutputsPlan {
        OutputsPlan {
            changes: ChangesPlan::Off { why: why.into() },
            policy: OutputPolicy::default(),
            policy_file: None,
            proposals: None,
            review: ReviewPrep::NotOffered,
        }
    }
}

/// Prepares the run's outputs. Nothing here fails the run: what cannot be prepared is delivered
/// as `off`, with the reason.
pub(crate) async fn prepare(ctx: &Admitted) -> OutputsPlan {
    let Some(gh) = ctx.gh.clone() else {
        return OutputsPlan::none("there is no GitHub token to deliver with");
    };
    if let Mode::Local { .. } = ctx.mode {
        return OutputsPlan::none("a local run leaves changes in the work tree");
    }
    let so = ctx.settings.safe_outputs.clone();
    let labels = async {
        match &so.allowed_labels {
            Some(l) => Some(l.clone()),
            None => match gh.labels().await {
                Ok(l) => Some(l),
                Err(e) => {
                    log::warning(&format!(
                        "cannot list the repository's labels (the agent may use none): {e}"
                    ));
                    Some(Vec::new())
                }
            },
        }
    };
    let changes = async {
        match so.changes {
            ChangesMode::Off => ChangesPlan::Off {
                why: "`changes: off`".into(),
            },
            ChangesMode::PullRequest => plan_changes(ctx, &gh).await,
        }
    };
    // None waits for another's round trips to GitHub.
    let (labels, changes, review) = tokio::join!(
        labels,
        changes,
        crate::phases::delivery::pr_review::prepare(ctx, &gh)
    );
    let policy = OutputPolicy {
        changes: matches!(changes, ChangesPlan::Deliver { .. }),
        labels,
        max_comments: so.max_comments,
        max_issues: so.max_issues,
        review: review.policy(),
    };
    let policy_file = policy
        .write_file()
        .map_err(|e| tracing::warn!("cannot write the output policy for the agent's tools: {e}"))
        .ok();
    let owner = agent_owner(&ctx.workspace);
    let proposals = match ProposalsDir::create(owner) {
        Ok(d) => Some(d),
        Err(e) => {
            log::warning(&format!(
                "the agent gets no proposal tools: cannot make their directory: {e}"
            ));
            None
        }
    };
    OutputsPlan {
        changes,
        policy,
        policy_file,
        proposals,
        review,
    }
}

/// The target branch, the agent started on it, and the base recorded.
async fn plan_changes(ctx: &Admitted, gh: &crate::github::GitHub) -> ChangesPlan {
    let so = &ctx.settings.safe_outputs;
    let inputs = TargetInputs {
        gh,
        plan: &ctx.plan,
        prefix: &so.branch_prefix,
        push_to_pr_branch: so.push_to_pr_branch,
        run_id: &ctx.run_id,
        repository: &ctx.repository,
    };
    let target = match branch::resolve(&inputs).await {
        Ok(t) => t,
        Err(e) => {
            log::warning(&format!(
                "changes will not be delivered: cannot choose a branch: {e}"
            ));
            return ChangesPlan::Off {
                why: format!("fro-bot could not choose a branch ({e})"),
            };
        }
    };
    if let Some((name, sha)) = target.start_on() {
        if let Err(why) = start_on(ctx, name, sha) {
            return ChangesPlan::Off { why };
        }
    }
    match capture::record_base(&ctx.workspace) {
        Ok(base) => ChangesPlan::Deliver { target, base },
        Err(e) => ChangesPlan::Off {
            why: format!("the workspace's commit could not be read ({e})"),
        },
    }
}

/// Checks out the branch the agent continues on.
fn start_on(ctx: &Admitted, name: &str, sha: &str) -> Result<(), String> {
    let token = ctx.settings.github_token.as_ref().ok_or("no token")?;
    let server = crate::github::server_url(&ctx.env);
    let remote = format!("{server}/{}.git", ctx.repository);
    match branch::check_out(&ctx.workspace, &remote, token.expose(), name, sha) {
        Ok(()) => {
            tracing::info!("the agent starts on {name} ({sha})");
            Ok(())
        }
        Err(e) => {
            log::warning(&format!(
                "changes will not be delivered: cannot check out {name}: {e}"
            ));
            Err(format!("fro-bot could not check out `{name}` ({e})"))
        }
    }
}

/// Who gets the proposals directory: the workspace's owner when fro-bot is root (the agent's uid;
/// a root-owned workspace's agent gets a dedicated uid, which `AgentUser` chooses the same way).
fn agent_owner(workspace: &std::path::Path) -> Option<(u32, u32)> {
    match crate::confine::AgentUser::choose(workspace) {
        crate::confine::AgentUser::Switched { uid, gid, .. } => Some((uid, gid)),
        crate::confine::AgentUser::Current { .. } => None,
    }
}
