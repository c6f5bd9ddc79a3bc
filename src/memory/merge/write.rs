//! Writing the merge: copy the base with SQLite's backup API (a consistent snapshot, WAL
//! included), attach this run's database read-only, and in one transaction replace each tree the
//! plan takes, join each tree both runs continued (`exchanges`, `join`), carry the parent rows
//! they need, and check the keys of what was written.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::exchanges::{self, Joining, Sides, TreeJoin};
use super::graph::{Graph, MESSAGE_TABLE};
use super::plan::{self, Change, Decision, Side, TreePlan, Versions};
use super::rows::{column_list, fill, step, OURS};
use super::schema::{quote, RefOrigin, Schema};
use super::snapshot::read_versions;
use super::{
    harden, join, open_read_only, Conflict, KeptBoth, MergeError, MergeOptions, MergeReport, Role,
    Snapshot, Taken, Verify,
};

/// Bounded wait when the base is being written while we copy it.
const COPY_BUSY_RETRIES: u32 = 100;

pub(super) fn run(
    base: &Path,
    ours: &Path,
    restored: &Snapshot,
    out: &Path,
    options: MergeOptions<'_>,
    only: Option<&BTreeSet<String>>,
) -> Result<MergeReport, MergeError> {
    let base_conn = open_read_only(base, Role::Base)?;
    let base_schema = Schema::read(&base_conn, Role::Base)?;
    let ours_conn = open_read_only(ours, Role::Ours)?;
    let ours_schema = Schema::read(&ours_conn, Role::Ours)?;
    if let Some(e) = base_schema.fingerprint.mismatch(&ours_schema.fingerprint) {
        return Err(e);
    }
    let graph = Graph::new(&base_schema);
    let ours_versions = read_versions(&ours_conn, &ours_schema, &graph, Role::Ours)?;
    drop(ours_conn);
    let base_versions = read_versions(&base_conn, &base_schema, &graph, Role::Base)?;
    let mut plans = plan::plan(&restored.sessions, &ours_versions, &base_versions);
    let refused = only.map_or_else(Vec::new, |own| keep_only(&mut plans, own));

    let started = Instant::now();
    let mut conn = copy_base(&base_conn, base, out)?;
    drop(base_conn);
    let copy_time = started.elapsed();

    let started = Instant::now();
    let mut report = MergeReport {
        copy_time,
        refused,
        ..MergeReport::default()
    };
    // A scratch file until the caller renames it: no syncs while writing (it is synced once at the
    // end; on error it is deleted). The journal mode stays the base's: leaving WAL costs more
    // than the few pages a merge writes.
    step("synchronous", || {
        conn.pragma_update(None, "synchronous", "OFF")
    })?;
    attach_ours(&conn, ours)?;
    let tx = step("begin", || {
        conn.transaction_with_behavior(TransactionBehavior::Immediate)
    })?;
    let no_messages = BTreeSet::new();
    let views = Views {
        ours: &ours_versions,
        base: &base_versions,
        restored: &restored.sessions,
        movable: options.own_messages.unwrap_or(&no_messages),
        same_thread: options.same_thread,
    };
    apply(&tx, &base_schema, &graph, &plans, &views, &mut report)?;
    step("commit", || tx.commit())?;
    step("detach", || conn.execute_batch("DETACH DATABASE ours"))?;
    if options.verify == Verify::Full {
        full_check(&conn)?;
    }
    conn.close().map_err(|(_, source)| MergeError::Write {
        step: "close".into(),
        source,
    })?;
    report.merge_time = started.elapsed();
    let started = Instant::now();
    sync(out)?;
    report.sync_time = started.elapsed();
    Ok(report)
}

/// Keeps the plans of `own` trees (by root or by a member of this run's side); the roots and
/// titles of the others, refused.
fn keep_only(plans: &mut Vec<TreePlan>, own: &BTreeSet<String>) -> Vec<(String, Option<String>)> {
    let mut refused = Vec::new();
    plans.retain(|p| {
        let mine = own.contains(&p.root) || p.ours_members.iter().any(|m| own.contains(m));
        if !mine {
            refused.push((p.root.clone(), p.title.clone()));
        }
        mine
    });
    refused
}

/// The merged file on disk before the caller renames it into place (as downloads are).
fn sync(out: &Path) -> Result<(), MergeError> {
    std::fs::File::open(out)
        .and_then(|f| f.sync_all())
        .map_err(|source| MergeError::Io {
            action: "syncing",
            path: out.to_path_buf(),
            source,
        })
}

