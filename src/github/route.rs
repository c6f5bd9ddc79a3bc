//! Routing and gating: does this event start a run, and with what plan
//! (docs/design.md#the-github-surface).

use super::dedup::dedup_entity;
use super::event::{Actor, Comment, CommentSource, Event, Flag, IssuesAction, Target, TargetKind};
use super::keys::{DedupEntity, LogicalKey};

/// What routing needs besides the event.
#[derive(Debug, Clone, Copy)]
pub struct RouteSettings<'a> {
    /// The handle that must be mentioned in a comment, e.g. `@fro-bot`.
    pub mention: &'a str,
    /// Whether the `prompt` input was given.
    pub prompt_given: bool,
    /// `GITHUB_RUN_ID`, for run-scoped logical keys.
    pub run_id: &'a str,
    /// The invocation identity (`keys::invocation_identity`).
    pub identity: Option<&'a str>,
    /// The label whose addition starts a run (input `trigger-label`); `None` = labels start nothing.
    pub trigger_label: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
// One per run, moved once: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Route {
    Run(RunPlan),
    Skip(SkipReason),
}

/// What a reaction or the response attaches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A comment in an issue or pull-request conversation (REST id).
    IssueComment { id: u64 },
    /// A comment on a pull request's diff (REST id).
    ReviewComment { id: u64 },
    /// A discussion comment: only GraphQL can react to it.
    DiscussionComment { node_id: Option<String> },
    /// The issue or pull request itself.
    Issue { number: u64 },
}

/// Where the conversation is: what the context is read from and the response posted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub kind: TargetKind,
    pub number: u64,
    pub node_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    pub logical_key: LogicalKey,
    /// `None` for schedule and dispatch runs.
    pub thread: Option<Thread>,
    /// What to react to (👀 now, 🎉/😕 at the end).
    pub trigger: Option<Subject>,
    /// The triggering comment's id (REST), when a comment triggered the run.
    pub trigger_comment_id: Option<u64>,
    /// The text that asked for the run: the comment body, or the issue's title and body. The
    /// caller combines it with the `prompt` input.
    pub directive: Option<String>,
    /// Login of whoever triggered the run.
    pub author: Option<String>,
    /// Set for the issues/pull_request events `dedup` applies to (not synchronize/reopened).
    pub dedup: Option<DedupEntity>,
    /// One line naming what triggered the run, for the prompt and the summary, e.g.
    /// "`pull_request` (opened) on pull request #7 by @mona".
    pub trigger_summary: String,
    /// For a comment on a pull request the payload does not say whether the pull request is a
    /// fork or a draft: the caller should check (`GitHub::pull_request_flags`) and apply
    /// `gate_pull_request` before running.
    pub pull_request_unchecked: bool,
    /// What the payload left out that a gate decides on (`locked`, an actor's `type`): the caller
    /// checks it through the API (`GitHub::check_unverified`) and skips on what it cannot settle.
    pub unverified: Unverified,
    /// Whether the run acts unattended (schedule/dispatch only): `github::acts_unattended`.
    pub acts_unattended: bool,
    /// Who asked, as trust goes: the run's own level, from the event and never from memory
    /// (docs/security.md#trust-follows-memory).
    pub requester: crate::trust::SessionTrust,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    UnsupportedEvent {
        event: String,
        action: Option<String>,
    },
    MalformedPayload {
        event: String,
        missing: &'static str,
    },
    NoMention {
        mention: String,
    },
    UntrustedAuthor {
        login: String,
        association: String,
    },
    BotAuthor {
        login: String,
    },
    /// The comment carries fro-bot's response marker: it is one of fro-bot's own answers.
    OwnResponse,
    /// The comment was written by the token's own identity (a personal token's user).
    SelfAuthored {
        login: String,
    },
    /// A pull request whose fork/draft state could not be verified.
    UnverifiedPullRequest {
        number: u64,
        why: String,
    },
    /// The payload does not say whether the target is locked, and the API could not tell.
    UnverifiedLock {
        kind: TargetKind,
        number: u64,
        why: String,
    },
    /// The payload does not say whether someone is a bot, and the API could not tell.
    UnverifiedActor {
        login: String,
        why: String,
    },
    ForkPullRequest {
        number: u64,
    },
    DraftPullRequest {
        number: u64,
    },
    Locked {
        kind: TargetKind,
        number: u64,
    },
    /// A label was added that is not `trigger-label` (or none is set).
    NotTheTriggerLabel {
        label: String,
        trigger: Option<String>,
    },
    NoPrompt {
        event: String,
    },
}

