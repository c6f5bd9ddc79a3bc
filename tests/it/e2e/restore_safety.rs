//! Restored memory is untrusted input (docs/persistence.md): the built binary, the real OpenCode
//! and the scripted provider, with hostile entries planted in the fake Actions cache. A bad newest
//! entry never erases older memory, restored content cannot steer OpenCode, and only sessions
//! fro-bot created are resumed.

use std::path::Path;

use rusqlite::Connection;

use crate::e2e::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job, StepResult};
use crate::support::fake_llm::{request_text, Reply};
use fro_bot::memory::state_paths::StatePaths;

const PREFIX: &str = "opencode-storage-octo-hello-main-Linux";
/// Archive member names are relative to the workspace; the data dir is `../home/...` from it.
const DATA: &str = "../home/.local/share/opencode";

fn key(run: u64) -> String {
    format!("{PREFIX}-{run}-1-agent")
}

fn version(job: &Job) -> String {
    fro_bot::cache::version(StatePaths::new(job.data_dir()).cache_paths())
}

/// A tar.zst holding one member whose name has a NUL byte (carried in a pax `path` record),
/// inside a cache path, so extraction must decide what to do with it.
fn nul_name_archive(dest: &Path) {
    let mut tar = tar::Builder::new(Vec::new());
    let name = format!("{DATA}/storage/evil\0name");
    tar.append_pax_extensions([("path", name.as_bytes())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.as_ustar_mut().unwrap().name[..8].copy_from_slice(b"opencode");
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(4);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append(&h, &b"evil"[..]).unwrap();
    let bytes = tar.into_inner().unwrap();
    std::fs::write(dest, zstd::encode_all(&bytes[..], 3).unwrap()).unwrap();
}

/// Runs issue 305's first exchange and returns the job, its session id and the good entry's key.
async fn good_memory(world: &World, run: u64) -> (Job, String) {
    world
        .github
        .seed_issue(305, "Flaky build", "It fails sometimes.");
    world
        .llm
        .push(Reply::text("The pelican timeout is the culprit."));
    let mut job = world.job(run);
    job.event(
        "issue_comment",
        &comment_event(305, 1, "@fro-bot why is it flaky?"),
    );
    let (job, first) = main_step(job).await;
    assert_eq!(
        first.output("cache-save-result"),
        "durable",
        "{}",
        explain(&first)
    );
    let session = first.output("session-id").to_string();
    (job, session)
}

/// The next run's follow-up on issue 305, after the previous job's post step.
async fn follow_up(world: &World, mut job: Job, run: u64) -> (Job, StepResult) {
    job.next_run(run);
    job.event(
        "issue_comment",
        &comment_event(305, run, "@fro-bot and the fix?"),
    );
    world.llm.push(Reply::text("Raise it."));
    main_step(job).await
}

fn keys(world: &World) -> Vec<String> {
    world.cache.entries().into_iter().map(|e| e.key).collect()
}

#[tokio::test]
async fn hostile_newer_entries_fall_back_to_the_older_good_one_which_resumes_the_thread() {
    let world = World::start().await;
    let (job, session) = good_memory(&world, 3050).await;
    let good = key(3050);
    // Two newer entries under this branch's prefix: a NUL-byte member name and plain garbage.
    let nul = job.home().join("nul.tzst");
    nul_name_archive(&nul);
    world.cache.plant(&key(3051), &version(&job), &nul);
    let garbage = job.home().join("garbage.tzst");
    std::fs::write(&garbage, b"\x28\xb5\x2f\xfd not really zstd").unwrap();
    world.cache.plant(&key(3052), &version(&job), &garbage);

    let (_job, next) = follow_up(&world, job, 3053).await;
    assert_eq!(next.code, 0, "{}", explain(&next));
    assert_eq!(next.output("cache-status"), "hit", "{}", explain(&next));
    assert!(
        next.summary.contains(&format!("key `{good}`")),
        "{}",
        next.summary
    );
    assert_eq!(
        next.output("session-id"),
        session,
        "issue 305's conversation resumes"
    );
    let text = request_text(&world.llm.requests().last().cloned().unwrap());
    assert!(text.contains("pelican timeout"), "{text}");
    for needle in [
        // The NUL name is refused by the extraction, and the garbage is not an archive.
        &format!("the cache entry `{}` cannot be restored", key(3052)),
        &format!("the cache entry `{}` cannot be restored", key(3051)),
        "fell back past 2 unusable newer entries",
        &format!("deleted the broken cache entry `{}`", key(3052)),
        &format!("deleted the broken cache entry `{}`", key(3051)),
    ] {
        assert!(next.summary.contains(needle), "{needle}\n{}", next.summary);
    }
    // The broken entries are gone; the good one and this run's entry remain.
    assert_eq!(keys(&world), [good, key(3053)]);
    let listed = world
        .github
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/actions/caches"))
        .count();
    assert!(listed >= 1, "the REST listing was used");
}

#[tokio::test]
async fn without_a_listing_the_save_declines_and_the_next_run_still_finds_the_good_entry() {
    let world = World::start().await;
    let (job, session) = good_memory(&world, 3060).await;
    let nul = job.home().join("nul.tzst");
    nul_name_archive(&nul);
    world.cache.plant(&key(3061), &version(&job), &nul);
    // No `actions: read`/`write` for this run.
    world.github.fail(None, "/actions/caches", 403, Some(2));

    let (job, second) = follow_up(&world, job, 3062).await;
    assert_eq!(
        second.code,
        0,
        "the run still answers: {}",
        explain(&second)
    );
    assert_eq!(second.output("cache-status"), "corrupted");
    assert_eq!(
        second.output("cache-save-result"),
        "declined-for-safety",
        "{}",
        explain(&second)
    );
    for needle in [
        "shadowing-declined",
        "older entries could not be listed",
        "permissions: actions: read",
        "permissions: actions: write",
    ] {
        assert!(
            second.summary.contains(needle),
            "{needle}\n{}",
            second.summary
        );
    }
    assert_eq!(
        world.github.created_comments().len(),
        1 + 1,
        "both runs answered"
    );
    assert_eq!(
        second.state.get("cacheSaved").map(String::as_str),
        Some("declined-for-safety")
    );
    assert_eq!(keys(&world), [key(3060), key(3061)], "nothing new saved");
    let (job, post) = post_step(job, second).await;
    assert!(post.summary.contains("declined"), "{}", post.summary);
    assert_eq!(keys(&world), [key(3060), key(3061)], "post saved nothing");

    // With the permissions back, the next run falls back, heals the cache and resumes.
    let (_job, third) = follow_up(&world, job, 3063).await;
    assert_eq!(third.output("cache-status"), "hit", "{}", explain(&third));
    assert_eq!(third.output("session-id"), session, "{}", explain(&third));
    assert_eq!(third.output("cache-save-result"), "durable");
    assert_eq!(keys(&world), [key(3060), key(3063)]);
}

#[tokio::test]
async fn when_every_entry_is_broken_the_run_starts_clean_and_saves() {
    let world = World::start().await;
    let job = world.job(3070);
    let nul = job.home().join("nul.tzst");
    nul_name_archive(&nul);
    world.cache.plant(&key(3069), &version(&job), &nul);
    world.github.seed_issue(305, "t", "b");
    let mut job = job;
    job.event("issue_comment", &comment_event(305, 1, "@fro-bot hi"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.output("cache-status"), "corrupted", "{}", explain(&r));
    assert_eq!(
        r.output("cache-save-result"),
        "durable",
        "nothing older exists to hide: {}",
        explain(&r)
    );
    assert_eq!(keys(&world), [key(3070)], "the broken entry was deleted");
}

/// Plants, as the newest entry, the job's memory with poison added: a project id that is a path,
/// start commands, a planted `fro-bot: issue-305` session updated in 2286, a `storage/` tree.
fn poison(job: &Job, world: &World, run: u64) -> String {
    let paths = StatePaths::new(job.data_dir());
    let conn = Connection::open(paths.db()).unwrap();
    let workspace = job.workspace().to_string_lossy().into_owned();
    let real: String = conn
        .query_row(
            "SELECT id FROM project WHERE worktree = ?1 AND id <> 'global'",
            [&workspace],
            |r| r.get(0),
        )
        .unwrap();
    let year_2286 = 9_999_999_999_000_i64;
    conn.execute(
        "UPDATE project SET commands = '{\"start\":\"touch /tmp/fro-bot-pwned\"}' WHERE id = ?1",
        [&real],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO project (id, worktree, time_created, time_updated, sandboxes, commands) \
         VALUES ('../storage/evil', ?1, 1, ?2, '[]', '{\"start\":\"touch /tmp/fro-bot-pwned\"}')",
        rusqlite::params![workspace, year_2286],
    )
    .unwrap();
    let planted = |id: &str, project: &str| {
        conn.execute(
            "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, time_updated) \
             SELECT ?1, ?2, slug, directory, title, version, ?3, ?3 FROM session \
             WHERE parent_id IS NULL ORDER BY time_updated DESC LIMIT 1",
            rusqlite::params![id, project, year_2286],
        )
        .unwrap();
    };
    planted("ses_zzzzzzzzzzzzplanted", &real);
    for i in 0..3 {
        planted(&format!("ses_evil{i}"), "../storage/evil");
    }
    drop(conn);
    std::fs::create_dir_all(paths.data_dir.join("storage/evil-git")).unwrap();
    std::fs::write(
        paths.data_dir.join("storage/evil-git/config"),
        "[core]\n\tfsmonitor = touch /tmp/fro-bot-pwned\n",
    )
    .unwrap();
    let archive = job.home().join("poisoned.tzst");
    fro_bot::cache::write_archive(paths.cache_paths(), &job.workspace(), &archive).unwrap();
    world.cache.plant(&key(run), &version(job), &archive);
    real
}

#[tokio::test]
async fn poisoned_memory_is_sanitized_and_a_planted_session_is_never_resumed() {
    let _ = std::fs::remove_file("/tmp/fro-bot-pwned");
    let world = World::start().await;
    let (job, session) = good_memory(&world, 3080).await;
    let real = poison(&job, &world, 3081);
    // A new checkout: OpenCode reads the project id fro-bot writes to `.git/opencode`.
    let _ = std::fs::remove_file(job.workspace().join(".git/opencode"));

    let (job, next) = follow_up(&world, job, 3082).await;
    assert_eq!(next.code, 0, "{}", explain(&next));
    assert_eq!(next.output("cache-status"), "hit");
    assert_eq!(
        next.output("session-id"),
        session,
        "the session fro-bot made resumes, not the planted one: {}",
        explain(&next)
    );
    assert_eq!(
        std::fs::read_to_string(job.workspace().join(".git/opencode")).unwrap(),
        real,
        "the poisoned id is never written"
    );
    assert!(
        !next.stdout.contains("../storage/evil") && !next.summary.contains("../storage/evil"),
        "never logged raw"
    );
    assert!(
        next.stdout.contains("refused 1 restored project id(s)"),
        "{}",
        next.stdout
    );
    for needle in [
        "cleared the start commands of 2 restored project(s)",
        "clamped",
        "dropped a restored storage/",
    ] {
        assert!(next.summary.contains(needle), "{needle}\n{}", next.summary);
    }
    let data = job.data_dir();
    assert!(
        !data.join("storage").exists(),
        "nothing under storage/ kept"
    );
    assert!(!Path::new("/tmp/fro-bot-pwned").exists(), "no code ran");
    let conn = Connection::open(data.join("opencode.db")).unwrap();
    let commands: i64 = conn
        .query_row(
            "SELECT count(*) FROM project WHERE commands IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(commands, 0, "project.commands cleared");
    let future: i64 = conn
        .query_row(
            "SELECT count(*) FROM session WHERE time_updated > 9000000000000",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(future, 0, "timestamps clamped");
    // The marker records only fro-bot's own session for the thread.
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("fro-bot.json")).unwrap()).unwrap();
    assert_eq!(marker["sessions"]["issue-305"], session.as_str());
}

/// `fro-bot local`'s filesystem cache falls back the same way, through its own listing.
#[tokio::test]
async fn the_filesystem_cache_falls_back_and_deletes_the_broken_entry() {
    use fro_bot::cache::{Backend, FsBackend, SaveRequest};
    use fro_bot::memory::fallback::Catalog;
    use fro_bot::memory::report::CacheStatus;
    use fro_bot::memory::restore::{restore, RestoreInputs, StoreAttempt};

    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let paths = StatePaths::new(dir.path().join("data/opencode"));
    std::fs::create_dir_all(&paths.data_dir).unwrap();
    crate::persistence::killed_writer(&paths.db(), 7);
    fro_bot::memory::checkpoint::checkpoint(&paths.db());
    let fs = FsBackend::new(dir.path().join("cache"));
    for key in ["local-k-1", "local-k-2"] {
        let request = SaveRequest {
            key,
            paths: paths.cache_paths(),
            workspace: &workspace,
        };
        fs.save(&request).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let newest = fs
        .entries()
        .unwrap()
        .into_iter()
        .find(|e| e.key == "local-k-2")
        .unwrap();
    std::fs::write(fs.dir().join(&newest.archive), b"not an archive").unwrap();
    std::fs::remove_dir_all(&paths.data_dir).unwrap();

    let backend = Backend::Filesystem(fs.clone());
    let report = restore(
        RestoreInputs {
            paths: &paths,
            workspace: &workspace,
            skip_cache: false,
            cache: Some(&backend),
            key: "local-k",
            restore_keys: &["local-k-".to_string()],
            catalog: Catalog::Local(&fs),
            now_ms: fro_bot::opencode::system_now_ms(),
        },
        async { StoreAttempt::Disabled },
    )
    .await;
    assert_eq!(report.status, CacheStatus::Hit, "{:?}", report.notes);
    assert_eq!(report.matched_key.as_deref(), Some("local-k-1"));
    assert_eq!(report.shadow_guard, None);
    let left: Vec<String> = fs.entries().unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(left, ["local-k-1"], "the broken entry was deleted");
    let rows: i64 = Connection::open(paths.db())
        .unwrap()
        .query_row("SELECT count(*) FROM memory", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 7, "the older database is in place");
}
