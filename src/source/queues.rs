//! One librdkafka queue per assigned partition, polled round-robin (issue 15).
//!
//! librdkafka's consumer queue delivers each partition's fetched records in long runs (one fetch response of up
//! to `max.partition.fetch.bytes` per partition), so a flush taken from it usually carried one or two
//! partitions and used one or two of the `postgres.connections`. With the partitions' queues split off
//! (`rd_kafka_queue_get_partition` + forwarding removed, librdkafka's "partition queue" API) and polled one record
//! per queue in turn, every partition's buffer fills at the same pace and every flush carries every partition.
//!
//! Order within a partition is kept: records fetched before a split sit in the consumer's queue and are always
//! drained first ([`Split::poll`]); those fetched after it are only in the partition's queue. librdkafka
//! deactivates partition queues on every (incremental) assign, so the owner re-splits after each rebalance
//! ([`Split::resplit`]).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;

use crate::engine::{Record, Tp};
use crate::error::Result;
use crate::source::kafka::record;

/// How long an idle poll waits on the consumer's own queue (callbacks, records fetched before a split) before
/// the partition queues are looked at again, in ms: a partition queue cannot wake a waiting poll.
const IDLE_SLICE_MS: u64 = 5;

/// The partition queues of a consumer's assignment and the round-robin cursor.
pub struct Split<C: ConsumerContext + 'static> {
    queues: Vec<(Tp, PartitionQueue<C>)>,
    next: usize,
}

impl<C: ConsumerContext + 'static> Default for Split<C> {
    fn default() -> Self {
        Split {
            queues: Vec::new(),
            next: 0,
        }
    }
}

/// What one poll gave: a record (copied out of librdkafka), an error of the queue it came from, or nothing.
pub type Next = Option<KafkaResult<Record>>;

fn copy(m: Option<KafkaResult<BorrowedMessage<'_>>>) -> Next {
    m.map(|r| r.map(|msg| record(&msg)))
}

impl<C: ConsumerContext + 'static> Split<C> {
    /// Splits off the queue of every partition currently assigned to `consumer` (the previous handles are
    /// dropped: an assign deactivated them).
    ///
    /// # Errors
    /// The consumer's assignment cannot be read.
    pub fn resplit(&mut self, consumer: &Arc<BaseConsumer<C>>) -> Result<()> {
        let assigned = consumer.assignment()?;
        self.queues.clear();
        for e in assigned.elements() {
            if let Some(q) = consumer.split_partition_queue(e.topic(), e.partition()) {
                self.queues
                    .push(((e.topic().to_string(), e.partition()), q));
            }
        }
        self.next = 0;
        tracing::debug!(partitions = self.queues.len(), "partition queues split");
        Ok(())
    }

    /// The next record: the consumer's own queue first (records fetched before the split, errors, callbacks),
    /// then one record from the next partition queue that has one; when none has, waits on the consumer's queue
    /// at most `timeout` (capped at a few ms, see `IDLE_SLICE_MS`). `stale` says a rebalance was served
    /// since the last [`Split::resplit`]: the partition queues are then not read (nothing returned) until the
    /// owner re-splits.
    pub fn poll(
        &mut self,
        consumer: &BaseConsumer<C>,
        timeout: Duration,
        stale: &dyn Fn() -> bool,
    ) -> Next {
        if self.queues.is_empty() {
            return copy(consumer.poll(timeout));
        }
        if let Some(m) = copy(consumer.poll(Duration::ZERO)) {
            return Some(m);
        }
        if stale() {
            return None;
        }
        let n = self.queues.len();
        for i in 0..n {
            let k = (self.next + i) % n;
            if let Some(m) = copy(self.queues[k].1.poll(Duration::ZERO)) {
                self.next = (k + 1) % n;
                return Some(m);
            }
        }
        copy(consumer.poll(timeout.min(Duration::from_millis(IDLE_SLICE_MS))))
    }

    /// Drops every partition queue (before the consumer closes).
    pub fn clear(&mut self) {
        self.queues.clear();
    }
}
