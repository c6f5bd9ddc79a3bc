//! Carrying a checked change out (docs/design.md#safe-outputs): one signed commit through
//! `createCommitOnBranch` with `expectedHeadOid` — never a push, never a force, never a commit to a
//! branch fro-bot did not choose — then the thread's one pull request.

use super::branch::{StartPoint, Target, RUN_TRAILER};
use super::capture::ChangeSet;
use crate::github::repo::{CommitResult, FileOp, PullResult};
use crate::github::{api::ApiError, GitHub};

/// What the commit says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub headline: String,
    pub body: String,
    /// `Co-authored-by:` the requester, when known.
    pub requester: Option<String>,
    /// Where the requester's no-reply address is (`github::noreply_domain`).
    pub noreply_domain: String,
    /// `Fro-Bot-Run:` — also how a re-run recognizes its own commit.
    pub run_url: String,
}

impl Message {
    fn full_body(&self) -> String {
        let mut body = self.body.trim().to_string();
        if !body.is_empty() {
            body.push_str("\n\n");
        }
        if let Some(login) = &self.requester {
            body.push_str(&format!(
                "Co-authored-by: {login} <{login}@{}>\n",
                self.noreply_domain
            ));
        }
        body.push_str(&format!("{RUN_TRAILER} {}", self.run_url));
        body
    }
}

/// The pull request side of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullOutcome {
    /// Opened by this run.
    Opened {
        number: u64,
        url: String,
    },
    /// The branch's pull request, opened by an earlier run.
    Existing {
        number: u64,
        url: String,
    },
    /// The commit went onto the thread's own pull request.
    OnThread {
        number: u64,
        url: String,
    },
    /// The repository does not let Actions open pull requests.
    NotPermitted {
        compare_url: String,
    },
    Failed {
        why: String,
    },
}

/// A commit that landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub branch: String,
    pub sha: String,
    pub url: Option<String>,
    /// An earlier attempt of this run had committed it already: nothing was committed again.
    pub already: bool,
}

/// Why a commit did not land.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("GitHub refused the commit: {source}")]
    Api {
        #[source]
        source: ApiError,
    },
    #[error("the branch {branch} moved while fro-bot committed, and the new commits touch the same files ({files})")]
    Conflict { branch: String, files: String },
    #[error("the branch {branch} moved twice while fro-bot committed")]
    Raced { branch: String },
}

impl From<ApiError> for CommitError {
    fn from(source: ApiError) -> Self {
        CommitError::Api { source }
    }
}

/// Commits `change` to the target's branch (creating fro-bot's thread branch first).
pub async fn commit(
    gh: &GitHub,
    target: &Target,
    change: &ChangeSet,
    message: &Message,
) -> Result<Committed, CommitError> {
    let branch = target.branch().unwrap_or_default().to_string();
    let mut head = match target {
        Target::ThreadBranch {
            head: None, start, ..
        } => {
            let start = match start {
                StartPoint::Commit(sha) => sha.clone(),
                StartPoint::DefaultBranch => {
                    let default = gh.default_branch().await?;
                    current_head(gh, &default).await?
                }
            };
            if !gh.create_branch(&branch, &start).await? {
                tracing::info!("{branch} appeared meanwhile; committing on top of it");
            }
            current_head(gh, &branch).await?
        }
        Target::ThreadBranch { .. } | Target::PullBranch { .. } | Target::Patch { .. } => {
            current_head(gh, &branch).await?
        }
    };
    // The whole trailer line: run 300's must not match run 3000's.
    let ours = trailer(message);
    if gh
        .commit_message(&head)
        .await?
        .lines()
        .any(|l| l.trim() == ours)
    {
        return Ok(Committed {
            branch,
            sha: head,
            url: None,
            already: true,
        });
    }
    let files = file_ops(change);
    let full_body = message.full_body();
    for attempt in 0..2 {
        if head != change.base {
            ensure_disjoint(gh, &branch, &change.base, &head, change).await?;
        }
        let msg = (message.headline.as_str(), full_body.as_str());
        match gh
            .create_commit_on_branch(&branch, &head, msg, &files)
            .await?
        {
            CommitResult::Created { oid, url } => {
                return Ok(Committed {
                    branch,
                    sha: oid,
                    url,
                    already: false,
                })
            }
            CommitResult::HeadMoved if attempt == 0 => {
                tracing::info!("{branch} moved while committing; reading it again");
                head = current_head(gh, &branch).await?;
            }
            CommitResult::HeadMoved => break,
        }
    }
    Err(CommitError::Raced { branch })
}

