//! Finalize: the one response on GitHub, the completion reaction, the run's records in the object
//! store, and the step summary.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::Settings;
use crate::github::response::ResponseOutcome;
use crate::github::{self, CacheKeys, RunPlan};
use crate::memory::ledger::StoreContext;
use crate::memory::report::{PersistenceReport, RestoreReport};
use crate::memory::state_paths::StatePaths;
use crate::object_store as store;
use crate::opencode::TurnOutcome;
use crate::phases::run_context::Admitted;
use crate::phases::tracking_comment::{self, Tracker};
use crate::phases::turn::agent::AgentRun;
use crate::runner::{log, now_ms, Env, FileCommands};

/// Puts the answer (or, for a failed run, what stopped it) and what became of the agent's proposals
/// (`delivery_answer`) into the tracking comment — or, without one, posts it as a new comment — and
/// reacts; the comment's URL.
pub(crate) async fn finalize_github(
    ctx: &Admitted,
    gh: &github::GitHub,
    (agent_run, delivery_answer): (&AgentRun, Option<&str>),
    restored: &RestoreReport,
    tracker: Option<&Tracker>,
) -> Option<String> {
    let (settings, env, plan, started) = (&ctx.settings, &ctx.env, &ctx.plan, ctx.started);
    let succeeded = agent_run.outcome == Some(TurnOutcome::Completed);
    let text = match (final_text(agent_run), delivery_answer) {
        (Some(t), Some(d)) => Some(format!("{t}\n\n{d}")),
        (None, Some(d)) if agent_run.delivery.delivered => Some(d.to_string()),
        (None, Some(d)) => Some(format!("{}\n\n{d}", empty_text(agent_run))),
        (None, None) => Some(empty_text(agent_run)),
        (t @ Some(_), None) => t,
    };
    let footer = run_footer(env, plan, agent_run, restored, started);
    // The reaction does not wait for the answer's round trip to GitHub.
    let (url, concluded) = tokio::join!(
        reply(gh, settings, plan, tracker, text.as_deref(), &footer),
        gh.conclude(plan, succeeded)
    );
    if let Err(e) = concluded {
        tracing::warn!("cannot add the completion reaction: {e}");
    }
    url
}

/// A reply that is not the agent's (the run did not get to run it): into the tracking comment, or
/// posted new; then 😕. The comment's URL.
pub(crate) async fn answer_only(
    ctx: &Admitted,
    gh: &github::GitHub,
    tracker: Option<&Tracker>,
    text: &str,
) -> Option<String> {
    let footer = github::response::RunFooter {
        run_url: github::response::run_url(&ctx.env),
        session_id: None,
        cache_status: None,
        logical_key: Some(ctx.plan.logical_key.as_str().to_string()),
        duration_secs: Some(ctx.started.elapsed().as_secs()),
    };
    let (url, concluded) = tokio::join!(
        reply(gh, &ctx.settings, &ctx.plan, tracker, Some(text), &footer),
        gh.conclude(&ctx.plan, false)
    );
    if let Err(e) = concluded {
        tracing::warn!("cannot add the completion reaction: {e}");
    }
    url
}

/// The tracking comment's body under a signal: the answer if the turn had completed, else that the
/// run was stopped.
pub(crate) fn cancelled_body(
    env: &Env,
    plan: &RunPlan,
    agent_run: &AgentRun,
    restored: &RestoreReport,
    started: Instant,
) -> String {
    let footer = run_footer(env, plan, agent_run, restored, started);
    let text = match (&agent_run.outcome, &agent_run.answer) {
        (Some(TurnOutcome::Completed), Some(answer)) => agent_words(answer),
        _ => with_kept(CANCELLED.to_string(), agent_run),
    };
    github::response::render(&text, &footer, plan.author.as_deref())
}

/// `stopped`, and — for a turn handed to OpenCode that did not complete — what memory kept of it,
/// as the repair of the turn knows it before the save (`memory::repair::kept_note`).
fn with_kept(stopped: String, agent_run: &AgentRun) -> String {
    let cut = agent_run.prompted && agent_run.outcome != Some(TurnOutcome::Completed);
    match cut
        .then(|| crate::memory::repair::kept_note(agent_run.cut.as_ref()))
        .flatten()
    {
        Some(kept) => format!("{stopped}\n\n{kept}"),
        None => stopped,
    }
}

/// The agent's answer with its links checked (`outbound::links`, after the redactor: an inert
/// URL's invisible breaks must not split a secret before it is found). fro-bot's own text beside
/// it — the delivery section, the footer — links to what fro-bot made, and is not rewritten.
fn agent_words(answer: &str) -> String {
    crate::outbound::links(&crate::redact::redact(answer))
}

