//! `replaysafe verify snapshot` / `verify diff`: the seed's check that a backfill changed an aggregate by exactly
//! what it reported — per day, to the row — while production keeps writing into the same days.
//!
//! A snapshot reads, in one `REPEATABLE READ` transaction (one MVCC snapshot), a counter or sum projection's
//! rows and the ledger's claims per event day and consumer group (row count, and the summed field when the
//! ledger holds it). Every projection change is committed in the transaction of the ledger claims it derives
//! from, so between two snapshots the ledger says exactly which group claimed how many rows of each day — no
//! clock or process memory is involved. `verify diff` takes the second snapshot and accounts each day's change
//! for the backfill's report and for the other groups' new claims ([`account`]), then every projection row
//! (every group-by key) for the claims of its key when the ledger holds the group-by fields, else within what
//! its day's claims allow ([`rows`]).

mod account;
mod compare;
mod rows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bigdecimal::BigDecimal;
use serde::{Deserialize, Serialize};
use tokio_postgres::IsolationLevel;

use crate::config::{self, Pipeline};
use crate::error::{Error, Result};
use crate::ops::backfill::Report;
use crate::ops::fingerprint::pipeline_fingerprint;
use crate::projection::ProjectionKind;
use crate::sink;

pub use account::{account, Day, Mismatch, Outcome};
pub use compare::{compare, CompareOptions, Comparison, RowDiff};
pub use rows::RowMismatch;

/// The snapshot file's format: 2 adds the per-row ledger claims (`row_claims`, `ledger_lacks`). A file of
/// another format is refused by [`read_snapshot`].
pub const SNAPSHOT_FORMAT: u32 = 2;

/// A snapshot of one counter or sum projection column's rows and of the ledger's claims per day and group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_FORMAT`] when written.
    #[serde(default)]
    pub format: u32,
    /// The pipeline file (absolute), re-read by `verify diff`.
    pub config: PathBuf,
    /// The pipeline's fingerprint ([`pipeline_fingerprint`]).
    pub pipeline: String,
    /// The projection table (as given).
    pub table: String,
    /// The projection table, schema-qualified (unquoted).
    pub qualified: String,
    /// The value column compared.
    pub column: String,
    /// `counter` or `sum`.
    pub kind: String,
    /// The row filter (SQL boolean expression, run in a read-only transaction on the table and the ledger).
    pub filter: Option<String>,
    /// When it was taken: the database's clock at the start of the reading transaction (RFC 3339, UTC).
    pub taken_at: String,
    /// Rows: the group-by values joined with `|` → the column's value (decimal text).
    pub rows: BTreeMap<String, String>,
    /// Group-by value → its partition-by day (`YYYY-MM-DD`), for per-day comparison.
    pub days: BTreeMap<String, String>,
    /// Whether every ledger claim adds exactly its part (counter: one; sum: its field): false when the
    /// projection has a `filter`, or a row projection may find a claimed record a redelivery of the state it
    /// already holds at that version (a duplicate, claimed but seen by no projection). A record it judges stale
    /// adds its part like any other claim.
    pub exact: bool,
    /// Ledger claims: day (`YYYY-MM-DD`) → consumer group → claims (rows, sum, generations).
    pub ledger: BTreeMap<String, BTreeMap<String, Claims>>,
    /// Ledger claims per projection row: group-by key (as in `rows`) → consumer group → claims (rows, sum;
    /// no generations). `None` when the ledger does not hold every group-by field (`ledger_lacks`).
    #[serde(default)]
    pub row_claims: Option<BTreeMap<String, BTreeMap<String, Claims>>>,
    /// The group-by fields the ledger does not hold (not key, partition-by or `[ledger] columns` fields): rows
    /// are then accounted within their day's claims only.
    #[serde(default)]
    pub ledger_lacks: Vec<String>,
}

