//! Applying batches with the retry rules of the design: connection trouble is retried with backoff through
//! the same path with the same keys (a lost COMMIT reply is "unknown", resolved through the checkpoint — both by
//! the retry driver, [`crate::engine::retry`]), a value PostgreSQL rejects is isolated by replaying the batch
//! record by record and quarantined, anything else stops. Also the retries of start-up and take-over
//! ([`retry_db`]).

use crate::decode::{Reason, Rejection};
use crate::error::{Error, Result};
use crate::model::{Batch, Pending};
use crate::sink::Sink;

pub use crate::engine::retry::Applied;

pub use crate::engine::retry::backoff;
use crate::engine::retry::{self, postgres_of, Ended, Subject};

/// Applies `batch`, retrying transient failures until `give_up()` says stop ([`retry::drive`]: a lost COMMIT
/// reply is resolved through the checkpoint); a record that cannot be applied is quarantined and the batch tried
/// again, a batch PostgreSQL rejects is replayed record by record (`isolate`).
///
/// # Errors
/// [`Error`] for a fatal database problem, or when `give_up` ends the retries (shutdown).
pub async fn apply_batch(
    sink: &mut Sink,
    batch: &Batch,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Applied> {
    match retry::drive(sink, Subject::Batch(batch), give_up).await? {
        Ended::Committed(outcomes) => Ok(Applied::Committed(outcomes)),
        Ended::Rewound(at) => Ok(Applied::Rewound(at)),
        Ended::Fenced => Ok(Applied::Fenced),
        Ended::Data(error) => Box::pin(isolate(sink, batch, error, give_up)).await,
        Ended::Record { offset, rejection } => {
            tracing::warn!(topic = %batch.topic, partition = batch.partition, offset, "record quarantined: {}", rejection.detail);
            let mut b = batch.clone();
            for it in &mut b.items {
                if it.offset == offset {
                    it.pending = Pending::Quarantine(rejection.clone());
                }
            }
            Box::pin(apply_batch(sink, &b, give_up)).await
        }
    }
}

/// Replays a batch that PostgreSQL rejected record by record; the record that fails alone is quarantined.
async fn isolate(
    sink: &mut Sink,
    batch: &Batch,
    error: tokio_postgres::Error,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Applied> {
    let message = error
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| error.to_string());
    if batch.items.len() == 1 {
        let item = &batch.items[0];
        if matches!(item.pending, Pending::Quarantine(_)) {
            return Err(Error::Other(format!(
                "the dead-letter insert itself was rejected at {}/{} offset {}: {message}",
                batch.topic, batch.partition, item.offset
            )));
        }
        tracing::warn!(topic = %batch.topic, partition = batch.partition, offset = item.offset, "record rejected by PostgreSQL, quarantined: {message}");
        let mut single = batch.clone();
        single.items[0].pending = Pending::Quarantine(Rejection {
            reason: Reason::RejectedByDatabase,
            detail: message,
        });
        return Box::pin(apply_batch(sink, &single, give_up)).await;
    }
    tracing::warn!(topic = %batch.topic, partition = batch.partition, records = batch.items.len(), "batch rejected by PostgreSQL ({message}); replaying record by record");
    let mut outcomes = Vec::with_capacity(batch.items.len());
    let mut expected = batch.expected;
    for item in &batch.items {
        let single = Batch {
            topic: batch.topic.clone(),
            partition: batch.partition,
            fence: batch.fence,
            expected,
            end: item.offset + 1,
            items: vec![item.clone()],
        };
        match Box::pin(apply_batch(sink, &single, give_up)).await? {
            Applied::Committed(o) => outcomes.extend(o),
            other => return Ok(other),
        }
        expected = Some(single.end);
    }
    Ok(Applied::Committed(outcomes))
}

/// Whether an error is worth retrying: a PostgreSQL error without SQLSTATE (I/O, closed connection) or one
/// [`crate::model::retryable`] names (classes 08, 40, 53, 55, 57 and 25006 read-only — PostgreSQL manual, Appendix A).
pub fn is_transient(e: &Error) -> bool {
    match e {
        Error::Connect(c) => c.transient,
        Error::Postgres(pg) => match pg.code() {
            None => true,
            Some(c) => crate::model::retryable(c.code()),
        },
        _ => false,
    }
}

/// The one retry helper of the engine: runs `op` until it succeeds, retrying transient database errors
/// ([`is_transient`]) with [`backoff`] until `give_up()`. Used for starting up and for taking over checkpoints
/// (every source); batches and source transactions go through the retry driver ([`retry::drive`]), which also
/// resolves an unknown commit.
///
/// # Errors
/// The first non-transient error, or the last error once `give_up()` is true.
pub async fn retry_db<T, F, Fut>(
    what: &str,
    give_up: &(dyn Fn() -> bool + Sync),
    op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    retry_db_until(what, give_up, None, op).await
}

/// What a start-up retry waits for, in the words of its log line: a lock another session holds (SQLSTATE 55P03
/// `lock_not_available`, `lock_timeout` fired — e.g. a batch transaction of another worker), the server gone
/// (no SQLSTATE: a refused or lost connection), or another transient database error.
fn retry_words(e: &Error) -> &'static str {
    match postgres_of(e).and_then(tokio_postgres::Error::code) {
        Some(c) if c.code() == "55P03" => "waiting for a lock another session holds (lock_timeout)",
        Some(_) => "database error",
        None => "database unavailable",
    }
}

/// As [`retry_db`], also ending at `deadline` (start-up: `--connect-timeout`): no sleep goes past it, and the
/// last error is returned once it has passed, prefixed with how long was waited.
///
/// # Errors
/// As [`retry_db`]; the last transient error once `deadline` has passed.
pub async fn retry_db_until<T, F, Fut>(
    what: &str,
    give_up: &(dyn Fn() -> bool + Sync),
    deadline: Option<std::time::Instant>,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = std::time::Instant::now();
    let mut attempt = 0u32;
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if is_transient(&e) && left.is_some_and(|l| l.is_zero()) => {
                return Err(Error::Other(format!(
                    "{what}: {}: {e}",
                    crate::endpoint::gave_up(started.elapsed())
                )));
            }
            Err(e) if is_transient(&e) && !give_up() => {
                attempt += 1;
                crate::model::apply_error::db_retry(postgres_of(&e));
                tracing::warn!(attempt, "{what}: {}, retrying: {e}", retry_words(&e));
                crate::health::beat(None);
                let pause = backoff(attempt);
                tokio::time::sleep(left.map_or(pause, |l| l.min(pause))).await;
            }
            Err(e) => return Err(e),
        }
    }
}
