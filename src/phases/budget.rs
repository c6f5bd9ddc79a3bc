//! The budget across runs in the main step (docs/design.md#the-budget-across-runs): after the
//! restore and before the agent, `judge` counts the spend ledger (`memory::spend_ledger`) against
//! `max-daily-cost` and `max-runs-per-user-per-hour` — under the repository lease with the object
//! store (`memory::spend_store::reserve`), from memory alone without it — and records this run's
//! line, holding what it may spend of the daily budget (the key proxy's cost cap, `Meter::hold`);
//! after the turn, `settle` makes the line what the key proxy counted, however the turn ended.

use std::time::Duration;

use crate::memory::report::PersistenceReport;
use crate::memory::spend_ledger::{self, Asking, Entry, SpendLedger, Verdict};
use crate::memory::spend_store::{self as store, Section};
use crate::memory::state_paths::{check_marker, MarkerCheck};
use crate::phases::run_context::Admitted;
use crate::runner::{log, now_ms};

/// How long a run waits for another run's lease section before counting from memory alone.
const LEASE_WAIT: Duration = Duration::from_secs(60);

/// Whether the run may start its agent.
pub(crate) enum Gate {
    /// It may; its line, to settle after the turn.
    Pass(Entry),
    /// It may not: the answer on the thread and the summary's reason.
    Refused { text: String, reason: String },
}

/// Judges the run against the budget and, when it passes, records its line (a hold).
pub(crate) async fn judge(ctx: &Admitted, report: &mut PersistenceReport) -> Gate {
    let now = now_ms();
    let actor = actor(ctx);
    let asking = Asking {
        actor: &actor,
        max_cost: ctx.settings.spend_cap.max_cost,
        now_ms: now,
    };
    let line = |hold: Option<f64>| Entry {
        run: ctx.keys.run_key(),
        actor: actor.clone(),
        at: now,
        cost: hold.unwrap_or(0.0),
        tokens: 0,
        running: true,
    };
    let (verdict, mut ledger, how, notes) = count(ctx, asking, &line, now).await;
    notes.iter().for_each(|n| log::warning(n));
    let gate = match &verdict {
        Verdict::Pass { hold } => {
            if let Some(hold) = hold {
                ctx.spend.hold(*hold);
            }
            let entry = line(*hold);
            ledger.record(entry.clone());
            Gate::Pass(entry)
        }
        Verdict::Refused(refusal) => Gate::Refused {
            text: refusal.text(now),
            reason: refusal.summary(),
        },
    };
    ledger.prune(now);
    if let Err(e) = spend_ledger::save_working(&ctx.paths.data_dir, &ledger) {
        log::warning(&format!("cannot write the run's spend ledger: {e}"));
    }
    let budget = ctx.settings.budget;
    report.budget = budget
        .is_set()
        .then(|| row(&ledger, (&actor, now), ctx, how, &notes));
    gate
}

/// The verdict, the ledger it was reached on, how exact it is, and what could not be believed:
/// under the store's lease when there is a store and a budget (the run's line put before the
/// lease is released), else from the ledger memory restored.
async fn count(
    ctx: &Admitted,
    asking: Asking<'_>,
    line: &dyn Fn(Option<f64>) -> Entry,
    now: u64,
) -> (Verdict, SpendLedger, &'static str, Vec<String>) {
    let budget = ctx.settings.budget;
    let (local, mut notes) = restored(ctx, now);
    let Some(store) = ctx.store.as_ref().filter(|_| budget.is_set()) else {
        let verdict = local.judge(&budget, asking);
        return (
            verdict,
            local,
            "best effort: counted from the Actions cache's memory",
            notes,
        );
    };
    let put_line = |verdict: &Verdict| match verdict {
        Verdict::Pass { hold } => Some(line(*hold)),
        Verdict::Refused(_) => None,
    };
    let judge = |l: &SpendLedger| l.judge(&budget, asking);
    match store::reserve(&section(ctx, store, now), local.clone(), judge, put_line).await {
        Ok((verdict, ledger, store_notes)) => {
            notes.extend(store_notes);
            (
                verdict,
                ledger,
                "exact: counted under the object store's lease",
                notes,
            )
        }
        Err(e) => {
            notes.push(format!(
                "the budget was counted from memory alone ({e}): runs beside this one may overshoot it"
            ));
            let verdict = local.judge(&budget, asking);
            (
                verdict,
                local,
                "best effort: counted from memory alone",
                notes,
            )
        }
    }
}

