//! The model check's request (docs/security.md#the-threat-check): the model the turn used, asked
//! through a key proxy of fro-bot's own for that one provider, with the redacted diff and the
//! proposed actions fenced as data (`judge`'s prompt, in the provider's own API: `provider`), an
//! unreadable or failed answer asked again once, a signal ending it there; and what it came to
//! (`JudgeRun`). What the result does to a delivery is the phase's (`phases::delivery::threat_check`).

use std::time::Duration;

use crate::confine::key_proxy::{KeyProxy, KeyProxyPlan, Metering, Route};
use crate::opencode::client::error_chain;
use crate::opencode::preflight::Providers;
use crate::runner::Cancellation;
use crate::threat::judge::{self, Verdict};
use crate::threat::provider::{self, JudgeModel, Usage, Wire};

/// The longest one request to the model may take.
const JUDGE_TIMEOUT: Duration = Duration::from_secs(120);
/// How many answers the model gets to give the verdict (an unreadable or failed one is asked
/// again once).
const JUDGE_ATTEMPTS: u32 = 2;
/// The most diff the model reads (characters); less for a smaller context window.
const MAX_JUDGED_CHARS: usize = 400_000;
/// Characters of diff per token of a known context window (code runs 3–4 to a token: the rest is
/// room for the prompt and the answer).
const CHARS_PER_CONTEXT_TOKEN: u64 = 2;

/// What the model check came to.
#[derive(Debug, Clone, PartialEq)]
pub enum JudgeResult {
    Clear,
    Flagged(Verdict),
    /// Two answers that were not the verdict.
    Unreadable,
    /// It could not be asked, or did not answer: why.
    Failed(String),
}

/// One model check.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeRun {
    /// `provider/model`, when one was known.
    pub model: Option<String>,
    pub requests: u32,
    pub usage: Usage,
    /// `None`: the listing gave no rates.
    pub cost: Option<f64>,
    pub result: JudgeResult,
}

impl JudgeRun {
    /// A check that was not asked, or got no answer: why.
    pub fn failed(model: Option<String>, why: impl Into<String>) -> JudgeRun {
        JudgeRun {
            model,
            requests: 0,
            usage: Usage::default(),
            cost: Some(0.0),
            result: JudgeResult::Failed(why.into()),
        }
    }

    /// What it found against delivering; `None`: nothing.
    pub fn concerns(&self) -> Option<Vec<String>> {
        Some(match &self.result {
            JudgeResult::Clear => return None,
            JudgeResult::Flagged(v) => {
                let mut out = vec![format!("the model check flagged it: {}", v.flags().join(", "))];
                out.extend(v.shown_reasons());
                out
            }
            JudgeResult::Unreadable => vec![
                "the model check's answer was not the verdict asked for, twice; that counts as flagged".into(),
            ],
            JudgeResult::Failed(why) => vec![format!("the model check could not run: {why}")],
        })
    }
}

/// Whom the check asks, and with what.
pub struct Asking<'a> {
    /// `provider/model`, when one is known.
    pub model: Option<String>,
    /// OpenCode's listing before the turn (`GET /config/providers`): the model's id, rates and
    /// context window.
    pub listing: Option<&'a Providers>,
    /// The providers a key proxy can serve, and their credentials.
    pub keys: KeyProxyPlan,
    pub repository: &'a str,
    pub cancel: &'a Cancellation,
    /// The run's spend meter: the check's request counts toward the caps, and is never refused
    /// by them (a change is judged, not waved through).
    pub spend: Option<std::sync::Arc<crate::confine::spend::Meter>>,
}

/// The one request, settled before anything starts.
struct Question {
    provider_id: String,
    route: Route,
    model: JudgeModel,
    /// The change's diff, redacted.
    diff: String,
}

