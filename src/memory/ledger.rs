//! Memory's ledger: what the restore, the turn's guard and the save record as the run goes
//! (`Ledger`), and the types they record it in — the restored database's digest (`RestoredCopy`)
//! and where memory on disk comes from (`Provenance`), the rows only this run's database holds
//! (`OwnRows`), the summary's report, and main's `cacheSaved` state kept in step with its output
//! (`CacheSaved`); beside them the leases post releases when main was killed holding them
//! (`PostLease`) and the store side of a run (`StoreContext`).

use std::path::Path;

use crate::memory::merge::Snapshot;
use crate::memory::report::{PersistenceReport, RestoreReport, RestoreSource};
use crate::memory::save_result::StateValue;
use crate::memory::state_paths::{check_marker, MarkerCheck, StatePaths};
use crate::object_store::{ObjectStore, StoreKeys};
use crate::runner::env::{output, state};
use crate::runner::{Env, FileCommands};

/// What memory's phases append to as the run goes, from admission to the summary; one owner, the
/// main step (`phases::run`), lends it to the phase that records.
pub(crate) struct Ledger {
    /// The database as restored (its digest), so an unchanged one is not uploaded again.
    pub(crate) restored_copy: Option<RestoredCopy>,
    /// The sessions as restored, so a newer shared copy can be merged with this run's
    /// (`None`: they could not be read, and a newer copy is then not overwritten).
    pub(crate) restored_sessions: Option<Snapshot>,
    /// The messages and thread session only this run's database holds (`OwnRows`).
    pub(crate) own_rows: OwnRows,
    /// Whether restored memory was scrubbed when saved, so the save scrubs only this run's rows.
    pub(crate) provenance: Provenance,
    /// The step summary's sections, filled as the phases go.
    pub(crate) report: PersistenceReport,
    /// State `cacheSaved` and output `cache-save-result`.
    pub(crate) cache_saved: CacheSaved,
}

impl Ledger {
    /// Nothing restored or recorded yet.
    pub(crate) fn new(cache_saved: CacheSaved) -> Self {
        Ledger {
            restored_copy: None,
            restored_sessions: None,
            own_rows: OwnRows::default(),
            provenance: Provenance::Unknown,
            report: PersistenceReport::default(),
            cache_saved,
        }
    }
}

/// The store side of a run: client and key layout.
pub struct StoreContext {
    pub store: ObjectStore,
    pub keys: StoreKeys,
}

/// What only this run's database holds (docs/persistence.md#session-level-merge): the messages
/// its own turn wrote, which a merge may give new ids to keep an exchange together, and its
/// thread's session (logical key, id), which a merge may fold into another run's session of the
/// same thread. Both follow every merged result this run adopts (`adopted`).
#[derive(Debug, Default)]
pub struct OwnRows(std::sync::Mutex<Rows>);

#[derive(Debug, Default, Clone)]
struct Rows {
    messages: std::collections::BTreeSet<String>,
    thread: Option<(String, String)>,
}

