//! The spend ledger (docs/persistence.md#the-spend-ledger): one line per run — its run key, the
//! login of who asked, when it started, and what its model requests cost as the key proxy counted
//! them — that the budget across runs is counted from (`max-daily-cost`,
//! `max-runs-per-user-per-hour`; docs/design.md#the-budget-across-runs). It travels in the marker
//! (`Marker::spend`), is joined at every merge (`absorb`, `for_marker`), is pruned past its window
//! (`SpendLedger::prune`), and with the object store also lives at `budget/spend.json`, read and
//! written under the repository lease (`memory::spend_store`). It never holds a secret or prompt
//! text. A restored ledger is untrusted input (`SpendLedger::read`): what cannot be believed is
//! left out and said, never a crash and never a silent reset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Budget;

pub const HOUR_MS: u64 = 3_600_000;
pub const DAY_MS: u64 = 24 * HOUR_MS;
/// The run's working copy beside the marker (not a cache path): what this run knows of the
/// ledger, folded into every marker it (or its post step) writes.
pub const WORKING_FILE: &str = "fro-bot-spend.json";
/// Lines kept at most (the newest): a day of runs of a busy repository, about 0.6 MB.
pub const MAX_ENTRIES: usize = 5_000;
/// A line dated later than this past now is not believed (it would never be pruned).
const CLOCK_SKEW_MS: u64 = 5 * 60_000;
/// No run costs more: a larger figure is not believed.
const MAX_RUN_COST: f64 = 100_000.0;
/// Run keys and logins are short (a login is at most 39 characters, a run key about 60).
const MAX_NAME: usize = 100;
/// Sums of costs compare with this slack, so $0.10 + $0.05 fits $0.15.
const EPSILON: f64 = 1e-9;

/// One run's line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `{runId}-{runAttempt}[-{identity}]`.
    pub run: String,
    /// The login of who asked for the run.
    pub actor: String,
    /// When the run was admitted, epoch milliseconds.
    pub at: u64,
    /// USD: what the run spent; while it runs (`running`), what it may spend of the daily budget.
    pub cost: f64,
    /// Input and output tokens the key proxy counted (0 while it runs).
    pub tokens: u64,
    /// The run holds `cost` and has not settled yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
}

/// The ledger: one line per run key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpendLedger {
    entries: BTreeMap<String, Entry>,
}

/// Whether a run may start, and what it holds of the daily budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// It may; `hold` is what it may spend of the daily budget (`None`: no daily budget).
    Pass {
        hold: Option<f64>,
    },
    Refused(Refusal),
}

/// Why a run may not start.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The repository's budget for today is spent (or held by runs under way).
    DailySpent {
        budget: f64,
        spent: f64,
        held: f64,
        running: usize,
        /// The run's own `max-cost`, which must fit in what is left.
        need: Option<f64>,
        resets_at: u64,
    },
    /// The actor started `limit` runs in the last hour.
    UserLimit {
        actor: String,
        limit: u32,
        resets_at: u64,
    },
}

/// Today's (UTC) standing of the daily budget.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Today {
    /// USD the runs that ended spent.
    pub spent: f64,
    /// USD the runs under way hold.
    pub held: f64,
    pub running: usize,
}

/// Who asks for a run, and when.
#[derive(Debug, Clone, Copy)]
pub struct Asking<'a> {
    pub actor: &'a str,
    pub max_cost: Option<f64>,
    pub now_ms: u64,
}