/// After the turn: this run's line is what the key proxy counted (the threat check's request
/// included), in the working copy (so the marker carries it) and, with the store and a budget,
/// in the store's ledger under the lease.
pub(crate) async fn settle(ctx: &Admitted, line: Entry, report: &mut PersistenceReport) {
    let now = now_ms();
    let spent = ctx.spend.spent();
    let entry = Entry {
        cost: spent.cost,
        tokens: spent.tokens(),
        running: false,
        ..line
    };
    let (mut ledger, _) = spend_ledger::load_working(&ctx.paths.data_dir, now);
    ledger.record(entry.clone());
    ledger.prune(now);
    if let Err(e) = spend_ledger::save_working(&ctx.paths.data_dir, &ledger) {
        log::warning(&format!("cannot write the run's spend ledger: {e}"));
    }
    let Some(store) = ctx.store.as_ref().filter(|_| ctx.settings.budget.is_set()) else {
        return;
    };
    if let Err(e) = store::settle(&section(ctx, store, now), entry).await {
        let text =
            format!("the store's spend ledger keeps this run's hold, not what it spent: {e}");
        log::warning(&text);
        if let Some(row) = report.budget.as_mut() {
            row.push_str(&format!("; {text}"));
        }
    }
}

/// Who asked: the triggering actor, else the workflow's.
fn actor(ctx: &Admitted) -> String {
    (ctx.plan.author.clone())
        .or_else(|| {
            ctx.env
                .get(crate::runner::env::GITHUB_ACTOR)
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The ledger as this run restored it: the working copy (with the ledgers of cache entries merged
/// at restore) joined with the restored marker's.
fn restored(ctx: &Admitted, now: u64) -> (SpendLedger, Vec<String>) {
    let (mut ledger, mut notes) = spend_ledger::load_working(&ctx.paths.data_dir, now);
    if let MarkerCheck::Compatible(marker) = check_marker(&ctx.paths.marker()) {
        if let Some(value) = &marker.spend {
            let (theirs, their_notes) = SpendLedger::read(value, now);
            ledger.join(theirs);
            notes.extend(their_notes);
        }
    }
    ledger.prune(now);
    (ledger, notes)
}

fn section<'a>(
    ctx: &'a Admitted,
    store: &'a crate::memory::ledger::StoreContext,
    now_ms: u64,
) -> Section<'a> {
    Section {
        store,
        holder: &ctx.lease_holder,
        files: &ctx.files,
        cancel: &ctx.cancel,
        wait: LEASE_WAIT,
        now_ms,
    }
}

/// The summary's "Budget" row.
fn row(
    ledger: &SpendLedger,
    (actor, now): (&str, u64),
    ctx: &Admitted,
    how: &str,
    notes: &[String],
) -> String {
    let budget = ctx.settings.budget;
    let mut parts = Vec::new();
    if let Some(max) = budget.max_daily_cost {
        let today = ledger.today(now);
        parts.push(format!(
            "today ${:.2} spent, ${:.2} held by {} run(s) under way, of ${max:.2}; resets at {}",
            today.spent,
            today.held,
            today.running,
            spend_ledger::clock(spend_ledger::day_start(now) + spend_ledger::DAY_MS)
        ));
    }
    if let Some(limit) = budget.max_runs_per_user_per_hour {
        let runs = ledger.runs_this_hour(actor, now);
        parts.push(format!("@{actor}: {runs} of {limit} run(s) this hour"));
    }
    parts.push(format!("({how})"));
    parts.extend(notes.iter().cloned());
    parts.join("; ")
}
