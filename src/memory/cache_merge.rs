//! The cache side of concurrent runs (docs/design.md#concurrent-runs): before saving, the entries
//! other runs saved under the restore prefixes since this run restored are downloaded beside the
//! live memory, checked like any restored entry, and this run's sessions are merged into them —
//! so the entry saved next holds every thread, and the next run (which restores only the newest)
//! loses none. A failure at any step keeps this run's own database: never worse than no merge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cache::{self, RestoreOutcome};
use crate::memory::checkpoint::{self, ProbeOutcome};
use crate::memory::fallback::{Catalog, Listing};
use crate::memory::ledger::OwnRows;
use crate::memory::merge::{self, MergeReport, Snapshot};
use crate::memory::report::RestoreSource;
use crate::memory::restore::shown;
use crate::memory::sanitize::{self, SanitizeOutcome};
use crate::memory::session_map::{self, Map};
use crate::memory::spend_ledger;
use crate::memory::state_paths::{check_marker, MarkerCheck, StatePaths, MARKER_FILE};
use crate::trust::{SessionTrust, TrustMap};

/// Entries merged at most per save: the newest ones, when a burst of runs saved since.
const MAX_ENTRIES: usize = 8;
/// Saves again at most this many times when entries committed during the save lack this run's
/// sessions (see [`merge_saved_meanwhile`]).
pub const MAX_RESAVES: usize = 2;

pub struct CacheMergeInputs<'a> {
    pub cache: &'a cache::Backend,
    pub catalog: Catalog<'a>,
    pub restore_keys: &'a [String],
    pub primary_key: &'a str,
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    /// Where this run's memory came from, and the cache entry when it was one (or, after a
    /// store restore, the entry merged in then: only entries newer than it are merged again).
    pub source: RestoreSource,
    pub restored_key: Option<&'a str>,
    /// What was merged at restore, joined to what the save merges (`CacheMergeReport::then`).
    pub earlier: Option<&'a CacheMergeReport>,
    /// What only this run's database holds, which a merge may move or fold (and then renames).
    pub own_rows: &'a OwnRows,
}

/// What the merge did, for the summary.
#[derive(Debug, Clone, Default)]
pub struct CacheMergeReport {
    /// Entries merged in, oldest first, with what each merge reported.
    pub merged: Vec<(String, MergeReport)>,
    /// Entries that could not be used, and why (kept out; this run's sessions still saved).
    pub skipped: Vec<String>,
    /// The threads the merged entries' markers map, for this run's marker.
    pub sessions: Map,
    /// Their trust records for the sessions whose merged version is theirs
    /// (docs/security.md#trust-follows-memory), and those sessions (a record of this run's no
    /// longer describes them).
    pub trust: TrustMap,
    pub from_them: BTreeSet<String>,
    /// Sessions a merge joined (both runs' exchanges in one), with the merged entry's record of
    /// each: the result holds both runs' text, so it keeps the lower record, or none.
    pub joined: BTreeMap<String, Option<SessionTrust>>,
    /// This run's thread sessions folded into another run's of the same thread (from, into).
    pub folded: Vec<(String, String)>,
    /// Every key the listing before the save showed (`None`: no listing), so what appears
    /// during the save can be told apart.
    pub listed: Option<Vec<String>>,
}

/// One entry merged in.
struct Merged {
    report: MergeReport,
    sessions: Map,
    trust: TrustMap,
    from_them: BTreeSet<String>,
    joined: BTreeMap<String, Option<SessionTrust>>,
    folded: Vec<(String, String)>,
    /// It brought in a message, or a session, that this run's database lacked (`gained`).
    new_to_us: bool,
}

impl CacheMergeReport {
    fn take(&mut self, key: String, merged: Merged) {
        self.fold(merged.sessions, merged.trust, merged.from_them);
        self.fold_joined(merged.joined);
        self.folded.extend(merged.folded);
        self.merged.push((key, merged.report));
    }

    /// An entry's map, trust records and sessions joined to what was merged before it.
    fn fold(&mut self, sessions: Map, trust: TrustMap, from_them: BTreeSet<String>) {
        for (k, v) in sessions {
            self.sessions.entry(k).or_insert(v);
        }
        crate::trust::join_lowering(&mut self.trust, trust);
        self.from_them.extend(from_them);
    }

