//! `fro-bot run` (and `fro-bot local`): the main step, in the order `docs/design.md` gives —
//! admit → acknowledge, the tracking comment and the thread's turn (the restore beside them when
//! there is no thread turn to take first) → restore → the turn (the outputs prepared, the guards
//! taken, the agent, cleanup, the guards put back, the delivery) → respond → save (always, within
//! the cancel budget) → the thread's turn given back → finish (summary, then the niceties). It
//! owns the run's ledger (`RunLedger`) and lends each step the part it appends to.

use std::sync::Arc;
use std::time::Instant;

use crate::config::CommentMode;
use crate::github::dedup;
use crate::lease::LeaseConfig;
use crate::memory::cache_merge::{CacheMergeInputs, CacheMergeReport};
use crate::memory::ledger::{CacheSaved, Ledger, OwnRows, Provenance, RestoredCopy, StoreContext};
use crate::memory::merge::Snapshot;
use crate::memory::project_identity::{self, IdentityOutcome};
use crate::memory::publish::{publish, PublishInputs, PublishReport, LEASE_WAIT};
use crate::memory::report::{PersistenceReport, RestoreReport, RestoreSource};
use crate::memory::restore::{restore, store_attempt, RestoreInputs};
use crate::memory::save::{save, SaveInputs, SaveReport};
use crate::memory::save_result::{GateInputs, StateValue, StorePublish};
use crate::memory::scrub::Scope;
use crate::memory::session_map::{self, SessionMap};
use crate::memory::state_paths::StatePaths;
use crate::opencode::progress::ProgressSink;
use crate::opencode::{Agent, TurnOutcome};
use crate::phases::admit::{admit, Admission};
use crate::phases::budget::Gate;
use crate::phases::delivery::change::{deliver, ChangesOutcome};
use crate::phases::delivery::prepare::{self, OutputsPlan};
use crate::phases::finalize::{
    answer_only, cancelled_body, finalize_github, upload_run_records, write_summary,
};
use crate::phases::run_context::{Admitted, ExitStatus, Mode, RunExit, RunLedger, RunOutcome};
use crate::phases::thread_turn::{self, ThreadTurn};
use crate::phases::tracking_comment::{self, Tracker};
use crate::phases::turn::agent::{drive_agent, start_agent, AgentInputs, AgentRun, DeliveryDid};
use crate::phases::turn::cleanup::{stop_agent, Stopped};
use crate::phases::turn::leftovers;
use crate::runner::env::{output, state};
use crate::runner::{failpoint, log, now_ms, Cancellation, Env, FileCommands};
use crate::trust::TrustMap;

pub async fn run(env: Env, mode: Mode, cancel: Cancellation) -> RunExit {
    let files = FileCommands::from_env(&env);
    // First thing: a run rejected by configuration, routing, dedup or a held lease makes post idle.
    let cache_saved = CacheSaved::start(&files);
    let admitted = admit(env, mode, (files.clone(), cache_saved.clone()), cancel).await;
    let (ctx, ledger) = match admitted {
        Ok(Admission::Run(admitted)) => *admitted,
        Ok(Admission::Skip { reason }) => return skipped(&files, &cache_saved, &reason),
        Err(e) => {
            log::error(&e.to_string());
            cache_saved.report(StateValue::Skipped);
            RunOutcome::Failed.report(&files);
            return RunExit::status(ExitStatus::Failed);
        }
    };
    // Admitted: from here on, a main step killed anywhere makes post retry the save.
    let mut run = RunLedger::new(ledger);
    run.ledger.cache_saved.set(StateValue::NotPersisted);
    crate::outbound::configure(crate::outbound::LinkPolicy::new(
        &crate::github::endpoints::server_url(&ctx.env),
        &ctx.repository,
        ctx.settings.network.allowed.clone(),
    ));
    failpoint::hit("run:admitted");
    let (tracker, turn, early) = acknowledge_and_take_thread_turn(&ctx).await;
    if let ThreadTurn::NotOurs { holder_id, waited } = &turn {
        let cache_saved = &run.ledger.cache_saved;
        return not_our_turn(&ctx, cache_saved, tracker, (holder_id, *waited)).await;
    }
    let restoring = match early {
        Some(restoring) => restoring,
        None => restoring(&ctx).await,
    };
    let (restored, merged_at_restore) = restore_memory(&ctx, &mut run.ledger, restoring).await;
    let line = match crate::phases::budget::judge(&ctx, &mut run.ledger.report).await {
        Gate::Pass(line) => line,
        Gate::Refused { text, reason } => {
            let why = (
                text.as_str(),
                reason.as_str(),
                run.ledger.report.budget.as_deref(),
            );
            let refused = over_budget(&ctx, &run.ledger.cache_saved, tracker, why);
            let exit = refused.await;
            give_back_thread_turn(&ctx, turn, None).await;
            return exit;
        }
    };
    let (agent_run, stopped) = take_turn(&ctx, &mut run, &restored, tracker.as_ref()).await;
    // Before the save, so the marker carries what this run spent.
    crate::phases::budget::settle(&ctx, line, &mut run.ledger.report).await;
    // The answer goes out before the save, so a slow save never delays it.
    let delivered = run.ledger.report.delivery_answer.as_deref();
    let cancelled_edit = respond(&ctx, (&agent_run, delivered), &restored, tracker).await;
    let merged = merged_at_restore.as_ref();
    let after_turn = (stopped, &agent_run);
    let saved = save_if_changed(&ctx, &mut run.ledger, after_turn, &restored, merged).await;
    run.ledger.report.concurrency_notes.extend(turn.note());
    give_back_thread_turn(&ctx, turn, cancelled_edit).await;
    match saved {
        Saved::InTime => finish(&ctx, run.ledger, agent_run).await,
        Saved::OutOfTime => out_of_time(&ctx, &run.ledger.cache_saved),
    }
}