/// The ledger rows one consumer group holds for one day.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// Rows.
    pub rows: i64,
    /// Sum projections whose field the ledger holds (`[ledger] columns`): the field summed over the rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// The stream generations (`[identity] generation`, '' for none) its rows were claimed under.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<String>,
}

/// What is compared: the projection's table, group-by, value column and day field, and the ledger.
struct Target {
    table: String,
    /// `schema.table`, unquoted (the key of the report's `sums`).
    qualified: String,
    group_by: Vec<String>,
    column: String,
    kind: ProjectionKind,
    /// The partition-by field (quoted; empty without one).
    day: String,
    ledger: String,
    /// Sum: the added field, when the ledger holds it.
    ledger_sum: Option<String>,
    /// See [`Snapshot::exact`].
    exact: bool,
    /// See [`Snapshot::ledger_lacks`].
    ledger_lacks: Vec<String>,
    /// The partition-by field's SQL type.
    day_type: &'static str,
    /// The partition-by field's position among `group_by` (`None`: not a group-by column).
    day_index: Option<usize>,
    /// The projection's `name`.
    projection: String,
}

/// Finds the counter or sum projection writing `table` and its value `column` (needed when it has several), grouped
/// by the partition-by field (`verify snapshot` and `diff` account per day).
fn target(p: &Pipeline, table: &str, column: Option<&str>) -> Result<Target> {
    let t = aggregate_target(p, table, column)?;
    if p.identity.partition_by.is_none() {
        return Err(Error::Usage(
            "verify compares per day: the pipeline needs `identity.partition-by`".into(),
        ));
    }
    if t.day_index.is_none() {
        return Err(Error::Usage(format!(
            "projection `{}` is not grouped by the partition-by field",
            t.projection
        )));
    }
    Ok(t)
}

/// [`target`] without the per-day requirement: `day_index` says whether the partition-by field is a group-by
/// column (`verify compare` then compares the days both tables cover, else the whole tables).
fn aggregate_target(p: &Pipeline, table: &str, column: Option<&str>) -> Result<Target> {
    let (proj, agg) = p
        .projections
        .iter()
        .filter(|x| matches!(x.kind, ProjectionKind::Counter | ProjectionKind::Sum))
        .find_map(|x| {
            x.aggregate
                .as_ref()
                .filter(|a| a.table.name.as_str() == table || x.name == table)
                .map(|a| (x, a))
        })
        .ok_or_else(|| {
            let tables: Vec<String> = p
                .projections
                .iter()
                .filter(|x| matches!(x.kind, ProjectionKind::Counter | ProjectionKind::Sum))
                .filter_map(|x| x.aggregate.as_ref().map(|a| a.table.name.as_str().to_string()))
                .collect();
            let choose = match tables.as_slice() {
                [] => "it has none (verify compares counter and sum projections)".to_string(),
                t => format!("its counter and sum tables: {}", t.join(", ")),
            };
            Error::Usage(format!(
                "`{table}` is not the table of a counter or sum projection of this pipeline; {choose}"
            ))
        })?;
    let day = p.identity.partition_by;
    let names: Vec<&str> = agg.values.iter().map(|v| v.as_str()).collect();
    let i = match column {
        Some(c) => names.iter().position(|n| *n == c),
        None if names.len() == 1 => Some(0),
        None => None,
    }
    .ok_or_else(|| {
        Error::Usage(format!(
            "projection `{}` has the value columns {}: name one with --column",
            proj.name,
            names.join(", ")
        ))
    })?;
    let held = sink::ledger::ledger_field_columns(p);
    let ledger_sum = agg.value_fields[i]
        .filter(|f| held.contains(f))
        .map(|f| p.fields[f].name.to_string());
    Ok(Target {
        table: agg.table.to_string(),
        qualified: format!("{}.{}", agg.table.schema.as_str(), agg.table.name.as_str()),
        group_by: agg
            .group_by
            .iter()
            .map(|&i| p.fields[i].name.to_string())
            .collect(),
        column: names[i].to_string(),
        kind: proj.kind,
        day: day
            .map(|d| p.fields[d].name.to_string())
            .unwrap_or_default(),
        day_index: day.and_then(|d| agg.group_by.iter().position(|&g| g == d)),
        projection: proj.name.clone(),
        ledger: p.ledger.table.to_string(),
        ledger_sum,
        exact: proj.filter.is_none()
            && !p.projections.iter().any(|x| x.kind == ProjectionKind::Row),
        ledger_lacks: agg
            .group_by
            .iter()
            .filter(|i| !held.contains(i))
            .map(|&i| p.fields[i].name.as_str().to_string())
            .collect(),
        day_type: day.map_or("date", |d| p.fields[d].ty.sql()),
    })
}

