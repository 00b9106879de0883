//! The ledger: its DDL, the claim statement (`INSERT … ON CONFLICT DO NOTHING RETURNING`), its day partitions,
//! and the horizon (claim horizon read in the batch transaction, prune of expired partitions).

use std::collections::HashSet;

use chrono::{Days, NaiveDate, Utc};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Statement, Transaction};

use super::batch::{Batch, Item, Pending};
use super::error::{classify, ApplyError};
use crate::config::Pipeline;
use crate::decode::{Reason, Rejection};
use crate::error::{Error, Result};

/// Ledger columns other than the fixed bookkeeping ones: `(column, type)` for the key fields, the
/// partition-by field and `ledger.columns`, in that order without repeats.
pub fn ledger_field_columns(p: &Pipeline) -> Vec<usize> {
    let mut cols: Vec<usize> = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !cols.contains(&pb) {
            cols.push(pb);
        }
    }
    for &c in &p.ledger.columns {
        if !cols.contains(&c) {
            cols.push(c);
        }
    }
    cols
}

/// The ledger primary key columns: generation, key fields, partition-by field.
pub fn ledger_pk(p: &Pipeline) -> Vec<String> {
    let mut pk = vec!["generation".to_string()];
    let mut idx = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !idx.contains(&pb) {
            idx.push(pb);
        }
    }
    pk.extend(idx.iter().map(|&i| p.fields[i].name.to_string()));
    pk
}

/// `CREATE TABLE` for the ledger (range-partitioned by day when `partition-by` is set).
pub fn create_ledger(p: &Pipeline) -> String {
    let mut defs = vec!["generation text NOT NULL DEFAULT ''".to_string()];
    let key_like: Vec<usize> = {
        let mut k = p.identity.key.clone();
        k.extend(p.identity.partition_by);
        k
    };
    for i in ledger_field_columns(p) {
        let f = &p.fields[i];
        let null = if key_like.contains(&i) {
            " NOT NULL"
        } else {
            ""
        };
        defs.push(format!("{} {}{null}", f.name, f.ty.sql()));
    }
    defs.extend([
        "topic text NOT NULL".to_string(),
        "partition integer NOT NULL".to_string(),
        "\"offset\" bigint NOT NULL".to_string(),
        "consumer_group text NOT NULL".to_string(),
        "landed_at timestamptz NOT NULL DEFAULT now()".to_string(),
    ]);
    defs.push(format!("PRIMARY KEY ({})", ledger_pk(p).join(", ")));
    let partition = match p.identity.partition_by {
        Some(i) => format!(" PARTITION BY RANGE ({})", p.fields[i].name),
        None => String::new(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}){partition}",
        p.ledger.table,
        defs.join(", ")
    )
}

/// Name of the horizon table (in the pipeline schema): the durable pruned-below day of each ledger.
pub const HORIZON: &str = "replaysafe_horizon";

/// `CREATE TABLE` for the horizon table: one row per ledger table (`ledger`, its schema-qualified name as
/// written in SQL), holding `pruned_below`: no delivery key of an event day before it is remembered any more
/// (those day partitions were dropped, or are to be dropped by the next prune). Claims of such days are
/// quarantined as `beyond-horizon` and their partitions are never re-created. `NULL`: nothing pruned yet. It
/// only moves forward, raised by the prune in the transaction that drops the partitions.
pub fn create_horizon(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (ledger text PRIMARY KEY, pruned_below date, \
         updated_at timestamptz NOT NULL DEFAULT now())",
        p.table(HORIZON)
    )
}

/// The ledger's claim horizon, read under a share lock on its horizon row (the prune updates that row, so a
/// claim and a prune serialize). Parameters: `$1` the ledger table (as in [`create_horizon`]), `$2` the
/// pipeline's `horizon-days` (int4, null for none). Returns one row: the oldest claimable day (the later of
/// `pruned_below` and the database's UTC date minus `$2`; null when neither), `pruned_below`, and the
/// database's UTC date.
pub fn horizon_statement(p: &Pipeline) -> String {
    format!(
        "WITH h AS (SELECT pruned_below FROM {} WHERE ledger = $1 FOR SHARE), \
         d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today) \
         SELECT greatest((SELECT pruned_below FROM h), d.today - $2::int), (SELECT pruned_below FROM h), d.today \
         FROM d",
        p.table(HORIZON)
    )
}

