//! The words a repair writes into memory, and how they are recognized again: the model-visible
//! error of a call whose outcome is unknown, the error that completes a cut answer, and the marker
//! (`froBotRepair` in the call's metadata) a later run reads back (docs/persistence.md#a-turn-cut-short).

use super::{Interruption, LeftAs, RepairOutcome, RepairReport, RunRef};

/// Starts every repaired answer's error message: how `read_back` tells the repair's own rows.
pub(super) const MESSAGE_PREFIX: &str = "Turn cut short: ";
const MESSAGE_SUFFIX: &str = " before this answer was complete.";

/// The key, in a repaired call's `state.metadata`, of what the repair recorded.
pub(super) const MARKER: &str = "froBotRepair";

/// The error OpenCode 1.18.33 writes on an abort, and the only one under which it still shows an
/// answer's parts to the model (`toModelMessages` drops an answer with any other error).
pub(super) const ABORTED_ERROR: &str = "MessageAbortedError";

/// What OpenCode's `bash` tool appends to a command's output when the turn is aborted under it
/// (and then records the call as `completed`).
pub(super) const ABORTED_COMMAND_TAIL: &str = "\nUser aborted the command\n</shell_metadata>";

/// What OpenCode's processor writes for a call still open when a turn is aborted.
pub(super) const ABORTED_TOOL_ERROR: &str = "Tool execution aborted";

impl Interruption {
    /// What stopped the turn, as the texts say it.
    fn why(self) -> &'static str {
        match self {
            Interruption::Cancelled => "the workflow run was cancelled",
            Interruption::TimedOut => "the agent's turn reached its time limit",
            Interruption::Capped => "the agent's turn reached its spend cap",
            Interruption::Killed => "the workflow run was killed",
            Interruption::EarlierRun => "an earlier workflow run was stopped",
            Interruption::Stopped => "the agent's server stopped",
        }
    }

    /// The marker's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Interruption::Cancelled => "cancelled",
            Interruption::TimedOut => "timed-out",
            Interruption::Capped => "capped",
            Interruption::Killed => "killed",
            Interruption::EarlierRun => "earlier-run",
            Interruption::Stopped => "stopped",
        }
    }

    const ALL: [Interruption; 6] = [
        Interruption::Cancelled,
        Interruption::TimedOut,
        Interruption::Capped,
        Interruption::Killed,
        Interruption::EarlierRun,
        Interruption::Stopped,
    ];

    /// The reason a repaired answer's error names (`message_error`), read back.
    pub(super) fn from_message(text: &str) -> Option<Self> {
        let why = text
            .strip_prefix(MESSAGE_PREFIX)?
            .strip_suffix(MESSAGE_SUFFIX)?;
        Self::ALL.into_iter().find(|i| i.why() == why)
    }

    /// How the summary names it.
    pub fn describe(self) -> &'static str {
        self.why()
    }
}

impl LeftAs {
    pub fn as_str(self) -> &'static str {
        match self {
            LeftAs::Pending => "pending",
            LeftAs::Running => "running",
            LeftAs::AbortedCommand => "aborted-command",
            LeftAs::AbortedTool => "aborted-tool",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        [
            LeftAs::Pending,
            LeftAs::Running,
            LeftAs::AbortedCommand,
            LeftAs::AbortedTool,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }
}

/// The model-visible error of a call whose outcome is unknown. "Tool execution interrupted" is
/// the seeds' own words for it.
pub fn call_error(reason: Interruption) -> String {
    format!(
        "Tool execution interrupted: {} while this call was under way. Its outcome is unknown: it \
         may not have started, may have run in part, or may have finished. It was not run again; \
         check its effects before repeating it.",
        reason.why()
    )
}

/// The error that completes an answer the turn did not finish.
pub fn message_error(reason: Interruption) -> String {
    format!("{MESSAGE_PREFIX}{}{MESSAGE_SUFFIX}", reason.why())
}

/// What the repair records in the call's metadata (never shown to the model).
pub(super) fn marker(reason: Interruption, left: LeftAs) -> String {
    serde_json::json!({"reason": reason.as_str(), "was": left.as_str()}).to_string()
}

/// What the repair records beside the answer's error (`error.data`, beside `message`: OpenCode
/// reads only `message`), when it knows the run the turn was cut in.
pub(super) fn message_marker(reason: Interruption, run: &RunRef) -> serde_json::Value {
    serde_json::json!({"reason": reason.as_str(), "run": run.id, "attempt": run.attempt})
}

/// What a repair kept: "the turn was kept; its last command's outcome is unknown".
pub(super) fn kept(report: &RepairReport) -> String {
    let kept = match report.turns.len() {
        1 => "the turn was kept",
        _ => "they were kept",
    };
    let last_is_command = report
        .turns
        .last()
        .and_then(|t| t.calls.last())
        .is_some_and(|c| c.tool == "bash");
    let calls = match (report.calls(), last_is_command) {
        (0, _) => "no call was under way".to_string(),
        (1, true) => "its last command's outcome is unknown".to_string(),
        (1, false) => "its last call's outcome is unknown".to_string(),
        (n, _) => format!("{n} calls have unknown outcomes"),
    };
    format!("{kept}; {calls}")
}

/// What the cut run tells the thread (its tracking comment) of what memory kept, from the repair
/// of its own turn (`None`: that repair did not run). It is said before the save, so it says
/// what the repair knows, and leaves whether memory was saved to the run's summary. `None`:
/// nothing to say (nothing of the turn was left open).
pub fn kept_note(repair: Option<&RepairOutcome>) -> Option<String> {
    match repair {
        Some(RepairOutcome::Repaired(r)) if r.turns.is_empty() => None,
        Some(RepairOutcome::Repaired(r)) => Some(format!(
            "This run's memory holds what I did so far: {}. Once that memory is saved (the run's \
             summary says whether it was), my next run on this thread is told that this turn was \
             cut short.",
            kept(r)
        )),
        Some(RepairOutcome::Failed { .. }) | None => Some(
            "What I did so far is not known to be kept in memory (the run's summary says what was \
             saved)."
                .to_string(),
        ),
    }
}

/// A call's input as a short line: a command's first line, anything else as its JSON (one line
/// already); other control characters become spaces, at most [`SUMMARY_CHARS`] characters are
/// kept, and `…` says that something was left out.
pub(super) fn summary(raw: &str) -> String {
    let raw = raw.trim_end_matches(['\n', '\r']);
    let line = raw.split(['\n', '\r']).next().unwrap_or_default();
    let mut out = String::new();
    let mut chars = line.chars().map(|c| if c.is_control() { ' ' } else { c });
    for c in chars.by_ref().take(SUMMARY_CHARS) {
        out.push(c);
    }
    if chars.next().is_some() || line.len() < raw.len() {
        out.push('…');
    }
    out
}

/// The longest input summary a report holds.
pub const SUMMARY_CHARS: usize = 200;
