//! The ledger's lifecycle: the prune (day partitions wholly older than the horizon dropped, tombstones and
//! conflicts older than it purged, the offsets whose ledger rows are gone recorded per topic/partition in
//! `replaysafe_pruned`) and the refusal of a batch reaching below a recorded pruned offset.

use chrono::NaiveDate;
use tokio_postgres::{Client, GenericClient, Statement, Transaction};

use super::ledger::{self, partition_name, DDL_LOCK, HORIZON};
use super::Batch;
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::Pending;
use crate::projection::outbox;

/// Name of the pruned-offsets table (in the pipeline schema).
pub const PRUNED: &str = "replaysafe_pruned";

/// `CREATE TABLE` for the pruned-offsets table: per ledger, stream generation, topic and partition,
/// `pruned_through` — the highest offset whose ledger row a prune dropped (every offset up to it may have lost
/// its row) — the pruned-below day that prune enforced, and the ledger rows it dropped. Raised (never lowered)
/// in the prune's transaction; read by every batch ([`pruned_statement`]) and by `backfill`/`rebuild` plans.
pub fn create_pruned(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (ledger text NOT NULL, generation text NOT NULL, topic text NOT NULL, \
         partition integer NOT NULL, pruned_through bigint NOT NULL, pruned_below date NOT NULL, \
         rows_pruned bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (ledger, generation, topic, partition))",
        p.table(PRUNED)
    )
}

/// The pruned offset of one partition: `$1` ledger, `$2` generation, `$3` topic, `$4` partition (int4).
/// Returns `pruned_through`, `pruned_below`, `updated_at` — no row when nothing of it was pruned.
pub fn pruned_statement(p: &Pipeline) -> String {
    format!(
        "SELECT pruned_through, pruned_below, updated_at::text FROM {} \
         WHERE ledger = $1 AND generation = $2 AND topic = $3 AND partition = $4",
        p.table(PRUNED)
    )
}

/// Step 1c of the batch transaction (after the horizon row's share lock, which a prune's update waits for and
/// holds until it commits — so what is read here is every prune committed before): a batch holding a record at
/// or below its partition's pruned offset that may have lost its ledger row (a claim of a pruned day, or one
/// quarantined as `beyond-horizon`; not a claim of a day inside the horizon — late events of pruned days raise
/// the pruned offset above them — nor a record filtered out) is refused — unless it `continues` what its group applied of the
/// partition (`checkpoint::advance`: a worker resuming from its own checkpoint, which lags below offsets another
/// group claimed and a prune dropped, is no replay; its records of expired days were quarantined by step 1b
/// and the ledger rows of the other days are all there). A fresh group, a checkpoint moved back, a `load`, a
/// `backfill` or a `rebuild` reaching the pruned offsets are refused.
///
/// # Errors
/// [`ApplyError::Fatal`] with [`Error::BelowHorizon`] naming the partition and the offset range; database errors
/// as [`classify`].
pub(super) async fn check_pruned(
    tx: &Transaction<'_>,
    stmt: Option<&Statement>,
    p: &Pipeline,
    generation: &str,
    batch: &Batch,
    continues: bool,
) -> std::result::Result<(), ApplyError> {
    let (Some(stmt), false) = (stmt, batch.items.is_empty()) else {
        return Ok(());
    };
    if continues {
        return Ok(());
    }
    let row = tx
        .query_opt(
            stmt,
            &[
                &p.ledger.table.to_string(),
                &generation,
                &batch.topic,
                &batch.partition,
            ],
        )
        .await
        .map_err(|e| classify(e, false))?;
    let Some(row) = row else {
        return Ok(());
    };
    let (through, below, at): (i64, NaiveDate, String) = (row.get(0), row.get(1), row.get(2));
    let Some(first) = batch
        .items
        .iter()
        .filter(|it| it.offset <= through && may_have_lost_its_row(p, it, below))
        .map(|it| it.offset)
        .min()
    else {
        return Ok(());
    };
    Err(ApplyError::Fatal(Error::BelowHorizon(below_message(
        p,
        (&batch.topic, batch.partition),
        (first, through),
        below,
        &at,
    ))))
}

