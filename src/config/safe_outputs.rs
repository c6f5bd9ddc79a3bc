//! The inputs of safe outputs (`changes`, `protected-paths`, the limits, the branch, the pull
//! request and the agent's GitHub actions), parsed once.

use super::inputs::{self as input, InputSpec};
use super::{invalid, optional, parse_bool, parse_choice, parse_u32, with_default, ConfigError};
use crate::runner::Env;

/// `changes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangesMode {
    /// Commit to a branch and open a draft pull request.
    PullRequest,
    /// Deliver nothing; the answer only.
    Off,
}

/// `threat-check`: what the model check of a change does, and what a "needs review" finding of
/// the deterministic gate means (docs/security.md#the-threat-check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreatMode {
    /// A flagged change is held; a "needs review" change goes out as a labelled draft.
    Block,
    /// A flagged change is delivered with a warning.
    Warn,
    /// `Block`, and a "needs review" finding refuses the change.
    Strict,
    /// No model check.
    Off,
}

impl ThreatMode {
    pub const CHOICES: [(&'static str, ThreatMode); 4] = [
        ("block", ThreatMode::Block),
        ("warn", ThreatMode::Warn),
        ("strict", ThreatMode::Strict),
        ("off", ThreatMode::Off),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ThreatMode::Block => "block",
            ThreatMode::Warn => "warn",
            ThreatMode::Strict => "strict",
            ThreatMode::Off => "off",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeOutputSettings {
    pub changes: ChangesMode,
    pub protected_paths: Vec<String>,
    pub max_change_files: u64,
    pub max_change_bytes: u64,
    /// `allowed-binary-paths`: binary files a change may carry.
    pub allowed_binary_paths: Vec<String>,
    pub threat_check: ThreatMode,
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
    let items = parse_patterns(env, &input::PROTECTED_PATHS)?;
    match items.len() == 1 && items[0].eq_ignore_ascii_case("none") {
        true => Ok(Vec::new()),
        false => Ok(items),
    }
}

fn parse_threat_mode(env: &Env) -> Result<ThreatMode, ConfigError> {
    let spec = &input::THREAT_CHECK;
    let value = with_default(env, spec)?;
    ThreatMode::CHOICES
        .iter()
        .find(|(word, _)| value.eq_ignore_ascii_case(word))
        .map(|(_, m)| *m)
        .ok_or_else(|| invalid(spec, value, "expected 'block', 'warn', 'strict' or 'off'"))
}

/// Patterns as `protected-paths` takes them (no `..`).
fn parse_patterns(env: &Env, spec: &InputSpec) -> Result<Vec<String>, ConfigError> {
    let items = list(env, spec).unwrap_or_default();
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
        allowed_binary_paths: parse_patterns(env, &input::ALLOWED_BINARY_PATHS)?,
        threat_check: parse_threat_mode(env)?,
        branch_prefix: parse_prefix(env)?,
        push_to_pr_branch: parse_bool(env, &input::PUSH_TO_PR_BRANCH)?,
        pr_draft: parse_bool(env, &input::PR_DRAFT)?,
        allowed_labels: list(env, &input::ALLOWED_LABELS),
        max_comments: u64::from(parse_u32(env, &input::MAX_COMMENTS)?),
        max_issues: u64::from(parse_u32(env, &input::MAX_ISSUES)?),
    })
}
