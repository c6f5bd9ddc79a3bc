//! Benchmark: where a save's and a restore's in-process time goes on an OpenCode-like database
//! (`FRO_BOT_BENCH_MB`, default 200): each step timed alone, best of `FRO_BOT_BENCH_REPS`.

#[path = "support/opencode_db.rs"]
mod opencode_db;

use std::time::{Duration, Instant};

use rusqlite::Connection;

const MB: u64 = 1_000_000;

fn main() {
    let mb: u64 = env_or("FRO_BOT_BENCH_MB", 200);
    let reps: usize = env_or("FRO_BOT_BENCH_REPS", 3).max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("opencode");
    std::fs::create_dir_all(&data).expect("data dir");
    let db = data.join("opencode.db");
    let t = Instant::now();
    let sessions = opencode_db::generate(&db, mb * MB);
    println!(
        "db: {:.0} MB, {sessions} sessions (generated in {:.1} s)",
        std::fs::metadata(&db).expect("db").len() as f64 / MB as f64,
        t.elapsed().as_secs_f64()
    );
    fro_bot::redact::register("savecost-bench-secret-0042");
    let best = |f: &mut dyn FnMut() -> Duration| {
        (0..reps)
            .map(|_| f())
            .min()
            .unwrap_or_default()
            .as_secs_f64()
    };
    let timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    let mut rows: Vec<(&str, f64)> = Vec::new();
    rows.push((
        "sha256 of the file",
        best(&mut || {
            timed(&mut || {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                std::io::copy(&mut std::fs::File::open(&db).expect("db"), &mut h).expect("hash");
            })
        }),
    ));
    rows.push((
        "quick_check",
        best(&mut || {
            timed(&mut || {
                let c = Connection::open(&db).expect("open");
                let _: String = c
                    .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                    .expect("qc");
            })
        }),
    ));
    rows.push((
        "sanitize (quick_check included)",
        best(&mut || {
            timed(&mut || {
                let _ = fro_bot::phases::sanitize::sanitize(&db, i64::MAX);
            })
        }),
    ));
    rows.push((
        "probe",
        best(&mut || {
            timed(&mut || {
                let _ = fro_bot::checkpoint::probe(&db);
            })
        }),
    ));
    rows.push((
        "snapshot capture",
        best(&mut || {
            timed(&mut || {
                let _ = fro_bot::merge::Snapshot::capture(&db);
            })
        }),
    ));
    rows.push((
        "scrub, whole",
        best(&mut || {
            timed(&mut || {
                let _ = fro_bot::scrub::scrub(&db, &fro_bot::scrub::Scope::Whole).expect("scrub");
            })
        }),
    ));
    rows.push((
        "scan the file for secrets",
        best(&mut || {
            timed(&mut || {
                let _ = fro_bot::scrub::file_holds_secrets(&db).expect("scan");
            })
        }),
    ));
    let paths = fro_bot::phases::paths::StatePaths::new(data.clone());
    rows.push((
        "write marker (hashes the file)",
        best(&mut || {
            timed(&mut || {
                fro_bot::phases::paths::write_marker(
                    &paths,
                    "1",
                    1,
                    None,
                    None,
                    fro_bot::phases::paths::Scrubbed::Whole,
                )
                .expect("marker");
            })
        }),
    ));
    let archive = dir.path().join("a.tzst");
    rows.push((
        "archive (tar + zstd)",
        best(&mut || {
            timed(&mut || {
                let _ = std::fs::remove_file(&archive);
                fro_bot::cache::write_archive(paths.cache_paths(), dir.path(), &archive)
                    .expect("archive");
            })
        }),
    ));
    let out = dir.path().join("out");
    rows.push((
        "extract",
        best(&mut || {
            let _ = std::fs::remove_dir_all(&out);
            std::fs::create_dir_all(&out).expect("out");
            let t = Instant::now();
            fro_bot::cache::extract_confined_into(
                &archive,
                paths.restore_targets(),
                dir.path(),
                &out,
            )
            .expect("extract");
            t.elapsed()
        }),
    ));
    for (name, secs) in rows {
        println!("| {name} | {secs:.3} s |");
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
