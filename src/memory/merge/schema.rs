//! What a database declares: its tables, their keys and references, and a fingerprint of the
//! migration set and schema text (two databases merge only when the fingerprints are equal).
//!
//! References come from declared foreign keys first. OpenCode 1.18 also ties rows to sessions
//! without declaring it; those links are found by column name (rules applied only to columns that
//! have no declared foreign key):
//! - `parent_id` in a table whose primary key is `id` → that table's `id` (child sessions);
//! - `aggregate_id` → `session.id`: OpenCode's event store keeps one aggregate per session
//!   (`event_sequence.aggregate_id` is the session id; `event` reaches it by a declared key);
//! - `<name>_id` where a table `<name>` with a one-column primary key exists → that key
//!   (`part.session_id` → `session`, `session.workspace_id` → `workspace`).

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::Connection;
use sha2::{Digest, Sha256};

use super::{MergeError, Role};

/// The table whose rows are the unit of merging.
pub const SESSION_TABLE: &str = "session";
/// Its column holding the time of the latest activity (ms), which decides conflicts.
pub const ACTIVITY_COLUMN: &str = "time_updated";
/// Tables listing applied migrations; their first key column is part of the fingerprint.
/// OpenCode 1.18 has `migration` (schema) and `data_migration` (data backfills).
pub const MIGRATION_TABLES: &[&str] = &["migration", "data_migration", "__drizzle_migrations"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefOrigin {
    Declared,
    ParentId,
    Aggregate,
    NamedAfterTable,
}

/// `table.column` references `target.target_column` (single-column links only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub column: String,
    pub target: String,
    pub target_column: String,
    pub origin: RefOrigin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: String,
    pub columns: Vec<String>,
    pub primary_key: Vec<String>,
    pub references: Vec<Reference>,
    /// Targets of declared multi-column foreign keys (only ordered, never followed).
    pub composite_targets: Vec<String>,
}

impl Table {
    /// The single-column primary key, if it has one.
    pub fn single_key(&self) -> Option<&str> {
        match self.primary_key.as_slice() {
            [k] => Some(k),
            _ => None,
        }
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|c| c == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// `table:id` for every applied migration, sorted.
    pub migrations: Vec<String>,
    /// SHA-256 of the sorted `CREATE` statements of every table and index.
    pub schema_digest: String,
    /// The statements themselves, by object name (for a readable mismatch message).
    pub objects: BTreeMap<String, String>,
}

impl Fingerprint {
    /// Why `self` (base) and `other` (ours) may not be merged, or `None` when they may.
    pub fn mismatch(&self, other: &Fingerprint) -> Option<MergeError> {
        if self.migrations != other.migrations {
            let a: BTreeSet<_> = self.migrations.iter().collect();
            let b: BTreeSet<_> = other.migrations.iter().collect();
            let only_base: Vec<_> = a.difference(&b).map(|s| s.as_str()).collect();
            let only_ours: Vec<_> = b.difference(&a).map(|s| s.as_str()).collect();
            return Some(MergeError::MigrationMismatch {
                only_base: only_base.join(", "),
                only_ours: only_ours.join(", "),
            });
        }
        if self.schema_digest != other.schema_digest {
            let names: BTreeSet<_> = self.objects.keys().chain(other.objects.keys()).collect();
            let differing: Vec<_> = names
                .into_iter()
                .filter(|n| self.objects.get(*n) != other.objects.get(*n))
                .map(|s| s.as_str())
                .collect();
            return Some(MergeError::SchemaMismatch {
                objects: differing.join(", "),
            });
        }
        None
    }
}

#[derive(Debug, Clone)]
pub struct Schema {
    pub tables: BTreeMap<String, Table>,
    pub fingerprint: Fingerprint,
}

pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

impl Schema {
    /// Reads the schema `conn`'s main database declares. Triggers, views and virtual tables are
    /// refused: OpenCode declares none, and each could run code while we copy rows.
    pub fn read(conn: &Connection, role: Role) -> Result<Schema, MergeError> {
        let read = |source| MergeError::read(role, source);
        let (objects, table_names) = read_objects(conn, role)?;
        let mut tables = BTreeMap::new();
        for name in &table_names {
            tables.insert(name.clone(), read_table(conn, name).map_err(read)?);
        }
        add_name_rules(&mut tables);
        let session = tables
            .get(SESSION_TABLE)
            .ok_or_else(|| MergeError::NotASessionDatabase {
                role,
                missing: format!("table `{SESSION_TABLE}`"),
            })?;
        if session.single_key().is_none() || !session.has_column(ACTIVITY_COLUMN) {
            return Err(MergeError::NotASessionDatabase {
                role,
                missing: format!("a one-column key and `{ACTIVITY_COLUMN}` in `{SESSION_TABLE}`"),
            });
        }
        let migrations = read_migrations(conn, &tables).map_err(read)?;
        Ok(Schema {
            tables,
            fingerprint: Fingerprint {
                migrations,
                schema_digest: digest(&objects),
                objects,
            },
        })
    }

