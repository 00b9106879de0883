//! The engine's vocabulary, shared by its parts and the sources: partitions, records, what a poll returns,
//! the acknowledgement and the observer of committed batches, a held partition's state.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::NaiveDate;

use crate::error::Error;
use crate::model::{Batch, Item, Outcome, Pending, Tally};

/// A topic and partition.
pub use crate::model::Tp;

/// One record from a source, before the decision.
pub struct Record {
    /// Topic and partition.
    pub tp: Tp,
    /// Offset.
    pub offset: i64,
    /// Record timestamp, ms since the Unix epoch, if any.
    pub timestamp_ms: Option<i64>,
    /// Raw key.
    pub key: Option<Vec<u8>>,
    /// Raw value.
    pub value: Option<Vec<u8>>,
    /// The Debezium old-key header (a primary-key change), if any.
    pub old_key: Option<Vec<u8>>,
    /// The decision, when the source took it already with the engine's `decide` (the file source
    /// decides on its reader thread, in parallel with the engine); `None`: the engine decides.
    pub decided: Option<Pending>,
}

/// What a poll returned.
pub enum Polled {
    /// A record of a held partition.
    Record(Record),
    /// Nothing arrived before the timeout (or a partition's end was reached).
    Idle,
    /// Something happened that is neither a record nor idleness (a logged client warning).
    Busy,
    /// The source cannot go on.
    Failed(Error),
}

/// What acknowledges committed batches to the source, after the database commit.
/// How a source commits the offsets it is given: `Sync` waits for the broker's answer (clean exits, revoked
/// partitions), `Async` does not (after each flush; a Kafka source learns the result in its commit callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    Sync,
    Async,
}

/// Offsets to acknowledge, in the order the batches committed: per partition the next offset to read (the
/// PostgreSQL checkpoint just committed; a partition can appear more than once, the last entry is the newest).
pub type Offsets = [(Tp, i64)];

pub trait Ack {
    /// Whether this source acknowledges at all (Kafka sources commit offsets; a file does not).
    fn acknowledges(&self) -> bool;
    /// Commits `offsets` (next offset to read per partition) with `mode`; a failure is only logged (the
    /// checkpoint in PostgreSQL is authoritative).
    fn commit(&self, offsets: &Offsets, mode: CommitMode);
    /// Whether every held checkpoint is to be committed again now (a Kafka source whose offset commit failed, or
    /// that was just assigned partitions: Kafka's committed offsets would stay behind the checkpoints until new
    /// records arrive). Asked by the loop when idle; `true` counts as done. The default: never.
    fn recommit_due(&self) -> bool {
        false
    }
    /// A batch of `tp` was fenced (another owner holds the checkpoint): `None` to stop reading the partition
    /// and go on (a group), or the error that ends the run.
    fn fenced(&self, tp: &Tp) -> Option<Error>;
    /// As [`Ack::fenced`], with `at`: the partition's checkpoint as this process last committed it (next offset
    /// to read) — what a group source commits to Kafka to ask the group coordinator whether it still owns the
    /// partition. The default ignores it.
    fn fenced_at(&self, tp: &Tp, at: i64) -> Option<Error> {
        let _ = at;
        self.fenced(tp)
    }
    /// The checkpoint of `tp` moved under our own fence to `offset` (next offset to read; commits lost behind
    /// our back, case C37): `None` once the partition is positioned there to be read again, or the error that
    /// ends the run (a rerun resumes from the checkpoint). The default ends the run.
    fn rewind(&self, tp: &Tp, offset: i64) -> Option<Error> {
        Some(Error::Other(format!(
            "{}/{}: the checkpoint moved back to offset {offset} under this process (commits lost by a database \
             failover or restore?); nothing after it is acknowledged — rerun to resume from the checkpoint",
            tp.0, tp.1
        )))
    }
}

/// An [`Ack`] that acknowledges nothing; a fenced partition ends the run with `fenced`'s error.
pub struct NoAck(pub Box<dyn Fn(&Tp) -> Error + Send + Sync>);

impl Ack for NoAck {
    fn acknowledges(&self) -> bool {
        false
    }
    fn commit(&self, _: &Offsets, _: CommitMode) {}
    fn fenced(&self, tp: &Tp) -> Option<Error> {
        Some((self.0)(tp))
    }
}

/// Sees every committed batch (a backfill's per-day report, its progress bar) and the loop's turns.
pub trait Observer: Send {
    /// A batch committed: its items' partition-by days (empty when not tracked) and outcomes, in item order.
    fn committed(&mut self, batch: &Batch, days: &[Option<NaiveDate>], outcomes: &[Outcome]);
    /// Called on every turn of the loop (rate-limit yourself).
    fn tick(&mut self, parts: &BTreeMap<Tp, PartState>, tally: &Tally);
    /// The loop ended.
    fn finish(&mut self) {}
}

/// A partition's state while held.
pub struct PartState {
    /// Our fence of the checkpoint row.
    pub fence: i64,
    /// The offset the partition was positioned at when taken over.
    pub start: i64,
    /// Checkpoint in the database: next offset to read (`None`: nothing committed yet).
    pub next: Option<i64>,
    pub(crate) buffer: Vec<Item>,
    /// Bytes of the buffered records' keys and values ([`Item::size`]).
    pub(crate) bytes: usize,
    /// Partition-by day per buffered item (only when the decision tracks days).
    pub(crate) days: Vec<Option<NaiveDate>>,
    pub(crate) oldest: Option<Instant>,
}

impl PartState {
    /// A partition taken over at `start`, checkpoint `next`.
    pub fn new(fence: i64, start: i64, next: Option<i64>) -> PartState {
        PartState {
            fence,
            start,
            next,
            buffer: Vec::new(),
            bytes: 0,
            days: Vec::new(),
            oldest: None,
        }
    }

    /// Records buffered, not yet launched.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes of the records buffered, not yet launched.
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }
}
