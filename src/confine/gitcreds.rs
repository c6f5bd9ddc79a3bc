//! The checkout's credentials, out of the agent's reach for the turn. `actions/checkout` persists
//! the job's token in the repository's git config (`http.<url>.extraheader`, or a file pulled in by
//! `includeIf.<cond>.path`); users add `url.<https://user:token@host/>.insteadOf` rules or a
//! `~/.git-credentials` store. On runs where the agent must not hold the token, those entries are
//! removed from `.git/config` and the files holding credentials are taken over (root, 0600) for the
//! turn; everything is put back afterwards (also on an error path, by `Drop`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::handover::{Handover, HandoverError, Take, TakenOver};

#[derive(Debug, thiserror::Error)]
pub enum GitCredsError {
    #[error("cannot run git on {}", config.display())]
    Git {
        config: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("git config failed on {}: {stderr}", config.display())]
    Failed { config: PathBuf, stderr: String },
    #[error("cannot take a credential file from the agent")]
    File {
        #[source]
        source: HandoverError,
    },
}

/// Entries removed from `.git/config`, re-added after the turn.
#[derive(Debug)]
pub struct HiddenCredentials {
    config: PathBuf,
    removed: Vec<(String, String)>,
    files: Handover,
    done: bool,
}

/// Whether a config value or key carries a credential.
fn is_credential(key: &str, value: &str) -> bool {
    let key_l = key.to_ascii_lowercase();
    if key_l.starts_with("http.") && key_l.ends_with(".extraheader") {
        return true;
    }
    if key_l.starts_with("url.") && key_l.ends_with(".insteadof") {
        // The rewritten URL is the key's subsection: a token lives in its userinfo.
        return has_userinfo_secret(&key[4..key.len() - ".insteadof".len()]);
    }
    if key_l.starts_with("url.") && key_l.ends_with(".pushinsteadof") {
        return has_userinfo_secret(&key[4..key.len() - ".pushinsteadof".len()]);
    }
    key_l.starts_with("remote.") && key_l.ends_with(".url") && has_userinfo_secret(value)
}

