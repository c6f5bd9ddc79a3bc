//! A turn's exchanges kept whole in OpenCode's order from the start (docs/persistence.md
//! #both-runs-continued-one-session). OpenCode reads a session's history ordered by
//! `(time_created, id)`, so the turns of two runs that overlapped in time interleave there: one
//! run's question, the other's, then both answers. Before anything of a turn is saved, each of its
//! answers takes its question's creation time ([`keep_together`]): the exchange is then one
//! instant of that order (its messages ordered by id, which ascends with creation), wholly before
//! or after any other run's, and no merge has to move it. Only rows no other copy of memory holds
//! yet are changed: moving a row another copy holds would bring it back twice at a later merge.

use std::collections::BTreeSet;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::graph::MESSAGE_TABLE;
use super::rows::step;
use super::schema::quote;
use super::{harden, open_error, MergeError, Role};

/// Each answer among `own` (an assistant message whose `parentID` is a user message among `own`,
/// in the same session) takes that question's creation time, in `time_created` and in its data's
/// `time.created`; `db` is written in place, in one transaction. How many answers moved.
///
/// `own` must be messages only this database holds (the turn's, `messages_added`). Ids never
/// change: an answer's id was made after its question's, so it still sorts after it.
pub fn keep_together(db: &Path, own: &BTreeSet<String>) -> Result<usize, MergeError> {
    if own.is_empty() {
        return Ok(0);
    }
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_error(Role::Ours, db, e))?;
    harden(&conn).map_err(|e| open_error(Role::Ours, db, e))?;
    let json = |alias: &str, path: &str| {
        format!(
            "(CASE WHEN json_valid({alias}.data) THEN json_extract({alias}.data, '{path}') END)"
        )
    };
    let t = quote(MESSAGE_TABLE);
    let sql = format!(
        "UPDATE main.{t} AS a SET time_created = q.time_created, \
           data = json_set(a.data, '$.time.created', q.time_created) \
         FROM main.{t} AS q \
         WHERE a.id IN (SELECT id FROM temp.together_own) \
           AND q.id IN (SELECT id FROM temp.together_own) \
           AND {a_role} = 'assistant' AND q.id = {a_parent} AND q.session_id = a.session_id \
           AND {q_role} = 'user' AND typeof(q.time_created) = 'integer' \
           AND a.time_created > q.time_created",
        a_role = json("a", "$.role"),
        a_parent = json("a", "$.parentID"),
        q_role = json("q", "$.role"),
    );
    step("keeping this turn's exchanges together", || {
        conn.execute_batch("BEGIN IMMEDIATE; CREATE TEMP TABLE together_own(id PRIMARY KEY);")?;
        {
            let mut insert = conn.prepare("INSERT OR IGNORE INTO temp.together_own VALUES (?1)")?;
            for id in own {
                insert.execute([id])?;
            }
        }
        let moved = conn.execute(&sql, [])?;
        conn.execute_batch("COMMIT")?;
        Ok(moved)
    })
}