/// The restore as it started and how it ended (`restoring`).
type Restoring = (Option<RestoreReport>, Instant);

/// The 👀 reaction, the tracking comment and the thread's turn; with no turn to take, the restore
/// beside them (`Some`), since nothing orders it after GitHub's round trips either.
async fn acknowledge_and_take_thread_turn(
    ctx: &Admitted,
) -> (Option<Arc<Tracker>>, ThreadTurn, Option<Restoring>) {
    // The 👀 reaction does not wait for the tracking comment or the thread's turn (each a round
    // trip to GitHub, the turn possibly a long wait), nor they for it.
    let acknowledge = async {
        if let Some(gh) = &ctx.gh {
            if let Err(e) = gh.acknowledge(&ctx.plan).await {
                tracing::warn!("cannot add the 👀 reaction: {e}");
            }
        }
    };
    // The thread's turn comes before the restore, so this run sees what an earlier run on its
    // thread is still saying; a sticky comment is that run's until then, so it is opened after.
    let own_turn = async {
        match ctx.settings.comment_mode {
            CommentMode::Run => {
                let tracker = tracking_comment::open(ctx).await;
                let turn = thread_turn::take(ctx, tracker.as_deref()).await;
                (tracker, turn)
            }
            CommentMode::Sticky => match thread_turn::take(ctx, None).await {
                // The thread's comment is the other run's: the reply is a comment of its own.
                turn @ ThreadTurn::NotOurs { .. } => (None, turn),
                turn => (tracking_comment::open(ctx).await, turn),
            },
        }
    };
    if thread_turn::needed(ctx) {
        let ((tracker, turn), ()) = tokio::join!(own_turn, acknowledge);
        (tracker, turn, None)
    } else {
        let ((tracker, turn), (), restoring) = tokio::join!(own_turn, acknowledge, restoring(ctx));
        (tracker, turn, Some(restoring))
    }
}

/// The save, unless the run cannot have changed memory (`memory_changed`).
async fn save_if_changed(
    ctx: &Admitted,
    ledger: &mut Ledger,
    (stopped, agent_run): (Stopped, &AgentRun),
    restored: &RestoreReport,
    merged_at_restore: Option<&CacheMergeReport>,
) -> Saved {
    match memory_changed(ctx, agent_run) {
        MemoryChanged::No => {
            record_save(
                ledger,
                SaveReport::cancelled_before_turn(),
                ctx.store.as_ref(),
            );
            Saved::InTime
        }
        MemoryChanged::Maybe => {
            let after_turn = (stopped, agent_run);
            cleanup_and_save(ctx, ledger, after_turn, restored, merged_at_restore).await
        }
    }
}

/// Published (or not): the thread's turn given back, so the next run on the thread may start; and
/// under a signal the tracking comment's "cancelled", each within the cancel budget.
async fn give_back_thread_turn(
    ctx: &Admitted,
    turn: ThreadTurn,
    cancelled_edit: Option<tokio::task::JoinHandle<()>>,
) {
    if ctx
        .cancel
        .within_budget(turn.release(&ctx.files))
        .await
        .is_none()
    {
        tracing::warn!(
            "this thread's turn was not given back before the cancel deadline (post gives it back)"
        );
    }
    if let Some(edit) = cancelled_edit {
        // Bounded by its own timeout, itself within the deadline.
        if ctx.cancel.within_budget(edit).await.is_none() {
            tracing::warn!("the tracking comment was not updated before the cancel deadline");
        }
    }
}

/// Whether this run may have changed memory, so that it must be saved.
enum MemoryChanged {
    /// Cancelled before the agent's turn was handed to OpenCode: memory is what the cache and the
    /// store already hold, and a save would only spend the cancel budget.
    No,
    Maybe,
}

fn memory_changed(ctx: &Admitted, agent_run: &AgentRun) -> MemoryChanged {
    match (ctx.cancel.is_cancelled(), agent_run.prompted) {
        (true, false) => MemoryChanged::No,
        (false, _) | (true, true) => MemoryChanged::Maybe,
    }
}

