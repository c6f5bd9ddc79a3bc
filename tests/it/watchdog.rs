//! `fro-bot watchdog` (`confine::watchdog`), the built binary: the guarded process group dies when
//! fro-bot's end of the pipe closes unreleased, and lives when released.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use fro_bot::confine::watchdog::Watchdog;

/// A `sleep` leading its own process group, as OpenCode does.
fn group_leader() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Whether `child` exits within `within`; killed and reaped either way.
fn exits_within(child: &mut std::process::Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fro-bot"))
}

#[tokio::test]
async fn an_unreleased_guard_kills_the_group_when_fro_bots_end_closes() {
    let mut dog = Watchdog::start(exe()).unwrap();
    let mut leader = group_leader();
    dog.guard(leader.id()).unwrap();
    // What a SIGKILL of fro-bot does to the pipe: its end closes with nothing more said.
    drop(dog);
    assert!(
        exits_within(&mut leader, Duration::from_secs(5)),
        "the guarded group outlived the pipe"
    );
}

#[tokio::test]
async fn a_released_guard_leaves_the_group_alone() {
    let mut dog = Watchdog::start(exe()).unwrap();
    let mut leader = group_leader();
    dog.guard(leader.id()).unwrap();
    dog.release().await;
    // The unreleased kill above comes within tens of milliseconds.
    assert!(
        !exits_within(&mut leader, Duration::from_secs(1)),
        "a released group was killed when the pipe closed"
    );
}
