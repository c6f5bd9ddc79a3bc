//! Benchmark: merging this run's changed sessions (one continued, one new) into a large base
//! database, beside what a save costs on the same file in the same run: a plain file copy, and
//! fro-bot's cache archive (tar + zstd, the local part of a cache save).
//!
//! Then both runs continued one 10,000-message session (docs/persistence.md#both-runs-continued-
//! one-session): the merge that keeps both exchanges, beside today's rule on the same data (the
//! later run's version of the tree written whole, as it is when only one run continued it), and
//! beside the fallback when the exchanges cannot be joined (checked, then today's rule).
//!
//! The base is built from OpenCode 1.18.33's real schema and migration list: sessions of turns
//! (messages, parts with ~1.5 KB of text each, events, todos), to `FRO_BOT_BENCH_MB` (default 200).
//! Best of `FRO_BOT_BENCH_REPS` (default 3). Run with `cargo bench --profile dev --bench merge`
//! (see docs/benchmarks.md).

use std::time::{Duration, Instant};

use rusqlite::Connection;

#[path = "support/opencode_db.rs"]
mod opencode_db;
use opencode_db::{generate, session, turn, TURNS_PER_SESSION};

use fro_bot::memory::merge::{self, MergeOptions, Snapshot, Verify};
use rusqlite::params;

const MB: u64 = 1_000_000;

fn main() {
    let mb: u64 = env_or("FRO_BOT_BENCH_MB", 200);
    let reps: usize = env_or("FRO_BOT_BENCH_REPS", 3).max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let t = Instant::now();
    let base = dir.path().join("base/opencode.db");
    std::fs::create_dir_all(base.parent().expect("parent")).expect("base dir");
    let sessions = generate(&base, mb * MB);
    let size = std::fs::metadata(&base).expect("base").len();
    println!(
        "base: {:.0} MB, {sessions} sessions of {TURNS_PER_SESSION} turns (generated in {:.1} s)",
        size as f64 / MB as f64,
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let snap = Snapshot::capture(&base).expect("snapshot");
    let capture = t.elapsed();
    // This run continued session 0 (5 turns) and answered a new thread (10 turns).
    let ours = dir.path().join("ours.db");
    std::fs::copy(&base, &ours).expect("ours");
    {
        let c = Connection::open(&ours).expect("ours");
        let tx = c.unchecked_transaction().expect("tx");
        for t in 0..5 {
            turn(&tx, "ses_00000", TURNS_PER_SESSION + t, 9_000_000);
        }
        session(&tx, "ses_new", 10, 9_000_001);
        tx.commit().expect("commit");
    }

    let best = |v: Vec<Duration>| v.into_iter().min().unwrap_or_default().as_secs_f64();
    let copies = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("copy-{r}.db"));
                let t = Instant::now();
                std::fs::copy(&base, &to).expect("copy");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm copy");
                e
            })
            .collect(),
    );
    let synced_copies = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("synced-{r}.db"));
                let t = Instant::now();
                std::fs::copy(&base, &to).expect("copy");
                std::fs::File::open(&to)
                    .and_then(|f| f.sync_all())
                    .expect("fsync");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm copy");
                e
            })
            .collect(),
    );
    let archives = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("archive-{r}.tzst"));
                let paths = [base.to_string_lossy().into_owned()];
                let t = Instant::now();
                fro_bot::cache::write_archive(&paths, dir.path(), &to).expect("archive");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm archive");
                e
            })
            .collect(),
    );
    let mut rows = Vec::new();
    for verify in [Verify::Written, Verify::Full] {
        let mut runs = Vec::new();
        for r in 0..reps {
            sync();
            let out = dir.path().join(format!("merged-{r}.db"));
            let t = Instant::now();
            let report = merge::merge_with(
                &base,
                &ours,
                &snap,
                &out,
                MergeOptions {
                    verify,
                    ..Default::default()
                },
            )
            .expect("merge");
            runs.push((t.elapsed(), report));
            std::fs::remove_file(&out).expect("rm merged");
        }
        runs.sort_by_key(|(d, _)| *d);
        let (total, report) = runs.swap_remove(0);
        assert_eq!(report.taken.len(), 2, "{report:?}");
        rows.push((verify, total, report));
    }
    println!(
        "best of {reps}; snapshot capture at restore: {:.3} s",
        capture.as_secs_f64()
    );
    println!("| step | time | vs file copy + fsync | vs cache archive |");
    println!("|---|---|---|---|");
    let line = |name: &str, t: f64| {
        println!(
            "| {name} | {t:.3} s | {:.2}× | {:.2}× |",
            t / synced_copies,
            t / archives
        )
    };
    line("file copy of the base (baseline)", copies);
    line("file copy + fsync (baseline)", synced_copies);
    line("cache archive of the base, tar+zstd (baseline)", archives);
    for (verify, total, report) in rows {
        line(
            &format!(
                "merge, verify {verify:?} (copy {:.3} s, merge {:.3} s, fsync {:.3} s; {} rows in, {} out)",
                report.copy_time.as_secs_f64(),
                report.merge_time.as_secs_f64(),
                report.sync_time.as_secs_f64(),
                report.rows_inserted,
                report.rows_deleted,
            ),
            total.as_secs_f64(),
        );
    }
    both_continued_one_session(dir.path(), &base, reps);
}

