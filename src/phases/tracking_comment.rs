//! The tracking comment through a run (`docs/design.md#the-github-surface`): posted once the run
//! is admitted, edited with the agent's progress at a bounded rate, and replaced by the final
//! body — the answer, or what stopped the run. Every write to the comment goes through one lock, and
//! the final body sets `finished` under it: no progress edit can land after the answer.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{CommentMode, ResponseMode};
use crate::github::api::{ApiError, GitHub, PostedComment};
use crate::github::event::TargetKind;
use crate::github::route::Thread;
use crate::github::tracking::render_working;
use crate::opencode::events::Todo;
use crate::opencode::progress::ProgressSink;
use crate::phases::run_context::Admitted;
use crate::runner::env::{self, output, state};
use crate::runner::{log, Env, FileCommands};

/// The least time between two progress edits (`FRO_BOT_PROGRESS_EDIT_MS` overrides it).
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// No interval override goes below this: the loop must never spin.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// Progress edits per run, at most (the final edit is not one of them).
pub(crate) const MAX_PROGRESS_EDITS: u32 = 60;
/// Posting (or, sticky, finding and editing) the working comment at admission.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// One progress edit; a slower GitHub ends the progress updates, not the run.
const PROGRESS_EDIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The final edit of a run that was not cancelled.
pub(crate) const FINAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The final edit under a signal, at most (and never past the cancel deadline).
pub(crate) const CANCEL_EDIT_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, thiserror::Error)]
pub(crate) enum TrackingError {
    #[error("cannot {what}: {source}")]
    Api {
        what: &'static str,
        #[source]
        source: ApiError,
    },
    #[error("cannot {what}: GitHub did not answer within {limit:?}")]
    TimedOut { what: &'static str, limit: Duration },
}

/// What a progress edit may do next, given what the comment already shows.
#[derive(Debug, Default)]
struct Pace {
    finished: bool,
    edits: u32,
    shown: Snapshot,
}

type Snapshot = (Vec<Todo>, Option<String>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// The run's final body is in (or on its way), or the edit budget is spent.
    Stop,
    /// Nothing changed since the last edit.
    Skip,
    Edit,
}

impl Pace {
    fn next(&self, snapshot: &Snapshot) -> Next {
        if self.finished || self.edits >= MAX_PROGRESS_EDITS {
            Next::Stop
        } else if *snapshot == self.shown {
            Next::Skip
        } else {
            Next::Edit
        }
    }
}

/// The run's tracking comment, once posted.
pub(crate) struct Tracker {
    gh: GitHub,
    kind: TargetKind,
    run_url: Option<String>,
    comment: PostedComment,
    pace: tokio::sync::Mutex<Pace>,
    /// Where `trackingComment` is kept for post until the final body is in.
    files: FileCommands,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("comment", &self.comment)
            .finish_non_exhaustive()
    }
}

/// Posts the working comment (or, `sticky`, turns the thread's own comment back into one) and
/// sets `comment-url`. `None` when there is nothing to track or posting failed (warned): the
/// answer is then posted at the end as a new comment.
pub(crate) async fn open(ctx: &Admitted) -> Option<Arc<Tracker>> {
    let (gh, thread) = (ctx.gh.as_ref()?, ctx.plan.thread.as_ref()?);
    if ctx.cancel.is_cancelled() {
        // Nothing will run: no comment to leave behind.
        return None;
    }
    match ctx.settings.response_mode {
        ResponseMode::None => return None,
        ResponseMode::Github => {}
    }
    let run_url = crate::github::response::run_url(&ctx.env);
    let body = render_working(run_url.as_deref(), &[], None);
    let placed = tokio::time::timeout(
        OPEN_TIMEOUT,
        place(gh, ctx.settings.comment_mode, thread, &body),
    )
    .await;
    let comment = match placed {
        Ok(Ok(comment)) => comment,
        Ok(Err(e)) => {
            log::warning(&format!(
                "cannot post the tracking comment (the answer is posted at the end): {e}"
            ));
            return None;
        }
        Err(_) => {
            log::warning(&format!(
                "the tracking comment was not posted within {OPEN_TIMEOUT:?} (the answer is posted at the end)"
            ));
            return None;
        }
    };
    if let Some(url) = &comment.url {
        ctx.files.set_output_or_warn(output::COMMENT_URL, url);
    }
    ctx.files.save_state_or_warn(
        state::TRACKING_COMMENT,
        &left_behind_value(thread.kind, &comment.id),
    );
    Some(Arc::new(Tracker {
        gh: gh.clone(),
        kind: thread.kind,
        run_url,
        comment,
        pace: Default::default(),
        files: ctx.files.clone(),
    }))
}

