//! The result of the save phase, the state value main hands to post, and post's decision.
//!
//! Every mapping here is one exhaustive `match`: adding an outcome fails to compile until each
//! decision about it is made.

use std::fmt;

/// Why the save ended the way it did (docs/design.md#save-outcomes-and-state-values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveOutcome {
    /// `skip-cache: true`.
    SkippedByConfiguration,
    /// No session database, or an empty one: nothing worth saving.
    SkippedEmpty,
    /// The WAL could not be folded into the database: saving the main file alone would lose data.
    CheckpointDeclined,
    /// The safety gate refused: something may still be writing, or the lease was lost.
    OwnershipDeclined,
    /// The newest cache entry could not be restored and older memory may remain: a new entry
    /// would hide it (docs/persistence.md, "Fall back, never shadow").
    ShadowingDeclined,
    /// The cache service refused the entry (exists, not reserved, write denied, rate limit, quota).
    CacheRejected,
    /// Transport or unexpected errors talking to the cache service.
    CacheError,
    /// The Actions cache holds the new entry.
    Persisted,
    /// The database is byte-for-byte what was restored: the entry (or store copy) it came from
    /// already holds it, so nothing is uploaded again.
    Unchanged,
    /// The run was cancelled before the agent's turn: it changed no memory, so nothing is saved
    /// and the cancel budget is left for the rest.
    CancelledBeforeTurn,
}

impl SaveOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            SaveOutcome::SkippedByConfiguration => "skipped-by-configuration",
            SaveOutcome::SkippedEmpty => "skipped-empty",
            SaveOutcome::CheckpointDeclined => "checkpoint-declined",
            SaveOutcome::OwnershipDeclined => "ownership-declined",
            SaveOutcome::ShadowingDeclined => "shadowing-declined",
            SaveOutcome::CacheRejected => "cache-rejected",
            SaveOutcome::CacheError => "cache-error",
            SaveOutcome::Persisted => "persisted",
            SaveOutcome::Unchanged => "unchanged",
            SaveOutcome::CancelledBeforeTurn => "cancelled-before-turn",
        }
    }
}

impl fmt::Display for SaveOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What main tells post (state `cacheSaved`) and the user (output `cache-save-result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateValue {
    Durable,
    StoreOnly,
    Skipped,
    DeclinedForSafety,
    NotPersisted,
}

impl StateValue {
    pub fn as_str(self) -> &'static str {
        match self {
            StateValue::Durable => "durable",
            StateValue::StoreOnly => "store-only",
            StateValue::Skipped => "skipped",
            StateValue::DeclinedForSafety => "declined-for-safety",
            StateValue::NotPersisted => "not-persisted",
        }
    }

    /// Reads the state as post sees it: absent or unrecognized means the save did not persist.
    pub fn parse(value: Option<&str>) -> StateValue {
        match value.map(str::trim) {
            Some("durable") => StateValue::Durable,
            Some("store-only") => StateValue::StoreOnly,
            Some("skipped") => StateValue::Skipped,
            Some("declined-for-safety") => StateValue::DeclinedForSafety,
            _ => StateValue::NotPersisted,
        }
    }
}

impl fmt::Display for StateValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSaveResult {
    pub cache_persisted: bool,
    pub store_persisted: bool,
    pub outcome: SaveOutcome,
    /// A human sentence for the summary and logs (already free of secrets).
    pub detail: String,
}

impl CacheSaveResult {
    pub fn new(outcome: SaveOutcome, store_persisted: bool, detail: impl Into<String>) -> Self {
        Self {
            cache_persisted: outcome == SaveOutcome::Persisted,
            store_persisted,
            outcome,
            detail: detail.into(),
        }
    }

    /// Nothing uploaded: the copy restored from the cache entry or the store still holds it all.
    pub fn unchanged(held_by_cache: bool, detail: impl Into<String>) -> Self {
        Self {
            cache_persisted: held_by_cache,
            store_persisted: !held_by_cache,
            outcome: SaveOutcome::Unchanged,
            detail: detail.into(),
        }
    }

    pub fn is_durable(&self) -> bool {
        self.cache_persisted || self.store_persisted
    }

    /// The state value, by the table in `docs/design.md#save-outcomes-and-state-values`.
    pub fn state_value(&self) -> StateValue {
        match self.outcome {
            SaveOutcome::SkippedByConfiguration
            | SaveOutcome::SkippedEmpty
            | SaveOutcome::CancelledBeforeTurn => StateValue::Skipped,
            SaveOutcome::CheckpointDeclined => StateValue::NotPersisted,
            SaveOutcome::OwnershipDeclined | SaveOutcome::ShadowingDeclined => {
                StateValue::DeclinedForSafety
            }
            SaveOutcome::CacheRejected | SaveOutcome::CacheError => {
                if self.store_persisted {
                    StateValue::StoreOnly
                } else {
                    StateValue::NotPersisted
                }
            }
            SaveOutcome::Persisted | SaveOutcome::Unchanged => StateValue::Durable,
        }
    }
}

