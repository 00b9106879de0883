//! The one retry driver of the engine's transactions — a partition's batch ([`crate::engine::apply::apply_batch`])
//! and the parts of a source transaction ([`crate::engine::txapply::apply_transaction`]): connection trouble and
//! the errors PostgreSQL asks to retry ([`crate::model::retryable`]) are retried with [`backoff`] through the same
//! path with the same keys until `give_up()` says stop. A lost COMMIT reply is *unknown*, not failed: the retry
//! tells whether the first attempt committed ([`conclude`], the one place of that rule — a batch by its
//! checkpoint, a source transaction by its claims).
//!
//! The decisions are plain functions of plain values ([`Retry::failed`], [`conclude`], [`by_claims`]), unit-tested
//! below without a database; [`drive`] is the loop that runs them against it.

use std::time::Duration;

use crate::decode::Rejection;
use crate::error::{Error, Result};
use crate::model::{ApplyError, Batch, Outcome, Pending};
use crate::sink::Sink;

/// What became of a batch.
#[derive(Debug)]
pub enum Applied {
    /// Committed; one outcome per item.
    Committed(Vec<Outcome>),
    /// Another owner holds the partition now; nothing was written.
    Fenced,
    /// The checkpoint row still carries our fence but its next offset is not where our batches left it
    /// (`next offset to read` it holds): the last commits were lost behind our back — what a failover to an
    /// asynchronous replica, or a restored backup, does. Nothing was written; the partition is read again from
    /// the checkpoint (the ledger makes the re-read harmless). Case C37.
    Rewound(i64),
    /// Not tried: an earlier batch of its partition in the same flush was fenced or rewound, or the lane
    /// failed. Nothing was written.
    Skipped,
}

/// Backoff before retry number `attempt` (1 = the first retry): 100 ms doubling to 5 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(6)).min(5_000))
}

/// The PostgreSQL error inside `e`, if it is one (for the `sqlstate` label of a retry).
pub fn postgres_of(e: &Error) -> Option<&tokio_postgres::Error> {
    match e {
        Error::Postgres(pg) => Some(pg),
        _ => None,
    }
}

/// What the driver applies: one partition's batch, or the parts of one source transaction in one transaction
/// (`id`: its transaction id, for messages).
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A batch ([`Sink::apply`]): its checkpoint step tells whether a lost COMMIT landed.
    Batch(&'a Batch),
    /// A source transaction ([`Sink::apply_transaction`]): no checkpoint step; its claims tell.
    Transaction {
        /// The parts, one per partition, in part order.
        parts: &'a [Batch],
        /// The source transaction id.
        id: &'a str,
    },
}

impl Subject<'_> {
    /// One attempt, a new transaction: one outcome per item (a transaction: of all parts, in part order).
    async fn attempt(&self, sink: &mut Sink) -> std::result::Result<Vec<Outcome>, ApplyError> {
        match self {
            Subject::Batch(b) => sink.apply(b).await,
            Subject::Transaction { parts, .. } => {
                sink.apply_transaction(parts).await.map(|o| o.concat())
            }
        }
    }

    /// The log line of a retry.
    fn warn_retry(&self, attempt: u32, f: &Failure) {
        let (what, commit_sent, detail) = (f.what(), f.commit_sent, &f.detail);
        match self {
            Subject::Batch(b) => {
                tracing::warn!(attempt, commit_sent, topic = %b.topic, partition = b.partition,
                "{what}, retrying the batch: {detail}")
            }
            Subject::Transaction { id, .. } => {
                tracing::warn!(attempt, commit_sent, transaction = %id,
                "{what}, retrying the source transaction: {detail}")
            }
        }
    }
}

/// A failed attempt as the rule reads it: an [`ApplyError::Transient`], or a reconnect that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// What failed (`message (SQLSTATE code)` or the client's text), for the log line and `/readyz`.
    pub detail: String,
    /// COMMIT had been sent: the attempt's outcome is unknown.
    pub commit_sent: bool,
    /// The session cannot serve the retry ([`crate::model::apply_error::needs_new_session`]: read-only, lost prepared
    /// statements).
    pub new_session: bool,
    /// With `commit_sent`: what the attempt computed, the truth if its COMMIT did land.
    pub outcomes: Option<Vec<Outcome>>,
    /// No connection could be made (nothing was tried).
    pub unavailable: bool,
}

