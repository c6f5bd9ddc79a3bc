//! One agent turn: subscribe to `/event` (and see `server.connected`) before `prompt_async`, wait
//! for `session.idle`, bounded by the run's timeout and cancellation (both abort the session), and
//! classify failures:
//! - quota exhaustion and provider auth errors are terminal. OpenCode itself retries a 429 quota
//!   error five times over about a minute (`session.status` `retry`): the quota text in a retry
//!   status ends the turn at once instead;
//! - context overflow (what is left after OpenCode's own compaction failed) archives the session and
//!   starts a fresh one with the same title and the same prompt, once;
//! - a provider OpenCode cannot connect to ends the turn at its third retry (6-12 s in), instead
//!   of the ~100 s of OpenCode's retries times fro-bot's attempts: an address that refuses or does
//!   not resolve three times running is a configuration to fix, not a blip;
//! - any other provider error is retried, up to 3 attempts in all, with a continuation prompt that
//!   names the error.

use std::time::Duration;

use tokio::time::Instant;

use super::client::{
    ApiError, Client, Message, ModelSpec, NamedError, PromptBody, Session, Tokens,
};
use super::events::{Event, EventStream, SessionStatus};
use super::progress::ProgressSink;
use crate::runner::{log, Cancellation};

pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
const CONNECT_WAIT: Duration = Duration::from_secs(10);
const ABORT_WAIT: Duration = Duration::from_secs(5);
const RECONNECTS: u32 = 5;
const SETTLE_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The key proxy refused the request at the run's spend cap.
    Capped,
    Quota,
    ProviderAuth,
    ContextOverflow,
    Aborted,
    /// The provider could not be reached at all (after OpenCode's own retries).
    Unreachable,
    /// Rate limits, 5xx, anything else: worth another attempt.
    Provider,
}

/// Words providers use for an exhausted quota or balance (not a rate limit, which passes).
const QUOTA_MARKERS: &[&str] = &[
    "insufficient_quota",
    "exceeded your current quota",
    "quota exceeded",
    "exceeded the quota",
    "billing",
    "credit balance is too low",
    "insufficient credits",
    "insufficient balance",
];

const AUTH_MARKERS: &[&str] = &[
    "invalid_api_key",
    "incorrect api key",
    "invalid x-api-key",
    "authentication_error",
    "unauthorized",
];

/// OpenCode's words when the provider's address cannot be reached (refused, no route, no such
/// host): "Cannot connect to API: Unable to connect. Is the computer able to access the url?"; and
/// fro-bot's key proxy's 502 when it cannot reach the provider.
const UNREACHABLE_MARKERS: &[&str] = &[
    "cannot connect to api",
    "unable to connect",
    crate::confine::key_proxy::UNREACHABLE,
];

/// OpenCode's retry that ends the turn when the provider still cannot be reached.
const UNREACHABLE_RETRIES: u64 = 3;

pub fn is_unreachable_text(text: &str) -> bool {
    let t = text.to_lowercase();
    UNREACHABLE_MARKERS.iter().any(|m| t.contains(m))
}

pub fn is_quota_text(text: &str) -> bool {
    let t = text.to_lowercase();
    QUOTA_MARKERS.iter().any(|m| t.contains(m))
}

pub fn classify(e: &NamedError) -> ErrorClass {
    let text = format!(
        "{} {}",
        e.data["message"].as_str().unwrap_or(""),
        e.data["responseBody"].as_str().unwrap_or("")
    );
    match e.name.as_str() {
        "ContextOverflowError" => ErrorClass::ContextOverflow,
        "ProviderAuthError" => ErrorClass::ProviderAuth,
        "MessageAbortedError" => ErrorClass::Aborted,
        _ if text.contains(crate::confine::key_proxy::CAPPED) => ErrorClass::Capped,
        _ if is_quota_text(&text) => ErrorClass::Quota,
        _ if is_unreachable_text(&text) => ErrorClass::Unreachable,
        _ if matches!(e.data["statusCode"].as_u64(), Some(401 | 403)) => ErrorClass::ProviderAuth,
        _ if AUTH_MARKERS.iter().any(|m| text.to_lowercase().contains(m)) => {
            ErrorClass::ProviderAuth
        }
        _ => ErrorClass::Provider,
    }
}