/// Takes a snapshot of `table`'s value `column` (optionally only rows matching `filter`) and of the ledger's
/// claims per day and group (the same `filter` applied to the ledger), in one read-only `REPEATABLE READ`
/// transaction.
///
/// # Errors
/// [`Error::Usage`] when the table is not a counter/sum projection, the column is not named where needed, or
/// `filter` does not apply to the table or the ledger; database errors.
pub fn snapshot(
    config_path: &Path,
    table: &str,
    column: Option<&str>,
    filter: Option<&str>,
) -> Result<Snapshot> {
    let p = config::load(config_path)?;
    let t = target(&p, table, column)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let read = rt.block_on(read(&p, &url, &t, filter))?;
    let mut snap = Snapshot {
        format: SNAPSHOT_FORMAT,
        config: std::fs::canonicalize(config_path).unwrap_or_else(|_| config_path.to_path_buf()),
        pipeline: pipeline_fingerprint(&p),
        table: table.to_string(),
        qualified: t.qualified.clone(),
        column: t.column.clone(),
        kind: format!("{:?}", t.kind).to_lowercase(),
        filter: filter.map(str::to_string),
        taken_at: read.taken_at,
        rows: BTreeMap::new(),
        days: BTreeMap::new(),
        exact: t.exact,
        ledger: BTreeMap::new(),
        row_claims: read.row_claims.as_ref().map(|_| BTreeMap::new()),
        ledger_lacks: t.ledger_lacks.clone(),
    };
    for r in read.rows {
        let k: String = r.get(0);
        snap.days.insert(k.clone(), r.get(1));
        snap.rows.insert(k, r.get(2));
    }
    for r in read.claims {
        let c = snap
            .ledger
            .entry(r.get(0))
            .or_default()
            .entry(r.get(1))
            .or_default();
        c.rows += r.get::<_, i64>(3);
        if t.ledger_sum.is_some() {
            let total = num(c.sum.as_deref().unwrap_or("0")) + num(r.get(4));
            c.sum = Some(total.normalized().to_plain_string());
        }
        c.generations.push(r.get(2));
    }
    if let (Some(out), Some(rows)) = (snap.row_claims.as_mut(), read.row_claims) {
        for r in rows {
            let c = out
                .entry(r.get(0))
                .or_default()
                .entry(r.get(1))
                .or_default();
            c.rows = r.get(2);
            c.sum = t.ledger_sum.as_ref().map(|_| r.get(3));
        }
    }
    Ok(snap)
}

type Rows = Vec<tokio_postgres::Row>;

/// What [`read`] returns: the database's clock at the transaction's start, the projection rows (key, day,
/// value), the ledger's claims per day, group and generation, and per row key and group (when the ledger holds
/// the group-by fields).
struct Read {
    taken_at: String,
    rows: Rows,
    claims: Rows,
    row_claims: Option<Rows>,
}

/// The row key of the projection table and the ledger: the group-by columns as text, joined with `|`.
fn row_key(t: &Target) -> String {
    t.group_by
        .iter()
        .map(|g| format!("{g}::text"))
        .collect::<Vec<_>>()
        .join(" || '|' || ")
}

