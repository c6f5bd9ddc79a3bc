//! Issue 14's hostile entries planted through the cache protocol and restored by the real binary
//! (`fro-bot run` with the real OpenCode): each is refused naming its cap or member, within a
//! bounded time and a peak RSS under 100 MB, and nothing lands outside the data dir.

use std::io::BufRead;
use std::time::{Duration, Instant};

use super::scenarios::World;
use crate::support::action::{comment_event, explain};
use crate::support::hostile::{self, Case};

/// fro-bot's own peak RSS must stay under this for any entry (OpenCode is a separate process).
const MAX_RSS_KB: u64 = 100 * 1024;
/// From start to the refusal: download and extraction of the worst entry take a few seconds.
const MAX_TIME_TO_REFUSAL: Duration = Duration::from_secs(30);

fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

struct Measured {
    peak_rss_kb: u64,
    refused_after: Option<Duration>,
    stdout: String,
    result: crate::support::action::StepResult,
}

/// Runs `fro-bot run`, polling its VmHWM (its own peak RSS, not its children's) and timing the
/// first stdout line that holds `needle`.
fn measured_run(job: &crate::support::action::Job, needle: &str) -> Measured {
    let start = Instant::now();
    let mut child = job.spawn(&["run"], &[]);
    let pid = child.id();
    let stdout = child.take_stdout().expect("piped stdout");
    let needle = needle.to_string();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut at = None;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if at.is_none() && line.contains(&needle) {
                at = Some(start.elapsed());
            }
            text.push_str(&line);
            text.push('\n');
        }
        (text, at)
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(kb) = vm_hwm_kb(pid) {
                    peak = peak.max(kb);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let result = job.finish(child);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_rss_kb = poller.join().unwrap();
    let (stdout, refused_after) = reader.join().unwrap();
    Measured {
        peak_rss_kb,
        refused_after,
        stdout,
        result,
    }
}

async fn refused_by_the_binary(case: Case) {
    let world = World::start().await;
    let mut job = world.job(900);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot hello"));
    let outside = job.root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let archive = job.root.path().join("hostile.tzst");
    let built = Instant::now();
    (case.build)(&archive, &outside);
    let build_time = built.elapsed();
    let paths = fro_bot::memory::state_paths::StatePaths::new(job.data_dir());
    world.cache.plant(
        "opencode-storage-octo-hello-main-Linux-1-1-agent",
        &fro_bot::cache::version(paths.cache_paths()),
        &archive,
    );
    let entry_size = std::fs::metadata(&archive).unwrap().len();
    let needle = case.expect.needle();
    let (job, m) = tokio::task::spawn_blocking(move || {
        let m = measured_run(&job, &needle);
        (job, m)
    })
    .await
    .unwrap();
    let mut r = m.result;
    r.stdout = m.stdout;
    eprintln!(
        "HOSTILE | {} | entry {} KB | peak RSS {:.1} MB | refused after {:.2} s | built in {:.1} s",
        case.label,
        entry_size / 1024,
        m.peak_rss_kb as f64 / 1024.0,
        m.refused_after.map_or(f64::NAN, |d| d.as_secs_f64()),
        build_time.as_secs_f64(),
    );
    let refused_after = m.refused_after.unwrap_or_else(|| {
        panic!(
            "{}: no refusal naming {:?}\n{}",
            case.label,
            case.expect.needle(),
            explain(&r)
        )
    });
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains(&case.expect.needle()))
        .unwrap();
    assert!(
        line.starts_with("::warning::") && line.contains("cache entry refused"),
        "{line}"
    );
    assert!(
        m.peak_rss_kb > 0 && m.peak_rss_kb < MAX_RSS_KB,
        "{}: peak RSS {} kB",
        case.label,
        m.peak_rss_kb
    );
    assert!(
        refused_after < MAX_TIME_TO_REFUSAL,
        "{}: {refused_after:?}",
        case.label
    );
    // The run still answers, without the entry's memory.
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_ne!(r.output("cache-status"), "hit", "{}", case.label);
    assert!(
        hostile::planted_files(job.root.path()).is_empty(),
        "{}: {:?}",
        case.label,
        hostile::planted_files(job.root.path())
    );
    let staging: Vec<_> = std::fs::read_dir(job.data_dir().parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".fro-bot-restore-")
        })
        .collect();
    assert!(staging.is_empty(), "{staging:?}");
}

fn case(label: &str) -> Case {
    hostile::cases()
        .into_iter()
        .find(|c| c.label == label)
        .unwrap_or_else(|| panic!("no case {label:?}"))
}

macro_rules! hostile_tests {
    ($($name:ident: $label:expr,)*) => {$(
        #[tokio::test]
        async fn $name() {
            refused_by_the_binary(case($label)).await;
        }
    )*};
}

hostile_tests! {
    gnu_long_name_bomb: "GNU long-name header of 1 GiB",
    pax_header_bomb: "pax header of 1 GiB",
    gnu_long_link_bomb: "GNU long-link header of 256 MiB",
    zero_bomb: "zero-filled opencode.db of 4 GiB",
    split_zero_bomb: "eight zero-filled files of 128 MiB",
    hard_link_amplification: "hard-link amplification (64 MiB × 1000 links)",
    a_million_members: "a million members",
    trailing_zeros: "1 GiB of zeros after the tar end",
    trailing_garbage: "garbage after the tar end",
    long_name: "a member name of 5000 bytes",
    directory_at_opencode_db: "a directory at opencode.db",
    file_below_opencode_db: "a file below opencode.db",
    symlink_at_opencode_db: "a symlink at opencode.db",
    directory_at_marker: "a directory at fro-bot.json",
    nul_in_pax_name: "a NUL byte in a name (pax path)",
    nul_in_gnu_long_name: "a NUL byte in a name (GNU long name)",
    traversal_out_of_storage: "traversal out of storage/",
    traversal_onto_opencode_db: "traversal from storage/ onto opencode.db",
    dot_component: "a dot component before opencode.db",
    name_outside_data_dir: "a name outside the data dir",
    absolute_name: "an absolute name",
    hard_link_outside: "a hard link to a file outside",
    device_node: "a device node",
}

#[test]
fn every_case_has_a_test() {
    let src = include_str!("hostile.rs");
    for c in hostile::cases() {
        assert!(
            src.contains(&format!("{:?}", c.label)),
            "{} untested",
            c.label
        );
    }
}