/// `run`: a new comment. `sticky`: the thread's comment fro-bot's own identity wrote, edited; a
/// new one when there is none or it cannot be edited.
async fn place(
    gh: &GitHub,
    mode: CommentMode,
    thread: &Thread,
    body: &str,
) -> Result<PostedComment, ApiError> {
    match mode {
        CommentMode::Run => {}
        CommentMode::Sticky => match gh.find_own_comment(thread).await {
            Ok(Some(existing)) => match gh.edit_comment(thread.kind, &existing, body).await {
                Ok(edited) => return Ok(edited),
                Err(e) => log::warning(&format!(
                    "cannot edit the thread's fro-bot comment {} (posting a new one): {e}",
                    existing.id
                )),
            },
            Ok(None) => {}
            Err(e) => log::warning(&format!(
                "cannot look for the thread's fro-bot comment (posting a new one): {e}"
            )),
        },
    }
    gh.post_comment(thread, body).await
}

/// The least time between progress edits: [`PROGRESS_INTERVAL`], or `FRO_BOT_PROGRESS_EDIT_MS`.
pub(crate) fn progress_interval(env: &Env) -> Duration {
    env.get(env::FRO_BOT_PROGRESS_EDIT_MS)
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(PROGRESS_INTERVAL)
        .max(MIN_INTERVAL)
}

impl Tracker {
    /// Edits the comment with `sink`'s todo list and current step, at most every `interval` and
    /// only when they changed, until the guard is dropped or the final body is in.
    pub(crate) fn watch(self: &Arc<Self>, sink: ProgressSink, interval: Duration) -> DropGuard {
        let stop = CancellationToken::new();
        let (this, until) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = until.cancelled() => return,
                    () = tokio::time::sleep(interval) => {}
                }
                if !this.show_progress(sink.snapshot()).await {
                    return;
                }
            }
        });
        stop.drop_guard()
    }

    /// One progress edit, if due. `false`: no more progress edits this run.
    async fn show_progress(&self, snapshot: Snapshot) -> bool {
        let mut pace = self.pace.lock().await;
        match pace.next(&snapshot) {
            Next::Stop => return false,
            Next::Skip => return true,
            Next::Edit => {}
        }
        let (todos, step) = &snapshot;
        let shown: Vec<crate::github::tracking::Todo<'_>> = todos
            .iter()
            .map(|t| crate::github::tracking::Todo {
                content: &t.content,
                status: &t.status,
            })
            .collect();
        let body = render_working(self.run_url.as_deref(), &shown, step.as_deref());
        match self
            .edit("update the tracking comment", &body, PROGRESS_EDIT_TIMEOUT)
            .await
        {
            Ok(_) => {
                pace.edits += 1;
                pace.shown = snapshot;
                true
            }
            Err(e) => {
                // Not worth hammering a failing API: the final edit (or its fallback) still comes.
                tracing::warn!("{e}; no more progress updates");
                false
            }
        }
    }

    /// Replaces the body with the run's final one. From here on no progress edit is made, even if
    /// this one fails or times out.
    pub(crate) async fn finish(
        &self,
        body: &str,
        limit: Duration,
    ) -> Result<PostedComment, TrackingError> {
        const WHAT: &str = "put the final answer into the tracking comment";
        let work = async {
            // Waits for a progress edit in flight: the final body is the last write.
            let mut pace = self.pace.lock().await;
            pace.finished = true;
            self.gh
                .edit_comment(self.kind, &self.comment, body)
                .await
                .map_err(|source| TrackingError::Api { what: WHAT, source })
        };
        match tokio::time::timeout(limit, work).await {
            Ok(Ok(edited)) => {
                // The comment holds its final body: nothing for post to finish.
                self.files.save_state_or_warn(state::TRACKING_COMMENT, "");
                Ok(edited)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TrackingError::TimedOut { what: WHAT, limit }),
        }
    }

    async fn edit(
        &self,
        what: &'static str,
        body: &str,
        limit: Duration,
    ) -> Result<PostedComment, TrackingError> {
        match tokio::time::timeout(limit, self.gh.edit_comment(self.kind, &self.comment, body))
            .await
        {
            Ok(Ok(edited)) => Ok(edited),
            Ok(Err(source)) => Err(TrackingError::Api { what, source }),
            Err(_) => Err(TrackingError::TimedOut { what, limit }),
        }
    }

    /// Shows `step` as the current step (`None`: the plain working body), once: the run's own
    /// status before the agent's progress starts, not paced; a failure is a log line.
    pub(crate) async fn show_step(&self, step: Option<&str>) {
        let pace = self.pace.lock().await;
        if pace.finished {
            return;
        }
        let body = render_working(self.run_url.as_deref(), &[], step);
        if let Err(e) = self
            .edit("update the tracking comment", &body, PROGRESS_EDIT_TIMEOUT)
            .await
        {
            tracing::warn!("{e}");
        }
    }

    pub(crate) fn url(&self) -> Option<&str> {
        self.comment.url.as_deref()
    }
}

