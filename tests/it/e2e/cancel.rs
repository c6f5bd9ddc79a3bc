//! A cancel is honoured wherever it lands (docs/design.md#signals-and-budgets): while OpenCode
//! starts, during session prep, the restore, the wait for the thread's turn, the wait for the
//! memory lease, and the save. The step ends before the runner would kill it (2.5 s after SIGTERM;
//! SIGINT is held to the same), and always with `cache-save-result`. Each test signals at a known
//! point: a pause point (`FRO_BOT_PAUSEPOINT`), a line the step prints, or a call the scripted
//! world holds.

use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fro_bot::runner::cancel::SIGTERM_BUDGET;
use fro_bot::runner::failpoint::PAUSED_AT;

use super::scenarios::{post_step, with_s3, World};
use crate::support::action::{comment_event, explain, processes_in, Job, Launch, StepResult};
use crate::support::cache_server::{GET_BLOB, LOOKUP, PUT_BLOB};
use crate::support::fake_llm::Reply;

/// What became of a step signalled mid-run.
struct Signalled {
    job: Job,
    result: StepResult,
    /// From the signal to the exit (or to the runner's kill).
    took: Duration,
    /// Still running when the budget was spent: the runner killed it.
    killed: bool,
}

impl Signalled {
    fn assert_in_time(&self) {
        assert!(
            !self.killed,
            "still running {:?} after the signal: the runner kills it here\n{}",
            self.took,
            explain(&self.result)
        );
        eprintln!("CANCEL | ended {:?} after the signal", self.took);
    }

    fn cache_saved(&self) -> (&str, &str) {
        let r = &self.result;
        (
            r.state.get("cacheSaved").map_or("(none)", String::as_str),
            r.outputs
                .get("cache-save-result")
                .map_or("(none)", String::as_str),
        )
    }
}