/// `CREATE TEMP TABLE landed`: the rows one batch newly claimed, visible to projection statements.
pub fn create_landed(p: &Pipeline) -> String {
    let mut defs = vec![
        "_generation text".to_string(),
        "_topic text".to_string(),
        "_partition integer".to_string(),
        "_offset bigint".to_string(),
        "_timestamp timestamptz".to_string(),
    ];
    defs.extend(
        p.fields
            .iter()
            .map(|f| format!("{} {}", f.name, f.ty.sql())),
    );
    defs.extend((0..p.pass_columns()).map(|i| format!("\"_pass_{i}\" boolean")));
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS landed ({}) ON COMMIT DELETE ROWS",
        defs.join(", ")
    )
}

/// The claim statement. Parameters: `$1` generation (text, '' for none), `$2` topic, `$3` partition (int4),
/// `$4` consumer group, `$5` offsets (int8[]), `$6` record timestamps in ms (int8[], null elements allowed),
/// then one `text[]` per field, then one `bool[]` per projection pass column. Returns the offsets of the rows it
/// newly claimed (and copied into `landed`); copies of one key inside the batch count once (the lowest offset).
///
/// Lock order (case C36): the claims are inserted in ascending ledger-key order (`ORDER BY` the primary key's
/// fields; the generation is one value per batch). An insert that meets another transaction's uncommitted claim
/// of the same key waits for that transaction, so two batches with overlapping delivery keys (a redelivery on
/// another partition, a second consumer group) in opposite orders would deadlock (40P01); in one order the later
/// one just waits. The executor inserts the rows of `INSERT … SELECT` in the order the SELECT yields them
/// (PostgreSQL manual, "Explicit Locking" → "Deadlocks": lock in a consistent order; latitude-dev/latitude-llm#3463
/// sorted its `ON CONFLICT DO NOTHING` batch by the conflict key for the same reason). The order is taken in SQL,
/// after the casts: the `unnest` arrays arrive in offset order as raw text, and only the typed values (a uuid
/// in any spelling, a date) are ordered alike by every session.
pub fn claim(p: &Pipeline) -> String {
    let n = p.fields.len();
    let passes = p.pass_columns();
    let mut params = vec!["$5::bigint[]".to_string(), "$6::bigint[]".to_string()];
    let mut names = vec!["_offset".to_string(), "_ts".to_string()];
    for i in 0..n {
        params.push(format!("${}::text[]", 7 + i));
        names.push(format!("f{i}"));
    }
    for j in 0..passes {
        params.push(format!("${}::boolean[]", 7 + n + j));
        names.push(format!("p{j}"));
    }
    let mut select = vec![
        "u._offset".to_string(),
        "CASE WHEN u._ts IS NULL THEN NULL ELSE to_timestamp(u._ts / 1000.0) END AS _timestamp"
            .to_string(),
    ];
    for (i, f) in p.fields.iter().enumerate() {
        select.push(format!("u.f{i}::{} AS {}", f.ty.sql(), f.name));
    }
    for j in 0..passes {
        select.push(format!("u.p{j} AS \"_pass_{j}\""));
    }
    let pk_fields: Vec<String> = ledger_pk(p).into_iter().skip(1).collect();
    let lcols: Vec<String> = ledger_field_columns(p)
        .iter()
        .map(|&i| p.fields[i].name.to_string())
        .collect();
    let mut landed_cols = vec![
        "_generation".to_string(),
        "_topic".to_string(),
        "_partition".to_string(),
        "_offset".to_string(),
        "_timestamp".to_string(),
    ];
    landed_cols.extend(p.fields.iter().map(|f| f.name.to_string()));
    landed_cols.extend((0..passes).map(|j| format!("\"_pass_{j}\"")));
    let mut landed_vals = vec![
        "$1".to_string(),
        "$2".into(),
        "$3".into(),
        "d._offset".into(),
        "d._timestamp".into(),
    ];
    landed_vals.extend(p.fields.iter().map(|f| format!("d.{}", f.name)));
    landed_vals.extend((0..passes).map(|j| format!("d.\"_pass_{j}\"")));
    format!(
        "WITH input AS (SELECT {select} FROM unnest({params}) AS u({names})), \
         dedup AS (SELECT DISTINCT ON ({pk}) * FROM input ORDER BY {pk}, _offset), \
         claimed AS (INSERT INTO {ledger} (generation, {lcols}, topic, partition, \"offset\", consumer_group) \
           SELECT $1, {lcols}, $2, $3, _offset, $4 FROM dedup ORDER BY {pk} ON CONFLICT DO NOTHING RETURNING \"offset\") \
         INSERT INTO pg_temp.landed ({landed_cols}) SELECT {landed_vals} FROM dedup d \
           JOIN claimed c ON c.\"offset\" = d._offset RETURNING _offset",
        select = select.join(", "),
        params = params.join(", "),
        names = names.join(", "),
        pk = pk_fields.join(", "),
        ledger = p.ledger.table,
        lcols = lcols.join(", "),
        landed_cols = landed_cols.join(", "),
        landed_vals = landed_vals.join(", "),
    )
}