    /// Sessions joined again keep the lower record of every entry they were joined with.
    fn fold_joined(&mut self, joined: BTreeMap<String, Option<SessionTrust>>) {
        for (id, theirs) in joined {
            let record = match (self.joined.remove(&id), theirs) {
                (None, theirs) => theirs,
                (Some(Some(held)), Some(theirs)) => Some(held.lowered_by(&theirs)),
                (Some(None), _) | (Some(Some(_)), None) => None,
            };
            self.joined.insert(id, record);
        }
    }

    /// Joins what was merged into `map`, the threads fro-bot keeps: an entry's thread this run's
    /// map lacks is added (this run's mapping stands where both have one).
    pub fn join_sessions_into(&self, map: &mut Map) {
        for (k, v) in &self.sessions {
            map.entry(k.clone()).or_insert_with(|| v.clone());
        }
        // A thread session folded into another run's continues as that one.
        for (from, into) in &self.folded {
            for session in map.values_mut().filter(|s| *s == from) {
                *session = into.clone();
            }
        }
    }

    /// Joins the merged entries' trust records into `trust`, this run's: a session whose merged
    /// version is theirs takes their record, the lower one where both hold it
    /// (docs/security.md#trust-follows-memory).
    pub fn join_trust_into(&self, trust: &mut TrustMap) {
        for (from, into) in &self.folded {
            if let Some(record) = trust.remove(from) {
                trust.insert(into.clone(), record);
            }
        }
        trust.retain(|id, _| !self.from_them.contains(id));
        crate::trust::join_lowering(trust, self.trust.clone());
        // A joined session holds both runs' text: the lower of both records, none if either has
        // none.
        for (id, theirs) in &self.joined {
            let record = match (trust.remove(id), theirs) {
                (Some(ours), Some(theirs)) => Some(ours.lowered_by(theirs)),
                (None, _) | (Some(_), None) => None,
            };
            if let Some(record) = record {
                trust.insert(id.clone(), record);
            }
        }
    }

    /// These merges (the restore's), then `later`'s (the save's): one report for the summary
    /// (the restore's threads and records are joined into the run's own at restore). The listing is `later`'s, the one taken just before the save.
    pub fn then(mut self, later: CacheMergeReport) -> CacheMergeReport {
        self.fold(later.sessions, later.trust, later.from_them);
        self.fold_joined(later.joined);
        self.folded.extend(later.folded);
        self.merged.extend(later.merged);
        self.skipped.extend(later.skipped);
        self.listed = later.listed;
        self
    }

    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .merged
            .iter()
            .map(|(key, m)| {
                format!(
                    "merged with `{}`, which another run saved: {} of this run's thread(s) written into it",
                    shown(key),
                    m.taken.len()
                )
            })
            .collect();
        for (_, m) in &self.merged {
            notes.extend(m.kept_both.iter().map(session_map::kept_both_note));
            notes.extend(
                m.conflicts
                    .iter()
                    .filter(|c| c.lost_a_turn())
                    .map(|c| c.describe()),
            );
        }
        notes.extend(self.skipped.iter().cloned());
        // Each entry of a burst joins the same thread again: one line says it.
        let mut seen = BTreeSet::new();
        notes.retain(|note| seen.insert(note.clone()));
        notes
    }
}

/// Merges the entries saved since this run restored into its database (in place, atomically by
/// rename). Returns what it did; errors are reported in it, never raised.
pub async fn merge_newer_entries(inputs: &CacheMergeInputs<'_>) -> CacheMergeReport {
    let mut report = CacheMergeReport::default();
    if !inputs.cache.can_restore() {
        return report;
    }
    let candidates = match candidates(inputs, &mut report).await {
        Ok(keys) => keys,
        Err(message) => {
            report.skipped.push(message);
            return report;
        }
    };
    merge_each(inputs, candidates, &mut report).await;
    report
}

/// Merges `keys` (newest first) into this run's database, oldest first; whether any of them held
/// a session, or a version of one, that this run lacked.
async fn merge_each(
    inputs: &CacheMergeInputs<'_>,
    keys: Vec<String>,
    report: &mut CacheMergeReport,
) -> bool {
    let mut contributed = false;
    for key in keys.into_iter().rev() {
        match merge_one(inputs, &key).await {
            Ok(merged) => {
                contributed |= merged.new_to_us;
                report.take(key, merged);
            }
            Err(why) => report.skipped.push(format!(
                "the entry `{}` saved meanwhile was not merged: {why}",
                shown(&key)
            )),
        }
    }
    contributed
}

