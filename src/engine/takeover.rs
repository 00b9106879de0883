//! Taking over a partition's checkpoint row (fence bumped), for every source: a group assignment, a backfill's
//! explicit partitions, a file's partitions as they appear. Retried through [`retry_db`] like everything else.

use crate::config::Pipeline;
use crate::engine::apply::retry_db;
use crate::engine::types::Tp;
use crate::error::{Error, Result};
use crate::model::{describe, is_read_only};
use crate::sink::{checkpoint, Sink};

/// A partition taken over.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// Topic and partition.
    pub tp: Tp,
    /// The checkpoint: next offset to apply (`None`: nothing committed in this generation yet).
    pub next: Option<i64>,
    /// Our fence (the bumped one): every batch's checkpoint compare-and-set carries it.
    pub fence: i64,
    /// The ids of the log the checkpoint was written on, `(topic id, cluster id)` (`None`: not recorded yet),
    /// compared with the broker's by `source::identity::check` before the checkpoint is used.
    pub stored_ids: (Option<String>, Option<String>),
}

/// Takes over the checkpoint rows of `tps` for `group` (creating them when missing), retrying transient
/// database errors until `give_up()`. With `newer`, a checkpoint that another generation of the group has
/// overtaken (a rolling deploy, a rollback of a generation change) is treated as absent (`next: None`), as
/// after a generation change.
///
/// # Errors
/// A non-transient database error, or the last one once `give_up()` is true.
pub async fn acquire(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    tps: &[Tp],
    newer: bool,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<Acquired>> {
    match acquire_with(sink, p, group, tps, newer, give_up, false).await? {
        Ok(acquired) => Ok(acquired),
        Err(e) => Err(Error::Postgres(e)),
    }
}

/// A partition whose checkpoint row another session kept locked past `postgres.lock-timeout-ms` (SQLSTATE
/// 55P03): typically a previous owner frozen inside its batch transaction, which holds the row until it commits
/// or PostgreSQL ends it (`postgres.idle-in-transaction-timeout-ms`).
#[derive(Debug, Clone)]
pub struct Blocked {
    /// Topic and partition.
    pub tp: Tp,
    /// PostgreSQL's message and SQLSTATE.
    pub detail: String,
    /// The backend pid of the transaction holding the row ([`holder`]), when it could be told.
    pub holder: Option<i32>,
}

/// As [`acquire`], partition by partition, but a take-over that waits longer than the lock timeout for the
/// checkpoint row is not retried here: it comes back as [`Blocked`], for the caller to retry later (outside a
/// rebalance callback, so the consumer keeps polling its other partitions).
///
/// # Errors
/// As [`acquire`].
pub async fn acquire_or_defer(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    tps: &[Tp],
    newer: bool,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<(Vec<Acquired>, Vec<Blocked>)> {
    let (mut acquired, mut blocked) = (Vec::new(), Vec::new());
    for tp in tps {
        match acquire_with(
            sink,
            p,
            group,
            std::slice::from_ref(tp),
            newer,
            give_up,
            true,
        )
        .await?
        {
            Ok(mut a) => acquired.append(&mut a),
            Err(e) => blocked.push(Blocked {
                tp: tp.clone(),
                detail: describe(&e),
                holder: holder(sink, p, group, tp).await,
            }),
        }
    }
    Ok((acquired, blocked))
}

/// Best effort: the pid of the session whose transaction locks `tp`'s checkpoint row — the row's `xmax` is the
/// locking transaction's id (a plain row lock or update), whose own transaction-id lock `pg_locks` lists. `None`
/// when the lock is gone or shared (a multixact), or the query fails.
async fn holder(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    (topic, partition): &Tp,
) -> Option<i32> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let sql = format!(
        "SELECT l.pid FROM {} c JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = c.xmax \
         AND l.granted AND l.mode = 'ExclusiveLock' \
         WHERE c.consumer_group = $1 AND c.topic = $2 AND c.partition = $3 AND c.generation = $4 LIMIT 1",
        p.table(checkpoint::CHECKPOINTS)
    );
    let row = sink
        .client()
        .query_opt(&sql, &[&group, topic, partition, &generation])
        .await
        .ok()??;
    row.get(0)
}

/// SQLSTATE 55P03 `lock_not_available`: `lock_timeout` fired.
fn is_lock_timeout(e: &Error) -> bool {
    matches!(e, Error::Postgres(pg) if pg.code().is_some_and(|c| c.code() == "55P03"))
}

/// [`acquire`]'s retries; with `defer_locked`, a lock timeout ends them as `Ok(Err(_))`.
async fn acquire_with(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    tps: &[Tp],
    newer: bool,
    give_up: &(dyn Fn() -> bool + Sync),
    defer_locked: bool,
) -> Result<std::result::Result<Vec<Acquired>, tokio_postgres::Error>> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let stmt = checkpoint::acquire_checkpoint(p);
    let newer_stmt = checkpoint::newer_generation(p);
    let sink = tokio::sync::Mutex::new(sink);
    let what = if tps.len() == 1 {
        "taking over a partition"
    } else {
        "taking over partitions"
    };
    retry_db(what, give_up, || async {
        // One attempt at a time: the lock is never contended.
        let mut sink = sink.lock().await;
        if sink.is_closed() {
            sink.reconnect().await?;
        }
        let result = acquire_once(
            &mut sink,
            (&stmt, &newer_stmt),
            group,
            &generation,
            tps,
            newer,
        )
        .await;
        if matches!(&result, Err(Error::Postgres(e)) if is_read_only(e)) {
            // A session on a read-only server (a failover the connection has not followed): the retry gets a
            // new connection.
            let _ = sink.reconnect().await;
        }
        match result {
            Err(e) if defer_locked && is_lock_timeout(&e) => match e {
                Error::Postgres(pg) => Ok(Err(pg)),
                other => Err(other),
            },
            other => other.map(Ok),
        }
    })
    .await
}

