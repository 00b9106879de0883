//! The engine's state between polls: held partitions and their buffers, the connections, the flush in flight,
//! the tally. Shared (behind a mutex) with a source whose client calls back into it (a group's rebalance).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::NaiveDate;

use crate::config::Pipeline;
use crate::engine::apply::Applied;
use crate::engine::flush::{self, Inflight};
use crate::engine::takeover::{self, Acquired};
use crate::engine::txbuf::TxBuf;
use crate::engine::types::{Ack, CommitMode, Observer, PartState, Tp};
use crate::error::{Error, Result};
use crate::model::{Item, Outcome, Tally};
use crate::sink::Sink;

/// The engine's state.
pub struct Core {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) rt: tokio::runtime::Handle,
    /// The connections (empty while a flush is in flight: they move to its thread).
    pub(crate) sinks: Vec<Sink>,
    /// Held partitions.
    pub parts: BTreeMap<Tp, PartState>,
    /// Outcomes so far.
    pub tally: Tally,
    /// Batches committed so far.
    pub batches: u64,
    /// Records dropped with a batch that did not commit (and the rest of its partition's buffer): read again
    /// from the checkpoint by the next run; `buffered` in a report from outside ([`crate::engine::Reporter::tally`]).
    pub unapplied: u64,
    /// An error raised where it cannot be returned (a rebalance callback); the loop ends with it.
    pub fatal: Option<Error>,
    /// Demo: the simulated crash happened (database committed, acknowledgement withheld).
    pub crashed: bool,
    pub(crate) crash_after_batches: Option<u64>,
    pub(crate) shutdown: Arc<AtomicBool>,
    /// Ends the database retries ([`crate::engine::Options::give_up`]).
    pub(crate) give_up: Arc<AtomicBool>,
    pub(crate) inflight: Option<Inflight>,
    pub(crate) observer: Option<Box<dyn Observer>>,
    /// When the first record was buffered and when the last batch committed (throughput log line).
    pub(crate) first_record: Option<Instant>,
    pub(crate) last_commit: Option<Instant>,
    /// `[source] transactions = "atomic"`: the open source transactions (`None`: per record).
    pub(crate) tx: Option<TxBuf>,
    /// The accounting as the loop last published it, readable without this state's lock (a report from outside
    /// while a thread holding the lock waits on the database: [`crate::engine::Reporter::tally`]).
    pub(crate) published: Arc<Published>,
    /// When the accounting was last published.
    pub(crate) published_at: Instant,
}

/// The accounting the loop publishes ([`Core::publish`]).
#[derive(Debug, Default)]
pub struct Published {
    /// The tally as of the last committed batch that was published.
    tally: Mutex<Tally>,
    /// Batches committed when `tally` was published.
    batches: AtomicU64,
    /// Records consumed and not confirmed applied ([`Core::held`]).
    held: AtomicU64,
}

impl Published {
    /// The published tally with `buffered` = the records held then.
    pub fn tally(&self) -> Tally {
        let mut t = self.tally.lock().map(|t| t.clone()).unwrap_or_default();
        t.buffered = self.held.load(Ordering::Relaxed);
        t
    }
}

impl Core {
    pub(crate) fn give_up_flag(&self) -> Arc<AtomicBool> {
        self.give_up.clone()
    }

    /// Records consumed and not confirmed applied: in partition buffers or open source transactions, in the flush
    /// in flight, or dropped with a batch that did not commit ([`Core::unapplied`]).
    pub fn held(&self) -> u64 {
        let open = self.tx.as_ref().map_or(0, |t| t.open_counts().1);
        let flying = self.inflight.as_ref().map_or(0, |f| f.records);
        (self.buffered() + open + flying) as u64 + self.unapplied
    }

    /// Publishes the accounting ([`Published`]): the held count each call, the tally when batches committed
    /// since the last call.
    pub fn publish(&self) {
        let p = &self.published;
        p.held.store(self.held(), Ordering::Relaxed);
        if p.batches.swap(self.batches, Ordering::Relaxed) != self.batches {
            if let Ok(mut t) = p.tally.lock() {
                *t = self.tally.clone();
            }
        }
    }

    /// Whether a flush is in flight.
    pub fn in_flight(&self) -> bool {
        self.inflight.is_some()
    }

