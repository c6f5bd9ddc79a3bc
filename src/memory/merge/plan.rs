//! The decision, per session tree (a root session and its descendants), from three views: what
//! this run restored, what it holds now ("ours"), and the newest shared copy ("base").
//!
//! A tree is the unit because a child session (a sub-agent's) belongs to the turn that made it:
//! when two turns changed the same thread, the winner's whole tree replaces the loser's.

use std::collections::{BTreeMap, BTreeSet};

use super::snapshot::SessionVersion;

pub type Versions = BTreeMap<String, SessionVersion>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Ours,
    Base,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// New in this run.
    Added,
    /// Changed by this run; the base still has the version this run restored.
    Updated,
    /// Deleted by this run (pruned); the base still has the version this run restored.
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This run's tree replaces the base's.
    Take(Change),
    /// Both sides made exactly the same change (e.g. this run's save was merged in before).
    Identical,
    /// Both sides changed the tree; the later activity wins (a tie goes to this run).
    Conflict { winner: Side },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreePlan {
    pub root: String,
    pub decision: Decision,
    /// The tree's sessions in the base and in ours (either may be empty).
    pub base_members: Vec<String>,
    pub ours_members: Vec<String>,
    pub ours_activity: Option<i64>,
    pub base_activity: Option<i64>,
    /// A title for the report (ours, else the base's).
    pub title: Option<String>,
}

impl TreePlan {
    /// Whether the output differs from the base for this tree.
    pub fn writes(&self) -> bool {
        match self.decision {
            Decision::Take(_) => true,
            Decision::Conflict { winner } => winner == Side::Ours,
            Decision::Identical => false,
        }
    }
}

/// Every tree this run changed (trees it left alone are the base's, whatever the base did).
pub fn plan(restored: &Versions, ours: &Versions, base: &Versions) -> Vec<TreePlan> {
    let roots = RootMap::new([ours, base, restored]);
    let group = |v: &Versions| -> BTreeMap<String, Versions> {
        let mut out: BTreeMap<String, Versions> = BTreeMap::new();
        for (id, ver) in v {
            out.entry(roots.root(id).to_string())
                .or_default()
                .insert(id.clone(), ver.clone());
        }
        out
    };
    let (by_ours, by_restored, by_base) = (group(ours), group(restored), group(base));
    let members =
        |g: &BTreeMap<String, Versions>, root: &str| g.get(root).cloned().unwrap_or_default();
    let candidates: BTreeSet<&str> = ours
        .keys()
        .chain(restored.keys())
        .map(|id| roots.root(id))
        .collect();
    let mut out = Vec::new();
    for root in candidates {
        let (o, r, b) = (
            members(&by_ours, root),
            members(&by_restored, root),
            members(&by_base, root),
        );
        if o == r {
            continue;
        }
        let activity = |v: &Versions| v.values().map(|s| s.activity).max();
        let (ours_activity, base_activity) = (activity(&o), activity(&b));
        let decision = if b == r {
            Decision::Take(if r.is_empty() {
                Change::Added
            } else if o.is_empty() {
                Change::Deleted
            } else {
                Change::Updated
            })
        } else if b == o {
            Decision::Identical
        } else {
            // `None` (the side deleted the tree) loses to any activity.
            let winner = if ours_activity >= base_activity {
                Side::Ours
            } else {
                Side::Base
            };
            Decision::Conflict { winner }
        };
        let title = o
            .get(root)
            .or_else(|| b.get(root))
            .or_else(|| r.get(root))
            .and_then(|s| s.title.clone());
        out.push(TreePlan {
            root: root.to_string(),
            decision,
            base_members: b.into_keys().collect(),
            ours_members: o.into_keys().collect(),
            ours_activity,
            base_activity,
            title,
        });
    }
    out
}

/// Session → root, over the parent links of all views (a parent unknown to every view ends the
/// walk; a cycle, which OpenCode never makes, ends it at the repeat).
struct RootMap {
    roots: BTreeMap<String, String>,
}

impl RootMap {
    fn new<const N: usize>(views: [&Versions; N]) -> Self {
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        for v in views {
            for (id, s) in v {
                if let Some(p) = &s.parent {
                    parent.entry(id.as_str()).or_insert(p.as_str());
                }
            }
        }
        let known: BTreeSet<&str> = views
            .iter()
            .flat_map(|v| v.keys().map(String::as_str))
            .collect();
        let mut roots = BTreeMap::new();
        for &id in &known {
            let mut cur = id;
            let mut seen = BTreeSet::from([id]);
            while let Some(&p) = parent.get(cur) {
                if !known.contains(p) || !seen.insert(p) {
                    break;
                }
                cur = p;
            }
            roots.insert(id.to_string(), cur.to_string());
        }
        RootMap { roots }
    }

