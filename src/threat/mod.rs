//! The threat check (docs/security.md#the-threat-check): what fro-bot looks for in the agent's
//! change once the existing checks (`safe_outputs::checks`) pass, before anything is delivered.
//!
//! First a deterministic gate (`gate`): hidden Unicode controls (`unicode`) and binary files
//! refuse the change; dependency-source changes (`dependencies`) and payload-like lines
//! (`payloads`) mark it "needs review". Then a model check of the exact change and the proposed
//! actions (`model_check`), asked of the model that answered the turn through a key proxy by
//! fro-bot itself, with no tools: its prompt and verdict (`judge`), in the provider's own API
//! (`provider`).
//! Every finding is named by file and line, never by what the line holds.

pub mod dependencies;
pub mod gate;
pub mod judge;
pub mod model_check;
pub mod payloads;
pub mod provider;
pub mod runs_code;
pub mod unicode;

use crate::safe_outputs::checks::code;
use runs_code::When;

/// What a finding does to the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Never delivered.
    Refuse,
    /// Delivered only as a draft pull request labelled [`REVIEW_LABEL`] (refused under
    /// `threat-check: strict`).
    NeedsReview,
}

/// The label a "needs review" pull request carries.
pub const REVIEW_LABEL: &str = "fro-bot:needs-review";

/// What the gate found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A bidirectional or invisible control character (its code point, never the line).
    HiddenControl { code_point: u32 },
    /// A binary (non-text) file that `allowed-binary-paths` does not list.
    Binary,
    /// A dependency resolved from outside its registry (a lockfile entry or a manifest's URL).
    ForeignSource,
    /// A setting of where packages are installed from (`.npmrc`, `pip.conf`, `.cargo/config`...).
    RegistrySetting,
    /// An override of where a dependency comes from (`[patch]`, `git =`, `replace`...).
    SourceOverride,
    /// Something that runs code (`runs_code::RUNS_CODE`): when dependencies are installed or the
    /// project built, the repository opened, a commit made, or a workflow uses it. `hook` is
    /// fro-bot's own name for it (`postinstall`, `build.rs`, `postCreateCommand`...), never the
    /// agent's text.
    RunsCode { hook: &'static str, when: When },
    /// A word (an identifier) whose letters come from two scripts that do not go together, such
    /// as Latin and Cyrillic: one name made to look like another (`unicode::mixed_scripts`).
    MixedScripts { scripts: [&'static str; 2] },
    /// One line longer than [`payloads::MAX_LINE_CHARS`].
    LongLine { chars: usize },
    /// A run of encoded-looking, high-entropy text.
    EncodedBlob { chars: usize },
}

impl Kind {
    pub fn severity(&self) -> Severity {
        match self {
            Kind::HiddenControl { .. } | Kind::Binary => Severity::Refuse,
            Kind::ForeignSource
            | Kind::RegistrySetting
            | Kind::SourceOverride
            | Kind::RunsCode { .. }
            | Kind::MixedScripts { .. }
            | Kind::LongLine { .. }
            | Kind::EncodedBlob { .. } => Severity::NeedsReview,
        }
    }

    fn what(&self) -> String {
        match self {
            Kind::HiddenControl { code_point } => format!(
                "holds an invisible or bidirectional Unicode control (U+{code_point:04X}), which can make code read differently from how it runs"
            ),
            Kind::Binary => "is a binary (non-text) file; `allowed-binary-paths` lists the binary files a change may carry".into(),
            Kind::ForeignSource => "resolves a dependency from outside its registry".into(),
            Kind::RegistrySetting => "changes where packages are installed from (a registry or index setting)".into(),
            Kind::SourceOverride => "overrides where a dependency comes from (`[patch]`, `git =`, `registry =`, `replace`)".into(),
            Kind::RunsCode { hook, when } => runs_code_what(hook, *when),
            Kind::MixedScripts { scripts: [a, b] } => format!(
                "holds a word that mixes the {a} and {b} scripts, which can make one name look like another"
            ),
            Kind::LongLine { chars } => format!(
                "is one line of {chars} characters (over {}): minified or generated text a reviewer does not read",
                payloads::MAX_LINE_CHARS
            ),
            Kind::EncodedBlob { chars } => format!(
                "holds {chars} characters of encoded, high-entropy text: a payload a reviewer cannot read"
            ),
        }
    }
}

fn runs_code_what(hook: &str, when: When) -> String {
    match when {
        When::Install => format!("adds or changes an install or build hook (`{hook}`), which runs when dependencies are installed or the project is built"),
        When::Open => format!("adds or changes what runs when someone opens the repository (`{hook}`): in a dev container, an editor or a shell"),
        When::Commit => format!("adds or changes a git hook (`{hook}`), which runs when someone commits or pushes"),
        When::Workflow => format!("adds or changes an action (`{hook}`), which runs in any workflow that `uses:` it"),
    }
}

/// One finding: the file, the line when there is one, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: String,
    pub line: Option<usize>,
    pub kind: Kind,
}

impl Finding {
    /// One line for the answer, the summary and the pull request: never the line's content.
    pub fn describe(&self) -> String {
        match self.line {
            Some(n) => format!("{} line {n} {}", code(&self.path), self.kind.what()),
            None => format!("{} {}", code(&self.path), self.kind.what()),
        }
    }
}