/// One attempt of [`acquire`] on `sink`: `stmts` are the take-over and newer-generation statements.
async fn acquire_once(
    sink: &mut Sink,
    (stmt, newer_stmt): (&str, &str),
    group: &str,
    generation: &str,
    tps: &[Tp],
    newer: bool,
) -> Result<Vec<Acquired>> {
    let mut out = Vec::with_capacity(tps.len());
    for (topic, partition) in tps {
        let superseded = if newer {
            sink.client()
                .query_opt(newer_stmt, &[&group, topic, partition, &generation])
                .await?
        } else {
            None
        };
        let row = sink
            .client()
            .query_one(stmt, &[&group, topic, partition, &generation])
            .await?;
        let mut next = row.get::<_, Option<i64>>(0);
        if let Some(r) = superseded {
            let (other, at): (String, i64) = (r.get(0), r.get(1));
            tracing::warn!(
                %topic,
                partition,
                stale = ?next,
                other_generation = %other,
                other_next = at,
                "generation `{other}` applied this partition after this generation's checkpoint; \
                 continuing from the newest checkpoint instead"
            );
            next = None;
        }
        // The partition's fenced-batches series exists from its take-over on (docs/operations.md "Metrics and health").
        fenced_counter(&(topic.clone(), *partition)).increment(0);
        out.push(Acquired {
            tp: (topic.clone(), *partition),
            next,
            fence: row.get::<_, i64>(1),
            stored_ids: (row.get(2), row.get(3)),
        });
    }
    Ok(out)
}

/// Writes a resolved start position into a checkpoint we hold (`fence`) before anything is consumed, so that a
/// crash before the first batch cannot resolve it again differently. With `mark_unapplied`, a checkpoint that
/// never applied a record also gets [`checkpoint::NOTHING_APPLIED`] as its last offset (a group's start). Returns
/// the rows updated (0: taken over by another consumer meanwhile).
///
/// # Errors
/// A database error.
pub async fn write_start(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    (topic, partition): &Tp,
    fence: i64,
    offset: i64,
    mark_unapplied: bool,
) -> Result<u64> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let stmt = if mark_unapplied {
        format!(
            "UPDATE {} SET next_offset = $5, updated_at = now(), \
             last_offset = CASE WHEN last_sha256 IS NULL THEN {} ELSE last_offset END \
             WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND fence = $4 AND generation = $6",
            p.table(checkpoint::CHECKPOINTS),
            checkpoint::NOTHING_APPLIED
        )
    } else {
        format!(
            "UPDATE {} SET next_offset = $5 WHERE consumer_group = $1 AND topic = $2 AND partition = $3 \
             AND fence = $4 AND generation = $6",
            p.table(checkpoint::CHECKPOINTS)
        )
    };
    Ok(sink
        .client()
        .execute(
            &stmt,
            &[&group, topic, partition, &fence, &offset, &generation],
        )
        .await?)
}

/// Moves a checkpoint we hold (`fence`) forward to `offset`, where an assign source (a backfill group or a
/// `projection build` resumed with a later `--from`) reads from, so that its first compare-and-set holds. The
/// records it skips were not applied by this group: the row's fingerprint is cleared and its last offset set
/// to [`checkpoint::NOTHING_APPLIED`], so the first batch counts as a start, not as continuing (the pruned-offset
/// check of `sink::lifecycle::check_pruned` applies as to a fresh group). Returns the rows updated.
///
/// # Errors
/// A database error.
pub async fn skip_forward(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    (topic, partition): &Tp,
    fence: i64,
    offset: i64,
) -> Result<u64> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let stmt = format!(
        "UPDATE {} SET next_offset = $5, updated_at = pg_catalog.now(), last_offset = {}, last_timestamp = NULL, \
         last_sha256 = NULL WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND fence = $4 \
         AND generation = $6 AND next_offset < $5",
        p.table(checkpoint::CHECKPOINTS),
        checkpoint::NOTHING_APPLIED
    );
    Ok(sink
        .client()
        .execute(
            &stmt,
            &[&group, topic, partition, &fence, &offset, &generation],
        )
        .await?)
}

/// `replaysafe_fenced_batches_total{topic, partition}`: batches of the partition rolled back by another owner's
/// fence (registered at zero by every take-over).
pub(super) fn fenced_counter(tp: &Tp) -> metrics::Counter {
    metrics::counter!(
        "replaysafe_fenced_batches_total",
        "topic" => tp.0.clone(),
        "partition" => tp.1.to_string()
    )
}

/// Records the broker's log ids in the checkpoint of `tp` we hold (`fence`) where none are stored
/// ([`checkpoint::record_log_ids`]); `ids` is `(topic id, cluster id)`. Returns the rows updated.
///
/// # Errors
/// A database error.
pub async fn record_log_ids(
    sink: &mut Sink,
    p: &Pipeline,
    group: &str,
    (topic, partition): &Tp,
    fence: i64,
    ids: (Option<&str>, Option<&str>),
) -> Result<u64> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    Ok(sink
        .client()
        .execute(
            &checkpoint::record_log_ids(p),
            &[
                &group,
                topic,
                partition,
                &generation,
                &fence,
                &ids.0,
                &ids.1,
            ],
        )
        .await?)
}