/// From the restore to the save: where the agent's proposals go, what it must not leave behind,
/// OpenCode and the turn, cleanup, and what it proposed carried out. A run cancelled before this
/// point does none of it.
async fn take_turn(
    ctx: &Admitted,
    run: &mut RunLedger,
    restored: &RestoreReport,
    tracker: Option<&Arc<Tracker>>,
) -> (AgentRun, Stopped) {
    let retention = ctx.settings.session_retention as usize;
    if ctx.cancel.is_cancelled() {
        let agent_run = AgentRun {
            outcome: Some(TurnOutcome::Cancelled),
            errors: vec!["the run was cancelled before the agent started".into()],
            ..AgentRun::default()
        };
        log::warning("the agent did not run: the run was cancelled");
        let stopped = stop_agent(None, &agent_run, retention, &ctx.cancel, None).await;
        return (agent_run, stopped);
    }
    let outputs = prepare::prepare(ctx).await;
    let guards = leftovers::take(ctx, run.ledger.provenance);
    let private_home = guards.private_home().map(std::path::Path::to_path_buf);
    let (agent, mut agent_run) = run_agent(
        ctx,
        run,
        (restored, tracker),
        (&outputs, private_home.as_deref()),
    )
    .await;
    // The agent is stopped (and everything it left running killed) before .git is put back and
    // its change read.
    let sibling = run.egress.as_ref().and_then(|r| r.sibling().cloned());
    let sibling = sibling.as_deref().map(|s| (s, &ctx.files));
    let stopped = stop_agent(agent, &agent_run, retention, &ctx.cancel, sibling).await;
    crate::phases::turn::cut::repair(ctx, &mut run.ledger.report, &mut agent_run, &stopped).await;
    crate::phases::turn::agent_network::record(&ctx.settings.network, run);
    leftovers::put_back(ctx, &mut run.ledger, guards, (&agent_run, &stopped.pruned));
    if !ctx.cancel.is_cancelled() {
        let report = &mut run.ledger.report;
        let (usage, did) = deliver_outputs(ctx, report, &outputs, &agent_run).await;
        agent_run.delivery = did;
        match (ctx.spend.spent().requests, usage) {
            // The threat check's request went through the meter too.
            (1.., _) => report_spend(ctx, &mut agent_run),
            (0, Some(usage)) => add_threat_usage(ctx, &mut agent_run, usage),
            (0, None) => {}
        }
    }
    (agent_run, stopped)
}

/// The restore itself (store, then cache, then validation), with when it started; `None` when a
/// signal stopped it: the agent will not run, and what is half restored is never saved
/// (`memory_changed`).
async fn restoring(ctx: &Admitted) -> Restoring {
    let t = Instant::now();
    let restore_keys = ctx.keys.restore_prefixes().to_vec();
    let restoring = async {
        let _g = log::Group::new("Restore memory");
        let inputs = RestoreInputs {
            paths: &ctx.paths,
            workspace: &ctx.workspace,
            skip_cache: ctx.settings.skip_cache,
            cache: ctx.cache.as_ref(),
            key: &ctx.keys.primary,
            restore_keys: &restore_keys,
            catalog: crate::memory::fallback::catalog(ctx.cache.as_ref(), ctx.gh.as_ref()),
            now_ms: crate::opencode::system_now_ms(),
        };
        restore(inputs, store_attempt(ctx.store.as_ref(), &ctx.paths)).await
    };
    let restored = tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => None,
        restored = restoring => Some(restored),
    };
    (restored, t)
}

/// What the restore brought, taken into the run: outputs, provenance, the cache entry merged into
/// the store's copy, then the workspace's project identity.
async fn restore_memory(
    ctx: &Admitted,
    ledger: &mut Ledger,
    (restored, t): Restoring,
) -> (RestoreReport, Option<CacheMergeReport>) {
    let cancel = ctx.cancel.clone();
    ctx.files
        .set_output_or_warn(output::LOGICAL_KEY, ctx.plan.logical_key.as_str());
    let Some(restored) = restored else {
        log::warning("memory: the restore was stopped by the cancel; nothing is saved");
        let mut report = RestoreReport::miss();
        report
            .notes
            .push("the run was cancelled during the restore".into());
        ledger.report.restore = Some(report.clone());
        return (report, None);
    };
    tracing::info!(
        "memory: {} (source: {})",
        restored.status.as_str(),
        restored.source.as_str()
    );
    if restored.shadow_guard.is_some() {
        // This run's memory must not hide older memory: post must not save it either.
        ledger.cache_saved.set(StateValue::DeclinedForSafety);
    }
    ctx.files
        .set_output_or_warn(output::CACHE_STATUS, restored.status.as_str());
    ledger.restored_copy = RestoredCopy::of(&ctx.paths, &restored);
    ledger.provenance = Provenance::of_restored(&ctx.paths, ledger.restored_copy.as_ref());
    ledger.restored_sessions = restored_sessions(&ctx.paths, &restored);
    // After the digest and the sessions above: those describe the store's copy, which the
    // publish compares against; the merged result is saved because it differs.
    let merged = tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        merged = merge_cache_into_store_copy(ctx, &ledger.own_rows, &restored) => merged,
    };
    let mut restored = restored;
    if merged.as_ref().is_some_and(|m| !m.merged.is_empty()) {
        // Another entry's memory came in: this run cannot vouch for what it held.
        ledger.provenance = Provenance::Unknown;
    }
    if let Some(merged) = &merged {
        // The turn resolves threads and judges sessions by these, as the save's marker will.
        if let SessionMap::Owned(map) = &mut restored.sessions {
            merged.join_sessions_into(map);
        }
        merged.join_trust_into(&mut restored.trust);
    }
    // Before OpenCode starts, and before the memory guard's copy: what an earlier run cut short.
    let repaired = crate::memory::repair::after_restore(ctx.paths.db()).await;
    ledger.report.cut_turns.push(repaired);
    ledger.report.restore = Some(restored.clone());
    ledger.report.record_phase("restore", t.elapsed());
    match project_identity::align(&ctx.workspace, &ctx.paths.db()) {
        IdentityOutcome::Failed { message } => tracing::warn!("project identity: {message}"),
        IdentityOutcome::Refused { count } => log::warning(&format!(
            "project identity: {count} restored project id(s) refused (not a commit hash); OpenCode derives its own"
        )),
        IdentityOutcome::Written { id } => tracing::info!("project identity set to {id}"),
        IdentityOutcome::AlreadySet { .. }
        | IdentityOutcome::NoRestoredProject
        | IdentityOutcome::NotAGitCheckout => {}
    }
    (restored, merged)
}