/// `scheme://user:secret@host...` (a bare user, as in `git@host`, is not a secret).
fn has_userinfo_secret(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

fn is_include(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k == "include.path" || (k.starts_with("includeif.") && k.ends_with(".path"))
}

fn git_config(config: &Path, args: &[&str]) -> Result<std::process::Output, GitCredsError> {
    Command::new("git")
        .arg("config")
        .arg("--file")
        .arg(config)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .map_err(|source| GitCredsError::Git {
            config: config.to_path_buf(),
            source,
        })
}

fn entries(config: &Path) -> Result<Vec<(String, String)>, GitCredsError> {
    let out = git_config(config, &["-z", "--get-regexp", "."])?;
    // Exit 1 = no entries at all.
    if !out.status.success() && out.status.code() != Some(1) {
        return Err(GitCredsError::Failed {
            config: config.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('\n') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (e.to_string(), String::new()),
        })
        .collect())
}

/// Whether an included config file holds a credential.
fn file_has_credentials(path: &Path) -> bool {
    path.is_file()
        && entries(path)
            .map(|es| es.iter().any(|(k, v)| is_credential(k, v)))
            .unwrap_or(true)
}

/// The repository's config file: `<workspace>/.git/config` (a `.git` file — a worktree or
/// submodule — points elsewhere and is not handled).
pub fn repo_config(workspace: &Path) -> Option<PathBuf> {
    let cfg = workspace.join(".git/config");
    cfg.is_file().then_some(cfg)
}

impl HiddenCredentials {
    /// Removes credential entries from `config` and takes over the credential files: included
    /// files that hold credentials and `credential_stores` (`~/.git-credentials`, ...).
    pub fn hide(
        config: Option<&Path>,
        credential_stores: &[PathBuf],
        agent_uid: u32,
    ) -> Result<HiddenCredentials, GitCredsError> {
        let mut hidden = HiddenCredentials {
            config: config.map(Path::to_path_buf).unwrap_or_default(),
            removed: Vec::new(),
            files: Handover::new(),
            done: false,
        };
        let take = |files: &mut Handover, path: &Path| {
            files
                .take_file(path, agent_uid, Take::Hide)
                .map_err(|source| GitCredsError::File { source })
        };
        for store in credential_stores {
            take(&mut hidden.files, store)?;
        }
        let Some(config) = config else {
            return Ok(hidden);
        };
        let base = config.parent().unwrap_or(Path::new("/"));
        let all = entries(config)?;
        let mut keys: Vec<&str> = Vec::new();
        for (k, v) in &all {
            let included = is_include(k).then(|| base.join(v));
            let secret = match &included {
                Some(file) => file_has_credentials(file),
                None => is_credential(k, v),
            };
            if secret {
                if let Some(file) = &included {
                    take(&mut hidden.files, file)?;
                }
                if !keys.contains(&k.as_str()) {
                    keys.push(k);
                }
            }
        }
        for key in keys {
            let out = git_config(config, &["--unset-all", key])?;
            if !out.status.success() {
                return Err(GitCredsError::Failed {
                    config: config.to_path_buf(),
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            // `--unset-all` drops every value of the key: the harmless ones go straight back.
            for (k, v) in all.iter().filter(|(k, _)| k == key) {
                let included = is_include(k).then(|| base.join(v));
                let secret = match &included {
                    Some(file) => file_has_credentials(file),
                    None => is_credential(k, v),
                };
                if secret {
                    hidden.removed.push((k.clone(), v.clone()));
                } else {
                    git_config(config, &["--add", k, v])?;
                }
            }
        }
        Ok(hidden)
    }

    /// The credential files taken for the turn.
    pub fn taken(&self) -> &TakenOver {
        self.files.taken()
    }

    /// How many credential entries and files were hidden.
    pub fn count(&self) -> usize {
        self.removed.len() + self.files.len()
    }

    /// Puts everything back. The agent's own changes to the config are kept.
    pub fn restore(&mut self) -> Result<(), GitCredsError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut first = None;
        for (k, v) in std::mem::take(&mut self.removed) {
            match git_config(&self.config, &["--add", &k, &v]) {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    first.get_or_insert(GitCredsError::Failed {
                        config: self.config.clone(),
                        stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    });
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if let Err(source) = self.files.restore() {
            first.get_or_insert(GitCredsError::File { source });
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for HiddenCredentials {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("cannot put the checkout's credentials back: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_recognised() {
        assert!(is_credential(
            "http.https://github.com/.extraheader",
            "AUTHORIZATION: basic x"
        ));
        assert!(is_credential(
            "url.https://x-access-token:ghs_1@github.com/.insteadof",
            "https://github.com/"
        ));
        assert!(!is_credential(
            "url.git@github.com:.insteadof",
            "https://github.com/"
        ));
        assert!(is_credential(
            "remote.origin.url",
            "https://u:ghs_1@github.com/o/r"
        ));
        assert!(!is_credential(
            "remote.origin.url",
            "https://github.com/o/r"
        ));
        assert!(!is_credential("user.name", "x:y@z"));
    }

    fn git(dir: &Path, args: &[&str]) {
        let st = Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
    }

    #[test]
    fn hidden_for_the_turn_and_put_back_with_the_agents_changes() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        git(&ws, &["init", "-q"]);
        let inc = t.path().join("creds.config");
        std::fs::write(
            &inc,
            "[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic INC\n",
        )
        .unwrap();
        let plain = t.path().join("plain.config");
        std::fs::write(&plain, "[user]\n\tname = someone\n").unwrap();
        git(
            &ws,
            &[
                "config",
                "http.https://github.com/.extraheader",
                "AUTHORIZATION: basic TOP",
            ],
        );
        git(
            &ws,
            &["config", "--add", "include.path", inc.to_str().unwrap()],
        );
        git(
            &ws,
            &["config", "--add", "include.path", plain.to_str().unwrap()],
        );
        git(
            &ws,
            &[
                "config",
                "url.https://x:ghs_2@github.com/.insteadOf",
                "https://github.com/",
            ],
        );
        let cfg = repo_config(&ws).unwrap();
        let mut hidden = HiddenCredentials::hide(Some(&cfg), &[], 1001).unwrap();
        let during = std::fs::read_to_string(&cfg).unwrap();
        for secret in ["TOP", "ghs_2", "creds.config"] {
            assert!(!during.contains(secret), "{secret} visible: {during}");
        }
        assert!(during.contains("plain.config"), "{during}");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(&inc).unwrap().mode() & 0o777, 0o600);
        }
        git(&ws, &["config", "user.email", "agent@example.com"]);
        hidden.restore().unwrap();
        let after = std::fs::read_to_string(&cfg).unwrap();
        for back in [
            "TOP",
            "ghs_2",
            "creds.config",
            "plain.config",
            "agent@example.com",
        ] {
            assert!(after.contains(back), "{back} missing: {after}");
        }
    }
}
