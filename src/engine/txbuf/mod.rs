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
use std::sync::Arc;
use std::time::{Duration, Instant};

mod meta;

pub use meta::{meta, read, tx_key, Meta};

use crate::config::txn::TxPlan;
use crate::config::Pipeline;
use crate::engine::apply::Applied;
use crate::engine::flush::{self, Cut};
use crate::engine::types::{PartState, Tp};
use crate::error::Result;
use crate::model::{Batch, Item, Outcome, Pending};

/// Why a transaction is applied (or probed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// END came and its counts are met.
    Complete,
    /// `transaction-timeout-ms` passed (since this process first read it, or — at the end of the input — since
    /// its records' timestamps).
    Timeout,
    /// `transaction-buffer-bytes` reached: the oldest open transaction goes.
    Memory,
    /// Every change of it is already claimed in the ledger (read again after a restart, its END not): applied
    /// now, as duplicates.
    Replayed,
    /// Not applied: its changes are tried in a rolled-back transaction to see whether all are already claimed
    /// ([`TxBuf::checked`]).
    Check,
}

/// How long a transaction without its END waits, once reading is idle, before its changes are checked against the
/// ledger (once): this, or a quarter of `transaction-timeout-ms` if less. Every transaction still incomplete is
/// checked before it times out, and at the end of the input.
pub const CHECK_AFTER: Duration = Duration::from_secs(1);

/// What a held change counts as: the distinct change it is (`ident`) and the collections END counts it under.
struct Held {
    ident: String,
    collections: Vec<String>,
}

struct Open {
    first: Instant,
    /// The earliest timestamp (ms since the Unix epoch) of its records, BEGIN and END: when it began.
    began_ms: Option<i64>,
    /// By partition and offset: a record read again (a rewind, a take-over) replaces its copy.
    records: BTreeMap<(Tp, i64), (Item, Held)>,
    /// Copies held per distinct change: a change delivered twice (a connector restart re-emits it) counts once.
    copies: HashMap<String, usize>,
    /// Distinct changes per collection name (each of a change's names).
    per: HashMap<String, u64>,
    end: Option<End>,
    /// The END event itself, held (its partition's checkpoint stays before it) until the transaction is applied:
    /// a new owner of the transaction topic's partition reads it again.
    end_item: Option<(Tp, Item)>,
    bytes: usize,
    /// Its changes were checked against the ledger ([`Why::Check`]); `check_now`: check at the next flush.
    checked: bool,
    check_now: bool,
    /// The check found every change already claimed.
    replayed: bool,
    /// At the end of the input, it began longer than `transaction-timeout-ms` ago.
    expired: bool,
}

impl Open {
    /// END came and its counts of the collections `counted` are met by distinct changes; an END without
    /// per-collection counts needs its `event_count`.
    fn complete(&self, counted: impl Fn(&str) -> bool) -> bool {
        let Some((total, counts)) = &self.end else {
            return false;
        };
        if counts.is_empty() {
            return self.copies.len() as u64 >= *total;
        }
        counts
            .iter()
            .filter(|(c, _)| counted(c))
            .all(|(c, k)| self.per.get(c).copied().unwrap_or(0) >= *k)
    }

    fn began(&mut self, ts: Option<i64>) {
        if let Some(t) = ts {
            self.began_ms = Some(self.began_ms.map_or(t, |b| b.min(t)));
        }
    }

    /// Adds a record; returns the bytes added (net of a replaced copy).
    fn add(&mut self, tp: &Tp, item: Item, held: Held) -> isize {
        let added = isize::try_from(item.size()).unwrap_or(isize::MAX);
        let removed = match self.records.remove(&(tp.clone(), item.offset)) {
            Some((i, h)) => {
                self.forget(&h);
                isize::try_from(i.size()).unwrap_or(isize::MAX)
            }
            None => 0,
        };
        let n = self.copies.entry(held.ident.clone()).or_default();
        *n += 1;
        if *n == 1 {
            for c in &held.collections {
                *self.per.entry(c.clone()).or_default() += 1;
            }
        }
        self.records.insert((tp.clone(), item.offset), (item, held));
        self.bytes = self.bytes.saturating_add_signed(added - removed);
        added - removed
    }

    fn forget(&mut self, h: &Held) {
        let Some(n) = self.copies.get_mut(&h.ident) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.copies.remove(&h.ident);
            for c in &h.collections {
                *self.per.entry(c.clone()).or_default() -= 1;
            }
        }
    }
}

