//! Transient faults of GitHub calls, retried (docs/design.md#the-github-surface). GitHub answers a
//! share of calls with 5xx, and a busy client with a secondary rate limit (403 or 429 with
//! `Retry-After`, or `x-ratelimit-remaining: 0` with `x-ratelimit-reset`). Every call goes through
//! `GitHub::call` ([`Retrier::call`]): a refusal (rate limit, or no connection made) is resent after the wait GitHub
//! asks for; an answer that leaves the outcome unknown (5xx, a connection lost) is resent only by a
//! call that may be repeated ([`Resend::Free`]: reads and idempotent writes). A write that could be
//! doubled ([`Resend::Refused`]) gets the error back and looks itself up before trying again
//! ([`Retrier::create_once`]). Waits back off (1 s, 2 s, 4 s by default), each at most
//! [`Pacing::max_wait`] and all of a run's together at most [`Pacing::budget`]; what GitHub asks
//! for beyond that is not waited for. Time comes from the [`Pacing`], so tests do not wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::runner::{env, Env};

/// Sleeps for the given time (injected: tests record the waits instead of sleeping).
pub type Sleep = Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;
/// Seconds since the epoch (for `x-ratelimit-reset`).
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// How transient faults are waited out.
#[derive(Clone)]
pub struct Pacing {
    /// The first wait when GitHub names none; doubled for each later one.
    pub base: Duration,
    /// The longest one wait: GitHub asking for more (a primary limit resetting in 40 min) is an
    /// error at once.
    pub max_wait: Duration,
    /// All waits of the run together.
    pub budget: Duration,
    /// Tries of one call, the first included.
    pub attempts: u32,
    sleep: Sleep,
    clock: Clock,
}

impl std::fmt::Debug for Pacing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacing")
            .field("base", &self.base)
            .field("max_wait", &self.max_wait)
            .field("budget", &self.budget)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            base: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
            budget: Duration::from_secs(180),
            attempts: 4,
            sleep: Arc::new(|d| Box::pin(tokio::time::sleep(d))),
            clock: Arc::new(|| crate::runner::now_ms() / 1000),
        }
    }
}

impl Pacing {
    /// The default, with `FRO_BOT_GITHUB_BACKOFF_MS` as the first wait (tests shorten it).
    pub fn from_env(env: &Env) -> Pacing {
        let base = env
            .get(env::FRO_BOT_GITHUB_BACKOFF_MS)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        Pacing {
            base: base.unwrap_or(Pacing::default().base),
            ..Pacing::default()
        }
    }

    /// Waits through `sleep` instead of the timer.
    pub fn with_sleep(self, sleep: Sleep) -> Pacing {
        Pacing { sleep, ..self }
    }

    /// Reads the time from `clock` (epoch seconds).
    pub fn with_clock(self, clock: Clock) -> Pacing {
        Pacing { clock, ..self }
    }
}

/// Whether a call may be sent again when its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// A read, or a write whose repetition changes nothing (an edit, a reaction, a label).
    Free,
    /// A write a repetition could double: only a refused request is sent again.
    Refused,
}

/// What an error says about sending the request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// GitHub did not act on it (a rate limit, no connection made): safe to send again, after
    /// `wait` when GitHub named one.
    Refused { wait: Option<Duration> },
    /// It may or may not have taken effect (5xx, the connection lost).
    Unknown { wait: Option<Duration> },
    /// Not transient.
    Final,
}

/// Retries and waits of the run, shared by every clone of the client.
#[derive(Debug, Default)]
struct Tally {
    retries: AtomicU64,
    waited_ms: AtomicU64,
}

/// What a client retries with: its [`Pacing`] and the run's tally.
#[derive(Debug, Clone, Default)]
pub struct Retrier {
    pub(crate) pacing: Pacing,
    tally: Arc<Tally>,
}

fn header<'a>(headers: Option<&'a http::HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get(name)?.to_str().ok().map(str::trim)
}