/// Copies the base into `out`. With no WAL content the main file is the whole database and a
/// file copy (in-kernel) is several times faster than the backup API; it runs inside a read
/// transaction, which keeps any writer or checkpointer from changing the main file meanwhile.
fn copy_base(base: &Connection, base_path: &Path, out: &Path) -> Result<Connection, MergeError> {
    let copy = |source| MergeError::Copy {
        path: out.to_path_buf(),
        source,
    };
    base.execute_batch("BEGIN").map_err(copy)?;
    let plain = base
        .query_row("SELECT count(*) FROM main.sqlite_schema", [], |_| Ok(()))
        .map_err(copy)
        .map(|()| wal_is_empty(base_path));
    let copied = match plain {
        Ok(true) => Some(
            std::fs::copy(base_path, out).map_err(|source| MergeError::Io {
                action: "copying the base to",
                path: out.to_path_buf(),
                source,
            }),
        ),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    };
    base.execute_batch("COMMIT").map_err(copy)?;
    let mut dst = Connection::open_with_flags(
        out,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(copy)?;
    harden(&dst).map_err(copy)?;
    match copied {
        Some(result) => {
            result?;
        }
        None => backup(base, &mut dst).map_err(copy)?,
    }
    Ok(dst)
}

fn wal_is_empty(db: &Path) -> bool {
    let mut wal = db.as_os_str().to_os_string();
    wal.push("-wal");
    std::fs::metadata(Path::new(&wal)).map_or(true, |m| m.len() == 0)
}

fn backup(base: &Connection, dst: &mut Connection) -> rusqlite::Result<()> {
    let backup = Backup::new(base, dst)?;
    let mut waits = 0;
    loop {
        match backup.step(-1)? {
            StepResult::Done => return Ok(()),
            StepResult::Busy | StepResult::Locked if waits < COPY_BUSY_RETRIES => {
                waits += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            StepResult::Busy | StepResult::Locked => {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some("the base stayed locked while copying it".into()),
                ))
            }
            // `More` (and any future kind): keep stepping.
            _ => {}
        }
    }
}

fn attach_ours(conn: &Connection, ours: &Path) -> Result<(), MergeError> {
    conn.execute("ATTACH DATABASE ?1 AS ours", [super::file_uri(ours)])
        .map_err(|e| super::open_error(Role::Ours, ours, e))?;
    Ok(())
}

/// The session versions of each side and this run's own new messages, for joining trees.
struct Views<'a> {
    ours: &'a Versions,
    base: &'a Versions,
    restored: &'a Versions,
    movable: &'a BTreeSet<String>,
    /// This run's thread session and the base's session of the same thread.
    same_thread: Option<(&'a str, &'a str)>,
}

fn apply(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    plans: &[TreePlan],
    views: &Views<'_>,
    report: &mut MergeReport,
) -> Result<(), MergeError> {
    step("temp tables", || {
        conn.execute_batch(
            "CREATE TEMP TABLE merge_del(id PRIMARY KEY);
             CREATE TEMP TABLE merge_ins(id PRIMARY KEY);
             CREATE TEMP TABLE merge_a(id PRIMARY KEY);
             CREATE TEMP TABLE merge_b(id PRIMARY KEY);
             CREATE TEMP TABLE merge_one(id PRIMARY KEY);
             CREATE TEMP TABLE merge_join(id PRIMARY KEY);
             CREATE TEMP TABLE merge_move(old PRIMARY KEY, new, at);
             CREATE TEMP TABLE merge_new(id PRIMARY KEY);
             CREATE TEMP TABLE merge_need(tbl, col, key, PRIMARY KEY(tbl, col, key));",
        )
    })?;
    let joins = join_plans(conn, schema, graph, plans, views)?;
    for (p, joining) in plans.iter().zip(&joins) {
        record(conn, graph, p, joining.as_ref(), report)?;
    }
    let whole: Vec<&TreePlan> = plans
        .iter()
        .zip(&joins)
        .filter(|(p, j)| p.writes() && !matches!(j, Some(Joining::Joined(_))))
        .map(|(p, _)| p)
        .collect();
    let joined: Vec<&TreeJoin> = joins
        .iter()
        .filter_map(|j| match j {
            Some(Joining::Joined(join)) => Some(join),
            Some(Joining::Refused(_)) | None => None,
        })
        .collect();
    if whole.is_empty() && joined.is_empty() {
        return Ok(());
    }
    fill(
        conn,
        "merge_del",
        whole.iter().flat_map(|p| &p.base_members),
    )?;
    fill(
        conn,
        "merge_ins",
        whole.iter().flat_map(|p| &p.ours_members),
    )?;
    report.rows_deleted += super::rows::delete_tied(conn, graph, "merge_del")?;
    report.rows_inserted += super::rows::insert_tied(conn, schema, graph, "merge_ins")?;
    for join in &joined {
        report.rows_inserted += join::write(conn, schema, graph, join)?;
        report
            .reissued
            .extend(join.moved().map(|m| (m.old.clone(), m.new.clone())));
    }
    // The joined trees' rows are checked, and their parents carried, like those inserted whole.
    step("listing joined sessions", || {
        let mut stmt = conn.prepare("INSERT OR IGNORE INTO temp.merge_ins VALUES (?1)")?;
        for id in joined.iter().flat_map(|j| &j.members) {
            stmt.execute([id])?;
        }
        Ok(())
    })?;
    carry_parents(conn, schema, graph, report)?;
    check_written(conn, schema, graph)
}

