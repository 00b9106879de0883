//! `[source] transactions = "atomic"`: Debezium source transactions (`provide.transaction.metadata=true`)
//! buffered per transaction id until the END event's per-collection counts are met, then applied in one
//! PostgreSQL transaction ([`crate::sink::Sink::apply_transaction`]) whatever the arrival order, across topics
//! and partitions. Checkpoints never pass a held record: a partition's batches end before its lowest held offset
//! ([`TxBuf::bound`]) until the transaction holding it committed, so a crash re-reads it (the ledger makes the
//! re-application harmless). A transaction whose END (or last change) has not come after `transaction-timeout-ms`
//! is applied as it is, with a warning and `replaysafe_transactions_incomplete_total{reason="timeout"}`; when the
//! buffered bytes pass `transaction-buffer-bytes`, the oldest open transaction is applied as it is (`reason =
//! "memory"`). Debezium's transaction metadata shapes: <https://debezium.io/documentation/reference/stable/connectors/postgresql.html#postgresql-transaction-metadata>.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Instant;

mod meta;

pub use meta::{meta, tx_key, Meta};

use crate::config::txn::TxPlan;
use crate::engine::flush::{self, Cut};
use crate::engine::types::{PartState, Tp};
use crate::sink::{Batch, Item};

/// Why a transaction is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// END came and its counts are met.
    Complete,
    /// `transaction-timeout-ms` passed.
    Timeout,
    /// `transaction-buffer-bytes` reached: the oldest open transaction goes.
    Memory,
}

struct Open {
    first: Instant,
    /// By partition and offset: a record read again (a rewind, a take-over) replaces its copy.
    records: BTreeMap<(Tp, i64), (Item, Vec<String>)>,
    /// Records per collection name (each of a record's names).
    per: HashMap<String, u64>,
    end: Option<End>,
    /// The END event itself, held (its partition's checkpoint stays before it) until the transaction is applied:
    /// a new owner of the transaction topic's partition reads it again.
    end_item: Option<(Tp, Item)>,
    bytes: usize,
}

impl Open {
    fn complete(&self) -> bool {
        let Some((total, counts)) = &self.end else {
            return false;
        };
        self.records.len() as u64 >= *total
            && counts
                .iter()
                .all(|(c, k)| self.per.get(c).copied().unwrap_or(0) >= *k)
    }

    /// Adds a record; returns the bytes added (net of a replaced copy).
    fn add(&mut self, tp: &Tp, item: Item, collections: Vec<String>) -> isize {
        let added = item.size() as isize;
        let old = self
            .records
            .insert((tp.clone(), item.offset), (item, collections.clone()));
        let removed = match old {
            Some((i, cs)) => {
                for c in cs {
                    *self.per.entry(c).or_default() -= 1;
                }
                i.size() as isize
            }
            None => 0,
        };
        for c in collections {
            *self.per.entry(c).or_default() += 1;
        }
        self.bytes = (self.bytes as isize + added - removed) as usize;
        added - removed
    }
}

/// The open transactions and the offsets they hold.
pub struct TxBuf {
    plan: TxPlan,
    open: HashMap<String, Open>,
    /// Offsets of records buffered here or applied in a flush not yet settled, per partition.
    held: BTreeMap<Tp, BTreeSet<i64>>,
    /// Per partition: the fence it was taken under and the offset after the last record taken (held or not);
    /// a newer take-over (another fence) or a rewind ([`TxBuf::rewound`]) forgets it.
    seen: BTreeMap<Tp, (i64, i64)>,
    bytes: usize,
    closed: HashSet<String>,
    closed_order: VecDeque<String>,
    /// Transactions taken for applying, not settled yet: when they were first seen and their END, for
    /// [`TxBuf::requeue`].
    applying: HashMap<String, (Instant, Option<End>)>,
}

/// An END's `event_count` and per-collection counts.
type End = (u64, Vec<(String, u64)>);

/// How many applied transaction ids [`TxBuf`] remembers.
pub const CLOSED: usize = 10_000;

/// A transaction ready to apply: its id, why, and its parts (one batch per partition, offsets ascending;
/// `fence` set by [`cuts`] to the partition's, `expected`/`end` unused: no checkpoint step).
pub struct Ready {
    /// The transaction id.
    pub id: String,
    /// Why it is applied now.
    pub why: Why,
    /// One batch per partition.
    pub parts: Vec<Batch>,
}

