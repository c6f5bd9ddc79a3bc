//! Same thread, one at a time (docs/design.md#same-thread-one-at-a-time): with the object store,
//! a run on an issue, pull request or discussion takes that thread's turn — a lease of its own at
//! `locks/thread-{hash}.json` — before it restores, so it sees the exchange an earlier run on the
//! thread is still having, and keeps it until its memory is published. It waits at most
//! `thread-wait`; runs on other threads never wait for it. Without the store there is nothing
//! shared to coordinate through (the README's `concurrency:` recipe is the way there).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease::{self, AcquireOutcome, Lease, LeaseConfig, LeaseHandle};
use crate::memory::ledger::PostLease;
use crate::phases::run_context::Admitted;
use crate::phases::tracking_comment::Tracker;
use crate::runner::{log, FileCommands};

/// Whether this run may go on, and on what terms.
#[derive(Debug)]
pub(crate) enum ThreadTurn {
    /// Nothing to wait for: no store, no thread (schedule, dispatch), or `thread-wait: 0`.
    NotNeeded,
    /// This run's turn, held (and renewed) until its memory is published.
    Taken {
        turn: HeldTurn,
        waited: Duration,
        waits: u32,
    },
    /// The store could not be asked: the run goes on without its turn (its memory is still
    /// merged with whatever the other run publishes).
    Unknown { message: String },
    /// The run was cancelled before or while it waited: it ends without restoring or saving.
    Cancelled,
    /// Another run kept the thread for all of `thread-wait`: this one does not run.
    NotOurs { holder_id: String, waited: Duration },
}

/// A held turn and the task that keeps post's copy of its ETag current.
#[derive(Debug)]
pub(crate) struct HeldTurn {
    handle: LeaseHandle,
    watch: tokio::task::JoinHandle<()>,
}

/// What the tracking comment says while the run waits for its turn.
pub(crate) const WAITING: &str = "waiting for an earlier run on this thread to finish";

/// Whether this run takes a turn on its thread: with the store, `thread-wait` set and a thread
/// (not a schedule or dispatch run). Without one, nothing orders its restore after other runs.
pub(crate) fn needed(ctx: &Admitted) -> bool {
    ctx.store.is_some() && ctx.settings.thread_wait.is_some() && ctx.plan.thread.is_some()
}

/// Takes the thread's turn, waiting for an earlier run on the thread as long as `thread-wait`;
/// while it waits, the tracking comment (if any) says so.
pub(crate) async fn take(ctx: &Admitted, tracker: Option<&Tracker>) -> ThreadTurn {
    let (Some(store), Some(wait)) = (&ctx.store, ctx.settings.thread_wait) else {
        return ThreadTurn::NotNeeded;
    };
    if !needed(ctx) {
        return ThreadTurn::NotNeeded;
    }
    if ctx.cancel.is_cancelled() {
        return ThreadTurn::Cancelled;
    }
    let key = store.keys.thread_lease(ctx.plan.logical_key.as_str());
    let started = Instant::now();
    let config = LeaseConfig::default();
    let clock: Arc<dyn lease::Clock> = Arc::new(lease::SystemClock);
    let holder = &ctx.lease_holder;
    let asked = async {
        match Lease::acquire(&store.store, &key, holder, config, clock.clone()).await {
            AcquireOutcome::HeldByOther { .. } => {}
            at_once => return (at_once, 0),
        }
        if let Some(tracker) = tracker {
            tracker.show_step(Some(WAITING)).await;
        }
        let left = wait.saturating_sub(started.elapsed());
        let stop = ctx.cancel.token();
        let (outcome, waits) =
            Lease::acquire_waiting(&store.store, &key, holder, config, clock, left, stop).await;
        if let (Some(tracker), AcquireOutcome::Acquired(_)) = (tracker, &outcome) {
            tracker.show_step(None).await;
        }
        (outcome, waits + 1)
    };
    // A signal ends the wait (not an ask in flight, which could leave the turn taken with nobody
    // to give it back), and an ask that outlives the cancel deadline is abandoned.
    let Some((outcome, waits)) = ctx.cancel.within_budget(asked).await else {
        return ThreadTurn::Cancelled;
    };
    let waited = started.elapsed();
    match outcome {
        AcquireOutcome::Acquired(handle) => {
            if waits > 0 {
                tracing::info!(
                    "took this thread's turn after waiting {} s for an earlier run",
                    waited.as_secs()
                );
            }
            let watch = PostLease::THREAD.keep_for_post(&ctx.files, &handle);
            ThreadTurn::Taken {
                turn: HeldTurn { handle, watch },
                waited,
                waits,
            }
        }
        AcquireOutcome::HeldByOther { .. } if ctx.cancel.is_cancelled() => ThreadTurn::Cancelled,
        AcquireOutcome::HeldByOther { holder_id, .. } => {
            let holder_id = shown_holder(&holder_id);
            log::warning(&format!(
                "another run ({holder_id}) kept this thread for {} s (thread-wait): this run does not start",
                waited.as_secs()
            ));
            ThreadTurn::NotOurs { holder_id, waited }
        }
        AcquireOutcome::Error { error } => {
            let message = error.to_string();
            log::warning(&format!(
                "cannot ask whether another run is on this thread (going on without waiting): {message}"
            ));
            ThreadTurn::Unknown { message }
        }
    }
}

