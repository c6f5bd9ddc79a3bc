//! The inputs of safe outputs (`changes`, `protected-paths`, the limits, the branch, the pull
//! request and the agent's GitHub actions), parsed once.

use super::inputs::{self as input, InputSpec};
use super::{invalid, optional, parse_bool, parse_choice, parse_u32, ConfigError};
use crate::runner::Env;

/// `changes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangesMode {
    /// Commit to a branch and open a draft pull request.
    PullRequest,
    /// Deliver nothing; the answer only.
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeOutputSettings {
    pub changes: ChangesMode,
    pub protected_paths: Vec<String>,
    pub max_change_files: u64,
    pub max_change_bytes: u64,
    pub branch_prefix: String,
    pub push_to_pr_branch: bool,
    pub pr_draft: bool,
    /// `None`: the repository's existing labels.
    pub allowed_labels: Option<Vec<String>>,
    pub max_comments: u64,
    pub max_issues: u64,
}

/// A comma- or newline-separated list, trimmed, empties dropped.
pub fn split_list(raw: &str) -> Vec<String> {
    raw.split([',', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn list(env: &Env, spec: &InputSpec) -> Option<Vec<String>> {
    optional(env, spec).map(split_list)
}

/// A branch prefix git and GitHub accept as the start of a ref name.
fn parse_prefix(env: &Env) -> Result<String, ConfigError> {
    let spec = &input::BRANCH_PREFIX;
    let value = optional(env, spec).unwrap_or("fro-bot/");
    let bad = value.is_empty()
        || value.starts_with(['/', '-', '.'])
        || value.contains("..")
        || value.contains("//")
        || value.contains("@{")
        || value
            .chars()
            .any(|c| c.is_ascii_control() || " ~^:?*[\\".contains(c))
        || value
            .split('/')
            .any(|c| c.ends_with(".lock") || c.starts_with('.'));
    match bad {
        true => Err(invalid(
            spec,
            value,
            "expected the start of a git branch name, e.g. 'fro-bot/' (no spaces, '..', '~^:?*[\\', or leading '/', '-', '.')",
        )),
        false => Ok(value.to_string()),
    }
}

fn parse_protected(env: &Env) -> Result<Vec<String>, ConfigError> {
    let spec = &input::PROTECTED_PATHS;
    let items = list(env, spec).unwrap_or_default();
    if items.len() == 1 && items[0].eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    match items.iter().find(|p| p.split('/').any(|c| c == "..")) {
        Some(p) => Err(invalid(
            spec,
            p,
            "a path pattern inside the repository (no '..')",
        )),
        None => Ok(items),
    }
}

pub fn parse(env: &Env) -> Result<SafeOutputSettings, ConfigError> {
    let changes = parse_choice(
        env,
        &input::CHANGES,
        [
            ("pull-request", ChangesMode::PullRequest),
            ("off", ChangesMode::Off),
        ],
    )?;
    Ok(SafeOutputSettings {
        changes,
        protected_paths: parse_protected(env)?,
        max_change_files: u64::from(parse_u32(env, &input::MAX_CHANGE_FILES)?),
        max_change_bytes: u64::from(parse_u32(env, &input::MAX_CHANGE_BYTES)?),
        branch_prefix: parse_prefix(env)?,
        push_to_pr_branch: parse_bool(env, &input::PUSH_TO_PR_BRANCH)?,
        pr_draft: parse_bool(env, &input::PR_DRAFT)?,
        allowed_labels: list(env, &input::ALLOWED_LABELS),
        max_comments: u64::from(parse_u32(env, &input::MAX_COMMENTS)?),
        max_issues: u64::from(parse_u32(env, &input::MAX_ISSUES)?),
    })
}