/// Whether record `it` (at or below a pruned offset) may be one whose ledger row the prune dropped: a claim of
/// an event day before `below` (or of no day), or one the horizon step quarantined as `beyond-horizon`. A claim
/// of a day from `below` on has its ledger day partition (a prune drops whole days only), so a duplicate is
/// recognised; a record filtered out (a rebuild's day window, `[[filter]]`) is not applied at all.
fn may_have_lost_its_row(p: &Pipeline, it: &crate::model::batch::Item, below: NaiveDate) -> bool {
    match &it.pending {
        Pending::Claim { fields, .. } => {
            crate::decode::partition_day(p, fields).is_none_or(|d| d < below)
        }
        Pending::Quarantine(r) => r.reason == crate::decode::Reason::BeyondHorizon,
        Pending::Filtered(_) => false,
    }
}

/// The refusal of a replay reaching offsets `first..=through` of `topic/partition`, pruned below `below` at `at`.
pub fn below_message(
    p: &Pipeline,
    (topic, partition): (&str, i32),
    (first, through): (i64, i64),
    below: NaiveDate,
    at: &str,
) -> String {
    format!(
        "{topic}/{partition}: offsets {first}..={through} are below the ledger's pruned horizon: a prune of ledger {} \
         (at {at}, event days before {below}) dropped ledger rows of offsets up to {through}, so the ledger can no \
         longer recognise those records as duplicates and replaying them could count them again. Refused; nothing \
         of it was committed. Replay from offset {} on (backfill: a later --from; run: with the group stopped, set \
         its next_offset in replaysafe_checkpoints to at least that), or rebuild the \
         days from {below} on (docs/replay.md \"The ledger's lifecycle\")",
        p.ledger.table,
        through + 1
    )
}

/// What each partition lost to a prune: `(generation, topic, partition)` → the highest offset and rows dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedRange {
    /// Stream generation ('' for none).
    pub generation: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The highest offset whose ledger row was (or would be) dropped.
    pub through: i64,
    /// Ledger rows dropped of this partition.
    pub rows: i64,
}

/// One day partition dropped (or to be dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedDay {
    /// The event day.
    pub day: NaiveDate,
    /// Its table name.
    pub table: String,
    /// Rows it held.
    pub rows: i64,
    /// `pg_total_relation_size` (heap, indexes, TOAST), bytes.
    pub bytes: i64,
}

/// What a prune did (or, dry run, would do).
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// The pruned-below day enforced (`None`: no horizon, nothing to prune).
    pub pruned_below: Option<NaiveDate>,
    /// Day partitions wholly before it.
    pub dropped: Vec<DroppedDay>,
    /// Per partition, the offsets whose ledger rows went with them (recorded in [`PRUNED`]).
    pub offsets: Vec<PrunedRange>,
    /// Tombstones purged per row projection table (deleted before the pruned-below day).
    pub tombstones: Vec<(String, i64)>,
    /// `replaysafe_conflicts` rows purged (detected before the pruned-below day).
    pub conflicts: i64,
    /// `replaysafe_row_versions` rows purged (claimed states of event days before the pruned-below day: the row
    /// projections forget them with the ledger's day partitions).
    pub row_versions: i64,
    /// Published outbox rows purged per outbox table (published more than `[outbox] keep-days` ago;
    /// `crate::projection::outbox::purge_published`). Done with or without a horizon.
    pub outbox: Vec<(String, u64)>,
}

/// Default longest wait for each lock of a prune (the horizon row, the partitions and the ledger to drop); past
/// it the prune fails (SQLSTATE 55P03), changing nothing, and is retried later (`ledger prune --lock-timeout`).
pub const PRUNE_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// `SET LOCAL` of the prune's transaction: `lock_timeout`, and the statement timeout raised 30 s above it (a lock
/// wait counts toward it; the session's `postgres.statement-timeout-ms` may be shorter).
fn lock_settings(lock_timeout: std::time::Duration) -> String {
    let ms = lock_timeout.as_millis().max(1);
    format!(
        "SET LOCAL lock_timeout = '{ms}ms'; SET LOCAL statement_timeout = '{}ms'",
        ms + 30_000
    )
}

