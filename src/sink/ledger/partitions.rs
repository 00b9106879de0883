//! The ledger's day partitions: their names, which exist, creating them (under the DDL lock) or requiring them.

use std::collections::HashSet;

use chrono::{Days, NaiveDate};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Pending};

use super::horizon::claim_horizon;
use super::{horizon_statement, DDL_LOCK};

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

/// The tables of a [`super::key_is_hashed`] ledger — the unpartitioned ledger itself or its day partitions —
/// must each hold [`super::key_constraint`] (an exclusion constraint, neither partial nor deferrable, over one
/// expression cast to the key type — a hash index column itself is the 4-byte hash, so the expression is read
/// back with `pg_get_indexdef`) and no other unique index or exclusion constraint: the claim's `ON CONFLICT DO NOTHING` has no conflict target, so
/// every one of them is an arbiter (PostgreSQL manual, "INSERT" → `conflict_target`), and another one (say
/// `EXCLUDE USING hash (event_id WITH =)` made by hand) would skip the same event id of another generation as a
/// duplicate. A partition of a ledger with a primary key inherits that and is not read here. Read at start and
/// whenever this process creates or looks up day partitions.
///
/// # Errors
/// [`Error::Postgres`]; [`Error::Schema`] naming the tables and what to do.
pub async fn require_key_constraints(client: &impl GenericClient, p: &Pipeline) -> Result<()> {
    let rows = client
        .query(
            "WITH t AS (SELECT c.oid FROM pg_class c WHERE NOT EXISTS (SELECT 1 FROM pg_index \
               WHERE indrelid = to_regclass($1) AND indisprimary) AND (c.oid = to_regclass($1) AND c.relkind = 'r' \
               OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1)))) \
             SELECT t.oid::regclass::text, \
               (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.oid AND i.indisexclusion AND i.indnatts = 1 \
                AND i.indpred IS NULL AND i.indimmediate \
                AND right(pg_get_indexdef(i.indexrelid, 1, false), length(to_regtype($2)::text) + 3) \
                    = '::' || to_regtype($2)::text || ')'), \
               (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.oid AND (i.indisunique OR i.indisexclusion)) \
             FROM t ORDER BY 1",
            &[&p.ledger.table.to_string(), &super::key_type(p).to_string()],
        )
        .await?;
    let (mut unguarded, mut other) = (Vec::new(), Vec::new());
    for r in &rows {
        let (table, ours, all): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        if ours == 0 {
            unguarded.push(table);
        } else if all > ours {
            other.push(table);
        }
    }
    if !unguarded.is_empty() {
        return Err(Error::Schema(format!(
            "ledger {}: {} hold(s) no delivery-key constraint, so a key could be claimed twice there (a day \
             partition made by hand? `replaysafe init --days N` makes them with it); add it to each: ALTER TABLE … \
             ADD {}",
            p.ledger.table,
            unguarded.join(", "),
            super::key_constraint(p)
        )));
    }
    if !other.is_empty() {
        return Err(Error::Schema(format!(
            "ledger {}: {} hold(s) a unique index or exclusion constraint besides the delivery-key constraint; the \
             claim's ON CONFLICT DO NOTHING would take it as an arbiter too and skip records it wrongly finds \
             there as duplicates — drop it",
            p.ledger.table,
            other.join(", ")
        )));
    }
    Ok(())
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
    let ahead = super::horizon::newest_day_here(p);
    let missing: Vec<NaiveDate> = days
        .into_iter()
        .filter(|d| !known.contains(d) && floor.is_none_or(|f| *d >= f) && *d <= ahead)
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
    // Days after the database's date + future-days get none: their records are quarantined as `future-day`.
    let newest = super::horizon::newest_day(p, horizon.today);
    let create: Vec<NaiveDate> = missing
        .into_iter()
        .filter(|d| horizon.oldest.is_none_or(|o| *d >= o) && *d <= newest)
        .collect();
    let hashed = super::key_is_hashed(&tx, p).await?;
    for day in &create {
        tx.batch_execute(&create_partition(p, *day, hashed)).await?;
    }
    require_key_constraints(&tx, p).await?;
    tx.commit().await?;
    known.extend(create);
    Ok(())
}

/// Step 0, before the batch transaction: creates the day partitions the batch's claims need (see
/// [`ensure_partitions`]); with `manage-schema = false` only requires them ([`require_partitions`]).
///
/// # Errors
/// As [`classify`]; other errors are fatal — a refused partition creation (SQLSTATE 42501) with the way to split
/// DDL from the runtime role, a missing partition without DDL naming it.
pub(in crate::sink) async fn ensure_batch_partitions(
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
                    crate::model::describe(&pg),
                    crate::sink::privileges::SPLIT_DDL
                )))
            }
            other => crate::model::apply_error::from_error(other),
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
    let ahead = super::horizon::newest_day_here(p);
    let wanted = |d: &NaiveDate, known: &HashSet<NaiveDate>, floor: Option<NaiveDate>| {
        !known.contains(d) && floor.is_none_or(|f| *d >= f) && *d <= ahead
    };
    if !days.iter().any(|d| wanted(d, known, *floor)) {
        return Ok(());
    }
    *known = existing_partitions(&*client, p)
        .await
        .map_err(crate::model::apply_error::from_error)?;
    require_key_constraints(&*client, p)
        .await
        .map_err(crate::model::apply_error::from_error)?;
    let horizon = claim_horizon(&*client, horizon_statement(p).as_str(), p)
        .await
        .map_err(|e| classify(e, false))?;
    *floor = horizon.oldest;
    // Days after the database's date + future-days need none: their records are quarantined as `future-day`.
    let newest = super::horizon::newest_day(p, horizon.today);
    let mut missing: Vec<NaiveDate> = days
        .into_iter()
        .filter(|d| wanted(d, known, *floor) && *d <= newest)
        .collect();
    missing.sort();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let ahead = (*missing.last().expect("checked non-empty just above") - horizon.today)
        .num_days()
        .max(1);
    let names: Vec<String> = missing.iter().map(|d| partition_name(p, *d)).collect();
    let hashed = super::key_is_hashed(&*client, p)
        .await
        .map_err(crate::model::apply_error::from_error)?;
    let sql: Vec<String> = missing
        .iter()
        .map(|d| create_partition(p, *d, hashed))
        .collect();
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
/// only, never input text), holding the delivery-key constraint when `hashed` ([`super::key_is_hashed`]; a
/// ledger with a primary key passes it on to its partitions itself).
fn create_partition(p: &Pipeline, day: NaiveDate, hashed: bool) -> String {
    let next = day.checked_add_days(Days::new(1)).unwrap_or(day);
    let key = if hashed {
        format!(" ({})", super::key_constraint(p))
    } else {
        String::new()
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {}.\"{}\" PARTITION OF {}{key} FOR VALUES FROM ('{}') TO ('{}')",
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
    let (from, to) = crate::sink::privileges::coverage(&*client, p, days).await?;
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
