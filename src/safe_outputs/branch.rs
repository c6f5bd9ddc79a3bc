//! Where a thread's change goes, decided before the turn (docs/design.md#safe-outputs): fro-bot's
//! own branch for the thread (`{branch-prefix}issue-N`, `pr-N`, `discussion-N`; `run-<id>` for a
//! run without a thread), a same-repository pull request's head branch, or — for a fork's pull
//! request — a patch in the answer. A later run on the thread finds its branch again and starts
//! the agent on it, so a follow-up adds a commit on top of the first.

use std::path::Path;

use super::git::{private_home, Git, GitError};
use crate::github::repo::PullRequest;
use crate::github::{api::ApiError, event::TargetKind, GitHub, RunPlan};

/// How many names a thread's branch may take (`issue-5`, `issue-5-2`, ... `issue-5-9`): a branch
/// whose pull request was merged or closed, or that fro-bot did not create, is passed over.
const NAME_TRIES: u32 = 9;

/// The commit trailer that marks fro-bot's commits; it names the run.
pub const RUN_TRAILER: &str = "Fro-Bot-Run:";

/// Where the change goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// fro-bot's branch for the thread. `head`: where it points now (`None`: to be created at
    /// `start` when there is something to commit). `pr_base`: the branch its pull request targets
    /// (`None`: the default branch).
    ThreadBranch {
        name: String,
        head: Option<String>,
        start: StartPoint,
        pr_base: Option<String>,
    },
    /// A same-repository pull request's head branch (`push-to-pr-branch`).
    PullBranch { pull: PullRequest },
    /// A pull request fro-bot may not push to: the change goes into the answer as a patch.
    Patch { number: u64, why: String },
}

impl Target {
    /// The branch and commit the agent should start on, when it is not the checkout as it is.
    pub fn start_on(&self) -> Option<(&str, &str)> {
        match self {
            Target::ThreadBranch {
                name,
                head: Some(h),
                ..
            } => Some((name, h)),
            Target::PullBranch { pull } => Some((&pull.head_ref, &pull.head_sha)),
            Target::ThreadBranch { head: None, .. } | Target::Patch { .. } => None,
        }
    }

    /// The branch a commit goes to (`None` for a patch).
    pub fn branch(&self) -> Option<&str> {
        match self {
            Target::ThreadBranch { name, .. } => Some(name),
            Target::PullBranch { pull } => Some(&pull.head_ref),
            Target::Patch { .. } => None,
        }
    }
}

/// Where a new thread branch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPoint {
    /// The default branch's head, read when the branch is created.
    DefaultBranch,
    /// This commit (a pull request's head).
    Commit(String),
}

/// What resolving the target needs.
pub struct TargetInputs<'a> {
    pub gh: &'a GitHub,
    pub plan: &'a RunPlan,
    pub prefix: &'a str,
    pub push_to_pr_branch: bool,
    pub run_id: &'a str,
    /// `owner/name` of this repository.
    pub repository: &'a str,
}

/// Where this run's change goes. For an issue or discussion this costs one request when the
/// thread has no branch yet (the default branch is read only when one is created).
pub async fn resolve(i: &TargetInputs<'_>) -> Result<Target, ApiError> {
    let thread = i.plan.thread.as_ref();
    let (stem, start, pr_base) = match thread {
        Some(t) if t.kind == TargetKind::PullRequest => {
            let pull = i.gh.pull_request(t.number).await?;
            let same_repo = pull
                .head_repo
                .as_deref()
                .is_some_and(|r| r.eq_ignore_ascii_case(i.repository));
            if !same_repo {
                return Ok(Target::Patch {
                    number: t.number,
                    why: "the pull request comes from a fork, which fro-bot never pushes to".into(),
                });
            }
            if i.push_to_pr_branch && requester_can_write(i).await {
                return Ok(Target::PullBranch { pull });
            }
            let start = StartPoint::Commit(pull.head_sha.clone());
            (format!("pr-{}", t.number), start, Some(pull.head_ref))
        }
        Some(t) => {
            let stem = match t.kind {
                TargetKind::Discussion => format!("discussion-{}", t.number),
                TargetKind::Issue | TargetKind::PullRequest => format!("issue-{}", t.number),
            };
            (stem, StartPoint::DefaultBranch, None)
        }
        None => (format!("run-{}", i.run_id), StartPoint::DefaultBranch, None),
    };
    thread_branch(i, &stem, &start, pr_base.as_deref()).await
}