impl TxBuf {
    /// An empty buffer.
    pub fn new(plan: TxPlan) -> TxBuf {
        TxBuf {
            plan,
            open: HashMap::new(),
            held: BTreeMap::new(),
            seen: BTreeMap::new(),
            bytes: 0,
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            applying: HashMap::new(),
        }
    }

    /// Notes a record of `tp` at `offset` taken (for [`TxBuf::bound`]).
    pub fn saw(&mut self, tp: &Tp, fence: i64, offset: i64) {
        // Assigned, not maxed: after a rewind or a new take-over the partition is read again from below.
        self.seen.insert(tp.clone(), (fence, offset + 1));
    }

    /// The checkpoint of `tp` moved back (read again from it): what was taken after it is forgotten.
    pub fn rewound(&mut self, tp: &Tp) {
        self.seen.remove(tp);
    }

    /// Takes a record: a change of a transaction is held (returned `None`); anything else is handed back (an
    /// END also records its counts).
    pub fn take(&mut self, tp: &Tp, fence: i64, item: Item) -> Option<Item> {
        self.saw(tp, fence, item.offset);
        let back = match meta(item.value.as_deref()) {
            Meta::Change { id, .. } if self.closed.contains(&id) => Some(item),
            Meta::Change { id, collections } => {
                self.held.entry(tp.clone()).or_default().insert(item.offset);
                let delta = self.entry(id).add(tp, item, collections);
                self.bytes = (self.bytes as isize + delta) as usize;
                None
            }
            Meta::End { id, .. } if self.closed.contains(&id) => Some(item),
            Meta::End { id, total, counts } => {
                self.held.entry(tp.clone()).or_default().insert(item.offset);
                let o = self.entry(id);
                o.end = Some((total, counts));
                let offset = item.offset;
                let old = o.end_item.replace((tp.clone(), item));
                if let Some((otp, old)) = old.filter(|(otp, i)| otp != tp || i.offset != offset) {
                    self.unhold(&otp, old.offset);
                }
                None
            }
            Meta::Begin { id } => {
                if !self.closed.contains(&id) {
                    self.entry(id);
                }
                Some(item)
            }
            Meta::Other => Some(item),
        };
        self.gauges();
        back
    }

    fn entry(&mut self, id: String) -> &mut Open {
        self.open.entry(id).or_insert_with(|| Open {
            first: Instant::now(),
            records: BTreeMap::new(),
            per: HashMap::new(),
            end: None,
            end_item: None,
            bytes: 0,
        })
    }

    /// Whether a transaction is complete, timed out, or the buffer is over its bytes.
    pub fn due(&self, now: Instant) -> bool {
        self.bytes > self.plan.buffer_bytes
            || self.open.values().any(|o| {
                !o.records.is_empty()
                    && (o.complete() || now.duration_since(o.first) >= self.plan.timeout)
            })
    }

    /// Takes the transactions to apply now: complete ones, timed-out ones, and the oldest while over the
    /// byte limit. Their offsets stay held until [`TxBuf::settled`].
    pub fn ready(&mut self, now: Instant) -> Vec<Ready> {
        let mut out: Vec<(String, Why)> = Vec::new();
        for (id, o) in &self.open {
            if o.complete() {
                out.push((id.clone(), Why::Complete));
            } else if !o.records.is_empty() && now.duration_since(o.first) >= self.plan.timeout {
                out.push((id.clone(), Why::Timeout));
            } else if o.records.is_empty() && now.duration_since(o.first) >= self.plan.timeout {
                // BEGIN/END without changes of ours (other tables' transaction): forgotten.
                out.push((id.clone(), Why::Complete));
            }
        }
        let mut bytes = self.bytes;
        for (id, _) in &out {
            bytes -= self.open[id].bytes;
        }
        while bytes > self.plan.buffer_bytes {
            let Some((id, o)) = self
                .open
                .iter()
                .filter(|(id, o)| !o.records.is_empty() && !out.iter().any(|(x, _)| x == *id))
                .min_by_key(|(_, o)| o.first)
            else {
                break;
            };
            bytes -= o.bytes;
            out.push((id.clone(), Why::Memory));
        }
        let mut ready = Vec::new();
        for (id, why) in out {
            let o = self.open.remove(&id).expect("open transaction");
            self.bytes -= o.bytes;
            self.close(&id);
            if o.records.is_empty() && o.end_item.is_none() {
                continue;
            }
            self.applying.insert(id.clone(), (o.first, o.end.clone()));
            if why != Why::Complete {
                tracing::warn!(transaction = %id, records = o.records.len(), ?why, end_seen = o.end.is_some(),
                    "source transaction applied as it is (incomplete): its END or some of its changes did not arrive in time");
                let reason = if why == Why::Timeout {
                    "timeout"
                } else {
                    "memory"
                };
                metrics::counter!("replaysafe_transactions_incomplete_total", "reason" => reason)
                    .increment(1);
            }
            ready.push(Ready {
                id,
                why,
                parts: parts(o.records, o.end_item),
            });
        }
        self.gauges();
        ready
    }