impl Failure {
    /// An attempt's transient error.
    fn of(
        error: &tokio_postgres::Error,
        commit_sent: bool,
        outcomes: Option<Vec<Outcome>>,
    ) -> Failure {
        Failure {
            detail: crate::model::describe(error),
            commit_sent,
            new_session: crate::model::apply_error::needs_new_session(error),
            outcomes,
            unavailable: false,
        }
    }

    /// A reconnect that failed.
    fn unavailable(e: &Error) -> Failure {
        Failure {
            detail: e.to_string(),
            commit_sent: false,
            new_session: false,
            outcomes: None,
            unavailable: true,
        }
    }

    fn what(&self) -> &'static str {
        if self.unavailable {
            "database unavailable"
        } else {
            "database error"
        }
    }
}

/// What the driver does after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Wait `pause`, then try again; `fresh`: on a new connection (the server may still be finishing the COMMIT
    /// it was sent, or this session reached a read-only server — a failover the pool has not followed, case C37 —
    /// or lost its prepared statements — a transaction pooler, case C45).
    Again {
        /// The backoff ([`backoff`]).
        pause: Duration,
        /// Replace the connection before the retry.
        fresh: bool,
    },
    /// `give_up()` said stop: `gave up after N attempts: detail`.
    GiveUp(String),
}

/// The state of one round of attempts: how many failed, and what an attempt whose COMMIT reply was lost
/// computed.
#[derive(Debug, Default)]
pub struct Retry {
    /// Failed attempts so far.
    pub attempt: u32,
    /// The outcomes of the last attempt that sent COMMIT and lost the reply: the truth if the retry shows it
    /// committed ([`conclude`]).
    pub unknown: Option<Vec<Outcome>>,
}

impl Retry {
    /// The rule after a failed attempt (`stop`: what `give_up()` says now). The attempt's transaction is gone
    /// (rolled back by the server — a deadlock 40P01 or serialization failure 40001 — or with its connection):
    /// the next attempt is a brand-new transaction that claims again, so nothing of it is kept but, after a lost
    /// COMMIT reply, its outcomes for the retry to confirm (case C36).
    pub fn failed(&mut self, f: Failure, stop: bool) -> Next {
        if f.commit_sent {
            self.unknown = f.outcomes;
        }
        self.attempt += 1;
        if stop {
            return Next::GiveUp(format!(
                "gave up after {} attempts: {}",
                self.attempt, f.detail
            ));
        }
        Next::Again {
            pause: backoff(self.attempt),
            fresh: f.commit_sent || f.new_session,
        }
    }
}

/// How a round of attempts ended (a transient failure is retried, never an end).
#[derive(Debug)]
pub enum Ended {
    /// Committed — by the last attempt or by an earlier one whose COMMIT reply was lost: the outcomes to count,
    /// one per item (a transaction: of all parts, in part order).
    Committed(Vec<Outcome>),
    /// A batch whose checkpoint row still carries our fence but whose next offset is not where our batches left
    /// it (the offset it holds, "next offset to read"): commits lost behind our back (case C37).
    Rewound(i64),
    /// Another owner holds the partition (a transaction: one of its parts' partitions); nothing was written.
    Fenced,
    /// PostgreSQL rejected a value ([`ApplyError::Data`]).
    Data(tokio_postgres::Error),
    /// One record cannot be applied ([`ApplyError::Record`]).
    Record {
        /// Its offset.
        offset: i64,
        /// Why.
        rejection: Rejection,
    },
}

