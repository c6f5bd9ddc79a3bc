//! Trust follows memory (docs/security.md#trust-follows-memory): every session fro-bot saves
//! records the trust of what wrote it — the least trusted author whose text its run read — and a
//! later run quotes lower-trust sessions as untrusted, or (runs that hold a token) leaves them out.
//!
//! A record can only lower trust: a session's record is the minimum over everything that wrote
//! it, a session without a record counts as the lowest, and a run's own level comes from its
//! event, never from memory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How far text is trusted, lowest first (`Ord` follows: `Outsider < Contributor < Maintainer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrustLevel {
    /// `NONE`, `FIRST_TIMER`, `FIRST_TIME_CONTRIBUTOR`, `MANNEQUIN`, unknown, a fork, no record.
    Outsider,
    /// `CONTRIBUTOR`: has had a contribution merged, has no write access.
    Contributor,
    /// `OWNER`, `MEMBER`, `COLLABORATOR`, and the workflow itself (schedule, dispatch, a label).
    Maintainer,
}

impl<'de> Deserialize<'de> for TrustLevel {
    /// Lenient: a value this version does not know (a forged or newer marker) is the lowest.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "maintainer" => TrustLevel::Maintainer,
            "contributor" => TrustLevel::Contributor,
            _ => TrustLevel::Outsider,
        })
    }
}

impl TrustLevel {
    /// The level of GitHub's `author_association` (bots are judged by theirs too), or of a fork.
    pub fn of(association: &str, fork: bool) -> TrustLevel {
        if fork {
            return TrustLevel::Outsider;
        }
        match association {
            "OWNER" | "MEMBER" | "COLLABORATOR" | WORKFLOW => TrustLevel::Maintainer,
            "CONTRIBUTOR" => TrustLevel::Contributor,
            _ => TrustLevel::Outsider,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TrustLevel::Outsider => "outsider",
            TrustLevel::Contributor => "contributor",
            TrustLevel::Maintainer => "maintainer",
        }
    }
}

/// What stands for an association when the workflow itself asked (schedule, dispatch, a label
/// added by someone with triage access): configured by the repository's maintainers.
pub const WORKFLOW: &str = "WORKFLOW";

/// Who wrote a session, as far as trust goes: the least trusted author whose text the writing
/// run read (the requester when nobody less trusted was read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTrust {
    pub level: TrustLevel,
    pub author: String,
    /// `author_association` (or [`WORKFLOW`]).
    pub association: String,
    #[serde(default)]
    pub fork: bool,
    #[serde(default)]
    pub bot: bool,
    /// The event of the run that recorded it (`issue_comment`, `schedule`...).
    #[serde(default)]
    pub event: String,
    #[serde(default)]
    pub run_id: String,
}

impl SessionTrust {
    pub fn new(author: &str, association: &str, fork: bool, bot: bool) -> SessionTrust {
        SessionTrust {
            level: TrustLevel::of(association, fork),
            author: author.to_string(),
            association: association.to_string(),
            fork,
            bot,
            event: String::new(),
            run_id: String::new(),
        }
    }

    /// The less trusted of the two (on a tie, `self`): what a session is after `other` wrote to
    /// it, or after its run read `other`'s text.
    pub fn lowered_by(self, other: &SessionTrust) -> SessionTrust {
        if other.level < self.level {
            SessionTrust {
                event: self.event,
                run_id: self.run_id,
                ..other.clone()
            }
        } else {
            self
        }
    }

    /// The association as a label shows it.
    pub fn association_label(&self) -> &str {
        if self.association.is_empty() {
            "UNKNOWN"
        } else {
            &self.association
        }
    }
}

/// Session id → who wrote it. Kept in the marker (`fro-bot.json`) beside the session map.
pub type TrustMap = BTreeMap<String, SessionTrust>;

/// Joins `records` into `map`: where both hold a session, the lower record (a record only ever
/// goes down).
pub fn join_lowering(
    map: &mut TrustMap,
    records: impl IntoIterator<Item = (String, SessionTrust)>,
) {
    for (id, record) in records {
        let joined = match map.remove(&id) {
            Some(held) => held.lowered_by(&record),
            None => record,
        };
        map.insert(id, joined);
    }
}

/// What a run does with an earlier session's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PriorUse {
    /// At the run's level or above: quoted with its recorded author.
    Trusted(SessionTrust),
    /// Below the run's level: fenced and labelled as an untrusted quote.
    Untrusted(SessionTrust),
    /// Below the run's level in a run that holds a token: left out.
    Withheld,
}

/// How one run judges earlier sessions: its own level, and whether it leaves lower-trust
/// sessions out (runs that hold a token: schedule, dispatch).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TrustView {
    pub level: Option<TrustLevel>,
    pub withhold_lower: bool,
    pub sessions: TrustMap,
}

impl TrustView {
    /// The view of a run at `level`; `withhold_lower` for runs that hold a token.
    pub fn new(level: TrustLevel, withhold_lower: bool, sessions: TrustMap) -> TrustView {
        TrustView {
            level: Some(level),
            withhold_lower,
            sessions,
        }
    }