/// Starts the main step, sends `signal` as the runner does once `ready` holds (given the stdout so
/// far), and kills the step as the runner does if it is still running once SIGTERM's budget is
/// spent after the signal.
async fn signal_when(job: Job, signal: i32, ready: impl Fn(&str) -> bool) -> Signalled {
    let mut running = job.spawn(&["run"], &[]);
    let stdout = running.take_stdout().expect("piped stdout");
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut seen = seen.lock().unwrap();
                seen.push_str(&line);
                seen.push('\n');
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if ready(&seen.lock().unwrap()) {
            break;
        }
        assert!(
            !running.exited(),
            "the step ended before the point to signal it at:\n{}",
            seen.lock().unwrap()
        );
        assert!(Instant::now() < deadline, "the point never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = Instant::now();
    running.signal(signal);
    let killed = loop {
        if running.exited() {
            break false;
        }
        if sent.elapsed() >= SIGTERM_BUDGET {
            running.signal(libc::SIGKILL);
            break true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = sent.elapsed();
    let (job, mut result) = tokio::task::spawn_blocking(move || {
        let r = job.finish(running);
        (job, r)
    })
    .await
    .unwrap();
    reader.join().unwrap();
    result.stdout = seen.lock().unwrap().clone();
    Signalled {
        job,
        result,
        took,
        killed,
    }
}

fn paused_at(point: &str) -> impl Fn(&str) -> bool {
    let line = format!("{PAUSED_AT}{point}");
    move |stdout| stdout.contains(&line)
}

/// A run on issue 5, held at `point` until the signal.
fn held_at(world: &World, run_id: u64, point: &str) -> Job {
    world.github.seed_issue(5, "t", "b");
    let mut job = world.job(run_id);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
    job.set("FRO_BOT_PAUSEPOINT", point);
    job
}

/// Cancelled before the agent's turn: nothing reached the model, nothing was saved (memory is what
/// the cache held), post has nothing to do, and the thread was told.
async fn assert_cancelled_before_the_turn(world: &World, s: Signalled) {
    s.assert_in_time();
    let r = &s.result;
    assert_eq!(s.cache_saved(), ("skipped", "skipped"), "{}", explain(r));
    assert!(r.summary.contains("cancelled-before-turn"), "{}", r.summary);
    assert!(world.llm.requests().is_empty(), "the model was asked");
    assert!(
        world.cache.calls_of(PUT_BLOB).is_empty(),
        "something was saved"
    );
    assert_ne!(r.code, 0, "a cancelled run is not a success");
    let versions = world.github.comment_versions();
    assert!(
        versions
            .last()
            .is_some_and(|v| v.contains("the run was cancelled")),
        "{versions:?}"
    );
    let (_job, post) = post_step(s.job, s.result).await;
    assert!(post.summary.contains("Nothing to do"), "{}", post.summary);
}

/// OpenCode's server process (`opencode serve --hostname 127.0.0.1 …`) among `processes_in` lines.
fn is_opencode(process: &str) -> bool {
    process.contains(" serve --hostname ")
}

/// OpenCode is running (in the workspace, where `processes_in` finds it in the container too) when
/// the signal comes, and nothing of the run is left once the step has ended.
pub(crate) async fn sigterm_while_opencode_starts_stops_it_and_ends_within_the_budget(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    let job = held_at(&world, 1100, "opencode:starting");
    let ws = job.workspace();
    let at_signal = Mutex::new(Vec::new());
    let paused = paused_at("opencode:starting");
    let s = signal_when(job, libc::SIGTERM, |out| {
        let ready = paused(out);
        if ready {
            *at_signal.lock().unwrap() = processes_in(&ws);
        }
        ready
    })
    .await;
    let at_signal = at_signal.into_inner().unwrap();
    assert!(
        at_signal.iter().any(|p| is_opencode(p)),
        "OpenCode runs in the workspace when the signal comes: {at_signal:?}"
    );
    let left = processes_in(&ws);
    assert!(
        left.is_empty(),
        "left running after the step ended: {left:?}\n{}",
        explain(&s.result)
    );
    assert!(
        s.result.stdout.contains("cancelled while OpenCode started"),
        "{}",
        explain(&s.result)
    );
    assert_cancelled_before_the_turn(&world, s).await;
}

pub(crate) async fn sigint_during_session_prep_ends_before_the_prompt_within_the_budget(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    let job = held_at(&world, 1110, "agent:prep");
    let s = signal_when(job, libc::SIGINT, paused_at("agent:prep")).await;
    assert_cancelled_before_the_turn(&world, s).await;
}

/// The restore's download hangs; the signal ends the run there, and the memory it was restoring
/// is untouched: the next run resumes the conversation.
pub(crate) async fn sigint_during_the_restore_stops_it_and_memory_is_kept(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(5, "t", "b");
    world.llm.push(Reply::text("the capybara is calm"));
    let mut job = world.job(1120);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot remember"));
    let (mut job, first) = super::scenarios::main_step(job).await;
    assert_eq!(
        first.output("cache-save-result"),
        "durable",
        "{}",
        explain(&first)
    );
    let session = first.output("session-id").to_string();

    job.next_run(1121);
    job.event("issue_comment", &comment_event(5, 2, "@fro-bot again"));
    world.cache.stall(GET_BLOB, 1);
    let s = signal_when(job, libc::SIGINT, |_| world.cache.stalled(GET_BLOB) > 0).await;
    s.assert_in_time();
    let r = &s.result;
    assert_eq!(s.cache_saved(), ("skipped", "skipped"), "{}", explain(r));
    assert!(
        r.stdout.contains("the restore was stopped"),
        "{}",
        explain(r)
    );
    assert_eq!(
        world.llm.requests().len(),
        1,
        "the cancelled run asked the model"
    );
    assert_eq!(world.cache.entries().len(), 1, "the cancelled run saved");

    let mut job = s.job;
    job.next_run(1122);
    job.event("issue_comment", &comment_event(5, 3, "@fro-bot and now"));
    world.llm.push(Reply::text("ok"));
    let (_job, next) = super::scenarios::main_step(job).await;
    assert_eq!(next.output("session-id"), session, "{}", explain(&next));
}

/// Another run holds the thread: the signal ends the wait, and the run restores and saves nothing;
/// the other run keeps its turn.
pub(crate) async fn sigterm_while_waiting_for_the_threads_turn_ends_without_restoring(
    launch: Launch,
) {
    use fro_bot::lease::{AcquireOutcome, Holder, Lease, LeaseConfig, SystemClock};
    let world = World::start_with(launch).await;
    world.github.seed_issue(5, "t", "b");
    let prefix = crate::support::s3::unique_prefix("e2e-cancel-turn");
    let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
    let keys = fro_bot::object_store::StoreKeys::new(&prefix, "octo", "hello").unwrap();
    let other = Holder {
        repo: "octo/hello".into(),
        run_id: 1,
        run_attempt: 1,
        identity: Some("other".into()),
    };
    let turn = keys.thread_lease("issue-5");
    let AcquireOutcome::Acquired(held) = Lease::acquire(
        &store,
        &turn,
        &other,
        LeaseConfig::default(),
        Arc::new(SystemClock),
    )
    .await
    else {
        panic!("the test could not take the thread's turn");
    };
    let mut job = world.job(1130);
    with_s3(&mut job, &prefix);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
    let waiting = || {
        world
            .github
            .comment_versions()
            .iter()
            .any(|v| v.contains("waiting for an earlier run on this thread to finish"))
    };
    let s = signal_when(job, libc::SIGTERM, |_| waiting()).await;
    s.assert_in_time();
    let r = &s.result;
    assert_eq!(s.cache_saved(), ("skipped", "skipped"), "{}", explain(r));
    assert!(
        world.cache.calls_of(LOOKUP).is_empty(),
        "it went on to restore"
    );
    assert!(world.llm.requests().is_empty());
    assert!(!r.state.contains_key("threadLeaseEtag"), "{:?}", r.state);
    assert!(
        r.summary
            .contains("cancelled while it waited for an earlier run on this thread")
            && !r.summary.contains("merged all the same"),
        "{}",
        r.summary
    );
    // Still the other run's.
    assert!(matches!(
        held.release().await,
        fro_bot::lease::ReleaseOutcome::Released
    ));
}

/// Another run holds the memory lease while this one saves: the signal ends the wait, and the
/// memory goes to the Actions cache within the budget (the next run merges it into the store).
pub(crate) async fn sigterm_while_the_publish_waits_for_the_lease_still_saves_to_the_cache(
    launch: Launch,
) {
    use fro_bot::lease::{AcquireOutcome, Holder, Lease, LeaseConfig, SystemClock};
    let world = World::start_with(launch).await;
    world.github.seed_issue(5, "t", "b");
    let prefix = crate::support::s3::unique_prefix("e2e-cancel-lease");
    let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
    let keys = fro_bot::object_store::StoreKeys::new(&prefix, "octo", "hello").unwrap();
    let other = Holder {
        repo: "octo/hello".into(),
        run_id: 1,
        run_attempt: 1,
        identity: Some("other".into()),
    };
    let AcquireOutcome::Acquired(held) = Lease::acquire(
        &store,
        keys.lease(),
        &other,
        LeaseConfig::default(),
        Arc::new(SystemClock),
    )
    .await
    else {
        panic!("the test could not take the lease");
    };
    world.llm.push(Reply::text("answered before the save"));
    let mut job = world.job(1140);
    with_s3(&mut job, &prefix);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
    let needle = fro_bot::memory::publish::WAITING_FOR_LEASE;
    let s = signal_when(job, libc::SIGTERM, |out| out.contains(needle)).await;
    s.assert_in_time();
    let r = &s.result;
    assert_eq!(s.cache_saved(), ("durable", "durable"), "{}", explain(r));
    assert_eq!(world.cache.entries().len(), 1);
    assert!(
        r.summary
            .contains("cancelled while action:1:1:other held the lease"),
        "{}",
        r.summary
    );
    assert!(matches!(
        held.release().await,
        fro_bot::lease::ReleaseOutcome::Released
    ));
}

/// The cache upload hangs: the save cannot finish before the deadline, so main says
/// `not-persisted` (state and output) in time, and post saves.
pub(crate) async fn sigterm_during_the_save_says_not_persisted_and_post_saves(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(5, "t", "b");
    world.llm.push(Reply::text("answered before the save"));
    world.cache.stall(PUT_BLOB, 1);
    let mut job = world.job(1150);
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot hi"));
    let s = signal_when(job, libc::SIGTERM, |_| world.cache.stalled(PUT_BLOB) > 0).await;
    s.assert_in_time();
    let r = &s.result;
    assert_eq!(
        s.cache_saved(),
        ("not-persisted", "not-persisted"),
        "{}",
        explain(r)
    );
    assert!(world.cache.entries().iter().all(|e| !e.finalized));
    let (_job, post) = post_step(s.job, s.result).await;
    assert!(post.summary.contains("durable"), "{}", post.summary);
    assert!(world.cache.entries().iter().any(|e| e.finalized));
}
