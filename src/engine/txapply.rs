//! Applying one source transaction (`[source] transactions = "atomic"`, [`crate::engine::txbuf`]) with the retry
//! rules of the design (the retry driver, [`crate::engine::retry`]): connection trouble is retried with backoff
//! through the same path with the same keys; a lost COMMIT reply is "unknown" and resolved by the retry's claims
//! (all already held → the first attempt committed, its outcomes count); a value PostgreSQL rejects (or
//! replaysafe refuses) quarantines the WHOLE transaction — every record a dead letter naming the transaction and
//! the failing record, under the reason a per-record batch gives that record, nothing of it applied — and the
//! run goes on.

use crate::decode::{Reason, Rejection};
use crate::engine::retry::{self, Applied, Ended, Subject};
use crate::error::{Error, Result};
use crate::model::{ApplyError, Batch, Pending};
use crate::sink::Sink;

/// What one round of attempts came to.
enum Tried {
    /// Committed (outcomes of all parts, in part order) or fenced.
    Done(Applied),
    /// PostgreSQL rejected a value (`rejected-by-database`) or replaysafe refused one (e.g. `invalid-field`, a
    /// value its column's type refuses): the reason and the message.
    Rejected(Reason, String),
}

/// Applies the parts of one source transaction in one transaction ([`Sink::apply_transaction`]: each part under
/// its partition's fence, no checkpoint step), retrying transient failures until `give_up()` says stop; outcomes
/// of all parts, in part order. A part fenced (its partition taken by another owner) → [`Applied::Fenced`],
/// nothing written. A value PostgreSQL rejects → the whole transaction quarantined ([`quarantine`]).
///
/// # Errors
/// A fatal database problem; the dead-letter insert itself rejected; `give_up` (shutdown).
pub async fn apply_transaction(
    sink: &mut Sink,
    parts: &[Batch],
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Applied> {
    let (reason, message) = match attempts(sink, parts, give_up).await? {
        Tried::Done(a) => return Ok(a),
        Tried::Rejected(r, m) => (r, m),
    };
    let q = quarantine(sink, parts, reason, &message).await?;
    match attempts(sink, &q, give_up).await? {
        Tried::Done(a) => Ok(a),
        Tried::Rejected(_, m) => Err(Error::Other(format!(
            "the dead letters of source transaction {} were rejected: {m}",
            tx_id(sink, parts)
        ))),
    }
}

/// Tries the changes of an open source transaction in a rolled-back transaction ([`Sink::probe_transaction`]):
/// [`Applied::Committed`] with the outcomes they would have (nothing written; a `duplicate` = already claimed),
/// or [`Applied::Skipped`] when the probe failed (the transaction just stays open; its application reports a
/// real failure).
pub async fn check(sink: &mut Sink, parts: &[Batch]) -> Applied {
    match sink.probe_transaction(parts).await {
        Ok(o) => Applied::Committed(o.concat()),
        Err(e) => {
            tracing::debug!(transaction = %tx_id(sink, parts), "source transaction check not conclusive: {e:?}");
            Applied::Skipped
        }
    }
}

/// One round of attempts ([`retry::drive`]: a lost COMMIT reply is resolved by the retry's claims).
async fn attempts(
    sink: &mut Sink,
    parts: &[Batch],
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Tried> {
    let id = tx_id(sink, parts);
    let subject = Subject::Transaction { parts, id: &id };
    Ok(match retry::drive(sink, subject, give_up).await? {
        Ended::Committed(o) => Tried::Done(Applied::Committed(o)),
        Ended::Fenced | Ended::Rewound(_) => Tried::Done(Applied::Fenced),
        Ended::Data(e) => Tried::Rejected(
            Reason::RejectedByDatabase,
            format!("PostgreSQL rejected {}", db_message(&e)),
        ),
        Ended::Record { offset, rejection } => Tried::Rejected(
            rejection.reason,
            format!("record at offset {offset}: {}", rejection.detail),
        ),
    })
}

/// The parts with every record quarantined, the detail naming the transaction and the record rejected alone
/// ([`Sink::probe`]) — under that record's reason (`rejected-by-database`, or the reason replaysafe refuses its
/// value with, as a per-record batch would record it) —, or saying only the whole transaction fails (`reason`).
async fn quarantine(
    sink: &mut Sink,
    parts: &[Batch],
    reason: Reason,
    message: &str,
) -> Result<Vec<Batch>> {
    let id = tx_id(sink, parts);
    let claims = |b: &Batch| {
        b.items
            .iter()
            .filter(|i| matches!(i.pending, Pending::Claim { .. }))
            .count()
    };
    let n: usize = parts.iter().map(claims).sum();
    let (reason, culprit) = match culprit(sink, parts).await? {
        Some(c) => c,
        None => (
            reason,
            format!("no record alone; the transaction as a whole: {message}"),
        ),
    };
    let detail = format!(
        "source transaction {id} quarantined whole ({n} records, nothing applied): {culprit}"
    );
    tracing::warn!(transaction = %id, records = n, "{detail}");
    let mut q = parts.to_vec();
    // The changes; the END (filtered) and records a decoder already quarantined keep their outcome.
    for it in q.iter_mut().flat_map(|b| b.items.iter_mut()) {
        if !matches!(it.pending, Pending::Claim { .. }) {
            continue;
        }
        it.pending = Pending::Quarantine(Rejection {
            reason,
            detail: detail.clone(),
        });
    }
    Ok(q)
}

/// The first record rejected alone (each claim tried in a rolled-back transaction): its reason and `PostgreSQL
/// rejected topic/partition offset N: message` (or `topic/partition offset N: detail` for a value replaysafe
/// refuses).
async fn culprit(sink: &mut Sink, parts: &[Batch]) -> Result<Option<(Reason, String)>> {
    for b in parts {
        for it in &b.items {
            if !matches!(it.pending, Pending::Claim { .. }) {
                continue;
            }
            let single = Batch {
                items: vec![it.clone()],
                ..b.clone()
            };
            let at = format!("{}/{} offset {}", b.topic, b.partition, it.offset);
            match sink.probe(&single).await {
                Ok(()) => {}
                Err(ApplyError::Data(e)) => {
                    return Ok(Some((
                        Reason::RejectedByDatabase,
                        format!("PostgreSQL rejected {at}: {}", db_message(&e)),
                    )))
                }
                Err(ApplyError::Record { rejection, .. }) => {
                    return Ok(Some((
                        rejection.reason,
                        format!("{at}: {}", rejection.detail),
                    )))
                }
                Err(ApplyError::Fatal(e)) => return Err(e),
                Err(other) => {
                    tracing::debug!(%at, "probe not conclusive: {other:?}");
                    return Ok(None);
                }
            }
        }
    }
    Ok(None)
}

/// PostgreSQL's message with its SQLSTATE, and the column, table or constraint when the server names them.
fn db_message(e: &tokio_postgres::Error) -> String {
    let Some(d) = e.as_db_error() else {
        return crate::model::describe(e);
    };
    let mut s = format!("{} (SQLSTATE {})", d.message(), d.code().code());
    for (what, v) in [
        ("column", d.column()),
        ("table", d.table()),
        ("constraint", d.constraint()),
    ] {
        if let Some(v) = v {
            s += &format!(", {what} {v}");
        }
    }
    if let Some(detail) = d.detail() {
        s += &format!(": {detail}");
    }
    s
}

/// The source transaction id of the parts, for messages.
fn tx_id(sink: &Sink, parts: &[Batch]) -> String {
    crate::engine::txbuf::tx_id(sink.pipeline(), parts).unwrap_or_else(|| "?".into())
}