impl SpendLedger {
    /// A restored ledger (a marker's `spend`, the store's object): untrusted. Lines that cannot
    /// be believed are left out, and the notes say how many and why; a value that is no list is
    /// read as empty, and said.
    pub fn read(value: &Value, now_ms: u64) -> (SpendLedger, Vec<String>) {
        let Some(items) = value.as_array() else {
            let note = "the spend ledger in memory is not a list: it was counted from zero (today's earlier spend is unknown)";
            return (SpendLedger::default(), vec![note.to_string()]);
        };
        let mut ledger = SpendLedger::default();
        let mut dropped: BTreeMap<&'static str, usize> = BTreeMap::new();
        for item in items {
            match entry_of(item, now_ms) {
                Ok(entry) => ledger.join_one(entry),
                Err(why) => *dropped.entry(why).or_default() += 1,
            }
        }
        let mut notes = Vec::new();
        if !dropped.is_empty() {
            let why: Vec<String> = dropped.iter().map(|(w, n)| format!("{w}: {n}")).collect();
            notes.push(format!(
                "the spend ledger in memory had {} line(s) that cannot be believed, left out ({})",
                dropped.values().sum::<usize>(),
                why.join("; ")
            ));
        }
        if ledger.entries.len() > MAX_ENTRIES {
            notes.push(format!(
                "the spend ledger in memory had {} lines: the newest {MAX_ENTRIES} were kept",
                ledger.entries.len()
            ));
            ledger.keep_newest();
        }
        (ledger, notes)
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn get(&self, run: &str) -> Option<&Entry> {
        self.entries.get(run)
    }

    /// Another copy's lines joined in: for a run both hold, the settled line, else the larger
    /// cost (never counting less than either copy says).
    pub fn join(&mut self, other: SpendLedger) {
        other.entries.into_values().for_each(|e| self.join_one(e));
    }

    /// Another copy's lines for the runs this one lacks (this one's stand: the store's, read
    /// under the lease, over a restored copy's).
    pub fn add_missing(&mut self, other: SpendLedger) {
        for (run, entry) in other.entries {
            self.entries.entry(run).or_insert(entry);
        }
    }

    /// This run's own line, over whatever stood for it.
    pub fn record(&mut self, entry: Entry) {
        self.entries.insert(entry.run.clone(), entry);
    }

    fn join_one(&mut self, entry: Entry) {
        let better = match self.entries.get(&entry.run) {
            None => true,
            Some(held) => match (held.running, entry.running) {
                (true, false) => true,
                (false, true) => false,
                _ => {
                    entry.cost > held.cost
                        || (entry.cost == held.cost && entry.tokens > held.tokens)
                }
            },
        };
        if better {
            self.entries.insert(entry.run.clone(), entry);
        }
    }

    /// Lines older than both windows (today, UTC, and the last hour) go; at most
    /// [`MAX_ENTRIES`] stay.
    pub fn prune(&mut self, now_ms: u64) {
        let from = day_start(now_ms).min(now_ms.saturating_sub(HOUR_MS));
        self.entries.retain(|_, e| e.at >= from);
        self.keep_newest();
    }

    fn keep_newest(&mut self) {
        if self.entries.len() <= MAX_ENTRIES {
            return;
        }
        let mut times: Vec<u64> = self.entries.values().map(|e| e.at).collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = times[MAX_ENTRIES - 1];
        self.entries.retain(|_, e| e.at >= cutoff);
        while self.entries.len() > MAX_ENTRIES {
            let oldest = self
                .entries
                .values()
                .min_by_key(|e| e.at)
                .map(|e| e.run.clone());
            if let Some(run) = oldest {
                self.entries.remove(&run);
            }
        }
    }

    /// The lines as JSON (oldest first), as the marker and the store keep them.
    pub fn to_value(&self) -> Value {
        let mut lines: Vec<&Entry> = self.entries.values().collect();
        lines.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.run.cmp(&b.run)));
        serde_json::to_value(lines).unwrap_or(Value::Array(Vec::new()))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a run asked for by `asking` may start under `budget`: the per-user hourly limit,
    /// then the daily budget (what runs spent today, UTC, and what runs under way hold).
    pub fn judge(&self, budget: &Budget, asking: Asking<'_>) -> Verdict {
        if let Some(limit) = budget.max_runs_per_user_per_hour {
            if let Some(refusal) = self.user_limit(limit, asking) {
                return Verdict::Refused(refusal);
            }
        }
        let Some(max) = budget.max_daily_cost else {
            return Verdict::Pass { hold: None };
        };
        let Today {
            spent,
            held,
            running,
        } = self.today(asking.now_ms);
        let left = max - spent - held;
        let fits = left > EPSILON && asking.max_cost.is_none_or(|need| need <= left + EPSILON);
        match fits {
            true => Verdict::Pass {
                hold: Some(asking.max_cost.unwrap_or(left)),
            },
            false => Verdict::Refused(Refusal::DailySpent {
                budget: max,
                spent,
                held,
                running,
                need: asking.max_cost,
                resets_at: day_start(asking.now_ms) + DAY_MS,
            }),
        }
    }