/// Messages of the session both runs continued.
const LONG_THREAD: usize = 10_000;

/// Both runs continued one 10,000-message session of the base: the union beside today's rule.
fn both_continued_one_session(dir: &std::path::Path, generated: &std::path::Path, reps: usize) {
    let t = Instant::now();
    let restored = dir.join("thread.db");
    std::fs::copy(generated, &restored).expect("copy");
    {
        let c = Connection::open(&restored).expect("restored");
        let tx = c.unchecked_transaction().expect("tx");
        fresh_session(&tx, "ses_thread", 8_000_000);
        for i in 0..LONG_THREAD / 2 {
            exchange(&tx, "ses_thread", 8_000_000 + 10 * i as i64, &[5]);
        }
        tx.commit().expect("commit");
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
    }
    let snap = Snapshot::capture(&restored).expect("snapshot");
    // The other run's turn (a tool step, so it was still working when this run asked) and this
    // run's, 5 messages each.
    let other = dir.join("other.db");
    let ours = dir.join("ours-thread.db");
    for p in [&other, &ours] {
        std::fs::copy(&restored, p).expect("copy");
    }
    let c = Connection::open(&other).expect("other");
    exchange(&c, "ses_thread", 9_500_000, &[10, 5_000]);
    exchange(&c, "ses_thread", 9_510_000, &[10]);
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    drop(c);
    let c = Connection::open(&ours).expect("ours");
    let mut own: Vec<String> = exchange(&c, "ses_thread", 9_502_000, &[10, 20]);
    own.extend(exchange(&c, "ses_thread", 9_503_000, &[10]));
    let own: std::collections::BTreeSet<String> = own.into_iter().collect();
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    drop(c);
    println!(
        "\nboth runs continued one {LONG_THREAD}-message session (built in {:.1} s); best of {reps}",
        t.elapsed().as_secs_f64()
    );
    let timed = |name: &str, base: &std::path::Path, restored: &Snapshot, own| {
        let mut runs = Vec::new();
        for r in 0..reps {
            sync();
            let out = dir.join(format!("thread-out-{r}.db"));
            let options = MergeOptions {
                own_messages: own,
                ..Default::default()
            };
            let t = Instant::now();
            let report = merge::merge_with(base, &ours, restored, &out, options).expect("merge");
            runs.push((t.elapsed(), report));
            std::fs::remove_file(&out).expect("rm");
        }
        runs.sort_by_key(|(d, _)| *d);
        let (best, report) = runs.swap_remove(0);
        println!(
            "{name}: {:.3} s (copy {:.3} s, merge {:.3} s, fsync {:.3} s; {} kept both, {} moved, {} conflict(s); {} rows in, {} out)",
            best.as_secs_f64(),
            report.copy_time.as_secs_f64(),
            report.merge_time.as_secs_f64(),
            report.sync_time.as_secs_f64(),
            report.kept_both.len(),
            report.reissued.len(),
            report.conflicts.len(),
            report.rows_inserted,
            report.rows_deleted,
        );
        best.as_secs_f64()
    };
    // Today's rule: the later version of the tree written whole (what a conflict did, and what a
    // tree only this run continued still gets).
    let today = timed(
        "today's rule (this run's tree whole)",
        &restored,
        &snap,
        None,
    );
    let union = timed(
        "both exchanges kept",
        &other,
        &Snapshot::empty(),
        Some(&own),
    );
    let refused = timed(
        "cannot be joined (the exchanges interleave, nothing may move): checked, then today's rule",
        &other,
        &Snapshot::empty(),
        None,
    );
    println!(
        "| both kept / today's rule | {:.2}× (target ≤ 1.5×) | fallback / today's rule | {:.2}× |",
        union / today,
        refused / today
    );
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An id of OpenCode's shape made at `ms` (`{prefix}_` + 12 hex of ms × 4096 + 1, then 14 base62).
fn oc_id(prefix: &str, ms: i64) -> String {
    let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{prefix}_{:012x}{n:014}",
        (ms as u64 * 4096 + 1) % (1 << 48)
    )
}

