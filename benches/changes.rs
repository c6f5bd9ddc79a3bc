//! Benchmark: reading and checking the agent's change (`safe_outputs::capture` + `checks`) for a
//! change of `FRO_BOT_BENCH_FILES` files (default 1,000) totalling `FRO_BOT_BENCH_KB` KiB (default
//! 4,096) in a repository of twice as many files, beside plain `git add -A && git diff --cached
//! --name-only` on the same work tree in the same run (what any tool reading the change must at
//! least do). Target: under 1 s for the default change, excluding network. Best of
//! `FRO_BOT_BENCH_REPS` (default 3). Run with `cargo bench --bench changes`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fro_bot::safe_outputs::{capture, checks};

const TARGET: Duration = Duration::from_secs(1);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@e",
            "-c",
            "safe.directory=*",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// `n` files of `size` bytes, 80-column lines of text.
fn write_files(root: &Path, n: usize, size: usize, salt: &str) {
    for i in 0..n {
        let dir = root.join(format!("src/m{}", i % 50));
        std::fs::create_dir_all(&dir).expect("dir");
        let line = format!("// {salt} file {i} {}\n", "x".repeat(60));
        let body = line.repeat(size / line.len() + 1);
        std::fs::write(dir.join(format!("f{i}.rs")), &body[..size]).expect("file");
    }
}

fn best(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let files = env_or("FRO_BOT_BENCH_FILES", 1000);
    let kb = env_or("FRO_BOT_BENCH_KB", 4096);
    let reps = env_or("FRO_BOT_BENCH_REPS", 3).max(1);
    let size = kb * 1024 / files;
    let repo = tempfile::tempdir().expect("repo");
    let ws = repo.path();
    git(ws, &["init", "-q", "-b", "main"]);
    write_files(ws, files * 2, size, "base");
    git(ws, &["add", "-A"]);
    git(ws, &["commit", "-q", "-m", "base"]);
    let base = capture::record_base(ws).expect("base");
    // The agent rewrites half of the files: `files` changed, `kb` KiB of new content.
    write_files(ws, files, size, "agent");
    let policy = checks::ChangePolicy {
        protected: vec![".github/".into(), "AGENTS.md".into(), "CODEOWNERS".into()],
        max_files: files as u64 + 1,
        max_bytes: (kb as u64 + 1) * 1024,
    };
    let mut changed = 0;
    let mut split = (Duration::MAX, Duration::MAX);
    let ours = best(reps, || {
        let t = Instant::now();
        let c = capture::capture(ws, &base).expect("capture");
        let read = t.elapsed();
        let t = Instant::now();
        assert!(
            checks::check(&c.change, &policy).is_empty(),
            "a clean change"
        );
        split = (split.0.min(read), split.1.min(t.elapsed()));
        changed = c.change.files.len();
    });
    assert_eq!(changed, files);
    let plain = best(reps, || {
        let index = ws.join(".git/index");
        let _ = std::fs::remove_file(&index);
        git(ws, &["read-tree", "HEAD"]);
        git(ws, &["add", "-A"]);
        git(ws, &["diff", "--cached", "--name-only"]);
    });
    let verdict = if ours < TARGET { "ok" } else { "OVER" };
    println!(
        "change: {files} files, {kb} KiB in a repository of {} files (best of {reps})",
        files * 2
    );
    println!(
        "capture + checks: {:.3} s (read {:.3} s, checks {:.3} s; {verdict}, target < {:.1} s) | plain git add -A + diff: {:.3} s | ratio {:.2}x",
        ours.as_secs_f64(),
        split.0.as_secs_f64(),
        split.1.as_secs_f64(),
        TARGET.as_secs_f64(),
        plain.as_secs_f64(),
        ours.as_secs_f64() / plain.as_secs_f64().max(1e-9)
    );
}
