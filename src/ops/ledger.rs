//! `replaysafe ledger stats` and `replaysafe ledger prune` (docs/replay.md "The ledger's lifecycle").

use chrono::NaiveDate;
use serde_json::{json, Value};
use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::sink::ledger::{self, DDL_LOCK};
use crate::sink::lifecycle::{self, PruneReport};

/// One table of the ledger: a day partition (or the whole ledger without `partition-by`).
#[derive(Debug, Clone)]
pub struct TableStats {
    /// The event day (`None`: the unpartitioned ledger).
    pub day: Option<NaiveDate>,
    /// Schema-qualified name.
    pub table: String,
    /// Rows (`count(*)`).
    pub rows: i64,
    /// `pg_table_size`: heap, TOAST, free space and visibility maps, bytes.
    pub heap_bytes: i64,
    /// `pg_indexes_size`, bytes.
    pub index_bytes: i64,
    /// `pg_total_relation_size` (= heap + indexes), bytes.
    pub total_bytes: i64,
}

/// What `ledger stats` reports.
#[derive(Debug, Clone)]
pub struct Stats {
    /// The ledger table.
    pub ledger: String,
    /// Its day partitions, oldest first (or the one table).
    pub tables: Vec<TableStats>,
    /// `[ledger] horizon-days`.
    pub horizon_days: Option<u32>,
    /// The durable pruned-below day.
    pub pruned_below: Option<NaiveDate>,
    /// The oldest event day a claim may land now.
    pub oldest_claimable: Option<NaiveDate>,
    /// The database's UTC date.
    pub today: Option<NaiveDate>,
    /// Tombstones held by the row projections.
    pub tombstones: i64,
    /// Rows of `replaysafe_conflicts` (0 when the pipeline has no row projection).
    pub conflicts: i64,
    /// Ledger rows per day: of the last (up to) 7 event days with `partition-by`, else since the first claim.
    pub rows_per_day: f64,
    /// Recorded pruned offsets: `(topic, partition)` → `(through, below, at)` for this generation.
    pub pruned: Vec<lifecycle::PrunedOffset>,
}

impl Stats {
    /// Rows over all tables.
    pub fn rows(&self) -> i64 {
        self.tables.iter().map(|t| t.rows).sum()
    }
    /// Bytes over all tables (heap + indexes).
    pub fn bytes(&self) -> i64 {
        self.tables.iter().map(|t| t.total_bytes).sum()
    }
    /// Bytes per ledger row (`None` without rows).
    pub fn bytes_per_event(&self) -> Option<f64> {
        (self.rows() > 0).then(|| self.bytes() as f64 / self.rows() as f64)
    }
    /// The ledger's size once it holds `horizon-days` days at the current daily rate, bytes.
    pub fn projected_bytes(&self) -> Option<f64> {
        Some(self.bytes_per_event()? * self.rows_per_day * f64::from(self.horizon_days?))
    }
}

/// Reads the ledger's statistics from the catalog and its tables (read-only; counts every row).
///
/// # Errors
/// [`Error::Postgres`]; [`Error::Schema`] when the ledger does not exist.
pub async fn stats(client: &Client, p: &Pipeline) -> Result<Stats> {
    let ledger_name = p.ledger.table.to_string();
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&ledger_name])
        .await?
        .get(0);
    if exists.is_none() {
        return Err(Error::Schema(format!(
            "ledger {ledger_name} does not exist: run `replaysafe init --config FILE` first"
        )));
    }
    let mut names: Vec<(Option<NaiveDate>, String)> = Vec::new();
    if p.identity.partition_by.is_some() {
        let mut days: Vec<NaiveDate> = ledger::existing_partitions(client, p)
            .await?
            .into_iter()
            .collect();
        days.sort();
        for d in days {
            let t = format!(
                "{}.\"{}\"",
                p.ledger.table.schema,
                ledger::partition_name(p, d)
            );
            names.push((Some(d), t));
        }
    } else {
        names.push((None, ledger_name.clone()));
    }
    let mut tables = Vec::new();
    for (day, table) in names {
        tables.push(table_stats(client, day, table).await?);
    }
    let horizon = ledger::current_horizon(client, p).await?;
    let generation = p.identity.generation.clone().unwrap_or_default();
    Ok(Stats {
        ledger: ledger_name,
        tables,
        horizon_days: p.ledger.horizon_days,
        pruned_below: horizon.and_then(|h| h.pruned_below),
        oldest_claimable: horizon.and_then(|h| h.oldest),
        today: horizon.map(|h| h.today),
        tombstones: tombstones(client, p).await?,
        conflicts: conflicts(client, p).await?,
        rows_per_day: rows_per_day(client, p).await?,
        pruned: lifecycle::pruned_offsets(client, p, &generation).await?,
    })
}