    pub fn session(&self) -> &Table {
        // Invariant: `read` refuses a schema without a session table.
        &self.tables[SESSION_TABLE]
    }

    /// Parents before children (by every reference except self-references); a cycle is broken in
    /// name order. Deleting goes in the reverse order.
    pub fn dependency_order(&self) -> Vec<&Table> {
        let mut done: BTreeSet<&str> = BTreeSet::new();
        let mut order = Vec::new();
        while order.len() < self.tables.len() {
            let ready: Vec<&Table> = self
                .tables
                .values()
                .filter(|t| !done.contains(t.name.as_str()))
                .filter(|t| {
                    t.references
                        .iter()
                        .map(|r| r.target.as_str())
                        .chain(t.composite_targets.iter().map(String::as_str))
                        .filter(|target| *target != t.name && self.tables.contains_key(*target))
                        .all(|target| done.contains(target))
                })
                .collect();
            let next = if ready.is_empty() {
                // A cycle: take the first remaining table by name.
                self.tables
                    .values()
                    .filter(|t| !done.contains(t.name.as_str()))
                    .take(1)
                    .collect()
            } else {
                ready
            };
            for t in next {
                done.insert(&t.name);
                order.push(t);
            }
        }
        order
    }
}

/// Every table and index by name with its normalized `CREATE` text, and the table names. Anything
/// else (trigger, view, virtual table) is refused.
fn read_objects(
    conn: &Connection,
    role: Role,
) -> Result<(BTreeMap<String, String>, Vec<String>), MergeError> {
    let read = |source| MergeError::read(role, source);
    let mut objects = BTreeMap::new();
    let mut table_names = Vec::new();
    let mut stmt = conn
        .prepare("SELECT type, name, sql FROM main.sqlite_schema ORDER BY name")
        .map_err(read)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .map_err(read)?;
    for row in rows {
        let (kind, name, sql) = row.map_err(read)?;
        let sql = sql.unwrap_or_default();
        let virtual_table = sql
            .trim_start()
            .get(..20)
            .is_some_and(|p| p.eq_ignore_ascii_case("CREATE VIRTUAL TABLE"));
        let refused = match kind.as_str() {
            "table" if virtual_table => Some("virtual table"),
            "table" | "index" => None,
            other => Some(other),
        };
        if let Some(kind) = refused {
            return Err(MergeError::UnexpectedSchemaObject {
                role,
                kind: kind.to_string(),
                name,
            });
        }
        // SQLite's own objects (autoindexes, sqlite_sequence) follow from the rest.
        if name.starts_with("sqlite_") {
            continue;
        }
        if kind == "table" {
            table_names.push(name.clone());
        }
        objects.insert(name, normalize(&sql));
    }
    Ok((objects, table_names))
}

fn digest(objects: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (name, sql) in objects {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(sql.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

/// Whitespace-insensitive schema text, so a re-indented but identical statement matches.
fn normalize(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read_table(conn: &Connection, name: &str) -> rusqlite::Result<Table> {
    let mut columns = Vec::new();
    let mut keyed = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT name, pk FROM pragma_table_info(?1, 'main')")?;
        let rows = stmt.query_map([name], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (col, pk) = row?;
            if pk > 0 {
                keyed.push((pk, col.clone()));
            }
            columns.push(col);
        }
    }
    keyed.sort();
    let primary_key: Vec<String> = keyed.into_iter().map(|(_, c)| c).collect();
    // (id, seq, table, from, to)
    let mut fks: BTreeMap<i64, Vec<(String, String, Option<String>)>> = BTreeMap::new();
    {
        let mut stmt = conn.prepare(
            "SELECT id, \"table\", \"from\", \"to\" FROM pragma_foreign_key_list(?1, 'main') \
             ORDER BY id, seq",
        )?;
        let rows = stmt.query_map([name], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        for row in rows {
            let (id, target, from, to) = row?;
            fks.entry(id).or_default().push((target, from, to));
        }
    }
    let mut references = Vec::new();
    let mut composite_targets = Vec::new();
    for (_, cols) in fks {
        match cols.as_slice() {
            [(target, from, to)] => references.push(Reference {
                column: from.clone(),
                target: target.clone(),
                // `to` is NULL when the key names the target's primary key implicitly; resolved
                // in `add_name_rules`, once every table is known.
                target_column: to.clone().unwrap_or_default(),
                origin: RefOrigin::Declared,
            }),
            [(target, ..), ..] => composite_targets.push(target.clone()),
            [] => {}
        }
    }
    Ok(Table {
        name: name.to_string(),
        columns,
        primary_key,
        references,
        composite_targets,
    })
}

/// Resolves implicit foreign-key targets and adds the column-name rules of the module docs.
fn add_name_rules(tables: &mut BTreeMap<String, Table>) {
    let keys: BTreeMap<String, Option<String>> = tables
        .iter()
        .map(|(n, t)| (n.clone(), t.single_key().map(str::to_string)))
        .collect();
    let session_key = keys.get(SESSION_TABLE).cloned().flatten();
    for table in tables.values_mut() {
        for r in &mut table.references {
            if r.target_column.is_empty() {
                r.target_column = keys.get(&r.target).cloned().flatten().unwrap_or_default();
            }
        }
        table.references.retain(|r| !r.target_column.is_empty());
        let declared: BTreeSet<String> =
            table.references.iter().map(|r| r.column.clone()).collect();
        let own_key = table.single_key().map(str::to_string);
        let mut added = Vec::new();
        for col in table.columns.iter().filter(|c| !declared.contains(*c)) {
            let rule = if col == "parent_id" && own_key.as_deref() == Some("id") {
                Some((table.name.clone(), "id".to_string(), RefOrigin::ParentId))
            } else if col == "aggregate_id" {
                session_key
                    .clone()
                    .map(|k| (SESSION_TABLE.to_string(), k, RefOrigin::Aggregate))
            } else {
                col.strip_suffix("_id")
                    .filter(|prefix| !prefix.is_empty())
                    .and_then(|prefix| {
                        keys.get(prefix)
                            .cloned()
                            .flatten()
                            .map(|k| (prefix.to_string(), k, RefOrigin::NamedAfterTable))
                    })
            };
            if let Some((target, target_column, origin)) = rule {
                added.push(Reference {
                    column: col.clone(),
                    target,
                    target_column,
                    origin,
                });
            }
        }
        table.references.extend(added);
    }
}

fn read_migrations(
    conn: &Connection,
    tables: &BTreeMap<String, Table>,
) -> rusqlite::Result<Vec<String>> {
    let mut out = Vec::new();
    for name in MIGRATION_TABLES {
        let Some(table) = tables.get(*name) else {
            continue;
        };
        let Some(col) = table.primary_key.first().or(table.columns.first()) else {
            continue;
        };
        let sql = format!(
            "SELECT CAST({c} AS TEXT) FROM main.{t}",
            c = quote(col),
            t = quote(name)
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], |r| r.get::<_, Option<String>>(0))?;
        for row in rows {
            out.push(format!("{name}:{}", row?.unwrap_or_default()));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = include_str!("../../../tests/it/fixtures/opencode-1.18.33-schema.sql");

    fn opencode() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

    fn refs(s: &Schema, table: &str) -> Vec<(String, String, RefOrigin)> {
        s.tables[table]
            .references
            .iter()
            .map(|r| (r.column.clone(), r.target.clone(), r.origin))
            .collect()
    }

    #[test]
    fn finds_declared_and_undeclared_session_links_in_opencode_1_18() {
        let s = Schema::read(&opencode(), Role::Base).unwrap();
        let own = |c: &str, t: &str, o| (c.to_string(), t.to_string(), o);
        assert_eq!(
            refs(&s, "part"),
            [
                own("message_id", "message", RefOrigin::Declared),
                own("session_id", "session", RefOrigin::NamedAfterTable)
            ]
        );
        assert_eq!(
            refs(&s, "session"),
            [
                own("project_id", "project", RefOrigin::Declared),
                own("workspace_id", "workspace", RefOrigin::NamedAfterTable),
                own("parent_id", "session", RefOrigin::ParentId),
            ]
        );
        assert_eq!(
            refs(&s, "event_sequence"),
            [own("aggregate_id", "session", RefOrigin::Aggregate)]
        );
        assert_eq!(
            refs(&s, "event"),
            [own("aggregate_id", "event_sequence", RefOrigin::Declared)]
        );
        // Columns that only look like links stay plain.
        assert!(refs(&s, "credential").is_empty());
        assert_eq!(s.tables["todo"].primary_key, ["session_id", "position"]);
        let order: Vec<&str> = s
            .dependency_order()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        let pos = |n: &str| order.iter().position(|t| *t == n).unwrap();
        assert!(pos("project") < pos("workspace") && pos("workspace") < pos("session"));
        assert!(pos("session") < pos("message") && pos("message") < pos("part"));
        assert!(pos("event_sequence") < pos("event"));
    }

    #[test]
    fn fingerprint_names_the_differing_migrations_and_objects() {
        let a = opencode();
        let b = opencode();
        a.execute_batch("INSERT INTO migration VALUES ('0001_init', 1), ('0002_x', 2);")
            .unwrap();
        b.execute_batch("INSERT INTO migration VALUES ('0001_init', 1), ('0003_y', 3);")
            .unwrap();
        let fa = Schema::read(&a, Role::Base).unwrap().fingerprint;
        let fb = Schema::read(&b, Role::Ours).unwrap().fingerprint;
        match fa.mismatch(&fb) {
            Some(MergeError::MigrationMismatch {
                only_base,
                only_ours,
            }) => {
                assert_eq!(only_base, "migration:0002_x");
                assert_eq!(only_ours, "migration:0003_y");
            }
            other => panic!("{other:?}"),
        }
        b.execute_batch(
            "DELETE FROM migration WHERE id = '0003_y'; INSERT INTO migration VALUES ('0002_x', 9);
             CREATE INDEX extra_idx ON message(time_updated);",
        )
        .unwrap();
        let fb = Schema::read(&b, Role::Ours).unwrap().fingerprint;
        match fa.mismatch(&fb) {
            Some(MergeError::SchemaMismatch { objects }) => assert_eq!(objects, "extra_idx"),
            other => panic!("{other:?}"),
        }
        b.execute_batch("DROP INDEX extra_idx").unwrap();
        let fb = Schema::read(&b, Role::Ours).unwrap().fingerprint;
        assert!(fa.mismatch(&fb).is_none());
    }

    #[test]
    fn triggers_views_and_virtual_tables_are_refused() {
        for extra in [
            "CREATE TRIGGER t AFTER INSERT ON message BEGIN DELETE FROM session; END;",
            "CREATE VIEW v AS SELECT * FROM session;",
            "CREATE VIRTUAL TABLE vt USING rtree(id, a, b);",
        ] {
            let c = opencode();
            c.execute_batch(extra).unwrap();
            match Schema::read(&c, Role::Base) {
                Err(MergeError::UnexpectedSchemaObject { role, .. }) => {
                    assert_eq!(role, Role::Base)
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_database_without_sessions_is_named_as_such() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE notes(x)").unwrap();
        assert!(matches!(
            Schema::read(&c, Role::Ours),
            Err(MergeError::NotASessionDatabase {
                role: Role::Ours,
                ..
            })
        ));
    }
}
