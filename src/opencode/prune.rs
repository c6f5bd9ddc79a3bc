//! Pruning: keep a root session updated within 30 days **or** among the newest `session-retention`
//! roots; delete every other root together with its child sessions (recursively, children first).
//! Every session is listed, not OpenCode's first 100, and the work is bounded
//! (docs/persistence.md#every-thread-resumes): at most [`LISTING_CAP`] sessions are considered
//! and deletions stop at [`Bounds::time`], the rest left to later runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::client::{ApiError, Client, Extent, Session, LISTING_CAP};

pub const MAX_AGE_MS: i64 = 30 * 24 * 60 * 60 * 1000;

/// How much one prune may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Sessions listed at most (the newest).
    pub listing: usize,
    /// Time for the deletions; what is left when it runs out waits for a later run.
    pub time: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            listing: LISTING_CAP,
            time: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrunePlan {
    pub keep: Vec<String>,
    /// Deletion order: every child before its parent.
    pub delete: Vec<String>,
}

/// Decides what to delete. `protect` (the current session) is always kept.
pub fn plan(sessions: &[Session], now_ms: i64, retention: usize, protect: &[&str]) -> PrunePlan {
    let mut roots: Vec<&Session> = sessions.iter().filter(|s| s.parent_id.is_none()).collect();
    roots.sort_by(|a, b| {
        b.time
            .updated
            .cmp(&a.time.updated)
            .then_with(|| b.id.cmp(&a.id))
    });
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in sessions {
        if let Some(p) = &s.parent_id {
            children.entry(p.as_str()).or_default().push(s.id.as_str());
        }
    }
    let mut out = PrunePlan::default();
    let mut seen = BTreeSet::new();
    for (rank, root) in roots.iter().enumerate() {
        let recent = now_ms.saturating_sub(root.time.updated) <= MAX_AGE_MS;
        if recent || rank < retention || protect.contains(&root.id.as_str()) {
            out.keep.push(root.id.clone());
            continue;
        }
        // Post-order walk: descendants first.
        let mut stack = vec![(root.id.as_str(), false)];
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                if seen.insert(id) {
                    out.delete.push(id.to_string());
                }
                continue;
            }
            stack.push((id, true));
            for c in children.get(id).into_iter().flatten() {
                if !seen.contains(c) {
                    stack.push((c, false));
                }
            }
        }
    }
    out
}

/// [`plan`] over every session `db` holds, read from the file (read-only): the memory guard checks
/// a prune against the restored copy with it, which the agent could not touch
/// (`memory::guard::put_back`).
pub fn plan_in(
    db: &Path,
    now_ms: i64,
    retention: usize,
    protect: &[&str],
) -> rusqlite::Result<PrunePlan> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let mut stmt = conn.prepare("SELECT id, parent_id, time_updated FROM session")?;
    let sessions = stmt
        .query_map([], |r| {
            Ok(Session {
                id: r.get(0)?,
                title: String::new(),
                directory: String::new(),
                project_id: String::new(),
                parent_id: r.get(1)?,
                time: super::client::SessionTime {
                    created: 0,
                    updated: r.get(2)?,
                    compacting: None,
                    archived: None,
                },
            })
        })?
        .collect::<rusqlite::Result<Vec<Session>>>()?;
    Ok(plan(&sessions, now_ms, retention, protect))
}

#[derive(Debug, Clone, PartialEq)]
pub struct PruneReport {
    pub kept: usize,
    pub deleted: Vec<String>,
    /// Deletions that failed (the session stays; the next run tries again).
    pub failures: Vec<String>,
    /// Whether every session was listed ([`Bounds::listing`]).
    pub listing: Extent,
    /// Deletions not attempted: [`Bounds::time`] ran out (a later run goes on).
    pub left: usize,
}

impl PruneReport {
    /// What the log says when a bound stopped the prune short of its whole plan.
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self.listing.note("pruning").into_iter().collect();
        if self.left > 0 {
            notes.push(format!(
                "pruning ran out of time: {} session(s) deleted, {} left for later runs",
                self.deleted.len(),
                self.left
            ));
        }
        notes
    }
}

/// Deletes what [`plan`] says over every session listed (the newest [`Bounds::listing`]), until
/// [`Bounds::time`] runs out.
pub async fn prune(
    client: &Client,
    now_ms: i64,
    retention: usize,
    protect: &[&str],
    bounds: Bounds,
) -> Result<PruneReport, ApiError> {
    let listing = client.list_sessions_upto(bounds.listing).await?;
    let plan = plan(&listing.sessions, now_ms, retention, protect);
    let mut report = PruneReport {
        kept: plan.keep.len(),
        deleted: Vec::new(),
        failures: Vec::new(),
        listing: listing.extent,
        left: 0,
    };
    let deadline = tokio::time::Instant::now() + bounds.time;
    let mut queue = plan.delete.into_iter();
    for id in queue.by_ref() {
        match client.delete_session(&id).await {
            Ok(()) => report.deleted.push(id),
            // Already gone (deleted with its parent): the goal is met.
            Err(e) if e.is_not_found() => report.deleted.push(id),
            Err(e) => report.failures.push(format!("{id}: {e}")),
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    report.left = queue.count();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::super::client::SessionTime;
    use super::*;

    const DAY: i64 = 24 * 60 * 60 * 1000;

    fn s(id: &str, parent: Option<&str>, age_days: i64, now: i64) -> Session {
        Session {
            id: id.into(),
            title: id.into(),
            directory: "/ws".into(),
            project_id: "p".into(),
            parent_id: parent.map(str::to_string),
            time: SessionTime {
                created: 0,
                updated: now - age_days * DAY,
                compacting: None,
                archived: None,
            },
        }
    }

    #[test]
    fn keeps_recent_or_newest_and_deletes_old_trees_children_first() {
        let now = 1_000 * DAY;
        let sessions = vec![
            s("recent1", None, 1, now),
            s("recent2", None, 29, now),
            s("old1", None, 40, now),
            s("old2", None, 50, now),
            s("old3", None, 60, now),
            s("child", Some("old3"), 1, now),
            s("grandchild", Some("child"), 1, now),
            s("current", None, 90, now),
        ];
        // Retention 3: recent1, recent2, old1 are the newest three; old2, old3 go; current is
        // protected.
        let p = plan(&sessions, now, 3, &["current"]);
        let mut keep = p.keep.clone();
        keep.sort();
        assert_eq!(keep, ["current", "old1", "recent1", "recent2"]);
        assert_eq!(p.delete.len(), 4);
        let pos = |id: &str| p.delete.iter().position(|d| d == id).unwrap();
        assert!(pos("grandchild") < pos("child") && pos("child") < pos("old3"));
        assert!(p.delete.contains(&"old2".to_string()));

        // Retention 0: only the 30-day rule.
        let p = plan(&sessions, now, 0, &[]);
        assert_eq!(p.keep, ["recent1", "recent2"]);
        // Exactly 30 days is still recent.
        let edge = vec![s("edge", None, 30, now)];
        assert_eq!(plan(&edge, now, 0, &[]).keep, ["edge"]);
    }
}