/// The store's copy is what restore prefers, but a save that reached only the cache (a withheld
/// publish, a post retry) is newer than it: the newest cache entry is merged in before the turn,
/// so the agent sees those threads too (docs/design.md#concurrent-runs).
async fn merge_cache_into_store_copy(
    ctx: &Admitted,
    own_rows: &OwnRows,
    restored: &RestoreReport,
) -> Option<CacheMergeReport> {
    if restored.source != RestoreSource::Storage {
        return None;
    }
    let restore_keys = ctx.keys.restore_prefixes().to_vec();
    let inputs = cache_merge_inputs((ctx, own_rows), &restore_keys, restored, None)?;
    let merged = crate::memory::cache_merge::merge_newer_entries(&inputs).await;
    for (key, _) in &merged.merged {
        tracing::info!("merged the newer cache entry {key} into the store's copy before the turn");
    }
    Some(merged)
}

/// What the cache merges read (`None` without a cache).
fn cache_merge_inputs<'a>(
    (ctx, own_rows): (&'a Admitted, &'a OwnRows),
    restore_keys: &'a [String],
    restored: &'a RestoreReport,
    earlier: Option<&'a CacheMergeReport>,
) -> Option<CacheMergeInputs<'a>> {
    let cache = ctx.cache.as_ref()?;
    Some(CacheMergeInputs {
        cache,
        catalog: crate::memory::fallback::catalog(Some(cache), ctx.gh.as_ref()),
        restore_keys,
        primary_key: &ctx.keys.primary,
        paths: &ctx.paths,
        workspace: &ctx.workspace,
        source: restored.source,
        restored_key: restored
            .matched_key
            .as_deref()
            .or_else(|| earlier.and_then(|e| e.merged.last().map(|(k, _)| k.as_str()))),
        earlier,
        own_rows,
    })
}

/// The sessions as restored, for the merge at publish (`None` when they cannot be read).
fn restored_sessions(paths: &StatePaths, restored: &RestoreReport) -> Option<Snapshot> {
    let db = paths.db();
    if restored.source == RestoreSource::None || !db.is_file() {
        return Some(Snapshot::empty());
    }
    match Snapshot::capture(&db) {
        Ok(snapshot) => Some(snapshot),
        Err(e) => {
            tracing::warn!(
                "cannot read the restored sessions; newer shared memory will not be merged: {e}"
            );
            None
        }
    }
}

/// Starts OpenCode and drives the turn; a signal during the start stops it (`ServerError::Cancelled`).
async fn run_agent(
    ctx: &Admitted,
    run: &mut RunLedger,
    (restored, tracker): (&RestoreReport, Option<&Arc<Tracker>>),
    (outputs, private_home): (&OutputsPlan, Option<&std::path::Path>),
) -> (Option<Agent>, AgentRun) {
    let mut agent_run = AgentRun::default();
    let agent = match ctx.cancel.is_cancelled() {
        true => Err("the run was cancelled before OpenCode started".to_string()),
        false => {
            let view = crate::phases::turn::agent::trust_view(&ctx.plan, restored);
            start_agent(ctx, run, &view, (outputs.tools(), private_home)).await
        }
    };
    let mut agent = match agent {
        Ok(a) => a,
        Err(message) => {
            match ctx.cancel.is_cancelled() {
                true => {
                    log::warning(&format!("the agent did not run: {message}"));
                    agent_run.outcome = Some(TurnOutcome::Cancelled);
                }
                false => log::error(&format!("OpenCode could not start: {message}")),
            }
            agent_run.errors.push(message);
            return (None, agent_run);
        }
    };
    {
        let _g = log::Group::new("Agent");
        let t = Instant::now();
        let progress = ProgressSink::log();
        let interval = tracking_comment::progress_interval(&ctx.env);
        // Dropped when the turn is over: progress edits stop before the final body.
        let _watch = tracker.map(|tr| tr.watch(progress.clone(), interval));
        let inputs = AgentInputs {
            settings: &ctx.settings,
            env: &ctx.env,
            plan: &ctx.plan,
            restored,
            gh: ctx.gh.as_ref(),
            cancel: &ctx.cancel,
            started: ctx.started,
            progress,
            changes_delivered: outputs.delivers_changes(),
            review: outputs.review.brief(),
            memory: ctx.paths.db(),
            record: &|out: &AgentRun| record_for_post(ctx, restored, out),
            spend: &ctx.spend,
        };
        drive_agent(&mut agent, &inputs, &mut agent_run).await;
        let prep = agent_run.prep_time;
        run.ledger.report.record_phase("session-prep", prep);
        run.ledger
            .report
            .record_phase("agent", t.elapsed().saturating_sub(prep));
    }
    if let Some(id) = &agent_run.session_id {
        ctx.files.set_output_or_warn(output::SESSION_ID, id);
    }
    report_spend(ctx, &mut agent_run);
    (Some(agent), agent_run)
}

