//! Which tables hold rows tied to a session, and how to select them.
//!
//! - **tied**: the `session` table itself, and every table with a reference (declared or by the
//!   name rules in `schema`) to `session` or to another tied table. Their rows move with the
//!   session.
//! - **parents**: tables a tied table references that are not tied themselves (`project`,
//!   `workspace`, and what those reference). A carried session brings the parent rows it needs when
//!   the base lacks them; the base's existing rows win.
//! - **attachments**: untied tables referencing a parent (`project_directory`, `permission`): this
//!   run's rows for a carried parent are added when the base lacks them.
//!
//! Everything else (accounts, credentials, migrations) is the base's, untouched.

use std::collections::{BTreeMap, BTreeSet};

use super::schema::{quote, RefOrigin, Reference, Schema, Table, SESSION_TABLE};

/// The tied table whose rows the report counts as lost messages.
pub const MESSAGE_TABLE: &str = "message";

/// How a tied table's rows are selected for a set of session ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// The session table: its key is the session id.
    Key { column: String },
    /// A column holding the session id.
    Direct { column: String },
    /// A column referencing `target.target_column`, a tied table selected by its own link.
    Via {
        column: String,
        target: String,
        target_column: String,
    },
}

#[derive(Debug, Clone)]
pub struct Graph {
    tied: BTreeMap<String, Link>,
    /// Tied tables in dependency order (parents first).
    tied_order: Vec<String>,
    parents: BTreeSet<String>,
    /// (attachment table, its references to parents)
    attachments: Vec<(String, Vec<Reference>)>,
    parent_column: Option<String>,
    message_key: Option<String>,
}

impl Graph {
    pub fn new(schema: &Schema) -> Graph {
        let session = schema.session();
        let tied = tied_tables(schema);
        let parents = parents_of(schema, &tied);
        let attachments = attachments_of(schema, &tied, &parents);
        let tied_order = schema
            .dependency_order()
            .into_iter()
            .filter(|t| tied.contains_key(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let parent_column = session
            .references
            .iter()
            .find(|r| r.origin == RefOrigin::ParentId)
            .map(|r| r.column.clone());
        let message_key = schema
            .tables
            .get(MESSAGE_TABLE)
            .filter(|t| tied.contains_key(&t.name))
            .and_then(|t| t.single_key())
            .map(str::to_string);
        Graph {
            tied,
            tied_order,
            parents,
            attachments,
            parent_column,
            message_key,
        }
    }

    #[cfg(test)]
    pub fn tied(&self) -> impl Iterator<Item = (&String, &Link)> {
        self.tied.iter()
    }

    /// Whether `table`'s rows move with a session.
    pub fn is_tied(&self, table: &str) -> bool {
        self.tied.contains_key(table)
    }

    /// Tied tables, parents first.
    pub fn tied_order(&self) -> &[String] {
        &self.tied_order
    }

    pub fn is_parent(&self, table: &str) -> bool {
        self.parents.contains(table)
    }

    pub fn attachments(&self) -> &[(String, Vec<Reference>)] {
        &self.attachments
    }

    /// The session table's column naming the parent session.
    pub fn parent_column(&self) -> Option<&str> {
        self.parent_column.as_deref()
    }

    /// The key of the tied `message` table, whose rows the report counts as a turn's messages.
    pub fn message_key(&self) -> Option<&str> {
        self.message_key.as_deref()
    }

    /// Tied tables with at most one row per session: linked directly by their whole primary key.
    pub fn singletons<'a>(&'a self, schema: &'a Schema) -> Vec<(&'a Table, &'a str)> {
        let mut out = Vec::new();
        for (name, link) in &self.tied {
            let Some(table) = schema.tables.get(name) else {
                continue;
            };
            match link {
                Link::Key { .. } | Link::Via { .. } => {}
                Link::Direct { column } => {
                    if table.single_key() == Some(column.as_str()) {
                        out.push((table, column.as_str()));
                    }
                }
            }
        }
        out
    }

    /// SQL condition selecting `table`'s rows (in database `db`) tied to the session ids listed in
    /// `temp.<ids>`. `table` must be tied.
    pub fn predicate(&self, db: &str, table: &str, ids: &str) -> String {
        let set = format!("(SELECT id FROM temp.{})", quote(ids));
        match self.tied.get(table) {
            Some(Link::Key { column } | Link::Direct { column }) => {
                format!("{} IN {set}", quote(column))
            }
            Some(Link::Via {
                column,
                target,
                target_column,
            }) => format!(
                "{} IN (SELECT {} FROM {}.{} WHERE {})",
                quote(column),
                quote(target_column),
                quote(db),
                quote(target),
                self.predicate(db, target, ids)
            ),
            // Not tied: selects nothing.
            None => "0".to_string(),
        }
    }
}

/// The session table and every table tied to it, each with how its rows are selected: direct
/// links first, then breadth-first through tied tables, so the shortest path wins.
fn tied_tables(schema: &Schema) -> BTreeMap<String, Link> {
    let mut tied: BTreeMap<String, Link> = BTreeMap::new();
    tied.insert(
        SESSION_TABLE.to_string(),
        Link::Key {
            column: schema.session().single_key().unwrap_or("id").to_string(),
        },
    );
    for t in schema.tables.values().filter(|t| t.name != SESSION_TABLE) {
        if let Some(r) = t.references.iter().find(|r| r.target == SESSION_TABLE) {
            tied.insert(
                t.name.clone(),
                Link::Direct {
                    column: r.column.clone(),
                },
            );
        }
    }
    loop {
        let mut added = Vec::new();
        for t in schema
            .tables
            .values()
            .filter(|t| !tied.contains_key(&t.name))
        {
            if let Some(r) = t
                .references
                .iter()
                .find(|r| r.target != t.name && tied.contains_key(&r.target))
            {
                added.push((
                    t.name.clone(),
                    Link::Via {
                        column: r.column.clone(),
                        target: r.target.clone(),
                        target_column: r.target_column.clone(),
                    },
                ));
            }
        }
        if added.is_empty() {
            break;
        }
        tied.extend(added);
    }
    tied
}

/// Untied tables referencing a parent, with those references.
fn attachments_of(
    schema: &Schema,
    tied: &BTreeMap<String, Link>,
    parents: &BTreeSet<String>,
) -> Vec<(String, Vec<Reference>)> {
    schema
        .tables
        .values()
        .filter(|t| !tied.contains_key(&t.name))
        .filter_map(|t| {
            let refs: Vec<Reference> = t
                .references
                .iter()
                .filter(|r| r.target != t.name && parents.contains(&r.target))
                .cloned()
                .collect();
            (!refs.is_empty()).then(|| (t.name.clone(), refs))
        })
        .collect()
}

/// Untied tables reachable from tied tables by references, transitively.
fn parents_of(schema: &Schema, tied: &BTreeMap<String, Link>) -> BTreeSet<String> {
    let mut parents = BTreeSet::new();
    let mut frontier: Vec<&str> = tied.keys().map(String::as_str).collect();
    while let Some(name) = frontier.pop() {
        let Some(t) = schema.tables.get(name) else {
            continue;
        };
        for r in &t.references {
            if !tied.contains_key(&r.target)
                && schema.tables.contains_key(&r.target)
                && parents.insert(r.target.clone())
            {
                frontier.push(r.target.as_str());
            }
        }
    }
    parents
}

#[cfg(test)]
mod tests {
    use super::super::Role;
    use super::*;
    use rusqlite::Connection;