impl SkipReason {
    /// One sentence for the step summary.
    pub fn describe(&self) -> String {
        match self {
            SkipReason::UnsupportedEvent { event, action } => match action {
                Some(a) => format!("The event `{event}` with action `{a}` is not handled."),
                None => format!("The event `{event}` is not handled."),
            },
            SkipReason::MalformedPayload { event, missing } => {
                format!("The `{event}` payload lacks `{missing}`.")
            }
            SkipReason::NoMention { mention } => {
                format!("The comment does not mention `{mention}`.")
            }
            SkipReason::UntrustedAuthor { login, association } => format!(
                "`{login}` is {association}; only OWNER, MEMBER and COLLABORATOR may trigger runs."
            ),
            SkipReason::BotAuthor { login } => {
                format!("`{login}` is a bot; bots do not trigger runs.")
            }
            SkipReason::OwnResponse => {
                "The comment is one of fro-bot's own responses (it carries the response marker); \
                 fro-bot does not answer itself."
                    .to_string()
            }
            SkipReason::SelfAuthored { login } => format!(
                "The comment was written by `{login}`, the identity of fro-bot's own token; \
                 fro-bot does not answer itself."
            ),
            SkipReason::UnverifiedPullRequest { number, why } => format!(
                "Pull request #{number} could not be verified as neither a fork nor a draft \
                 ({why}); fro-bot does not run on a pull request of unknown provenance."
            ),
            SkipReason::UnverifiedLock { kind, number, why } => format!(
                "The payload does not say whether {} #{number} is locked and GitHub could not \
                 tell ({why}); fro-bot does not run on what may be locked.",
                kind.as_str()
            ),
            SkipReason::UnverifiedActor { login, why } => format!(
                "The payload does not say whether `{login}` is a bot and GitHub could not tell \
                 ({why}); fro-bot does not run for what may be a bot."
            ),
            SkipReason::ForkPullRequest { number } => {
                format!("Pull request #{number} comes from a fork.")
            }
            SkipReason::DraftPullRequest { number } => {
                format!("Pull request #{number} is a draft.")
            }
            SkipReason::Locked { kind, number } => {
                format!("The {} #{number} is locked.", kind.as_str())
            }
            SkipReason::NoPrompt { event } => {
                format!("A `{event}` run needs the `prompt` input.")
            }
            SkipReason::NotTheTriggerLabel { label, trigger } => match trigger {
                Some(t) => format!("The label `{label}` is not the trigger label `{t}`."),
                None => format!(
                    "The label `{label}` was added, but no `trigger-label` is set: labels start no run."
                ),
            },
        }
    }
}

/// What a payload left out that the gates decide on; an empty one needs no look-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unverified {
    /// The target whose `locked` is missing.
    pub locked: Option<(TargetKind, u64)>,
    /// Logins the bot gates read (a comment's author and sender; an entity event's author and
    /// sender) whose `type` is missing and that do not end in `[bot]`.
    pub actors: Vec<String>,
}