/// What a cancelled run's comment says.
pub(crate) const CANCELLED: &str =
    "I was stopped before I could finish: the run was cancelled. Mention me again to retry.";

/// The answer; for a turn that did not complete, what stopped it too (after any partial answer),
/// so the person who asked is not left waiting in silence. `None`: a completed turn with nothing
/// written.
fn final_text(agent_run: &AgentRun) -> Option<String> {
    let answer = agent_run.answer.as_deref().map(agent_words);
    if agent_run.outcome == Some(TurnOutcome::Completed) {
        return answer;
    }
    let stopped = format!(
        "I could not finish this one: the agent {}. The run log has the details; mention me again to retry.",
        agent_run.outcome_text()
    );
    let stopped = with_kept(stopped, agent_run);
    Some(match &answer {
        Some(partial) => format!("{partial}\n\n---\n\n{stopped}"),
        None => stopped,
    })
}

/// A completed turn that wrote no answer and delivered nothing: what it did instead (the tools it
/// ran, what became of its files), so the comment is not a bare "nothing".
fn empty_text(agent_run: &AgentRun) -> String {
    let tools = match agent_run.tools.len() {
        0 => "ran no tool".to_string(),
        n => {
            let mut counts: Vec<(&str, usize)> = Vec::new();
            for t in &agent_run.tools {
                match counts.iter_mut().find(|(name, _)| name == t) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((t.as_str(), 1)),
                }
            }
            let named: Vec<String> = counts
                .iter()
                .map(|(name, c)| match c {
                    1 => format!("`{name}`"),
                    c => format!("`{name}` ×{c}"),
                })
                .collect();
            format!("ran {n} tool call(s) ({})", named.join(", "))
        }
    };
    let changes = match &agent_run.delivery.changes {
        Some(c) => format!("changes: {c}"),
        None => "changes: not read".to_string(),
    };
    format!(
        "I finished without a written answer, and nothing was delivered. This turn {tools}; {changes}."
    )
}

fn run_footer(
    env: &Env,
    plan: &RunPlan,
    agent_run: &AgentRun,
    restored: &RestoreReport,
    started: Instant,
) -> github::response::RunFooter {
    github::response::RunFooter {
        run_url: github::response::run_url(env),
        session_id: agent_run.session_id.clone(),
        cache_status: Some(restored.status.as_str().to_string()),
        logical_key: Some(plan.logical_key.as_str().to_string()),
        duration_secs: Some(started.elapsed().as_secs()),
    }
}

/// `text` into the tracking comment, or — without one, or when the edit fails — posted new. `None`
/// text: nothing to say (the tracking comment still gets the footer). The comment's URL.
async fn reply(
    gh: &github::GitHub,
    settings: &Settings,
    plan: &RunPlan,
    tracker: Option<&Tracker>,
    text: Option<&str>,
    footer: &github::response::RunFooter,
) -> Option<String> {
    let Some(t) = tracker else {
        return post_new(gh, settings, plan, text?, footer).await;
    };
    let body = github::response::render(text.unwrap_or(""), footer, plan.author.as_deref());
    match t.finish(&body, tracking_comment::FINAL_TIMEOUT).await {
        Ok(edited) => edited.url.or_else(|| t.url().map(str::to_string)),
        Err(e) => {
            log::warning(&format!("{e}; posting the answer as a new comment"));
            post_new(gh, settings, plan, text.unwrap_or(""), footer).await
        }
    }
}

/// Today's one response comment, posted new.
async fn post_new(
    gh: &github::GitHub,
    settings: &Settings,
    plan: &RunPlan,
    text: &str,
    footer: &github::response::RunFooter,
) -> Option<String> {
    let (thread, requester) = (plan.thread.as_ref(), plan.author.as_deref());
    match gh
        .respond(settings.response_mode, thread, text, footer, requester)
        .await
    {
        Ok(ResponseOutcome::Posted(posted)) => posted.url,
        Ok(ResponseOutcome::Disabled | ResponseOutcome::NoThread) => None,
        Err(e) => {
            log::warning(&format!("cannot post the response comment: {e}"));
            None
        }
    }
}

