//! The ledger horizon: read in the batch transaction under a share lock the prune waits for; claims of older
//! event days are quarantined.

use chrono::{Days, NaiveDate, Utc};
use tokio_postgres::{Client, GenericClient, Statement, Transaction};

use crate::config::Pipeline;
use crate::decode::{Reason, Rejection};
use crate::error::Result;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Item, Pending};

use super::{horizon_statement, HORIZON};

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

/// The latest event day a claim may have: `today` + `[ledger] future-days` (later days are quarantined as
/// `future-day`, and no ledger partition is created for them).
pub fn newest_day(p: &Pipeline, today: NaiveDate) -> NaiveDate {
    today
        .checked_add_days(Days::new(u64::from(p.ledger.future_days)))
        .unwrap_or(NaiveDate::MAX)
}

/// The latest event day worth a partition by this process's clock: [`newest_day`] of the local UTC date plus
/// a day (the database's clock decides in the claim; this only spares a DDL transaction per batch for records
/// of days far ahead).
pub fn newest_day_here(p: &Pipeline) -> NaiveDate {
    newest_day(p, Utc::now().date_naive())
        .checked_add_days(Days::new(1))
        .unwrap_or(NaiveDate::MAX)
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
    let days: Option<i32> = p.ledger.horizon_days.map(crate::units::int_days);
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
/// [`crate::Error::Postgres`].
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

/// The oldest day the ledger horizon covers by this process's clock (`today - horizon-days`, UTC), if there is
/// a horizon. Advisory only (an early refusal of a backfill window): claims decide with the database's clock
/// and the durable pruned-below day ([`claim_horizon`]).
pub fn horizon_start(p: &Pipeline) -> Option<NaiveDate> {
    let days = p.ledger.horizon_days?;
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(u64::from(days)))
}

/// Prunes the ledger to the horizon ([`crate::sink::lifecycle::prune`]: partitions dropped, pruned offsets recorded,
/// tombstones and conflicts purged, in one transaction). Returns the days dropped.
///
/// # Errors
/// [`crate::Error::Postgres`] (also when a lock is not granted within a minute).
pub async fn drop_expired_partitions(client: &mut Client, p: &Pipeline) -> Result<Vec<NaiveDate>> {
    let report = crate::sink::lifecycle::prune(client, p, false).await?;
    Ok(report.dropped.iter().map(|d| d.day).collect())
}

impl Horizon {
    /// Why a record of event day `day` (later than [`newest_day`]) is quarantined.
    pub fn future_refusal(&self, p: &Pipeline, day: NaiveDate) -> String {
        format!(
            "event day {day} is more than future-days = {} after the database's UTC date {} (latest accepted: {}): \
             a producer's clock or a wrong field? Raise [ledger] future-days (at most {}) if such days are real, then \
             replay the dead letters",
            p.ledger.future_days,
            self.today,
            newest_day(p, self.today),
            crate::config::MAX_FUTURE_DAYS
        )
    }

    /// Why a record of event day `day` (older than [`Horizon::oldest`]) is quarantined. The text depends on the
    /// record, the horizon and the database's date only — not on when a prune ran — so the same records give the
    /// same dead letters whatever the history (`prove`'s crash and batching boundaries compare them).
    pub fn refusal(&self, p: &Pipeline, day: NaiveDate) -> String {
        let oldest = self.oldest.map(|d| d.to_string()).unwrap_or_default();
        let days = p
            .ledger
            .horizon_days
            .map_or_else(|| "none".to_string(), |d| d.to_string());
        format!(
            "event day {day} is older than the ledger horizon: the ledger recognises delivery keys of days from \
             {oldest} only (database date {}, horizon-days {days}); a key of an older day may no longer be \
             recognised, so applying it could count it twice",
            self.today
        )
    }
}

/// Step 1b of the batch transaction: reads the ledger horizon under a share lock the prune waits for
/// ([`horizon_statement`]); claims of older event days are quarantined. Returns the batch with them turned into
/// `beyond-horizon` quarantines, `None` when there is no horizon or nothing is older.
///
/// # Errors
/// As [`classify`].
pub(in crate::sink) async fn apply_horizon(
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

/// `batch` with every claim of an event day older than `h.oldest` turned into a `beyond-horizon` quarantine, and
/// every claim of a day later than [`newest_day`] into a `future-day` one; `None` when there is none.
fn beyond_horizon(p: &Pipeline, batch: &Batch, h: &Horizon) -> Option<Batch> {
    let newest = newest_day(p, h.today);
    let refused = |it: &Item| match &it.pending {
        Pending::Claim { fields, .. } => {
            let day = crate::decode::partition_day(p, fields)?;
            if h.oldest.is_some_and(|o| day < o) {
                Some(Rejection {
                    reason: Reason::BeyondHorizon,
                    detail: h.refusal(p, day),
                })
            } else if day > newest {
                Some(Rejection {
                    reason: Reason::FutureDay,
                    detail: h.future_refusal(p, day),
                })
            } else {
                None
            }
        }
        _ => None,
    };
    if !batch.items.iter().any(|it| refused(it).is_some()) {
        return None;
    }
    let mut b = batch.clone();
    for it in &mut b.items {
        if let Some(r) = refused(it) {
            it.pending = Pending::Quarantine(r);
        }
    }
    Some(b)
}