impl ThreadTurn {
    /// The summary's line about the turn, when there is something to say.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            ThreadTurn::NotNeeded => None,
            ThreadTurn::Taken { waits: 0, .. } => None,
            ThreadTurn::Taken { waited, .. } => Some(format!(
                "waited {} s for an earlier run on this thread, so this run saw its exchange",
                waited.as_secs()
            )),
            ThreadTurn::Unknown { message } => Some(format!(
                "did not wait for other runs on this thread ({message}); memory is merged all the same"
            )),
            ThreadTurn::Cancelled => Some(
                "cancelled while it waited for an earlier run on this thread: nothing was restored or saved"
                    .into(),
            ),
            ThreadTurn::NotOurs { holder_id, waited } => Some(format!(
                "did not run: {holder_id} kept this thread for {} s",
                waited.as_secs()
            )),
        }
    }

    /// Gives the turn back (after the publish), so the next run on the thread starts.
    pub(crate) async fn release(self, files: &FileCommands) {
        let ThreadTurn::Taken { turn, .. } = self else {
            return;
        };
        turn.watch.abort();
        match turn.handle.release().await {
            lease::ReleaseOutcome::Released => PostLease::THREAD.clear(files),
            lease::ReleaseOutcome::NotHeld => {}
            // Post releases it from the state, or it expires by itself.
            lease::ReleaseOutcome::Failed { error } => {
                tracing::warn!("cannot give back this thread's turn: {error}")
            }
        }
    }
}

/// The one reply of a run that did not get its turn.
pub(crate) fn not_our_turn_text(holder_id: &str, waited: Duration) -> String {
    format!(
        "I could not take my turn here: an earlier run on this thread (`{}`) was still working after {} s. Mention me again once it has answered.",
        shown_holder(holder_id),
        waited.as_secs()
    )
}

/// A holder id as read from the store, fit for a comment and the summary: anyone who can write
/// the store can write it, so only the characters of `action:{run}:{attempt}:{identity}` are
/// kept (no markdown, mention or line break), and at most 100 of them.
fn shown_holder(id: &str) -> String {
    id.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.'))
        .take(100)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_id_from_the_store_cannot_write_markdown_or_mention_anyone() {
        let text = not_our_turn_text(
            "action:1:1`\n\n# Pwned @octocat <img src=x>[link](https://evil)",
            Duration::from_secs(300),
        );
        assert!(
            text.contains("(`action:1:1Pwnedoctocatimgsrcxlinkhttps:evil`)"),
            "{text}"
        );
        assert!(!text.contains('@') && !text.contains('\n') && !text.contains('#'));
        assert!(text.contains("after 300 s"));
        assert_eq!(shown_holder(&"a".repeat(500)).len(), 100);
        assert_eq!(
            shown_holder("action:42:2:build-m0a1b2c3d"),
            "action:42:2:build-m0a1b2c3d"
        );
    }
}