/// The open transactions and the offsets they hold.
pub struct TxBuf {
    plan: TxPlan,
    pipeline: Arc<Pipeline>,
    open: HashMap<String, Open>,
    /// Offsets of records buffered here or applied in a flush not yet settled, per partition.
    held: BTreeMap<Tp, BTreeSet<i64>>,
    /// Per partition: the fence it was taken under and the offset after the last record taken (held or not);
    /// a newer take-over (another fence) or a rewind ([`TxBuf::rewound`]) forgets it.
    seen: BTreeMap<Tp, (i64, i64)>,
    /// Collections a change was read of (END's counts of other collections are not waited for).
    collections: HashSet<String>,
    bytes: usize,
    closed: HashSet<String>,
    closed_order: VecDeque<String>,
    /// Transactions taken for applying, not settled yet: when they were first seen and their END, for
    /// [`TxBuf::requeue`].
    applying: HashMap<String, (Instant, Option<End>)>,
    /// The last polls returned nothing ([`TxBuf::idle`]).
    idle: bool,
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

/// Whether a row projection of `pipeline` reads collection `c` (`schema.table`, `db.table`, …): its
/// `source-table`, or — without one — a table of the projection table's name.
fn projected(pipeline: &Pipeline, c: &str) -> bool {
    pipeline
        .projections
        .iter()
        .filter_map(|p| p.row.as_ref())
        .any(|r| match &r.source_table {
            Some(s) => s == c,
            None => c.rsplit('.').next() == Some(r.table.name.as_str()),
        })
}

/// Whether one of `topics` may carry collection `c` (`schema.table`, `db.table`, …): a topic named by Debezium's
/// default rule `<topic.prefix>.<schema>.<table>` ends with `.<table>` (Debezium's PostgreSQL connector doc,
/// "Topic names"); a pattern subscription (`^…`) may carry anything. A topic renamed by a routing SMT is not
/// recognised: name the table in a row projection's `source-table`, or its changes count only once one was read.
fn subscribed(topics: &[String], c: &str) -> bool {
    let table = c.rsplit('.').next().unwrap_or(c);
    topics
        .iter()
        .any(|t| t.starts_with('^') || t == table || t.ends_with(&format!(".{table}")))
}

impl TxBuf {
    /// An empty buffer for `pipeline` (its decoder unwraps registry frames; its row projections name the
    /// collections it reads).
    pub fn new(plan: TxPlan, pipeline: Arc<Pipeline>) -> TxBuf {
        TxBuf {
            plan,
            pipeline,
            open: HashMap::new(),
            held: BTreeMap::new(),
            seen: BTreeMap::new(),
            collections: HashSet::new(),
            bytes: 0,
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            applying: HashMap::new(),
            idle: false,
        }
    }

    /// Whether the source's last polls returned nothing (reading has paused): an END not read by then is not
    /// about to come from what Kafka holds.
    pub fn idle(&mut self, idle: bool) {
        self.idle = idle;
    }

