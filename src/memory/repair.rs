//! A turn cut short, repaired in the database before the agent resumes
//! (docs/persistence.md#a-turn-cut-short). OpenCode never repairs what a killed or aborted turn
//! leaves: an answer without `time.completed`, calls left `pending`/`running`, a command it
//! recorded as `completed` with `User aborted the command`. The repair writes them as OpenCode
//! 1.18.33 reads them back: the answer completed with an error naming the interruption, each such
//! call an error whose outcome is unknown and that was not run again, its input kept; streamed text
//! is kept; nothing is run. It returns what it repaired (`RepairReport`), and `read_back` finds the
//! same in a database an earlier run repaired; `unanswered` finds the turns cut short that the
//! next run on a thread is told of (docs/persistence.md#the-next-run-knows). Restored rows are
//! hostile input: only bound parameters, only rows found by their own columns, triggers off,
//! bounded work.

mod read_back;
mod rows;
mod text;
mod unanswered;
mod write;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

pub use read_back::{read_back, read_back_path};
pub use text::{call_error, kept_note, message_error, SUMMARY_CHARS};
pub use unanswered::{on_thread, unanswered, unanswered_path, Unanswered, MAX_UNANSWERED};

/// At most this many answers are repaired in one pass; the rest wait for the next
/// (`RepairReport::limited`).
pub const MAX_MESSAGES: usize = 1_000;
/// At most this many tool parts of one answer are looked at.
pub const MAX_PARTS: usize = 1_000;
/// At most this many sessions make up the trees a repair is limited to.
pub const MAX_TREE: usize = 10_000;

/// What stopped the turn, as far as the caller knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// fro-bot aborted the turn on a signal (the runner's cancel).
    Cancelled,
    /// fro-bot aborted the turn at the `timeout` input.
    TimedOut,
    /// fro-bot aborted the turn at the spend cap (`max-cost`, `max-tokens`).
    Capped,
    /// The process that ran the turn was killed (post, finishing a killed main step).
    Killed,
    /// Found in restored memory: some earlier run was stopped, how is not known.
    EarlierRun,
    /// OpenCode went away under this run's turn.
    Stopped,
}

/// What state OpenCode left a call in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftAs {
    /// Its input was still being written by the model.
    Pending,
    /// It was running.
    Running,
    /// `bash`, recorded `completed` with the output ending in `User aborted the command`.
    AbortedCommand,
    /// Recorded as an error `Tool execution aborted` by OpenCode's processor on the abort.
    AbortedTool,
}

/// Which sessions a repair reads.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every session (restored memory).
    Whole,
    /// These sessions and their sub-agent sessions (a turn this run ran).
    Trees(&'a [&'a str]),
}

/// The workflow run a turn was cut in, as the repair that ran in that run records it beside the
/// answer (`error.data.froBotRepair`); a turn found cut in restored memory names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRef {
    /// `GITHUB_RUN_ID`: 1 to 20 ASCII digits.
    pub id: String,
    /// `GITHUB_RUN_ATTEMPT`: 1 to 6 ASCII digits, when known.
    pub attempt: Option<String>,
}

impl RunRef {
    /// `None` unless `id` is a run id (digits); an attempt that is not digits is left out. What
    /// is read back from memory goes through here too, so a forged marker says nothing else.
    pub fn new(id: &str, attempt: Option<&str>) -> Option<RunRef> {
        let digits = |s: &str, max: usize| {
            (!s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.to_string())
        };
        Some(RunRef {
            id: digits(id, 20)?,
            attempt: attempt.and_then(|a| digits(a, 6)),
        })
    }
}

/// One call whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCall {
    pub part_id: String,
    pub call_id: Option<String>,
    pub tool: String,
    /// The command's first line, or the input's JSON; at most [`SUMMARY_CHARS`] characters (and
    /// `…` when something was left out), no control characters.
    pub input: String,
    pub left: LeftAs,
}

/// One answer of a turn cut short, as repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutTurn {
    pub session_id: String,
    pub message_id: String,
    pub reason: Interruption,
    pub calls: Vec<UnknownCall>,
    /// A newer message follows it in its session: a later turn went on past it.
    pub superseded: bool,
}

/// What one repair did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    pub turns: Vec<CutTurn>,
    /// More answers (or calls of one answer) needed repair than one pass does.
    pub limited: bool,
}

impl RepairReport {
    pub fn calls(&self) -> usize {
        self.turns.iter().map(|t| t.calls.len()).sum()
    }
}