/// The lost-COMMIT rule, its one place: what the last attempt's `result` (not transient) means, given `unknown`,
/// the outcomes of an earlier attempt whose COMMIT reply was lost ([`Retry::unknown`]).
///
/// - A batch: fenced at its own fence with the checkpoint at the batch's end means an earlier attempt
///   committed — its outcomes count (or, when it computed none, what it claimed: a claim is `duplicate`, filtered
///   and quarantined records keep their outcome). Our fence with another checkpoint is [`Ended::Rewound`];
///   another fence is [`Ended::Fenced`]. A commit is the last attempt's (the checkpoint refused a second one).
/// - A source transaction (no checkpoint step): [`by_claims`]. Fenced is [`Ended::Fenced`].
///
/// # Errors
/// [`ApplyError::Fatal`]'s error; a transient error (never passed by [`drive`]) as its PostgreSQL error.
pub fn conclude(
    subject: Subject<'_>,
    result: std::result::Result<Vec<Outcome>, ApplyError>,
    unknown: Option<Vec<Outcome>>,
) -> Result<Ended> {
    Ok(match (subject, result) {
        (Subject::Batch(_), Ok(outcomes)) => Ended::Committed(outcomes),
        (Subject::Transaction { .. }, Ok(retry)) => Ended::Committed(by_claims(unknown, retry)),
        (Subject::Batch(b), Err(ApplyError::Fenced { next_offset, fence })) => {
            batch_fenced(b, next_offset, fence, unknown)
        }
        (Subject::Transaction { id, .. }, Err(ApplyError::Fenced { next_offset, fence })) => {
            tracing::warn!(transaction = %id, fence, ?next_offset,
                "a partition of the source transaction is owned by another consumer now (fenced); not applied");
            Ended::Fenced
        }
        (_, Err(ApplyError::Data(e))) => Ended::Data(e),
        (_, Err(ApplyError::Record { offset, rejection })) => Ended::Record { offset, rejection },
        (_, Err(ApplyError::Fatal(e))) => return Err(e),
        (_, Err(ApplyError::Transient { error, .. })) => return Err(Error::Postgres(error)),
    })
}

/// A batch's attempt refused by its checkpoint step (the stored `next_offset` and `fence`): see [`conclude`].
fn batch_fenced(
    batch: &Batch,
    next_offset: Option<i64>,
    fence: i64,
    unknown: Option<Vec<Outcome>>,
) -> Ended {
    let (topic, partition) = (&batch.topic, batch.partition);
    if fence == batch.fence && next_offset == Some(batch.end) {
        tracing::info!(%topic, partition, "commit outcome was unknown; the checkpoint shows it committed");
        return Ended::Committed(unknown.unwrap_or_else(|| claimed(batch)));
    }
    if let (true, Some(at)) = (fence == batch.fence, next_offset) {
        tracing::warn!(%topic, partition, fence, checkpoint = at, expected = ?batch.expected,
            "the checkpoint moved under our own fence (commits lost by a database failover or restore?); reading \
             the partition again from the checkpoint");
        return Ended::Rewound(at);
    }
    tracing::warn!(%topic, partition, our_fence = batch.fence, fence, ?next_offset, expected = ?batch.expected,
        "partition is owned by another consumer now (fenced); batch discarded");
    Ended::Fenced
}

/// The outcomes of a batch that committed in an attempt whose outcomes are not known: every claim a
/// `duplicate` (what replaying it gives), filtered and quarantined records as they are.
fn claimed(batch: &Batch) -> Vec<Outcome> {
    batch
        .items
        .iter()
        .map(|i| match &i.pending {
            Pending::Claim { .. } => Outcome::Duplicate,
            Pending::Filtered(r) => Outcome::Filtered(r.clone()),
            Pending::Quarantine(r) => Outcome::Quarantined(r.reason),
        })
        .collect()
}

/// A source transaction's outcomes to count after a retry committed: when an earlier attempt's COMMIT reply was
/// lost (`unknown`) and the retry claimed nothing new, the earlier attempt committed (a source transaction's
/// claims commit all together or not at all) — its outcomes are the truth, counted once; otherwise the retry's.
/// "Claimed nothing new": no record of the retry is `landed` or `stale` without a conflict. A conflict says
/// nothing either way: a redelivery at a stored source position with another state (module
/// `projection::row::redelivery`) is a conflict in every attempt without claiming anything, and a claimed
/// conflict of an attempt that did not commit is a conflict in the retry too — then both attempts' outcomes are
/// the same and either is the truth.
pub fn by_claims(unknown: Option<Vec<Outcome>>, retry: Vec<Outcome>) -> Vec<Outcome> {
    // A stale record is claimed too (and reached every projection but the row ones: docs/reference.md "Accounting").
    let fresh = |o: &Outcome| matches!(o, Outcome::Landed | Outcome::Stale { conflict: false });
    match unknown {
        Some(u) if u.len() == retry.len() && u != retry && !retry.iter().any(fresh) => {
            tracing::info!(
                "source transaction: commit outcome was unknown; its claims show it committed"
            );
            u
        }
        _ => retry,
    }
}

