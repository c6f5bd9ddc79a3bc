//! Pull request review, around the turn (docs/design.md#pull-request-review). Before it
//! (`prepare`): the pull request, its diff pinned to the head recorded now, fro-bot's earlier
//! reviews and threads, the range since its last review — into the view the review tools read.
//! After it (`post`): the agent's review proposals composed into one review
//! (`review::compose::Draft`), posted once the head is checked not to have moved, a 422 answered
//! by moving what GitHub refused into the body and posting again once; then replies and resolves
//! in fro-bot's own threads.

use crate::config::review::ReviewMode;
use crate::github::event::{Event, PullRequestAction, TargetKind};
use crate::github::GitHub;
use crate::phases::run_context::{Admitted, Mode};
use crate::review::api::{self, PostError, Posted, Thread};
use crate::review::compose::{same_login, Draft, Inline, Inputs};
use crate::review::diff::PullDiff;
use crate::review::fingerprint::Fingerprint;
use crate::review::outcome::{ReviewOutcome, ThreadActs};
use crate::review::view::{cap_diff, ReviewView, Since, ThreadView, MAX_DIFF_BYTES};
use crate::runner::log;
use crate::safe_outputs::proposals::{Proposal, ReviewPolicy};

/// What the turn may review.
pub(crate) enum ReviewPrep {
    NotOffered,
    Unavailable { why: String },
    Ready(Box<Ready>),
}

pub(crate) struct Ready {
    pub(crate) view: ReviewView,
    /// The view for the tools, kept alive for the turn.
    file: tempfile::NamedTempFile,
    pub(crate) policy: ReviewPolicy,
    own_login: String,
    /// The run is a `review: auto` review of a pull request event.
    pub(crate) auto: bool,
}

impl ReviewPrep {
    pub(crate) fn policy(&self) -> Option<ReviewPolicy> {
        match self {
            ReviewPrep::Ready(r) => Some(r.policy.clone()),
            ReviewPrep::NotOffered | ReviewPrep::Unavailable { .. } => None,
        }
    }

    pub(crate) fn view_file(&self) -> Option<std::path::PathBuf> {
        match self {
            ReviewPrep::Ready(r) => Some(r.file.path().to_path_buf()),
            ReviewPrep::NotOffered | ReviewPrep::Unavailable { .. } => None,
        }
    }

    /// What the prompt tells the agent of the review, and the task of an automatic one.
    pub(crate) fn brief(&self) -> Option<(String, Option<String>)> {
        let ReviewPrep::Ready(r) = self else {
            return None;
        };
        let v = &r.view;
        let since = match &v.since {
            Since::FirstReview => String::new(),
            Since::Range { from, .. } => format!(
                " You last reviewed it at {from}: review the commits since then (review_diff shows only those) and do not repeat what your open threads say."
            ),
            Since::Rewritten { from } => format!(
                " Its history was rewritten since your last review (at {from}): review it whole."
            ),
            Since::Unchanged => " You already reviewed this head.".into(),
        };
        let brief = format!(
            "This is pull request #{} at head {}. To review it, use review_diff, review_comment (inline, on lines of the diff; `suggestion` for a change the author applies in one click) and submit_review (the summary and event); fro-bot posts them as one review after your turn. list_review_threads shows the threads you started before: reply to or resolve those rather than repeating a finding.{since}",
            v.number, v.head_sha
        );
        let task = r.auto.then(|| {
            format!("Review pull request #{} with the review tools.{since} Then answer with a short summary of the review.", v.number)
        });
        Some((brief, task))
    }
}

/// The head a review of this run is pinned to: the one a pull request event names, else the
/// pull request's head now.
fn recorded_head(event: &Event, pull: &api::Pull) -> String {
    match event {
        Event::PullRequest { target, .. } => target.head_sha.clone(),
        _ => None,
    }
    .unwrap_or_else(|| pull.head_sha.clone())
}

/// Whether the run is an automatic review (`review: auto` and a pull request event that asks one).
fn is_auto(ctx: &Admitted) -> bool {
    ctx.settings.review.mode == ReviewMode::Auto
        && matches!(
            ctx.event,
            Event::PullRequest {
                action: PullRequestAction::Opened
                    | PullRequestAction::Synchronize
                    | PullRequestAction::ReadyForReview,
                ..
            }
        )
}

pub(crate) async fn prepare(ctx: &Admitted, gh: &GitHub) -> ReviewPrep {
    let Some(thread) = ctx.plan.thread.as_ref() else {
        return ReviewPrep::NotOffered;
    };
    if thread.kind != TargetKind::PullRequest || matches!(ctx.mode, Mode::Local { .. }) {
        return ReviewPrep::NotOffered;
    }
    match ready(ctx, gh, thread.number).await {
        Ok(r) => ReviewPrep::Ready(Box::new(r)),
        Err(why) => {
            log::warning(&format!("the agent gets no review tools: {why}"));
            ReviewPrep::Unavailable { why }
        }
    }
}