/// Reads the projection rows and the ledger's claims per day and group (and per row key) in one MVCC snapshot,
/// after checking that `filter` selects whole days ([`whole_days`]).
async fn read(p: &Pipeline, url: &str, t: &Target, filter: Option<&str>) -> Result<Read> {
    let key = row_key(t);
    let cond = filter.map(|f| format!(" WHERE {f}")).unwrap_or_default();
    let rows_sql = format!(
        "SELECT {key}, {}::text, {}::text FROM {}{cond}",
        t.day, t.column, t.table
    );
    let sum = t
        .ledger_sum
        .as_ref()
        .map(|f| format!(", coalesce(sum({f}), 0)::text"))
        .unwrap_or_default();
    let ledger_sql = format!(
        "SELECT {day}::text, consumer_group, generation, count(*)::bigint{sum} FROM {} l{cond} GROUP BY 1, 2, 3 \
         ORDER BY 1, 2, 3",
        sink::ledger::ledger_rows(p),
        day = t.day
    );
    let mut client = sink::connect_with(url, &p.postgres.timeouts).await?;
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // A whole table's snapshot may run longer than a batch statement may.
    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
    let taken_at: String = tx
        .query_one(
            "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[],
        )
        .await?
        .get(0);
    let rows = tx
        .query(&rows_sql, &[])
        .await
        .map_err(|e| where_error(e, filter, None))?;
    let claims = tx
        .query(&ledger_sql, &[])
        .await
        .map_err(|e| where_error(e, filter, Some(&t.ledger)))?;
    if let Some(f) = filter {
        whole_days(&tx, p, t, f, &rows, &claims).await?;
    }
    let row_claims = match t.ledger_lacks.is_empty() {
        true => Some(
            tx.query(
                &format!(
                    "SELECT {key}, consumer_group, count(*)::bigint{sum} FROM {} l{cond} GROUP BY 1, 2",
                    sink::ledger::ledger_rows(p)
                ),
                &[],
            )
            .await?,
        ),
        false => None,
    };
    tx.rollback().await?;
    Ok(Read {
        taken_at,
        rows,
        claims,
        row_claims,
    })
}

/// Refuses a `--where` that selects part of a day — in the projection table or in the ledger — (issue 41 item
/// 6): a backfill's report counts whole days and production's claims are accounted per day, so a condition on
/// another column (`customer_id = …`) would make every day's claims disagree with the report. The days
/// selected (by a projection row or a ledger claim) are read again without the condition.
///
/// # Errors
/// [`Error::Usage`] naming the first partly selected day and the rows left out.
async fn whole_days(
    tx: &tokio_postgres::Transaction<'_>,
    p: &Pipeline,
    t: &Target,
    f: &str,
    rows: &Rows,
    claims: &Rows,
) -> Result<()> {
    let days: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(1))
        .chain(claims.iter().map(|r| r.get::<_, String>(0)))
        .collect();
    let (Some(lo), Some(hi)) = (days.first(), days.last()) else {
        return Ok(());
    };
    let list: Vec<&String> = days.iter().collect();
    let table_sql = format!(
        "SELECT {day}::text, pg_catalog.count(*)::bigint FROM {} WHERE {day}::text = ANY($1::text[]) \
         AND (({f})) IS NOT TRUE GROUP BY 1 ORDER BY 1 LIMIT 1",
        t.table,
        day = t.day
    );
    let ledger_sql = format!(
        "SELECT {day}::text, pg_catalog.count(*)::bigint FROM {} l WHERE {day} BETWEEN $1::text::{ty} AND \
         $2::text::{ty} AND (({f})) IS NOT TRUE GROUP BY 1 ORDER BY 1",
        sink::ledger::ledger_rows(p),
        day = t.day,
        ty = t.day_type
    );
    let first = tx.query(&table_sql, &[&list]).await?.first().map(|r| {
        let (d, n): (String, i64) = (r.get(0), r.get(1));
        (d, format!("{n} row(s) of {}", t.qualified))
    });
    let first = match first {
        Some(x) => Some(x),
        None => tx
            .query(&ledger_sql, &[lo, hi])
            .await?
            .iter()
            .find_map(|r| {
                let (d, n): (String, i64) = (r.get(0), r.get(1));
                days.contains(&d)
                    .then(|| (d, format!("{n} ledger claim(s)")))
            }),
    };
    match first {
        None => Ok(()),
        Some((day, what)) => Err(Error::Usage(format!(
            "--where `{}` selects part of day {day} ({what} of that day left out): verify accounts whole days — a \
         backfill's report counts every record of a day, and the ledger's claims per day are compared with \
         it — so a condition on another column than the day field ({}) would make every day disagree; name \
         only the day field, e.g. --where \"{} between '…' and '…'\" (each row of those days is compared \
         anyway)",
            crate::printable::escape_controls(f),
            t.day.trim_matches('"'),
            t.day.trim_matches('"')
        ))),
    }
}