/// The one response on GitHub and the completion reaction. Under a signal memory comes first: only
/// the tracking comment is told, in a task beside cleanup and the save (its handle, to await within
/// the budget).
async fn respond(
    ctx: &Admitted,
    (agent_run, delivered): (&AgentRun, Option<&str>),
    restored: &RestoreReport,
    tracker: Option<Arc<Tracker>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let gh = ctx.gh.as_ref()?;
    if ctx.cancel.is_cancelled() {
        let tracker = tracker?;
        let body = cancelled_body(&ctx.env, &ctx.plan, agent_run, restored, ctx.started);
        let limit = ctx
            .cancel
            .remaining()
            .unwrap_or_default()
            .min(tracking_comment::CANCEL_EDIT_TIMEOUT);
        return Some(tokio::spawn(async move {
            if let Err(e) = tracker.finish(&body, limit).await {
                log::warning(&e.to_string());
            }
        }));
    }
    let answer = (agent_run, delivered);
    let url = finalize_github(ctx, gh, answer, restored, tracker.as_deref()).await;
    // Answered (or the answer could not be posted at all): post must not call the run stopped.
    ctx.files.save_state_or_warn(state::TRACKING_COMMENT, "");
    if let Some(url) = url {
        ctx.files.set_output_or_warn(output::COMMENT_URL, &url);
    }
    None
}

enum Saved {
    /// The save finished (whatever its result): state, output and report are written.
    InTime,
    /// The cancel deadline passed first: the state still says not-persisted, so post retries.
    OutOfTime,
}

/// The run's tokens and cost into the outputs and the summary: what the key proxy counted, however
/// the turn ended (`confine::spend`); else — no request went through it (a provider it cannot
/// carry) — what OpenCode reported of the messages it completed.
fn report_spend(ctx: &Admitted, agent_run: &mut AgentRun) {
    let spent = ctx.spend.spent();
    if spent.requests > 0 {
        agent_run.tokens = Some(crate::opencode::client::Tokens {
            input: spent.input,
            output: spent.output,
            ..Default::default()
        });
        agent_run.cost = spent.cost;
    }
    if let Some(tokens) = &agent_run.tokens {
        let totals = serde_json::json!({"input": tokens.input, "output": tokens.output});
        ctx.files
            .set_output_or_warn(output::TOKENS, &totals.to_string());
        ctx.files
            .set_output_or_warn(output::COST, &agent_run.cost.to_string());
    }
}

/// The threat check's model tokens and cost join the turn's, in the outputs and the summary.
fn add_threat_usage(
    ctx: &Admitted,
    agent_run: &mut AgentRun,
    (usage, cost): (crate::threat::provider::Usage, f64),
) {
    let tokens = agent_run.tokens.get_or_insert_with(Default::default);
    tokens.input += usage.input;
    tokens.output += usage.output;
    agent_run.cost += cost;
    let totals = serde_json::json!({"input": tokens.input, "output": tokens.output});
    ctx.files
        .set_output_or_warn(output::TOKENS, &totals.to_string());
    ctx.files
        .set_output_or_warn(output::COST, &agent_run.cost.to_string());
}