/// For each tree both sides changed, how its exchanges are joined or why not (`None`: a tree only
/// one side changed).
fn join_plans(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    plans: &[TreePlan],
    views: &Views<'_>,
) -> Result<Vec<Option<Joining>>, MergeError> {
    let sides = Sides {
        conn,
        schema,
        graph,
        ours: views.ours,
        base: views.base,
        restored: views.restored,
        movable: views.movable,
    };
    plans
        .iter()
        .map(|p| match (&p.decision, views.same_thread) {
            (Decision::Conflict { winner }, _) => exchanges::plan(&sides, p, *winner).map(Some),
            // A thread this run started, which another run started too.
            (Decision::Take(Change::Added), Some((ours, theirs))) if p.root == ours => {
                exchanges::plan_fold(&sides, p, theirs)
            }
            (Decision::Take(_) | Decision::Identical, _) => Ok(None),
        })
        .collect()
}

/// Adds a plan's outcome to the report (before anything is deleted, so the loser's rows can
/// still be counted).
fn record(
    conn: &Connection,
    graph: &Graph,
    p: &TreePlan,
    joining: Option<&Joining>,
    report: &mut MergeReport,
) -> Result<(), MergeError> {
    if let Some(Joining::Joined(join)) = joining {
        let moved = join.moved().count() as u64;
        report.kept_both.push(KeptBoth {
            root: join.root.clone(),
            title: p.title.clone(),
            sessions: join.members.clone(),
            messages: join.sessions.iter().map(|s| s.new_messages as u64).sum(),
            moved,
        });
        if let Some(from) = &join.folded {
            report.folded.push((from.clone(), join.root.clone()));
        }
        return Ok(());
    }
    let refusal = match joining {
        Some(Joining::Refused(refusal)) => Some(refusal.clone()),
        Some(Joining::Joined(_)) | None => None,
    };
    match &p.decision {
        Decision::Take(change) => report.taken.push(Taken {
            root: p.root.clone(),
            title: p.title.clone(),
            change: *change,
            sessions: match change {
                super::Change::Deleted => p.base_members.clone(),
                super::Change::Added | super::Change::Updated => p.ours_members.clone(),
            },
        }),
        Decision::Identical => report.identical += 1,
        Decision::Conflict { winner } => {
            let (winner_db, winner_ids, loser_db, loser_ids) = match winner {
                Side::Ours => (OURS, &p.ours_members, "main", &p.base_members),
                Side::Base => ("main", &p.base_members, OURS, &p.ours_members),
            };
            let lost_messages =
                lost_rows(conn, graph, (loser_db, loser_ids), (winner_db, winner_ids))?;
            report.conflicts.push(Conflict {
                root: p.root.clone(),
                title: p.title.clone(),
                winner: *winner,
                ours_activity: p.ours_activity,
                base_activity: p.base_activity,
                lost_sessions: loser_ids
                    .iter()
                    .filter(|id| !winner_ids.contains(id))
                    .cloned()
                    .collect(),
                lost_messages,
                refusal,
            });
        }
    }
    Ok(())
}