/// The prompt for a retry after a provider error.
pub fn continuation_prompt(error: &str) -> String {
    format!(
        "The previous attempt at this task stopped with a provider error: {error}\n\
         Continue the task from where it stopped. Do not repeat steps that already completed; \
         finish the remaining work and give your final answer."
    )
}

#[derive(Debug, Clone, PartialEq)]
pub enum TurnFailure {
    Quota {
        message: String,
    },
    ProviderAuth {
        message: String,
    },
    /// Still too large in a fresh session.
    ContextOverflow {
        message: String,
    },
    /// Provider errors on every attempt.
    Provider {
        message: String,
    },
    /// OpenCode could not connect to the provider, retry after retry.
    Unreachable {
        message: String,
    },
    /// The turn ended without any assistant message.
    NoReply,
    /// The OpenCode API itself failed (server gone, unexpected answer).
    Api {
        message: String,
    },
    /// No model can be called (no credentials, unknown model): found before the turn started.
    NoUsableModel {
        message: String,
    },
}

impl std::fmt::Display for TurnFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TurnFailure::Quota { message } => {
                write!(f, "the provider's quota is exhausted ({message})")
            }
            TurnFailure::NoUsableModel { message } => write!(f, "no usable model: {message}"),
            TurnFailure::ProviderAuth { message } => {
                write!(f, "the provider rejected the credentials ({message})")
            }
            TurnFailure::ContextOverflow { message } => {
                write!(
                    f,
                    "the conversation is too large even in a fresh session ({message})"
                )
            }
            TurnFailure::Provider { message } => {
                write!(f, "the provider failed on every attempt ({message})")
            }
            TurnFailure::Unreachable { message } => write!(
                f,
                "the provider could not be reached ({message}): check its base URL in `opencode-config` and that the runner can reach it (a runner proxy: `HTTPS_PROXY`)"
            ),
            TurnFailure::NoReply => f.write_str("the turn ended without an answer"),
            TurnFailure::Api { message } => write!(f, "the OpenCode API failed ({message})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum TurnOutcome {
    Completed,
    TimedOut,
    /// The key proxy refused a request at the run's spend cap: the line that says so ("stopped
    /// at the spend cap: $0.52 of $0.50").
    Capped {
        line: String,
    },
    Cancelled,
    Failed(TurnFailure),
}