pub(crate) async fn upload_run_records(
    ctx: &StoreContext,
    keys: &CacheKeys,
    paths: &StatePaths,
    plan: &RunPlan,
    report: &PersistenceReport,
    agent_run: &AgentRun,
) {
    let run_key = keys.run_key();
    let metadata = serde_json::json!({
        "run_key": run_key,
        "logical_key": plan.logical_key.as_str(),
        "session_id": agent_run.session_id,
        "outcome": agent_run.outcome_text(),
        "cache_status": report.restore.as_ref().map(|r| r.status.as_str()),
        "save_result": report.save.as_ref().map(|s| s.state_value().as_str()),
        "save_outcome": report.save.as_ref().map(|s| s.outcome.as_str()),
        "store_publish": report.store_publish.describe(),
        "lease": report.lease.describe(),
        "at_ms": now_ms(),
    });
    // Outcome texts quote errors: the record goes through the redactor like everything else.
    let (metadata, _) = crate::redact::redact_json(&metadata);
    if let store::UploadOutcome::Failed { error } =
        store::sync::upload_run_metadata(&ctx.store, &ctx.keys, &run_key, &metadata).await
    {
        tracing::warn!("cannot upload the run record: {error}");
    }
    // OpenCode's own logs may quote configuration or provider errors: only redacted copies leave
    // the machine.
    let redacted = match redacted_copy(&paths.data_dir.join("log")) {
        Ok(Some(dir)) => dir,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("cannot prepare OpenCode's logs for upload: {e}");
            return;
        }
    };
    if let store::ArtifactsOutcome::Failed { .. } =
        store::sync::upload_run_artifacts(&ctx.store, &ctx.keys, &run_key, redacted.path()).await
    {
        tracing::warn!("some OpenCode logs could not be uploaded");
    }
}

/// Largest log file copied for upload; OpenCode's logs are small, a runaway one is cut.
pub(crate) const MAX_LOG_BYTES: u64 = 8 * 1024 * 1024;

/// A temp copy of the regular files in `dir` with every registered secret replaced by `***`.
pub(crate) fn redacted_copy(dir: &Path) -> std::io::Result<Option<tempfile::TempDir>> {
    use std::io::Read as _;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let out = tempfile::tempdir()?;
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let mut text = Vec::new();
        std::fs::File::open(entry.path())?
            .take(MAX_LOG_BYTES)
            .read_to_end(&mut text)?;
        let clean = log::redact(&String::from_utf8_lossy(&text));
        std::fs::write(out.path().join(entry.file_name()), clean)?;
    }
    Ok(Some(out))
}

/// The summary's row for GitHub's transient faults (`GitHub::retries`): how many calls were
/// tried again and how long the waits were.
pub(crate) fn retries_row(gh: Option<&github::GitHub>) -> Option<Vec<String>> {
    let (retries, waited) = gh?.retries();
    Some(vec![
        "GitHub retries".into(),
        match retries {
            0 => "none".into(),
            n => format!(
                "{n} (transient faults; waited {:.1}s)",
                waited.as_secs_f64()
            ),
        },
    ])
}

pub(crate) fn write_summary(
    files: &FileCommands,
    (plan, gh, spend): (
        &RunPlan,
        Option<&github::GitHub>,
        &crate::confine::spend::Meter,
    ),
    agent_run: &AgentRun,
    report: &PersistenceReport,
    duration: Duration,
) {
    let mut rows = vec![
        vec!["Trigger".to_string(), plan.trigger_summary.clone()],
        vec![
            "Conversation".into(),
            format!("`{}`", plan.logical_key.as_str()),
        ],
        vec![
            "Session".into(),
            agent_run
                .session_id
                .clone()
                .unwrap_or_else(|| "none".into()),
        ],
        vec!["Agent".into(), agent_run.outcome_text()],
        vec![
            "Model".into(),
            agent_run.model.clone().unwrap_or_else(|| "n/a".into()),
        ],
        vec![
            "Tokens / cost".into(),
            match &agent_run.tokens {
                Some(t) => format!("{} in, {} out / ${:.4}", t.input, t.output, agent_run.cost),
                None => "n/a".into(),
            },
        ],
        vec!["Duration".into(), format!("{:.1}s", duration.as_secs_f64())],
    ];
    rows.extend(retries_row(gh));
    if spend.cap().is_set() {
        rows.push(vec!["Spend cap".into(), spend.summary()]);
    }
    rows.extend(
        report
            .budget
            .iter()
            .map(|b| vec!["Budget".into(), b.clone()]),
    );
    rows.extend(
        report
            .delivery_rows
            .iter()
            .map(|(k, v)| vec![k.clone(), v.replace('\n', " ")]),
    );
    let mut md = format!(
        "### fro-bot run\n\n{}\n",
        crate::runner::summary::table(&["", ""], &rows)
    );
    md.push_str(&report.to_markdown("Session Persistence"));
    if let Err(e) = files.append_summary(&md) {
        tracing::warn!("{e}");
    }
    if files.summary.is_none() {
        // Local runs: the summary goes to the terminal.
        log::print(&format!("\n{md}"));
    }
}