    /// Records buffered over all partitions.
    pub fn buffered(&self) -> usize {
        self.parts.values().map(|s| s.buffer.len()).sum()
    }

    /// Records buffered that a flush can apply now: not waiting behind a record an open source transaction holds
    /// ([`TxBuf::bound`]). Those that wait leave with their transaction, not with a flush, so a batch run's
    /// caught-up check does not wait for them.
    pub fn buffered_free(&self) -> usize {
        self.parts
            .iter()
            .map(|(tp, st)| {
                let bound = self.tx.as_ref().and_then(|t| t.bound(tp, st.fence));
                st.buffer
                    .iter()
                    .filter(|i| bound.is_none_or(|b| i.offset < b))
                    .count()
            })
            .sum()
    }

    /// Bytes of the records buffered in all partitions (keys and values, [`crate::model::Item::size`]).
    pub fn buffered_bytes(&self) -> usize {
        self.parts.values().map(|s| s.bytes).sum()
    }

    /// Whether the buffers hold `connections` batches' worth (`batch.max-records` × `postgres.connections`
    /// records, or `batch.max-bytes` × `postgres.connections` bytes): polling waits for the flush in flight, and
    /// a flush is due, so that what a worker holds stays within two such amounts (buffered and in flight).
    pub fn read_ahead_full(&self) -> bool {
        let n = self.pipeline.postgres.connections;
        let max = flush::Limits::of(&self.pipeline);
        self.buffered() >= max.records.saturating_mul(n)
            || self.buffered_bytes() >= max.bytes.saturating_mul(n)
    }

