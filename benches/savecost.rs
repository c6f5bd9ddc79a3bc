//! Benchmark (issue 24): a save and a restore of an OpenCode-like database as whole processes,
//! side by side with `@actions/cache` in the same run, against the same in-process cache test
//! server (`tests/it/support/cache_server.rs`), with each process's peak RSS (`wait4`'s
//! `ru_maxrss`, which covers the `tar`/`zstd` children the toolkit starts).
//!
//! - save: `fro-bot post` retrying main's save (state `not-persisted`), the way a run that
//!   continued restored memory leaves it: memory a fro-bot saved (scrubbed, its marker saying so)
//!   plus one new session, with main's scrub scope in the state. Once per size also with no scope
//!   (memory of unknown provenance: the whole scrub). Against `saveCache` of the same files.
//! - restore: this binary re-invoked as `restore-child`, running the restore phase
//!   (`memory::restore::restore`: download, extraction, checkpoint/probe, `quick_check` and
//!   sanitizing) and then what the main step does with it before the turn (the restored digest and
//!   the marker check, the session snapshot). Against `restoreCache` of the toolkit's own entry.
//!
//! Run through `scripts/bench-savecost`, which builds the release binary and installs the pinned
//! toolkit: `FRO_BOT_BENCH_BIN` (the `fro-bot` binary), `FRO_BOT_BENCH_TOOLKIT` (a directory
//! holding `node_modules/@actions/cache`), `FRO_BOT_BENCH_SIZES` (MB, default `10,200,1000`),
//! `FRO_BOT_BENCH_REPS` (default 2; best of). Figures: docs/benchmarks.md.

#[path = "../tests/it/support/cache_server.rs"]
#[allow(dead_code)]
mod cache_server;
// The same server speaks v1 too (it mounts these routes).
#[path = "../tests/it/support/cache_server_v1.rs"]
#[allow(dead_code)]
mod cache_server_v1;
#[path = "support/opencode_db.rs"]
mod opencode_db;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use fro_bot::memory::state_paths::{write_marker, Scrubbed, StatePaths};

const MB: u64 = 1_000_000;
const REPO: &str = "octo/bench";
/// The session the benchmarked run added to restored memory.
const NEW_SESSION: &str = "ses_bench_new";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("restore-child") {
        restore_child(&args[2..]);
        return;
    }
    let bin = PathBuf::from(std::env::var("FRO_BOT_BENCH_BIN").expect("FRO_BOT_BENCH_BIN"));
    let toolkit =
        PathBuf::from(std::env::var("FRO_BOT_BENCH_TOOLKIT").expect("FRO_BOT_BENCH_TOOLKIT"));
    let sizes: Vec<u64> = std::env::var("FRO_BOT_BENCH_SIZES")
        .unwrap_or_else(|_| "10,200,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let reps: usize = std::env::var("FRO_BOT_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let server = rt.block_on(cache_server::CacheServer::start());
    let script = write_toolkit_script(&toolkit);
    let mut rows = Vec::new();
    for mb in sizes {
        rows.push(bench_size(&server, &bin, &script, mb, reps));
    }
    println!();
    println!("best of {reps}; whole processes; peak RSS in MB");
    println!(
        "| size | save fro-bot | save toolkit | ratio (≤ 0.6×) | save, whole scrub | restore fro-bot (in-process) | restore toolkit | ratio (≤ 0.4×) | peak RSS fro-bot save / restore | peak RSS toolkit save / restore |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} MB | {:.2} s | {:.2} s | {:.2}× {} | {:.2} s | {:.2} s ({:.2} s) | {:.2} s | {:.2}× {} | {} / {} | {} / {} |",
            r.mb,
            r.save.secs,
            r.tk_save.secs,
            r.save.secs / r.tk_save.secs,
            verdict(r.save.secs / r.tk_save.secs, 0.6),
            r.whole.secs,
            r.restore.secs,
            r.restore_in_process,
            r.tk_restore.secs,
            r.restore.secs / r.tk_restore.secs,
            verdict(r.restore.secs / r.tk_restore.secs, 0.4),
            r.save.rss_mb,
            r.restore.rss_mb,
            r.tk_save.rss_mb,
            r.tk_restore.rss_mb,
        );
    }
}

fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target {
        "ok"
    } else {
        "OVER"
    }
}