async fn table_stats(client: &Client, day: Option<NaiveDate>, table: String) -> Result<TableStats> {
    let row = client
        .query_one(
            &format!(
                "SELECT (SELECT count(*)::bigint FROM {table}), pg_table_size(to_regclass($1)), \
                 pg_indexes_size(to_regclass($1)), pg_total_relation_size(to_regclass($1))"
            ),
            &[&table],
        )
        .await?;
    Ok(TableStats {
        day,
        table,
        rows: row.get(0),
        heap_bytes: row.get(1),
        index_bytes: row.get(2),
        total_bytes: row.get(3),
    })
}

/// Ledger rows per day. With `partition-by`: the rows of the last (up to) 7 event days (the database's UTC date
/// and the 6 days before) over the days from the oldest of them through today — the rate the day partitions
/// grow at, which is what the horizon keeps. Without: every row over the days since the ledger's first source
/// was claimed from (`replaysafe_sources.created_at`; the ledger keeps no claim time per row).
async fn rows_per_day(client: &Client, p: &Pipeline) -> Result<f64> {
    let sql = match p.identity.partition_by {
        Some(d) => format!(
            "WITH t AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today) \
             SELECT count(*)::float8, (t.today - min(l.{day}) + 1)::float8 FROM {ledger} l, t \
             WHERE l.{day} > t.today - 7 AND l.{day} <= t.today GROUP BY t.today",
            day = p.fields[d].name,
            ledger = p.ledger.table
        ),
        None => format!(
            "SELECT count(*)::float8, extract(epoch FROM now() - min(s.created_at))::float8 / 86400.0 \
             FROM {} l JOIN {} s ON s.id = l._source_id",
            p.ledger.table,
            p.table(crate::sink::ledger::SOURCES)
        ),
    };
    let Some(row) = client.query_opt(&sql, &[]).await? else {
        return Ok(0.0);
    };
    let (n, days): (f64, Option<f64>) = (row.get(0), row.get(1));
    Ok(n / days.unwrap_or(1.0).ceil().max(1.0))
}

async fn count_if_exists(client: &Client, table: &str, filter: &str) -> Result<i64> {
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(0);
    }
    let sql = format!("SELECT count(*)::bigint FROM {table} {filter}");
    Ok(client.query_one(&sql, &[]).await?.get(0))
}

async fn tombstones(client: &Client, p: &Pipeline) -> Result<i64> {
    let mut n = 0;
    for plan in p.projections.iter().filter_map(|x| x.row.as_ref()) {
        let (table, cond) = plan.tombstone_rows();
        n += count_if_exists(client, &table, &format!("WHERE {cond}")).await?;
    }
    Ok(n)
}

async fn conflicts(client: &Client, p: &Pipeline) -> Result<i64> {
    let Some(table) = crate::projection::row::conflicts_table(p) else {
        return Ok(0);
    };
    let names: Vec<String> = p.projections.iter().map(|x| x.name.clone()).collect();
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(0);
    }
    let sql = format!("SELECT count(*)::bigint FROM {table} WHERE projection = ANY($1)");
    Ok(client.query_one(&sql, &[&names]).await?.get(0))
}

/// `ledger prune`: creates the pruned-offsets table when the pipeline manages its schema (under the DDL lock),
/// then [`lifecycle::prune_with`], each lock wait bounded by `lock_timeout`.
///
/// # Errors
/// As [`lifecycle::prune`]; [`Error::Schema`] when a table it needs is missing under `manage-schema = false`.
pub async fn prune(
    client: &mut Client,
    p: &Pipeline,
    dry_run: bool,
    lock_timeout: std::time::Duration,
) -> Result<PruneReport> {
    // Checked before any DDL: a pipeline never initialised (its schema missing) is named, not a raw SQLSTATE.
    let create = p.postgres.manage_schema && !dry_run;
    let missing = crate::sink::privileges::missing_tables(client, p).await?;
    let mut needed = vec![
        p.ledger.table.to_string(),
        p.table(ledger::HORIZON).to_string(),
    ];
    if !dry_run && !create {
        needed.push(p.table(lifecycle::PRUNED).to_string());
    }
    if let Some(m) = missing.iter().find(|m| needed.contains(m)) {
        return Err(Error::Schema(format!(
            "{m} is missing: run `replaysafe init --config FILE` as the schema's owner first"
        )));
    }
    if create {
        let tx = client.transaction().await?;
        tx.execute(DDL_LOCK, &[]).await?;
        tx.batch_execute(&lifecycle::create_pruned(p)).await?;
        tx.commit().await?;
    }
    lifecycle::prune_with(client, p, dry_run, lock_timeout)
        .await
        .map_err(|e| match e {
            Error::Postgres(pg) if pg.code().is_some_and(|c| c.code() == "55P03") => Error::Other(format!(
                "ledger {}: a lock the prune needs was not granted within {lock_timeout:?} ({}); no partition \
                 was dropped, no pruned offset recorded, nothing purged (the horizon day may have been raised: \
                 claims of older days are quarantined) — a long transaction reading or writing the ledger holds \
                 it; retry later or with a longer --lock-timeout",
                p.ledger.table,
                crate::model::describe(&pg)
            )),
            other => other,
        })
}

