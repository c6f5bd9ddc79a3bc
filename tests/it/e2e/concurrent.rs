//! Concurrent runs (docs/design.md#concurrent-runs): runs on different threads overlap, every one
//! is answered, the memory they saved — what the next run restores — holds every thread's session
//! with its first message, and follow-ups on a sample of the threads resume their own
//! conversations end to end — with the object store and without it. The real OpenCode, the
//! scripted model, the cache test server and SeaweedFS.

use std::path::Path;
use std::time::Duration;

use super::scenarios::{main_step, with_s3, World};
use crate::support::action::{comment_event, explain, Job, Launch, StepResult};
use crate::support::fake_llm::{request_text, Reply};
use fro_bot::cache::{Backend, RestoreOutcome, RestoreRequest};
use fro_bot::memory::session_map::Map;
use fro_bot::memory::state_paths::{marker_naming, parse_marker, MarkerCheck, StatePaths};
use fro_bot::object_store::sync::{fetch_marker, restore_session_db, StoreRestore};
use fro_bot::runner::Env;

const FIRST_ISSUE: u64 = 20;

/// Sixteen OpenCode servers starting in the same second on two cores outlast its 60 s startup
/// deadline, so the first runs start this far apart. That they overlap (restore before the others
/// save) is not left to the spacing: each run's turn is held until the next run's has begun.
const FIRST_RUNS_APART: Duration = Duration::from_millis(2500);
/// At most four follow-ups: four servers starting at once take about 20 CPU-seconds, some 10 s on
/// two cores, far inside the 60 s deadline even on a busy machine. They still start apart, so the
/// later ones restore while the earlier ones work.
const FOLLOW_UPS_APART: Duration = Duration::from_millis(1000);

fn word(i: u64) -> String {
    format!("zebra-{i}-okapi")
}

fn question(i: u64) -> String {
    format!("@fro-bot which word was it on thread {i}?")
}

/// `n` overlapping first runs, one per issue, each answered once and saved durably; then the
/// saved memory the next run restores is read directly and holds every thread's session with its
/// first message; then overlapping follow-ups on a sample of the threads (the first, the last and
/// two between: all of them when `n` is 2) each hit the cache, resume their own session and show
/// the model its first exchange. "Every thread resumes": the check on memory covers every thread,
/// the sampled follow-ups prove end to end that such memory is resumed (each follow-up is a full
/// run with its own OpenCode server, the cost this sampling saves).
async fn overlapping_threads_all_resume(n: u64, prefix: Option<&str>) {
    let world = World::start().await;
    let sessions = first_runs(&world, n, prefix).await;
    every_thread_is_in_saved_memory(&world, prefix, &sessions).await;
    let sample: std::collections::BTreeSet<u64> = [0, n / 3, 2 * n / 3, n - 1].into();
    follow_ups(&world, &sample, prefix, &sessions).await;
}

/// Run `run`, for comment `comment` on thread `i`'s issue, with the store when `prefix` is given.
fn thread_job(
    world: &World,
    run: u64,
    comment: u64,
    prefix: Option<&str>,
    i: u64,
    body: &str,
) -> Job {
    let mut job = world.job(run);
    job.at_fixed_root();
    if let Some(prefix) = prefix {
        with_s3(&mut job, prefix);
    }
    job.event(
        "issue_comment",
        &comment_event(FIRST_ISSUE + i, comment, body),
    );
    job
}