fn fresh_session(c: &Connection, id: &str, at: i64) {
    session(c, id, 0, at);
}

fn log_event(c: &Connection, session: &str, kind: &str, data: &str) {
    let seq: i64 = c
        .query_row(
            "UPDATE event_sequence SET seq = seq + 1 WHERE aggregate_id = ?1 RETURNING seq",
            [session],
            |r| r.get(0),
        )
        .expect("seq");
    c.execute(
        "INSERT INTO event VALUES (?1, ?2, ?3, ?4, ?5)",
        params![oc_id("evt", 1), session, seq, kind, data],
    )
    .expect("event");
}

/// A question at `at` and an answer `step` ms after it per step, as OpenCode 1.18 writes them
/// (~1.5 KB of text a part, each answer's `parentID` its question, their events); the ids.
fn exchange(c: &Connection, session: &str, at: i64, steps: &[i64]) -> Vec<String> {
    let filler = "The agent read src/lib.rs and proposed a change to the parser. ".repeat(24);
    let q = oc_id("msg", at);
    let mut ids = vec![q.clone()];
    let write = |id: &str, t: i64, data: serde_json::Value| {
        c.execute(
            "INSERT INTO message VALUES (?1, ?2, ?3, ?3, ?4)",
            params![id, session, t, data.to_string()],
        )
        .expect("message");
        let part = oc_id("prt", t);
        let text = serde_json::json!({"type": "text", "text": filler});
        c.execute(
            "INSERT INTO part VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
            params![part, id, session, t, text.to_string()],
        )
        .expect("part");
        let info = serde_json::json!({"sessionID": session, "info": {"id": id}});
        log_event(c, session, "message.updated.1", &info.to_string());
        let part = serde_json::json!({"sessionID": session, "part": {"id": part, "messageID": id}});
        log_event(c, session, "message.part.updated.1", &part.to_string());
    };
    write(
        &q,
        at,
        serde_json::json!({"role": "user", "time": {"created": at}}),
    );
    for step in steps {
        let id = oc_id("msg", at + step);
        let data = serde_json::json!({"parentID": q, "role": "assistant",
            "time": {"created": at + step}, "cost": 0.01, "tokens": {"input": 100, "output": 10}});
        write(&id, at + step, data);
        ids.push(id);
    }
    c.execute(
        "UPDATE session SET time_updated = max(time_updated, ?2) WHERE id = ?1",
        params![session, at + steps.last().copied().unwrap_or(0)],
    )
    .expect("touch");
    ids
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}
