//! What confining the agent changes for the turn, and how it is undone
//! (docs/security.md#the-agent-is-confined): before OpenCode starts, OpenCode's directories are
//! handed to the agent's uid, the job's file commands taken from it and the checkout's
//! credentials hidden ([`confine`]), all recorded in main's state so post can give them back if
//! main is killed ([`record_taken`]); after the server stops, [`Confinement::release`] kills
//! what the agent left running, regroups what OpenCode made in the checkout and takes everything
//! back. A local run's agent is the user: nothing is handed over.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::client::error_chain;
use super::{AgentError, AgentOptions};
use crate::confine::gitcreds::{self, HiddenCredentials};
use crate::confine::handover::{Handover, Take, TakenOver};
use crate::confine::key_proxy::KeyProxy;
use crate::confine::{memory_group, strays, AgentUser, PrivateBinary};
use crate::runner::{env, FileCommands};

/// The session tools' trust view, written for them to read at each call (`launch::trust_file`),
/// kept while the agent runs.
pub(super) type TrustFile = Option<(crate::trust::TrustView, tempfile::NamedTempFile)>;

/// What [`confine`] changed before OpenCode starts.
pub(super) struct Confined {
    pub handover: Handover,
    pub git_credentials: Option<HiddenCredentials>,
    /// The agent's private copy of OpenCode (and its shell wrapper); `None` for a local run.
    pub binary: Option<PrivateBinary>,
}

/// Hands OpenCode's directories to the agent's uid, takes the file commands and hides the
/// checkout's credentials (a local run's agent is the user: nothing to do). `fro_bot`: the
/// session tools' binary, which the wrapper may also run as the shell's interpreter.
pub(super) fn confine(opts: &AgentOptions, fro_bot: Option<&Path>) -> Result<Confined, AgentError> {
    let mut handover = Handover::new();
    let AgentUser::Switched { uid, gid, .. } = opts.user else {
        return Ok(Confined {
            handover,
            git_credentials: None,
            binary: None,
        });
    };
    let confine_err = |source| AgentError::Confine { source };
    // The wrapper comes first: whether OpenCode gets the memory group decides how its data dir
    // is handed over.
    let binary = PrivateBinary::prepare(
        &opts.opencode,
        opts.base_env.get(env::PATH),
        fro_bot.filter(|_| gid != memory_group::MEMORY_GID),
    )
    .map_err(|source| AgentError::Binary {
        path: opts.opencode.clone(),
        source,
    })?;
    let data_dir = opts.dirs.data_dir();
    for dir in opts.dirs.opencode_dirs() {
        match binary.memory_group() {
            Some(group) if dir == data_dir => handover.give_dir_to_group(&dir, uid, group),
            _ => handover.give_dir(&dir, uid, gid),
        }
        .map_err(confine_err)?;
    }
    for file in &opts.file_commands {
        handover
            .take_file(file, uid, Take::ReadOnly)
            .map_err(confine_err)?;
    }
    let git_credentials = if opts.hide_git_credentials {
        Some(hide_git_credentials(opts, uid)?)
    } else {
        None
    };
    Ok(Confined {
        handover,
        git_credentials,
        binary: Some(binary),
    })
}

fn hide_git_credentials(opts: &AgentOptions, uid: u32) -> Result<HiddenCredentials, AgentError> {
    let config = gitcreds::repo_config(&opts.workspace);
    let hidden = HiddenCredentials::hide(config.as_deref(), &credential_stores(opts), uid)
        .map_err(|source| AgentError::GitCredentials { source })?;
    if hidden.count() > 0 {
        tracing::info!(
            "hid {} checkout credential(s) from the agent for the turn",
            hidden.count()
        );
    }
    Ok(hidden)
}

/// git's credential stores the agent could read: in its `HOME`, and in the runner's own home
/// when the agent's is a private one.
fn credential_stores(opts: &AgentOptions) -> Vec<PathBuf> {
    let mut stores = vec![
        opts.dirs.home.join(".git-credentials"),
        opts.dirs.config_home.join("git/credentials"),
    ];
    if let Some(home) = &opts.runner_home {
        stores.push(home.join(".git-credentials"));
        stores.push(home.join(".config/git/credentials"));
    }
    stores
}

impl Confined {
    /// Everything taken from the runner's user for the turn, for main's state: post gives it
    /// back when main is killed before [`Confinement::release`] could.
    pub fn taken(&self) -> TakenOver {
        let mut all = self.handover.taken().clone();
        if let Some(c) = &self.git_credentials {
            all.taken.extend(c.taken().taken.iter().cloned());
        }
        all
    }
}

/// Main's record of what is taken for the turn (`state::TURN_TAKEN`); empty when nothing is.
pub(super) fn record_taken(files: &FileCommands, taken: &TakenOver) {
    let value = if taken.taken.is_empty() {
        String::new()
    } else {
        match serde_json::to_string(taken) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!("post could not give back what the turn takes: {e}");
                return;
            }
        }
    };
    if let Err(e) = files.save_state(env::state::TURN_TAKEN, &value) {
        tracing::warn!("{e}");
    }
}

/// What confining the agent changed for the turn, held while OpenCode runs and undone by
/// [`Confinement::release`].
#[derive(Debug)]
pub(super) struct Confinement {
    pub user: AgentUser,
    pub handover: Handover,
    pub git_credentials: Option<HiddenCredentials>,
    /// What the summary says about the agent's reach.
    pub notes: Vec<String>,
    /// The key proxy, serving the provider APIs while the agent runs.
    pub _key_proxy: KeyProxy,
    /// Kept until the server is gone.
    pub _binary: Option<PrivateBinary>,
    /// The session tools' trust view, read by them at each call while the agent runs.
    pub trust: TrustFile,
    /// OpenCode and the session-tools server, as run by the agent's uid.
    pub own_programs: Vec<PathBuf>,
    /// The checkout and the memory group, when OpenCode held it: what OpenCode made there gets
    /// the agent's gid back.
    pub regroup: Option<(PathBuf, u32)>,
}