impl OwnRows {
    pub fn new(
        messages: std::collections::BTreeSet<String>,
        thread: Option<(String, String)>,
    ) -> Self {
        OwnRows(std::sync::Mutex::new(Rows { messages, thread }))
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, Rows> {
        // Every update below leaves whole values: a panic elsewhere cannot leave them half set.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn messages(&self) -> std::collections::BTreeSet<String> {
        self.rows().messages.clone()
    }

    /// This run's thread and its session now.
    pub fn thread(&self) -> Option<(String, String)> {
        self.rows().thread.clone()
    }

    /// A merged result is this run's database now: its moved messages go by their new ids, and a
    /// folded thread session by the session it joined.
    pub fn adopted(&self, report: &crate::memory::merge::MergeReport) {
        let mut rows = self.rows();
        for (old, new) in &report.reissued {
            if rows.messages.remove(old) {
                rows.messages.insert(new.clone());
            }
        }
        if let Some((_, session)) = rows.thread.as_mut() {
            if let Some((_, into)) = report.folded.iter().find(|(from, _)| from == session) {
                *session = into.clone();
            }
        }
    }
}

/// Main's state `cacheSaved` (what post does if main ends now) and output `cache-save-result` (what
/// became of memory, for later steps), kept in step: the state is written at every change, the
/// output once. However the step ends — a skip, a configuration error, a save cut off by the
/// cancel deadline, a panic — the output is set: when the last handle is dropped without a
/// [`CacheSaved::report`], it takes the state's last value.
#[derive(Clone)]
pub(crate) struct CacheSaved(std::sync::Arc<std::sync::Mutex<CacheSavedInner>>);

struct CacheSavedInner {
    files: FileCommands,
    last: StateValue,
    reported: bool,
}

impl CacheSaved {
    /// `skipped`, first thing: a run that is not admitted makes post idle.
    pub(crate) fn start(files: &FileCommands) -> Self {
        files.save_state_or_warn(state::CACHE_SAVED, StateValue::Skipped.as_str());
        Self(std::sync::Arc::new(std::sync::Mutex::new(
            CacheSavedInner {
                files: files.clone(),
                last: StateValue::Skipped,
                reported: false,
            },
        )))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, CacheSavedInner> {
        // A poisoned lock only means a panic elsewhere; the values are still the last written.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state only: what post does if the step ends before the next change.
    pub(crate) fn set(&self, value: StateValue) {
        let mut inner = self.inner();
        inner
            .files
            .save_state_or_warn(state::CACHE_SAVED, value.as_str());
        inner.last = value;
    }

    /// The step's result: state and output.
    pub(crate) fn report(&self, value: StateValue) {
        self.set(value);
        let mut inner = self.inner();
        inner
            .files
            .set_output_or_warn(output::CACHE_SAVE_RESULT, value.as_str());
        inner.reported = true;
    }
}

impl Drop for CacheSavedInner {
    fn drop(&mut self) {
        if !self.reported {
            self.files
                .set_output_or_warn(output::CACHE_SAVE_RESULT, self.last.as_str());
        }
    }
}

/// Where main leaves a held lease's key and current ETag, so post can release it when main was
/// killed holding it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PostLease {
    key: &'static str,
    etag: &'static str,
}

impl PostLease {
    /// The repository lease of the store publish (`memory::publish`).
    pub(crate) const REPO: PostLease = PostLease {
        key: state::LEASE_KEY,
        etag: state::LEASE_ETAG,
    };
    /// The thread's turn (`phases::thread_turn`).
    pub(crate) const THREAD: PostLease = PostLease {
        key: state::THREAD_LEASE_KEY,
        etag: state::THREAD_LEASE_ETAG,
    };
    pub(crate) const ALL: [PostLease; 2] = [PostLease::REPO, PostLease::THREAD];

    /// Saves the key and ETag, and keeps the ETag current while the lease is held (renewals
    /// change it) until the returned task is aborted.
    pub(crate) fn keep_for_post(
        self,
        files: &FileCommands,
        handle: &crate::lease::LeaseHandle,
    ) -> tokio::task::JoinHandle<()> {
        let (key, etag) = handle.state_for_post();
        files.save_state_or_warn(self.key, &key);
        files.save_state_or_warn(self.etag, &etag);
        let (files, source) = (files.clone(), handle.etag_source());
        tokio::spawn(async move {
            let mut seen = source.current();
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let now = source.current();
                if now != seen {
                    files.save_state_or_warn(self.etag, &now);
                    seen = now;
                }
            }
        })
    }

    /// Released: nothing for post to do.
    pub(crate) fn clear(self, files: &FileCommands) {
        files.save_state_or_warn(self.key, "");
        files.save_state_or_warn(self.etag, "");
    }