async fn ready(ctx: &Admitted, gh: &GitHub, number: u64) -> Result<Ready, String> {
    let pull = api::pull(gh, number).await.map_err(|e| e.to_string())?;
    let head = recorded_head(&ctx.event, &pull);
    let (own, diff, reviews, threads) = tokio::join!(
        gh.own_login(),
        api::diff(gh, &pull.base_sha, &head),
        api::reviews(gh, number),
        api::threads(gh, number)
    );
    let own = own.map_err(|e| e.to_string())?;
    let (diff, diff_cut) = cap_diff(diff.map_err(|e| e.to_string())?, MAX_DIFF_BYTES);
    // Without the earlier reviews and threads the review still runs, as a first one.
    let reviews = reviews.unwrap_or_else(|e| {
        log::warning(&format!("cannot list the pull request's reviews: {e}"));
        Vec::new()
    });
    let threads = threads.unwrap_or_else(|e| {
        log::warning(&format!(
            "cannot list the pull request's review threads: {e}"
        ));
        Vec::new()
    });
    let since = api::since(
        gh,
        crate::review::compose::last_reviewed(&reviews, &own),
        &head,
    )
    .await;
    let view = ReviewView {
        number,
        head_sha: head,
        author: pull.author,
        diff,
        diff_cut,
        since,
        threads: threads.iter().filter_map(|t| ours(t, &own)).collect(),
    };
    let file = view
        .write_file()
        .map_err(|e| format!("cannot write the review view: {e}"))?;
    Ok(Ready {
        view,
        file,
        policy: ReviewPolicy {
            events: ctx.settings.review.events.clone(),
            max_comments: ctx.settings.review.max_comments,
        },
        own_login: own,
        auto: is_auto(ctx),
    })
}

/// A thread fro-bot started (its first comment is fro-bot's and carries a fingerprint), as the
/// tools show it.
fn ours(t: &Thread, own: &str) -> Option<ThreadView> {
    let (comment_id, author, body) = t.comments.first()?;
    let fingerprint = Fingerprint::in_body(body)?;
    if !same_login(author, own) {
        return None;
    }
    let said: String = body
        .lines()
        .filter(|l| !l.starts_with("<!-- fro-bot:"))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(500)
        .collect();
    Some(ThreadView {
        id: t.id.clone(),
        comment_id: *comment_id,
        path: t.path.clone(),
        line: t.line,
        start_line: t.start_line,
        side: t.side,
        resolved: t.resolved,
        outdated: t.outdated,
        said: said.trim().to_string(),
        fingerprint: Some(fingerprint),
        replies: t.comments.len() - 1,
    })
}

/// After the turn: the review, when the turn's proposals stand (`AgentRun::proposals_stand`: it
/// completed, or the spend cap ended it), like every proposal.
pub(crate) async fn carry_out(
    ctx: &Admitted,
    (prep, proposals): (&ReviewPrep, Option<std::path::PathBuf>),
    agent_run: &crate::phases::turn::agent::AgentRun,
    held: Option<&str>,
) -> ReviewOutcome {
    let (Some(gh), Some(file)) = (ctx.gh.as_ref(), proposals) else {
        return ReviewOutcome::NotOffered;
    };
    if let (Some(why), ReviewPrep::Ready(_)) = (held, prep) {
        return ReviewOutcome::Failed {
            why: why.to_string(),
            refused: Vec::new(),
        };
    }
    if !agent_run.proposals_stand() {
        return match prep {
            ReviewPrep::Ready(_) => ReviewOutcome::Failed {
                why: "the agent's turn did not complete, so no review is posted".into(),
                refused: Vec::new(),
            },
            _ => ReviewOutcome::NotOffered,
        };
    }
    let read = crate::safe_outputs::proposals::read(&file);
    post(gh, prep, &read.proposals).await
}

