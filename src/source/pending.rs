//! Partitions assigned to the group source whose take-over is still pending: the checkpoint row was locked by
//! another session past `postgres.lock-timeout-ms` (a frozen previous owner). They stay assigned but paused and
//! unpositioned — nothing is consumed from them — and the take-over is retried from the poll loop with
//! [`backoff`] until it succeeds or the partition is revoked.
//!
//! A partition whose batch was fenced while the group still assigns it to this member waits here too (paused):
//! after a grace it is taken over again once the group coordinator confirms this member still owns it
//! ([`Pending::fenced`]; src/source/group.rs), or dropped by the rebalance that expels a zombie.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::engine::apply::backoff;
use crate::engine::takeover::Blocked;
use crate::engine::Tp;

/// One pending take-over.
#[derive(Debug)]
struct Waiting {
    since: Instant,
    attempts: u32,
    next_try: Instant,
    /// A fenced partition: the checkpoint this process last committed (next offset to read), committed to
    /// Kafka to ask the coordinator whether the partition is still ours before taking it over again.
    fenced: Option<i64>,
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
            fenced: None,
        });
        w.attempts += 1;
        w.next_try = now + backoff(w.attempts);
        metrics::counter!("replaysafe_takeover_deferrals_total").increment(1);
        tracing::warn!(
            topic = %b.tp.0,
            partition = b.tp.1,
            attempts = w.attempts,
            waited_ms = crate::units::ms(now.duration_since(w.since)),
            blocking_pid = ?b.holder,
            "take-over waits: the partition's checkpoint row is locked by another session (a previous owner's \
             open batch transaction?); the partition stays paused, nothing is consumed from it, the take-over is \
             retried from the poll loop: {}",
            b.detail
        );
    }

    /// Records a partition whose batch was fenced (another writer bumped its fence) while the group still
    /// assigns it here: paused, its take-over is due after `grace`, once ownership is confirmed. `at`: the
    /// checkpoint this process last committed.
    pub fn fenced(&mut self, tp: &Tp, at: i64, grace: Duration) {
        let now = Instant::now();
        self.waiting.insert(
            tp.clone(),
            Waiting {
                since: now,
                attempts: 0,
                next_try: now + grace,
                fenced: Some(at),
            },
        );
    }

    /// A fenced partition whose ownership the group coordinator did not confirm (`detail`): retried with
    /// [`backoff`]. Returns how long ago it was fenced.
    pub fn unconfirmed(&mut self, tp: &Tp, detail: &str) -> Duration {
        let now = Instant::now();
        let Some(w) = self.waiting.get_mut(tp) else {
            return Duration::ZERO;
        };
        w.attempts += 1;
        w.next_try = now + backoff(w.attempts);
        let waited = now.duration_since(w.since);
        tracing::warn!(
            topic = %tp.0,
            partition = tp.1,
            attempts = w.attempts,
            waited_ms = crate::units::ms(waited),
            "fenced partition: the group coordinator does not confirm this member still owns it ({detail}); \
             waiting for the rebalance that gives it up"
        );
        waited
    }

    /// The partitions whose next attempt is due, each with its fenced checkpoint (`None`: a take-over that
    /// found its row locked).
    pub fn due(&self, now: Instant) -> Vec<(Tp, Option<i64>)> {
        self.waiting
            .iter()
            .filter(|(_, w)| w.next_try <= now)
            .map(|(tp, w)| (tp.clone(), w.fenced))
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
                    waited_ms = crate::units::ms(w.since.elapsed()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_partition_is_due_after_its_grace_with_its_checkpoint() {
        let mut p = Pending::default();
        let tp = ("t".to_string(), 3);
        let grace = Duration::from_millis(200);
        p.fenced(&tp, 42, grace);
        let now = Instant::now();
        assert!(p.due(now).is_empty(), "not before the grace");
        assert!(
            !p.is_empty(),
            "a fenced partition keeps `run --until-caught-up` from finishing"
        );
        assert_eq!(p.due(now + grace), vec![(tp.clone(), Some(42))]);
        // Not confirmed: retried after a backoff, the time since the fence reported.
        let waited = p.unconfirmed(&tp, "Broker: Specified group generation id is not valid");
        assert!(waited < Duration::from_secs(5));
        assert!(p.due(Instant::now()).is_empty());
        assert_eq!(p.due(Instant::now() + backoff(1)).len(), 1);
        // Revoked (or taken over): forgotten.
        assert!(p.remove(&tp));
        assert!(p.is_empty());
        assert_eq!(p.unconfirmed(&tp, "gone"), Duration::ZERO);
    }
}