    /// `replaysafe_transaction_buffer_bytes` and `replaysafe_transactions_open` (buffered, not yet applied).
    fn gauges(&self) {
        metrics::gauge!("replaysafe_transaction_buffer_bytes").set(self.bytes as f64);
        metrics::gauge!("replaysafe_transactions_open").set(self.open.len() as f64);
    }

    /// Remembers the last [`CLOSED`] transaction ids taken for applying: a change or END of one arriving later
    /// (after a timeout, or read again) is applied per record, not held for another timeout.
    fn close(&mut self, id: &str) {
        if self.closed.insert(id.to_string()) {
            self.closed_order.push_back(id.to_string());
        }
        while self.closed_order.len() > CLOSED {
            if let Some(old) = self.closed_order.pop_front() {
                self.closed.remove(&old);
            }
        }
    }

    /// A transaction's parts committed (or were dropped with their partition): their offsets are no longer held.
    pub fn settled(&mut self, parts: &[Batch]) {
        if let Some(id) = tx_id(parts) {
            self.applying.remove(&id);
        }
        for b in parts {
            let tp = (b.topic.clone(), b.partition);
            for it in &b.items {
                self.unhold(&tp, it.offset);
            }
        }
    }

    fn unhold(&mut self, tp: &Tp, offset: i64) {
        if let Some(h) = self.held.get_mut(tp) {
            h.remove(&offset);
            if h.is_empty() {
                self.held.remove(tp);
            }
        }
    }

    /// A transaction's commit was fenced: nothing of it was written. It is open again (its END kept) with the
    /// records of the parts `keep` says are still ours (still held); the other parts' offsets are no longer held —
    /// their partitions' owners read them again from the checkpoints, and records read again here are buffered
    /// anew.
    pub fn requeue(&mut self, parts: &[Batch], keep: impl Fn(&Tp) -> bool) {
        let Some(id) = tx_id(parts) else {
            return;
        };
        let (first, end) = self
            .applying
            .remove(&id)
            .unwrap_or_else(|| (Instant::now(), None));
        self.closed.remove(&id);
        self.closed_order.retain(|x| *x != id);
        let (kept, lost): (Vec<&Batch>, Vec<&Batch>) = parts
            .iter()
            .partition(|b| keep(&(b.topic.clone(), b.partition)));
        self.settled(&lost.into_iter().cloned().collect::<Vec<_>>());
        let mut added = 0isize;
        let o = self.entry(id);
        o.first = first;
        o.end = o.end.take().or(end);
        for b in kept {
            let tp = (b.topic.clone(), b.partition);
            for it in &b.items {
                match meta(it.value.as_deref()) {
                    Meta::Change { collections, .. } => {
                        added += o.add(&tp, it.clone(), collections);
                    }
                    _ => o.end_item = Some((tp.clone(), it.clone())),
                }
            }
        }
        self.bytes = (self.bytes as isize + added) as usize;
    }

    /// How far a batch of `tp` may move its checkpoint: before its lowest held offset, and not past the last
    /// record taken.
    pub fn bound(&self, tp: &Tp, fence: i64) -> Option<i64> {
        let held = self.held.get(tp).and_then(|h| h.first().copied());
        let seen = self
            .seen
            .get(tp)
            .filter(|(f, _)| *f == fence)
            .map(|(_, n)| *n);
        match (held, seen) {
            (Some(h), Some(s)) => Some(h.min(s)),
            (h, s) => h.or(s),
        }
    }

