//! Which OpenCode session a run continues: the one fro-bot's session map records for the logical
//! key (`memory::session_map`), fetched by its id however many sessions memory holds, or — for
//! memory written before the map existed — the newest live root session of this workspace titled
//! `fro-bot: {logical key}`; else a new one with that title (a title also saves OpenCode's extra
//! title-generator LLM call).

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

/// Whether `s` is the session fro-bot recorded for the conversation (`id`) and still live: in
/// this workspace, a root session, not archived or compacting. Its title does not matter (and no
/// other session with that title is considered).
pub fn is_live_owned(s: &Session, directory: &str, id: &str) -> bool {
    s.id == id
        && s.directory == directory
        && s.time.archived.is_none()
        && s.time.compacting.is_none()
        && s.parent_id.is_none()
}

/// Resumes the conversation's session — the one fro-bot's map names, or for legacy memory the
/// newest with its title — or creates one.
pub async fn resolve(
    client: &Client,
    logical_key: &str,
    ownership: Ownership<'_>,
) -> Result<ResolvedSession, ApiError> {
    let title = title_for(logical_key);
    let found = match ownership {
        Ownership::Mapped(Some(id)) => owned(client, id).await?,
        Ownership::Mapped(None) => None,
        Ownership::ByTitle => by_title(client, &title).await?,
    };
    if let Some(session) = found {
        return Ok(ResolvedSession {
            session,
            resolution: Resolution::Resumed,
        });
    }
    let session = client.create_session(&title).await?;
    Ok(ResolvedSession {
        session,
        resolution: Resolution::Created,
    })
}

/// The session the map names, fetched by id (`GET /session/{id}`), never looked up in a listing:
/// a listing holds only the newest sessions, and a thread must resume however many conversations
/// were updated after it (docs/persistence.md#every-thread-resumes). `None` when it is gone
/// (pruned, deleted, sanitized away: 404) or no longer live.
async fn owned(client: &Client, id: &str) -> Result<Option<Session>, ApiError> {
    // OpenCode's route takes only ids matching `^ses` (anything else is its 500): a map entry
    // that is not one names no session.
    if !id.starts_with("ses") {
        tracing::debug!("the session map names {id:?}, which is no session id");
        return Ok(None);
    }
    match client.get_session(id).await {
        Ok(s) => Ok(is_live_owned(&s, client.directory(), id).then_some(s)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Legacy memory: the newest live root session with the title, among every session listed.
async fn by_title(client: &Client, title: &str) -> Result<Option<Session>, ApiError> {
    let listing = client.list_sessions().await?;
    if let Some(note) = listing
        .extent
        .note("the search for this thread's session by title")
    {
        tracing::warn!("{note}");
    }
    Ok(pick(&listing.sessions, client.directory(), title).cloned())
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
    fn an_owned_session_is_resumed_by_id_alone_and_only_if_live() {
        let t = "fro-bot: issue-1";
        let mine = s("ses_mine", "renamed", 100);
        assert!(
            is_live_owned(&mine, "/ws", "ses_mine"),
            "its title does not matter"
        );
        assert!(!is_live_owned(&mine, "/other", "ses_mine"), "elsewhere");
        assert!(!is_live_owned(&mine, "/ws", "ses_other"), "another id");
        let mut archived = s("ses_a", t, 900);
        archived.time.archived = Some(901);
        assert!(!is_live_owned(&archived, "/ws", "ses_a"), "archived");
        let mut compacting = s("ses_b", t, 900);
        compacting.time.compacting = Some(901);
        assert!(!is_live_owned(&compacting, "/ws", "ses_b"), "compacting");
        let mut child = s("ses_c", t, 900);
        child.parent_id = Some("ses_x".into());
        assert!(!is_live_owned(&child, "/ws", "ses_c"), "a sub-agent's");
    }
}