/// The first run on each of `n` threads, all overlapping: each answered once and saved durably.
/// Returns their session ids, by thread.
async fn first_runs(world: &World, n: u64, prefix: Option<&str>) -> Vec<String> {
    // Each run's turn is answered only once the next run's has reached the model: the next run has
    // restored before this one saves, so they overlap by construction, whatever the spacing.
    world.llm.hold_while(move |request, all| {
        let Some(i) = run_asking(&request_text(request), n) else {
            return false;
        };
        i + 1 < n
            && !all
                .iter()
                .any(|r| run_asking(&request_text(r), n) == Some(i + 1))
    });
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..n {
        world
            .github
            .seed_issue(FIRST_ISSUE + i, &format!("Thread {i}"), "Body.");
        let body = format!("@fro-bot remember the word {}", word(i));
        let job = thread_job(world, 3000 + i, 500 + i, prefix, i, &body);
        runs.spawn(async move { (i, main_step(job).await.1) });
        tokio::time::sleep(FIRST_RUNS_APART).await;
    }
    let mut sessions = vec![String::new(); n as usize];
    let mut notes = vec![Vec::new(); n as usize];
    while let Some(joined) = runs.join_next().await {
        let (i, r): (u64, StepResult) = joined.unwrap();
        assert_eq!(r.code, 0, "run {i}: {}", explain(&r));
        assert_eq!(
            r.output("cache-save-result"),
            "durable",
            "run {i}: {}",
            explain(&r)
        );
        sessions[i as usize] = r.output("session-id").to_string();
        notes[i as usize] = r
            .summary
            .lines()
            .filter(|l| l.contains("Concurrent runs"))
            .map(str::to_string)
            .collect();
    }
    world.llm.release_holds();
    merged_where_they_overlapped(world, &notes);
    let answered = world.github.created_comments();
    for i in 0..n {
        let thread = format!("issue-{}", FIRST_ISSUE + i);
        assert_eq!(
            answered.iter().filter(|(t, _)| *t == thread).count(),
            1,
            "{thread} answered once: {answered:?}"
        );
    }
    let notes: Vec<&String> = notes.iter().flatten().collect();
    println!("{n} overlapping runs: {} concurrency note(s)", notes.len());
    for note in notes {
        println!("  {note}");
    }
    sessions
}

/// The first run on thread `i`: its save key.
fn first_key(i: u64) -> String {
    format!(
        "opencode-storage-octo-hello-main-Linux-{}-1-agent",
        3000 + i
    )
}

/// The runs overlapped and their memory was merged: some run's summary says it merged another's
/// (`notes`, each run's "Concurrent runs" lines), which [`first_runs`]' hold makes certain (of two
/// runs each restored before the other saved, the later to save merges). And each run that had to
/// merge did: from the model's and the cache server's logs, run `j` had to when another run
/// committed its entry after `j` restored (before `j`'s first request reached the model) and
/// before `j` began its own save (reserved its key).
fn merged_where_they_overlapped(world: &World, notes: &[Vec<String>]) {
    use crate::support::cache_server::{CREATE, FINALIZE};
    use std::time::Instant;
    let n = notes.len() as u64;
    let requests: Vec<(Instant, String)> = world
        .llm
        .request_times()
        .into_iter()
        .zip(world.llm.requests().iter().map(request_text))
        .collect();
    let calls = world.cache.timed_calls();
    let first_call = |op: &str, key: &str| {
        calls
            .iter()
            .find(|(_, c)| c.op == op && c.body.as_ref().is_some_and(|b| b["key"] == key))
            .map(|(at, _)| *at)
            .unwrap_or_else(|| panic!("no {op} of {key}"))
    };
    let turn: Vec<Instant> = (0..n)
        .map(|i| {
            requests
                .iter()
                .find(|(_, text)| run_asking(text, n) == Some(i))
                .map(|(at, _)| *at)
                .unwrap_or_else(|| panic!("run {i} never reached the model"))
        })
        .collect();
    let committed: Vec<Instant> = (0..n)
        .map(|i| first_call(FINALIZE, &first_key(i)))
        .collect();
    let saving: Vec<Instant> = (0..n).map(|i| first_call(CREATE, &first_key(i))).collect();
    let zero = turn.iter().min().copied().unwrap_or_else(Instant::now);
    let timeline: Vec<String> = (0..n as usize)
        .map(|j| {
            let at = |t: Instant| t.duration_since(zero).as_secs_f64();
            format!(
                "run {j}: turn {:.1}s, save {:.1}s, committed {:.1}s: {:?}",
                at(turn[j]),
                at(saving[j]),
                at(committed[j]),
                notes[j]
            )
        })
        .collect();
    let merged = |j: usize| notes[j].iter().any(|note| note.contains("merged"));
    let mut had_to = 0;
    for j in 0..n as usize {
        let Some(i) = (0..n as usize)
            .filter(|&i| i != j)
            .find(|&i| turn[j] < committed[i] && committed[i] < saving[j])
        else {
            continue;
        };
        had_to += 1;
        assert!(
            merged(j),
            "run {j} restored before run {i} saved and saved after it, yet merged nothing:\n{}",
            timeline.join("\n")
        );
    }
    assert!(
        (0..n as usize).any(merged),
        "no run merged another's memory: the runs did not overlap\n{}",
        timeline.join("\n")
    );
    println!("{had_to} of {n} runs restored before another saved, and merged it");
}

