//! Pruning: keep a root session updated within 30 days **or** among the newest `session-retention`
//! roots; delete every other root together with its child sessions (recursively, children first).

use std::collections::{BTreeMap, BTreeSet};

use super::client::{ApiError, Client, Session};

pub const MAX_AGE_MS: i64 = 30 * 24 * 60 * 60 * 1000;

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

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PruneReport {
    pub kept: usize,
    pub deleted: Vec<String>,
    /// Deletions that failed (the session stays; the next run tries again).
    pub failures: Vec<String>,
}

pub async fn prune(
    client: &Client,
    now_ms: i64,
    retention: usize,
    protect: &[&str],
) -> Result<PruneReport, ApiError> {
    let sessions = client.list_sessions().await?;
    let plan = plan(&sessions, now_ms, retention, protect);
    let mut report = PruneReport {
        kept: plan.keep.len(),
        ..Default::default()
    };
    for id in plan.delete {
        match client.delete_session(&id).await {
            Ok(()) => report.deleted.push(id),
            // Already gone (deleted with its parent): the goal is met.
            Err(e) if e.is_not_found() => report.deleted.push(id),
            Err(e) => report.failures.push(format!("{id}: {e}")),
        }
    }
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
