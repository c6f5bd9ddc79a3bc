//! The lease record stored at `.../locks/repo.json` (docs/design.md#the-coordination-lease). Times
//! are epoch ms.

use serde::{Deserialize, Serialize};

pub const RECORD_VERSION: u32 = 1;

/// Who is asking for the lease: one run attempt of one job invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `owner/repo`.
    pub repo: String,
    pub run_id: u64,
    pub run_attempt: u32,
    /// The invocation identity (docs/design.md#keys-and-identities), if any.
    pub identity: Option<String>,
}

impl Holder {
    /// `action:{runId}:{runAttempt}[:{identity}]`.
    pub fn holder_id(&self) -> String {
        match &self.identity {
            Some(id) => format!("action:{}:{}:{id}", self.run_id, self.run_attempt),
            None => format!("action:{}:{}", self.run_id, self.run_attempt),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub version: u32,
    pub repo: String,
    pub holder_id: String,
    pub surface: String,
    pub run_id: u64,
    pub generation: u64,
    /// Fresh random hex on every write: S3 ETags are the body's MD5, so two identical bodies
    /// would share an ETag and a compare-and-swap could succeed twice (ABA).
    pub nonce: String,
    pub acquired_at: u64,
    pub renewed_at: u64,
    pub expires_at: u64,
    pub ttl_seconds: u64,
}

pub fn fresh_nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

impl LeaseRecord {
    pub fn new(holder: &Holder, generation: u64, now_ms: u64, ttl_ms: u64) -> Self {
        LeaseRecord {
            version: RECORD_VERSION,
            repo: holder.repo.clone(),
            holder_id: holder.holder_id(),
            surface: "github".into(),
            run_id: holder.run_id,
            generation,
            nonce: fresh_nonce(),
            acquired_at: now_ms,
            renewed_at: now_ms,
            expires_at: now_ms.saturating_add(ttl_ms),
            ttl_seconds: ttl_ms / 1000,
        }
    }

    /// The same holding, renewed at `now_ms`, with a fresh nonce.
    pub fn renewed(&self, now_ms: u64, ttl_ms: u64) -> Self {
        LeaseRecord {
            nonce: fresh_nonce(),
            renewed_at: now_ms,
            expires_at: now_ms.saturating_add(ttl_ms),
            ttl_seconds: ttl_ms / 1000,
            ..self.clone()
        }
    }

    /// The same record, released at `now_ms`: expired at once, generation kept, so the next
    /// holder's generation is higher (the generation is a fencing token that never restarts).
    pub fn released(&self, now_ms: u64) -> Self {
        LeaseRecord {
            nonce: fresh_nonce(),
            renewed_at: now_ms,
            expires_at: now_ms,
            ..self.clone()
        }
    }

    /// When the record really stops a takeover: its `expires_at`, but never later than the store's
    /// `LastModified` plus `max_ttl_ms` (a holder renews well within its TTL, so a live record is
    /// always younger). A far-future `expires_at` — a skewed clock or a planted record — cannot
    /// lock the repository.
    pub fn effective_expiry(&self, last_modified_ms: Option<u64>, max_ttl_ms: u64) -> u64 {
        match last_modified_ms {
            Some(lm) => self.expires_at.min(lm.saturating_add(max_ttl_ms)),
            None => self.expires_at,
        }
    }

    /// Written by an earlier attempt of `holder`'s run and job. GitHub re-runs only a run that
    /// has ended, so that attempt is gone: its record holds nothing, even when its post step never
    /// ran to release it (a lost runner).
    pub fn is_earlier_attempt_of(&self, holder: &Holder) -> bool {
        let Some(rest) = self.holder_id.strip_prefix("action:") else {
            return false;
        };
        let mut parts = rest.splitn(3, ':');
        let (Some(run), Some(attempt)) = (parts.next(), parts.next()) else {
            return false;
        };
        run.parse::<u64>().ok() == Some(holder.run_id)
            && attempt.parse::<u32>().is_ok_and(|a| a < holder.run_attempt)
            && parts.next() == holder.identity.as_deref()
    }

    pub fn to_bytes(&self) -> bytes::Bytes {
        // A struct of strings and integers always serializes.
        bytes::Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// `None` for anything that is not a well-formed record of a version we understand.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<LeaseRecord>(body)
            .ok()
            .filter(|r| r.version == RECORD_VERSION && !r.holder_id.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_id_format() {
        let mut h = Holder {
            repo: "o/r".into(),
            run_id: 42,
            run_attempt: 2,
            identity: None,
        };
        assert_eq!(h.holder_id(), "action:42:2");
        h.identity = Some("build-m0a1b2c3d".into());
        assert_eq!(h.holder_id(), "action:42:2:build-m0a1b2c3d");
    }

    #[test]
    fn only_an_earlier_attempt_of_the_same_run_and_job_is_recognised() {
        let holder = |run_id, run_attempt, identity: Option<&str>| Holder {
            repo: "o/r".into(),
            run_id,
            run_attempt,
            identity: identity.map(str::to_string),
        };
        let me = holder(42, 3, Some("build"));
        let record = |h: &Holder| LeaseRecord::new(h, 1, 0, 1000);
        assert!(record(&holder(42, 2, Some("build"))).is_earlier_attempt_of(&me));
        assert!(record(&holder(42, 1, Some("build"))).is_earlier_attempt_of(&me));
        // Not: this attempt, a later one, another job of the run, another run.
        assert!(!record(&me).is_earlier_attempt_of(&me));
        assert!(!record(&holder(42, 4, Some("build"))).is_earlier_attempt_of(&me));
        assert!(!record(&holder(42, 2, Some("test"))).is_earlier_attempt_of(&me));
        assert!(!record(&holder(42, 2, None)).is_earlier_attempt_of(&me));
        assert!(!record(&holder(41, 2, Some("build"))).is_earlier_attempt_of(&me));
        assert!(record(&holder(7, 1, None)).is_earlier_attempt_of(&holder(7, 2, None)));
        let mut odd = record(&holder(42, 2, Some("build")));
        odd.holder_id = "local:42:2:build".into();
        assert!(!odd.is_earlier_attempt_of(&me));
    }

    #[test]
    fn record_round_trip_and_fresh_nonce() {
        let h = Holder {
            repo: "o/r".into(),
            run_id: 7,
            run_attempt: 1,
            identity: None,
        };
        let r = LeaseRecord::new(&h, 3, 1_000, 300_000);
        assert_eq!(r.expires_at, 301_000);
        assert_eq!(r.ttl_seconds, 300);
        let json: serde_json::Value = serde_json::from_slice(&r.to_bytes()).unwrap();
        for field in [
            "version",
            "repo",
            "holder_id",
            "surface",
            "run_id",
            "generation",
            "nonce",
            "acquired_at",
            "renewed_at",
            "expires_at",
            "ttl_seconds",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
        assert_eq!(LeaseRecord::parse(&r.to_bytes()), Some(r.clone()));
        // Same time, same holder: the bodies still differ (ABA guard).
        let again = r.renewed(1_000, 300_000);
        assert_ne!(again.nonce, r.nonce);
        assert_ne!(again.to_bytes(), r.to_bytes());
        assert_eq!(again.generation, 3);
        let released = again.released(2_000);
        assert_eq!((released.generation, released.expires_at), (3, 2_000));
        assert_ne!(released.nonce, again.nonce);
        assert!(LeaseRecord::parse(b"{}").is_none());
        assert!(LeaseRecord::parse(b"garbage").is_none());
    }

    #[test]
    fn a_far_future_expiry_is_bounded_by_last_modified() {
        let h = Holder {
            repo: "o/r".into(),
            run_id: 7,
            run_attempt: 1,
            identity: None,
        };
        let planted = LeaseRecord {
            expires_at: u64::MAX,
            ..LeaseRecord::new(&h, 1, 1_000, 300_000)
        };
        assert_eq!(planted.effective_expiry(Some(5_000), 300_000), 305_000);
        let honest = LeaseRecord::new(&h, 1, 1_000, 300_000);
        assert_eq!(honest.effective_expiry(Some(1_000), 330_000), 301_000);
        assert_eq!(honest.effective_expiry(None, 330_000), 301_000);
    }
}