/// Advisory lock key serialising DDL from concurrent replaysafe processes (`hashtext('replaysafe-ddl')`).
pub(crate) const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('replaysafe-ddl'))";

/// Name of the ledger partition holding `day`: `<ledger>_pYYYYMMDD`.
pub fn partition_name(p: &Pipeline, day: NaiveDate) -> String {
    format!("{}_p{}", p.ledger.table.name.as_str(), day.format("%Y%m%d"))
}

/// The day partitions of the ledger that exist now.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn existing_partitions(
    client: &impl GenericClient,
    p: &Pipeline,
) -> Result<HashSet<NaiveDate>> {
    if p.identity.partition_by.is_none() {
        return Ok(HashSet::new());
    }
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass($1)",
            &[&p.ledger.table.to_string()],
        )
        .await?;
    let prefix = format!("{}_p", p.ledger.table.name.as_str());
    Ok(rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            name.strip_prefix(&prefix)
                .and_then(|d| NaiveDate::parse_from_str(d, "%Y%m%d").ok())
        })
        .collect())
}

/// The ledger's claim horizon as the database holds it (see [`horizon_statement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    /// The oldest event day a claim may land; `None`: every day.
    pub oldest: Option<NaiveDate>,
    /// The durable pruned-below day (`replaysafe_horizon.pruned_below`); `None`: nothing pruned yet.
    pub pruned_below: Option<NaiveDate>,
    /// The database's date in UTC (the one clock the horizon counts with).
    pub today: NaiveDate,
}

/// Reads the ledger's claim horizon; inside a transaction this takes a share lock on the horizon row, which
/// the prune's update waits for (and which waits for a prune in progress).
///
/// # Errors
/// The database error.
pub async fn claim_horizon<T: ?Sized + tokio_postgres::ToStatement + Sync + Send>(
    client: &impl GenericClient,
    stmt: &T,
    p: &Pipeline,
) -> std::result::Result<Horizon, tokio_postgres::Error> {
    let days: Option<i32> = p.ledger.horizon_days.map(|d| d as i32);
    let row = client
        .query_one(stmt, &[&p.ledger.table.to_string(), &days])
        .await?;
    Ok(Horizon {
        oldest: row.get(0),
        pruned_below: row.get(1),
        today: row.get(2),
    })
}

/// The ledger's claim horizon now, outside a batch (operator commands refusing a window early); `None` without
/// `partition-by` or before the horizon table exists.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn current_horizon(client: &Client, p: &Pipeline) -> Result<Option<Horizon>> {
    if p.identity.partition_by.is_none() {
        return Ok(None);
    }
    let exists: Option<String> = client
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&p.table(HORIZON).to_string()],
        )
        .await?
        .get(0);
    if exists.is_none() {
        return Ok(None);
    }
    Ok(Some(
        claim_horizon(client, horizon_statement(p).as_str(), p).await?,
    ))
}

