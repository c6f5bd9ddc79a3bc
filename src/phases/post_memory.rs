//! Post's side of the memory guard (docs/persistence.md#a-turn-cut-short): a main step killed
//! between the guard's copy and its put-back leaves memory as the agent left it, so post finishes
//! what main started before it saves. The copy main handed over is believed only as main's state
//! records it (`memory::guard::Handoff::verify`); the cut turn is repaired as killed
//! (`memory::repair`, `Interruption::Killed`); memory is rebuilt as the copy plus this run's own
//! session trees by the same `memory::guard::limit` main's put-back runs, and scrubbed as main
//! would (`Provenance::scrub_scope`). Where that cannot be done it says why, and nothing is saved.

use crate::memory::guard::{self, Handoff, Rebuilt};
use crate::memory::repair::{self, Interruption, RepairOutcome, RunRef};
use crate::memory::scrub::Scope;
use crate::memory::state_paths::StatePaths;
use crate::runner::env::{self, state};
use crate::runner::Env;

/// What post made of main's memory guard.
#[derive(Debug)]
pub(crate) enum GuardEnd {
    /// Main put memory back itself, or never took a copy: post goes on as main's state says.
    NotPending,
    /// Memory is the restored copy plus this run's own trees, as main would have left it: the save
    /// scrubs `scope`; `text` is for post's summary.
    Finished { scope: Scope, text: String },
    /// Main was killed before the agent's turn was sent: memory is as restored, which the cache
    /// and the store already keep, so there is nothing to save.
    BeforeTheTurn,
    /// Nothing may be saved, for this reason.
    NotSaved { why: String },
}

/// Finishes main's memory guard when main was killed before it could, then removes the copy.
pub(crate) async fn finish(env: &Env, paths: &StatePaths) -> GuardEnd {
    let handoff = match handoff(env) {
        None => return GuardEnd::NotPending,
        Some(Ok(h)) => h,
        Some(Err(e)) => return GuardEnd::NotSaved { why: e.to_string() },
    };
    let own = guard::recorded_own(env.state(state::MEMORY_OWN)).filter(|o| !o.is_empty());
    let end = match own {
        Some(own) => finish_from(env, paths, &handoff, own).await,
        None => GuardEnd::BeforeTheTurn,
    };
    handoff.discard();
    end
}

/// Removes the copy main handed over, when post does not finish it (another decision, the time
/// box): it must not outlive the job's post step.
pub(crate) fn discard(env: &Env) {
    if let Some(Ok(handoff)) = handoff(env) {
        handoff.discard();
    }
}

fn handoff(env: &Env) -> Option<Result<Handoff, guard::HandoffError>> {
    Handoff::from_state(
        env.state(state::MEMORY_GUARD),
        env.state(state::MEMORY_HANDOFF),
    )
}

/// The copy believed, the cut turn repaired, memory limited to `own` trees as main would.
async fn finish_from(
    env: &Env,
    paths: &StatePaths,
    handoff: &Handoff,
    own: Vec<String>,
) -> GuardEnd {
    let kept = match guard::from_handoff(handoff) {
        Ok(kept) => kept,
        Err(e) => return GuardEnd::NotSaved { why: e.to_string() },
    };
    let db = paths.db();
    // As main does it: the repair first (only this run's trees), then the rebuild.
    // The run is post's own (one run, main and post): the next run's notice names it.
    let run = RunRef::new(
        env.get(env::GITHUB_RUN_ID).unwrap_or_default(),
        env.get(env::GITHUB_RUN_ATTEMPT),
    );
    let repaired = repair::after_turn(db.clone(), own.clone(), Interruption::Killed, run).await;
    // What main's cleanup may have pruned is not known here: those trees go back as restored (the
    // safe side; a later run prunes them).
    let pruned: &[String] = &[];
    let limited = guard::limit(&kept, &db, &own, (pruned, 0), handoff.scrubbed);
    let note = limited.note.clone();
    match limited.rebuilt {
        Rebuilt::OwnTrees => GuardEnd::Finished {
            scope: limited.provenance.scrub_scope(&own),
            text: finished_text(&own, &repaired, note.as_deref()),
        },
        Rebuilt::RestoredWhole | Rebuilt::Neither => GuardEnd::NotSaved {
            why: note.unwrap_or_else(|| "memory could not be rebuilt".into()),
        },
    }
}

/// "The main step was killed before …; post did it: …".
fn finished_text(own: &[String], repaired: &RepairOutcome, note: Option<&str>) -> String {
    let ids: Vec<String> = own.iter().map(|id| format!("`{id}`")).collect();
    let mut text = format!(
        "The main step was killed before it limited the agent's changes to memory to its own \
         conversation; post did it from the copy the main step kept: memory is as restored plus \
         this run's conversation ({})",
        ids.join(", ")
    );
    if let Some(line) = repair::summary_line(std::slice::from_ref(repaired)) {
        text.push_str(&format!("; {line}"));
    }
    if let Some(note) = note {
        text.push_str(&format!("; {note}"));
    }
    text.push('.');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_conversation_kept_the_repair_and_what_was_put_back() {
        let repaired = RepairOutcome::Repaired(repair::RepairReport {
            turns: vec![repair::CutTurn {
                session_id: "ses_a".into(),
                message_id: "msg_a".into(),
                reason: Interruption::Killed,
                calls: vec![repair::UnknownCall {
                    part_id: "prt_a".into(),
                    call_id: None,
                    tool: "bash".into(),
                    input: "sleep".into(),
                    left: repair::LeftAs::Running,
                }],
                superseded: false,
            }],
            limited: false,
        });
        let text = finished_text(
            &["ses_a".into()],
            &repaired,
            Some("the agent changed 1 conversation(s) other than this run's (`ses_b`): put back as restored"),
        );
        assert!(text.contains("this run's conversation (`ses_a`)"), "{text}");
        assert!(
            text.contains(
                "repaired a turn cut short (the workflow run was killed): the turn was kept; its \
                 last command's outcome is unknown"
            ),
            "{text}"
        );
        assert!(text.contains("(`ses_b`): put back as restored."), "{text}");
    }
}
