//! `replaysafe verify snapshot` / `verify diff`: the seed's check that a backfill changed an aggregate by exactly
//! what it reported — per day, to the row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{self, Pipeline};
use crate::error::{Error, Result};
use crate::ops::backfill::Report;
use crate::projection::ProjectionKind;
use crate::sink;

/// A snapshot of one counter projection's rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The pipeline file (absolute), re-read by `verify diff`.
    pub config: PathBuf,
    /// The projection table.
    pub table: String,
    /// The row filter (SQL boolean expression, run in a read-only transaction).
    pub filter: Option<String>,
    /// When it was taken (RFC 3339).
    pub taken_at: String,
    /// Rows: the group-by values joined with `|` → the counter value.
    pub rows: BTreeMap<String, i64>,
    /// Group-by value → its partition-by day (`YYYY-MM-DD`), for per-day comparison.
    pub days: BTreeMap<String, String>,
}

struct Target {
    table: String,
    group_by: Vec<String>,
    column: String,
    day: String,
}

/// Finds the counter projection writing `table`.
fn target(p: &Pipeline, table: &str) -> Result<Target> {
    let (proj, agg) = p
        .projections
        .iter()
        .filter(|x| x.kind == ProjectionKind::Counter)
        .find_map(|x| {
            x.aggregate
                .as_ref()
                .filter(|a| a.table.name.as_str() == table || x.name == table)
                .map(|a| (x, a))
        })
        .ok_or_else(|| {
            Error::Usage(format!(
                "`{table}` is not the table of a counter projection of this pipeline"
            ))
        })?;
    let day = p.identity.partition_by.ok_or_else(|| {
        Error::Usage("verify compares per day: the pipeline needs `identity.partition-by`".into())
    })?;
    if !agg.group_by.contains(&day) {
        return Err(Error::Usage(format!(
            "projection `{}` is not grouped by the partition-by field",
            proj.name
        )));
    }
    Ok(Target {
        table: agg.table.to_string(),
        group_by: agg
            .group_by
            .iter()
            .map(|&i| p.fields[i].name.to_string())
            .collect(),
        column: agg.values[0].to_string(),
        day: p.fields[day].name.to_string(),
    })
}

/// Takes a snapshot of `table` (optionally only rows matching `filter`).
///
/// # Errors
/// [`Error::Usage`] when the table is not a counter projection; database errors.
pub fn snapshot(config_path: &Path, table: &str, filter: Option<&str>) -> Result<Snapshot> {
    let p = config::load(config_path)?;
    let t = target(&p, table)?;
    let url = database_url(&p)?;
    let key = t
        .group_by
        .iter()
        .map(|g| format!("{g}::text"))
        .collect::<Vec<_>>()
        .join(" || '|' || ");
    let sql = format!(
        "SELECT {key}, {}::text, {}::bigint FROM {}{}",
        t.day,
        t.column,
        t.table,
        filter.map(|f| format!(" WHERE {f}")).unwrap_or_default()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let rows = rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        let tx = client.build_transaction().read_only(true).start().await?;
        // A whole table's snapshot may run longer than a batch statement may.
        tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
        let rows = tx
            .query(&sql, &[])
            .await
            .map_err(|e| where_error(e, filter))?;
        tx.rollback().await?;
        Ok::<_, Error>(rows)
    })?;
    let mut snap = Snapshot {
        config: std::fs::canonicalize(config_path).unwrap_or_else(|_| config_path.to_path_buf()),
        table: table.to_string(),
        filter: filter.map(str::to_string),
        taken_at: chrono::Utc::now().to_rfc3339(),
        rows: BTreeMap::new(),
        days: BTreeMap::new(),
    };
    for r in rows {
        let k: String = r.get(0);
        snap.days.insert(k.clone(), r.get(1));
        snap.rows.insert(k, r.get(2));
    }
    Ok(snap)
}

/// A `--where` that PostgreSQL rejects as written (SQLSTATE class 42: unknown column, syntax; class 22: a bad
/// literal) is bad usage, not a runtime failure.
fn where_error(e: tokio_postgres::Error, filter: Option<&str>) -> Error {
    let class = e.code().map(|c| &c.code()[..2]);
    match (filter, class) {
        (Some(f), Some("42" | "22")) => Error::Usage(format!(
            "--where `{f}`: {}",
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_string())
        )),
        _ => Error::Postgres(e),
    }
}

fn database_url(p: &Pipeline) -> Result<String> {
    let url = p
        .postgres
        .url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .ok_or_else(|| Error::Usage("no database: set [postgres] url or DATABASE_URL".into()))?;
    // The pipeline's TLS and password keys apply to this URL too.
    crate::sink::conninfo::note(&url, &p.postgres.connection, &p.source.path);
    Ok(url)
}

/// One day whose aggregate change differs from what the backfill reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The day.
    pub day: String,
    /// Sum of the counter's change over the day's rows.
    pub changed_by: i64,
    /// Records the backfill reported as landed for the day.
    pub expected: i64,
}

/// Compares a fresh snapshot with `before` and the backfill `report`: per day, the counter's change must equal
/// the records the backfill landed. Returns the mismatches (empty: verified to the row).
///
/// # Errors
/// Reading the files or the database.
pub fn diff(before: &Snapshot, report: &Report) -> Result<(Vec<Mismatch>, String)> {
    let after = snapshot(&before.config, &before.table, before.filter.as_deref())?;
    let mut changed: BTreeMap<String, i64> = BTreeMap::new();
    for (k, v) in &after.rows {
        let d = after.days.get(k).cloned().unwrap_or_default();
        *changed.entry(d).or_default() += v - before.rows.get(k).copied().unwrap_or(0);
    }
    for (k, v) in &before.rows {
        if !after.rows.contains_key(k) {
            *changed
                .entry(before.days.get(k).cloned().unwrap_or_default())
                .or_default() -= v;
        }
    }
    let mut days: Vec<String> = changed.keys().cloned().collect();
    days.extend(
        report
            .per_day
            .iter()
            .filter(|(d, c)| c.landed > 0 && *d != "unknown")
            .map(|(d, _)| d.clone()),
    );
    days.sort();
    days.dedup();
    let mut mismatches = Vec::new();
    let mut table = format!("{:<12} {:>12} {:>12}\n", "day", "changed by", "backfilled");
    for d in days {
        let c = changed.get(&d).copied().unwrap_or(0);
        let e = report.per_day.get(&d).map_or(0, |x| x.landed as i64);
        // A late event lands on its own event day, which the snapshot's --where may not cover.
        let unseen =
            !before.days.values().any(|x| *x == d) && !after.days.values().any(|x| *x == d);
        table += &format!(
            "{:<12} {:>12} {:>12}{}\n",
            d,
            c,
            e,
            match (c == e, unseen) {
                (true, _) => "",
                (false, false) => "   MISMATCH",
                (false, true) =>
                    "   MISMATCH (no row of this day in either snapshot: does --where cover every day the backfill \
                     can land on?)",
            }
        );
        if c != e {
            mismatches.push(Mismatch {
                day: d,
                changed_by: c,
                expected: e,
            });
        }
    }
    Ok((mismatches, table))
}