/// Prunes the ledger to its horizon in two transactions, each lock wait bounded (a minute):
/// 1. under the DDL lock, raises the durable pruned-below day (`replaysafe_horizon`) to the database's UTC date
///    minus `horizon-days` (never back) and commits — the update waits for the batches holding the horizon row; from then on every
///    claim of an older day is quarantined, so the expired partitions receive no row any more;
/// 2. reads the expired day partitions (the highest offset and the rows per generation/topic/partition: a scan,
///    while batches go on, before the DDL lock), then takes the DDL lock and the horizon row (waiting for the
///    batches in flight, holding the next ones at their horizon step) and, in that transaction, records the
///    pruned offsets ([`PRUNED`]) of the partitions still there (another prune may have dropped some), drops the day
///    partitions before the day, and purges tombstones and conflicts recorded before it. Running batches wait
///    only for this tail, not for the scan. A crash between the two leaves the day raised and the partitions for
///    the next prune (claims are quarantined by the day meanwhile).
///
/// With `dry_run`, one read-only transaction reports the same without changing anything (and without waiting for
/// locks).
///
/// # Errors
/// [`Error::Postgres`] (also when a lock is not granted within [`PRUNE_LOCK_TIMEOUT`]).
pub async fn prune(client: &mut Client, p: &Pipeline, dry_run: bool) -> Result<PruneReport> {
    prune_with(client, p, dry_run, PRUNE_LOCK_TIMEOUT).await
}

/// As [`prune`], each lock wait bounded by `lock_timeout`.
///
/// # Errors
/// As [`prune`]; a lock not granted within `lock_timeout` is SQLSTATE 55P03 (nothing of that transaction
/// changed).
pub async fn prune_with(
    client: &mut Client,
    p: &Pipeline,
    dry_run: bool,
    lock_timeout: std::time::Duration,
) -> Result<PruneReport> {
    let mut report = PruneReport {
        dry_run,
        ..PruneReport::default()
    };
    let (Some(days), Some(_)) = (p.ledger.horizon_days, p.identity.partition_by) else {
        // No horizon: nothing of the ledger to prune; published outbox rows still age out.
        report.outbox = outbox::purge_published(&*client, p, dry_run).await?;
        return Ok(report);
    };
    let days = crate::units::int_days(days);
    if dry_run {
        let tx = client.transaction().await?;
        tx.batch_execute("SET TRANSACTION READ ONLY").await?;
        let below = raise_horizon(&tx, p, days, true).await?;
        report.pruned_below = Some(below);
        fold(&mut report, scan_expired(&tx, p, below).await?);
        report.tombstones = purge_tombstones(&tx, p, below, true).await?;
        report.conflicts = purge_conflicts(&tx, p, below, true).await?;
        report.row_versions = purge_row_versions(&tx, p, below, true).await?;
        report.outbox = outbox::purge_published(&tx, p, true).await?;
        tx.rollback().await?;
        return Ok(report);
    }
    let tx = client.transaction().await?;
    tx.batch_execute(&lock_settings(lock_timeout)).await?;
    tx.execute(DDL_LOCK, &[]).await?;
    raise_horizon(&tx, p, days, false).await?;
    tx.commit().await?;

    let tx = client.transaction().await?;
    // The day in force now (another prune may have raised it further meanwhile).
    let below: NaiveDate = tx
        .query_one(
            &format!(
                "SELECT pruned_below FROM {} WHERE ledger = $1",
                p.table(HORIZON)
            ),
            &[&p.ledger.table.to_string()],
        )
        .await?
        .get(0);
    // The scan is work, not a wait: no statement timeout for it (its lock waits stay bounded by lock_timeout), and
    // no DDL lock yet (other pipelines' partition creations do not wait for it).
    tx.batch_execute(&format!(
        "{}; SET LOCAL statement_timeout = 0",
        lock_settings(lock_timeout)
    ))
    .await?;
    let scanned = scan_expired(&tx, p, below).await?;
    tx.batch_execute(&lock_settings(lock_timeout)).await?;
    tx.execute(DDL_LOCK, &[]).await?;
    // The horizon row: the batches in flight finish first; the next ones wait at their horizon step (holding no
    // ledger lock there), so the drops below never wait for them nor they for a lock the drops hold.
    tx.execute(
        &format!(
            "SELECT 1 FROM {} WHERE ledger = $1 FOR UPDATE",
            p.table(HORIZON)
        ),
        &[&p.ledger.table.to_string()],
    )
    .await?;
    // A concurrent prune may have dropped some of them meanwhile: only what is still there is ours.
    let present = ledger::existing_partitions(&tx, p).await?;
    let scanned = scanned
        .into_iter()
        .filter(|(d, _)| present.contains(&d.day))
        .collect();
    report.pruned_below = Some(below);
    fold(&mut report, scanned);
    record_pruned(&tx, p, below, &report.offsets).await?;
    for d in &report.dropped {
        tx.batch_execute(&format!(
            "DROP TABLE IF EXISTS {}.\"{}\"",
            p.ledger.table.schema, d.table
        ))
        .await?;
    }
    report.tombstones = purge_tombstones(&tx, p, below, false).await?;
    report.conflicts = purge_conflicts(&tx, p, below, false).await?;
    report.row_versions = purge_row_versions(&tx, p, below, false).await?;
    // [outbox] keep-days: published outbox rows older than it (never an unpublished one).
    report.outbox = outbox::purge_published(&tx, p, false).await?;
    tx.commit().await?;
    Ok(report)
}