    fn root<'a>(&'a self, id: &'a str) -> &'a str {
        self.roots.get(id).map(String::as_str).unwrap_or(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(entries: &[(&str, Option<&str>, i64, &str)]) -> Versions {
        entries
            .iter()
            .map(|(id, parent, at, digest)| {
                (
                    id.to_string(),
                    SessionVersion {
                        parent: parent.map(str::to_string),
                        activity: *at,
                        title: Some(format!("t-{id}")),
                        digest: digest.to_string(),
                    },
                )
            })
            .collect()
    }

    fn decisions(p: &[TreePlan]) -> Vec<(&str, Decision)> {
        p.iter()
            .map(|t| (t.root.as_str(), t.decision.clone()))
            .collect()
    }

    #[test]
    fn disjoint_changes_are_taken_and_untouched_trees_left_to_the_base() {
        let restored = v(&[("a", None, 1, "a1"), ("old", None, 1, "o1")]);
        // Ours: a changed, new n with a child, old pruned.
        let ours = v(&[
            ("a", None, 5, "a2"),
            ("n", None, 6, "n1"),
            ("n-child", Some("n"), 7, "c1"),
        ]);
        // Base: another run added b and changed nothing else.
        let base = v(&[
            ("a", None, 1, "a1"),
            ("old", None, 1, "o1"),
            ("b", None, 9, "b1"),
        ]);
        let p = plan(&restored, &ours, &base);
        assert_eq!(
            decisions(&p),
            [
                ("a", Decision::Take(Change::Updated)),
                ("n", Decision::Take(Change::Added)),
                ("old", Decision::Take(Change::Deleted)),
            ]
        );
        assert_eq!(p[1].ours_members, ["n", "n-child"]);
        assert_eq!(p[1].ours_activity, Some(7));
        assert!(p.iter().all(TreePlan::writes));
    }

    #[test]
    fn both_sides_changed_the_later_activity_wins_and_identical_changes_are_no_conflict() {
        let restored = v(&[("a", None, 1, "a1"), ("c", None, 1, "c1")]);
        let ours = v(&[
            ("a", None, 5, "a-ours"),
            ("c", None, 4, "c-same"),
            ("d", None, 3, "d1"),
        ]);
        let base = v(&[
            ("a", None, 8, "a-base"),
            ("c", None, 4, "c-same"),
            ("d", None, 3, "d1"),
        ]);
        let p = plan(&restored, &ours, &base);
        assert_eq!(
            decisions(&p),
            [
                ("a", Decision::Conflict { winner: Side::Base }),
                ("c", Decision::Identical),
                ("d", Decision::Identical),
            ]
        );
        assert!(!p[0].writes() && !p[1].writes());
        assert_eq!((p[0].ours_activity, p[0].base_activity), (Some(5), Some(8)));
        // A tie goes to this run.
        let base = v(&[("a", None, 5, "a-base")]);
        let p = plan(&restored, &v(&[("a", None, 5, "a-ours")]), &base);
        assert_eq!(p[0].decision, Decision::Conflict { winner: Side::Ours });
    }

    #[test]
    fn a_child_change_decides_for_the_whole_tree_and_deletion_loses_to_activity() {
        let restored = v(&[("r", None, 1, "r1"), ("k", Some("r"), 1, "k1")]);
        // Ours added a sub-agent child under r; base changed r itself.
        let ours = v(&[
            ("r", None, 1, "r1"),
            ("k", Some("r"), 1, "k1"),
            ("k2", Some("r"), 6, "k2"),
        ]);
        let base = v(&[("r", None, 4, "r-base"), ("k", Some("r"), 1, "k1")]);
        let p = plan(&restored, &ours, &base);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].decision, Decision::Conflict { winner: Side::Ours });
        assert_eq!(p[0].base_members, ["k", "r"]);
        assert_eq!(p[0].ours_members, ["k", "k2", "r"]);
        // Ours pruned r while the base continued it: the base's activity wins.
        let p = plan(&restored, &Versions::new(), &base);
        assert_eq!(p[0].decision, Decision::Conflict { winner: Side::Base });
        assert_eq!(p[0].ours_activity, None);
    }

    #[test]
    fn parent_cycles_and_unknown_parents_end_the_walk() {
        let ours = v(&[
            ("x", Some("y"), 1, "x"),
            ("y", Some("x"), 1, "y"),
            ("z", Some("missing"), 1, "z"),
        ]);
        let p = plan(&Versions::new(), &ours, &Versions::new());
        let roots: Vec<&str> = p.iter().map(|t| t.root.as_str()).collect();
        assert!(roots.contains(&"z"), "{roots:?}");
        assert_eq!(p.iter().map(|t| t.ours_members.len()).sum::<usize>(), 3);
    }
}
