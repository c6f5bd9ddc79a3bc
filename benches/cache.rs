//! Benchmark: save + restore of generated OpenCode state through the in-process cache test server,
//! beside a raw `tar -cf - | zstd -T0` + file-copy baseline on the same data in the same run, and
//! fro-bot's peak RSS (save and restore run in a child process: this binary re-invoked with
//! `child`, reporting its own VmHWM).
//!
//! Sizes: `FRO_BOT_BENCH_SIZES` (MB, comma-separated), default `10,200,1000`.

#[path = "../tests/it/support/cache_server.rs"]
#[allow(dead_code)]
mod cache_server;
// The same server speaks v1 too (it mounts these routes).
#[path = "../tests/it/support/cache_server_v1.rs"]
#[allow(dead_code)]
mod cache_server_v1;

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fro_bot::cache::{
    ActionsCacheClient, CacheMode, CachePath, RestoreOutcome, RestoreRequest, RetryPolicy,
    SaveRequest,
};

/// The bench's cache paths are the action's three: `storage` is the one directory.
fn targets(paths: &[String]) -> Vec<CachePath> {
    paths
        .iter()
        .map(|p| {
            if p.ends_with("/storage") {
                CachePath::directory(p.clone())
            } else {
                CachePath::file(p.clone())
            }
        })
        .collect()
}

const MB: u64 = 1_000_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("extract") {
        // Profiling aid: `extract <archive> <workspace> <paths...>`.
        let t = Instant::now();
        fro_bot::cache::extract_confined(
            Path::new(&args[2]),
            &targets(&args[4..]),
            Path::new(&args[3]),
        )
        .expect("extract");
        println!("extract {:.3}", t.elapsed().as_secs_f64());
        return;
    }
    if args.get(1).map(String::as_str) == Some("archive") {
        // Profiling aid: `archive <dest> <workspace> <paths...>`.
        let t = Instant::now();
        fro_bot::cache::write_archive(&args[4..], Path::new(&args[3]), Path::new(&args[2]))
            .expect("archive");
        println!("archive {:.3}", t.elapsed().as_secs_f64());
        return;
    }
    if args.get(1).map(String::as_str) == Some("generate") {
        // Profiling aid: `generate <data dir> <MB>`.
        generate(
            Path::new(&args[2]),
            args[3].parse::<u64>().expect("MB") * MB,
        );
        return;
    }
    if args.get(1).map(String::as_str) == Some("child") {
        child(&args[2..]);
        return;
    }
    let sizes: Vec<u64> = std::env::var("FRO_BOT_BENCH_SIZES")
        .unwrap_or_else(|_| "10,200,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let server = rt.block_on(cache_server::CacheServer::start());
    // Best of N per measurement, each starting from a synced file system: otherwise whichever step
    // runs while earlier steps' dirty pages are being written back gets throttled by the kernel.
    let reps: usize = std::env::var("FRO_BOT_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    println!(
        "best of {reps} runs each; fro-bot runs in a child process, the cache server in this one"
    );
    println!(
        "| size | fro-bot save | raw save | ratio | fro-bot restore | raw restore | ratio | archive | extract only | peak RSS save / restore |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for mb in &sizes {
        let dir = tempfile::tempdir().expect("temp dir");
        let layout = Layout::new(dir.path());
        generate(&layout.data, mb * MB);
        let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);

        let raw_saves: Vec<f64> = (0..reps)
            .map(|_| {
                sync();
                raw_save(&layout, dir.path()).as_secs_f64()
            })
            .collect();
        let saves: Vec<ChildRun> = (0..reps)
            .map(|r| {
                sync();
                run_child(&server, "save", &layout, &format!("bench-{mb}-{r}"))
            })
            .collect();
        let restores: Vec<ChildRun> = (0..reps)
            .map(|_| {
                // Restores go to an absent data dir, as on a fresh runner. Old trees are deleted
                // and synced first: page cache held by stale copies slowed whichever step ran
                // next by up to 5× on the test VM.
                fs::remove_dir_all(&layout.data).expect("clear data dir");
                sync();
                run_child(&server, "restore", &layout, &format!("bench-{mb}-0"))
            })
            .collect();
        let raw_restores: Vec<f64> = (0..reps)
            .map(|r| {
                sync();
                raw_restore(dir.path(), r).as_secs_f64()
            })
            .collect();
        let entry = server
            .entries()
            .into_iter()
            .find(|e| e.key == format!("bench-{mb}-0"))
            .expect("saved entry");
        let archive = entry.size.unwrap_or(0);
        // The extraction alone, in this process, to split transfer from extraction time.
        fs::remove_dir_all(&layout.data).expect("clear data dir");
        sync();
        let t = Instant::now();
        fro_bot::cache::extract_confined(
            &server.blob_path(&entry),
            &targets(&layout.paths),
            &layout.workspace,
        )
        .expect("extract");
        let extract_only = t.elapsed().as_secs_f64();

        let save = best(&saves.iter().map(|c| c.secs).collect::<Vec<_>>());
        let restore = best(&restores.iter().map(|c| c.secs).collect::<Vec<_>>());
        let (raw_save, raw_restore) = (best(&raw_saves), best(&raw_restores));
        let hwm = |v: &[ChildRun]| v.iter().map(|c| c.hwm_kb).max().unwrap_or(0) / 1024;
        println!(
            "| {mb} MB | {save:.2} s | {raw_save:.2} s | {:.2}× | {restore:.2} s | {raw_restore:.2} s | {:.2}× | {:.1} MB | {extract_only:.2} s | {} MB / {} MB |",
            save / raw_save,
            restore / raw_restore,
            archive as f64 / MB as f64,
            hwm(&saves),
            hwm(&restores),
        );
    }
}

fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

struct Layout {
    workspace: PathBuf,
    data: PathBuf,
    paths: Vec<String>,
}

impl Layout {
    fn new(root: &Path) -> Self {
        let workspace = root.join("github/workspace");
        let data = root.join("github/home/.local/share/opencode");
        fs::create_dir_all(&workspace).expect("workspace");
        let paths = ["storage", "opencode.db", "fro-bot.json"]
            .iter()
            .map(|p| data.join(p).to_string_lossy().into_owned())
            .collect();
        Layout {
            workspace,
            data,
            paths,
        }
    }
}

/// A session-database-like file: 4 KiB pages of JSON-ish text with varying ids and a random
/// quarter (hashes, ids), so it compresses roughly like a real one; plus a small storage tree.
fn generate(data: &Path, bytes: u64) {
    fs::create_dir_all(data.join("storage/session")).expect("storage dir");
    for i in 0..20 {
        fs::write(
            data.join(format!("storage/session/ses_{i:04}.json")),
            format!("{{\"id\":\"ses_{i:04}\",\"title\":\"session {i}\"}}"),
        )
        .expect("storage file");
    }
    fs::write(data.join("fro-bot.json"), b"{\"storage_version\":1}").expect("marker");
    let mut out = BufWriter::new(fs::File::create(data.join("opencode.db")).expect("db"));
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        // xorshift64*: fast and seeded, so every run writes the same bytes.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut page = vec![0u8; 4096];
    let mut written = 0;
    let mut n = 0u64;
    while written < bytes {
        let text = format!(
            "{{\"type\":\"text\",\"role\":\"assistant\",\"message\":\"msg_{n:012}\",\"part\":\"The agent read the file src/lib.rs and proposed a change to line {}.\"}}",
            next() % 1000
        );
        let tb = text.as_bytes();
        for (j, b) in page[..3072].iter_mut().enumerate() {
            *b = tb[j % tb.len()];
        }
        for chunk in page[3072..].chunks_mut(8) {
            chunk.copy_from_slice(&next().to_le_bytes()[..chunk.len()]);
        }
        let take = (bytes - written).min(4096) as usize;
        out.write_all(&page[..take]).expect("write db");
        written += take as u64;
        n += 1;
    }
    out.flush().expect("flush db");
}

fn sh(script: &str) -> Duration {
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .status()
        .expect("sh");
    assert!(status.success(), "{script}");
    t.elapsed()
}

/// `tar -cf - | zstd -T0` to a file, then a copy of it (the stand-in for the upload).
fn raw_save(layout: &Layout, root: &Path) -> Duration {
    let archive = root.join("raw.tzst");
    let copy = root.join("raw-copy.tzst");
    let names = "storage opencode.db fro-bot.json";
    sh(&format!(
        "tar -cf - -C '{}' {names} | zstd -T0 -q -f -o '{}' && cp '{}' '{}'",
        layout.data.display(),
        archive.display(),
        archive.display(),
        copy.display()
    ))
}

/// A copy of the archive (the download), then `zstd -d | tar -x` into a fresh directory.
fn raw_restore(root: &Path, rep: usize) -> Duration {
    let copy = root.join("raw-copy.tzst");
    let again = root.join("raw-download.tzst");
    let out = root.join(format!("raw-out-{rep}"));
    fs::create_dir_all(&out).expect("raw out");
    let t = sh(&format!(
        "cp '{}' '{}' && zstd -dc -q '{}' | tar -xf - -C '{}'",
        copy.display(),
        again.display(),
        again.display(),
        out.display()
    ));
    let _ = fs::remove_file(&again);
    let _ = fs::remove_dir_all(&out);
    t
}

struct ChildRun {
    secs: f64,
    hwm_kb: u64,
}

fn run_child(server: &cache_server::CacheServer, op: &str, layout: &Layout, key: &str) -> ChildRun {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    let out = cmd
        .arg("child")
        .arg(op)
        .arg(server.url())
        .arg(server.token())
        .arg(&layout.workspace)
        .arg(key)
        .args(&layout.paths)
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {op} failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .expect("child result line");
    let mut it = line.split_whitespace().skip(1);
    let secs = it.next().and_then(|s| s.parse().ok()).expect("secs");
    let hwm_kb = it.next().and_then(|s| s.parse().ok()).expect("hwm");
    ChildRun { secs, hwm_kb }
}

/// In the child: one save or restore, then `RESULT <secs> <VmHWM kB>`.
fn child(args: &[String]) {
    let [op, url, token, workspace, key, paths @ ..] = args else {
        panic!("usage: child <save|restore> <url> <token> <workspace> <key> <paths...>");
    };
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut client = ActionsCacheClient::new(url, token, CacheMode::ReadWrite).expect("client");
    client.set_retry(RetryPolicy {
        base_delay: Duration::from_millis(50),
        ..RetryPolicy::default()
    });
    let workspace = PathBuf::from(workspace);
    let t = Instant::now();
    match op.as_str() {
        "save" => {
            rt.block_on(client.save(&SaveRequest {
                key,
                paths,
                workspace: &workspace,
            }))
            .expect("save");
        }
        "restore" => {
            let outcome = rt
                .block_on(client.restore(&RestoreRequest {
                    key,
                    restore_keys: &[],
                    paths: &targets(paths),
                    workspace: &workspace,
                    into: None,
                }))
                .expect("restore");
            assert!(matches!(outcome, RestoreOutcome::Hit { .. }), "miss");
        }
        other => panic!("unknown op {other}"),
    }
    let secs = t.elapsed().as_secs_f64();
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    println!("RESULT {secs:.3} {hwm}");
}