/// One expired day partition measured: its size and, per generation/topic/partition, its offsets and rows.
type Scanned = (DroppedDay, Vec<PrunedRange>);

/// The day partitions before `below`, oldest first, each measured ([`measure`]).
async fn scan_expired(
    tx: &Transaction<'_>,
    p: &Pipeline,
    below: NaiveDate,
) -> Result<Vec<Scanned>> {
    let mut old: Vec<NaiveDate> = ledger::existing_partitions(tx, p)
        .await?
        .into_iter()
        .filter(|d| *d < below)
        .collect();
    old.sort();
    let mut out = Vec::with_capacity(old.len());
    for day in old {
        out.push(measure(tx, p, day).await?);
    }
    Ok(out)
}

/// Adds the measured partitions to the report (offsets merged per generation/topic/partition).
fn fold(report: &mut PruneReport, scanned: Vec<Scanned>) {
    for (dropped, ranges) in scanned {
        merge(&mut report.offsets, ranges);
        report.dropped.push(dropped);
    }
}

/// Raises the horizon row to today − `days` (dry run: only reads it) and returns the pruned-below day in force;
/// a longer horizon than the ledger still remembers is warned about.
async fn raise_horizon(
    tx: &Transaction<'_>,
    p: &Pipeline,
    days: i32,
    dry_run: bool,
) -> Result<NaiveDate> {
    let sql = if dry_run {
        format!(
            "SELECT greatest((SELECT pruned_below FROM {} WHERE ledger = $1), \
             (now() AT TIME ZONE 'UTC')::date - $2::int), (now() AT TIME ZONE 'UTC')::date - $2::int",
            p.table(HORIZON)
        )
    } else {
        format!(
            "INSERT INTO {} AS h (ledger, pruned_below) VALUES ($1, (now() AT TIME ZONE 'UTC')::date - $2::int) \
             ON CONFLICT (ledger) DO UPDATE SET pruned_below = greatest(h.pruned_below, EXCLUDED.pruned_below), \
             updated_at = now() RETURNING pruned_below, (now() AT TIME ZONE 'UTC')::date - $2::int",
            p.table(HORIZON)
        )
    };
    let row = tx
        .query_one(&sql, &[&p.ledger.table.to_string(), &days])
        .await?;
    let (below, asked): (NaiveDate, NaiveDate) = (row.get(0), row.get(1));
    if below > asked {
        tracing::warn!(
            ledger = %p.ledger.table,
            %below,
            %asked,
            "`horizon-days = {days}` asks the ledger to recognise event days from {asked}, but it was pruned below \
             {below} (a shorter horizon ran before): records of days before {below} stay quarantined as \
             beyond-horizon; the horizon grows back to {days} days one day at a time"
        );
    }
    Ok(below)
}

