//! Memory holding thousands of sessions (docs/persistence.md#every-thread-resumes): OpenCode
//! 1.18.33's `GET /session` answers only the 100 most recently updated unless asked for more, and
//! every thread must still resume, be pruned when past the window, and be found as prior work.
//! The database is grown as the whole-run benchmark grows it (`support::grow`): run 1's real
//! session cloned into thousands.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job};
use crate::support::fake_llm::{request_text, Reply};
use crate::support::grow::{epoch_ms, grow, Growth};

const DAY: i64 = 86_400_000;
/// Sessions updated after the thread's: conversations of one exchange, and (so the growth stays
/// quick) sessions without messages, interleaved.
const CONVERSATIONS: usize = 500;
const EMPTY: usize = 2500;
/// The oldest empty ones, moved past the 30-day window: pruned.
const PAST_WINDOW: usize = 150;
/// Empty ones made sub-agent children of those: pruned with them.
const CHILDREN: usize = 50;
/// The conversation holding the prior work: about 2000 sessions are newer.
const PRIOR: usize = 100;
const PRIOR_TEXT: &str = "The quokka gearbox slipped until the KESTREL-4411 bearing was replaced.";

/// The sessions the growth made, by role.
struct Grown {
    thread: String,
    past_window: Vec<String>,
    children: Vec<String>,
    prior: String,
    total: usize,
}

/// Grows `db` around the thread's session: it becomes the oldest of all (90 days), thousands of
/// sessions are newer, the oldest grown ones are past the window (some with children), and a
/// conversation about 2000 sessions deep holds the prior work. Only that one mentions this
/// thread's terms.
fn grow_around(db: &Path, thread: &str) -> Grown {
    let now = epoch_ms();
    // Within the window, from 10 days ago: the empty ones 4 minutes apart, the conversations 20
    // minutes apart between them (the newest about 3 days old).
    let start = now - 10 * DAY;
    let empty = Growth {
        exchanges: 0,
        ..Growth::many(EMPTY, start, 240_000)
    };
    let empty = grow(db, thread, &empty);
    let conversations = grow(
        db,
        thread,
        &Growth::many(CONVERSATIONS, start + 120_000, 1_200_000),
    );
    assert_eq!(
        (empty.sessions, conversations.sessions),
        (EMPTY, CONVERSATIONS)
    );
    let c = rusqlite::Connection::open(db).unwrap();
    let set_updated = |id: &str, at: i64| {
        c.execute(
            "UPDATE session SET time_updated = ?1 WHERE id = ?2",
            rusqlite::params![at, id],
        )
        .unwrap();
    };
    set_updated(thread, now - 90 * DAY);
    let past_window: Vec<String> = empty.ids[..PAST_WINDOW].to_vec();
    for (i, id) in past_window.iter().enumerate() {
        set_updated(id, now - 40 * DAY - i as i64 * 60_000);
    }
    let children: Vec<String> = empty.ids[PAST_WINDOW..PAST_WINDOW + CHILDREN].to_vec();
    for (i, id) in children.iter().enumerate() {
        c.execute(
            "UPDATE session SET parent_id = ?1 WHERE id = ?2",
            rusqlite::params![past_window[i], id],
        )
        .unwrap();
    }
    // The clones carry run 1's run summary, which names the thread's key: only the prior-work
    // session may mention it.
    c.execute(
        "UPDATE part SET data = replace(data, 'issue-5', 'issue-x') WHERE session_id <> ?1",
        [thread],
    )
    .unwrap();
    let prior = conversations.ids[PRIOR].clone();
    let changed = c
        .execute(
            "UPDATE part SET data = json_set(data, '$.text', ?1) WHERE id = (SELECT id FROM part \
             WHERE session_id = ?2 AND json_extract(data, '$.type') = 'text' LIMIT 1)",
            rusqlite::params![PRIOR_TEXT, prior],
        )
        .unwrap();
    assert_eq!(changed, 1);
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    Grown {
        thread: thread.to_string(),
        past_window,
        children,
        prior,
        total: EMPTY + CONVERSATIONS + 1,
    }
}

fn session_ids(db: &Path) -> BTreeSet<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut stmt = c.prepare("SELECT id FROM session").unwrap();
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    ids
}