impl Unverified {
    fn of(event: &Event) -> Unverified {
        let (target, actors): (Option<&Target>, Vec<Option<&Actor>>) = match event {
            Event::Comment {
                comment,
                target,
                sender,
                ..
            } => (Some(target), vec![Some(&comment.author), sender.as_ref()]),
            Event::Issues { target, sender, .. }
            | Event::PullRequest { target, sender, .. }
            | Event::Labeled { target, sender, .. } => {
                (Some(target), vec![sender.as_ref(), target.author.as_ref()])
            }
            Event::WorkflowDispatch { sender } => (None, vec![sender.as_ref()]),
            Event::Schedule { .. } | Event::Unsupported { .. } | Event::Malformed { .. } => {
                (None, vec![])
            }
        };
        let mut logins: Vec<String> = actors
            .into_iter()
            .flatten()
            .filter(|a| a.kind_unknown())
            .map(|a| a.login.clone())
            .collect();
        logins.sort();
        logins.dedup();
        Unverified {
            locked: target
                .filter(|t| t.locked == Flag::Unknown)
                .map(|t| (t.kind, t.number)),
            actors: logins,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.locked.is_none() && self.actors.is_empty()
    }
}

/// Routes an event. Gates apply in order: support, bot, own response, trust, mention, lock, fork,
/// draft. The token's own identity, unverified pull requests and what the payload left out are
/// checked after routing (`GitHub::check_self_trigger`, `GitHub::check_pull_request`,
/// `GitHub::check_unverified`).
pub fn route(event: &Event, settings: &RouteSettings<'_>) -> Route {
    let mut route = route_event(event, settings);
    if let Route::Run(plan) = &mut route {
        plan.requester.event = event.name().to_string();
        plan.requester.run_id = settings.run_id.to_string();
        plan.unverified = Unverified::of(event);
    }
    route
}

fn route_event(event: &Event, settings: &RouteSettings<'_>) -> Route {
    match event {
        Event::Unsupported { event, action } => Route::Skip(SkipReason::UnsupportedEvent {
            event: event.clone(),
            action: action.clone(),
        }),
        Event::Malformed { event, missing, .. } => Route::Skip(SkipReason::MalformedPayload {
            event: event.clone(),
            missing,
        }),
        Event::Schedule { cron } => schedule_route(cron, settings),
        Event::WorkflowDispatch { sender } => dispatch_route(sender.as_ref(), settings),
        Event::Comment {
            source,
            comment,
            target,
            sender,
        } => comment_route(*source, comment, target, sender.as_ref(), settings),
        Event::Issues {
            action,
            target,
            sender,
        } => entity_route(
            event,
            target,
            sender.as_ref(),
            match action {
                IssuesAction::Opened => "opened",
                IssuesAction::Edited => "edited",
            },
        ),
        Event::PullRequest {
            action,
            target,
            sender,
        } => entity_route(event, target, sender.as_ref(), action.as_str()),
        Event::Labeled {
            label,
            target,
            sender,
        } => label_route(event, label, target, sender.as_ref(), settings),
    }
}

/// A scheduled run has no request to answer: it runs only with the `prompt` input.
fn schedule_route(cron: &str, settings: &RouteSettings<'_>) -> Route {
    if !settings.prompt_given {
        return Route::Skip(SkipReason::NoPrompt {
            event: "schedule".into(),
        });
    }
    let mut plan = run_scoped(LogicalKey::schedule(
        cron,
        settings.run_id,
        settings.identity,
    ));
    plan.trigger_summary = format!("`schedule` ({cron})");
    Route::Run(plan)
}

/// A dispatched run, like a scheduled one, runs only with the `prompt` input.
fn dispatch_route(sender: Option<&Actor>, settings: &RouteSettings<'_>) -> Route {
    if !settings.prompt_given {
        return Route::Skip(SkipReason::NoPrompt {
            event: "workflow_dispatch".into(),
        });
    }
    let mut plan = run_scoped(LogicalKey::dispatch(settings.run_id, settings.identity));
    plan.author = sender.map(|s| s.login.clone());
    if let Some(login) = &plan.author {
        plan.requester.author = login.clone();
    }
    plan.trigger_summary = match &plan.author {
        Some(login) => format!("`workflow_dispatch` by @{login}"),
        None => "`workflow_dispatch`".to_string(),
    };
    Route::Run(plan)
}

/// A new comment: gated on its author, then planned as a run about its thread.
fn comment_route(
    source: CommentSource,
    comment: &Comment,
    target: &Target,
    sender: Option<&Actor>,
    settings: &RouteSettings<'_>,
) -> Route {
    match gate_comment(comment, target, sender, settings) {
        Some(skip) => Route::Skip(skip),
        None => Route::Run(comment_plan(source, comment, target)),
    }
}

/// The comment gates, in order: bot, own response, trust, mention, then the target's.
fn gate_comment(
    comment: &Comment,
    target: &Target,
    sender: Option<&Actor>,
    settings: &RouteSettings<'_>,
) -> Option<SkipReason> {
    if let Some(bot) = [Some(&comment.author), sender]
        .into_iter()
        .flatten()
        .find(|a| a.is_bot())
    {
        return Some(SkipReason::BotAuthor {
            login: bot.login.clone(),
        });
    }
    if super::marker::carries_marker(&comment.body) {
        return Some(SkipReason::OwnResponse);
    }
    if !comment.association.is_trusted() {
        return Some(SkipReason::UntrustedAuthor {
            login: comment.author.login.clone(),
            association: comment.association.as_str().to_string(),
        });
    }
    if !mentions(&comment.body, settings.mention) {
        return Some(SkipReason::NoMention {
            mention: settings.mention.to_string(),
        });
    }
    gate_target(target)
}

/// The plan for a run a comment asked for: it reacts to the comment and answers in its thread.
fn comment_plan(source: CommentSource, comment: &Comment, target: &Target) -> RunPlan {
    let trigger = match source {
        CommentSource::IssueComment => Subject::IssueComment { id: comment.id },
        CommentSource::PullRequestReviewComment => Subject::ReviewComment { id: comment.id },
        CommentSource::DiscussionComment => Subject::DiscussionComment {
            node_id: comment.node_id.clone(),
        },
    };
    let unchecked = target.kind == TargetKind::PullRequest
        && (target.fork == Flag::Unknown || target.draft == Flag::Unknown);
    RunPlan {
        logical_key: entity_key(target),
        thread: Some(thread(target)),
        trigger: Some(trigger),
        trigger_comment_id: Some(comment.id),
        directive: Some(comment.body.clone()),
        author: Some(comment.author.login.clone()),
        dedup: None,
        trigger_summary: format!(
            "`{}` on {} #{} by @{}",
            source.event_name(),
            target.kind.as_str(),
            target.number,
            comment.author.login
        ),
        pull_request_unchecked: unchecked,
        unverified: Unverified::default(),
        acts_unattended: false,
        requester: crate::trust::SessionTrust::new(
            &comment.author.login,
            comment.association.as_str(),
            target.fork == Flag::Yes,
            false,
        ),
    }
}

/// A label added by a person is a request, like a mention: who can label (triage access or more)
/// is trusted; the entity's author need not be. Bots never trigger (no loops).
fn label_route(
    event: &Event,
    label: &str,
    target: &Target,
    sender: Option<&super::event::Actor>,
    settings: &RouteSettings<'_>,
) -> Route {
    if settings.trigger_label != Some(label) {
        return Route::Skip(SkipReason::NotTheTriggerLabel {
            label: label.to_string(),
            trigger: settings.trigger_label.map(str::to_string),
        });
    }
    let Some(sender) = sender else {
        return Route::Skip(SkipReason::MalformedPayload {
            event: event.name().to_string(),
            missing: "sender",
        });
    };
    if sender.is_bot() {
        return Route::Skip(SkipReason::BotAuthor {
            login: sender.login.clone(),
        });
    }
    if let Some(skip) = gate_target(target) {
        return Route::Skip(skip);
    }
    let mut plan = entity_plan(target, None);
    plan.author = Some(sender.login.clone());
    // Labelling takes triage access, which maintainers grant. The entity's author is read (the
    // directive is its text), which lowers the session's record (phases::turn::agent).
    plan.requester = crate::trust::SessionTrust::new(
        &sender.login,
        crate::trust::WORKFLOW,
        target.fork == Flag::Yes,
        false,
    );
    plan.trigger_summary = format!(
        "`{}` (labeled `{label}`) on {} #{} by @{}",
        event.name(),
        target.kind.as_str(),
        target.number,
        sender.login
    );
    Route::Run(plan)
}

/// Issues and pull_request events: gated on the entity's author (the only association the
/// payload carries) and on the sender being a person.
fn entity_route(
    event: &Event,
    target: &Target,
    sender: Option<&super::event::Actor>,
    action: &str,
) -> Route {
    if let Some(bot) = [target.author.as_ref(), sender]
        .into_iter()
        .flatten()
        .find(|a| a.is_bot())
    {
        return Route::Skip(SkipReason::BotAuthor {
            login: bot.login.clone(),
        });
    }
    if !target.association.is_trusted() {
        return Route::Skip(SkipReason::UntrustedAuthor {
            login: target
                .author
                .as_ref()
                .map_or_else(|| "(unknown)".to_string(), |a| a.login.clone()),
            association: target.association.as_str().to_string(),
        });
    }
    if let Some(skip) = gate_target(target) {
        return Route::Skip(skip);
    }
    let mut plan = entity_plan(target, dedup_entity(event).ok());
    plan.trigger_summary = format!(
        "`{}` ({action}) on {} #{}{}",
        event.name(),
        target.kind.as_str(),
        target.number,
        target
            .author
            .as_ref()
            .map_or_else(String::new, |a| format!(" by @{}", a.login))
    );
    Route::Run(plan)
}

/// The plan for a run about an issue or pull request itself (not a comment on it).
fn entity_plan(target: &Target, dedup: Option<DedupEntity>) -> RunPlan {
    RunPlan {
        logical_key: entity_key(target),
        thread: Some(thread(target)),
        trigger: Some(Subject::Issue {
            number: target.number,
        }),
        trigger_comment_id: None,
        // The issue or pull request itself is what the agent is asked about.
        directive: Some(format!("{}\n\n{}", target.title, target.body)),
        author: target.author.as_ref().map(|a| a.login.clone()),
        dedup,
        trigger_summary: String::new(),
        pull_request_unchecked: target.kind == TargetKind::PullRequest
            && (target.fork == Flag::Unknown || target.draft == Flag::Unknown),
        unverified: Unverified::default(),
        acts_unattended: false,
        requester: crate::trust::SessionTrust::new(
            target
                .author
                .as_ref()
                .map_or("(unknown)", |a| a.login.as_str()),
            target.association.as_str(),
            target.fork == Flag::Yes,
            target.author.as_ref().is_some_and(|a| a.is_bot()),
        ),
    }
}

/// Locked, fork and draft gates. `Flag::Unknown` passes here; see `RunPlan::pull_request_unchecked`
/// and `RunPlan::unverified`.
fn gate_target(target: &Target) -> Option<SkipReason> {
    if target.locked == Flag::Yes {
        return Some(SkipReason::Locked {
            kind: target.kind,
            number: target.number,
        });
    }
    if target.kind == TargetKind::PullRequest {
        return gate_pull_request(target.number, target.fork, target.draft);
    }
    None
}

/// The fork and draft gates for a pull request, also for flags fetched after routing.
pub fn gate_pull_request(number: u64, fork: Flag, draft: Flag) -> Option<SkipReason> {
    if fork == Flag::Yes {
        return Some(SkipReason::ForkPullRequest { number });
    }
    if draft == Flag::Yes {
        return Some(SkipReason::DraftPullRequest { number });
    }
    None
}

fn run_scoped(logical_key: LogicalKey) -> RunPlan {
    RunPlan {
        logical_key,
        thread: None,
        trigger: None,
        trigger_comment_id: None,
        directive: None,
        author: None,
        dedup: None,
        trigger_summary: String::new(),
        pull_request_unchecked: false,
        unverified: Unverified::default(),
        acts_unattended: true,
        requester: crate::trust::SessionTrust::new(
            "workflow",
            crate::trust::WORKFLOW,
            false,
            false,
        ),
    }
}

fn entity_key(target: &Target) -> LogicalKey {
    match target.kind {
        TargetKind::Issue => LogicalKey::issue(target.number),
        TargetKind::PullRequest => LogicalKey::pull_request(target.number),
        TargetKind::Discussion => LogicalKey::discussion(target.number),
    }
}

fn thread(target: &Target) -> Thread {
    Thread {
        kind: target.kind,
        number: target.number,
        node_id: target.node_id.clone(),
    }
}

/// Whether `text` mentions `mention` (e.g. `@fro-bot`), case-insensitively, as a whole handle:
/// not preceded by a handle/email character and not followed by one (`@fro-bot-dev`,
/// `me@fro-bot.io`, `@fro-bots` do not count; `@fro-bot,` and `(@fro-bot)` do).
pub fn mentions(text: &str, mention: &str) -> bool {
    let handle = mention.trim_start_matches('@');
    if handle.is_empty() {
        return false;
    }
    let needle = format!("@{}", handle.to_ascii_lowercase());
    // ASCII lowercasing keeps byte offsets aligned with `text`.
    let hay = text.to_ascii_lowercase();
    let is_handle_char = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    let mut from = 0;
    while let Some(pos) = hay[from..].find(&needle) {
        let start = from + pos;
        let end = start + needle.len();
        let before_ok = hay[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !(is_handle_char(c) || c == '.' || c == '@' || c == '/'));
        // A trailing '.' ends a sentence unless a handle character follows it.
        let mut rest = hay[end..].chars();
        let after_ok = match rest.next() {
            None => true,
            Some('.') | Some('/') => rest.next().is_none_or(|c| !is_handle_char(c)),
            Some(c) => !is_handle_char(c),
        };
        if before_ok && after_ok {
            return true;
        }
        from = end;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mention_matching() {
        let m = "@fro-bot";
        for yes in [
            "@fro-bot please look",
            "hey @Fro-Bot, fix it",
            "(@FRO-BOT)",
            "done @fro-bot.",
            "@fro-bot",
            "line1\n@fro-bot: go",
        ] {
            assert!(mentions(yes, m), "{yes:?}");
        }
        for no in [
            "fro-bot please",
            "@fro-bots",
            "@fro-bot-dev help",
            "mail me@fro-bot.io",
            "x@fro-bot",
            "@fro-bot_x",
            "@fro-bot.io",
            "",
        ] {
            assert!(!mentions(no, m), "{no:?}");
        }
        assert!(mentions("hi @my-bot", "my-bot"));
        assert!(mentions("a @fro-bot-dev b @fro-bot", m));
        assert!(!mentions("anything", "@"));
    }
}