/// Creates the day partitions in `days` that are not in `known` (and adds them to `known`), under the DDL lock
/// — except days older than the ledger's claim horizon, which are never (re-)created: their records are
/// quarantined by the claim. `floor` caches the oldest claimable day last seen (it only moves forward; the
/// claim transaction checks it again), so records of days below it cost no DDL transaction.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn ensure_partitions(
    client: &mut Client,
    p: &Pipeline,
    known: &mut HashSet<NaiveDate>,
    floor: &mut Option<NaiveDate>,
    days: impl IntoIterator<Item = NaiveDate>,
) -> Result<()> {
    let missing: Vec<NaiveDate> = days
        .into_iter()
        .filter(|d| !known.contains(d) && floor.is_none_or(|f| *d >= f))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    // Under the DDL lock no prune runs: the horizon read here holds until this transaction ends.
    let horizon = claim_horizon(&tx, horizon_statement(p).as_str(), p).await?;
    *floor = horizon.oldest;
    let create: Vec<NaiveDate> = missing
        .into_iter()
        .filter(|d| horizon.oldest.is_none_or(|o| *d >= o))
        .collect();
    for day in &create {
        tx.batch_execute(&create_partition(p, *day)).await?;
    }
    tx.commit().await?;
    known.extend(create);
    Ok(())
}

/// The oldest day the ledger horizon covers by this process's clock (`today - horizon-days`, UTC), if there is
/// a horizon. Advisory only (an early refusal of a backfill window): claims decide with the database's clock
/// and the durable pruned-below day ([`claim_horizon`]).
pub fn horizon_start(p: &Pipeline) -> Option<NaiveDate> {
    let days = p.ledger.horizon_days?;
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(u64::from(days)))
}

/// Prunes the ledger to the horizon ([`super::lifecycle::prune`]: partitions dropped, pruned offsets recorded,
/// tombstones and conflicts purged, in one transaction). Returns the days dropped.
///
/// # Errors
/// [`Error::Postgres`] (also when a lock is not granted within a minute).
pub async fn drop_expired_partitions(client: &mut Client, p: &Pipeline) -> Result<Vec<NaiveDate>> {
    let report = super::lifecycle::prune(client, p, false).await?;
    Ok(report.dropped.iter().map(|d| d.day).collect())
}

impl Horizon {
    /// Why a record of event day `day` (older than [`Horizon::oldest`]) is quarantined.
    pub fn refusal(&self, p: &Pipeline, day: NaiveDate) -> String {
        let oldest = self.oldest.map(|d| d.to_string()).unwrap_or_default();
        let days = p
            .ledger
            .horizon_days
            .map_or_else(|| "none".to_string(), |d| d.to_string());
        let pruned = self
            .pruned_below
            .map_or_else(|| "nothing".to_string(), |d| format!("days before {d}"));
        format!(
            "event day {day} is older than the ledger horizon: the ledger recognises delivery keys of days from \
             {oldest} only (database date {}, horizon-days {days}, pruned: {pruned}); a key of an older day may \
             no longer be recognised, so applying it could count it twice",
            self.today
        )
    }
}

/// Step 2 of the batch transaction: claims the delivery keys of the batch's `Claim` items in the ledger
/// ([`claim`]), copying the newly claimed rows into `landed`.
///
/// Returns the offsets newly claimed.
///
/// # Errors
/// As [`classify`].
pub(super) async fn claim_batch(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    group: &str,
    generation: &str,
    batch: &Batch,
) -> Result<HashSet<i64>, ApplyError> {
    let claims: Vec<&Item> = batch
        .items
        .iter()
        .filter(|i| matches!(i.pending, Pending::Claim { .. }))
        .collect();
    let mut landed: HashSet<i64> = HashSet::new();
    if !claims.is_empty() {
        let offsets: Vec<i64> = claims.iter().map(|i| i.offset).collect();
        let ts: Vec<Option<i64>> = claims.iter().map(|i| i.timestamp_ms).collect();
        let mut cols: Vec<Vec<Option<&str>>> =
            vec![Vec::with_capacity(claims.len()); p.fields.len()];
        let mut passes: Vec<Vec<bool>> = vec![Vec::with_capacity(claims.len()); p.pass_columns()];
        for it in &claims {
            if let Pending::Claim {
                fields, passes: ps, ..
            } = &it.pending
            {
                for (c, v) in cols.iter_mut().zip(fields) {
                    c.push(v.as_ref().map(|v| v.text.as_str()));
                }
                for (c, v) in passes.iter_mut().zip(ps) {
                    c.push(*v);
                }
            }
        }
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &generation,
            &batch.topic,
            &batch.partition,
            &group,
            &offsets,
            &ts,
        ];
        for c in &cols {
            params.push(c);
        }
        for c in &passes {
            params.push(c);
        }
        let rows = tx
            .query(stmt, &params)
            .await
            .map_err(|e| classify(e, false))?;
        landed.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    }
    Ok(landed)
}