/// The thread's session is older than 3000 others: the follow-up resumes it (its first exchange
/// is in the model's request), the sessions past the window go with their children, and prior
/// work is found in a session about 2000 deep.
#[tokio::test]
async fn the_oldest_thread_resumes_old_sessions_are_pruned_and_prior_work_is_found_among_thousands()
{
    let world = World::start().await;
    world
        .github
        .seed_issue(5, "Quokka gearbox slips", "It slips under load.");
    let (mut job, grown) = a_thread_and_thousands_newer(&world).await;
    let db = job.data_dir().join("opencode.db");

    // Run 2: a follow-up on the thread.
    job.next_run(4101);
    job.event(
        "issue_comment",
        &comment_event(5, 502, "@fro-bot and how do we fix it?"),
    );
    world.llm.push(Reply::text("Replace the clutch."));
    let (_job, second) = main_step(job).await;
    assert_eq!(second.code, 0, "{}", explain(&second));
    assert_eq!(second.output("cache-status"), "hit", "{}", explain(&second));
    assert_eq!(
        second.output("cache-save-result"),
        "durable",
        "{}",
        explain(&second)
    );
    let asked = world.llm.requests().last().cloned().unwrap();
    let broken = broken_promises(second.output("session-id"), &asked, &grown, &db);
    assert!(
        broken.is_empty(),
        "{}\n{}",
        broken.join("\n"),
        explain(&second)
    );
}

/// Run 1 answers on the thread; its database is then grown around the thread's session
/// ([`grow_around`]) and saved. The cache is read-only for main, so main does not save; post
/// saves the grown database under main's key, with main's session map.
async fn a_thread_and_thousands_newer(world: &World) -> (Job, Grown) {
    world
        .llm
        .push(Reply::text("It slips because the WALRUS-7 clutch is worn."));
    let mut job = world.job(4100);
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot why does the gearbox slip?"),
    );
    world.cache.set_read_only(true);
    let (job, first) = main_step(job).await;
    assert_eq!(first.code, 0, "{}", explain(&first));
    let thread = first.output("session-id").to_string();
    assert!(thread.starts_with("ses_"), "{}", explain(&first));
    let db = job.data_dir().join("opencode.db");
    let grown = tokio::task::spawn_blocking(move || grow_around(&db, &thread))
        .await
        .unwrap();
    world.cache.set_read_only(false);
    let (job, post) = post_step(job, first).await;
    assert_eq!(post.code, 0, "{}", explain(&post));
    assert_eq!(world.cache.entries().len(), 1, "{}", explain(&post));
    (job, grown)
}

/// Whether the model's request holds, as an assistant turn of its history, an answer saying
/// `words` (the issue's comments quote fro-bot's answers too: only the history shows a resume).
fn answered_before(request: &Value, words: &str) -> bool {
    let history = request["messages"].as_array().into_iter().flatten();
    history
        .filter(|m| m["role"] == "assistant")
        .any(|m| request_text(&serde_json::json!({ "messages": [m] })).contains(words))
}

/// Each promise checked on its own, so a run that breaks several says so for each: the run
/// continued `session`, `asked` the model with the thread's first answer in its history and the
/// prior work in its prompt, and `db` lost exactly the sessions past the window and their
/// children.
fn broken_promises(session: &str, asked: &Value, grown: &Grown, db: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    let resumed = answered_before(asked, "WALRUS-7");
    if session != grown.thread || !resumed {
        let not = if resumed { "" } else { "not " };
        broken.push(format!(
            "the thread did not resume: session {session} (the thread's is {}); its first \
             answer is {not}in the model's history",
            grown.thread,
        ));
    }
    let asked = request_text(asked);
    if !(asked.contains("Relevant prior work")
        && asked.contains(&grown.prior)
        && asked.contains("KESTREL-4411"))
    {
        broken.push("prior work about 2000 sessions deep was not found".into());
    }
    let left = session_ids(db);
    let gone: Vec<&String> = grown.past_window.iter().chain(&grown.children).collect();
    let still = gone.iter().filter(|id| left.contains(**id)).count();
    let want = grown.total - gone.len();
    if still > 0 || left.len() != want || !left.contains(&grown.thread) {
        broken.push(format!(
            "{still} of {} sessions past the window (or their children) are still in memory; \
             {} sessions left where {want} should be, the thread's {}",
            gone.len(),
            left.len(),
            if left.contains(&grown.thread) {
                "kept"
            } else {
                "gone"
            }
        ));
    }
    broken
}