/// fro-bot's own branch for pull request `pull` (`{prefix}pr-N` from its head, proposed into its
/// branch): where a change goes that must not land on the pull request's branch itself.
pub async fn own_branch_for_pull(
    i: &TargetInputs<'_>,
    pull: &PullRequest,
) -> Result<Target, ApiError> {
    let start = StartPoint::Commit(pull.head_sha.clone());
    let stem = format!("pr-{}", pull.number);
    thread_branch(i, &stem, &start, Some(&pull.head_ref)).await
}

/// Whether the requester may write to the repository (what pushing to their pull request's
/// branch needs).
async fn requester_can_write(i: &TargetInputs<'_>) -> bool {
    let Some(login) = i.plan.author.as_deref() else {
        return false;
    };
    match i.gh.permission(login).await {
        Ok(p) => matches!(p.as_str(), "admin" | "maintain" | "write"),
        Err(e) => {
            tracing::warn!("cannot read @{login}'s permission (not pushing to their branch): {e}");
            false
        }
    }
}

/// The first of `{prefix}{stem}`, `-2`, ... that is free or fro-bot's with an open (or no) pull
/// request.
async fn thread_branch(
    i: &TargetInputs<'_>,
    stem: &str,
    start: &StartPoint,
    pr_base: Option<&str>,
) -> Result<Target, ApiError> {
    for n in 1..=NAME_TRIES {
        let name = match n {
            1 => format!("{}{stem}", i.prefix),
            n => format!("{}{stem}-{n}", i.prefix),
        };
        let target = |head| Target::ThreadBranch {
            name: name.clone(),
            head,
            start: start.clone(),
            pr_base: pr_base.map(str::to_string),
        };
        let Some(head) = i.gh.branch_head(&name).await? else {
            return Ok(target(None));
        };
        if !is_ours(i.gh, &head).await? {
            tracing::info!("{name} was not made by fro-bot; passing it over");
            continue;
        }
        let pulls = i.gh.pulls_for_branch(&name).await?;
        match pulls.first() {
            Some(p) if !p.open => {
                tracing::info!(
                    "{name}: pull request #{} is closed; passing it over",
                    p.number
                )
            }
            Some(_) | None => return Ok(target(Some(head))),
        }
    }
    Err(ApiError::Transport {
        operation: "choose a branch",
        message: format!(
            "{}{stem} and its {} successors are all taken",
            i.prefix,
            NAME_TRIES - 1
        ),
    })
}

/// A branch is fro-bot's when its head commit carries the run trailer.
async fn is_ours(gh: &GitHub, head: &str) -> Result<bool, ApiError> {
    let message = gh.commit_message(head).await?;
    Ok(message.lines().any(|l| l.starts_with(RUN_TRAILER)))
}

/// Fetches `branch` at `sha` from the repository and checks it out in the workspace, before the
/// turn, as the workspace's owner (so the files stay the agent's to edit). The token goes to this
/// one git command in its environment (never a file, never its command line).
pub fn check_out(
    workspace: &Path,
    remote: &str,
    token: &str,
    branch: &str,
    sha: &str,
) -> Result<(), GitError> {
    use base64::Engine;
    let scratch = tempfile::tempdir().map_err(|source| spawn_err("tempdir", source))?;
    let home = private_home(scratch.path()).map_err(|source| spawn_err("home", source))?;
    let owner = workspace_owner(workspace);
    if let Some((uid, gid)) = owner {
        for dir in [scratch.path(), home.as_path()] {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|source| spawn_err("chown", source))?;
        }
    }
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
    let refspec = format!("+refs/heads/{branch}:refs/remotes/fro-bot/{branch}");
    Git::new(workspace, &home)
        .as_owner(owner)
        .with_network()
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "http.extraHeader")
        .env(
            "GIT_CONFIG_VALUE_0",
            format!("AUTHORIZATION: basic {basic}"),
        )
        .args([
            "fetch",
            "-q",
            "--no-tags",
            "--no-recurse-submodules",
            remote,
            &refspec,
        ])
        .output()?;
    Git::new(workspace, &home)
        .as_owner(owner)
        .args(["checkout", "-q", "-B", branch, sha])
        .output()?;
    Ok(())
}

fn spawn_err(what: &str, source: std::io::Error) -> GitError {
    GitError::Spawn {
        args: what.to_string(),
        source,
    }
}

/// The workspace's owner, when fro-bot is root and it is someone else.
fn workspace_owner(workspace: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let m = std::fs::metadata(workspace).ok()?;
    (m.uid() != 0).then_some((m.uid(), m.gid()))
}