/// Messages the loser's tree holds that the winner's does not.
fn lost_rows(
    conn: &Connection,
    graph: &Graph,
    (loser_db, loser_ids): (&str, &[String]),
    (winner_db, winner_ids): (&str, &[String]),
) -> Result<u64, MergeError> {
    let Some(key) = graph.message_key() else {
        return Ok(0);
    };
    fill(conn, "merge_a", loser_ids.iter())?;
    fill(conn, "merge_b", winner_ids.iter())?;
    let sql = format!(
        "SELECT count(*) FROM {l}.{t} WHERE {lp} AND {k} NOT IN (SELECT {k} FROM {w}.{t} WHERE {wp})",
        l = quote(loser_db),
        w = quote(winner_db),
        t = quote(MESSAGE_TABLE),
        k = quote(key),
        lp = graph.predicate(loser_db, MESSAGE_TABLE, "merge_a"),
        wp = graph.predicate(winner_db, MESSAGE_TABLE, "merge_b"),
    );
    let n: i64 = step("counting lost messages", || {
        conn.query_row(&sql, [], |r| r.get(0))
    })?;
    Ok(n.max(0) as u64)
}

/// Parent rows (projects, workspaces) the inserted rows reference and the base lacks, then this
/// run's attachment rows for them; the base's rows win on any key clash (`OR IGNORE`).
fn carry_parents(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    report: &mut MergeReport,
) -> Result<(), MergeError> {
    need_referenced_keys(conn, schema, graph)?;
    let parents: Vec<&str> = schema
        .dependency_order()
        .into_iter()
        .map(|t| t.name.as_str())
        .filter(|n| graph.is_parent(n))
        .collect();
    need_their_parents(conn, schema, graph, &parents)?;
    report.rows_carried += carry_needed(conn, schema, graph, &parents)?;
    Ok(())
}

/// One statement of the parents' carry, with `args` bound in order; the rows it changed.
fn execute(conn: &Connection, what: &str, sql: &str, args: &[&str]) -> Result<usize, MergeError> {
    step(what, || {
        conn.execute(sql, rusqlite::params_from_iter(args.iter()))
    })
}

/// Into `temp.merge_need`: the parent keys the inserted tied rows reference.
fn need_referenced_keys(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
) -> Result<(), MergeError> {
    for table in graph.tied_order() {
        for r in &schema.tables[table].references {
            if graph.is_parent(&r.target) {
                let sql = format!(
                    "INSERT OR IGNORE INTO temp.merge_need SELECT ?1, ?2, {c} FROM {OURS}.{t} \
                     WHERE {p} AND {c} IS NOT NULL",
                    c = quote(&r.column),
                    t = quote(table),
                    p = graph.predicate(OURS, table, "merge_ins"),
                );
                let args = [r.target.as_str(), &r.target_column];
                execute(conn, "listing parent rows", &sql, &args)?;
            }
        }
    }
    Ok(())
}

/// Into `temp.merge_need`: the needed parent rows' own parents, children first so each table's
/// needed keys are complete first (`parents`: in dependency order).
fn need_their_parents(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    parents: &[&str],
) -> Result<(), MergeError> {
    for p in parents.iter().rev() {
        for col in needed_columns(conn, schema, p)? {
            for r in &schema.tables[*p].references {
                if !graph.is_parent(&r.target) || r.target == *p {
                    continue;
                }
                let sql = format!(
                    "INSERT OR IGNORE INTO temp.merge_need SELECT ?1, ?2, {c} FROM {OURS}.{t} \
                     WHERE {c} IS NOT NULL AND {k} IN \
                     (SELECT key FROM temp.merge_need WHERE tbl = ?3 AND col = ?4)",
                    c = quote(&r.column),
                    t = quote(p),
                    k = quote(&col),
                );
                let args = [r.target.as_str(), &r.target_column, p, &col];
                execute(conn, "listing parent rows", &sql, &args)?;
            }
        }
    }
    Ok(())
}

