//! Named kill points for crash tests: with `FRO_BOT_FAILPOINT=<name>` in the environment, the
//! process SIGKILLs itself when it reaches that point, exactly as the runner kills a container
//! that overran its cancel budget. Unset (always, outside tests), a check is one load of a
//! cached `Option`.

use std::sync::OnceLock;

use super::env::FRO_BOT_FAILPOINT;

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            std::env::var(FRO_BOT_FAILPOINT)
                .ok()
                .filter(|v| !v.is_empty())
        })
        .as_deref()
}

/// Dies here if this point is armed.
pub fn hit(name: &str) {
    if armed() == Some(name) {
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