/// What `err` says, `now` in epoch seconds (for `x-ratelimit-reset`).
pub fn classify(err: &octocrab::Error, now: u64) -> Fault {
    match err {
        octocrab::Error::GitHub { source, .. } => {
            let headers = source.headers.as_ref();
            let retry_after = header(headers, "retry-after")
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_secs);
            let exhausted = header(headers, "x-ratelimit-remaining") == Some("0");
            let reset = header(headers, "x-ratelimit-reset")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|at| Duration::from_secs(at.saturating_sub(now).max(1)));
            let status = source.status_code.as_u16();
            let secondary = source.message.to_ascii_lowercase().contains("rate limit");
            match status {
                429 => Fault::Refused {
                    wait: retry_after.or(reset),
                },
                403 if retry_after.is_some() => Fault::Refused { wait: retry_after },
                403 if exhausted && reset.is_some() => Fault::Refused { wait: reset },
                403 if secondary => Fault::Refused { wait: None },
                500 | 502 | 503 | 504 => Fault::Unknown { wait: retry_after },
                _ => Fault::Final,
            }
        }
        octocrab::Error::Hyper { .. } | octocrab::Error::Service { .. } => {
            match connection_refused(err) {
                true => Fault::Refused { wait: None },
                false => Fault::Unknown { wait: None },
            }
        }
        _ => Fault::Final,
    }
}

/// No connection was made: the request never reached GitHub.
fn connection_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            return r.is_connect();
        }
        next = e.source();
    }
    false
}

impl Retrier {
    /// The retries this client (and its clones) made so far, and how long they waited.
    pub fn retries(&self) -> (u64, Duration) {
        let t = &self.tally;
        (
            t.retries.load(Ordering::Relaxed),
            Duration::from_millis(t.waited_ms.load(Ordering::Relaxed)),
        )
    }

    /// Runs `attempt`, sending it again on a transient fault as `resend` allows, each time after
    /// its wait, while the tries and the run's budget last. The last error is returned.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        resend: Resend,
        mut attempt: F,
    ) -> Result<T, octocrab::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, octocrab::Error>>,
    {
        let mut tries = 1;
        loop {
            let err = match attempt().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let wait = match (classify(&err, (self.pacing.clock)()), resend) {
                (Fault::Refused { wait }, _) | (Fault::Unknown { wait }, Resend::Free) => wait,
                (Fault::Unknown { .. }, Resend::Refused) | (Fault::Final, _) => return Err(err),
            };
            if !self.backoff(tries, wait).await {
                return Err(err);
            }
            tries += 1;
        }
    }

    /// Waits before try `tries + 1` (GitHub's `wait`, else the backoff), counting it; `false` when
    /// the tries or the run's budget are spent, or GitHub asks for longer than one wait may be.
    async fn backoff(&self, tries: u32, wait: Option<Duration>) -> bool {
        let p = &self.pacing;
        if tries >= p.attempts {
            return false;
        }
        let wait = wait.unwrap_or_else(|| p.base.saturating_mul(1 << (tries - 1).min(16)));
        let waited = Duration::from_millis(self.tally.waited_ms.load(Ordering::Relaxed));
        if wait > p.max_wait || waited + wait > p.budget {
            return false;
        }
        self.tally.retries.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.tally.waited_ms.fetch_add(ms, Ordering::Relaxed);
        tracing::info!("GitHub: transient fault; trying again in {wait:?}");
        (p.sleep)(wait).await;
        true
    }

    /// A write a repetition could double (a comment, a pull request, a review): sent once; when
    /// its outcome is unknown, after the wait `lookup` asks GitHub whether it took effect (fro-bot's
    /// marker, the head branch, the body) and only when it did not is it sent again. A look-up
    /// that fails ends it with the write's error: never a second write blind.
    pub(crate) async fn create_once<T, E, F, Fut, L, LFut>(
        &self,
        mut attempt: F,
        mut lookup: L,
    ) -> Result<T, octocrab::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, octocrab::Error>>,
        L: FnMut() -> LFut,
        LFut: Future<Output = Result<Option<T>, E>>,
        E: std::fmt::Display,
    {
        let mut tries = 1;
        loop {
            let err = match self.call(Resend::Refused, &mut attempt).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let Fault::Unknown { wait } = classify(&err, (self.pacing.clock)()) else {
                return Err(err);
            };
            if !self.backoff(tries, wait).await {
                return Err(err);
            }
            tries += 1;
            match lookup().await {
                Ok(Some(found)) => {
                    tracing::info!("GitHub: the write took effect before its answer was lost");
                    return Ok(found);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("cannot tell whether the write took effect ({e}); not repeated");
                    return Err(err);
                }
            }
        }
    }
}