/// The entries saved since this run restored, newest first: those listed before the restored
/// entry; after a store restore or a miss, the newest (a store restore holds what the store
/// had, so only a save that reached the cache alone can be missing from it).
async fn candidates(
    inputs: &CacheMergeInputs<'_>,
    report: &mut CacheMergeReport,
) -> Result<Vec<String>, String> {
    let version = cache::version(inputs.paths.cache_paths());
    let keys = match inputs
        .catalog
        .list(inputs.restore_keys, &version, &[])
        .await
    {
        Listing::Keys { keys, .. } => keys,
        Listing::Failed { .. } => return newest_by_lookup(inputs).await,
    };
    report.listed = Some(keys.clone());
    let newer: Vec<String> = match inputs.restored_key {
        Some(restored) => match keys.iter().position(|k| k == restored) {
            Some(at) => keys[..at].to_vec(),
            // Not listed (another prefix, or evicted): only the newest can be told apart.
            None => keys.into_iter().take(1).collect(),
        },
        None => match inputs.source {
            RestoreSource::Storage => keys.into_iter().take(1).collect(),
            RestoreSource::Cache | RestoreSource::None => keys,
        },
    };
    Ok(newer.into_iter().take(MAX_ENTRIES).collect())
}

/// Without a listing (no `actions: read`), the lookup still names the newest entry.
async fn newest_by_lookup(inputs: &CacheMergeInputs<'_>) -> Result<Vec<String>, String> {
    let scratch = scratch(inputs.paths)?;
    let request = cache::RestoreRequest {
        key: inputs.primary_key,
        restore_keys: inputs.restore_keys,
        paths: inputs.paths.restore_targets(),
        workspace: inputs.workspace,
        into: Some(scratch.path()),
    };
    match inputs.cache.restore(&request).await {
        Ok(RestoreOutcome::Hit { matched_key, .. })
            if Some(matched_key.as_str()) != inputs.restored_key =>
        {
            Ok(vec![matched_key])
        }
        Ok(_) => Ok(Vec::new()),
        Err(e) => Err(format!("cannot look up entries saved meanwhile: {e}")),
    }
}

fn scratch(paths: &StatePaths) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(".fro-bot-merge")
        .tempdir_in(&paths.data_dir)
        .map_err(|e| format!("cannot make a scratch dir: {e}"))
}

/// The merged entry's session map and trust records, from its marker; its spend ledger joins
/// this run's (`spend_ledger::absorb`), whatever becomes of the merge.
fn maps_of_entry(
    inputs: &CacheMergeInputs<'_>,
    marker: &Path,
    key: &str,
) -> Result<(Map, TrustMap), String> {
    match check_marker(marker) {
        MarkerCheck::Compatible(marker) => {
            let (data_dir, now_ms) = (&inputs.paths.data_dir, crate::runner::now_ms());
            for note in spend_ledger::absorb(data_dir, marker.spend.as_ref(), now_ms) {
                crate::runner::log::warning(&format!("`{}`: {note}", shown(key)));
            }
            Ok((
                marker.sessions.unwrap_or_default(),
                marker.trust.unwrap_or_default(),
            ))
        }
        MarkerCheck::VersionMismatch { found } => Err(format!("storage version {found}")),
        MarkerCheck::Missing | MarkerCheck::Unreadable { .. } => Ok((Map::new(), TrustMap::new())),
    }
}