/// Runs attempts of `subject` until one does not fail transiently, then [`conclude`]s. A closed connection is
/// opened again before an attempt (a failed reconnect counts as a failed attempt); each failure is counted
/// (`replaysafe_db_retries_total`), logged and shown on `/readyz`, then [`Retry::failed`] decides.
///
/// # Errors
/// A fatal database problem; `give_up()` true after a failed attempt (`gave up after N attempts: …`).
pub async fn drive(
    sink: &mut Sink,
    subject: Subject<'_>,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Result<Ended> {
    let mut retry = Retry::default();
    loop {
        let failure = if sink.is_closed() {
            match sink.reconnect().await {
                Ok(()) => continue,
                Err(e) => {
                    crate::model::apply_error::db_retry(postgres_of(&e));
                    Failure::unavailable(&e)
                }
            }
        } else {
            match subject.attempt(sink).await {
                Err(ApplyError::Transient {
                    error,
                    commit_sent,
                    outcomes,
                }) => {
                    crate::model::apply_error::db_retry(Some(&error));
                    Failure::of(&error, commit_sent, outcomes)
                }
                result => return conclude(subject, result, retry.unknown),
            }
        };
        subject.warn_retry(retry.attempt + 1, &failure);
        crate::health::retrying(&failure.detail);
        match retry.failed(failure, give_up()) {
            Next::GiveUp(message) => return Err(Error::Other(message)),
            Next::Again { pause, fresh } => {
                tokio::time::sleep(pause).await;
                if fresh && !sink.is_closed() {
                    let _ = sink.reconnect().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Reason;
    use crate::model::Item;

    fn failure(commit_sent: bool, new_session: bool, outcomes: Option<Vec<Outcome>>) -> Failure {
        Failure {
            detail: "connection closed".into(),
            commit_sent,
            new_session,
            outcomes,
            unavailable: false,
        }
    }

    fn batch(fence: i64, end: i64) -> Batch {
        let claim = |offset| Item {
            offset,
            timestamp_ms: None,
            key: None,
            value: None,
            pending: Pending::Claim {
                fields: Vec::new(),
                passes: Vec::new(),
                change: None,
                deletes: Vec::new(),
            },
        };
        Batch {
            topic: "t".into(),
            partition: 0,
            fence,
            expected: Some(end - 2),
            end,
            items: vec![
                claim(end - 2),
                Item {
                    pending: Pending::Filtered("skip".into()),
                    ..claim(end - 1)
                },
            ],
        }
    }

    #[test]
    fn a_failed_attempt_is_retried_with_backoff_until_give_up() {
        let mut r = Retry::default();
        let pause = |attempt| backoff(attempt);
        assert_eq!(
            r.failed(failure(false, false, None), false),
            Next::Again {
                pause: pause(1),
                fresh: false
            }
        );
        // A session that cannot serve the retry (read-only, lost prepared statements) is replaced.
        assert_eq!(
            r.failed(failure(false, true, None), false),
            Next::Again {
                pause: pause(2),
                fresh: true
            }
        );
        // A reconnect that failed counts like a failed attempt; nothing to replace.
        let down = Failure::unavailable(&Error::Other("refused".into()));
        assert_eq!(down.what(), "database unavailable");
        assert_eq!(
            r.failed(down.clone(), false),
            Next::Again {
                pause: pause(3),
                fresh: false
            }
        );
        assert_eq!(
            r.failed(down, true),
            Next::GiveUp("gave up after 4 attempts: refused".into())
        );
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(40), Duration::from_secs(5));
    }

    #[test]
    fn a_lost_commit_reply_keeps_the_attempts_outcomes_and_retries_on_a_new_connection() {
        let mut r = Retry::default();
        let landed = vec![Outcome::Landed];
        assert_eq!(
            r.failed(failure(true, false, Some(landed.clone())), false),
            Next::Again {
                pause: backoff(1),
                fresh: true
            }
        );
        assert_eq!(r.unknown.as_deref(), Some(&landed[..]));
        // A later failure before COMMIT keeps them; a later lost reply replaces them.
        r.failed(failure(false, false, None), false);
        assert_eq!(r.unknown.as_deref(), Some(&landed[..]));
        r.failed(failure(true, false, None), false);
        assert_eq!(r.unknown, None);
    }

    #[test]
    fn a_batch_fenced_at_its_own_end_committed_in_the_attempt_whose_reply_was_lost() {
        let b = batch(7, 12);
        let fenced = |next_offset, fence| Err(ApplyError::Fenced { next_offset, fence });
        let known = vec![Outcome::Landed, Outcome::Filtered("skip".into())];
        // Its outcomes count, or without them what it claimed.
        let got = conclude(Subject::Batch(&b), fenced(Some(12), 7), Some(known.clone()));
        assert!(matches!(got, Ok(Ended::Committed(o)) if o == known));
        let got = conclude(Subject::Batch(&b), fenced(Some(12), 7), None);
        assert!(
            matches!(got, Ok(Ended::Committed(o)) if o == [Outcome::Duplicate, Outcome::Filtered("skip".into())])
        );
        // Our fence, another checkpoint: commits lost behind our back, read again from it.
        let got = conclude(Subject::Batch(&b), fenced(Some(9), 7), Some(known.clone()));
        assert!(matches!(got, Ok(Ended::Rewound(9))));
        // Another fence (or our fence with no checkpoint): another owner.
        for (next, fence) in [(Some(12), 8), (None, 7)] {
            let got = conclude(Subject::Batch(&b), fenced(next, fence), Some(known.clone()));
            assert!(matches!(got, Ok(Ended::Fenced)), "{next:?} {fence}");
        }
        // A commit by the last attempt is its own (the checkpoint refuses a second one).
        let got = conclude(Subject::Batch(&b), Ok(vec![Outcome::Landed]), Some(known));
        assert!(matches!(got, Ok(Ended::Committed(o)) if o == [Outcome::Landed]));
    }

    #[test]
    fn what_ends_the_retries() {
        let b = batch(7, 12);
        let rejection = Rejection {
            reason: Reason::InvalidField,
            detail: "bad".into(),
        };
        let got = conclude(
            Subject::Batch(&b),
            Err(ApplyError::Record {
                offset: 10,
                rejection: rejection.clone(),
            }),
            None,
        );
        assert!(matches!(got, Ok(Ended::Record { offset: 10, rejection: r }) if r == rejection));
        let got = conclude(
            Subject::Batch(&b),
            Err(ApplyError::Fatal(Error::Other("dropped table".into()))),
            None,
        );
        assert!(matches!(got, Err(Error::Other(m)) if m == "dropped table"));
        // A transaction's fence: fenced whatever the checkpoint says.
        let parts = [b.clone()];
        let tx = Subject::Transaction {
            parts: &parts,
            id: "tx",
        };
        let got = conclude(
            tx,
            Err(ApplyError::Fenced {
                next_offset: Some(12),
                fence: 7,
            }),
            None,
        );
        assert!(matches!(got, Ok(Ended::Fenced)));
        // A transaction's commit goes through its claims.
        let got = conclude(
            tx,
            Ok(vec![Outcome::Duplicate]),
            Some(vec![Outcome::Landed]),
        );
        assert!(matches!(got, Ok(Ended::Committed(o)) if o == [Outcome::Landed]));
    }

    #[test]
    fn a_lost_reply_is_resolved_by_the_retry_claims() {
        let first = vec![Outcome::Landed, Outcome::Landed];
        let dup = vec![Outcome::Duplicate, Outcome::Duplicate];
        // The retry found every claim held: the first attempt committed, counted once as landed.
        assert!(matches!(
            by_claims(Some(first.clone()), dup.clone())[..],
            [Outcome::Landed, Outcome::Landed]
        ));
        // The retry landed them: the first attempt did not commit.
        assert!(matches!(
            by_claims(Some(first.clone()), first.clone())[..],
            [Outcome::Landed, Outcome::Landed]
        ));
        // A redelivery conflict (its key claimed before the transaction) is a conflict in the retry too: it claims
        // nothing, so the first attempt committed.
        let conflict = Outcome::Stale { conflict: true };
        assert_eq!(
            by_claims(
                Some(vec![Outcome::Landed, conflict.clone()]),
                vec![Outcome::Duplicate, conflict.clone()]
            ),
            [Outcome::Landed, conflict.clone()]
        );
        // A claimed conflict that committed: a duplicate in the retry.
        assert_eq!(
            by_claims(Some(vec![conflict.clone()]), vec![Outcome::Duplicate]),
            std::slice::from_ref(&conflict)
        );
        // Not committed: the retry decides the same.
        assert_eq!(
            by_claims(Some(vec![conflict.clone()]), vec![conflict.clone()]),
            [conflict]
        );
        // No lost reply: the retry's outcomes.
        assert!(matches!(
            by_claims(None, dup)[..],
            [Outcome::Duplicate, Outcome::Duplicate]
        ));
    }
}