/// Step 1b of the batch transaction: reads the ledger horizon under a share lock the prune waits for
/// ([`horizon_statement`]); claims of older event days are quarantined. Returns the batch with them turned into
/// `beyond-horizon` quarantines, `None` when there is no horizon or nothing is older.
///
/// # Errors
/// As [`classify`].
pub(super) async fn apply_horizon(
    tx: &Transaction<'_>,
    stmt: Option<&Statement>,
    p: &Pipeline,
    batch: &Batch,
) -> Result<Option<Batch>, ApplyError> {
    let Some(stmt) = stmt else {
        return Ok(None);
    };
    let h = claim_horizon(tx, stmt, p)
        .await
        .map_err(|e| classify(e, false))?;
    Ok(beyond_horizon(p, batch, &h))
}

/// Step 0, before the batch transaction: creates the day partitions the batch's claims need (see
/// [`ensure_partitions`]); with `manage-schema = false` only requires them ([`require_partitions`]).
///
/// # Errors
/// As [`classify`]; other errors are fatal — a refused partition creation (SQLSTATE 42501) with the way to split
/// DDL from the runtime role, a missing partition without DDL naming it.
pub(super) async fn ensure_batch_partitions(
    client: &mut Client,
    p: &Pipeline,
    known: &mut HashSet<NaiveDate>,
    floor: &mut Option<NaiveDate>,
    batch: &Batch,
) -> Result<(), ApplyError> {
    if p.identity.partition_by.is_none() {
        return Ok(());
    }
    let days: Vec<NaiveDate> = batch
        .items
        .iter()
        .filter_map(|it| match &it.pending {
            Pending::Claim { fields, .. } => crate::decode::partition_day(p, fields),
            _ => None,
        })
        .collect();
    if !p.postgres.manage_schema {
        return require_partitions(client, p, known, floor, days, batch).await;
    }
    ensure_partitions(client, p, known, floor, days)
        .await
        .map_err(|e| match e {
            Error::Postgres(pg) if pg.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                ApplyError::Fatal(Error::Other(format!(
                    "ledger {}: creating a day partition for {}/{} was refused ({}): {}",
                    p.ledger.table,
                    batch.topic,
                    batch.partition,
                    super::describe(&pg),
                    super::privileges::SPLIT_DDL
                )))
            }
            other => super::error::from_error(other),
        })
}