/// Downloads `key` beside the live memory, checks it as restore does, and merges this run's
/// database into it; the result replaces this run's database. Also the entry's session map.
async fn merge_one(inputs: &CacheMergeInputs<'_>, key: &str) -> Result<Merged, String> {
    let scratch = scratch(inputs.paths)?;
    let request = cache::RestoreRequest {
        key,
        restore_keys: &[],
        paths: inputs.paths.restore_targets(),
        workspace: inputs.workspace,
        into: Some(scratch.path()),
    };
    match inputs.cache.restore_exact(&request).await {
        Ok(RestoreOutcome::Hit { .. }) => {}
        Ok(RestoreOutcome::Miss) => return Err("it is gone".into()),
        Ok(RestoreOutcome::Unrestorable { reason, .. }) => return Err(reason),
        Err(e) => return Err(e.to_string()),
    }
    let base = scratch.path().join(checkpoint::DB_FILE);
    let (sessions, records) = maps_of_entry(inputs, &scratch.path().join(MARKER_FILE), key)?;
    let out = scratch.path().join("merged.db");
    // Now, not when the save began: an entry saved since holds activity after that, which the
    // sanitizer would otherwise clamp (and so change) as if it came from the future.
    let now_ms = crate::opencode::system_now_ms();
    let ours = inputs.paths.db();
    let own = Own {
        messages: inputs.own_rows.messages(),
        // The entry's session of this run's thread, when another run started it too.
        same_thread: inputs.own_rows.thread().and_then(|(key, mine)| {
            let theirs = sessions.get(&key).filter(|theirs| **theirs != mine)?;
            Some((mine, theirs.clone()))
        }),
    };
    let versions = {
        let (base, out) = (base.clone(), out.clone());
        tokio::task::spawn_blocking(move || check_and_merge(&base, &ours, &out, now_ms, &own))
            .await
            .map_err(|e| format!("merge task failed: {e}"))??
    };
    replace(&out, &inputs.paths.db())?;
    // The result is this run's database now.
    inputs.own_rows.adopted(&versions.report);
    let Versions {
        report,
        theirs,
        mine,
        merged,
        gained,
    } = versions;
    let joined: BTreeMap<String, Option<SessionTrust>> = report
        .kept_both
        .iter()
        .flat_map(|k| &k.sessions)
        .map(|id| (id.clone(), records.get(id).cloned()))
        .collect();
    let from_them = merged
        .sessions
        .iter()
        .filter(|(id, v)| theirs.sessions.get(*id) == Some(v) && mine.sessions.get(*id) != Some(v))
        .map(|(id, _)| id.clone())
        .collect();
    Ok(Merged {
        folded: report.folded.clone(),
        report,
        sessions,
        // A record of theirs holds only for a session whose merged version is theirs.
        trust: session_map::trust_after_merge(&records, &theirs, &theirs, &merged),
        from_them,
        joined,
        new_to_us: gained,
    })
}

/// What only this run's database holds, for the merge.
struct Own {
    messages: BTreeSet<String>,
    same_thread: Option<(String, String)>,
}

/// The merge's report, the session versions of each side and of the result, and whether the
/// result holds anything this run's database lacked ([`gained`]).
struct Versions {
    report: MergeReport,
    theirs: Snapshot,
    mine: Snapshot,
    merged: Snapshot,
    gained: bool,
}

/// After this run's entry was saved: entries other runs committed during the save (not in the
/// listing taken before it) may lack this run's sessions, and the newest of them is what the next
/// run restores. They are merged in; whether any brought a message or a session this run's
/// database lacked (then the caller saves again, under a key of its own).
pub async fn merge_saved_meanwhile(
    inputs: &CacheMergeInputs<'_>,
    report: &mut CacheMergeReport,
    own_keys: &[String],
) -> bool {
    let Some(listed) = report.listed.clone() else {
        return false;
    };
    let version = cache::version(inputs.paths.cache_paths());
    let Listing::Keys { keys, .. } = inputs
        .catalog
        .list(inputs.restore_keys, &version, &[])
        .await
    else {
        return false;
    };
    let fresh: Vec<String> = keys
        .iter()
        .filter(|k| !listed.contains(k) && !own_keys.contains(k))
        .take(MAX_ENTRIES)
        .cloned()
        .collect();
    let contributed = merge_each(inputs, fresh, report).await;
    report.listed = Some(keys);
    contributed
}

/// The entry is untrusted like any restored one: readable, sanitized, then merged.
///
/// An entry saved meanwhile need not descend from what this run restored (it may come from a run
/// that restored older memory, or from the store's lineage), so a session it lacks was not
/// deleted by it: the merge is against an empty snapshot — every session on either side is kept,
/// and where both hold one, the later activity wins.
fn check_and_merge(
    base: &Path,
    ours: &Path,
    out: &Path,
    now_ms: i64,
    own: &Own,
) -> Result<Versions, String> {
    if !base.is_file() {
        return Err("it holds no session database".into());
    }
    if let ProbeOutcome::Failed { message, .. } = checkpoint::probe(base) {
        return Err(format!("unreadable: {message}"));
    }
    match sanitize::sanitize(base, now_ms) {
        SanitizeOutcome::Clean { .. } => {}
        SanitizeOutcome::Corrupt { message } | SanitizeOutcome::Failed { message } => {
            return Err(message)
        }
    }
    let theirs = Snapshot::capture(base).map_err(|e| e.to_string())?;
    let mine = Snapshot::capture(ours).map_err(|e| e.to_string())?;
    let options = merge::MergeOptions {
        own_messages: Some(&own.messages),
        same_thread: own
            .same_thread
            .as_ref()
            .map(|(mine, theirs)| (mine.as_str(), theirs.as_str())),
        ..Default::default()
    };
    let report = merge::merge_with(base, ours, &Snapshot::empty(), out, options)
        .map_err(|e| e.to_string())?;
    let merged = Snapshot::capture(out).map_err(|e| e.to_string())?;
    let gained = gained(ours, out, &mine, &merged, &report)?;
    Ok(Versions {
        report,
        theirs,
        mine,
        merged,
        gained,
    })
}