/// A `--where` that PostgreSQL rejects as written (SQLSTATE class 42: unknown column, syntax; class 22: a bad
/// literal) is bad usage, not a runtime failure. `ledger`: it failed on the ledger (the projection took it).
fn where_error(e: tokio_postgres::Error, filter: Option<&str>, ledger: Option<&str>) -> Error {
    let class = e.code().map(|c| &c.code()[..2]);
    let msg = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string());
    match (filter, class, ledger) {
        (Some(f), Some("42" | "22"), None) => Error::Usage(format!("--where `{f}`: {msg}")),
        (Some(f), Some("42" | "22"), Some(l)) => Error::Usage(format!(
            "--where `{f}` applies to the ledger {l} too (verify counts its claims per day with it), and there: \
             {msg}; name only fields the ledger holds — the day field, the key fields, [ledger] columns"
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

/// Reads a snapshot file; one of another [`SNAPSHOT_FORMAT`] (an earlier version's: without per-row ledger
/// claims, or without a pipeline fingerprint or ledger claims at all) is refused.
///
/// # Errors
/// [`Error::Usage`] naming the file and the format.
pub fn read_snapshot(path: &Path) -> Result<Snapshot> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
    let format = v.get("format").and_then(serde_json::Value::as_u64);
    if format != Some(u64::from(SNAPSHOT_FORMAT)) {
        let what = match (
            format,
            v.get("pipeline").is_some() && v.get("ledger").is_some(),
        ) {
            (None, false) => "no pipeline fingerprint, no ledger claims".to_string(),
            (None, true) => "format 1: ledger claims per day only, none per row".to_string(),
            (Some(n), _) => format!("format {n}, this version reads format {SNAPSHOT_FORMAT}"),
        };
        return Err(Error::Usage(format!(
            "{} was taken by an earlier replaysafe ({what}): it cannot be compared row by row; take the snapshot \
             again with this version's `verify snapshot` before the backfill",
            path.display()
        )));
    }
    serde_json::from_value(v).map_err(|e| Error::Usage(format!("{}: {e}", path.display())))
}

/// Refuses to compare a report and a snapshot that cannot be compared: a dry run's report (nothing applied),
/// a report or snapshot of another pipeline (fingerprints differ), a report of an earlier version (no
/// fingerprint).
///
/// # Errors
/// [`Error::Usage`] saying which and what to do.
pub fn check_comparable(before: &Snapshot, report: &Report) -> Result<()> {
    if report.dry_run {
        return Err(Error::Usage(format!(
            "the report of backfill `{}` is a dry run's plan: nothing was applied, there is nothing to verify; \
             run the backfill without --dry-run (-o report.json) and verify that report",
            report.group_id
        )));
    }
    let Some(fp) = &report.pipeline else {
        return Err(Error::Usage(format!(
            "the report of backfill `{}` has no pipeline fingerprint (written by an earlier replaysafe): it cannot \
             be matched to the snapshot's pipeline",
            report.group_id
        )));
    };
    if *fp != before.pipeline {
        return Err(Error::Usage(format!(
            "the report of backfill `{}` comes from another pipeline than the snapshot (pipeline fingerprints {} \
             and {}: identity, ledger, filter rules or projections differ): take the snapshot with the pipeline \
             file the backfill runs with",
            report.group_id,
            short(fp),
            short(&before.pipeline)
        )));
    }
    Ok(())
}

/// The first 12 hex digits of a fingerprint.
pub fn short(fp: &str) -> &str {
    &fp[..fp.len().min(12)]
}

/// Compares a fresh snapshot with `before` and the backfill `report` ([`check_comparable`] first): per day, the
/// change must equal what the backfill landed plus what other groups claimed since `before`, and every row its
/// claims ([`account`]). Returns the days and rows that differ and the printed table.
///
/// # Errors
/// As [`check_comparable`]; [`Error::Usage`] when the pipeline file changed since the snapshot; reading the files
/// or the database.
pub fn diff(before: &Snapshot, report: &Report) -> Result<Outcome> {
    check_comparable(before, report)?;
    let after = snapshot(
        &before.config,
        &before.table,
        Some(&before.column),
        before.filter.as_deref(),
    )?;
    if after.pipeline != before.pipeline {
        return Err(Error::Usage(format!(
            "the pipeline file {} changed since the snapshot (fingerprint {} then, {} now): the two snapshots \
             would not compare the same definition",
            before.config.display(),
            short(&before.pipeline),
            short(&after.pipeline)
        )));
    }
    Ok(account(before, &after, report))
}

/// A decimal text as a number (0 when it does not parse).
fn num(s: &str) -> BigDecimal {
    BigDecimal::from_str(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
[kafka]
group-id = "g"
topics = ["t"]
[postgres]
schema = "s"
[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/customer_id", type = "text" }
amount = { path = "/amount", type = "numeric" }
[identity]
key = ["event_id"]
partition-by = "day"
[ledger]
columns = ["amount"]
[[projection]]
kind = "sum"
table = "totals"
group-by = ["day", "customer_id"]
add = { total = "amount", again = "amount" }
"#;

    #[test]
    fn a_sum_with_several_columns_needs_column_and_knows_the_ledger_holds_its_field() {
        let p = config::parse("p.toml", TEXT).unwrap();
        let e = target(&p, "totals", None).err().unwrap().to_string();
        assert!(e.contains("--column"), "{e}");
        let t = target(&p, "totals", Some("again")).unwrap();
        assert_eq!(
            (t.column.as_str(), t.ledger_sum.as_deref()),
            ("again", Some("\"amount\""))
        );
        assert!(t.exact);
        assert!(target(&p, "totals", Some("nope")).is_err());
        let other = config::parse(
            "p.toml",
            &TEXT.replace("[ledger]\ncolumns = [\"amount\"]\n", ""),
        )
        .unwrap();
        assert_eq!(
            target(&other, "totals", Some("total")).unwrap().ledger_sum,
            None
        );
    }

    #[test]
    fn the_fingerprint_follows_what_is_counted_only() {
        let p = config::parse("p.toml", TEXT).unwrap();
        let fp = pipeline_fingerprint(&p);
        assert_eq!(fp.len(), 64);
        let batch = config::parse("p.toml", &format!("{TEXT}[batch]\nmax-records = 7\n")).unwrap();
        assert_eq!(pipeline_fingerprint(&batch), fp);
        let generation = TEXT.replace(
            "partition-by = \"day\"",
            "partition-by = \"day\"\ngeneration = \"b\"",
        );
        let filtered = TEXT.replace(
            "[identity]",
            "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"amount < 0.0\"\n[identity]",
        );
        for text in [
            generation,
            filtered,
            TEXT.replace(
                "group-by = [\"day\", \"customer_id\"]",
                "group-by = [\"day\"]",
            ),
        ] {
            assert_ne!(
                pipeline_fingerprint(&config::parse("p.toml", &text).unwrap()),
                fp,
                "{text}"
            );
        }
    }
}