    /// Whether a partition with nothing buffered has its checkpoint below its bound: transaction records
    /// applied that its checkpoint has to step over (a batch without records).
    pub fn behind(&self, parts: &BTreeMap<Tp, PartState>) -> bool {
        parts.iter().any(|(tp, st)| {
            st.buffer.is_empty()
                && self
                    .bound(tp, st.fence)
                    .is_some_and(|b| b > st.next.unwrap_or(st.start))
        })
    }

    /// Whether any record is held (buffered or applying).
    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// Records and transactions buffered, for the shutdown log line.
    pub fn open_counts(&self) -> (usize, usize) {
        let recs = self
            .open
            .values()
            .map(|o| o.records.len() + usize::from(o.end_item.is_some()))
            .sum();
        (
            self.open
                .values()
                .filter(|o| !o.records.is_empty() || o.end_item.is_some())
                .count(),
            recs,
        )
    }
}

/// The source transaction id of a transaction's parts (its first change's, as [`tx_key`] keys it).
pub fn tx_id(parts: &[Batch]) -> Option<String> {
    parts
        .iter()
        .flat_map(|b| b.items.iter())
        .find_map(|it| match meta(it.value.as_deref()) {
            Meta::Change { id, .. } | Meta::End { id, .. } => Some(id),
            _ => None,
        })
}

/// One batch per partition, offsets ascending.
fn parts(records: BTreeMap<(Tp, i64), (Item, Vec<String>)>, end: Option<(Tp, Item)>) -> Vec<Batch> {
    let mut by: BTreeMap<Tp, Vec<Item>> = BTreeMap::new();
    for ((tp, _), (item, _)) in records {
        by.entry(tp).or_default().push(item);
    }
    if let Some((tp, item)) = end {
        let v = by.entry(tp).or_default();
        v.push(item);
        v.sort_by_key(|i| i.offset);
    }
    by.into_iter()
        .map(|((topic, partition), items)| {
            let end = items.last().map_or(0, |i| i.offset + 1);
            Batch {
                topic,
                partition,
                fence: 0,
                expected: None,
                end,
                items,
            }
        })
        .collect()
}

/// The cuts of a flush in atomic mode: the transactions ready now (each one cut of all its parts), then each
/// partition's buffer below its bound ([`flush::cut_bounded`]). Partitions whose checkpoint is below their bound
/// (transaction records applied) are selected too.
pub fn cuts(
    t: &mut TxBuf,
    parts: &mut BTreeMap<Tp, PartState>,
    max: flush::Limits,
    which: impl Fn(&Tp, &PartState) -> bool,
) -> Vec<Cut> {
    let mut cuts: Vec<Cut> = t
        .ready(Instant::now())
        .into_iter()
        .map(|mut r| {
            // Each part under the fence its partition is held by now: its commit takes that fence.
            for b in &mut r.parts {
                b.fence = parts
                    .get(&(b.topic.clone(), b.partition))
                    .map_or(0, |st| st.fence);
            }
            let first = &r.parts[0];
            tracing::debug!(transaction = %r.id, why = ?r.why, parts = r.parts.len(), "source transaction applied");
            Cut {
                batch: Batch {
                    topic: first.topic.clone(),
                    partition: first.partition,
                    fence: 0,
                    expected: None,
                    end: 0,
                    items: Vec::new(),
                },
                days: Vec::new(),
                tx: Some(r.parts),
            }
        })
        .collect();
    let bounds: BTreeMap<Tp, Option<i64>> = parts
        .iter()
        .map(|(tp, st)| (tp.clone(), t.bound(tp, st.fence)))
        .collect();
    let bound = |tp: &Tp| bounds.get(tp).copied().flatten();
    let behind =
        |tp: &Tp, st: &PartState| bound(tp).is_some_and(|b| b > st.next.unwrap_or(st.start));
    cuts.extend(flush::cut_bounded(
        parts,
        max,
        |tp, st| which(tp, st) || behind(tp, st),
        &bound,
    ));
    cuts
}

#[cfg(test)]
mod tests;