/// Which first run a request is from: the highest thread whose word it holds (a run quotes only
/// threads saved before it restored, which started before it).
fn run_asking(text: &str, n: u64) -> Option<u64> {
    (0..n).rev().find(|&i| text.contains(&word(i)))
}

/// After the overlapping saves and merges, the memory the next run restores holds every thread:
/// the newest cache entry (what a run without the store restores) and, with the store, the
/// store's copy (what a run with it restores first, merging the newest entry in). In each, the
/// marker's session map leads each thread to its first run's session, which holds its message.
async fn every_thread_is_in_saved_memory(world: &World, prefix: Option<&str>, sessions: &[String]) {
    let (dir, map) = newest_cache_entry(world).await;
    holds_every_thread(dir.path(), &map, sessions, "the newest cache entry");
    if let Some(prefix) = prefix {
        let (dir, map) = store_copy(prefix).await;
        holds_every_thread(dir.path(), &map, sessions, "the store's copy");
    }
}

/// The entry the next run's lookup finds (primary key, then the restore prefixes; the version is
/// over the data paths as the steps see them), extracted, and its marker's session map.
async fn newest_cache_entry(world: &World) -> (tempfile::TempDir, Map) {
    let mut job = Job::new(0);
    job.at_fixed_root();
    let paths = StatePaths::new(job.step_path(&job.data_dir()));
    let backend = Backend::from_env(&Env::from_pairs(world.cache.env_pairs())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = "opencode-storage-octo-hello-main-Linux";
    let request = RestoreRequest {
        key,
        restore_keys: &[format!("{key}-")],
        paths: paths.restore_targets(),
        workspace: &job.step_workspace(),
        into: Some(dir.path()),
    };
    let found = backend.restore(&request).await.unwrap();
    assert!(
        matches!(found, RestoreOutcome::Hit { .. }),
        "no entry to restore: {found:?}"
    );
    let marker = std::fs::read_to_string(dir.path().join("fro-bot.json")).unwrap();
    let MarkerCheck::Compatible(marker) = parse_marker(&marker) else {
        panic!("the newest entry's marker cannot be read: {marker}");
    };
    (
        dir,
        marker
            .sessions
            .expect("the entry's marker has a session map"),
    )
}

/// The store's copy, downloaded as the next run does, and the session map of the marker beside it
/// (which must name that copy, or the next run would not believe it).
async fn store_copy(prefix: &str) -> (tempfile::TempDir, Map) {
    let store = crate::support::s3::connect(&crate::support::s3::settings(prefix)).await;
    let keys = fro_bot::object_store::StoreKeys::new(prefix, "octo", "hello").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let StoreRestore::Hit { sha256, .. } = restore_session_db(&store, &keys, dir.path()).await
    else {
        panic!("the store holds no copy");
    };
    let marker = fetch_marker(&store, &keys)
        .await
        .unwrap()
        .expect("a marker beside the store's copy");
    let marker = marker_naming(&marker, &sha256).unwrap();
    (
        dir,
        marker
            .sessions
            .expect("the store's marker has a session map"),
    )
}

/// Thread `i` (issue `FIRST_ISSUE + i`) leads to `sessions[i]`, whose user message asks to
/// remember the thread's word.
fn holds_every_thread(data: &Path, map: &Map, sessions: &[String], what: &str) {
    let db = rusqlite::Connection::open(data.join("opencode.db")).unwrap();
    for (i, id) in (0u64..).zip(sessions) {
        let thread = format!("issue-{}", FIRST_ISSUE + i);
        assert_eq!(
            map.get(&thread),
            Some(id),
            "{what}: {thread} leads to its first run's session: {map:?}"
        );
        let asked = format!("remember the word {}", word(i));
        let messages: i64 = db
            .query_row(
                "SELECT count(*) FROM session s JOIN message m ON m.session_id = s.id \
                 JOIN part p ON p.message_id = m.id \
                 WHERE s.id = ?1 AND json_extract(m.data, '$.role') = 'user' \
                 AND instr(json_extract(p.data, '$.text'), ?2) > 0",
                [id, &asked],
                |row| row.get(0),
            )
            .unwrap();
        assert!(
            messages > 0,
            "{what}: session {id} of {thread} was lost or lacks its message \"{asked}\""
        );
    }
}

/// A follow-up on each thread of `sample`, overlapping, each in words of its own (to find its
/// request): a cache hit that resumes the thread's session, and the model sees its first exchange.
async fn follow_ups(
    world: &World,
    sample: &std::collections::BTreeSet<u64>,
    prefix: Option<&str>,
    sessions: &[String],
) {
    let mut runs = tokio::task::JoinSet::new();
    for &i in sample {
        let job = thread_job(world, 4000 + i, 600 + i, prefix, i, &question(i));
        runs.spawn(async move { (i, main_step(job).await.1) });
        tokio::time::sleep(FOLLOW_UPS_APART).await;
    }
    while let Some(joined) = runs.join_next().await {
        let (i, r): (u64, StepResult) = joined.unwrap();
        assert_eq!(r.code, 0, "follow-up {i}: {}", explain(&r));
        assert_eq!(r.output("cache-status"), "hit", "{}", explain(&r));
        assert_eq!(
            r.output("session-id"),
            sessions[i as usize],
            "follow-up {i} resumes its own session: {}",
            explain(&r)
        );
    }
    let requests = world.llm.requests();
    for &i in sample {
        // The request whose newest message is this question (others may quote it as prior work).
        let asked = requests
            .iter()
            .find(|body| {
                let last = body["messages"].as_array().and_then(|m| m.last());
                last.is_some_and(|m| m.to_string().contains(&question(i)))
            })
            .map(request_text)
            .unwrap_or_else(|| panic!("follow-up {i} reached the model"));
        assert!(
            asked.contains(&format!("remember the word {}", word(i))),
            "follow-up {i} sees its thread's first exchange"
        );
    }
}

#[tokio::test]
async fn two_overlapping_runs_without_the_store_are_answered_and_both_threads_resume() {
    overlapping_threads_all_resume(2, None).await;
}

#[tokio::test]
async fn two_overlapping_runs_with_the_store_are_answered_and_both_threads_resume() {
    let prefix = crate::support::s3::unique_prefix("e2e-concurrent2");
    overlapping_threads_all_resume(2, Some(&prefix)).await;
}

#[tokio::test]
async fn sixteen_overlapping_runs_without_the_store_are_answered_and_every_thread_resumes() {
    overlapping_threads_all_resume(16, None).await;
}

#[tokio::test]
async fn sixteen_overlapping_runs_with_the_store_are_answered_and_every_thread_resumes() {
    let prefix = crate::support::s3::unique_prefix("e2e-concurrent16");
    overlapping_threads_all_resume(16, Some(&prefix)).await;
}

/// Polls until the model has had `n` requests (a run is inside its turn).
async fn until_requests(world: &World, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while world.llm.requests().len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "the model got {} request(s), not {n}",
            world.llm.requests().len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Two mentions on one thread with the store: the second waits for the first to publish, then
/// resumes its session and sees its exchange (docs/design.md#same-thread-one-at-a-time).
#[tokio::test]
async fn two_runs_on_one_thread_with_the_store_run_one_after_the_other_and_the_second_sees_the_first(
) {
    let world = World::start().await;
    let prefix = crate::support::s3::unique_prefix("e2e-thread-turn");
    world.github.seed_issue(30, "One thread", "Body.");
    world.llm.push(Reply::Delayed(
        std::time::Duration::from_secs(5),
        Box::new(Reply::text("Noted: the word is walrus-77.")),
    ));
    world.llm.push(Reply::text("It was walrus-77."));
    let job = |run: u64, comment: u64, body: &str| {
        let mut job = world.job(run);
        job.at_fixed_root();
        with_s3(&mut job, &prefix);
        job.event("issue_comment", &comment_event(30, comment, body));
        job
    };
    let first = job(5100, 710, "@fro-bot remember the word walrus-77");
    let first = tokio::spawn(async move { main_step(first).await.1 });
    // The first run is inside its turn (its request is at the model) when the second starts.
    until_requests(&world, 1).await;
    let second = job(5101, 711, "@fro-bot which word was it?");
    let second = tokio::spawn(async move { main_step(second).await.1 });
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    for r in [&a, &b] {
        assert_eq!(r.code, 0, "{}", explain(r));
        assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(r));
    }
    assert_eq!(
        b.output("session-id"),
        a.output("session-id"),
        "the second run resumes the first's session: {}",
        explain(&b)
    );
    let requests = world.llm.requests();
    let asked = request_text(requests.last().unwrap());
    assert!(
        asked.contains("remember the word walrus-77")
            && asked.contains("Noted: the word is walrus-77."),
        "the second run's request carries the first exchange: {asked}"
    );
    assert!(
        b.summary.contains("waited") && b.summary.contains("earlier run on this thread"),
        "{}",
        b.summary
    );
    assert!(
        !a.summary.contains("earlier run on this thread"),
        "{}",
        a.summary
    );
    let answered = world.github.created_comments();
    assert_eq!(answered.len(), 2, "{answered:?}");
    // While it waited, its comment said so; then it worked and answered as usual.
    let versions = world.github.comment_versions();
    let waiting = versions
        .iter()
        .position(|v| v.contains("waiting for an earlier run on this thread to finish"))
        .unwrap_or_else(|| panic!("{versions:?}"));
    assert!(
        versions[waiting + 1..]
            .iter()
            .any(|v| v.contains("Working on it") && !v.contains("waiting for")),
        "{versions:?}"
    );
    assert!(answered
        .iter()
        .any(|(_, body)| body.contains("It was walrus-77.")));
}

/// A run that cannot get its turn within `thread-wait` does not run, and says so on the thread
/// (😕): the mention is never dropped in silence. The other run is not disturbed — with
/// `comment-mode: sticky` its comment stays its own, and the reply is a comment of its own.
async fn a_run_that_cannot_get_its_turn_answers_that_it_could_not(mode: &str) {
    let world = World::start().await;
    let prefix = crate::support::s3::unique_prefix("e2e-thread-busy");
    world.github.seed_issue(31, "Busy thread", "Body.");
    world.llm.push(Reply::Delayed(
        std::time::Duration::from_secs(12),
        Box::new(Reply::text("Done with the long one.")),
    ));
    let job = |run: u64, comment: u64, body: &str| {
        let mut job = world.job(run);
        job.at_fixed_root();
        with_s3(&mut job, &prefix);
        job.input("comment-mode", mode);
        job.event("issue_comment", &comment_event(31, comment, body));
        job
    };
    let first = job(5200, 720, "@fro-bot a long task");
    let first = tokio::spawn(async move { main_step(first).await.1 });
    until_requests(&world, 1).await;
    let mut second = job(5201, 721, "@fro-bot and this?");
    second.input("thread-wait", "2000");
    let (_, b) = main_step(second).await;
    assert_eq!(b.code, 0, "{}", explain(&b));
    assert_eq!(b.output("cache-save-result"), "skipped", "{}", explain(&b));
    assert!(b.summary.contains("kept this thread"), "{}", b.summary);
    assert_eq!(
        world.llm.requests().len(),
        1,
        "the second run never reached the model"
    );
    assert!(
        world
            .github
            .reactions()
            .iter()
            .any(|(subject, c)| c == "confused" && subject.contains("721")),
        "{:?}",
        world.github.reactions()
    );
    let a = first.await.unwrap();
    assert_eq!(a.code, 0, "{}", explain(&a));
    assert_eq!(a.output("cache-save-result"), "durable", "{}", explain(&a));
    // Two comments: sticky, the second run never took over the first's.
    let comments = world.github.created_comments();
    assert_eq!(comments.len(), 2, "{comments:?}");
    let reply: Vec<_> = comments
        .iter()
        .filter(|(_, body)| body.contains("could not take my turn"))
        .collect();
    assert_eq!(reply.len(), 1, "{comments:?}");
    assert!(reply[0].1.contains("action:5200:1"), "{}", reply[0].1);
    assert!(
        comments
            .iter()
            .any(|(_, body)| body.contains("Done with the long one.")),
        "{comments:?}"
    );
}

#[tokio::test]
async fn a_run_that_cannot_get_its_turn_answers_that_it_could_not_run_mode() {
    a_run_that_cannot_get_its_turn_answers_that_it_could_not("run").await;
}

#[tokio::test]
async fn a_run_that_cannot_get_its_turn_answers_that_it_could_not_sticky_mode() {
    a_run_that_cannot_get_its_turn_answers_that_it_could_not("sticky").await;
}

/// A save that reached only the cache (here a run without the store; likewise a withheld publish
/// or a post retry) is newer than the store's copy, which restore prefers: it is merged in before
/// the turn, so a follow-up on that thread resumes it, and the store then holds it too.
#[tokio::test]
async fn a_save_that_reached_only_the_cache_is_not_shadowed_by_the_stores_older_copy() {
    let world = World::start().await;
    let prefix = crate::support::s3::unique_prefix("e2e-cache-only");
    world.github.seed_issue(40, "Stored thread", "Body.");
    world.github.seed_issue(41, "Cache-only thread", "Body.");
    let job = |run: u64, issue: u64, comment: u64, body: &str, store: bool| {
        let mut job = world.job(run);
        job.at_fixed_root();
        if store {
            with_s3(&mut job, &prefix);
        }
        job.event("issue_comment", &comment_event(issue, comment, body));
        job
    };
    let (_, a) = main_step(job(5300, 40, 730, "@fro-bot hello", true)).await;
    assert_eq!(a.output("cache-save-result"), "durable", "{}", explain(&a));
    let (_, b) = main_step(job(
        5301,
        41,
        731,
        "@fro-bot remember the word narwhal-9",
        false,
    ))
    .await;
    assert_eq!(b.output("cache-save-result"), "durable", "{}", explain(&b));
    world.llm.push(Reply::text("It was narwhal-9."));
    // The follow-up's issue is now eve's (an outsider): the run that read it lowers the record of
    // the session it wrote, though that session and its record came from the cache entry merged
    // in before the turn.
    world
        .github
        .seed_issue_by(41, "Cache-only thread", "Body.", "eve", "NONE");
    let mut follow_up = job(5302, 41, 732, "@fro-bot which word was it?", true);
    let mut event = comment_event(41, 732, "@fro-bot which word was it?");
    event["issue"]["user"]["login"] = serde_json::json!("eve");
    event["issue"]["author_association"] = serde_json::json!("NONE");
    follow_up.event("issue_comment", &event);
    let (follow_up, c) = main_step(follow_up).await;
    assert_eq!(c.code, 0, "{}", explain(&c));
    assert_eq!(
        c.output("session-id"),
        b.output("session-id"),
        "the follow-up resumes the cache-only session: {}",
        explain(&c)
    );
    let marker: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            fro_bot::memory::state_paths::StatePaths::new(follow_up.data_dir()).marker(),
        )
        .unwrap(),
    )
    .unwrap();
    let record = &marker["trust"][c.output("session-id")];
    assert_eq!(record["level"], "outsider", "{marker}");
    assert_eq!(record["author"], "eve", "{marker}");
    assert_eq!(
        marker["trust"][a.output("session-id")]["level"],
        "maintainer",
        "{marker}"
    );
    let asked = request_text(world.llm.requests().last().unwrap());
    assert!(asked.contains("remember the word narwhal-9"), "{asked}");
    assert!(c.summary.contains("merged with `"), "{}", c.summary);
    // C published the merge: the store's copy now holds both threads.
    let store = crate::support::s3::connect(&crate::support::s3::settings(&prefix)).await;
    let keys = fro_bot::object_store::StoreKeys::new(&prefix, "octo", "hello").unwrap();
    let fro_bot::object_store::GetOutcome::Found(copy) =
        store.get_bytes(&keys.session_db()).await.unwrap()
    else {
        panic!("no store copy");
    };
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &copy.bytes).unwrap();
    let db = rusqlite::Connection::open(file.path()).unwrap();
    for r in [&a, &b] {
        let id = r.output("session-id");
        let n: i64 = db
            .query_row("SELECT count(*) FROM session WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(n, 1, "{id} in the store's copy");
    }
}