/// Why the safety gate refused to save, checked in this order (first match reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// Work this run started in the agent was still running after shutdown was requested.
    AgentStillRunning,
    /// The OpenCode server did not confirm it stopped writing.
    ServerNotQuiescent,
    /// Processes the agent started survived the kill: they may still write the database.
    StraysRemained,
}

impl GateRefusal {
    pub fn describe(self) -> &'static str {
        match self {
            GateRefusal::AgentStillRunning => {
                "a session this run started was still busy after shutdown was requested"
            }
            GateRefusal::ServerNotQuiescent => {
                "the OpenCode server did not confirm that it stopped writing"
            }
            GateRefusal::StraysRemained => {
                "processes the agent started were still alive after SIGKILL"
            }
        }
    }
}

/// The facts the gate looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateInputs {
    pub agent_still_running: bool,
    pub server_quiescent: bool,
    pub strays_remained: bool,
}

pub fn safety_gate(inputs: GateInputs) -> Option<GateRefusal> {
    if inputs.agent_still_running {
        Some(GateRefusal::AgentStillRunning)
    } else if !inputs.server_quiescent {
        Some(GateRefusal::ServerNotQuiescent)
    } else if inputs.strays_remained {
        Some(GateRefusal::StraysRemained)
    } else {
        None
    }
}

/// What happened to the object-store copy of the session database in this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorePublish {
    Published,
    /// The lease could not be had, or may not publish now (lost, released, about to expire).
    Withheld {
        reason: String,
    },
    Conflict,
    Failed {
        message: String,
    },
    Disabled,
    /// The store is on but the save never reached publication (skipped, gate, checkpoint).
    NotAttempted,
}

impl StorePublish {
    pub fn describe(&self) -> String {
        match self {
            StorePublish::Published => "published".into(),
            StorePublish::Withheld { reason } => format!("withheld ({reason})"),
            StorePublish::Conflict => {
                "conflict (another run published newer memory that could not be merged; not overwritten)".into()
            }
            StorePublish::Failed { message } => format!("failed: {message}"),
            StorePublish::Disabled => "disabled".into(),
            StorePublish::NotAttempted => "not attempted".into(),
        }
    }
}

/// What the post step does with main's state value (docs/design.md#the-post-decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostDecision {
    /// Main's save stands; post only logs why it does nothing.
    NothingToDo { why: &'static str },
    /// Main declined for safety: post must not save either, and says so in its summary.
    Declined,
    /// Checkpoint and retry the Actions cache save (never the object store: the lease is gone).
    RetryCacheSave,
}