/// The needed parent rows, parents first; then the attachments. How many rows were carried.
fn carry_needed(
    conn: &Connection,
    schema: &Schema,
    graph: &Graph,
    parents: &[&str],
) -> Result<u64, MergeError> {
    let mut carried = 0;
    for p in parents {
        for col in needed_columns(conn, schema, p)? {
            let sql = format!(
                "INSERT OR IGNORE INTO main.{t} ({cols}) SELECT {cols} FROM {OURS}.{t} \
                 WHERE {k} IN (SELECT key FROM temp.merge_need WHERE tbl = ?1 AND col = ?2)",
                t = quote(p),
                cols = column_list(schema, p, None),
                k = quote(&col),
            );
            carried += execute(conn, &format!("carrying {p}"), &sql, &[p, &col])? as u64;
        }
    }
    for (table, refs) in graph.attachments() {
        for r in refs {
            let sql = format!(
                "INSERT OR IGNORE INTO main.{t} ({cols}) SELECT {cols} FROM {OURS}.{t} \
                 WHERE {c} IN (SELECT key FROM temp.merge_need WHERE tbl = ?1 AND col = ?2)",
                t = quote(table),
                cols = column_list(schema, table, None),
                c = quote(&r.column),
            );
            let args = [r.target.as_str(), &r.target_column];
            carried += execute(conn, &format!("carrying {table}"), &sql, &args)? as u64;
        }
    }
    Ok(carried)
}

/// The columns of `table` that `temp.merge_need` lists keys for (always real columns: they come
/// from the schema's references).
fn needed_columns(
    conn: &Connection,
    schema: &Schema,
    table: &str,
) -> Result<Vec<String>, MergeError> {
    let cols: Vec<String> = step("listing parent rows", || {
        let mut stmt =
            conn.prepare("SELECT DISTINCT col FROM temp.merge_need WHERE tbl = ?1 ORDER BY col")?;
        let rows = stmt.query_map([table], |r| r.get::<_, String>(0))?;
        rows.collect()
    })?;
    Ok(cols
        .into_iter()
        .filter(|c| schema.tables[table].has_column(c))
        .collect())
}

/// Every declared key of the rows written resolves; the parent and attachment tables (small) are
/// checked whole.
fn check_written(conn: &Connection, schema: &Schema, graph: &Graph) -> Result<(), MergeError> {
    let mut problems = Vec::new();
    for table in graph.tied_order() {
        for r in &schema.tables[table].references {
            if r.origin != RefOrigin::Declared {
                continue;
            }
            let sql = format!(
                "SELECT count(*) FROM main.{t} AS src WHERE {p} AND src.{c} IS NOT NULL \
                 AND NOT EXISTS (SELECT 1 FROM main.{tgt} AS dst WHERE dst.{tc} = src.{c})",
                t = quote(table),
                p = graph.predicate("main", table, "merge_ins"),
                c = quote(&r.column),
                tgt = quote(&r.target),
                tc = quote(&r.target_column),
            );
            let n: i64 = step("checking written keys", || {
                conn.query_row(&sql, [], |row| row.get(0))
            })?;
            if n > 0 {
                problems.push(format!(
                    "{n} row(s) of {table}.{} reference a missing {}.{}",
                    r.column, r.target, r.target_column
                ));
            }
        }
    }
    let small = schema
        .tables
        .keys()
        .filter(|t| graph.is_parent(t) || graph.attachments().iter().any(|(a, _)| a == *t));
    for table in small {
        problems.extend(foreign_key_violations(conn, Some(table))?);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(MergeError::Check {
            detail: problems.join("; "),
        })
    }
}

fn foreign_key_violations(
    conn: &Connection,
    table: Option<&str>,
) -> Result<Vec<String>, MergeError> {
    let sql = match table {
        Some(t) => format!("PRAGMA main.foreign_key_check({})", quote(t)),
        None => "PRAGMA main.foreign_key_check".to_string(),
    };
    step("foreign_key_check", || {
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], |r| {
            Ok(format!(
                "{} row {} references a missing {}",
                r.get::<_, String>(0)?,
                r.get::<_, Option<i64>>(1)?.unwrap_or(-1),
                r.get::<_, String>(2)?
            ))
        })?;
        rows.take(20).collect()
    })
}

fn full_check(conn: &Connection) -> Result<(), MergeError> {
    let integrity: Vec<String> = step("integrity_check", || {
        let mut stmt = conn.prepare("PRAGMA main.integrity_check")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.take(20).collect()
    })?;
    if integrity != ["ok"] {
        return Err(MergeError::Check {
            detail: integrity.join("; "),
        });
    }
    let fk = foreign_key_violations(conn, None)?;
    if fk.is_empty() {
        Ok(())
    } else {
        Err(MergeError::Check {
            detail: fk.join("; "),
        })
    }
}