pub(super) const CODEWORD_ISSUE: u64 = 50;

pub(super) fn codeword(i: u64) -> String {
    format!("walrus-{i}-narwhal")
}

/// Mention `i` on the codeword thread: run `6000 + i`, comment `800 + i`.
pub(super) fn codeword_job(world: &World, i: u64, body: &str, prefix: Option<&str>) -> Job {
    let mut job = world.job(6000 + i);
    job.at_fixed_root();
    if let Some(prefix) = prefix {
        with_s3(&mut job, prefix);
    }
    job.event(
        "issue_comment",
        &comment_event(CODEWORD_ISSUE, 800 + i, body),
    );
    job
}

/// Three mentions on one new issue, 0.3 s apart (docs/persistence.md#concurrent-runs-and-the-merge):
/// each is answered once, and a follow-up's first request to the model carries all three
/// questions, each followed by its own answer. With the Actions cache alone the runs overlap (no
/// answer comes before every mention reached the model, so each run restored before any saved)
/// and their exchanges are merged; with the store they take turns, as before.
pub async fn three_mentions_on_one_thread_are_all_answered_and_remembered(
    launch: Launch,
    prefix: Option<&str>,
) {
    let world = World::start_with(launch).await;
    world
        .github
        .seed_issue(CODEWORD_ISSUE, "Codewords", "Remember what I say.");
    world.llm.set_default(Reply::Echo {
        containing: "-narwhal".into(),
    });
    if prefix.is_none() {
        world.llm.hold_while(|_, all| {
            (0..3).any(|i| !all.iter().any(|r| request_text(r).contains(&codeword(i))))
        });
    }
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..3 {
        let body = format!("@fro-bot remember the codeword {}", codeword(i));
        let job = codeword_job(&world, i, &body, prefix);
        runs.spawn(async move { (i, main_step(job).await.1) });
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut summaries = Vec::new();
    while let Some(joined) = runs.join_next().await {
        let (i, r) = joined.unwrap();
        assert_eq!(r.code, 0, "mention {i}: {}", explain(&r));
        assert_eq!(
            r.output("cache-save-result"),
            "durable",
            "mention {i}: {}",
            explain(&r)
        );
        summaries.push(r.summary);
    }
    world.llm.release_holds();
    let answered = world.github.created_comments();
    for i in 0..3 {
        let answer = format!("Noted {}.", codeword(i));
        assert_eq!(
            answered
                .iter()
                .filter(|(_, body)| body.contains(&answer))
                .count(),
            1,
            "mention {i} answered once: {answered:?}"
        );
    }
    if prefix.is_none() {
        let kept = summaries
            .iter()
            .filter(|s| {
                s.contains("kept both exchanges of `issue-50` (a run beside this one answered too)")
            })
            .count();
        assert!(
            kept >= 2,
            "the later saves kept the others' exchanges: {summaries:#?}"
        );
    }
    follow_up_remembers_every_codeword(&world, prefix).await;
}

/// The next mention resumes the thread, and its first request holds each earlier question once,
/// immediately followed by its own answer.
pub(super) async fn follow_up_remembers_every_codeword(world: &World, prefix: Option<&str>) {
    let question = "@fro-bot what were the codewords?";
    let (_, r) = main_step(codeword_job(world, 3, question, prefix)).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(r.output("cache-status"), "hit", "{}", explain(&r));
    let requests = world.llm.requests();
    let first = requests
        .iter()
        .find(|body| {
            let last = body["messages"].as_array().and_then(|m| m.last());
            last.is_some_and(|m| m.to_string().contains("what were the codewords"))
        })
        .unwrap_or_else(|| panic!("the follow-up reached the model: {}", explain(&r)));
    let messages = first["messages"].as_array().unwrap();
    let history = &messages[..messages.len() - 1];
    for i in 0..3 {
        let asked = format!("remember the codeword {}", codeword(i));
        let at = history
            .iter()
            .position(|m| m["role"] == "user" && m.to_string().contains(&asked))
            .unwrap_or_else(|| panic!("mention {i} is not in the follow-up's request: {first:#}"));
        let times = history
            .iter()
            .filter(|m| m["role"] == "user" && m.to_string().contains(&asked))
            .count();
        assert_eq!(
            times, 1,
            "mention {i} is in the follow-up's request once: {first:#}"
        );
        // Its answer (after any tool steps) comes before the next question.
        let answered = history[at + 1..]
            .iter()
            .take_while(|m| m["role"] != "user")
            .any(|m| {
                m["role"] == "assistant"
                    && m.to_string().contains(&format!("Noted {}.", codeword(i)))
            });
        assert!(
            answered,
            "mention {i} is followed by its own answer: {first:#}"
        );
    }
}

#[tokio::test]
async fn three_mentions_on_one_thread_with_the_store_take_turns_and_are_all_remembered() {
    let prefix = crate::support::s3::unique_prefix("e2e-codewords");
    three_mentions_on_one_thread_are_all_answered_and_remembered(Launch::Binary, Some(&prefix))
        .await;
}