struct Row {
    mb: u64,
    save: Proc,
    tk_save: Proc,
    whole: Proc,
    restore: Proc,
    restore_in_process: f64,
    tk_restore: Proc,
}

#[derive(Clone, Copy)]
struct Proc {
    secs: f64,
    rss_mb: u64,
}

fn best(runs: &[Proc]) -> Proc {
    runs.iter()
        .copied()
        .min_by(|a, b| a.secs.total_cmp(&b.secs))
        .expect("at least one run")
}

/// Where the job's files are: the same absolute paths for both tools, as on a runner.
struct Layout {
    root: tempfile::TempDir,
    workspace: PathBuf,
    home: PathBuf,
    paths: StatePaths,
    pristine: PathBuf,
}

impl Layout {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let workspace = root.path().join("github/workspace");
        let home = root.path().join("github/home");
        fs::create_dir_all(&workspace).expect("workspace");
        let paths = StatePaths::new(home.join(".local/share/opencode"));
        fs::create_dir_all(&paths.data_dir).expect("data dir");
        let pristine = root.path().join("pristine");
        fs::create_dir_all(&pristine).expect("pristine");
        Layout {
            root,
            workspace,
            home,
            paths,
            pristine,
        }
    }

    /// The data dir as the run left it (outside the timings; the page cache stays warm).
    fn reset(&self) {
        self.clear();
        for f in ["opencode.db", "fro-bot.json"] {
            fs::copy(self.pristine.join(f), self.paths.data_dir.join(f)).expect("reset");
        }
    }

    fn clear(&self) {
        let _ = fs::remove_dir_all(&self.paths.data_dir);
        fs::create_dir_all(&self.paths.data_dir).expect("data dir");
    }

    fn temp(&self) -> PathBuf {
        let t = self.root.path().join("runner-temp");
        fs::create_dir_all(&t).expect("runner temp");
        t
    }
}

fn bench_size(
    server: &cache_server::CacheServer,
    bin: &Path,
    script: &Path,
    mb: u64,
    reps: usize,
) -> Row {
    let layout = Layout::new();
    let db = layout.paths.db();
    let t = Instant::now();
    let sessions = opencode_db::generate(&db, mb * MB);
    // Memory a fro-bot saved: scrubbed whole, its marker naming it and saying so.
    fro_bot::memory::scrub::scrub(&db, &fro_bot::memory::scrub::Scope::Whole).expect("scrub");
    write_marker(&layout.paths, "0", 1, None, None, Scrubbed::Whole, None).expect("marker");
    // The run: one new thread of ten turns.
    {
        let c = rusqlite::Connection::open(&db).expect("db");
        opencode_db::session(&c, NEW_SESSION, 10, 9_000_000_000);
    }
    fro_bot::memory::checkpoint::checkpoint(&db);
    for f in ["opencode.db", "fro-bot.json"] {
        fs::copy(layout.paths.data_dir.join(f), layout.pristine.join(f)).expect("pristine");
    }
    eprintln!(
        "{mb} MB: {:.0} MB database, {sessions} sessions (made in {:.1} s)",
        fs::metadata(&db).expect("db").len() as f64 / MB as f64,
        t.elapsed().as_secs_f64()
    );
    let scope = serde_json::to_string(&fro_bot::memory::scrub::Scope::Changed {
        sessions: [NEW_SESSION.to_string()].into(),
    })
    .expect("scope");
    let (mut saves, mut tk_saves) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        layout.reset();
        tk_saves.push(toolkit(server, &layout, script, "save", &tk_key(mb, rep)));
        layout.reset();
        saves.push(post(server, bin, &layout, &run_id(mb, rep), Some(&scope)));
    }
    layout.reset();
    let whole = post(server, bin, &layout, &format!("{mb}999"), None);
    let (mut restores, mut tk_restores, mut in_process) = (Vec::new(), Vec::new(), f64::MAX);
    for _ in 0..reps {
        layout.clear();
        tk_restores.push(toolkit(server, &layout, script, "restore", &tk_key(mb, 0)));
        layout.clear();
        let (proc, inner) = restore(server, &layout, &primary_key());
        restores.push(proc);
        in_process = in_process.min(inner);
    }
    parts(&layout, reps);
    Row {
        mb,
        save: best(&saves),
        tk_save: best(&tk_saves),
        whole,
        restore: best(&restores),
        restore_in_process: in_process,
        tk_restore: best(&tk_restores),
    }
}