/// One day partition's size and, per topic/partition, its highest offset and rows (one scan).
async fn measure(
    tx: &Transaction<'_>,
    p: &Pipeline,
    day: NaiveDate,
) -> Result<(DroppedDay, Vec<PrunedRange>)> {
    let table = partition_name(p, day);
    let qualified = format!("{}.\"{}\"", p.ledger.table.schema, table);
    let bytes: i64 = tx
        .query_one(
            "SELECT pg_total_relation_size(to_regclass($1))",
            &[&qualified],
        )
        .await?
        .get(0);
    let rows = tx
        .query(
            &format!(
                "SELECT generation, topic, partition, max(\"offset\"), count(*)::bigint FROM {} l \
                 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
                super::ledger::ledger_rows_of(p, &qualified)
            ),
            &[],
        )
        .await?;
    let ranges: Vec<PrunedRange> = rows
        .iter()
        .map(|r| PrunedRange {
            generation: r.get(0),
            topic: r.get(1),
            partition: r.get(2),
            through: r.get(3),
            rows: r.get(4),
        })
        .collect();
    let dropped = DroppedDay {
        day,
        table,
        rows: ranges.iter().map(|r| r.rows).sum(),
        bytes,
    };
    Ok((dropped, ranges))
}

/// Adds `ranges` into `into` (highest offset, rows summed per generation/topic/partition).
fn merge(into: &mut Vec<PrunedRange>, ranges: Vec<PrunedRange>) {
    for r in ranges {
        match into.iter_mut().find(|x| {
            (&x.generation, &x.topic, x.partition) == (&r.generation, &r.topic, r.partition)
        }) {
            Some(x) => {
                x.through = x.through.max(r.through);
                x.rows += r.rows;
            }
            None => into.push(r),
        }
    }
}

/// Raises the pruned offsets of [`PRUNED`] (never lowers them), in the prune's transaction.
async fn record_pruned(
    tx: &Transaction<'_>,
    p: &Pipeline,
    below: NaiveDate,
    ranges: &[PrunedRange],
) -> Result<()> {
    let sql = format!(
        "INSERT INTO {} AS x (ledger, generation, topic, partition, pruned_through, pruned_below, rows_pruned) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (ledger, generation, topic, partition) DO UPDATE SET \
         pruned_through = greatest(x.pruned_through, EXCLUDED.pruned_through), \
         pruned_below = greatest(x.pruned_below, EXCLUDED.pruned_below), \
         rows_pruned = x.rows_pruned + EXCLUDED.rows_pruned, updated_at = now()",
        p.table(PRUNED)
    );
    let ledger = p.ledger.table.to_string();
    for r in ranges {
        tx.execute(
            &sql,
            &[
                &ledger,
                &r.generation,
                &r.topic,
                &r.partition,
                &r.through,
                &below,
                &r.rows,
            ],
        )
        .await?;
    }
    Ok(())
}

/// Tombstones of the row projections deleted before `below` (00:00 UTC): counted, and deleted unless `dry_run`.
async fn purge_tombstones(
    tx: &Transaction<'_>,
    p: &Pipeline,
    below: NaiveDate,
    dry_run: bool,
) -> Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for plan in p.projections.iter().filter_map(|x| x.row.as_ref()) {
        // `_deleted_at < below` holds only where it is set.
        let (table, _) = plan.tombstone_rows();
        let n = count_or_delete(tx, &table, "_deleted_at", below, dry_run, None).await?;
        out.push((table, n));
    }
    Ok(out)
}

