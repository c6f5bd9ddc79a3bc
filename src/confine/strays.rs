//! What the agent leaves running. A process group or session does not hold it (`setsid` leaves
//! both), so strays are found by uid: every process whose real or effective uid is the agent's and
//! that descends from fro-bot. fro-bot is a child subreaper (see [`super::harden_self`]), so an
//! orphan — a double-forked `nohup setsid` writer included — is re-parented to fro-bot, never
//! out of its tree (and only this run's processes are touched when several runs share a host).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A process as `/proc/<pid>/status` tells it.
#[derive(Debug, Clone, Copy)]
struct Proc {
    ppid: i32,
    real_uid: u32,
    effective_uid: u32,
    zombie: bool,
}

fn read_proc(pid: i32) -> Option<Proc> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let mut uids = field("Uid:")?.split_whitespace();
    Some(Proc {
        ppid: field("PPid:")?.parse().ok()?,
        real_uid: uids.next()?.parse().ok()?,
        effective_uid: uids.next()?.parse().ok()?,
        zombie: field("State:")?.starts_with('Z'),
    })
}

fn all_procs() -> HashMap<i32, Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, read_proc(pid)?)))
        .collect()
}

/// Processes of `uid` that descend from `root` (not `root` itself).
fn strays_of(procs: &HashMap<i32, Proc>, root: i32, uid: u32) -> Vec<(i32, Proc)> {
    let descends = |mut pid: i32| {
        for _ in 0..procs.len() {
            match procs.get(&pid) {
                Some(p) if p.ppid == root => return true,
                Some(p) if p.ppid > 0 => pid = p.ppid,
                _ => return false,
            }
        }
        false
    };
    procs
        .iter()
        .filter(|(&pid, p)| {
            pid != root && (p.real_uid == uid || p.effective_uid == uid) && descends(pid)
        })
        .map(|(&pid, &p)| (pid, p))
        .collect()
}

/// What the sweep found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sweep {
    /// Nothing of the agent's was running.
    Clean,
    /// These were killed and are gone: `agents` names those the agent started (not fro-bot's own
    /// programs, such as the session-tools server OpenCode ran, which may still be exiting).
    Killed { count: usize, agents: Vec<String> },
    /// Still alive after SIGKILL and the wait.
    Remaining { pids: Vec<i32> },
}

/// A process's name (`comm`), unless its program is one of `ours` or it is gone. Without root its program may
/// not be readable (fro-bot's own processes are not dumpable): then its name decides (the kernel
/// keeps the first 15 bytes of the program's file name).
fn agents_process(pid: i32, ours: &[std::path::PathBuf]) -> Option<String> {
    // Gone since the scan: it ended on its own (a program of fro-bot's exiting), nothing the agent
    // left that needed killing.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    let is_ours = match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) => ours.contains(&exe),
        Err(_) => ours.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| n.as_encoded_bytes().iter().take(15).eq(comm.as_bytes()))
        }),
    };
    (!is_ours).then(|| format!("{comm} ({pid})"))
}

/// Kills (SIGKILL) and reaps every process of `uid` under fro-bot, until none is left or `budget`
/// runs out. Processes fork while being killed: it rescans until a scan is clean. `ours`: the
/// programs of fro-bot's own that run as `uid` (killed too, not reported as the agent's).
pub fn sweep(uid: u32, budget: Duration, ours: &[std::path::PathBuf]) -> Sweep {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let deadline = Instant::now() + budget;
    let mut killed = std::collections::HashSet::new();
    let mut agents = Vec::new();
    loop {
        let procs = all_procs();
        let strays = strays_of(&procs, me, uid);
        let live: Vec<i32> = strays
            .iter()
            .filter(|(_, p)| !p.zombie)
            .map(|(pid, _)| *pid)
            .collect();
        for (pid, p) in &strays {
            if p.zombie && p.ppid == me {
                // SAFETY: reaps only this exact pid, a zombie child of ours (an orphan re-parented
                // to us), never a child another part of fro-bot is waiting for.
                unsafe { libc::waitpid(*pid, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
        if strays.is_empty() {
            return match killed.len() {
                0 => Sweep::Clean,
                count => Sweep::Killed { count, agents },
            };
        }
        for pid in &live {
            if !killed.contains(pid) {
                agents.extend(agents_process(*pid, ours));
            }
            // SAFETY: a plain syscall on a pid just seen as the agent's and in our tree; a pid
            // cannot be reused while it is our descendant or an unreaped zombie.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
            killed.insert(*pid);
        }
        if Instant::now() >= deadline {
            if live.is_empty() {
                // Only zombies of other strays' children: gone once their parents are reaped.
                return Sweep::Killed {
                    count: killed.len(),
                    agents,
                };
            }
            return Sweep::Remaining { pids: live };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_process_gone_since_the_scan_is_not_reported_as_the_agents() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert_eq!(agents_process(pid, &[]), None);
        let me = std::process::id() as i32;
        assert!(agents_process(me, &[]).is_some(), "a live process is named");
    }

    #[test]
    fn a_double_forked_setsid_child_is_found_and_killed() {
        // SAFETY: getuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to run a child as another uid");
            return;
        }
        super::super::harden_self().unwrap();
        let marker = tempfile::tempdir().unwrap();
        let out = marker.path().join("alive");
        std::fs::set_permissions(
            marker.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid nohup sh -c 'while :; do date > {}; sleep 0.05; done' >/dev/null 2>&1 &",
                out.display()
            ))
            .uid(1001)
            .gid(1001)
            .status()
            .unwrap();
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(300));
        assert!(out.exists(), "the writer runs");
        let found = sweep(1001, Duration::from_secs(3), &[]);
        assert!(
            matches!(&found, Sweep::Killed { count, agents } if *count >= 1 && agents.iter().any(|a| a.starts_with("sh ("))),
            "{found:?}"
        );
        std::fs::remove_file(&out).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!out.exists(), "the writer is dead");
        assert_eq!(sweep(1001, Duration::from_secs(1), &[]), Sweep::Clean);
    }
}
