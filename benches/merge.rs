//! Benchmark: merging this run's changed sessions (one continued, one new) into a large base
//! database, beside what a save costs on the same file in the same run: a plain file copy, and
//! fro-bot's cache archive (tar + zstd, the local part of a cache save).
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

use fro_bot::merge::{self, MergeOptions, Snapshot, Verify};

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