#[derive(Debug, Clone, PartialEq)]
pub struct AssistantReply {
    pub message_id: String,
    /// `provider/model` of the answering model, when OpenCode says.
    pub model: Option<String>,
    pub text: String,
    pub tokens: Tokens,
    pub cost: f64,
    pub error: Option<NamedError>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    pub outcome: TurnOutcome,
    /// The session the turn ended in (a fresh one after a context overflow).
    pub session: Session,
    /// The session archived after a context overflow, if any.
    pub replaced: Option<String>,
    /// Prompts sent (first attempt, continuations, the fresh-session restart).
    pub attempts: u32,
    /// The last assistant message of the turn.
    pub reply: Option<AssistantReply>,
    /// Tokens and cost over all the turn's assistant messages.
    pub tokens: Tokens,
    pub cost: f64,
    /// The tools the turn's assistant messages called, in order (one name per call).
    pub tools: Vec<String>,
    /// Every error observed, in order (sanitized).
    pub errors: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct TurnOptions {
    /// `None` = no deadline.
    pub timeout: Option<Duration>,
    pub agent: Option<String>,
    pub model: Option<ModelSpec>,
    pub max_attempts: u32,
    /// Milliseconds since the epoch (archiving stamps it).
    pub now_ms: fn() -> i64,
    /// Where the turn's live progress goes; `None` prints nothing.
    pub progress: Option<ProgressSink>,
    /// The run's spend meter: a request the key proxy refused at its cap ends the turn as the
    /// timeout does (`TurnOutcome::Capped`).
    pub spend: Option<std::sync::Arc<crate::confine::spend::Meter>>,
}

impl Default for TurnOptions {
    fn default() -> Self {
        Self {
            timeout: None,
            agent: None,
            model: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            now_ms: super::system_now_ms,
            progress: None,
            spend: None,
        }
    }
}

/// How one prompt ended.
enum AttemptEnd {
    /// `observed`: the last `session.error` for the session during the attempt.
    Idle {
        new: Vec<Message>,
        observed: Option<NamedError>,
    },
    QuotaRetry {
        message: String,
    },
    /// OpenCode's retries cannot reach the provider: the (sanitized) message.
    UnreachableRetry {
        message: String,
    },
    TimedOut,
    /// A request was refused at the spend cap: the cap's line.
    Capped {
        line: String,
    },
    Cancelled,
}

/// One turn in `session`: the prompt, then continuations and at most one fresh-session restart
/// as the replies' errors call for (their classes are in the module comment), until a reply
/// comes back without an error or the turn ends.
pub async fn run_turn(
    client: &Client,
    session: Session,
    prompt: &str,
    opts: &TurnOptions,
    cancel: &Cancellation,
) -> TurnReport {
    let deadline = opts.timeout.map(|t| Instant::now() + t);
    let mut report = TurnReport {
        outcome: TurnOutcome::Completed,
        session,
        replaced: None,
        attempts: 0,
        reply: None,
        tokens: Tokens::default(),
        cost: 0.0,
        tools: Vec::new(),
        errors: Vec::new(),
    };
    let mut text = prompt.to_string();
    let mut provider_attempts = 0u32;
    loop {
        report.attempts += 1;
        provider_attempts += 1;
        let end = attempt(client, &report.session.id, &text, opts, deadline, cancel).await;
        let end = match end {
            Ok(e) => e,
            Err(e) => {
                fail_api(&mut report, &e);
                return report;
            }
        };
        let Some((new, observed)) = answered(client, &mut report, end).await else {
            return report;
        };
        account(&mut report, &new);
        let Some(error) = failed_reply(&mut report, observed) else {
            return report;
        };
        match after_error(client, &mut report, &error, provider_attempts, opts).await {
            Next::Done => return report,
            Next::Continue(message) => text = continuation_prompt(&message),
            Next::Restart => {
                text = prompt.to_string();
                provider_attempts = 0;
            }
        }
    }
}

/// The new messages of an attempt that went idle, and the `session.error` it observed; else the
/// turn is over: a quota or unreachable retry, the deadline or a cancel stops the session and
/// records why.
async fn answered(
    client: &Client,
    report: &mut TurnReport,
    end: AttemptEnd,
) -> Option<(Vec<Message>, Option<NamedError>)> {
    let (outcome, error) = match end {
        AttemptEnd::Idle { new, observed } => return Some((new, observed)),
        AttemptEnd::QuotaRetry { message } => (
            TurnOutcome::Failed(TurnFailure::Quota {
                message: message.clone(),
            }),
            message,
        ),
        AttemptEnd::UnreachableRetry { message } => (
            TurnOutcome::Failed(TurnFailure::Unreachable {
                message: message.clone(),
            }),
            message,
        ),
        AttemptEnd::TimedOut => (TurnOutcome::TimedOut, "the turn timed out".into()),
        AttemptEnd::Capped { line } => (TurnOutcome::Capped { line: line.clone() }, line),
        AttemptEnd::Cancelled => (TurnOutcome::Cancelled, "the run was cancelled".into()),
    };
    stop(client, &report.session.id).await;
    report.errors.push(error);
    let stopped_mid_reply = matches!(
        outcome,
        TurnOutcome::TimedOut | TurnOutcome::Cancelled | TurnOutcome::Capped { .. }
    );
    report.outcome = outcome;
    // What the stopped session had written still counts.
    if stopped_mid_reply {
        collect_after_stop(client, report).await;
    }
    None
}

/// The error of the turn's last reply, to act on; `None` when the turn is over: no reply at all
/// (failed), or one without an error (completed).
fn failed_reply(report: &mut TurnReport, observed: Option<NamedError>) -> Option<NamedError> {
    // OpenCode reports idle before it stores the failed message's error: an empty reply after a
    // `session.error` failed with that error.
    if let (Some(r), Some(err)) = (report.reply.as_mut(), observed) {
        if r.error.is_none() && r.text.trim().is_empty() {
            r.error = Some(err);
        }
    }
    let Some(reply) = &report.reply else {
        report.outcome = TurnOutcome::Failed(TurnFailure::NoReply);
        return None;
    };
    let Some(error) = reply.error.clone() else {
        report.outcome = TurnOutcome::Completed;
        return None;
    };
    Some(error)
}

/// What the turn does after a reply that failed.
enum Next {
    /// The turn is over; the report holds its outcome.
    Done,
    /// Retry with a continuation prompt naming this (sanitized) error.
    Continue(String),
    /// Start over with the original prompt in the fresh session that replaced the overflowing one.
    Restart,
}

/// Records the reply's `error` and decides, by its class, whether and how the turn goes on.
async fn after_error(
    client: &Client,
    report: &mut TurnReport,
    error: &NamedError,
    provider_attempts: u32,
    opts: &TurnOptions,
) -> Next {
    let message = log::redact(&error.message());
    report.errors.push(format!("{}: {message}", error.name));
    match classify(error) {
        ErrorClass::Capped => {
            let line = opts.spend.as_ref().and_then(|m| m.reached());
            let line = line.unwrap_or_else(|| "stopped at the spend cap".into());
            report.outcome = TurnOutcome::Capped { line };
            Next::Done
        }
        ErrorClass::Quota => {
            report.outcome = TurnOutcome::Failed(TurnFailure::Quota { message });
            Next::Done
        }
        ErrorClass::ProviderAuth => {
            report.outcome = TurnOutcome::Failed(TurnFailure::ProviderAuth { message });
            Next::Done
        }
        ErrorClass::Unreachable => {
            report.outcome = TurnOutcome::Failed(TurnFailure::Unreachable { message });
            Next::Done
        }
        ErrorClass::ContextOverflow if report.replaced.is_none() => {
            match replace_session(client, report, opts).await {
                Ok(()) => Next::Restart,
                Err(e) => {
                    fail_api(report, &e);
                    Next::Done
                }
            }
        }
        ErrorClass::ContextOverflow => {
            report.outcome = TurnOutcome::Failed(TurnFailure::ContextOverflow { message });
            Next::Done
        }
        ErrorClass::Aborted | ErrorClass::Provider => {
            if provider_attempts >= opts.max_attempts.max(1) {
                report.outcome = TurnOutcome::Failed(TurnFailure::Provider { message });
                return Next::Done;
            }
            Next::Continue(message)
        }
    }
}

/// Archives the report's session and moves the report to a fresh one with the same title.
async fn replace_session(
    client: &Client,
    report: &mut TurnReport,
    opts: &TurnOptions,
) -> Result<(), ApiError> {
    let old = report.session.clone();
    client.archive_session(&old.id, (opts.now_ms)()).await?;
    report.session = client.create_session(&old.title).await?;
    report.replaced = Some(old.id);
    Ok(())
}

/// Ends the turn on a failure of the OpenCode API itself.
fn fail_api(report: &mut TurnReport, e: &ApiError) {
    let message = log::redact(&e.to_string());
    report.errors.push(message.clone());
    report.outcome = TurnOutcome::Failed(TurnFailure::Api { message });
}

/// Adds the new messages' usage to the report and takes the last assistant message as the reply.
fn account(report: &mut TurnReport, new: &[Message]) {
    let mut last = None;
    for m in new.iter().filter(|m| m.info.role == "assistant") {
        if let Some(t) = &m.info.tokens {
            report.tokens.add(t);
        }
        report.cost += m.info.cost.unwrap_or(0.0);
        let calls = m.parts.iter().filter(|p| p.kind == "tool");
        report
            .tools
            .extend(calls.map(|p| p.tool.clone().unwrap_or_else(|| "tool".into())));
        last = Some(m);
    }
    report.reply = last.map(|m| AssistantReply {
        message_id: m.info.id.clone(),
        model: match (&m.info.provider_id, &m.info.model_id) {
            (Some(p), Some(id)) => Some(format!("{p}/{id}")),
            _ => None,
        },
        text: m.plain_text(),
        tokens: m.info.tokens.clone().unwrap_or_default(),
        cost: m.info.cost.unwrap_or(0.0),
        error: m.info.error.clone(),
    });
}

/// After an abort: whatever the agent produced so far still counts (tokens, partial text). The
/// partial answer is the newest text the turn wrote: the step that was stopped may have none.
async fn collect_after_stop(client: &Client, report: &mut TurnReport) {
    if let Ok(msgs) = client.messages(&report.session.id, Some(50)).await {
        let last_user = msgs.iter().rposition(|m| m.info.role == "user");
        let new: Vec<Message> = match last_user {
            Some(i) => msgs[i + 1..].to_vec(),
            None => vec![],
        };
        account(report, &new);
        let said = new
            .iter()
            .rev()
            .filter(|m| m.info.role == "assistant")
            .map(Message::plain_text)
            .find(|t| !t.trim().is_empty());
        if let (Some(reply), Some(said)) = (report.reply.as_mut(), said) {
            if reply.text.trim().is_empty() {
                reply.text = said;
            }
        }
    }
}

async fn attempt(
    client: &Client,
    session_id: &str,
    text: &str,
    opts: &TurnOptions,
    deadline: Option<Instant>,
    cancel: &Cancellation,
) -> Result<AttemptEnd, ApiError> {
    // Already out of time or cancelled: start nothing.
    if cancel.is_cancelled() {
        return Ok(AttemptEnd::Cancelled);
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Ok(AttemptEnd::TimedOut);
    }
    if let Some(line) = opts.spend.as_ref().and_then(|m| m.reached()) {
        return Ok(AttemptEnd::Capped { line });
    }
    let events = subscribe(client).await?;
    let before = client.messages(session_id, None).await?.len();
    let mut body = PromptBody::text(text);
    body.agent = opts.agent.clone();
    body.model = opts.model.clone();
    client.prompt_async(session_id, &body).await?;

    let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let until = deadline.unwrap_or(far);
    let observed = match wait_for_idle(client, session_id, events, opts, until, cancel).await? {
        Wait::Idle { observed } => observed,
        Wait::Ended(end) => return Ok(end),
    };
    settle(client, session_id, before, observed).await
}

/// How the wait for the session's idle ended.
enum Wait {
    /// `observed` as in [`AttemptEnd::Idle`].
    Idle { observed: Option<NamedError> },
    /// The attempt ended without an idle.
    Ended(AttemptEnd),
}

/// Follows the session's events until it is idle, reconnecting when the stream drops.
async fn wait_for_idle(
    client: &Client,
    session_id: &str,
    mut events: EventStream,
    opts: &TurnOptions,
    until: Instant,
    cancel: &Cancellation,
) -> Result<Wait, ApiError> {
    let mut reconnects = 0;
    let mut observed: Option<NamedError> = None;
    loop {
        let next = tokio::select! {
            ev = events.next() => ev,
            _ = tokio::time::sleep_until(until) => return Ok(Wait::Ended(AttemptEnd::TimedOut)),
            _ = cancel.cancelled() => return Ok(Wait::Ended(AttemptEnd::Cancelled)),
            () = refused(opts) => return Ok(Wait::Ended(capped(opts))),
        };
        match next {
            Ok(Some(ev)) => {
                if ev.session_id() != Some(session_id) {
                    continue;
                }
                if let Some(progress) = &opts.progress {
                    progress.observe(&ev);
                }
                match on_event(ev, &mut observed) {
                    Seen::Idle => return Ok(Wait::Idle { observed }),
                    Seen::QuotaRetry { message } => {
                        return Ok(Wait::Ended(AttemptEnd::QuotaRetry { message }))
                    }
                    Seen::UnreachableRetry { message } => {
                        return Ok(Wait::Ended(AttemptEnd::UnreachableRetry { message }))
                    }
                    Seen::Nothing => {}
                }
            }
            Ok(None) | Err(_) => {
                // The stream dropped: reconnect, then make sure the idle was not missed meanwhile.
                reconnects += 1;
                events = reconnect(client, reconnects).await?;
                if !is_busy(client, Some(session_id)).await? {
                    return Ok(Wait::Idle { observed });
                }
            }
        }
    }
}

/// Returns once the key proxy refused a request at the spend cap (never without a meter).
async fn refused(opts: &TurnOptions) {
    match &opts.spend {
        Some(meter) => meter.refused().await,
        None => std::future::pending().await,
    }
}

/// The attempt's end at the spend cap, with the cap's line.
fn capped(opts: &TurnOptions) -> AttemptEnd {
    let line = opts.spend.as_ref().and_then(|m| m.reached());
    AttemptEnd::Capped {
        line: line.unwrap_or_else(|| "stopped at the spend cap".into()),
    }
}

/// What one of the session's events means for the attempt.
enum Seen {
    Idle,
    /// OpenCode is retrying a quota error: the (sanitized) message.
    QuotaRetry {
        message: String,
    },
    /// OpenCode has retried [`UNREACHABLE_RETRIES`] times and still cannot connect.
    UnreachableRetry {
        message: String,
    },
    Nothing,
}

/// Reads one event of the session; a `session.error` is kept in `observed`.
fn on_event(ev: Event, observed: &mut Option<NamedError>) -> Seen {
    match ev {
        Event::SessionIdle { .. }
        | Event::SessionStatus {
            status: SessionStatus::Idle,
            ..
        } => Seen::Idle,
        Event::SessionError { error, .. } => {
            if error.is_some() {
                *observed = error;
            }
            Seen::Nothing
        }
        Event::SessionStatus {
            status: SessionStatus::Retry { message, attempt },
            ..
        } => {
            if is_quota_text(&message) {
                return Seen::QuotaRetry {
                    message: log::redact(&message),
                };
            }
            if attempt >= UNREACHABLE_RETRIES && is_unreachable_text(&message) {
                return Seen::UnreachableRetry {
                    message: log::redact(&message),
                };
            }
            Seen::Nothing
        }
        Event::SessionStatus {
            status: SessionStatus::Busy | SessionStatus::Other { .. },
            ..
        }
        | Event::ServerConnected
        | Event::MessageUpdated { .. }
        | Event::PartUpdated { .. }
        | Event::TodoUpdated { .. }
        | Event::Other { .. } => Seen::Nothing,
    }
}

/// Subscribes again after the stream dropped for the `reconnects`-th time, backing off; gives up
/// after [`RECONNECTS`].
async fn reconnect(client: &Client, reconnects: u32) -> Result<EventStream, ApiError> {
    if reconnects > RECONNECTS {
        return Err(ApiError::Status {
            method: "GET",
            route: "/event".into(),
            status: 0,
            body: "the event stream kept dropping".into(),
        });
    }
    tokio::time::sleep(Duration::from_millis(200 * reconnects as u64)).await;
    subscribe(client).await
}

/// The messages after the first `before`, once the last assistant message is complete (or after
/// [`SETTLE_WAIT`]). Idle is announced before the last message is finalized: give it a moment.
async fn settle(
    client: &Client,
    session_id: &str,
    before: usize,
    observed: Option<NamedError>,
) -> Result<AttemptEnd, ApiError> {
    let settle = Instant::now() + SETTLE_WAIT;
    loop {
        let msgs = client.messages(session_id, None).await?;
        let new: Vec<Message> = msgs.into_iter().skip(before).collect();
        let settled = new
            .iter()
            .rev()
            .find(|m| m.info.role == "assistant")
            .is_none_or(|m| m.info.time.completed.is_some() || m.info.error.is_some());
        if settled || Instant::now() >= settle {
            return Ok(AttemptEnd::Idle { new, observed });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens `/event` and waits for `server.connected`, so nothing the prompt causes is missed.
async fn subscribe(client: &Client) -> Result<EventStream, ApiError> {
    let mut events = client.events().await?;
    let connected = tokio::time::timeout(CONNECT_WAIT, async {
        loop {
            match events.next().await? {
                Some(Event::ServerConnected) => return Ok(true),
                Some(_) => continue,
                None => return Ok(false),
            }
        }
    })
    .await;
    match connected {
        Ok(Ok(true)) => Ok(events),
        Ok(Err(e)) => Err(e),
        Ok(Ok(false)) | Err(_) => Err(ApiError::Status {
            method: "GET",
            route: "/event".into(),
            status: 0,
            body: "no server.connected event".into(),
        }),
    }
}

/// Aborts the session and waits (bounded) until OpenCode reports it idle. `prompt_async` returns
/// before the loop starts, so an early abort can find nothing to abort and the loop then starts
/// anyway: the abort is repeated while the session is busy, and idle must hold on two checks.
async fn stop(client: &Client, session_id: &str) {
    let until = Instant::now() + ABORT_WAIT;
    let mut idle_checks = 0;
    let mut last_abort: Option<Instant> = None;
    while Instant::now() < until {
        match is_busy(client, Some(session_id)).await {
            Ok(false) => {
                idle_checks += 1;
                if idle_checks >= 2 {
                    return;
                }
            }
            Ok(true) => {
                idle_checks = 0;
                if last_abort.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
                    let _ = client.abort(session_id).await;
                    last_abort = Some(Instant::now());
                }
            }
            Err(_) => return,
        }
        if last_abort.is_none() {
            let _ = client.abort(session_id).await;
            last_abort = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// Whether work is still running: the given session, or any session when `None`. This is the
/// save safety gate's first check ("work this run started is still running").
pub async fn is_busy(client: &Client, session_id: Option<&str>) -> Result<bool, ApiError> {
    let status = client.status().await?;
    Ok(match session_id {
        Some(id) => status.get(id).is_some_and(|s| s.kind != "idle"),
        None => status.values().any(|s| s.kind != "idle"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn retry(message: &str, attempt: u64) -> Event {
        Event::SessionStatus {
            session_id: "ses_1".into(),
            status: SessionStatus::Retry {
                message: message.into(),
                attempt,
            },
        }
    }

    #[test]
    fn only_the_third_retry_that_cannot_connect_ends_the_attempt() {
        let refused =
            "Cannot connect to API: Unable to connect. Is the computer able to access the url?";
        let mut observed = None;
        for attempt in [1, 2] {
            assert!(matches!(
                on_event(retry(refused, attempt), &mut observed),
                Seen::Nothing
            ));
        }
        assert!(matches!(
            on_event(retry(refused, 3), &mut observed),
            Seen::UnreachableRetry { message } if message.contains("Unable to connect")
        ));
        // A rate limit is OpenCode's to retry, however often.
        assert!(matches!(
            on_event(retry("Rate limit reached", 5), &mut observed),
            Seen::Nothing
        ));
    }

    fn err(name: &str, data: serde_json::Value) -> NamedError {
        NamedError {
            name: name.into(),
            data,
        }
    }

    #[test]
    fn classification_matches_what_opencode_reports() {
        // As observed from OpenCode 1.18.33 against OpenAI-shaped errors.
        let auth = err(
            "APIError",
            json!({"message": "Incorrect API key provided: sk-fake.", "statusCode": 401,
                   "isRetryable": false, "responseBody": "{\"error\":{\"code\":\"invalid_api_key\"}}"}),
        );
        assert_eq!(classify(&auth), ErrorClass::ProviderAuth);
        assert_eq!(
            classify(&err(
                "ProviderAuthError",
                json!({"providerID": "x", "message": "no key"})
            )),
            ErrorClass::ProviderAuth
        );
        let quota = err(
            "APIError",
            json!({"message": "You exceeded your current quota, please check your plan and billing details.",
                   "statusCode": 429, "isRetryable": true}),
        );
        assert_eq!(classify(&quota), ErrorClass::Quota);
        let rate = err(
            "APIError",
            json!({"message": "Rate limit reached for requests", "statusCode": 429, "isRetryable": true}),
        );
        assert_eq!(classify(&rate), ErrorClass::Provider);
        let unreachable = err(
            "APIError",
            json!({"message": "Bad Gateway: the provider is unreachable", "statusCode": 502, "isRetryable": true}),
        );
        assert_eq!(classify(&unreachable), ErrorClass::Unreachable);
        let overflow = err(
            "ContextOverflowError",
            json!({"message": "Session too large to compact - context exceeds model limit even after stripping media"}),
        );
        assert_eq!(classify(&overflow), ErrorClass::ContextOverflow);
        assert_eq!(
            classify(&err("MessageAbortedError", json!({"message": "Aborted"}))),
            ErrorClass::Aborted
        );
        assert_eq!(
            classify(&err("UnknownError", json!({"message": "socket hang up"}))),
            ErrorClass::Provider
        );
        assert!(is_quota_text(
            "You exceeded your current quota, please check your plan"
        ));
        assert!(!is_quota_text("Rate limit reached for requests"));
        assert!(continuation_prompt("Rate limit reached").contains("Rate limit reached"));
    }
}