    /// What runs spent today (UTC) and what runs under way hold.
    pub fn today(&self, now_ms: u64) -> Today {
        let since = day_start(now_ms);
        let mut today = Today::default();
        for e in self.entries.values().filter(|e| e.at >= since) {
            match e.running {
                true => (today.held, today.running) = (today.held + e.cost, today.running + 1),
                false => today.spent += e.cost,
            }
        }
        today
    }

    /// The runs `actor` started in the last hour.
    pub fn runs_this_hour(&self, actor: &str, now_ms: u64) -> usize {
        let since = now_ms.saturating_sub(HOUR_MS);
        (self.entries.values())
            .filter(|e| e.at > since && e.actor.eq_ignore_ascii_case(actor))
            .count()
    }

    fn user_limit(&self, limit: u32, asking: Asking<'_>) -> Option<Refusal> {
        let since = asking.now_ms.saturating_sub(HOUR_MS);
        let mut times: Vec<u64> = (self.entries.values())
            .filter(|e| e.at > since && e.actor.eq_ignore_ascii_case(asking.actor))
            .map(|e| e.at)
            .collect();
        if times.len() < limit as usize {
            return None;
        }
        times.sort_unstable();
        // The run that must turn an hour old before one more fits.
        let freeing = times[times.len() - limit as usize..].first().copied();
        Some(Refusal::UserLimit {
            actor: asking.actor.to_string(),
            limit,
            resets_at: freeing.unwrap_or(asking.now_ms) + HOUR_MS,
        })
    }
}

/// A line of a restored ledger, or why it cannot be believed.
fn entry_of(v: &Value, now_ms: u64) -> Result<Entry, &'static str> {
    let name = |k: &str| {
        v[k].as_str()
            .filter(|s| !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control))
            .map(str::to_string)
    };
    let run = name("run").ok_or("no run key, or not a short name")?;
    let actor = name("actor").ok_or("no actor, or not a short name")?;
    let at = v["at"].as_u64().ok_or("a time that is not a number")?;
    if at > now_ms.saturating_add(CLOCK_SKEW_MS) {
        return Err("a time in the future");
    }
    let cost = (v["cost"].as_f64())
        .filter(|c| c.is_finite() && (0.0..=MAX_RUN_COST).contains(c))
        .ok_or("a cost that is negative, not a number or absurd")?;
    let tokens = v["tokens"]
        .as_u64()
        .ok_or("a token count that is not a count")?;
    Ok(Entry {
        run,
        actor,
        at,
        cost,
        tokens,
        running: v["running"].as_bool() == Some(true),
    })
}

impl Refusal {
    /// The answer on the thread.
    pub fn text(&self, now_ms: u64) -> String {
        match self {
            Refusal::DailySpent {
                budget,
                spent,
                held,
                running,
                need,
                resets_at,
            } => {
                let mut text = format!(
                    "The daily budget of this repository is spent; it resets at {} ({}). Today: ${spent:.2} spent",
                    clock(*resets_at),
                    wait(*resets_at, now_ms)
                );
                if *running > 0 {
                    text.push_str(&format!(", ${held:.2} held by {running} run(s) under way"));
                }
                text.push_str(&format!(" of ${budget:.2} (`max-daily-cost`)"));
                if let Some(need) = need {
                    text.push_str(&format!("; a run may spend up to ${need:.2} (`max-cost`)"));
                }
                text + ". I did not start the agent."
            }
            Refusal::UserLimit {
                actor,
                limit,
                resets_at,
            } => format!(
                "@{actor} has started {limit} run(s) in the last hour, the limit of `max-runs-per-user-per-hour`; it resets at {} ({}). I did not start the agent.",
                clock(*resets_at),
                wait(*resets_at, now_ms)
            ),
        }
    }

