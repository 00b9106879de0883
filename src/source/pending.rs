//! Partitions assigned to the group source whose take-over is still pending: the checkpoint row was locked by
//! another session past `postgres.lock-timeout-ms` (a frozen previous owner). They stay assigned but paused and
//! unpositioned — nothing is consumed from them — and the take-over is retried from the poll loop with
//! [`backoff`] until it succeeds or the partition is revoked.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::engine::apply::backoff;
use crate::engine::takeover::Blocked;
use crate::engine::Tp;

/// One pending take-over.
#[derive(Debug)]
struct Waiting {
    since: Instant,
    attempts: u32,
    next_try: Instant,
}

/// The pending take-overs of one consumer.
#[derive(Debug, Default)]
pub struct Pending {
    waiting: BTreeMap<Tp, Waiting>,
}

impl Pending {
    /// Records a take-over that found its checkpoint row locked (first time or again), and logs it.
    pub fn blocked(&mut self, b: &Blocked) {
        let now = Instant::now();
        let w = self.waiting.entry(b.tp.clone()).or_insert(Waiting {
            since: now,
            attempts: 0,
            next_try: now,
        });
        w.attempts += 1;
        w.next_try = now + backoff(w.attempts);
        metrics::counter!("replaysafe_takeover_deferrals_total").increment(1);
        tracing::warn!(
            topic = %b.tp.0,
            partition = b.tp.1,
            attempts = w.attempts,
            waited_ms = now.duration_since(w.since).as_millis() as u64,
            blocking_pid = ?b.holder,
            "take-over waits: the partition's checkpoint row is locked by another session (a previous owner's \
             open batch transaction?); the partition stays paused, nothing is consumed from it, the take-over is \
             retried from the poll loop: {}",
            b.detail
        );
    }

    /// The partitions whose next attempt is due.
    pub fn due(&self, now: Instant) -> Vec<Tp> {
        self.waiting
            .iter()
            .filter(|(_, w)| w.next_try <= now)
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// Forgets `tp` (taken over, or revoked); true when it was pending.
    pub fn remove(&mut self, tp: &Tp) -> bool {
        match self.waiting.remove(tp) {
            Some(w) => {
                tracing::info!(
                    topic = %tp.0,
                    partition = tp.1,
                    attempts = w.attempts,
                    waited_ms = w.since.elapsed().as_millis() as u64,
                    "pending take-over ended"
                );
                true
            }
            None => false,
        }
    }

    /// Whether `tp` is pending.
    pub fn contains(&self, tp: &Tp) -> bool {
        self.waiting.contains_key(tp)
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}