    /// Whether END's count of collection `c` is waited for: a row projection reads it, a change of it was read,
    /// or one of `[kafka] topics` may carry it ([`subscribed`]). A connector capturing more tables than the
    /// pipeline subscribes to counts those too; they never come here.
    fn counted(&self, c: &str) -> bool {
        self.collections.contains(c)
            || projected(&self.pipeline, c)
            || subscribed(&self.pipeline.kafka.topics, c)
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

    /// The distinct change `item` is: its `total_order` in the transaction (Debezium's count of its events),
    /// else its delivery key, else its place.
    fn ident(&self, tp: &Tp, item: &Item, order: Option<u64>) -> String {
        if let Some(o) = order {
            return format!("order {o}");
        }
        if let Pending::Claim { fields, .. } = &item.pending {
            if let Some(k) = crate::decode::delivery_key(&self.pipeline, fields) {
                return format!("key {}", k.join("\u{1f}"));
            }
        }
        format!("at {}/{}/{}", tp.0, tp.1, item.offset)
    }

    /// Takes a record: a change of a transaction is held (returned `None`); anything else is handed back (an
    /// END also records its counts).
    pub fn take(&mut self, tp: &Tp, fence: i64, item: Item) -> Option<Item> {
        self.saw(tp, fence, item.offset);
        let ts = item.timestamp_ms;
        let back = match read(&self.pipeline, item.value.as_deref()) {
            Meta::Change { id, .. } if self.closed.contains(&id) => Some(item),
            Meta::Change {
                id,
                collections,
                order,
            } => {
                for c in &collections {
                    if !self.collections.contains(c) {
                        self.collections.insert(c.clone());
                    }
                }
                let ident = self.ident(tp, &item, order);
                self.held.entry(tp.clone()).or_default().insert(item.offset);
                let o = self.entry(id);
                o.began(ts);
                let delta = o.add(tp, item, Held { ident, collections });
                self.bytes = self.bytes.saturating_add_signed(delta);
                None
            }
            Meta::End { id, .. } if self.closed.contains(&id) => Some(item),
            Meta::End { id, total, counts } => {
                self.held.entry(tp.clone()).or_default().insert(item.offset);
                let o = self.entry(id);
                o.began(ts);
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
                    self.entry(id).began(ts);
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
            began_ms: None,
            records: BTreeMap::new(),
            copies: HashMap::new(),
            per: HashMap::new(),
            end: None,
            end_item: None,
            bytes: 0,
            checked: false,
            check_now: false,
            replayed: false,
            expired: false,
        })
    }

    /// What is due for `o` now, if anything: complete, replayed, a check against the ledger (before any
    /// timeout), the timeout.
    fn why(&self, o: &Open, now: Instant) -> Option<Why> {
        let age = now.duration_since(o.first);
        if o.complete(|c| self.counted(c)) {
            return Some(Why::Complete);
        }
        if o.records.is_empty() {
            // BEGIN/END without changes of ours (other tables' transaction, or an END read again or late after
            // its changes were applied): forgotten after the timeout — at the end of the input, once it began that
            // long ago (its records' timestamps).
            return (o.expired || age >= self.plan.timeout).then_some(Why::Complete);
        }
        if o.replayed {
            return Some(Why::Replayed);
        }
        let late = o.expired || age >= self.plan.timeout;
        // Its END not read although reading has paused (idle): possibly read again after a restart.
        let stalled = o.end.is_none() && self.idle && age >= CHECK_AFTER.min(self.plan.timeout / 4);
        if !o.checked && (late || o.check_now || stalled) {
            return Some(Why::Check);
        }
        late.then_some(Why::Timeout)
    }

    /// Whether a transaction is complete, replayed, to be checked, timed out, or the buffer is over its bytes.
    pub fn due(&self, now: Instant) -> bool {
        self.bytes > self.plan.buffer_bytes
            || self.open.values().any(|o| self.why(o, now).is_some())
    }

    /// At the end of the input (`--until-caught-up` caught up, a backfill's stop offsets, the end of a load's
    /// file): every open transaction is checked against the ledger at the next flush, and those that began
    /// (their records' timestamps) `transaction-timeout-ms` or longer before `now_ms` (ms since the Unix epoch)
    /// are applied as they are after it. Returns how many began that long ago.
    pub fn at_end(&mut self, now_ms: i64) -> usize {
        let timeout = i64::try_from(self.plan.timeout.as_millis()).unwrap_or(i64::MAX);
        let mut n = 0;
        for o in self.open.values_mut() {
            o.check_now = !o.checked;
            if o.began_ms
                .is_some_and(|b| now_ms.saturating_sub(b) >= timeout)
            {
                o.expired = true;
                n += 1;
            }
        }
        n
    }

    /// Takes the transactions to apply now — complete, replayed, timed-out ones, and the oldest while over the
    /// byte limit (their offsets stay held until [`TxBuf::settled`]) — and copies of those to check against the
    /// ledger (they stay open).
    pub fn ready(&mut self, now: Instant) -> Vec<Ready> {
        let mut ready = Vec::new();
        for (id, why) in self.choose(now) {
            if why == Why::Check {
                ready.push(self.copy_for_check(id));
            } else if let Some(r) = self.take_for_applying(id, why) {
                ready.push(r);
            }
        }
        self.gauges();
        ready
    }

    /// The transactions due now ([`TxBuf::why`]), then the oldest others while the buffer would stay over its
    /// bytes (a check takes nothing out of the buffer).
    fn choose(&self, now: Instant) -> Vec<(String, Why)> {
        let mut out: Vec<(String, Why)> = Vec::new();
        for (id, o) in &self.open {
            if let Some(why) = self.why(o, now) {
                out.push((id.clone(), why));
            }
        }
        let mut bytes = self.bytes;
        for (id, why) in &out {
            if *why != Why::Check {
                bytes -= self.open[id].bytes;
            }
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
        out
    }

    /// A copy of open transaction `id`'s changes for a [`Why::Check`] probe; it stays open, checked.
    fn copy_for_check(&mut self, id: String) -> Ready {
        let o = self.open.get_mut(&id).expect("open transaction");
        o.checked = true;
        o.check_now = false;
        let copies = o
            .records
            .iter()
            .map(|((tp, _), (it, _))| (tp.clone(), it.clone()));
        Ready {
            id,
            why: Why::Check,
            parts: parts(copies),
        }
    }

    /// Open transaction `id` taken out for applying (`why`), its id closed; `None` when it holds nothing.
    fn take_for_applying(&mut self, id: String, why: Why) -> Option<Ready> {
        let o = self.open.remove(&id).expect("open transaction");
        self.bytes -= o.bytes;
        self.close(&id);
        if o.records.is_empty() && o.end_item.is_none() {
            return None;
        }
        self.applying.insert(id.clone(), (o.first, o.end.clone()));
        if matches!(why, Why::Timeout | Why::Memory) {
            tracing::warn!(transaction = %id, records = o.records.len(), ?why, end_seen = o.end.is_some(),
                "source transaction applied as it is (incomplete): its END or some of its changes did not arrive in time");
            let reason = if why == Why::Timeout {
                "timeout"
            } else {
                "memory"
            };
            metrics::counter!("replaysafe_transactions_incomplete_total", "reason" => reason)
                .increment(1);
        } else if why == Why::Replayed {
            tracing::info!(transaction = %id, records = o.records.len(),
                "source transaction read again, every change already claimed: applied without waiting for its END");
        }
        let records = o.records.into_iter().map(|((tp, _), (it, _))| (tp, it));
        Some(Ready {
            id,
            why,
            parts: parts(records.chain(o.end_item)),
        })
    }

    /// The result of a [`Why::Check`] probe of a transaction's changes: when it ran and every change it had was
    /// already claimed (a `duplicate`), the transaction is applied at the next flush ([`Why::Replayed`]).
    pub fn checked(&mut self, parts: &[Batch], r: &Result<Applied>) {
        let Some(id) = self.tx_id(parts) else {
            return;
        };
        let Ok(Applied::Committed(outcomes)) = r else {
            return;
        };
        let items = parts.iter().flat_map(|b| b.items.iter());
        let claims: Vec<&Outcome> = items
            .zip(outcomes)
            .filter(|(it, _)| matches!(it.pending, Pending::Claim { .. }))
            .map(|(_, o)| o)
            .collect();
        let all = !claims.is_empty() && claims.iter().all(|o| **o == Outcome::Duplicate);
        if let (true, Some(o)) = (all, self.open.get_mut(&id)) {
            o.replayed = true;
        }
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
        if let Some(id) = self.tx_id(parts) {
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
        let Some(id) = self.tx_id(parts) else {
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
        let mut back: Vec<(Tp, Item, Option<Held>)> = Vec::new();
        for b in kept {
            let tp = (b.topic.clone(), b.partition);
            for it in &b.items {
                let held = match read(&self.pipeline, it.value.as_deref()) {
                    Meta::Change {
                        collections, order, ..
                    } => Some(Held {
                        ident: self.ident(&tp, it, order),
                        collections,
                    }),
                    _ => None,
                };
                back.push((tp.clone(), it.clone(), held));
            }
        }
        let mut added = 0isize;
        let o = self.entry(id);
        o.first = first;
        // Checked already, or not worth checking (it was being applied).
        o.checked = true;
        o.end = o.end.take().or(end);
        for (tp, it, held) in back {
            match held {
                Some(h) => added += o.add(&tp, it, h),
                None => o.end_item = Some((tp, it)),
            }
        }
        self.bytes = self.bytes.saturating_add_signed(added);
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

    /// The source transaction id of a transaction's parts (its first change's or END's, as [`tx_key`] keys it).
    pub fn tx_id(&self, parts: &[Batch]) -> Option<String> {
        tx_id(&self.pipeline, parts)
    }
}

/// The source transaction id of a transaction's parts (its first change's or END's, read as `pipeline` decodes
/// values, as [`tx_key`] keys it).
pub fn tx_id(pipeline: &Pipeline, parts: &[Batch]) -> Option<String> {
    parts.iter().flat_map(|b| b.items.iter()).find_map(|it| {
        match read(pipeline, it.value.as_deref()) {
            Meta::Change { id, .. } | Meta::End { id, .. } => Some(id),
            _ => None,
        }
    })
}

/// One batch per partition, offsets ascending.
fn parts(records: impl Iterator<Item = (Tp, Item)>) -> Vec<Batch> {
    let mut by: BTreeMap<Tp, Vec<Item>> = BTreeMap::new();
    for (tp, item) in records {
        by.entry(tp).or_default().push(item);
    }
    by.into_iter()
        .map(|((topic, partition), mut items)| {
            items.sort_by_key(|i| i.offset);
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
                check: r.why == Why::Check,
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