    /// The summary's row.
    pub fn summary(&self) -> String {
        match self {
            Refusal::DailySpent { resets_at, .. } => {
                format!("the daily budget is spent; resets at {}", clock(*resets_at))
            }
            Refusal::UserLimit {
                actor, resets_at, ..
            } => format!(
                "@{actor} reached `max-runs-per-user-per-hour`; resets at {}",
                clock(*resets_at)
            ),
        }
    }
}

/// `2026-12-05 00:00 UTC`.
pub fn clock(ms: u64) -> String {
    let iso = crate::runner::format_ms(i64::try_from(ms).unwrap_or(i64::MAX));
    format!("{} {} UTC", &iso[..10], &iso[11..16])
}

/// `in 5 h 12 min`.
fn wait(until: u64, now_ms: u64) -> String {
    let min = until.saturating_sub(now_ms).div_ceil(60_000);
    match min / 60 {
        0 => format!("in {min} min"),
        h => format!("in {h} h {} min", min % 60),
    }
}

/// The start of `now_ms`'s UTC day.
pub fn day_start(now_ms: u64) -> u64 {
    now_ms - now_ms % DAY_MS
}

/// The run's working copy.
pub fn working_file(data_dir: &Path) -> PathBuf {
    data_dir.join(WORKING_FILE)
}

/// The working copy, read as untrusted (it lies in the data dir); missing: empty.
pub fn load_working(data_dir: &Path, now_ms: u64) -> (SpendLedger, Vec<String>) {
    match std::fs::read(working_file(data_dir)) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => SpendLedger::read(&v, now_ms),
            Err(e) => (
                SpendLedger::default(),
                vec![format!(
                    "the run's spend ledger is unreadable ({e}): counted from zero"
                )],
            ),
        },
        Err(_) => (SpendLedger::default(), Vec::new()),
    }
}

/// Writes the working copy, atomically.
pub fn save_working(data_dir: &Path, ledger: &SpendLedger) -> std::io::Result<()> {
    let tmp = data_dir.join(format!(".{WORKING_FILE}.tmp"));
    std::fs::write(&tmp, ledger.to_value().to_string())?;
    std::fs::rename(&tmp, working_file(data_dir))
}

/// Joins `value` (the `spend` of a marker restored or merged) into the working copy; returns what
/// could not be believed.
pub fn absorb(data_dir: &Path, value: Option<&Value>, now_ms: u64) -> Vec<String> {
    let Some(value) = value else {
        return Vec::new();
    };
    let (mut ledger, mut notes) = load_working(data_dir, now_ms);
    let (theirs, their_notes) = SpendLedger::read(value, now_ms);
    notes.extend(their_notes);
    ledger.join(theirs);
    ledger.prune(now_ms);
    if let Err(e) = save_working(data_dir, &ledger) {
        notes.push(format!("cannot write the run's spend ledger: {e}"));
    }
    notes
}

/// The marker's `spend`: the ledger of the marker on disk (`on_disk`) joined with the working
/// copy, pruned; `None` when both are empty.
pub fn for_marker(data_dir: &Path, on_disk: Option<&Value>, now_ms: u64) -> Option<Value> {
    let (mut ledger, _) = load_working(data_dir, now_ms);
    if let Some(value) = on_disk {
        ledger.join(SpendLedger::read(value, now_ms).0);
    }
    ledger.prune(now_ms);
    (!ledger.is_empty()).then(|| ledger.to_value())
}

#[cfg(test)]
mod tests;