    /// Post's view: the key and ETag main left, if it left a lease.
    pub(crate) fn left_behind(self, env: &Env) -> Option<(&str, &str)> {
        Some((env.state(self.key)?, env.state(self.etag)?))
            .filter(|(k, e)| !k.is_empty() && !e.is_empty())
    }
}

/// What the run restored, to tell an unchanged database from one worth uploading again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredCopy {
    pub sha256: [u8; 32],
    /// The Actions cache entry it came from; `None` for the object store's copy.
    pub cache_key: Option<String>,
}

impl RestoredCopy {
    /// The restored database's digest, when a restore hit left one.
    pub fn of(paths: &StatePaths, report: &RestoreReport) -> Option<Self> {
        let cache_key = match report.source {
            RestoreSource::Cache => Some(report.matched_key.clone()?),
            RestoreSource::Storage => None,
            RestoreSource::None => return None,
        };
        if let Some(sha256) = report.restored_sha256 {
            return Some(Self { sha256, cache_key });
        }
        match sha256_file(&paths.db()) {
            Ok(sha256) => Some(Self { sha256, cache_key }),
            Err(e) => {
                tracing::debug!("cannot hash the restored database: {e}");
                None
            }
        }
    }

    pub(crate) fn holder(&self) -> String {
        match &self.cache_key {
            Some(key) => format!("the Actions cache entry `{key}`"),
            None => "the object store's copy".to_string(),
        }
    }
}

/// Where the memory on disk comes from, as far as the save's scrub cares
/// (docs/security.md#scrubbed-memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Nothing restored, or memory no marker vouches for: the save scrubs the whole database.
    Unknown,
    /// Restored memory whose marker names it and records that fro-bot scrubbed it whole
    /// (`scrub::SCRUB_VERSION`), unchanged since by anything but the restore's checks.
    Scrubbed,
    /// That memory after the turn, rebuilt with only this run's trees, scrubbed before they were
    /// written into it (`memory::guard::put_back`): the save scrubs only those trees.
    RebuiltFromScrubbed,
}

impl Provenance {
    /// The restored database's provenance: `Scrubbed` only when the marker beside it names this
    /// very database (its SHA-256 as it came out of the entry, `RestoreReport::restored_sha256`;
    /// the sanitizer only ever removes) and says it was scrubbed whole.
    pub fn of_restored(paths: &StatePaths, copy: Option<&RestoredCopy>) -> Self {
        let Some(copy) = copy else {
            return Provenance::Unknown;
        };
        match check_marker(&paths.marker()) {
            MarkerCheck::Compatible(m)
                if m.scrubbed == Some(crate::memory::scrub::SCRUB_VERSION)
                    && m.db_sha256.eq_ignore_ascii_case(&hex::encode(copy.sha256)) =>
            {
                Provenance::Scrubbed
            }
            MarkerCheck::Compatible(_)
            | MarkerCheck::Missing
            | MarkerCheck::VersionMismatch { .. }
            | MarkerCheck::Unreadable { .. } => Provenance::Unknown,
        }
    }

    /// What the save's scrub reads: only the trees this run wrote when memory was rebuilt from
    /// scrubbed memory with just those (docs/security.md#scrubbed-memory), else everything. Main's
    /// save and post's finish of a killed main both ask this.
    pub fn scrub_scope(self, written: &[String]) -> crate::memory::scrub::Scope {
        match self {
            Provenance::RebuiltFromScrubbed => crate::memory::scrub::Scope::Changed {
                sessions: written.iter().cloned().collect(),
            },
            Provenance::Scrubbed | Provenance::Unknown => crate::memory::scrub::Scope::Whole,
        }
    }
}

