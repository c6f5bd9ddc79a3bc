//! Statements both ways of writing a merge share: a named step's error, listing session ids in a
//! temp table, and copying or comparing the rows of tied tables for the sessions listed.

use rusqlite::Connection;

use super::graph::Graph;
use super::schema::{quote, Schema};
use super::MergeError;

/// The attached name of this run's database inside the output connection.
pub const OURS: &str = "ours";

pub fn step<T>(name: &str, f: impl FnOnce() -> rusqlite::Result<T>) -> Result<T, MergeError> {
    f().map_err(|source| MergeError::Write {
        step: name.to_string(),
        source,
    })
}

/// Replaces the ids in `temp.<table>(id)` with `ids`. `table` is one of the merge's own temp
/// tables, never a name from a database.
pub fn fill<'a>(
    conn: &Connection,
    table: &str,
    ids: impl Iterator<Item = &'a String>,
) -> Result<(), MergeError> {
    step(&format!("listing sessions ({table})"), || {
        conn.execute(&format!("DELETE FROM temp.{table}"), [])?;
        let mut stmt = conn.prepare(&format!("INSERT OR IGNORE INTO temp.{table} VALUES (?1)"))?;
        for id in ids {
            stmt.execute([id])?;
        }
        Ok(())
    })
}

/// `table`'s columns, quoted, as the schema lists them (`prefix.` before each when given).
pub fn column_list(schema: &Schema, table: &str, prefix: Option<&str>) -> String {
    schema.tables[table]
        .columns
        .iter()
        .map(|c| match prefix {
            Some(p) => format!("{p}.{}", quote(c)),
            None => quote(c),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Inserts this run's rows of every tied table for the sessions in `temp.<ids>`, parents first.
pub fn insert_tied(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    ids: &str,
) -> Result<u64, MergeError> {
    let mut inserted = 0;
    for table in graph.tied_order() {
        let cols = column_list(schema, table, None);
        let sql = format!(
            "INSERT INTO main.{t} ({cols}) SELECT {cols} FROM {OURS}.{t} WHERE {p}",
            t = quote(table),
            p = graph.predicate(OURS, table, ids)
        );
        inserted += step(&format!("inserting into {table}"), || {
            conn.execute(&sql, [])
        })? as u64;
    }
    Ok(inserted)
}

/// Deletes the output's rows of every tied table for the sessions in `temp.<ids>`, children
/// first.
pub fn delete_tied(conn: &Connection, graph: &Graph, ids: &str) -> Result<u64, MergeError> {
    let mut deleted = 0;
    for table in graph.tied_order().iter().rev() {
        let sql = format!(
            "DELETE FROM main.{} WHERE {}",
            quote(table),
            graph.predicate("main", table, ids)
        );
        deleted += step(&format!("deleting from {table}"), || conn.execute(&sql, []))? as u64;
    }
    Ok(deleted)
}

/// How many of `table`'s rows for the sessions in `temp.<ids>` one side holds and the other does
/// not, over `columns` (both ways).
pub fn differing_rows(
    conn: &Connection,
    graph: &Graph,
    table: &str,
    columns: &[&str],
    ids: &str,
) -> Result<i64, MergeError> {
    let cols = columns
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ");
    let side = |db: &str| {
        format!(
            "SELECT {cols} FROM {db}.{t} WHERE {p}",
            t = quote(table),
            p = graph.predicate(db, table, ids)
        )
    };
    let (o, b) = (side(OURS), side("main"));
    let sql = format!(
        "SELECT (SELECT count(*) FROM ({o} EXCEPT {b})) + (SELECT count(*) FROM ({b} EXCEPT {o}))"
    );
    step(&format!("comparing {table}"), || {
        conn.query_row(&sql, [], |r| r.get(0))
    })
}