/// What [`Confinement::release`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// No process of the agent is left and its directories are fro-bot's again.
    Clean { strays_killed: Vec<String> },
    /// Processes of the agent survived SIGKILL: its directories stay handed over (taking them
    /// back while something writes them would race), and the checkpoint must not run.
    StraysRemain { pids: Vec<i32> },
    /// No stray, but something could not be taken back.
    NotTakenBack { message: String },
}

impl Confinement {
    /// After the server stopped: kills and reaps every process the agent left, then takes its
    /// directories back and gives the file-command files back (`state`: main's record, cleared
    /// once everything is back).
    pub async fn release(&mut self, budget: Duration, state: Option<&FileCommands>) -> Released {
        let killed = match self.sweep(budget).await {
            Ok(killed) => killed,
            Err(remaining) => return remaining,
        };
        self.regroup();
        let creds = self.git_credentials.as_mut().map(|c| c.restore());
        if let Some(Err(e)) = creds {
            return Released::NotTakenBack {
                message: error_chain(&e),
            };
        }
        match self.handover.restore() {
            Ok(()) => {
                if let Some(files) = state {
                    record_taken(files, &TakenOver::default());
                }
                Released::Clean {
                    strays_killed: killed,
                }
            }
            Err(e) => Released::NotTakenBack {
                message: error_chain(&e),
            },
        }
    }

    /// Kills what the agent's uid left running (fro-bot's own programs spared): the agents'
    /// names killed, or why not everything is gone.
    async fn sweep(&self, budget: Duration) -> Result<Vec<String>, Released> {
        let uid = self.user.uid();
        let ours = self.own_programs.clone();
        let sweep = tokio::task::spawn_blocking(move || strays::sweep(uid, budget, &ours)).await;
        match sweep {
            Ok(strays::Sweep::Clean) => Ok(Vec::new()),
            Ok(strays::Sweep::Killed { agents, .. }) => Ok(agents),
            Ok(strays::Sweep::Remaining { pids }) => Err(Released::StraysRemain { pids }),
            Err(e) => {
                tracing::warn!("the stray sweep failed: {e}");
                Err(Released::StraysRemain { pids: vec![] })
            }
        }
    }

    /// Gives what OpenCode made in the checkout the agent's gid (best effort: a stray group
    /// gives no one access to anything).
    fn regroup(&self) {
        let (Some((workspace, group)), AgentUser::Switched { gid, .. }) =
            (&self.regroup, self.user)
        else {
            return;
        };
        match memory_group::regroup(workspace, *group, gid) {
            Ok(0) => {}
            Ok(n) => tracing::debug!("{n} file(s) OpenCode made in the checkout get gid {gid}"),
            Err(e) => tracing::warn!("cannot give OpenCode's files in the checkout gid {gid}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::handover::Taken;
    use crate::runner::Env;

    fn state_of(file: &Path) -> Vec<(String, String)> {
        crate::runner::file_command::parse(&std::fs::read_to_string(file).unwrap()).unwrap()
    }

    #[test]
    fn a_local_run_hands_nothing_over() {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = AgentOptions::local(tmp.path(), Env::from_pairs([("PATH", "/usr/bin")]));
        opts.file_commands = vec![tmp.path().join("state")];
        opts.hide_git_credentials = true;
        let confined = confine(&opts, None).unwrap();
        assert!(confined.handover.is_empty());
        assert!(confined.git_credentials.is_none());
        assert!(
            confined.binary.is_none(),
            "OpenCode itself, no private copy"
        );
        assert!(confined.taken().taken.is_empty());
    }

    /// Post reads main's record back (`phases::turn::leftovers`): what was taken reads back
    /// whole, and once everything is given back the record is empty.
    #[test]
    fn mains_record_of_what_is_taken_reads_back_and_is_cleared_when_given_back() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        std::fs::write(&state, "").unwrap();
        let files = FileCommands {
            state: Some(state.clone()),
            ..FileCommands::default()
        };
        let taken = TakenOver {
            taken: vec![Taken {
                path: tmp.path().join("home/.local/share/opencode"),
                uid: 1001,
                gid: 1001,
                mode: Some(0o700),
            }],
        };
        record_taken(&files, &taken);
        record_taken(&files, &TakenOver::default());
        let entries = state_of(&state);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].0, env::state::TURN_TAKEN);
        let read: TakenOver = serde_json::from_str(&entries[0].1).unwrap();
        assert_eq!(read, taken);
        assert_eq!(
            entries[1],
            (env::state::TURN_TAKEN.to_string(), String::new())
        );
    }

    #[test]
    fn the_runners_own_credential_stores_are_hidden_when_the_agent_has_a_private_home() {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = AgentOptions::local(tmp.path(), Env::from_pairs([("PATH", "/usr/bin")]));
        let home = &opts.dirs.home;
        let agents = vec![
            home.join(".git-credentials"),
            home.join(".config/git/credentials"),
        ];
        assert_eq!(credential_stores(&opts), agents);
        opts.runner_home = Some(PathBuf::from("/home/runner"));
        let mut all = agents;
        all.push(PathBuf::from("/home/runner/.git-credentials"));
        all.push(PathBuf::from("/home/runner/.config/git/credentials"));
        assert_eq!(credential_stores(&opts), all);
    }
}