pub(crate) fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    crate::memory::state_paths::FileDigest::of(path).map(|d| d.sha256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::file_command;

    fn read(path: &Path) -> Vec<(String, String)> {
        file_command::parse(&std::fs::read_to_string(path).unwrap_or_default()).unwrap()
    }

    #[test]
    fn only_memory_rebuilt_from_scrubbed_memory_is_scrubbed_by_its_changed_trees() {
        use crate::memory::scrub::Scope;
        let written = ["ses_1".to_string(), "ses_2".to_string()];
        assert_eq!(
            Provenance::RebuiltFromScrubbed.scrub_scope(&written),
            Scope::Changed {
                sessions: written.iter().cloned().collect()
            }
        );
        // Scrubbed memory the turn was not limited to its own trees in: anything may hold one.
        assert_eq!(Provenance::Scrubbed.scrub_scope(&written), Scope::Whole);
        assert_eq!(Provenance::Unknown.scrub_scope(&written), Scope::Whole);
    }

    #[test]
    fn only_a_marker_naming_the_restored_database_and_its_scrub_vouches_for_it() {
        use crate::memory::state_paths::{write_marker, Scrubbed};
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().to_path_buf());
        std::fs::write(paths.db(), b"restored database").unwrap();
        let copy = |paths: &StatePaths| RestoredCopy {
            sha256: sha256_file(&paths.db()).unwrap(),
            cache_key: Some("k".into()),
        };
        assert_eq!(Provenance::of_restored(&paths, None), Provenance::Unknown);
        assert_eq!(
            Provenance::of_restored(&paths, Some(&copy(&paths))),
            Provenance::Unknown,
            "no marker"
        );
        write_marker(&paths, "1", 1, None, None, Scrubbed::NotVouched, None).unwrap();
        assert_eq!(
            Provenance::of_restored(&paths, Some(&copy(&paths))),
            Provenance::Unknown,
            "a marker that does not record a scrub (an older one)"
        );
        write_marker(&paths, "1", 1, None, None, Scrubbed::Whole, None).unwrap();
        assert_eq!(
            Provenance::of_restored(&paths, Some(&copy(&paths))),
            Provenance::Scrubbed
        );
        // The database changed after the marker was written (another one beside it, or the
        // sanitizer had to change it): the marker does not name it.
        std::fs::write(paths.db(), b"another database").unwrap();
        assert_eq!(
            Provenance::of_restored(&paths, Some(&copy(&paths))),
            Provenance::Unknown
        );
        // A marker of another scrub version.
        let text = std::fs::read_to_string(paths.marker()).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["db_sha256"] = hex::encode(copy(&paths).sha256).into();
        json["scrubbed"] = (crate::memory::scrub::SCRUB_VERSION + 1).into();
        std::fs::write(paths.marker(), json.to_string()).unwrap();
        assert_eq!(
            Provenance::of_restored(&paths, Some(&copy(&paths))),
            Provenance::Unknown
        );
    }

    #[test]
    fn however_main_ends_the_output_says_what_the_state_says() {
        let dir = tempfile::tempdir().unwrap();
        let files = FileCommands {
            output: Some(dir.path().join("output")),
            state: Some(dir.path().join("state")),
            env: None,
            summary: None,
        };
        // A step that ends without a report (a panic, a path that forgot): the last state.
        let record = CacheSaved::start(&files);
        let handle = record.clone();
        record.set(StateValue::NotPersisted);
        drop(record);
        assert!(read(&dir.path().join("output")).is_empty(), "still held");
        drop(handle);
        let output = vec![(
            output::CACHE_SAVE_RESULT.to_string(),
            "not-persisted".to_string(),
        )];
        assert_eq!(read(&dir.path().join("output")), output);
        // A report is the output, once.
        let record = CacheSaved::start(&files);
        record.report(StateValue::Durable);
        drop(record);
        let outputs = read(&dir.path().join("output"));
        assert_eq!(outputs.len(), 2, "{outputs:?}");
        assert_eq!(outputs[1].1, "durable");
        let states = read(&dir.path().join("state"));
        assert_eq!(states.last().unwrap().1, "durable");
    }
}
