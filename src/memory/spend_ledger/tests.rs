use super::*;
use crate::memory::state_paths::StatePaths;
use serde_json::json;

/// 2026-12-04 17:00 UTC.
const NOW: u64 = 1_796_403_600_000;

fn line(run: &str, actor: &str, at: u64, cost: f64, running: bool) -> Entry {
    Entry {
        run: run.into(),
        actor: actor.into(),
        at,
        cost,
        tokens: 10,
        running,
    }
}

fn ledger(lines: &[Entry]) -> SpendLedger {
    let mut l = SpendLedger::default();
    lines.iter().cloned().for_each(|e| l.record(e));
    l
}

fn daily(max: f64) -> Budget {
    Budget {
        max_daily_cost: Some(max),
        max_runs_per_user_per_hour: None,
    }
}

fn asking(max_cost: Option<f64>) -> Asking<'static> {
    Asking {
        actor: "mona",
        max_cost,
        now_ms: NOW,
    }
}

#[test]
fn the_daily_budget_counts_todays_spend_and_holds_and_says_when_it_resets() {
    let yesterday = day_start(NOW) - 1;
    let l = ledger(&[
        line("1", "a", yesterday, 5.0, false),
        line("2", "a", NOW - 60_000, 0.10, false),
    ]);
    assert_eq!(
        l.judge(&daily(0.30), asking(None)),
        Verdict::Pass {
            hold: Some(0.19999999999999998)
        }
    );
    assert_eq!(
        l.judge(&daily(0.30), asking(Some(0.2))),
        Verdict::Pass { hold: Some(0.2) }
    );
    // A run under way holds its share: the next one fits only in what is left.
    let mut l = l;
    l.record(line("3", "b", NOW - 1000, 0.15, true));
    let Verdict::Refused(refusal) = l.judge(&daily(0.30), asking(Some(0.10))) else {
        panic!("passed a budget it does not fit");
    };
    let text = refusal.text(NOW);
    assert!(
        text.starts_with("The daily budget of this repository is spent; it resets at 2026-12-05 00:00 UTC (in 7 h 0 min)"),
        "{text}"
    );
    assert!(
        text.contains("$0.10 spent, $0.15 held by 1 run(s) under way of $0.30"),
        "{text}"
    );
    assert!(l.judge(&daily(0.30), asking(Some(0.05))) == Verdict::Pass { hold: Some(0.05) });
    // Spent to the cent: nothing is left.
    let l = ledger(&[
        line("4", "a", NOW - 1, 0.10, false),
        line("5", "a", NOW - 2, 0.05, false),
    ]);
    assert!(matches!(
        l.judge(&daily(0.15), asking(None)),
        Verdict::Refused(_)
    ));
}

#[test]
fn the_hourly_limit_is_per_actor_and_resets_when_the_oldest_counted_run_turns_an_hour_old() {
    let l = ledger(&[
        line("1", "Mona", NOW - 50 * 60_000, 0.0, false),
        line("2", "mona", NOW - 10 * 60_000, 0.0, true),
        line("3", "hubot", NOW - 5 * 60_000, 0.0, false),
        line("4", "mona", NOW - 70 * 60_000, 0.0, false),
    ]);
    let limit = |n| Budget {
        max_daily_cost: None,
        max_runs_per_user_per_hour: Some(n),
    };
    assert_eq!(
        l.judge(&limit(3), asking(None)),
        Verdict::Pass { hold: None }
    );
    let Verdict::Refused(refusal) = l.judge(&limit(2), asking(None)) else {
        panic!("a third run in the hour passed");
    };
    assert_eq!(
        refusal,
        Refusal::UserLimit {
            actor: "mona".into(),
            limit: 2,
            resets_at: NOW + 10 * 60_000
        }
    );
    assert!(refusal
        .text(NOW)
        .contains("it resets at 2026-12-04 17:10 UTC (in 10 min)"));
    let Verdict::Refused(Refusal::UserLimit { resets_at, .. }) = l.judge(&limit(1), asking(None))
    else {
        panic!()
    };
    assert_eq!(resets_at, NOW + 50 * 60_000, "the newest run must age out");
}