/// `ledger stats` as text.
pub fn stats_text(s: &Stats) -> String {
    let mut out = format!("ledger {}\n", s.ledger);
    out.push_str(&format!(
        "{:<12} {:>12} {:>14} {:>14} {:>14}\n",
        "day", "rows", "heap bytes", "index bytes", "total bytes"
    ));
    for t in &s.tables {
        let day = t.day.map_or_else(|| "(all)".to_string(), |d| d.to_string());
        out.push_str(&format!(
            "{day:<12} {:>12} {:>14} {:>14} {:>14}\n",
            t.rows, t.heap_bytes, t.index_bytes, t.total_bytes
        ));
    }
    let opt = |d: Option<NaiveDate>| d.map_or_else(|| "none".to_string(), |d| d.to_string());
    let days: Vec<Option<NaiveDate>> = s.tables.iter().map(|t| t.day).collect();
    out.push_str(&format!(
        "total: {} rows, {} bytes; bytes per event: {}\n",
        s.rows(),
        s.bytes(),
        s.bytes_per_event()
            .map_or_else(|| "n/a".to_string(), |b| format!("{b:.1}"))
    ));
    out.push_str(&format!(
        "days: oldest {}, newest {}; horizon-days {}, pruned below {}, oldest claimable {}, database date {}\n",
        opt(days.first().copied().flatten()),
        opt(days.last().copied().flatten()),
        s.horizon_days
            .map_or_else(|| "none".to_string(), |d| d.to_string()),
        opt(s.pruned_below),
        opt(s.oldest_claimable),
        opt(s.today)
    ));
    out.push_str(&format!(
        "tombstones: {}; conflicts: {}\n",
        s.tombstones, s.conflicts
    ));
    out.push_str(&match s.projected_bytes() {
        Some(b) => format!(
            "projected size over the horizon: {b:.0} bytes ({:.1} rows/day × {:.1} bytes/event × {} days)\n",
            s.rows_per_day,
            s.bytes_per_event().unwrap_or(0.0),
            s.horizon_days.unwrap_or(0)
        ),
        None => format!(
            "projected size: n/a ({:.1} rows/day; needs horizon-days and rows)\n",
            s.rows_per_day
        ),
    });
    for ((t, p), (through, below, at)) in &s.pruned {
        out.push_str(&format!(
            "pruned: {t}/{p} offsets up to {through} (days before {below}, at {at})\n"
        ));
    }
    out
}

/// `ledger stats --json`.
pub fn stats_json(s: &Stats) -> Value {
    let days: Vec<Option<NaiveDate>> = s.tables.iter().map(|t| t.day).collect();
    let d = |d: Option<NaiveDate>| d.map(|d| d.to_string());
    json!({
        "ledger": s.ledger,
        "partitions": s.tables.iter().map(|t| json!({
            "day": d(t.day), "table": t.table, "rows": t.rows, "heap_bytes": t.heap_bytes,
            "index_bytes": t.index_bytes, "total_bytes": t.total_bytes,
        })).collect::<Vec<_>>(),
        "rows": s.rows(),
        "bytes": s.bytes(),
        "bytes_per_event": s.bytes_per_event(),
        "oldest_day": d(days.first().copied().flatten()),
        "newest_day": d(days.last().copied().flatten()),
        "horizon_days": s.horizon_days,
        "pruned_below": d(s.pruned_below),
        "oldest_claimable": d(s.oldest_claimable),
        "database_date": d(s.today),
        "tombstones": s.tombstones,
        "conflicts": s.conflicts,
        "rows_per_day": s.rows_per_day,
        "projected_bytes": s.projected_bytes(),
        "pruned_offsets": s.pruned.iter().map(|((t, p), (through, below, at))| json!({
            "topic": t, "partition": p, "through": through, "below": below.to_string(), "at": at,
        })).collect::<Vec<_>>(),
    })
}