/// Where the restore's in-process time goes: each step alone on the restored database (the
/// restore's own order), best of `reps`.
fn parts(layout: &Layout, reps: usize) {
    let db = layout.paths.db();
    let time = |f: &mut dyn FnMut()| {
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let probe = time(&mut || {
        fro_bot::memory::checkpoint::probe(&db);
    });
    let quick_check = time(&mut || {
        let c = rusqlite::Connection::open(&db).expect("open");
        let _: String = c
            .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
            .expect("quick_check");
    });
    let sanitize = time(&mut || {
        fro_bot::memory::sanitize::sanitize(&db, i64::MAX);
    });
    let digest = time(&mut || {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        std::io::copy(&mut fs::File::open(&db).expect("db"), &mut h).expect("hash");
    });
    let snapshot = time(&mut || {
        fro_bot::memory::merge::Snapshot::capture(&db).expect("snapshot");
    });
    eprintln!(
        "restore parts: probe {probe:.3} s, quick_check {quick_check:.3} s, sanitize (with its \
         quick_check) {sanitize:.3} s, SHA-256 {digest:.3} s, snapshot {snapshot:.3} s"
    );
}

fn tk_key(mb: u64, rep: usize) -> String {
    format!("toolkit-{mb}-{rep}")
}

fn run_id(mb: u64, rep: usize) -> String {
    format!("{mb}{rep:03}")
}

/// What fro-bot's keys come to for this job (`github::keys`): `fro-bot-{repo}-{branch}-{os}`.
fn primary_key() -> String {
    let env = fro_bot::runner::Env::from_pairs(job_env("1"));
    fro_bot::github::keys::CacheKeys::from_env(&env, None)
        .expect("keys")
        .primary
}

fn job_env(run_id: &str) -> Vec<(String, String)> {
    [
        ("GITHUB_REPOSITORY", REPO),
        ("GITHUB_REF_NAME", "main"),
        ("GITHUB_REF", "refs/heads/main"),
        ("RUNNER_OS", "Linux"),
        ("GITHUB_RUN_ID", run_id),
        ("GITHUB_RUN_ATTEMPT", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn common_env(server: &cache_server::CacheServer, layout: &Layout) -> Vec<(String, String)> {
    let mut env = server.env_pairs();
    env.extend([
        ("GITHUB_WORKSPACE".into(), path(&layout.workspace)),
        ("HOME".into(), path(&layout.home)),
        ("RUNNER_TEMP".into(), path(&layout.temp())),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]);
    env
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `fro-bot post` retrying the save; `scope`: main's scrub scope in the state.
fn post(
    server: &cache_server::CacheServer,
    bin: &Path,
    layout: &Layout,
    run_id: &str,
    scope: Option<&str>,
) -> Proc {
    let mut env = common_env(server, layout);
    env.extend(job_env(run_id));
    env.push(("STATE_cacheSaved".into(), "not-persisted".into()));
    if let Some(scope) = scope {
        env.push(("STATE_scrubScope".into(), scope.into()));
    }
    let mut cmd = Command::new(bin);
    cmd.arg("post")
        .env_clear()
        .envs(env)
        .current_dir(&layout.workspace);
    let (proc, out) = timed(cmd);
    let key = format!("{}-{run_id}-1", primary_key());
    assert!(
        server.entries().iter().any(|e| e.key == key && e.finalized),
        "post did not save {key}: {out}"
    );
    proc
}

/// One `saveCache` or `restoreCache` of the three paths, by the pinned toolkit.
fn toolkit(
    server: &cache_server::CacheServer,
    layout: &Layout,
    script: &Path,
    op: &str,
    key: &str,
) -> Proc {
    let mut env = common_env(server, layout);
    env.extend(job_env("1"));
    env.push(("ACTIONS_CACHE_SERVICE_V2".into(), "true".into()));
    let mut cmd = Command::new("node");
    cmd.arg(script)
        .arg(op)
        .arg(key)
        .args(layout.paths.cache_paths())
        .env_clear()
        .envs(env)
        .current_dir(&layout.workspace);
    let (proc, out) = timed(cmd);
    assert!(out.contains("TOOLKIT OK"), "toolkit {op} {key}: {out}");
    if op == "restore" {
        assert!(layout.paths.db().is_file(), "toolkit restored no database");
    }
    proc
}

/// The restore phase in a child process; its whole time and its in-process time.
fn restore(server: &cache_server::CacheServer, layout: &Layout, key: &str) -> (Proc, f64) {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.arg("restore-child")
        .arg(server.url())
        .arg(server.token())
        .arg(&layout.workspace)
        .arg(&layout.paths.data_dir)
        .arg(layout.temp())
        .arg(key);
    let (proc, out) = timed(cmd);
    let inner = out
        .lines()
        .find_map(|l| l.strip_prefix("RESTORED "))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("restore child: {out}"));
    (proc, inner)
}

/// Runs `cmd` to its end: wall time from spawn to exit and peak RSS (`wait4`).
// The child is reaped by `wait4`, which `Child::wait` cannot stand in for (no rusage).
#[allow(clippy::zombie_processes)]
fn timed(mut cmd: Command) -> (Proc, String) {
    let out_file = tempfile::NamedTempFile::new().expect("output file");
    let t = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out_file.reopen().expect("stdout"))
        .stderr(out_file.reopen().expect("stderr"))
        .spawn()
        .expect("spawn");
    let mut status = 0;
    // SAFETY: all-zero is a valid `rusage`; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for the child just spawned (not waited for by anything else).
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = t.elapsed().as_secs_f64();
    let out = fs::read_to_string(out_file.path()).unwrap_or_default();
    assert!(
        pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed ({status}): {out}"
    );
    let rss_mb = usage.ru_maxrss as u64 / 1000;
    (Proc { secs, rss_mb }, out)
}

/// The toolkit's two calls, as a workflow's `actions/cache` step makes them.
fn write_toolkit_script(toolkit: &Path) -> PathBuf {
    let lib = toolkit.join("node_modules/@actions/cache/lib/cache.js");
    assert!(lib.is_file(), "no @actions/cache at {}", lib.display());
    let script = toolkit.join("fro-bot-bench.mjs");
    fs::write(
        &script,
        format!(
            r#"import * as cache from {lib:?};
const [op, key, ...paths] = process.argv.slice(2);
if (op === "save") {{
  const id = await cache.saveCache(paths, key);
  if (id === -1) {{ console.log("save failed"); process.exit(1); }}
}} else {{
  const hit = await cache.restoreCache(paths, key, []);
  if (hit !== key) {{ console.log("restore missed"); process.exit(1); }}
}}
console.log("TOOLKIT OK");
"#,
            lib = lib.to_string_lossy()
        ),
    )
    .expect("toolkit script");
    script
}

/// In the child: the restore phase, then what the main step derives from it before the turn.
fn restore_child(args: &[String]) {
    let [url, token, workspace, data_dir, temp, key] = args else {
        panic!("usage: restore-child <url> <token> <workspace> <data dir> <temp> <key>");
    };
    use fro_bot::memory::restore::{restore, RestoreInputs, StoreAttempt};
    let t = Instant::now();
    let env = fro_bot::runner::Env::from_pairs([
        ("ACTIONS_RESULTS_URL", url.as_str()),
        ("ACTIONS_RUNTIME_TOKEN", token.as_str()),
        ("RUNNER_TEMP", temp.as_str()),
    ]);
    let backend = fro_bot::cache::Backend::from_env(&env).expect("cache backend");
    let paths = StatePaths::new(PathBuf::from(data_dir));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let restore_keys = [format!("{key}-")];
    let report = rt.block_on(restore(
        RestoreInputs {
            paths: &paths,
            workspace: Path::new(workspace),
            skip_cache: false,
            cache: Some(&backend),
            key,
            restore_keys: &restore_keys,
            catalog: fro_bot::memory::fallback::Catalog::Unavailable { reason: "bench" },
            now_ms: fro_bot::opencode::system_now_ms(),
        },
        async { StoreAttempt::Disabled },
    ));
    assert_eq!(
        report.status,
        fro_bot::memory::report::CacheStatus::Hit,
        "{:?}",
        report.notes
    );
    let copy = fro_bot::memory::ledger::RestoredCopy::of(&paths, &report);
    let provenance = fro_bot::memory::ledger::Provenance::of_restored(&paths, copy.as_ref());
    assert_eq!(
        provenance,
        fro_bot::memory::ledger::Provenance::Scrubbed,
        "the saved marker vouches for what it saved"
    );
    fro_bot::memory::merge::Snapshot::capture(&paths.db()).expect("snapshot");
    println!("RESTORED {:.3}", t.elapsed().as_secs_f64());
}
