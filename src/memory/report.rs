//! What the persistence phases found and did, for the step summary, outputs and logs.

use std::time::Duration;

use crate::memory::checkpoint::CheckpointOutcome;
use crate::memory::save_result::{CacheSaveResult, StorePublish};
use crate::memory::session_map::SessionMap;
use crate::runner::summary::table;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Miss,
    Corrupted,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Corrupted => "corrupted",
        }
    }
}

/// Where restored memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreSource {
    /// The S3-compatible object store.
    Storage,
    /// The GitHub Actions cache (or the local filesystem cache).
    Cache,
    None,
}

impl RestoreSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreSource::Storage => "storage",
            RestoreSource::Cache => "cache",
            RestoreSource::None => "none",
        }
    }
}

/// The lease as the summary reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReport {
    Disabled,
    Acquired { generation: u64 },
    HeldByOther { holder: String },
    Error { message: String },
}

impl LeaseReport {
    pub fn describe(&self) -> String {
        match self {
            LeaseReport::Disabled => "disabled".into(),
            LeaseReport::Acquired { generation } => format!("acquired (generation {generation})"),
            LeaseReport::HeldByOther { holder } => format!("held by {holder}"),
            LeaseReport::Error { message } => format!("error: {message}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RestoreReport {
    pub status: CacheStatus,
    pub source: RestoreSource,
    pub matched_key: Option<String>,
    /// The object-store ETag of the restored database: publication is conditional on it.
    pub store_etag: Option<String>,
    /// Warnings and notable facts, in order (already free of secrets).
    pub notes: Vec<String>,
    /// Which sessions this memory lets fro-bot resume (`memory::session_map`).
    pub sessions: SessionMap,
    /// Who wrote each restored session (docs/security.md#trust-follows-memory); empty for
    /// fresh memory, memory from the object store (no marker) and markers from before trust.
    pub trust: crate::trust::TrustMap,
    /// Set when an entry existed but none could be restored and older memory may remain: the
    /// save is declined with this reason, so it cannot hide that memory.
    pub shadow_guard: Option<String>,
    /// SHA-256 of the database as it came out of the entry, taken beside the restore's checks
    /// (`memory::ledger::RestoredCopy`).
    pub restored_sha256: Option<[u8; 32]>,
}

impl RestoreReport {
    pub fn miss() -> Self {
        Self {
            status: CacheStatus::Miss,
            source: RestoreSource::None,
            matched_key: None,
            store_etag: None,
            notes: Vec::new(),
            sessions: SessionMap::default(),
            trust: crate::trust::TrustMap::new(),
            shadow_guard: None,
            restored_sha256: None,
        }
    }

    /// The trust records to save after a run that wrote `sessions` as `written`: the restored
    /// ones, with those sessions' lowered by what this run read (never raised).
    pub fn trust_after_run(
        &self,
        sessions: &[&str],
        written: Option<&crate::trust::SessionTrust>,
    ) -> crate::trust::TrustMap {
        let mut map = self.trust.clone();
        let Some(written) = written else {
            return map;
        };
        for id in sessions {
            let record = match map.get(*id) {
                Some(old) => written.clone().lowered_by(old),
                None => written.clone(),
            };
            map.insert(id.to_string(), record);
        }
        map
    }
}

/// Everything the "Session Persistence" summary section shows.
#[derive(Debug, Clone)]
pub struct PersistenceReport {
    pub restore: Option<RestoreReport>,
    pub save: Option<CacheSaveResult>,
    pub checkpoint: Option<CheckpointOutcome>,
    pub scrub: Option<crate::memory::scrub::ScrubOutcome>,
    pub store_publish: StorePublish,
    pub lease: LeaseReport,
    /// What concurrent runs meant for this save: merges, conflicts, publish retries and waits
    /// (`memory::cache_merge`, `memory::publish`).
    pub concurrency_notes: Vec<String>,
    pub phases: Vec<(&'static str, Duration)>,
    /// How the agent was confined, and what it could still reach (`crate::confine`).
    pub confinement: Vec<String>,
    /// What fro-bot did with the agent's proposals (`phases::delivery::change`): the run table's rows and
    /// the paragraph the answer ends with.
    pub delivery_rows: Vec<(String, String)>,
    pub delivery_answer: Option<String>,
    /// The "Network" row: what the agent could reach and what it tried (`phases::turn::agent_network`).
    pub network: Option<String>,
    /// What became of the links in the agent's posted text (`outbound::summary_row`).
    pub links: Option<String>,
    /// Turns cut short, repaired after the restore and after this run's turn (`memory::repair`).
    pub cut_turns: Vec<crate::memory::repair::RepairOutcome>,
    /// The "Budget" row: the budget across runs as this run found it (`phases::budget`).
    pub budget: Option<String>,
}

impl Default for PersistenceReport {
    fn default() -> Self {
        Self {
            restore: None,
            save: None,
            checkpoint: None,
            scrub: None,
            store_publish: StorePublish::Disabled,
            lease: LeaseReport::Disabled,
            concurrency_notes: Vec::new(),
            phases: Vec::new(),
            confinement: Vec::new(),
            delivery_rows: Vec::new(),
            delivery_answer: None,
            network: None,
            links: None,
            cut_turns: Vec::new(),
            budget: None,
        }
    }
}

impl PersistenceReport {
    pub fn record_phase(&mut self, name: &'static str, took: Duration) {
        self.phases.push((name, took));
    }

    /// The markdown section for the step summary.
    pub fn to_markdown(&self, heading: &str) -> String {
        let mut rows: Vec<Vec<String>> = Vec::new();
        if let Some(r) = &self.restore {
            rows.push(vec![
                "Cache restore".into(),
                format!(
                    "{} (source: {}{})",
                    r.status.as_str(),
                    r.source.as_str(),
                    r.matched_key
                        .as_deref()
                        .map(|k| format!(", key `{k}`"))
                        .unwrap_or_default()
                ),
            ]);
        }
        if let Some(s) = &self.save {
            rows.push(vec![
                "Save result".into(),
                format!("{} ({}): {}", s.state_value(), s.outcome, s.detail),
            ]);
        }
        rows.push(vec![
            "Object-store publish".into(),
            self.store_publish.describe(),
        ]);
        rows.push(vec!["Lease".into(), self.lease.describe()]);
        if let Some(c) = &self.checkpoint {
            rows.push(vec!["Checkpoint".into(), c.describe()]);
        }
        if let Some(s) = &self.scrub {
            rows.push(vec!["Secrets scrubbed".into(), s.describe()]);
        }
        if let Some(line) = crate::memory::repair::summary_line(&self.cut_turns) {
            rows.push(vec!["Turn cut short".into(), line]);
        }
        if let Some(n) = &self.network {
            rows.push(vec!["Network".into(), n.clone()]);
        }
        if let Some(l) = &self.links {
            rows.push(vec!["Links".into(), l.clone()]);
        }
        if !self.phases.is_empty() {
            let phases = self
                .phases
                .iter()
                .map(|(name, d)| format!("{name} {:.2}s", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ");
            rows.push(vec!["Phase durations".into(), phases]);
        }
        let mut out = format!("### {heading}\n\n");
        out.push_str(&table(&["", ""], &rows));
        if let Some(r) = &self.restore {
            for note in &r.notes {
                out.push_str(&format!("\n- {}", note.replace('\n', " ")));
            }
            if !r.notes.is_empty() {
                out.push('\n');
            }
        }
        for note in &self.concurrency_notes {
            out.push_str(&format!("\n- Concurrent runs: {}", note.replace('\n', " ")));
        }
        for note in &self.confinement {
            out.push_str(&format!("\n- Agent: {}", note.replace('\n', " ")));
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::save_result::SaveOutcome;

    #[test]
    fn a_written_sessions_record_only_goes_down() {
        use crate::trust::{SessionTrust, TrustLevel};
        let mut restored = RestoreReport::miss();
        let eve = SessionTrust::new("eve", "NONE", false, false);
        restored.trust.insert("ses_old".into(), eve.clone());
        let mona = SessionTrust::new("mona", "OWNER", false, false);
        let map = restored.trust_after_run(&["ses_old", "ses_new"], Some(&mona));
        assert_eq!(
            map["ses_old"], eve,
            "an outsider's session stays the outsider's"
        );
        assert_eq!(map["ses_new"].level, TrustLevel::Maintainer);
        assert_eq!(restored.trust_after_run(&["ses_x"], None), restored.trust);
    }

    #[test]
    fn summary_names_every_part() {
        let mut report = PersistenceReport {
            restore: Some(RestoreReport {
                status: CacheStatus::Hit,
                source: RestoreSource::Storage,
                matched_key: None,
                store_etag: Some("\"e\"".into()),
                notes: vec!["removed a stale WAL".into()],
                sessions: SessionMap::Legacy,
                trust: crate::trust::TrustMap::new(),
                shadow_guard: None,
                restored_sha256: None,
            }),
            save: Some(CacheSaveResult::new(
                SaveOutcome::CacheRejected,
                true,
                "write denied",
            )),
            checkpoint: Some(CheckpointOutcome::Checkpointed),
            scrub: Some(crate::memory::scrub::ScrubOutcome::Scrubbed(
                crate::memory::scrub::ScrubReport {
                    replacements: 3,
                    values: 2,
                    credential_rows: 1,
                    vacuumed: false,
                    trees_of: None,
                },
            )),
            store_publish: StorePublish::Published,
            lease: LeaseReport::Acquired { generation: 7 },
            concurrency_notes: vec![
                "2 puts: newer memory was published during this run and merged".into(),
            ],
            phases: vec![],
            confinement: vec!["the agent runs as uid 1001".into()],
            delivery_rows: Vec::new(),
            delivery_answer: None,
            network: Some("allowlist (`node`): allowed no request; refused none".into()),
            links: Some("1 made inert".into()),
            cut_turns: Vec::new(),
            budget: None,
        };
        report.record_phase("restore", Duration::from_millis(1500));
        let md = report.to_markdown("Session Persistence");
        for needle in [
            "### Session Persistence",
            "hit (source: storage)",
            "store-only (cache-rejected): write denied",
            "| Object-store publish | published |",
            "| Network | allowlist (`node`): allowed no request; refused none |",
            "| Links | 1 made inert |",
            "acquired (generation 7)",
            "checkpointed",
            "| Secrets scrubbed | 3 secret(s) replaced in 2 value(s), 1 credential row(s) removed |",
            "restore 1.50s",
            "- removed a stale WAL",
            "- Concurrent runs: 2 puts",
            "- Agent: the agent runs as uid 1001",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in\n{md}");
        }
    }
}