/// `ledger prune` as text.
pub fn prune_text(p: &Pipeline, r: &PruneReport) -> String {
    let Some(below) = r.pruned_below else {
        return format!(
            "ledger {}: no horizon (`[ledger] horizon-days` with `identity.partition-by`): nothing to prune\n{}",
            p.ledger.table,
            outbox_text(r)
        );
    };
    let verb = if r.dry_run { "would drop" } else { "dropped" };
    let mut out = format!(
        "ledger {}: pruned below {below}{}\n",
        p.ledger.table,
        if r.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        }
    );
    for d in &r.dropped {
        out.push_str(&format!(
            "{verb} {} (day {}, {} rows, {} bytes)\n",
            d.table, d.day, d.rows, d.bytes
        ));
    }
    for o in &r.offsets {
        out.push_str(&format!(
            "pruned horizon {}/{}: offsets up to {} ({} rows){}\n",
            o.topic,
            o.partition,
            o.through,
            o.rows,
            if o.generation.is_empty() {
                String::new()
            } else {
                format!(" of generation `{}`", o.generation)
            }
        ));
    }
    let verb = if r.dry_run { "would purge" } else { "purged" };
    for (t, n) in &r.tombstones {
        out.push_str(&format!("{verb} {n} tombstones of {t}\n"));
    }
    out.push_str(&format!(
        "{verb} {} conflicts, {} claimed row versions; {} partitions {}\n",
        r.conflicts,
        r.row_versions,
        r.dropped.len(),
        if r.dry_run { "to drop" } else { "dropped" }
    ));
    out.push_str(&outbox_text(r));
    out
}

/// One line per outbox table: the published rows older than `[outbox] keep-days` purged (or, dry run, to purge).
fn outbox_text(r: &PruneReport) -> String {
    let verb = if r.dry_run { "would purge" } else { "purged" };
    r.outbox
        .iter()
        .map(|(t, n)| {
            format!("{verb} {n} published outbox rows of {t} (older than [outbox] keep-days)\n")
        })
        .collect()
}

/// `ledger prune --json`.
pub fn prune_json(r: &PruneReport) -> Value {
    json!({
        "dry_run": r.dry_run,
        "pruned_below": r.pruned_below.map(|d| d.to_string()),
        "dropped": r.dropped.iter().map(|d| json!({
            "day": d.day.to_string(), "table": d.table, "rows": d.rows, "bytes": d.bytes,
        })).collect::<Vec<_>>(),
        "pruned_offsets": r.offsets.iter().map(|o| json!({
            "generation": o.generation, "topic": o.topic, "partition": o.partition,
            "through": o.through, "rows": o.rows,
        })).collect::<Vec<_>>(),
        "tombstones": r.tombstones.iter().map(|(t, n)| json!({"table": t, "purged": n})).collect::<Vec<_>>(),
        "conflicts": r.conflicts,
        "row_versions": r.row_versions,
        "outbox": r.outbox.iter().map(|(t, n)| json!({"table": t, "purged": n})).collect::<Vec<_>>(),
    })
}

/// Refuses a replay window (backfill, rebuild) whose partitions start at or below their recorded pruned offset
/// ([`lifecycle::PRUNED`], for the pipeline's generation), before anything is read or deleted. Each plan is
/// `(topic, partition, start, stop)` with `stop` exclusive; an empty window is never refused. A window of event
/// days (`first_day`: a rebuild's `--from`) starting on or after the day a partition was pruned below is not
/// refused: its records of older days are filtered out and its own days' ledger rows are all there (a prune
/// drops whole days), however far late events of pruned days raised the pruned offset; every batch still checks
/// its records (`sink::lifecycle::check_pruned`). Nor is a partition on which `group` (the backfill's
/// `--group-id`) already applied a record: the rerun of an interrupted backfill resumes from its checkpoint and
/// continues what it applied — as a worker resuming from its own checkpoint does, its records of pruned days are
/// quarantined as `beyond-horizon` and the ledger rows of the other days are all there.
///
/// # Errors
/// [`Error::BelowHorizon`] naming the partition and the offset range; [`Error::Postgres`].
pub fn refuse_below_pruned(
    p: &Pipeline,
    database_url: &str,
    group: &str,
    plans: &[(String, i32, i64, i64)],
    first_day: Option<NaiveDate>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let generation = p.identity.generation.clone().unwrap_or_default();
    let (pruned, continuing) = rt.block_on(async {
        let client = crate::sink::connect_with(database_url, &p.postgres.timeouts).await?;
        let pruned = lifecycle::pruned_offsets(&client, p, &generation).await?;
        Ok::<_, Error>((pruned, applied_by(&client, p, group, &generation).await?))
    })?;
    let mut refused = Vec::new();
    for (topic, partition, start, stop) in plans {
        if continuing.contains(&(topic.clone(), *partition)) {
            continue;
        }
        let found = pruned
            .iter()
            .find(|((t, n), _)| t == topic && n == partition);
        if let Some((_, (through, below, at))) = found {
            if start <= through && stop > start && first_day.is_none_or(|d| d < *below) {
                refused.push(lifecycle::below_message(
                    p,
                    (topic, *partition),
                    (*start, *through.min(&(stop - 1))),
                    *below,
                    at,
                ));
            }
        }
    }
    match refused.is_empty() {
        true => Ok(()),
        false => Err(Error::BelowHorizon(refused.join("\n"))),
    }
}