#[test]
fn a_hostile_ledger_is_read_line_by_line_and_says_what_it_left_out() {
    let value = json!([
        {"run": "ok", "actor": "mona", "at": NOW - 5, "cost": 0.5, "tokens": 3},
        {"run": "neg", "actor": "mona", "at": NOW - 5, "cost": -100.0, "tokens": 3},
        {"run": "nan", "actor": "mona", "at": NOW - 5, "cost": "NaN", "tokens": 3},
        {"run": "huge", "actor": "mona", "at": NOW - 5, "cost": 1e300, "tokens": 3},
        {"run": "future", "actor": "mona", "at": NOW + DAY_MS * 365, "cost": 1.0, "tokens": 3},
        {"run": "x".repeat(500), "actor": "mona", "at": NOW, "cost": 1.0, "tokens": 3},
        {"run": "ctl", "actor": "mo\u{1b}na", "at": NOW, "cost": 1.0, "tokens": 3},
        {"run": "tok", "actor": "mona", "at": NOW, "cost": 1.0, "tokens": -3},
        "a string", 7, null
    ]);
    let (l, notes) = SpendLedger::read(&value, NOW);
    assert_eq!(
        l.entries().map(|e| e.run.as_str()).collect::<Vec<_>>(),
        ["ok"]
    );
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("10 line(s) that cannot be believed"),
        "{notes:?}"
    );
    assert!(notes[0].contains("a time in the future: 1"), "{notes:?}");
    for not_a_list in [json!({"run": 1}), json!("x"), json!(null)] {
        let (l, notes) = SpendLedger::read(&not_a_list, NOW);
        assert!(l.is_empty());
        assert!(notes[0].contains("counted from zero"), "{notes:?}");
    }
    // A flood keeps the newest lines only.
    let flood: Vec<Value> = (0..MAX_ENTRIES as u64 + 50)
        .map(|i| json!({"run": format!("r{i}"), "actor": "a", "at": NOW - 100_000 + i, "cost": 0.0, "tokens": 0}))
        .collect();
    let (l, notes) = SpendLedger::read(&Value::Array(flood), NOW);
    assert_eq!(l.entries().count(), MAX_ENTRIES);
    assert!(l.get("r0").is_none() && l.get(&format!("r{}", MAX_ENTRIES + 49)).is_some());
    assert!(notes[0].contains("the newest 5000 were kept"), "{notes:?}");
}

#[test]
fn copies_join_without_counting_less_and_prune_past_both_windows() {
    let mut a = ledger(&[
        line("1", "a", NOW - 10, 0.2, true),
        line("2", "a", NOW - 10, 0.1, false),
    ]);
    let b = ledger(&[
        line("1", "a", NOW - 10, 0.05, false),
        line("2", "a", NOW - 10, 0.3, false),
        line("3", "b", NOW - 10, 0.4, true),
    ]);
    a.join(b.clone());
    let cost = |l: &SpendLedger, r: &str| l.get(r).map(|e| (e.cost, e.running));
    assert_eq!(cost(&a, "1"), Some((0.05, false)), "settled beats a hold");
    assert_eq!(
        cost(&a, "2"),
        Some((0.3, false)),
        "the larger of two settled lines"
    );
    assert_eq!(cost(&a, "3"), Some((0.4, true)));
    let mut store = ledger(&[line("1", "a", NOW - 10, 0.2, true)]);
    store.add_missing(b);
    assert_eq!(
        cost(&store, "1"),
        Some((0.2, true)),
        "the store's own line stands"
    );
    // Just after midnight the last hour reaches into yesterday; at noon only today counts.
    let midnight = day_start(NOW) + DAY_MS + 60_000;
    let mut l = ledger(&[
        line("y", "a", midnight - 30 * 60_000, 1.0, false),
        line("old", "a", NOW - 2 * HOUR_MS, 1.0, false),
    ]);
    l.prune(midnight);
    assert_eq!(
        l.entries().map(|e| e.run.as_str()).collect::<Vec<_>>(),
        ["y"]
    );
    l.prune(midnight + 12 * HOUR_MS);
    assert!(l.is_empty());
}

#[test]
fn the_working_copy_carries_joined_lines_into_the_marker() {
    let dir = tempfile::tempdir().unwrap();
    let paths = StatePaths::from_env(&crate::runner::Env::from_pairs([(
        "XDG_DATA_HOME",
        dir.path().to_str().unwrap(),
    )]))
    .unwrap();
    std::fs::create_dir_all(&paths.data_dir).unwrap();
    assert_eq!(for_marker(&paths.data_dir, None, NOW), None);
    let merged = json!([{"run": "m", "actor": "a", "at": NOW - 1, "cost": 0.25, "tokens": 9}]);
    assert!(absorb(&paths.data_dir, Some(&merged), NOW).is_empty());
    let on_disk =
        json!([{"run": "r", "actor": "a", "at": NOW - 1, "cost": 0.5, "tokens": 9}, {"bad": 1}]);
    let marker = for_marker(&paths.data_dir, Some(&on_disk), NOW).unwrap();
    let (l, _) = SpendLedger::read(&marker, NOW);
    assert_eq!(
        l.entries().map(|e| e.run.as_str()).collect::<Vec<_>>(),
        ["m", "r"]
    );
    std::fs::write(working_file(&paths.data_dir), b"{not json").unwrap();
    let (l, notes) = load_working(&paths.data_dir, NOW);
    assert!(l.is_empty() && notes[0].contains("unreadable"), "{notes:?}");
}