/// A repair as the summary reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairOutcome {
    Repaired(RepairReport),
    /// The database could not be read or written; it is as it was.
    Failed {
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("cannot open the session database: {0}")]
    Open(#[source] rusqlite::Error),
    #[error("the session database has no {0} table as OpenCode 1.18 writes it")]
    Schema(&'static str),
    #[error("cannot repair the session database: {0}")]
    Sql(#[from] rusqlite::Error),
}

/// Repairs `db` (absent: nothing to repair). See [`repair`].
pub fn repair_path(
    db: &Path,
    scope: Scope<'_>,
    reason: Interruption,
) -> Result<RepairReport, RepairError> {
    repair_path_in(db, scope, reason, None)
}

/// [`repair_path`], recording `run` (the run the turn was cut in) beside each repaired answer.
fn repair_path_in(
    db: &Path,
    scope: Scope<'_>,
    reason: Interruption,
    run: Option<&RunRef>,
) -> Result<RepairReport, RepairError> {
    if !db.is_file() {
        return Ok(RepairReport::default());
    }
    let mut conn = open(db, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    repair_in(&mut conn, scope, reason, run)
}

/// Repairs every answer in `scope` that a cut turn left: without `time.completed`, or aborted
/// (OpenCode's `MessageAbortedError`, which only fro-bot's abort causes) and not repaired yet. One
/// transaction; every row written is found by its own columns and written with bound parameters.
pub fn repair(
    conn: &mut Connection,
    scope: Scope<'_>,
    reason: Interruption,
) -> Result<RepairReport, RepairError> {
    repair_in(conn, scope, reason, None)
}

/// [`repair`] by the run the turn was cut in (`run`), which each repaired answer records.
pub fn repair_in(
    conn: &mut Connection,
    scope: Scope<'_>,
    reason: Interruption,
    run: Option<&RunRef>,
) -> Result<RepairReport, RepairError> {
    harden(conn).map_err(RepairError::Open)?;
    rows::check_schema(conn)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let sessions = rows::sessions(&tx, scope)?;
    let (found, mut limited) = rows::cut_messages(&tx, sessions.as_deref())?;
    let mut report = RepairReport::default();
    for message in found {
        let (parts, more) = rows::tool_parts(&tx, &message)?;
        limited |= more;
        let cut = write::repair_message(&tx, &message, &parts, (reason, run))?;
        report.turns.extend(cut);
    }
    tx.commit()?;
    report.limited = limited;
    Ok(report)
}

/// After the restore (and its sanitizer), before OpenCode starts: every session of restored
/// memory, off the async runtime. Whatever it finds, an earlier run left.
pub async fn after_restore(db: PathBuf) -> RepairOutcome {
    let task = tokio::task::spawn_blocking(move || {
        repair_path(&db, Scope::Whole, Interruption::EarlierRun)
    });
    outcome(task.await)
}

/// After fro-bot stopped a turn and OpenCode: the run's own session trees, off the runtime; `run`
/// (this run) is recorded beside each answer, for the next run's notice.
pub async fn after_turn(
    db: PathBuf,
    sessions: Vec<String>,
    reason: Interruption,
    run: Option<RunRef>,
) -> RepairOutcome {
    let task = tokio::task::spawn_blocking(move || {
        let ids: Vec<&str> = sessions.iter().map(String::as_str).collect();
        repair_path_in(&db, Scope::Trees(&ids), reason, run.as_ref())
    });
    outcome(task.await)
}

fn outcome(
    joined: Result<Result<RepairReport, RepairError>, tokio::task::JoinError>,
) -> RepairOutcome {
    let outcome = match joined {
        Ok(Ok(report)) => RepairOutcome::Repaired(report),
        Ok(Err(e)) => RepairOutcome::Failed {
            message: e.to_string(),
        },
        Err(e) => RepairOutcome::Failed {
            message: format!("the repair task failed: {e}"),
        },
    };
    match &outcome {
        RepairOutcome::Repaired(r) if r.turns.is_empty() => {}
        RepairOutcome::Repaired(r) => tracing::info!("{}", describe(r)),
        RepairOutcome::Failed { message } => {
            crate::runner::log::warning(&format!("a turn cut short was not repaired: {message}"))
        }
    }
    outcome
}

/// The summary's one line for the repairs of a run, when there is something to say.
pub fn summary_line(outcomes: &[RepairOutcome]) -> Option<String> {
    let lines: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match o {
            RepairOutcome::Repaired(r) if r.turns.is_empty() => None,
            RepairOutcome::Repaired(r) => Some(describe(r)),
            RepairOutcome::Failed { message } => {
                Some(format!("a turn cut short could not be repaired: {message}"))
            }
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// "repaired a turn cut short (why): the turn was kept; its last command's outcome is unknown".
fn describe(report: &RepairReport) -> String {
    let turns = match report.turns.len() {
        1 => "a turn cut short".to_string(),
        n => format!("{n} answers cut short"),
    };
    let mut reasons: Vec<&str> = report.turns.iter().map(|t| t.reason.describe()).collect();
    reasons.dedup();
    let more = if report.limited {
        " (more are left for the next run)"
    } else {
        ""
    };
    format!(
        "repaired {turns} ({}): {}{more}",
        reasons.join(", "),
        text::kept(report)
    )
}

pub(super) fn open(db: &Path, flags: OpenFlags) -> Result<Connection, RepairError> {
    let conn = Connection::open_with_flags(db, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(RepairError::Open)?;
    Ok(conn)
}

/// Restored memory may hold triggers (which an update would fire) and views: off, like every
/// connection that reads memory (`merge`).
pub(super) fn harden(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_VIEW, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    // Only `data` is written: no key changes, and keys restored memory breaks are not ours to judge.
    conn.pragma_update(None, "foreign_keys", false)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(())
}