/// The review proposals carried out.
pub(crate) async fn post(gh: &GitHub, prep: &ReviewPrep, proposals: &[Proposal]) -> ReviewOutcome {
    let ReviewPrep::Ready(r) = prep else {
        return match prep {
            ReviewPrep::Unavailable { why } => ReviewOutcome::Unavailable { why: why.clone() },
            _ => ReviewOutcome::NotOffered,
        };
    };
    let review: Vec<Proposal> = proposals
        .iter()
        .filter(|p| p.is_review())
        .cloned()
        .collect();
    if review.is_empty() {
        return ReviewOutcome::NothingProposed;
    }
    let mut draft = Draft::compose(&Inputs {
        view: &r.view,
        proposals: &review,
        policy: &r.policy,
        own_login: &r.own_login,
    });
    let number = r.view.number;
    if draft.has_review() {
        match api::pull(gh, number).await {
            Ok(now) if now.head_sha != r.view.head_sha => {
                return ReviewOutcome::HeadMoved {
                    recorded: r.view.head_sha.clone(),
                    now: now.head_sha,
                }
            }
            Ok(_) => {}
            Err(e) => return failed(format!("cannot read the pull request's head: {e}"), draft),
        }
    }
    let posted = match draft.has_review() {
        true => match submit(gh, number, &mut draft).await {
            Ok(p) => Some(p),
            Err(why) => return failed(why, draft),
        },
        false => None,
    };
    let threads = thread_acts(gh, number, &draft).await;
    match posted {
        Some((posted, retried)) => ReviewOutcome::Posted {
            url: posted.url,
            event: draft.event,
            comments: draft.comments.len(),
            moved: draft.moved.len(),
            repeated: draft.repeated,
            retried,
            threads,
            refused: draft.refused,
        },
        None => ReviewOutcome::ThreadsOnly {
            repeated: draft.repeated,
            threads,
            refused: draft.refused,
        },
    }
}

fn failed(why: String, draft: Draft) -> ReviewOutcome {
    log::warning(&format!("the review was not posted: {why}"));
    ReviewOutcome::Failed {
        why,
        refused: draft.refused,
    }
}

/// Posts the review; after GitHub's 422 (which names no comment) the comments fro-bot can no
/// longer anchor in the pull request's own diff — or, when it finds none, all of them — go into
/// the body, and the review goes once more.
async fn submit(
    gh: &GitHub,
    number: u64,
    draft: &mut Draft,
) -> Result<(Posted, Option<String>), String> {
    let errors = match api::post_review(gh, number, &draft.request()).await {
        Ok(posted) => return Ok((posted, None)),
        Err(PostError::Rejected { errors }) => errors,
        Err(PostError::Api(e)) => return Err(e.to_string()),
    };
    log::warning(&format!("GitHub refused the review ({errors}); posting it again with the refused comments in its body"));
    let fresh = api::pull_diff(gh, number)
        .await
        .map(|d| PullDiff::parse(&d));
    let anchored =
        |c: &Inline, diff: &PullDiff| diff.anchor(&c.path, c.line, c.start_line, c.side).is_ok();
    let culprits = match &fresh {
        Ok(diff) => draft.comments.iter().filter(|c| !anchored(c, diff)).count(),
        Err(_) => 0,
    };
    match (&fresh, culprits) {
        (Ok(diff), n) if n > 0 => draft.demote(&errors, |c| !anchored(c, diff)),
        _ => draft.demote(&errors, |_| true),
    }
    match api::post_review(gh, number, &draft.request()).await {
        Ok(posted) => Ok((posted, Some(errors))),
        Err(e) => Err(format!("{e} (after moving the comments into the body)")),
    }
}

/// Replies and resolves, each on its own: one GitHub refuses does not stop the others.
async fn thread_acts(gh: &GitHub, number: u64, draft: &Draft) -> ThreadActs {
    let mut acts = ThreadActs::default();
    for (comment_id, body) in &draft.replies {
        match api::reply(gh, number, *comment_id, body).await {
            Ok(()) => acts.replied += 1,
            Err(e) => acts.failed.push(format!("reply: {e}")),
        }
    }
    for thread in &draft.resolves {
        match api::resolve(gh, thread).await {
            Ok(()) => acts.resolved += 1,
            Err(e) => acts.failed.push(format!("resolve: {e}")),
        }
    }
    acts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safe_outputs::proposals::Side;

    fn thread(author: &str, body: &str) -> Thread {
        Thread {
            id: "PRRT_1".into(),
            resolved: false,
            outdated: true,
            path: "a.rs".into(),
            line: None,
            start_line: None,
            side: Side::Right,
            comments: vec![
                (11, author.into(), body.into()),
                (12, "mona".into(), "ok".into()),
            ],
        }
    }

    #[test]
    fn only_threads_fro_bot_started_with_a_fingerprint_are_its_own() {
        let marked = format!(
            "Unwrap.\n\n{}\n<!-- fro-bot:response -->",
            Fingerprint::of("a.rs", &["x"], "Unwrap.").marker()
        );
        let own = ours(&thread("github-actions", &marked), "github-actions[bot]").unwrap();
        assert_eq!(
            (own.comment_id, own.replies, own.said.as_str()),
            (11, 1, "Unwrap.")
        );
        assert!(own.outdated && own.fingerprint.is_some());
        // A person who copies fro-bot's marker into a thread of theirs does not silence a finding.
        assert!(ours(&thread("mona", &marked), "github-actions[bot]").is_none());
        assert!(ours(&thread("github-actions", "Unwrap."), "github-actions[bot]").is_none());
    }
}
