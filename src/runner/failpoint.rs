//! Named points for crash and cancel tests. With `FRO_BOT_FAILPOINT=<name>` in the environment,
//! the process SIGKILLs itself when it reaches that point, exactly as the runner kills a container
//! that overran its cancel budget. With `FRO_BOT_PAUSEPOINT=<name>` it says so on stdout when it
//! reaches that point and holds there until a signal cancels the run, so a test signals at a known
//! point instead of after a guessed delay. Unset (always, outside tests), a check is one load of a
//! cached `Option`.

use std::sync::OnceLock;
use std::time::Duration;

use super::cancel::Cancellation;
use super::env::{FRO_BOT_FAILPOINT, FRO_BOT_PAUSEPOINT};

/// What a pause point prints, followed by its name: the test signals once it reads this.
pub const PAUSED_AT: &str = "fro-bot paused at ";
/// A test that never signals does not hang the step for ever.
const PAUSE_LIMIT: Duration = Duration::from_secs(120);

fn armed(var: &str, cell: &'static OnceLock<Option<String>>) -> Option<&'static str> {
    cell.get_or_init(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Dies here if this point is armed.
pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    if armed(FRO_BOT_FAILPOINT, &ARMED) == Some(name) {
        // SAFETY: getpid(2), kill(2) on our own pid and _exit(2) have no memory-safety
        // preconditions.
        unsafe {
            // As a container's PID 1 (the action's image) a signal we send ourselves is ignored
            // (pid_namespaces(7)); end as abruptly, with the status a SIGKILL leaves.
            if libc::getpid() == 1 {
                libc::_exit(128 + libc::SIGKILL);
            }
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Holds here until `cancel` fires, if this point is armed; the step goes on from here as it
/// would after a signal that arrived at this moment.
pub async fn pause(name: &str, cancel: &Cancellation) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    if armed(FRO_BOT_PAUSEPOINT, &ARMED) == Some(name) {
        super::log::print(&format!("{PAUSED_AT}{name}"));
        if tokio::time::timeout(PAUSE_LIMIT, cancel.cancelled())
            .await
            .is_err()
        {
            tracing::warn!("pause point {name}: no signal came; going on");
        }
    }
}