pub fn post_decision(state: StateValue) -> PostDecision {
    match state {
        StateValue::Durable => PostDecision::NothingToDo {
            why: "the main step saved memory durably",
        },
        StateValue::StoreOnly => PostDecision::NothingToDo {
            why: "the main step published memory to the object store; the next run restores it from there",
        },
        StateValue::Skipped => PostDecision::NothingToDo {
            why: "the main step had nothing to save (skipped by configuration, routing, or an empty database)",
        },
        StateValue::DeclinedForSafety => PostDecision::Declined,
        StateValue::NotPersisted => PostDecision::RetryCacheSave,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_to_state_value_table() {
        use SaveOutcome::*;
        use StateValue as V;
        let rows = [
            (SkippedByConfiguration, false, V::Skipped),
            (SkippedByConfiguration, true, V::Skipped),
            (SkippedEmpty, false, V::Skipped),
            (CheckpointDeclined, false, V::NotPersisted),
            (OwnershipDeclined, false, V::DeclinedForSafety),
            (ShadowingDeclined, false, V::DeclinedForSafety),
            (CacheRejected, false, V::NotPersisted),
            (CacheRejected, true, V::StoreOnly),
            (CacheError, false, V::NotPersisted),
            (CacheError, true, V::StoreOnly),
            (Persisted, false, V::Durable),
            (Persisted, true, V::Durable),
        ];
        for (outcome, store, expected) in rows {
            let r = CacheSaveResult::new(outcome, store, "");
            assert_eq!(r.state_value(), expected, "{outcome} store={store}");
            assert_eq!(r.is_durable(), outcome == Persisted || store);
        }
        // Unchanged memory is held by where it came from, either way durable.
        for held_by_cache in [true, false] {
            let r = CacheSaveResult::unchanged(held_by_cache, "");
            assert_eq!(r.state_value(), V::Durable);
            assert!(r.is_durable());
            assert_eq!(r.cache_persisted, held_by_cache);
        }
    }

    #[test]
    fn state_values_round_trip_and_unknown_means_not_persisted() {
        for v in [
            StateValue::Durable,
            StateValue::StoreOnly,
            StateValue::Skipped,
            StateValue::DeclinedForSafety,
            StateValue::NotPersisted,
        ] {
            assert_eq!(StateValue::parse(Some(v.as_str())), v);
        }
        assert_eq!(StateValue::parse(None), StateValue::NotPersisted);
        assert_eq!(StateValue::parse(Some("")), StateValue::NotPersisted);
        assert_eq!(StateValue::parse(Some("DURABLE")), StateValue::NotPersisted);
        assert_eq!(StateValue::parse(Some("yes")), StateValue::NotPersisted);
    }

    #[test]
    fn post_decision_table() {
        assert!(matches!(
            post_decision(StateValue::Durable),
            PostDecision::NothingToDo { .. }
        ));
        assert!(matches!(
            post_decision(StateValue::StoreOnly),
            PostDecision::NothingToDo { .. }
        ));
        assert!(matches!(
            post_decision(StateValue::Skipped),
            PostDecision::NothingToDo { .. }
        ));
        assert_eq!(
            post_decision(StateValue::DeclinedForSafety),
            PostDecision::Declined
        );
        assert_eq!(
            post_decision(StateValue::NotPersisted),
            PostDecision::RetryCacheSave
        );
        assert_eq!(
            post_decision(StateValue::parse(Some("garbage"))),
            PostDecision::RetryCacheSave
        );
    }

    #[test]
    fn safety_gate_reports_the_first_match_in_order() {
        let all = GateInputs {
            agent_still_running: true,
            server_quiescent: false,
            strays_remained: true,
        };
        assert_eq!(safety_gate(all), Some(GateRefusal::AgentStillRunning));
        let two = GateInputs {
            agent_still_running: false,
            ..all
        };
        assert_eq!(safety_gate(two), Some(GateRefusal::ServerNotQuiescent));
        let strays = GateInputs {
            server_quiescent: true,
            ..two
        };
        assert_eq!(safety_gate(strays), Some(GateRefusal::StraysRemained));
        let one = GateInputs {
            strays_remained: false,
            ..strays
        };
        assert_eq!(safety_gate(one), None);
    }
}