    const SCHEMA: &str = include_str!("../../../tests/it/fixtures/opencode-1.18.33-schema.sql");

    #[test]
    fn opencode_1_18_tables_fall_into_tied_parents_and_attachments() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        let schema = Schema::read(&c, Role::Base).unwrap();
        let g = Graph::new(&schema);
        let tied: BTreeSet<&str> = g.tied().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            tied,
            BTreeSet::from([
                "event",
                "event_sequence",
                "message",
                "part",
                "session",
                "session_context_epoch",
                "session_input",
                "session_message",
                "session_share",
                "todo",
            ])
        );
        assert_eq!(
            g.tied.get("event"),
            Some(&Link::Via {
                column: "aggregate_id".into(),
                target: "event_sequence".into(),
                target_column: "aggregate_id".into(),
            }),
            "event reaches its session through its declared key"
        );
        assert!(g.is_parent("project") && g.is_parent("workspace"));
        let att: BTreeSet<&str> = g.attachments().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            att,
            BTreeSet::from(["permission", "project_directory", "workspace"])
        );
        let singles: BTreeSet<&str> = g
            .singletons(&schema)
            .iter()
            .map(|(t, _)| t.name.as_str())
            .collect();
        assert_eq!(
            singles,
            BTreeSet::from(["event_sequence", "session_context_epoch", "session_share"])
        );
        assert_eq!(g.parent_column(), Some("parent_id"));
    }

    #[test]
    fn a_table_tied_only_through_another_is_selected_through_it() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE session(id text primary key, time_updated integer not null);
             CREATE TABLE message(id text primary key, sid text references session(id));
             CREATE TABLE attachment(id text primary key, msg text references message(id));",
        )
        .unwrap();
        let schema = Schema::read(&c, Role::Base).unwrap();
        let g = Graph::new(&schema);
        assert_eq!(
            g.predicate("ours", "attachment", "ids"),
            "\"msg\" IN (SELECT \"id\" FROM \"ours\".\"message\" WHERE \"sid\" IN (SELECT id FROM temp.\"ids\"))"
        );
        assert_eq!(g.tied_order(), ["session", "message", "attachment"]);
    }
}