    /// The view when nothing is known about the run: every session is an untrusted quote.
    pub fn unknown() -> TrustView {
        TrustView::default()
    }

    /// The view when the run's trust could not be read: every session is left out.
    pub fn closed() -> TrustView {
        TrustView {
            level: Some(TrustLevel::Maintainer),
            withhold_lower: true,
            sessions: TrustMap::new(),
        }
    }

    /// A session's record; none (not written by fro-bot, or memory from before trust was
    /// recorded) is the lowest.
    pub fn record(&self, session_id: &str) -> SessionTrust {
        match self.sessions.get(session_id) {
            // Never above what its own association says.
            Some(r) => SessionTrust {
                level: r.level.min(TrustLevel::of(&r.association, r.fork)),
                ..r.clone()
            },
            None => SessionTrust::new("unknown", "", false, false),
        }
    }

    pub fn judge(&self, session_id: &str) -> PriorUse {
        let record = self.record(session_id);
        match self.level {
            Some(level) if record.level >= level => PriorUse::Trusted(record),
            Some(_) if self.withhold_lower => PriorUse::Withheld,
            Some(_) | None => PriorUse::Untrusted(record),
        }
    }
}

/// Writes `view` where the session tools read it (`tools::sessions::TrustSource::File`): a
/// root-owned (fro-bot's) file the agent's uid can read but not change. It lives as long as the
/// returned handle.
pub fn write_view_file(view: &TrustView) -> std::io::Result<tempfile::NamedTempFile> {
    crate::confine::agent_readable_json("fro-bot-trust-", view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_association_fork_and_order() {
        assert_eq!(TrustLevel::of("OWNER", false), TrustLevel::Maintainer);
        assert_eq!(
            TrustLevel::of("COLLABORATOR", false),
            TrustLevel::Maintainer
        );
        assert_eq!(TrustLevel::of(WORKFLOW, false), TrustLevel::Maintainer);
        assert_eq!(
            TrustLevel::of("CONTRIBUTOR", false),
            TrustLevel::Contributor
        );
        for a in [
            "NONE",
            "FIRST_TIMER",
            "MANNEQUIN",
            "",
            "owner",
            "SOMETHING_NEW",
        ] {
            assert_eq!(TrustLevel::of(a, false), TrustLevel::Outsider, "{a}");
        }
        assert_eq!(TrustLevel::of("OWNER", true), TrustLevel::Outsider);
        assert!(TrustLevel::Outsider < TrustLevel::Contributor);
        assert!(TrustLevel::Contributor < TrustLevel::Maintainer);
    }

    #[test]
    fn records_only_go_down_and_keep_the_writing_run() {
        let mut run = SessionTrust::new("mona", "OWNER", false, false);
        run.run_id = "7".into();
        let eve = SessionTrust::new("eve", "NONE", false, false);
        let lowered = run.clone().lowered_by(&eve);
        assert_eq!(lowered.author, "eve");
        assert_eq!(lowered.level, TrustLevel::Outsider);
        assert_eq!(lowered.run_id, "7");
        // A more trusted writer never raises it.
        assert_eq!(lowered.clone().lowered_by(&run), lowered);
    }

    #[test]
    fn a_view_quotes_or_withholds_lower_sessions_and_unknown_levels_are_lowest() {
        let map: TrustMap = serde_json::from_str(
            r#"{"ses_m": {"level": "maintainer", "author": "mona", "association": "OWNER"},
                "ses_e": {"level": "outsider", "author": "eve", "association": "NONE"},
                "ses_x": {"level": "root", "author": "x", "association": "OWNER"},
                "ses_y": {"level": "maintainer", "author": "y", "association": "NONE"}}"#,
        )
        .unwrap();
        let comment = TrustView::new(TrustLevel::Maintainer, false, map.clone());
        assert!(matches!(comment.judge("ses_m"), PriorUse::Trusted(_)));
        assert!(matches!(comment.judge("ses_e"), PriorUse::Untrusted(t) if t.author == "eve"));
        assert!(matches!(comment.judge("ses_x"), PriorUse::Untrusted(_)));
        assert!(matches!(comment.judge("ses_y"), PriorUse::Untrusted(_)));
        assert!(matches!(comment.judge("ses_none"), PriorUse::Untrusted(_)));
        let schedule = TrustView::new(TrustLevel::Maintainer, true, map);
        assert!(matches!(schedule.judge("ses_m"), PriorUse::Trusted(_)));
        assert_eq!(schedule.judge("ses_e"), PriorUse::Withheld);
        assert_eq!(schedule.judge("ses_none"), PriorUse::Withheld);
        assert_eq!(TrustView::closed().judge("ses_m"), PriorUse::Withheld);
        assert!(matches!(
            TrustView::unknown().judge("ses_m"),
            PriorUse::Untrusted(_)
        ));
    }
}