/// `replaysafe_conflicts` rows of this pipeline's projections detected before `below`.
async fn purge_conflicts(
    tx: &Transaction<'_>,
    p: &Pipeline,
    below: NaiveDate,
    dry_run: bool,
) -> Result<i64> {
    let Some(table) = crate::projection::row::conflicts_table(p) else {
        return Ok(0);
    };
    let names: Vec<String> = p.projections.iter().map(|x| x.name.clone()).collect();
    count_or_delete(tx, &table, "detected_at", below, dry_run, Some(&names)).await
}

/// `replaysafe_row_versions` rows of this pipeline's row projections of event days before `below` (the days whose
/// ledger partitions go): counted, and deleted unless `dry_run`; 0 when the table does not exist.
async fn purge_row_versions(
    tx: &Transaction<'_>,
    p: &Pipeline,
    below: NaiveDate,
    dry_run: bool,
) -> Result<i64> {
    let names: Vec<String> = p
        .projections
        .iter()
        .filter(|x| x.row.is_some())
        .map(|x| x.name.clone())
        .collect();
    if names.is_empty() {
        return Ok(0);
    }
    let table = p
        .table(crate::projection::row::history::VERSIONS)
        .to_string();
    let exists: Option<String> = tx
        .query_one("SELECT pg_catalog.to_regclass($1)::text", &[&table])
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(0);
    }
    let cond = "day < $1 AND projection = ANY($2)";
    if dry_run {
        let sql = format!("SELECT pg_catalog.count(*)::bigint FROM {table} WHERE {cond}");
        return Ok(tx.query_one(&sql, &[&below, &names]).await?.get(0));
    }
    let sql = format!("DELETE FROM {table} WHERE {cond}");
    Ok(crate::units::bigint(
        tx.execute(&sql, &[&below, &names]).await?,
    ))
}

/// Counts (dry run) or deletes the rows of `table` whose `column` (timestamptz) is before `below` 00:00 UTC —
/// with `projections`, only rows of those projections (`replaysafe_conflicts` is shared by the pipelines of a
/// schema); 0 when the table does not exist.
async fn count_or_delete(
    tx: &Transaction<'_>,
    table: &str,
    column: &str,
    below: NaiveDate,
    dry_run: bool,
    projections: Option<&Vec<String>>,
) -> Result<i64> {
    let exists: Option<String> = tx
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(0);
    }
    let mut cond = format!("{column} < ($1::date::timestamp AT TIME ZONE 'UTC')");
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&below];
    if let Some(names) = projections {
        cond.push_str(" AND projection = ANY($2)");
        params.push(names);
    }
    if dry_run {
        let sql = format!("SELECT count(*)::bigint FROM {table} WHERE {cond}");
        return Ok(tx.query_one(&sql, &params).await?.get(0));
    }
    let sql = format!("DELETE FROM {table} WHERE {cond}");
    Ok(crate::units::bigint(tx.execute(&sql, &params).await?))
}

/// A recorded pruned offset: `(topic, partition)` → `(pruned_through, pruned_below, updated_at as text)`.
pub type PrunedOffset = ((String, i32), (i64, NaiveDate, String));

/// The pruned offsets recorded for `generation` ('' for none): `(topic, partition)` →
/// `(pruned_through, pruned_below, updated_at)`; empty before the table exists.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn pruned_offsets(
    client: &impl GenericClient,
    p: &Pipeline,
    generation: &str,
) -> Result<Vec<PrunedOffset>> {
    let exists: Option<String> = client
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&p.table(PRUNED).to_string()],
        )
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            &format!(
                "SELECT topic, partition, pruned_through, pruned_below, updated_at::text FROM {} \
                 WHERE ledger = $1 AND generation = $2 ORDER BY topic, partition",
                p.table(PRUNED)
            ),
            &[&p.ledger.table.to_string(), &generation],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3), r.get(4))))
        .collect())
}
