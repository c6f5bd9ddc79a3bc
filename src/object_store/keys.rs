//! The object key layout (docs/design.md#object-store). Every component is sanitized once, here.

use super::validate::{sanitize_key_component, validate_prefix, ValidationError};

/// Object keys for one repository under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreKeys {
    /// `{prefix}/github/{owner}/{repo}`
    repo_root: String,
    /// `{prefix}/coordination/{owner}/{repo}/locks`
    locks: String,
    lease: String,
}

/// The files restore ever downloads from `sessions/` (an allowlist): the database, and the marker
/// that names it (the same name as the marker beside the database, `memory::state_paths::MARKER_FILE`).
pub const SESSION_DB_NAME: &str = "opencode.db";
pub const SESSION_MARKER_NAME: &str = "fro-bot.json";

impl StoreKeys {
    pub fn new(prefix: &str, owner: &str, repo: &str) -> Result<StoreKeys, ValidationError> {
        let prefix = validate_prefix(prefix)?;
        let owner = sanitize_key_component(owner)?;
        let repo = sanitize_key_component(repo)?;
        let locks = format!("{prefix}/coordination/{owner}/{repo}/locks");
        Ok(StoreKeys {
            repo_root: format!("{prefix}/github/{owner}/{repo}"),
            lease: format!("{locks}/repo.json"),
            locks,
        })
    }

    /// From `GITHUB_REPOSITORY` (`owner/repo`).
    pub fn for_repository(prefix: &str, repository: &str) -> Result<StoreKeys, ValidationError> {
        let (owner, repo) = repository.split_once('/').unwrap_or((repository, ""));
        Self::new(prefix, owner, repo)
    }

    /// `.../sessions/` — the folder restore reads one allowlisted name from.
    pub fn sessions_dir(&self) -> String {
        format!("{}/sessions/", self.repo_root)
    }

    pub fn session_db(&self) -> String {
        format!("{}{SESSION_DB_NAME}", self.sessions_dir())
    }

    /// `.../sessions/fro-bot.json`: the marker of the database published last; it holds the
    /// database's SHA-256, so it is believed only beside exactly that database.
    pub fn session_marker(&self) -> String {
        format!("{}{SESSION_MARKER_NAME}", self.sessions_dir())
    }

    /// `.../budget/spend.json`: the spend ledger the budget across runs is counted from
    /// (`memory::spend_ledger::store`), written only under the lease.
    pub fn spend_ledger(&self) -> String {
        format!("{}/budget/spend.json", self.repo_root)
    }

    /// `.../metadata/{runKey}.json`; `run_key` is `{runId}-{runAttempt}[-{identity}]`.
    pub fn run_metadata(&self, run_key: &str) -> Result<String, ValidationError> {
        let run_key = sanitize_key_component(run_key)?;
        Ok(format!("{}/metadata/{run_key}.json", self.repo_root))
    }

    /// `.../artifacts/{runKey}/{relpath}`; each path segment is sanitized on its own.
    pub fn run_artifact(&self, run_key: &str, relpath: &str) -> Result<String, ValidationError> {
        let run_key = sanitize_key_component(run_key)?;
        let segments = relpath
            .split(['/', '\\'])
            .filter(|s| !s.is_empty() && *s != ".")
            .map(sanitize_key_component)
            .collect::<Result<Vec<_>, _>>()?;
        if segments.is_empty() {
            return Err(ValidationError::Invalid {
                input: super::validate::KEY_COMPONENT,
                reason: format!("artifact path {relpath:?} names no file"),
            });
        }
        Ok(format!(
            "{}/artifacts/{run_key}/{}",
            self.repo_root,
            segments.join("/")
        ))
    }

    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// `.../locks/thread-{hash}.json`: the turn of one thread (`phases::thread_turn`). A digest,
    /// so a logical key of any length or spelling makes one short, safe name.
    pub fn thread_lease(&self, logical_key: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = hex::encode(Sha256::digest(logical_key.as_bytes()));
        format!("{}/thread-{}.json", self.locks, &digest[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let k = StoreKeys::new("fro-bot-state", "octo", "hello.world").unwrap();
        assert_eq!(
            k.session_db(),
            "fro-bot-state/github/octo/hello.world/sessions/opencode.db"
        );
        assert_eq!(
            k.session_marker(),
            "fro-bot-state/github/octo/hello.world/sessions/fro-bot.json"
        );
        assert_eq!(
            k.run_metadata("123-2-build-m0a1b2c3d").unwrap(),
            "fro-bot-state/github/octo/hello.world/metadata/123-2-build-m0a1b2c3d.json"
        );
        assert_eq!(
            k.run_artifact("123-1", "log/2026.log").unwrap(),
            "fro-bot-state/github/octo/hello.world/artifacts/123-1/log/2026.log"
        );
        assert_eq!(
            k.lease(),
            "fro-bot-state/coordination/octo/hello.world/locks/repo.json"
        );
        let thread = k.thread_lease("issue-7");
        assert!(
            thread.starts_with("fro-bot-state/coordination/octo/hello.world/locks/thread-")
                && thread.ends_with(".json"),
            "{thread}"
        );
        assert_ne!(thread, k.thread_lease("issue-8"));
        assert_eq!(thread, k.thread_lease("issue-7"));
        assert_eq!(
            StoreKeys::for_repository("p", "octo/repo").unwrap(),
            StoreKeys::new("p", "octo", "repo").unwrap()
        );
    }

    #[test]
    fn components_are_sanitized_or_rejected() {
        let k = StoreKeys::new("p", "o\nwner", "re\\po").unwrap();
        assert_eq!(k.session_db(), "p/github/owner/re-po/sessions/opencode.db");
        assert!(StoreKeys::new("p", "..", "r").is_err());
        assert!(StoreKeys::new("p", "o", "").is_err());
        assert!(StoreKeys::new("p/q", "o", "r").is_err());
        assert!(StoreKeys::for_repository("p", "noslash").is_err());
        let k = StoreKeys::new("p", "o", "r").unwrap();
        assert!(k.run_metadata("1-1/../x").is_err());
        assert!(k.run_artifact("1-1", "../secret").is_err());
        assert!(k.run_artifact("1-1", "").is_err());
        assert_eq!(
            k.run_artifact("1/1", "./a//b").unwrap(),
            "p/github/o/r/artifacts/1-1/a/b"
        );
    }
}