/// Asks the model about `diff` (the change's, empty when there is none) and `actions`.
pub async fn ask(asking: &Asking<'_>, diff: &str, actions: &str) -> JudgeRun {
    let name = asking.model.clone();
    let question = match question(asking, diff) {
        Ok(q) => q,
        Err(why) => return JudgeRun::failed(name, why),
    };
    let wire = Wire::of(question.route.style);
    let metering = asking.spend.clone().map(|meter| Metering {
        meter,
        refuse: false,
    });
    let proxy = match KeyProxy::start_metered(vec![question.route], metering).await {
        Ok(p) => p,
        Err(e) => return JudgeRun::failed(name, format!("the key proxy did not start: {e}")),
    };
    let http = match crate::net::loopback().timeout(JUDGE_TIMEOUT).build() {
        Ok(h) => h,
        Err(e) => return JudgeRun::failed(name, format!("no HTTP client: {e}")),
    };
    let prompt = (
        judge::system_prompt(asking.repository),
        judge::user_prompt(&question.diff, actions),
    );
    let base = proxy.base_url(&question.provider_id);
    let mut run = JudgeRun::failed(name, "not asked");
    let to = (&http, base.as_str(), wire, &question.model);
    ask_for_verdict(to, (&prompt.0, &prompt.1), asking.cancel, &mut run).await;
    run.cost = question.model.cost(run.usage);
    run
}

/// The provider the key proxy serves for the model, the model as listed, and the diff it reads
/// (no more than its context window takes); `Err`: why it cannot be asked.
fn question(asking: &Asking<'_>, diff: &str) -> Result<Question, String> {
    let name = asking.model.as_deref();
    let Some((provider_id, model_id)) = name.and_then(|n| n.split_once('/')) else {
        return Err("no model is known to ask (set `model`)".into());
    };
    let Some(route) = asking.keys.routes.iter().find(|r| r.id == provider_id) else {
        return Err(format!(
            "provider `{provider_id}` is not one the key proxy serves (an API key is needed; OAuth and cloud-signed credentials are not), so fro-bot cannot ask it"
        ));
    };
    let entry = asking
        .listing
        .and_then(|l| l.providers.iter().find(|p| p.id == provider_id))
        .and_then(|p| p.models.get(model_id));
    let model = JudgeModel::from_listing(model_id, entry);
    let limit = model
        .context
        .map_or(MAX_JUDGED_CHARS, |c| {
            usize::try_from(c.saturating_mul(CHARS_PER_CONTEXT_TOKEN)).unwrap_or(usize::MAX)
        })
        .min(MAX_JUDGED_CHARS);
    let diff = crate::redact::redact(diff);
    let chars = diff.chars().count();
    if chars > limit {
        return Err(format!(
            "the change's diff ({chars} characters) is more than it reads ({limit})"
        ));
    }
    Ok(Question {
        provider_id: provider_id.to_string(),
        route: route.clone(),
        model,
        diff,
    })
}

/// Up to [`JUDGE_ATTEMPTS`] requests, until one answers with the verdict; each answer's usage and
/// the last result into `run`.
async fn ask_for_verdict(
    (http, base, wire, model): (&reqwest::Client, &str, Wire, &JudgeModel),
    prompt: (&str, &str),
    cancel: &Cancellation,
    run: &mut JudgeRun,
) {
    for _ in 0..JUDGE_ATTEMPTS {
        run.requests += 1;
        let asked = provider::ask(http, base, wire, model, prompt);
        // A signal leaves the budget to memory: the check ends there, and holds what it covers.
        let asked = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                run.result = JudgeResult::Failed("the run was cancelled while it asked".into());
                break;
            }
            asked = asked => asked,
        };
        let answer = match asked {
            Ok(a) => a,
            Err(e) => {
                run.result = JudgeResult::Failed(error_chain(&e));
                continue;
            }
        };
        run.usage.add(answer.usage);
        match judge::parse_verdict(&answer.text) {
            Ok(v) if v.flagged() => run.result = JudgeResult::Flagged(v),
            Ok(_) => run.result = JudgeResult::Clear,
            Err(_) => {
                run.result = JudgeResult::Unreadable;
                continue;
            }
        }
        break;
    }
}
