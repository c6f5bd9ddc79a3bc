//! Which OpenCode session a run continues: the one fro-bot's session map records for the logical
//! key (`memory::session_map`), or — for memory written before the map existed — the newest live
//! root session of this workspace titled `fro-bot: {logical key}`; else a new one with that title
//! (a title also saves OpenCode's extra title-generator LLM call).

use super::client::{ApiError, Client, Session};

/// How resolution may find the session of one conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership<'a> {
    /// Only this session (or none: a new one is created).
    Mapped(Option<&'a str>),
    /// By title, for legacy memory.
    ByTitle,
}

pub fn title_for(logical_key: &str) -> String {
    format!("fro-bot: {logical_key}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Resumed,
    Created,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedSession {
    pub session: Session,
    pub resolution: Resolution,
}

/// A session that may be continued: in this workspace directory, not archived, not compacting, not
/// a child (sub-agent) session, with exactly this title.
pub fn is_candidate(s: &Session, directory: &str, title: &str) -> bool {
    s.directory == directory
        && s.title == title
        && s.time.archived.is_none()
        && s.time.compacting.is_none()
        && s.parent_id.is_none()
}

/// The session to resume among `sessions`: newest `time.updated` wins (ties: the larger id, which
/// OpenCode makes descending by creation, so the choice is deterministic).
pub fn pick<'a>(sessions: &'a [Session], directory: &str, title: &str) -> Option<&'a Session> {
    sessions
        .iter()
        .filter(|s| is_candidate(s, directory, title))
        .max_by(|a, b| {
            a.time
                .updated
                .cmp(&b.time.updated)
                .then_with(|| a.id.cmp(&b.id))
        })
}

/// The session fro-bot recorded for the conversation, if it is still live: in this workspace,
/// a root session, not archived or compacting. Its title does not matter (and no other session
/// with that title is considered).
pub fn pick_owned<'a>(sessions: &'a [Session], directory: &str, id: &str) -> Option<&'a Session> {
    sessions.iter().find(|s| {
        s.id == id
            && s.directory == directory
            && s.time.archived.is_none()
            && s.time.compacting.is_none()
            && s.parent_id.is_none()
    })
}

/// Resumes the conversation's session — the one fro-bot's map names, or for legacy memory the
/// newest with its title — or creates one.
pub async fn resolve(
    client: &Client,
    logical_key: &str,
    ownership: Ownership<'_>,
) -> Result<ResolvedSession, ApiError> {
    let title = title_for(logical_key);
    let sessions = client.list_sessions().await?;
    let found = match ownership {
        Ownership::Mapped(Some(id)) => pick_owned(&sessions, client.directory(), id),
        Ownership::Mapped(None) => None,
        Ownership::ByTitle => pick(&sessions, client.directory(), &title),
    };
    if let Some(s) = found {
        return Ok(ResolvedSession {
            session: s.clone(),
            resolution: Resolution::Resumed,
        });
    }
    let session = client.create_session(&title).await?;
    Ok(ResolvedSession {
        session,
        resolution: Resolution::Created,
    })
}

#[cfg(test)]
mod tests {
    use super::super::client::SessionTime;
    use super::*;

    fn s(id: &str, title: &str, updated: i64) -> Session {
        Session {
            id: id.into(),
            title: title.into(),
            directory: "/ws".into(),
            project_id: "p".into(),
            parent_id: None,
            time: SessionTime {
                created: 1,
                updated,
                compacting: None,
                archived: None,
            },
        }
    }

    #[test]
    fn newest_live_root_with_the_exact_title_wins() {
        let t = "fro-bot: issue-1";
        let mut archived = s("ses_a", t, 900);
        archived.time.archived = Some(901);
        let mut compacting = s("ses_b", t, 800);
        compacting.time.compacting = Some(801);
        let mut child = s("ses_c", t, 700);
        child.parent_id = Some("ses_x".into());
        let mut elsewhere = s("ses_d", t, 600);
        elsewhere.directory = "/other".into();
        let sessions = vec![
            archived,
            compacting,
            child,
            elsewhere,
            s("ses_e", "fro-bot: issue-10", 500),
            s("ses_f", t, 100),
            s("ses_g", t, 300),
            s("ses_h", "fro-bot: issue-1 ", 400),
        ];
        assert_eq!(pick(&sessions, "/ws", t).unwrap().id, "ses_g");
        assert!(pick(&sessions, "/ws", "fro-bot: issue-2").is_none());
        assert_eq!(title_for("pr-7"), "fro-bot: pr-7");
    }

    #[test]
    fn an_owned_session_is_found_by_id_alone_and_only_if_live() {
        let t = "fro-bot: issue-1";
        let mut archived = s("ses_a", t, 900);
        archived.time.archived = Some(901);
        let mut planted = s("ses_p", t, 9_999_999_999_999);
        planted.time.created = 9_999_999_999_999;
        let sessions = vec![archived, planted, s("ses_mine", "renamed", 100)];
        assert_eq!(
            pick_owned(&sessions, "/ws", "ses_mine").unwrap().id,
            "ses_mine"
        );
        assert!(pick_owned(&sessions, "/ws", "ses_a").is_none(), "archived");
        assert!(
            pick_owned(&sessions, "/other", "ses_mine").is_none(),
            "elsewhere"
        );
        assert!(pick_owned(&sessions, "/ws", "ses_gone").is_none());
    }
}
