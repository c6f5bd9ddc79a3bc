//! Which sessions mention a search term, read from OpenCode's database itself (read-only, while
//! OpenCode runs): OpenCode's API lists every session but gives their text one session per
//! request, so finding prior work among thousands of sessions through it would cost thousands of
//! requests. The prior-work search reads here which sessions to fetch, then fetches only those
//! through the API (docs/persistence.md#every-thread-resumes). Bounded by time: a restored
//! database is untrusted and may be huge.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

/// What one scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// The sessions that mention a term, in the order they were given.
    pub found: Vec<String>,
    pub end: ScanEnd,
}

/// Why a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanEnd {
    /// As many sessions as were wanted were found.
    Enough,
    /// Every session given was read.
    Exhausted,
    /// The time ran out after reading `read` of the sessions given (the newest, in order).
    OutOfTime { read: usize },
}

/// The first `want` of `sessions` (in their order) whose parts mention one of `terms`, ignoring
/// ASCII case; reading stops at `budget`. Parts are OpenCode's JSON, so each term is looked for
/// as JSON writes it (a quote or a newline in it escaped).
pub fn sessions_mentioning(
    db: &Path,
    sessions: &[&str],
    terms: &[String],
    want: usize,
    budget: Duration,
) -> rusqlite::Result<Scan> {
    let needles = needles(terms);
    let deadline = Instant::now() + budget;
    let conn = open(db)?;
    let mut stmt = conn.prepare("SELECT data FROM part WHERE session_id = ?1")?;
    let mut found = Vec::new();
    if needles.is_empty() {
        return Ok(Scan {
            found,
            end: ScanEnd::Exhausted,
        });
    }
    for (read, id) in sessions.iter().enumerate() {
        if found.len() >= want {
            return Ok(Scan {
                found,
                end: ScanEnd::Enough,
            });
        }
        if Instant::now() >= deadline {
            return Ok(Scan {
                found,
                end: ScanEnd::OutOfTime { read },
            });
        }
        match mentions(&mut stmt, id, &needles, deadline)? {
            Mention::Yes => found.push(id.to_string()),
            Mention::No => {}
            Mention::OutOfTime => {
                return Ok(Scan {
                    found,
                    end: ScanEnd::OutOfTime { read },
                })
            }
        }
    }
    let end = match found.len() >= want {
        true => ScanEnd::Enough,
        false => ScanEnd::Exhausted,
    };
    Ok(Scan { found, end })
}

/// The database, read-only.
fn open(db: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// What one session's parts say.
enum Mention {
    Yes,
    No,
    /// The time ran out while reading them.
    OutOfTime,
}

/// The terms as they appear in a part's JSON, lowercased (ASCII); empty ones dropped.
fn needles(terms: &[String]) -> Vec<Vec<u8>> {
    terms
        .iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let quoted = serde_json::to_string(t).unwrap_or_default();
            let inner = quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .unwrap_or(&quoted);
            inner.to_ascii_lowercase().into_bytes()
        })
        .collect()
}

/// Whether any part of session `id` holds one of `needles`. The clock is read at every part (each
/// is one indexed step), so a session of very many parts cannot hold the scan past `deadline`.
fn mentions(
    stmt: &mut rusqlite::Statement<'_>,
    id: &str,
    needles: &[Vec<u8>],
    deadline: Instant,
) -> rusqlite::Result<Mention> {
    let mut rows = stmt.query([id])?;
    while let Some(row) = rows.next()? {
        if Instant::now() >= deadline {
            return Ok(Mention::OutOfTime);
        }
        let data = match row.get_ref(0)? {
            rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => t,
            _ => continue,
        };
        let lower = data.to_ascii_lowercase();
        if needles
            .iter()
            .any(|n| memchr::memmem::find(&lower, n).is_some())
        {
            return Ok(Mention::Yes);
        }
    }
    Ok(Mention::No)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(parts: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("opencode.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE part (id TEXT, session_id TEXT, data TEXT);")
            .unwrap();
        for (i, (session, text)) in parts.iter().enumerate() {
            let data = serde_json::json!({"type": "text", "text": text}).to_string();
            c.execute(
                "INSERT INTO part VALUES (?1, ?2, ?3)",
                rusqlite::params![format!("prt_{i}"), session, data],
            )
            .unwrap();
        }
        (dir, path)
    }

    #[test]
    fn finds_sessions_in_the_order_given_ignoring_case_and_json_escapes() {
        let (_dir, path) = db(&[
            ("ses_a", "nothing here"),
            ("ses_b", "The Quokka Gearbox slips"),
            ("ses_c", "she said \"quokka gearbox\"\nthen left"),
            ("ses_d", "gearbox"),
        ]);
        let terms = vec!["quokka gearbox".to_string(), "said \"quokka".to_string()];
        let order = ["ses_d", "ses_c", "ses_a", "ses_b"];
        let all = sessions_mentioning(&path, &order, &terms, 10, Duration::from_secs(5)).unwrap();
        assert_eq!(all.found, ["ses_c", "ses_b"]);
        assert_eq!(all.end, ScanEnd::Exhausted);
        let one = sessions_mentioning(&path, &order, &terms, 1, Duration::from_secs(5)).unwrap();
        assert_eq!(one.found, ["ses_c"]);
        assert_eq!(one.end, ScanEnd::Enough);
        let none = sessions_mentioning(&path, &order, &[" ".into()], 1, Duration::ZERO).unwrap();
        assert_eq!(none.found, Vec::<String>::new());
        assert_eq!(none.end, ScanEnd::Exhausted, "no term: nothing to look for");
    }

    #[test]
    fn a_scan_past_its_time_says_how_far_it_read() {
        let (_dir, path) = db(&[("ses_a", "quokka")]);
        let scan =
            sessions_mentioning(&path, &["ses_a"], &["quokka".into()], 1, Duration::ZERO).unwrap();
        assert_eq!(scan.end, ScanEnd::OutOfTime { read: 0 });
        assert!(scan.found.is_empty());
    }
}