    /// The runtime the database work runs on.
    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.rt.clone()
    }

    /// The first connection, for the sources' checkpoint work; settle first (a flush in flight holds them).
    pub fn sink(&mut self) -> &mut Sink {
        &mut self.sinks[0]
    }

    /// Settles the flush in flight, then takes over `tps` ([`takeover::acquire`]) on the first connection.
    ///
    /// # Errors
    /// As [`Core::settle`] and [`takeover::acquire`].
    pub fn take_over(
        &mut self,
        ack: &dyn Ack,
        group: &str,
        tps: &[Tp],
        newer: bool,
    ) -> Result<Vec<Acquired>> {
        self.settle(ack, CommitMode::Async)?;
        crate::health::unfenced(tps);
        let stop = self.give_up_flag();
        let give_up = move || stop.load(Ordering::Relaxed);
        let p = self.pipeline.clone();
        let rt = self.rt.clone();
        rt.block_on(takeover::acquire(
            &mut self.sinks[0],
            &p,
            group,
            tps,
            newer,
            &give_up,
        ))
    }

    /// Buffers one decided record of a held partition (one not held is ignored).
    pub fn push(&mut self, tp: &Tp, item: Item, day: Option<NaiveDate>, track_days: bool) {
        let Some(st) = self.parts.get_mut(tp) else {
            tracing::debug!(topic = %tp.0, partition = tp.1, offset = item.offset, "record for a partition not held; ignored");
            return;
        };
        if st.buffer.is_empty() {
            st.oldest = Some(Instant::now());
        }
        st.bytes += item.size();
        st.buffer.push(item);
        if track_days {
            st.days.push(day);
        }
        self.first_record.get_or_insert_with(Instant::now);
    }

    /// A partition's buffer is full or its oldest record has waited `batch.linger-ms`.
    pub fn due(&self, now: Instant) -> bool {
        if self
            .tx
            .as_ref()
            .is_some_and(|t| t.due(now) || t.behind(&self.parts))
        {
            return true;
        }
        let max = flush::Limits::of(&self.pipeline);
        self.read_ahead_full()
            || self.parts.values().any(|st| {
                max.full(st.buffer.len(), st.bytes)
                    || st
                        .oldest
                        .is_some_and(|t| now.duration_since(t) >= self.pipeline.linger)
            })
    }

    /// When the oldest buffered record's linger ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.parts
            .values()
            .filter_map(|st| st.oldest)
            .min()
            .map(|t| t + self.pipeline.linger)
    }

    /// Flushes partitions selected by `which` and waits: the flush in flight (if any) is settled first, then
    /// the selected buffers are applied and acknowledged with `mode`.
    ///
    /// # Errors
    /// As [`Core::settle`].
    pub fn flush(
        &mut self,
        ack: &dyn Ack,
        which: impl Fn(&Tp, &PartState) -> bool,
        mode: CommitMode,
    ) -> Result<()> {
        self.settle(ack, mode)?;
        if self.crashed {
            return Ok(());
        }
        self.launch(which);
        self.settle(ack, mode)
    }

    /// Cuts the buffers of the partitions selected by `which` into batches and starts applying them in the
    /// background ([`flush::launch`]): polling and decoding the next records overlaps the transactions. At
    /// most one flush is in flight: [`Core::settle`] comes first, which also makes each partition's `next`
    /// (the next batch's expected checkpoint) current.
    pub fn launch(&mut self, which: impl Fn(&Tp, &PartState) -> bool) {
        debug_assert!(self.inflight.is_none(), "one flush in flight at most");
        let cuts = match self.tx.as_mut() {
            None => flush::cut(&mut self.parts, flush::Limits::of(&self.pipeline), which),
            Some(t) => crate::engine::txbuf::cuts(
                t,
                &mut self.parts,
                flush::Limits::of(&self.pipeline),
                which,
            ),
        };
        self.launch_cuts(cuts);
    }

    /// Starts applying `cuts` in the background (nothing when empty); no flush may be in flight.
    pub(crate) fn launch_cuts(&mut self, cuts: Vec<flush::Cut>) {
        debug_assert!(self.inflight.is_none(), "one flush in flight at most");
        if cuts.is_empty() {
            return;
        }
        let sinks = std::mem::take(&mut self.sinks);
        self.inflight = Some(flush::launch(&self.rt, sinks, cuts, self.give_up_flag()));
    }

    /// Waits for the flush in flight (if any), records its outcomes, and acknowledges — after the database
    /// commit — the offsets of the batches it committed, with `mode`.
    ///
    /// # Errors
    /// The first batch's error; a fenced batch's error when the source ends on one ([`Ack::fenced`]).
    pub fn settle(&mut self, ack: &dyn Ack, mode: CommitMode) -> Result<()> {
        let Some(flight) = self.inflight.take() else {
            return Ok(());
        };
        let (sinks, results) = flight.join()?;
        self.sinks = sinks;
        let mut commit = Vec::new();
        let mut first_err = None;
        // Partitions fenced or rewound in this flush: their later batches were skipped on purpose.
        let mut handled: Vec<Tp> = Vec::new();
        for (cut, r) in results {
            if let (Some(parts), true) = (&cut.tx, cut.check) {
                // A probe: nothing written, the transaction stays open.
                if let Some(t) = self.tx.as_mut() {
                    t.checked(parts, &r);
                }
                continue;
            }
            if let Some(parts) = &cut.tx {
                if let Err(e) = self.settle_transaction(ack, parts, r) {
                    first_err.get_or_insert(e);
                }
                continue;
            }
            let batch = &cut.batch;
            let tp = (batch.topic.clone(), batch.partition);
            if matches!(r, Ok(Applied::Fenced | Applied::Rewound(_))) {
                handled.push(tp.clone());
            }
            match r {
                Ok(Applied::Committed(outcomes)) => {
                    self.count_commit(std::slice::from_ref(batch), &cut.days, &outcomes);
                    if let Some(st) = self.parts.get_mut(&tp) {
                        st.next = Some(batch.end);
                    }
                    commit.push((tp.clone(), batch.end));
                }
                Ok(Applied::Rewound(at)) => match ack.rewind(&tp, at) {
                    // Read again from the checkpoint: what we buffered after the lost commits is dropped.
                    None => {
                        if let Some(t) = self.tx.as_mut() {
                            t.rewound(&tp);
                        }
                        if let Some(st) = self.parts.get_mut(&tp) {
                            st.buffer.clear();
                            st.bytes = 0;
                            st.days.clear();
                            st.oldest = None;
                            st.next = Some(at);
                        }
                        metrics::counter!("replaysafe_checkpoint_rewinds_total").increment(1);
                    }
                    Some(e) => {
                        first_err.get_or_insert(e);
                    }
                },
                Ok(Applied::Skipped) if handled.contains(&tp) => {}
                // Not committed because an earlier batch of its lane failed: later records of the partition
                // must not be applied over the gap.
                Ok(Applied::Skipped) => {
                    self.unapplied += batch.items.len() as u64;
                    self.forget_uncommitted(&tp);
                }
                Ok(Applied::Fenced) => match self.fenced(ack, &tp) {
                    // Another owner holds the checkpoint: what we buffered is dropped (the owner resumes from
                    // the checkpoint; a group source takes the partition over again once the group coordinator
                    // confirms it is still ours, or gives it up — src/source/group.rs).
                    None => {
                        crate::health::fenced(&tp);
                        self.parts.remove(&tp);
                    }
                    Some(e) => {
                        first_err.get_or_insert(e);
                    }
                },
                Err(e) => {
                    self.unapplied += batch.items.len() as u64;
                    self.forget_uncommitted(&tp);
                    first_err.get_or_insert(e);
                }
            }
        }
        if !commit.is_empty() && ack.acknowledges() {
            if let Some(limit) = self.crash_after_batches {
                if self.batches >= limit {
                    self.crashed = true;
                    return Ok(());
                }
            }
            fail::fail_point!("after-db-commit-before-kafka-commit", |_| {
                std::process::abort();
            });
            ack.commit(&commit, mode);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A source transaction's flush result ([`crate::engine::txbuf`]): committed → counted, its offsets no longer
    /// held (the partitions' next batches step over them); fenced (a part's partition taken by another owner) →
    /// nothing of it written, and every partition it touched handed back as fenced ([`Core::fenced`]: read again
    /// from its checkpoint, before the records, if it is still ours); not committed → the run ends with the
    /// error and the checkpoints stay before its records.
    fn settle_transaction(
        &mut self,
        ack: &dyn Ack,
        parts: &[crate::model::Batch],
        r: Result<Applied>,
    ) -> Result<()> {
        match r {
            Ok(Applied::Committed(outcomes)) => {
                metrics::counter!("replaysafe_transactions_applied_total").increment(1);
                // Days are not tracked for a transaction's records.
                self.count_commit(parts, &[], &outcomes);
                if let Some(t) = self.tx.as_mut() {
                    t.settled(parts);
                }
                Ok(())
            }
            Ok(Applied::Fenced) => self.transaction_fenced(ack, parts),
            Ok(Applied::Skipped) => {
                // Not tried (its lane stopped at a fenced batch or transaction): open again with the parts of
                // partitions still ours; the next flush tries it again.
                let keep = self.still_ours(parts);
                if let Some(t) = self.tx.as_mut() {
                    t.requeue(parts, |tp| keep.contains(tp));
                }
                Ok(())
            }
            Ok(_) => {
                self.unapplied += parts.iter().map(|b| b.items.len() as u64).sum::<u64>();
                Err(Error::Other(
                    "a source transaction's batch was not applied (an earlier batch of its connection failed)"
                        .into(),
                ))
            }
            Err(e) => {
                self.unapplied += parts.iter().map(|b| b.items.len() as u64).sum::<u64>();
                Err(e)
            }
        }
    }

    /// Counts a commit — a batch (`parts`: it alone, `days`: its records' partition-by days) or a source
    /// transaction (its parts, no days) — with `outcomes` (of all parts, in part order): the batch counter, the
    /// tally and its metrics, `/readyz`, and the observer, part by part (the last part takes what is left).
    fn count_commit(
        &mut self,
        parts: &[crate::model::Batch],
        days: &[Option<NaiveDate>],
        outcomes: &[Outcome],
    ) {
        crate::health::committed();
        self.batches += 1;
        self.last_commit = Some(Instant::now());
        metrics::counter!("replaysafe_batches_total").increment(1);
        for o in outcomes {
            self.tally.add(o);
            count_metric(o);
        }
        if let Some(obs) = self.observer.as_mut() {
            let mut rest = outcomes;
            for (i, part) in parts.iter().enumerate() {
                let n = if i + 1 == parts.len() {
                    rest.len()
                } else {
                    part.items.len().min(rest.len())
                };
                let (mine, later) = rest.split_at(n);
                obs.committed(part, days, mine);
                rest = later;
            }
        }
    }

    /// The partitions of a transaction's parts this engine still holds under the part's fence.
    fn still_ours(&self, parts: &[crate::model::Batch]) -> Vec<Tp> {
        parts
            .iter()
            .map(|b| ((b.topic.clone(), b.partition), b.fence))
            .filter(|(tp, f)| self.parts.get(tp).is_some_and(|st| st.fence == *f))
            .map(|(tp, _)| tp)
            .collect()
    }

    /// A transaction's commit was fenced, nothing written: the parts whose partition we no longer hold under
    /// their fence were fenced — when we think we hold them all, the database says otherwise for one of them, and
    /// all are handed back ([`Core::fenced`]: read again from the checkpoint if still ours). The transaction is
    /// open again with the other parts ([`crate::engine::txbuf::TxBuf::requeue`]).
    fn transaction_fenced(&mut self, ack: &dyn Ack, parts: &[crate::model::Batch]) -> Result<()> {
        let ours = self.still_ours(parts);
        let mut lost: Vec<Tp> = parts
            .iter()
            .map(|b| (b.topic.clone(), b.partition))
            .filter(|tp| !ours.contains(tp))
            .collect();
        if lost.is_empty() {
            lost = ours;
        }
        if let Some(t) = self.tx.as_mut() {
            t.requeue(parts, |tp| !lost.contains(tp));
            for tp in &lost {
                t.rewound(tp);
            }
        }
        let mut first_err = None;
        lost.retain(|tp| self.parts.contains_key(tp));
        for tp in lost {
            match self.fenced(ack, &tp) {
                None => {
                    crate::health::fenced(&tp);
                    self.parts.remove(&tp);
                }
                Some(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A batch of `tp` failed or was not tried (an earlier batch of its lane failed): nothing of it was
    /// committed, and its records are no longer buffered. The partition is no longer held by this engine — its
    /// buffer is dropped and later records are ignored ([`Core::push`]) — so no later batch (a drain on
    /// shutdown or revocation, a later flush) applies the records after it over the gap, moving the checkpoint
    /// past records never applied. The checkpoint stays before the failed batch: a rerun reads it again.
    fn forget_uncommitted(&mut self, tp: &Tp) {
        if let Some(st) = self.parts.remove(tp) {
            self.unapplied += st.buffered() as u64;
            tracing::debug!(topic = %tp.0, partition = tp.1, "partition dropped after a batch not committed");
        }
    }

    /// A batch of `tp` was fenced: counted in `replaysafe_fenced_batches_total{topic, partition}`, then handed
    /// to the source with the checkpoint this process last committed ([`Ack::fenced_at`]).
    fn fenced(&self, ack: &dyn Ack, tp: &Tp) -> Option<Error> {
        takeover::fenced_counter(tp).increment(1);
        match self.parts.get(tp) {
            Some(st) => ack.fenced_at(tp, st.next.unwrap_or(st.start)),
            None => ack.fenced(tp),
        }
    }

    /// Acknowledges every held partition's checkpoint synchronously (clean exits).
    pub fn commit_checkpoints(&self, ack: &dyn Ack) {
        self.commit_checkpoints_with(ack, CommitMode::Sync);
    }

    /// Acknowledges every held partition's checkpoint (next offset to read) with `mode`.
    pub fn commit_checkpoints_with(&self, ack: &dyn Ack, mode: CommitMode) {
        let held: Vec<(Tp, i64)> = (self.parts.iter())
            .filter_map(|(tp, st)| Some((tp.clone(), st.next?)))
            .collect();
        if !held.is_empty() && !self.crashed && ack.acknowledges() {
            ack.commit(&held, mode);
        }
    }
}

fn count_metric(o: &Outcome) {
    match o {
        Outcome::Landed => metrics::counter!("replaysafe_records_total", "outcome" => "landed").increment(1),
        Outcome::Duplicate => metrics::counter!("replaysafe_records_total", "outcome" => "duplicate").increment(1),
        Outcome::Stale { .. } => metrics::counter!("replaysafe_records_total", "outcome" => "stale").increment(1),
        Outcome::Filtered(rule) => {
            metrics::counter!("replaysafe_records_total", "outcome" => "filtered", "rule" => rule.clone()).increment(1)
        }
        Outcome::Quarantined(r) => {
            metrics::counter!("replaysafe_records_total", "outcome" => "quarantined", "reason" => r.as_str()).increment(1)
        }
    }
}