/// What the agent proposed, checked and carried out; its outcome into the outputs, the summary and
/// the answer; the threat check's model usage, when it asked the model, and what was delivered.
async fn deliver_outputs(
    ctx: &Admitted,
    summary: &mut PersistenceReport,
    outputs: &OutputsPlan,
    agent_run: &AgentRun,
) -> (Option<(crate::threat::provider::Usage, f64)>, DeliveryDid) {
    let t = Instant::now();
    let report = {
        let _g = log::Group::new("Deliver the agent's proposals");
        deliver(ctx, outputs, agent_run).await
    };
    ctx.files
        .set_output_or_warn(output::CHANGES, report.changes.output());
    if let ChangesOutcome::Delivered {
        committed, pull, ..
    } = &report.changes
    {
        ctx.files
            .set_output_or_warn(output::BRANCH, &committed.branch);
        ctx.files
            .set_output_or_warn(output::COMMIT_SHA, &committed.sha);
        if let Some(url) = pull.url() {
            ctx.files.set_output_or_warn(output::PR_URL, url);
        }
    }
    let review = crate::phases::delivery::pr_review::carry_out(
        ctx,
        (&outputs.review, outputs.proposals_file()),
        agent_run,
        report.held.as_deref(),
    )
    .await;
    if let Some(url) = review.url() {
        ctx.files.set_output_or_warn(output::REVIEW_URL, url);
    }
    let rows: Vec<_> = report
        .summary_rows()
        .into_iter()
        .chain(review.summary_row())
        .collect();
    for (k, v) in &rows {
        tracing::info!("{k}: {v}");
    }
    let changes = rows.first().map(|(_, v)| v.clone());
    summary.delivery_rows = rows;
    let answer = [report.answer_section(), review.answer_line()];
    summary.delivery_answer = Some(
        answer
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n\n"),
    )
    .filter(|a| !a.is_empty());
    summary.record_phase("deliver", t.elapsed());
    let did = DeliveryDid {
        delivered: report.delivered() || review.url().is_some(),
        changes,
    };
    (report.threat.usage, did)
}

/// Cleanup (always; each step isolated), then the save within the cancel budget.
async fn cleanup_and_save(
    ctx: &Admitted,
    ledger: &mut Ledger,
    (stopped, agent_run): (Stopped, &AgentRun),
    restored: &RestoreReport,
    merged_at_restore: Option<&CacheMergeReport>,
) -> Saved {
    let t = Instant::now();
    let _g = log::Group::new("Save memory");
    let Stopped {
        agent_still_running,
        quiescent,
        strays_remained,
        pruned: _,
    } = stopped;
    let save_key = ctx.keys.save_key();
    let restore_keys = ctx.keys.restore_prefixes();
    let beside = beside_memory(ctx, ledger.provenance, agent_run, restored);
    let inputs = SaveInputs {
        paths: &ctx.paths,
        workspace: &ctx.workspace,
        skip_cache: ctx.settings.skip_cache,
        gate: GateInputs {
            agent_still_running,
            server_quiescent: quiescent,
            strays_remained,
        },
        cache: ctx.cache.as_ref(),
        save_key: &save_key,
        run_id: &ctx.run_id,
        now_ms: now_ms(),
        shadow_guard: restored.shadow_guard.as_deref(),
        sessions: Some(&beside.sessions),
        trust: Some(&beside.trust),
        restored: ledger.restored_copy.as_ref(),
        cache_merge: cache_merge_inputs(
            (ctx, &ledger.own_rows),
            &restore_keys,
            restored,
            merged_at_restore,
        ),
        scrub_scope: &beside.scrub_scope,
    };
    let publish = || publish_to_store(ctx, ledger, restored);
    let Some(saved) = ctx.cancel.within_budget(save(inputs, publish)).await else {
        return Saved::OutOfTime;
    };
    failpoint::hit("run:after-save");
    record_save(ledger, saved, ctx.store.as_ref());
    // A merge folded the session this run started into the one another run started for the
    // thread: the thread continues there.
    if let Some((_, session)) = ledger.own_rows.thread() {
        if agent_run.session_id.as_deref() != Some(session.as_str()) {
            ctx.files.set_output_or_warn(output::SESSION_ID, &session);
        }
    }
    ledger.report.record_phase("save", t.elapsed());
    Saved::InTime
}

/// What the save records beside memory.
struct BesideMemory {
    /// Which session continues which thread.
    sessions: session_map::Map,
    /// Who wrote each session.
    trust: TrustMap,
    /// What the save's scrub reads.
    scrub_scope: Scope,
}

/// The session map, the sessions' trust and the scrub's scope after this run's turn, each also in
/// main's state, so a retry by post records and scrubs what main would have.
fn beside_memory(
    ctx: &Admitted,
    provenance: Provenance,
    agent_run: &AgentRun,
    restored: &RestoreReport,
) -> BesideMemory {
    let (sessions, trust) = sessions_and_trust(ctx, agent_run, restored);
    // A session the turn replaced (context overflow) got the same prompt: scrubbed the same way.
    let scrub_scope = provenance.scrub_scope(&agent_run.own_sessions());
    if let Ok(json) = serde_json::to_string(&scrub_scope) {
        // Post's retry scrubs what main would have.
        ctx.files.save_state_or_warn(state::SCRUB_SCOPE, &json);
    }
    BesideMemory {
        sessions,
        trust,
        scrub_scope,
    }
}

/// The session map and the sessions' trust after this run's turn, also in main's state (post
/// records the same if it has to save).
fn sessions_and_trust(
    ctx: &Admitted,
    agent_run: &AgentRun,
    restored: &RestoreReport,
) -> (session_map::Map, TrustMap) {
    let sessions = restored.sessions.after_run(
        &ctx.paths.db(),
        &ctx.workspace,
        ctx.plan.logical_key.as_str(),
        agent_run.session_id.as_deref(),
    );
    if let Ok(json) = serde_json::to_string(&sessions) {
        ctx.files.save_state_or_warn(state::SESSION_MAP, &json);
    }
    // A session the turn replaced (context overflow) got the same prompt: lowered the same way.
    let own = agent_run.own_sessions();
    let written: Vec<&str> = own.iter().map(String::as_str).collect();
    let trust = restored.trust_after_run(&written, agent_run.trust.as_ref());
    if let Ok(json) = serde_json::to_string(&trust) {
        ctx.files.save_state_or_warn(state::SESSION_TRUST, &json);
    }
    (sessions, trust)
}