/// Without DDL (`manage-schema = false`, `run --no-ddl`): the day partitions the batch's claims need must
/// exist. A day not in `known` (nor older than the claim horizon, whose records are quarantined in the
/// transaction) makes it read the partitions and the horizon again; a day still missing stops the batch before
/// its transaction — nothing of it is committed, its checkpoint stays, so its records are read again after a
/// restart — with an error naming the partitions, the `init --days` fix and the SQL that creates them.
///
/// # Errors
/// [`ApplyError::Fatal`] naming the missing partitions; database errors as [`classify`].
async fn require_partitions(
    client: &mut Client,
    p: &Pipeline,
    known: &mut HashSet<NaiveDate>,
    floor: &mut Option<NaiveDate>,
    days: Vec<NaiveDate>,
    batch: &Batch,
) -> Result<(), ApplyError> {
    let wanted = |d: &NaiveDate, known: &HashSet<NaiveDate>, floor: Option<NaiveDate>| {
        !known.contains(d) && floor.is_none_or(|f| *d >= f)
    };
    if !days.iter().any(|d| wanted(d, known, *floor)) {
        return Ok(());
    }
    *known = existing_partitions(&*client, p)
        .await
        .map_err(super::error::from_error)?;
    let horizon = claim_horizon(&*client, horizon_statement(p).as_str(), p)
        .await
        .map_err(|e| classify(e, false))?;
    *floor = horizon.oldest;
    let mut missing: Vec<NaiveDate> = days
        .into_iter()
        .filter(|d| wanted(d, known, *floor))
        .collect();
    missing.sort();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let ahead = (*missing.last().expect("not empty") - horizon.today)
        .num_days()
        .max(1);
    let names: Vec<String> = missing.iter().map(|d| partition_name(p, *d)).collect();
    let sql: Vec<String> = missing.iter().map(|d| create_partition(p, *d)).collect();
    Err(ApplyError::Fatal(Error::Other(format!(
        "ledger {}: no day partition {} for event day(s) {} of {}/{} (offsets {}..{}), and this process creates \
         none (manage-schema = false or run --no-ddl). Nothing of this batch was committed; its records are read \
         again from the checkpoint after a restart. As the ledger's owner, run `replaysafe init --config FILE \
         --days {ahead}` (days ahead of today; schedule it daily), or create them: {}",
        p.ledger.table,
        names.join(", "),
        missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        batch.topic,
        batch.partition,
        batch.items.first().map_or(batch.end, |i| i.offset),
        batch.end - 1,
        sql.join("; ")
    ))))
}

/// `CREATE TABLE IF NOT EXISTS … PARTITION OF` the ledger for `day` (dates rendered by chrono: digits and dashes
/// only, never input text).
fn create_partition(p: &Pipeline, day: NaiveDate) -> String {
    let next = day.checked_add_days(Days::new(1)).unwrap_or(day);
    format!(
        "CREATE TABLE IF NOT EXISTS {}.\"{}\" PARTITION OF {} FOR VALUES FROM ('{}') TO ('{}')",
        p.ledger.table.schema,
        partition_name(p, day),
        p.ledger.table,
        day.format("%Y-%m-%d"),
        next.format("%Y-%m-%d"),
    )
}

/// Default of `init --days`: a week of day partitions ahead of today.
pub const DEFAULT_DAYS_AHEAD: u32 = 7;

/// `init --days N`: creates the ledger's day partitions from the oldest claimable day (the horizon; today
/// without one) through the database's today + `days`, so that a process without DDL finds them. Returns the
/// days created and the range covered; nothing without `partition-by`.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn create_partitions_ahead(
    client: &mut Client,
    p: &Pipeline,
    days: u32,
) -> Result<(Vec<NaiveDate>, Option<(NaiveDate, NaiveDate)>)> {
    if p.identity.partition_by.is_none() {
        return Ok((Vec::new(), None));
    }
    let (from, to) = super::privileges::coverage(&*client, p, days).await?;
    let before = existing_partitions(&*client, p).await?;
    let mut known = before.clone();
    let mut floor = None;
    let all = std::iter::successors(Some(from), |d| d.checked_add_days(Days::new(1)))
        .take_while(|d| *d <= to);
    ensure_partitions(client, p, &mut known, &mut floor, all).await?;
    let mut created: Vec<NaiveDate> = known.difference(&before).copied().collect();
    created.sort();
    Ok((created, Some((from, to))))
}

/// `batch` with every claim of an event day older than `h.oldest` turned into a `beyond-horizon` quarantine;
/// `None` when there is none.
fn beyond_horizon(p: &Pipeline, batch: &Batch, h: &Horizon) -> Option<Batch> {
    let oldest = h.oldest?;
    let old = |it: &Item| match &it.pending {
        Pending::Claim { fields, .. } => {
            crate::decode::partition_day(p, fields).filter(|d| *d < oldest)
        }
        _ => None,
    };
    if !batch.items.iter().any(|it| old(it).is_some()) {
        return None;
    }
    let mut b = batch.clone();
    for it in &mut b.items {
        if let Some(day) = old(it) {
            it.pending = Pending::Quarantine(Rejection {
                reason: Reason::BeyondHorizon,
                detail: h.refusal(p, day),
            });
        }
    }
    Some(b)
}
