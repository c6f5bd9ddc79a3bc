//! Cancellation by signal. In the container the binary is PID 1, so nothing handles SIGINT/SIGTERM
//! unless we do. On cancel the runner sends SIGINT, SIGTERM 7.5 s later, and kills 2.5 s after that:
//! the phases observe the token, stop the agent, and persist within what is left of that budget.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// From SIGINT the runner kills the container after 7.5 s + 2.5 s.
pub const SIGINT_BUDGET: Duration = Duration::from_millis(10_000);
/// From SIGTERM alone (e.g. `docker stop` or the second stage) only the last 2.5 s remain.
pub const SIGTERM_BUDGET: Duration = Duration::from_millis(2_500);
/// Kept back from the budget for writing state and exiting.
const MARGIN: Duration = Duration::from_millis(800);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
}

/// Shared, cheaply cloned view of "has the run been cancelled, and how long is left".
#[derive(Debug, Clone, Default)]
pub struct Cancellation {
    token: CancellationToken,
    first: Arc<Mutex<Option<(Signal, Instant)>>>,
}

impl Cancellation {
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs SIGINT/SIGTERM handlers that cancel this token. Must run inside the tokio runtime.
    pub fn install_signal_handlers(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let which = tokio::select! {
                    _ = int.recv() => Signal::Interrupt,
                    _ = term.recv() => Signal::Terminate,
                };
                tracing::warn!("received {which:?}: stopping the agent and saving memory");
                this.cancel_with(which, Instant::now());
            }
        });
        Ok(())
    }

    /// Records the first signal (later ones only shorten nothing: the first sets the clock).
    pub fn cancel_with(&self, signal: Signal, at: Instant) {
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some((signal, at));
        } else if let Some((Signal::Interrupt, t0)) = *first {
            // SIGTERM after SIGINT: the kill comes 2.5 s from now at the latest.
            if signal == Signal::Terminate && at + SIGTERM_BUDGET < t0 + SIGINT_BUDGET {
                *first = Some((Signal::Terminate, at));
            }
        }
        self.token.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The instant by which persistence must be done, once a signal arrived.
    pub fn deadline(&self) -> Option<Instant> {
        let first = *self.first.lock().unwrap_or_else(|e| e.into_inner());
        first.map(|(signal, at)| {
            let budget = match signal {
                Signal::Interrupt => SIGINT_BUDGET,
                Signal::Terminate => SIGTERM_BUDGET,
            };
            at + budget.saturating_sub(MARGIN)
        })
    }

    /// Time left before the runner kills us, or `None` when not cancelled.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Runs `fut` to completion, unless the run is cancelled and the runner's kill deadline passes
    /// first (then `None`): a signal must not abort the save, but the save must not outlive the
    /// kill.
    pub async fn within_budget<T>(&self, fut: impl std::future::Future<Output = T>) -> Option<T> {
        let deadline = async {
            self.cancelled().await;
            // Re-read every 100 ms: a SIGTERM after the SIGINT shortens what is left.
            while let Some(d) = self.deadline() {
                if Instant::now() >= d {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            out = fut => Some(out),
            () = deadline => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_follows_the_first_signal_and_a_later_sigterm() {
        let c = Cancellation::new();
        assert!(c.deadline().is_none());
        let t0 = Instant::now();
        c.cancel_with(Signal::Interrupt, t0);
        assert!(c.is_cancelled());
        assert_eq!(c.deadline(), Some(t0 + SIGINT_BUDGET - MARGIN));
        // SIGTERM 7.5 s later leaves 2.5 s: same end, not extended.
        let t1 = t0 + Duration::from_millis(7_500);
        c.cancel_with(Signal::Terminate, t1);
        assert_eq!(c.deadline(), Some(t0 + SIGINT_BUDGET - MARGIN));
        // An early SIGTERM shortens the budget.
        let c = Cancellation::new();
        c.cancel_with(Signal::Interrupt, t0);
        c.cancel_with(Signal::Terminate, t0 + Duration::from_secs(1));
        assert_eq!(
            c.deadline(),
            Some(t0 + Duration::from_secs(1) + SIGTERM_BUDGET - MARGIN)
        );
    }
}