/// Whether the merged result `out` holds something this run's database `ours` lacked: a message,
/// or a session other than the one its thread session was folded into. The same exchanges under
/// another session of the thread are nothing new: saving again for them would only change which
/// of the thread's sessions the entry names, and two runs that each folded into the other's would
/// go on swapping.
fn gained(
    ours: &Path,
    out: &Path,
    mine: &Snapshot,
    merged: &Snapshot,
    report: &MergeReport,
) -> Result<bool, String> {
    let into: BTreeSet<&String> = report.folded.iter().map(|(_, into)| into).collect();
    let new_session = merged
        .sessions
        .keys()
        .any(|id| !mine.sessions.contains_key(id) && !into.contains(id));
    if new_session {
        return Ok(true);
    }
    merge::messages_added(Some(ours), out)
        .map(|added| !added.is_empty())
        .map_err(|e| e.to_string())
}

fn replace(merged: &Path, db: &Path) -> Result<(), String> {
    checkpoint::remove_stale_sidecars(db)
        .and_then(|()| std::fs::rename(merged, db))
        .map_err(|e| format!("cannot put the merged database in place: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(author: &str, association: &str) -> SessionTrust {
        SessionTrust::new(author, association, false, false)
    }

    #[test]
    fn a_joined_session_keeps_the_lower_record_and_none_when_either_has_none() {
        let report = CacheMergeReport {
            joined: BTreeMap::from([
                ("ses_both".to_string(), Some(record("eve", "NONE"))),
                ("ses_unrecorded".to_string(), None),
            ]),
            ..Default::default()
        };
        let mut trust = TrustMap::from([
            ("ses_both".to_string(), record("mona", "OWNER")),
            ("ses_unrecorded".to_string(), record("mona", "OWNER")),
            ("ses_mine".to_string(), record("mona", "OWNER")),
        ]);
        report.join_trust_into(&mut trust);
        assert_eq!(
            trust["ses_both"].author, "eve",
            "the lower of both: {trust:?}"
        );
        assert!(!trust.contains_key("ses_unrecorded"), "{trust:?}");
        assert_eq!(trust["ses_mine"].author, "mona");
    }

    #[test]
    fn a_folded_thread_session_continues_as_the_one_it_joined() {
        let report = CacheMergeReport {
            sessions: Map::from([("issue-12".to_string(), "ses_theirs".to_string())]),
            joined: BTreeMap::from([(
                "ses_theirs".to_string(),
                Some(record("bob", "CONTRIBUTOR")),
            )]),
            folded: vec![("ses_mine".to_string(), "ses_theirs".to_string())],
            ..Default::default()
        };
        let mut map = Map::from([("issue-12".to_string(), "ses_mine".to_string())]);
        report.join_sessions_into(&mut map);
        assert_eq!(map["issue-12"], "ses_theirs");
        let mut trust = TrustMap::from([("ses_mine".to_string(), record("mona", "OWNER"))]);
        report.join_trust_into(&mut trust);
        assert!(!trust.contains_key("ses_mine"));
        assert_eq!(trust["ses_theirs"].association, "CONTRIBUTOR", "{trust:?}");
        // Another run's merges of the same session keep the lowest record seen.
        let later = CacheMergeReport {
            joined: BTreeMap::from([("ses_theirs".to_string(), Some(record("eve", "NONE")))]),
            ..Default::default()
        };
        let both = report.then(later);
        assert_eq!(both.joined["ses_theirs"].as_ref().unwrap().author, "eve");
    }
}