/// What main's state tells post as soon as main knows it (before the prompt is sent, and when the
/// turn returns), for a post step that finishes a killed main's turn: this run's own sessions
/// (`memory::guard::record_own`), the session map and the sessions' trust.
fn record_for_post(ctx: &Admitted, restored: &RestoreReport, agent_run: &AgentRun) {
    crate::memory::guard::record_own(&ctx.files, &agent_run.own_sessions());
    sessions_and_trust(ctx, agent_run, restored);
}

/// The save's publish to the store (`memory::publish`), when there is one.
async fn publish_to_store(
    ctx: &Admitted,
    ledger: &Ledger,
    restored: &RestoreReport,
) -> PublishReport {
    let Some(store) = ctx.store.as_ref() else {
        return PublishReport::from(StorePublish::Disabled);
    };
    let no_sessions = Snapshot::empty();
    publish(PublishInputs {
        store,
        cancel: &ctx.cancel,
        holder: ctx.lease_holder.clone(),
        files: &ctx.files,
        paths: &ctx.paths,
        workspace: &ctx.workspace,
        expected_etag: restored.store_etag.clone(),
        restored: match restored.source {
            RestoreSource::Storage => ledger.restored_sessions.as_ref(),
            RestoreSource::Cache | RestoreSource::None => Some(&no_sessions),
        },
        own_rows: &ledger.own_rows,
        run_id: &ctx.run_id,
        now_ms: now_ms(),
        lease_config: LeaseConfig::default(),
        lease_wait: LEASE_WAIT,
    })
    .await
}

/// The save's result into state (post's decision), outputs, the log and the report.
fn record_save(ledger: &mut Ledger, saved: SaveReport, store: Option<&StoreContext>) {
    let state_value = saved.result.state_value();
    ledger.cache_saved.report(state_value);
    match state_value {
        StateValue::Durable | StateValue::Skipped => {
            tracing::info!("memory: {state_value} — {}", saved.result.detail)
        }
        StateValue::StoreOnly | StateValue::DeclinedForSafety | StateValue::NotPersisted => {
            log::warning(&format!(
                "memory: {state_value} ({}): {}",
                saved.result.outcome, saved.result.detail
            ))
        }
    }
    ledger.report.store_publish = match store {
        None => StorePublish::Disabled,
        Some(_) => saved.publish.outcome.clone(),
    };
    if let Some(lease) = saved.publish.lease.clone() {
        ledger.report.lease = lease;
    }
    ledger
        .report
        .concurrency_notes
        .extend(saved.cache_merge.notes());
    ledger
        .report
        .concurrency_notes
        .extend(saved.publish.notes());
    ledger.report.checkpoint = saved.checkpoint;
    ledger.report.scrub = saved.scrub;
    ledger.report.save = Some(saved.result);
}

/// What the user reads comes first (summary, `duration`); the niceties after it, each within what
/// is left of a cancel budget (a lease left behind is post's to release).
async fn finish(ctx: &Admitted, mut ledger: Ledger, agent_run: AgentRun) -> RunExit {
    // Every text in the agent's words has been posted by now.
    ledger.report.links = crate::outbound::summary_row();
    let duration = ctx.started.elapsed();
    ctx.files
        .set_output_or_warn(output::DURATION, &duration.as_secs().to_string());
    let about = (&ctx.plan, ctx.gh.as_ref(), ctx.spend.as_ref());
    write_summary(&ctx.files, about, &agent_run, &ledger.report, duration);

    if let Some(store) = &ctx.store {
        let records = upload_run_records(
            store,
            &ctx.keys,
            &ctx.paths,
            &ctx.plan,
            &ledger.report,
            &agent_run,
        );
        if ctx.cancel.within_budget(records).await.is_none() {
            tracing::warn!("run records not uploaded before the cancel deadline");
        }
    }
    let succeeded = agent_run.outcome == Some(TurnOutcome::Completed);
    if succeeded {
        record_dedup(ctx).await;
    }
    let outcome = outcome_of(&agent_run);
    outcome.report(&ctx.files);
    let status = match (succeeded, outcome) {
        (true, RunOutcome::Empty) if ctx.settings.fail_on_empty => {
            log::error(
                "the agent finished without a written answer and delivered nothing (fail-on-empty)",
            );
            ExitStatus::Failed
        }
        (true, _) => ExitStatus::Success,
        (false, _) => ExitStatus::Failed,
    };
    RunExit {
        status,
        answer: agent_run.answer,
    }
}

