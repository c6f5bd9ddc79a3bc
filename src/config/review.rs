//! The inputs of pull request review (`review`, `review-events`, `max-review-comments`), parsed
//! once (docs/design.md#pull-request-review).

use super::inputs::{self as input, InputSpec};
use super::{invalid, optional, parse_choice, parse_u32, ConfigError};
use crate::runner::Env;

/// `review`: when a pull request event starts a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewMode {
    /// Only when someone asks for one; pull request events run as before.
    OnRequest,
    /// `pull_request` opened, synchronize and ready_for_review start a review.
    Auto,
}

/// What a review says of the pull request as a whole (GitHub's `event`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReviewEvent {
    Comment,
    RequestChanges,
    Approve,
}

impl ReviewEvent {
    pub const ALL: [ReviewEvent; 3] = [
        ReviewEvent::Comment,
        ReviewEvent::RequestChanges,
        ReviewEvent::Approve,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReviewEvent::Comment => "COMMENT",
            ReviewEvent::RequestChanges => "REQUEST_CHANGES",
            ReviewEvent::Approve => "APPROVE",
        }
    }

    pub fn parse(word: &str) -> Option<ReviewEvent> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(word.trim()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewSettings {
    pub mode: ReviewMode,
    /// The events a review may carry; `COMMENT` always.
    pub events: Vec<ReviewEvent>,
    pub max_comments: u64,
}

fn parse_events(env: &Env) -> Result<Vec<ReviewEvent>, ConfigError> {
    let spec: &InputSpec = &input::REVIEW_EVENTS;
    let mut events = vec![ReviewEvent::Comment];
    for word in super::safe_outputs::split_list(optional(env, spec).unwrap_or("COMMENT")) {
        match ReviewEvent::parse(&word) {
            Some(e) if !events.contains(&e) => events.push(e),
            Some(_) => {}
            None => {
                return Err(invalid(
                    spec,
                    &word,
                    "expected COMMENT, REQUEST_CHANGES or APPROVE",
                ))
            }
        }
    }
    events.sort();
    Ok(events)
}

pub fn parse(env: &Env) -> Result<ReviewSettings, ConfigError> {
    Ok(ReviewSettings {
        mode: parse_choice(
            env,
            &input::REVIEW,
            [
                ("on-request", ReviewMode::OnRequest),
                ("auto", ReviewMode::Auto),
            ],
        )?,
        events: parse_events(env)?,
        max_comments: u64::from(parse_u32(env, &input::MAX_REVIEW_COMMENTS)?),
    })
}
