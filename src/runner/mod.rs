//! The GitHub Actions runtime protocol, owned here: the environment snapshot ([`Env`]) with every
//! name the action reads or writes (`env`), inputs, outputs, state and env through the file
//! commands (`file_command`), the step summary (`summary`), the job log's one writer (`log`) and
//! the lines it prints made inert (`lines`),
//! cancellation by signal (`cancel`), and the named points crash tests stop at (`failpoint`).

pub mod cancel;
pub mod env;
pub mod failpoint;
pub mod file_command;
pub mod lines;
pub mod log;
pub mod summary;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use cancel::Cancellation;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("cannot write file command {}", path.display())]
    FileCommand {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid file-command name {name:?}: it may not be empty or contain '=', '<<' or a line break")]
    InvalidName { name: String },
    #[error("cannot write the step summary {}", path.display())]
    Summary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A snapshot of the process environment. Everything reads the environment through this, so tests
/// can build one by hand and main and post derive the same values from the same variables.
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl Env {
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        }
    }

    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.insert(name.into(), value.into());
    }

    pub fn remove(&mut self, name: &str) {
        self.vars.remove(name);
    }

    /// `RUNNER_TEMP` when it is a directory here (older runners pass a host path that does not
    /// exist in the container).
    pub fn runner_temp(&self) -> Option<std::path::PathBuf> {
        self.get(env::RUNNER_TEMP)
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_dir())
    }

    /// The raw value of a variable.
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// A variable's value trimmed, `None` when unset or blank.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.raw(name).map(str::trim).filter(|v| !v.is_empty())
    }

    /// An action input: `INPUT_<NAME>` with the name upper-cased and spaces turned into `_`
    /// (dashes are kept, as the runner does). Trimmed; empty means unset.
    pub fn input(&self, name: &str) -> Option<&str> {
        self.get(&input_var(name))
    }

    /// State saved by the main step, as the post step sees it (`STATE_<name>`, case preserved).
    pub fn state(&self, name: &str) -> Option<&str> {
        self.get(&format!("{}{name}", env::STATE_PREFIX))
    }

    pub fn is_github_actions(&self) -> bool {
        self.get(env::GITHUB_ACTIONS) == Some("true")
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Wall-clock epoch milliseconds (for records written to disk; lease timing has its own clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Epoch ms → `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// The environment variable that carries an input.
pub fn input_var(name: &str) -> String {
    format!(
        "{}{}",
        env::INPUT_PREFIX,
        name.replace(' ', "_").to_uppercase()
    )
}

/// Where the step's outputs, state, env and summary go. Missing files (a local run) turn writes
/// into no-ops, never errors.
#[derive(Debug, Clone, Default)]
pub struct FileCommands {
    pub output: Option<PathBuf>,
    pub state: Option<PathBuf>,
    pub env: Option<PathBuf>,
    pub summary: Option<PathBuf>,
}

impl FileCommands {
    pub fn from_env(env: &Env) -> Self {
        let path = |name| env.get(name).map(PathBuf::from);
        Self {
            output: path(env::GITHUB_OUTPUT),
            state: path(env::GITHUB_STATE),
            env: path(env::GITHUB_ENV),
            summary: path(env::GITHUB_STEP_SUMMARY),
        }
    }

    pub fn set_output(&self, name: &str, value: &str) -> Result<(), RunnerError> {
        match &self.output {
            Some(path) => file_command::append(path, name, value),
            None => Ok(()),
        }
    }

    pub fn save_state(&self, name: &str, value: &str) -> Result<(), RunnerError> {
        match &self.state {
            Some(path) => file_command::append(path, name, value),
            None => Ok(()),
        }
    }

    /// [`FileCommands::save_state`], for a state the runner could not take is worth a warning,
    /// never a failed run.
    pub fn save_state_or_warn(&self, name: &str, value: &str) {
        if let Err(e) = self.save_state(name, value) {
            tracing::warn!("{e}");
        }
    }

    /// [`FileCommands::set_output`], warning when the runner could not take it.
    pub fn set_output_or_warn(&self, name: &str, value: &str) {
        if let Err(e) = self.set_output(name, value) {
            tracing::warn!("{e}");
        }
    }

    pub fn export_env(&self, name: &str, value: &str) -> Result<(), RunnerError> {
        match &self.env {
            Some(path) => file_command::append(path, name, value),
            None => Ok(()),
        }
    }

    /// Appends to the step summary, through the one redactor: the summary is public to anyone
    /// who can read the run.
    pub fn append_summary(&self, markdown: &str) -> Result<(), RunnerError> {
        match &self.summary {
            Some(path) => summary::append(path, &crate::redact::redact(markdown)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_follow_the_runner_naming_rules() {
        let env = Env::from_pairs([
            ("INPUT_GITHUB-TOKEN", "  tok  "),
            ("INPUT_S3-BACKUP", "true"),
            ("INPUT_MY_INPUT", "spaced"),
            ("INPUT_EMPTY", "   "),
        ]);
        assert_eq!(env.input("github-token"), Some("tok"));
        assert_eq!(env.input("s3-backup"), Some("true"));
        assert_eq!(env.input("my input"), Some("spaced"));
        assert_eq!(env.input("empty"), None);
        assert_eq!(env.input("missing"), None);
    }

    #[test]
    fn state_keeps_its_case() {
        let env = Env::from_pairs([("STATE_cacheSaved", "durable")]);
        assert_eq!(env.state("cacheSaved"), Some("durable"));
        assert_eq!(env.state("CACHESAVED"), None);
    }

    #[test]
    fn writers_go_to_their_files_and_are_noops_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let files = FileCommands {
            output: Some(dir.path().join("out")),
            state: Some(dir.path().join("state")),
            env: None,
            summary: None,
        };
        files.set_output("session-id", "ses_1").unwrap();
        files.save_state("cacheSaved", "skipped").unwrap();
        files.save_state("cacheSaved", "not-persisted").unwrap();
        files.export_env("X", "y").unwrap();
        files.append_summary("# hi").unwrap();
        let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert_eq!(
            file_command::parse(&out).unwrap(),
            vec![("session-id".into(), "ses_1".into())]
        );
        let state = std::fs::read_to_string(dir.path().join("state")).unwrap();
        let parsed = file_command::parse(&state).unwrap();
        assert_eq!(parsed.last().unwrap().1, "not-persisted");
    }
}