/// The outcome of a run that reached the agent's turn (or tried to).
fn outcome_of(agent_run: &AgentRun) -> RunOutcome {
    match &agent_run.outcome {
        Some(TurnOutcome::Completed) if agent_run.delivery.delivered => RunOutcome::Delivered,
        Some(TurnOutcome::Completed) if agent_run.answer.is_some() => RunOutcome::Answered,
        Some(TurnOutcome::Completed) => RunOutcome::Empty,
        Some(TurnOutcome::TimedOut) => RunOutcome::TimedOut,
        Some(TurnOutcome::Capped { .. }) => RunOutcome::Capped,
        Some(TurnOutcome::Cancelled) => RunOutcome::Cancelled,
        Some(TurnOutcome::Failed(_)) | None => RunOutcome::Failed,
    }
}

/// A successful issue/PR run leaves a sentinel so a duplicate event within the window is skipped.
async fn record_dedup(ctx: &Admitted) {
    let (Some(sentinels), Some(_)) = (ctx.sentinels(), ctx.plan.dedup) else {
        return;
    };
    let attempt = ctx
        .env
        .get(crate::runner::env::GITHUB_RUN_ATTEMPT)
        .unwrap_or("1");
    let record = dedup::record(
        &sentinels,
        &ctx.event,
        &ctx.repository,
        &ctx.run_id,
        attempt,
        Some(ctx.plan.logical_key.as_str()),
        now_ms(),
    );
    match ctx.cancel.within_budget(record).await {
        Some(Ok(_)) | None => {}
        Some(Err(e)) => tracing::warn!("cannot record the dedup sentinel: {e}"),
    }
}

/// The save did not finish before the cancel deadline: say so, and let post retry.
fn out_of_time(ctx: &Admitted, cache_saved: &CacheSaved) -> RunExit {
    let text = "memory: not saved before the cancel deadline; the post step retries";
    log::warning(text);
    cache_saved.report(StateValue::NotPersisted);
    RunOutcome::Cancelled.report(&ctx.files);
    ctx.files.set_output_or_warn(
        output::DURATION,
        &ctx.started.elapsed().as_secs().to_string(),
    );
    if let Err(e) = ctx
        .files
        .append_summary(&format!("### Session Persistence\n\n{text}.\n\n"))
    {
        tracing::warn!("{e}");
    }
    RunExit::status(ExitStatus::Failed)
}

/// Another run kept the thread for all of `thread-wait`: nothing is restored, run or saved, and
/// the mention is answered with that (😕), so it is never dropped in silence.
async fn not_our_turn(
    ctx: &Admitted,
    cache_saved: &CacheSaved,
    tracker: Option<Arc<Tracker>>,
    (holder_id, waited): (&str, std::time::Duration),
) -> RunExit {
    let text = thread_turn::not_our_turn_text(holder_id, waited);
    if let Some(gh) = &ctx.gh {
        if let Some(url) = answer_only(ctx, gh, tracker.as_deref(), &text).await {
            ctx.files.set_output_or_warn(output::COMMENT_URL, &url);
        }
        ctx.files.save_state_or_warn(state::TRACKING_COMMENT, "");
    }
    // Memory was not touched: post has nothing to retry.
    skipped(
        &ctx.files,
        cache_saved,
        &format!("another run ({holder_id}) kept this thread for {} s (thread-wait); the thread was told", waited.as_secs()),
    )
}

/// The budget across runs is spent (`phases::budget`): the thread is told why and when it
/// resets, the agent does not start, and memory (restored, unchanged) is not saved.
async fn over_budget(
    ctx: &Admitted,
    cache_saved: &CacheSaved,
    tracker: Option<Arc<Tracker>>,
    (text, reason, row): (&str, &str, Option<&str>),
) -> RunExit {
    if let Some(gh) = &ctx.gh {
        if let Some(url) = answer_only(ctx, gh, tracker.as_deref(), text).await {
            ctx.files.set_output_or_warn(output::COMMENT_URL, &url);
        }
        ctx.files.save_state_or_warn(state::TRACKING_COMMENT, "");
    }
    log::warning(&format!("the agent did not start: {reason}"));
    let mut summary = format!(
        "### fro-bot\n\nNot run: {}\n\n{}\n\n",
        reason.replace('\n', " "),
        text.replace('\n', " ")
    );
    if let Some(row) = row {
        summary.push_str(&format!("Budget: {}\n\n", row.replace('\n', " ")));
    }
    if let Err(e) = ctx.files.append_summary(&summary) {
        tracing::warn!("{e}");
    }
    cache_saved.report(StateValue::Skipped);
    RunOutcome::OverBudget.report(&ctx.files);
    RunExit::status(ExitStatus::Skipped)
}

fn skipped(files: &FileCommands, cache_saved: &CacheSaved, reason: &str) -> RunExit {
    tracing::info!("skipped: {reason}");
    let text = format!("### fro-bot\n\nSkipped: {}\n\n", reason.replace('\n', " "));
    if let Err(e) = files.append_summary(&text) {
        tracing::warn!("{e}");
    }
    cache_saved.report(StateValue::Skipped);
    RunOutcome::Skipped.report(files);
    RunExit::status(ExitStatus::Skipped)
}