/// What post says in a tracking comment main left "working" (main was killed). Said before post's
/// save: what the turn did is not known to be kept; if it is saved, the next run's restore repairs
/// it and that run is told (docs/persistence.md#the-next-run-knows).
pub(crate) const KILLED: &str =
    "I was stopped before I could finish: the job ended before I could answer. What I did so far \
     is not known to be kept in memory; if it was saved, my next run on this thread is told that \
     this turn was cut short. Mention me again to retry.";
/// Post's edit of such a comment, at most.
const LEFT_BEHIND_TIMEOUT: Duration = Duration::from_secs(10);

fn left_behind_value(kind: TargetKind, id: &str) -> String {
    let kind = match kind {
        TargetKind::Issue => "issue",
        TargetKind::PullRequest => "pull_request",
        TargetKind::Discussion => "discussion",
    };
    format!("{kind}:{id}")
}

fn parse_left_behind(value: &str) -> Option<(TargetKind, PostedComment)> {
    let (kind, id) = value.split_once(':')?;
    let kind = match kind {
        "issue" => TargetKind::Issue,
        "pull_request" => TargetKind::PullRequest,
        "discussion" => TargetKind::Discussion,
        _ => return None,
    };
    let comment = PostedComment {
        id: id.to_string(),
        url: None,
    };
    (!id.is_empty()).then_some((kind, comment))
}

/// Post: a tracking comment main left "working" (it was killed before its final edit) is told
/// the run stopped, so the thread is not left waiting. Within 10 s; a failure is a warning.
pub(crate) async fn finish_left_behind(env: &Env) {
    let Some((kind, comment)) = env
        .state(state::TRACKING_COMMENT)
        .and_then(parse_left_behind)
    else {
        return;
    };
    let token = crate::config::Settings::from_env(env, crate::config::AuthRequirement::Optional)
        .ok()
        .and_then(|s| s.github_token);
    let gh = token.and_then(|t| GitHub::from_env(env, &t).ok());
    let Some(gh) = gh else {
        log::warning("post: the tracking comment still says working, but there is no GitHub client to edit it");
        return;
    };
    let footer = crate::github::response::RunFooter {
        run_url: crate::github::response::run_url(env),
        session_id: None,
        cache_status: None,
        logical_key: None,
        duration_secs: None,
    };
    let body = crate::github::response::render(KILLED, &footer, None);
    match tokio::time::timeout(LEFT_BEHIND_TIMEOUT, gh.edit_comment(kind, &comment, &body)).await {
        Ok(Ok(_)) => tracing::info!("post: the tracking comment now says the run was stopped"),
        Ok(Err(e)) => log::warning(&format!("post: cannot update the tracking comment: {e}")),
        Err(_) => log::warning("post: updating the tracking comment timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comment_left_for_post_round_trips_and_junk_is_ignored() {
        for kind in [
            TargetKind::Issue,
            TargetKind::PullRequest,
            TargetKind::Discussion,
        ] {
            let (k, c) = parse_left_behind(&left_behind_value(kind, "DC_kw:1")).unwrap();
            assert_eq!((k, c.id.as_str()), (kind, "DC_kw:1"));
        }
        for junk in ["", "issue:", "issue", "commit:5", ":5"] {
            assert!(parse_left_behind(junk).is_none(), "{junk}");
        }
    }

    fn snap(i: u32) -> Snapshot {
        (
            vec![Todo {
                content: format!("step {i}"),
                status: "in_progress".into(),
            }],
            None,
        )
    }

    #[test]
    fn progress_edits_are_made_only_on_change_at_most_the_cap_and_never_after_the_end() {
        let mut pace = Pace::default();
        assert_eq!(
            pace.next(&Snapshot::default()),
            Next::Skip,
            "nothing new yet"
        );
        for i in 0..MAX_PROGRESS_EDITS {
            assert_eq!(pace.next(&snap(i)), Next::Edit);
            pace.edits += 1;
            pace.shown = snap(i);
            let again = match i + 1 == MAX_PROGRESS_EDITS {
                true => Next::Stop,
                false => Next::Skip,
            };
            assert_eq!(pace.next(&snap(i)), again, "the same snapshot again");
        }
        assert_eq!(pace.next(&snap(999)), Next::Stop, "the cap holds");

        let pace = Pace {
            finished: true,
            ..Pace::default()
        };
        assert_eq!(
            pace.next(&snap(1)),
            Next::Stop,
            "the final body is the last write"
        );
    }

    #[test]
    fn the_interval_override_is_read_and_floored() {
        let env = |v: &str| Env::from_pairs([(env::FRO_BOT_PROGRESS_EDIT_MS, v)]);
        assert_eq!(
            progress_interval(&Env::from_pairs(Vec::<(String, String)>::new())),
            PROGRESS_INTERVAL
        );
        assert_eq!(progress_interval(&env("300")), Duration::from_millis(300));
        assert_eq!(progress_interval(&env("0")), MIN_INTERVAL);
        assert_eq!(progress_interval(&env("soon")), PROGRESS_INTERVAL);
    }
}