/// The partitions on which `group` applied a record under `generation` (its checkpoint's `last_offset` is a
/// record, not [`crate::sink::checkpoint::NOTHING_APPLIED`] nor unknown); empty before the table exists.
///
/// # Errors
/// [`Error::Postgres`].
async fn applied_by(
    client: &Client,
    p: &Pipeline,
    group: &str,
    generation: &str,
) -> Result<std::collections::HashSet<(String, i32)>> {
    let table = p.table(crate::sink::checkpoint::CHECKPOINTS);
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table.to_string()])
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(std::collections::HashSet::new());
    }
    let rows = client
        .query(
            &format!(
                "SELECT topic, partition FROM {table} WHERE consumer_group = $1 AND generation = $2 \
                 AND last_offset > $3"
            ),
            &[&group, &generation, &crate::sink::checkpoint::NOTHING_APPLIED],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// How long [`warn_retention`] waits for the broker's answer.
pub const RETENTION_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// At the start of `run` and `backfill`: reads each topic's `retention.ms` (Kafka DescribeConfigs, through
/// [`crate::source::kafka::client_config`], bounded by [`RETENTION_READ_TIMEOUT`]) and warns when Kafka keeps
/// records longer than the ledger remembers their delivery keys (`horizon-days`), stating the safe replay
/// window. Returns the warnings. A failure to read it is itself only a warning; without a horizon nothing is
/// checked (the ledger remembers every key).
pub fn warn_retention(p: &Pipeline, brokers: &str) -> Vec<String> {
    let Some(days) = p.ledger.horizon_days else {
        return Vec::new();
    };
    let horizon_ms = i64::from(days) * 86_400_000;
    let mut out = Vec::new();
    for t in &p.kafka.topics {
        let msg = match read_retention(p, brokers, t) {
            Ok(ms) if ms >= 0 && ms <= horizon_ms => continue,
            Ok(ms) => {
                let keeps = if ms < 0 {
                    "forever (retention.ms = -1)".to_string()
                } else {
                    format!("{:.1} days (retention.ms = {ms})", ms as f64 / 86_400_000.0)
                };
                format!(
                    "topic {t}: Kafka keeps records {keeps}, longer than the ledger remembers their delivery keys \
                     (horizon-days = {days}). Safe replay window: records of the last {days} days (event days \
                     inside the horizon); a replay reaching older records — a fresh group or a reset checkpoint \
                     from the earliest offsets, a backfill or rebuild further back — is refused below the pruned \
                     offsets (exit 2) and quarantines older event days as beyond-horizon, never counts them again"
                )
            }
            Err(e) => format!(
                "topic {t}: could not read retention.ms ({e}); not compared with the ledger horizon \
                 (horizon-days = {days})"
            ),
        };
        tracing::warn!("{msg}");
        out.push(msg);
    }
    out
}

/// The topic's `retention.ms` (`-1`: forever; the broker's default when the topic sets none).
fn read_retention(p: &Pipeline, brokers: &str, topic: &str) -> Result<i64> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        crate::source::kafka::client_config(p, brokers).create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let opts = AdminOptions::new().request_timeout(Some(RETENTION_READ_TIMEOUT));
    let spec = ResourceSpecifier::Topic(topic);
    let asked = admin.describe_configs([&spec], &opts);
    let res = rt
        .block_on(async { tokio::time::timeout(RETENTION_READ_TIMEOUT, asked).await })
        .map_err(|_| Error::Other(format!("no answer in {RETENTION_READ_TIMEOUT:?}")))??;
    let resource = match res.into_iter().next() {
        Some(Ok(r)) => r,
        Some(Err(e)) => return Err(Error::Other(e.to_string())),
        None => return Err(Error::Other("empty answer".into())),
    };
    resource
        .get("retention.ms")
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Other("no retention.ms in the answer".into()))
}