fn trailer(message: &Message) -> String {
    format!("{RUN_TRAILER} {}", message.run_url)
}

async fn current_head(gh: &GitHub, branch: &str) -> Result<String, CommitError> {
    gh.branch_head(branch)
        .await?
        .ok_or_else(|| CommitError::Api {
            source: ApiError::Transport {
                operation: "get branch",
                message: format!("the branch {branch} does not exist"),
            },
        })
}

/// The branch is at `head`, not where the agent started (`base`): committing the agent's files on
/// top is safe only when nothing since `base` touched the same paths.
async fn ensure_disjoint(
    gh: &GitHub,
    branch: &str,
    base: &str,
    head: &str,
    change: &ChangeSet,
) -> Result<(), CommitError> {
    let (_, changed) = gh.compare(base, head).await?;
    let ours: std::collections::HashSet<String> =
        change.files.iter().map(|f| f.path_lossy()).collect();
    let both: Vec<String> = changed.into_iter().filter(|p| ours.contains(p)).collect();
    if both.is_empty() {
        return Ok(());
    }
    Err(CommitError::Conflict {
        branch: branch.to_string(),
        files: both.join(", "),
    })
}

fn file_ops(change: &ChangeSet) -> Vec<FileOp<'_>> {
    change
        .files
        .iter()
        .filter_map(|f| {
            // The checks refused every non-UTF-8 path before a commit is attempted.
            let path = std::str::from_utf8(&f.path).ok()?;
            Some(match &f.new {
                Some(_) => FileOp::Put {
                    path,
                    contents: &f.content,
                },
                None => FileOp::Delete { path },
            })
        })
        .collect()
}

/// What a pull request needs besides the branch.
pub struct PullInputs<'a> {
    pub title: &'a str,
    pub body: &'a str,
    pub draft: bool,
    /// `{GITHUB_SERVER_URL}/owner/name`, for the compare link.
    pub repo_url: &'a str,
}

/// The branch's one pull request: the existing open one, or a new one.
pub async fn pull_request(
    gh: &GitHub,
    target: &Target,
    branch: &str,
    p: &PullInputs<'_>,
) -> PullOutcome {
    let base = match target {
        Target::PullBranch { pull } => {
            return PullOutcome::OnThread {
                number: pull.number,
                url: pull.url.clone(),
            }
        }
        Target::ThreadBranch {
            pr_base: Some(base),
            ..
        } => base.clone(),
        Target::ThreadBranch { pr_base: None, .. } => match gh.default_branch().await {
            Ok(b) => b,
            Err(e) => return PullOutcome::Failed { why: e.to_string() },
        },
        Target::Patch { .. } => {
            return PullOutcome::Failed {
                why: "a patch has no pull request".into(),
            }
        }
    };
    match gh.pulls_for_branch(branch).await {
        Ok(pulls) => {
            if let Some(open) = pulls.into_iter().find(|p| p.open) {
                return PullOutcome::Existing {
                    number: open.number,
                    url: open.url,
                };
            }
        }
        Err(e) => return PullOutcome::Failed { why: e.to_string() },
    }
    match gh
        .create_pull(p.title, p.body, branch, &base, p.draft)
        .await
    {
        Ok(PullResult::Opened(pull)) => PullOutcome::Opened {
            number: pull.number,
            url: pull.url,
        },
        Ok(PullResult::NotPermitted) => PullOutcome::NotPermitted {
            compare_url: format!("{}/compare/{base}...{branch}?expand=1", p.repo_url),
        },
        Err(e) => PullOutcome::Failed { why: e.to_string() },
    }
}

impl PullOutcome {
    /// The pull request's URL, when there is one.
    pub fn url(&self) -> Option<&str> {
        match self {
            PullOutcome::Opened { url, .. }
            | PullOutcome::Existing { url, .. }
            | PullOutcome::OnThread { url, .. } => Some(url),
            PullOutcome::NotPermitted { .. } | PullOutcome::Failed { .. } => None,
        }
    }
}
