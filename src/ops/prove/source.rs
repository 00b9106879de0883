//! The source of the scripted boundaries: the scratch topic's records in an order `prove` chose (a permitted
//! shuffle, a rebuilt topic's new offsets, a resnapshot), handed to the engine like a Kafka consumer would — each
//! partition taken over (checkpoint row, fence) and read from its checkpoint, else from the group's committed
//! Kafka offset on the scratch cluster, else from its first record — and acknowledged by committing the
//! group's offsets on the scratch cluster after the database commit.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::scratch::Rec;
use crate::engine::{lock, Ack, CommitMode, Offsets, PartState, Polled, Shared, Source, Tp};
use crate::error::{Error, Result};

/// Commits a group's offsets on the scratch cluster (a consumer of the group that never joins it).
pub struct KafkaAck {
    consumer: BaseConsumer,
}

impl KafkaAck {
    /// A committer for `group` on the scratch cluster `client` ([`super::scratch::Cluster::client`]).
    ///
    /// # Errors
    /// A Kafka error.
    pub fn new(client: &ClientConfig, group: &str) -> Result<KafkaAck> {
        let consumer = client
            .clone()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()?;
        Ok(KafkaAck { consumer })
    }

    /// The group's committed offsets of `tps` (next offset to read), where committed.
    ///
    /// # Errors
    /// A Kafka error.
    pub fn committed(&self, tps: &[Tp]) -> Result<BTreeMap<Tp, i64>> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in tps {
            tpl.add_partition(t, *p);
        }
        let got = self
            .consumer
            .committed_offsets(tpl, Duration::from_secs(10))?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }
}

impl Ack for KafkaAck {
    fn acknowledges(&self) -> bool {
        true
    }
    fn commit(&self, offsets: &Offsets, _mode: CommitMode) {
        let offsets = crate::source::kafka::offset_list(offsets);
        if let Err(e) = self
            .consumer
            .commit(&offsets, rdkafka::consumer::CommitMode::Sync)
        {
            tracing::warn!("prove: committing offsets on the scratch cluster: {e}");
        }
    }
    fn fenced(&self, tp: &Tp) -> Option<Error> {
        Some(Error::Other(format!(
            "{}/{}: fenced by another consumer",
            tp.0, tp.1
        )))
    }
}

/// The scripted source.
pub struct Scripted {
    core: Shared,
    group: String,
    order: VecDeque<Rec>,
    starts: Option<BTreeMap<Tp, i64>>,
    /// Hand a record only while nothing is in flight and fewer than `batch.max-records` are buffered: every
    /// flush then carries the records in the chosen order (one batch per flush with `max-records = 1`).
    paced: bool,
    /// [`Scripted::with_cuts`]: the records are handed in chunks of seeded random sizes, each chunk only once the
    /// previous one is applied (nothing buffered or in flight), so batches end at those cuts: the state of the
    /// generator and the records left in the current chunk.
    cuts: Option<(u64, usize, usize)>,
    ack: KafkaAck,
    /// Records handed to the engine.
    pub delivered: Arc<AtomicU64>,
}

impl Scripted {
    /// A source handing `order` to the engine of `core` under `group`.
    ///
    /// # Errors
    /// A Kafka error.
    pub fn new(
        core: Shared,
        client: &ClientConfig,
        group: &str,
        order: Vec<Rec>,
        paced: bool,
    ) -> Result<Scripted> {
        Ok(Scripted {
            core,
            group: group.to_string(),
            order: order.into(),
            starts: None,
            paced,
            cuts: None,
            ack: KafkaAck::new(client, group)?,
            delivered: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Hands the records in chunks of 1 to `max` records (sizes drawn from `seed`), each chunk once the one
    /// before is applied: with `batch.max-records` above `max` and a short linger, every batch ends at a cut
    /// (per partition) of the chunks — batch boundaries at random places, the order of the records kept.
    pub fn with_cuts(mut self, seed: u64, max: usize) -> Scripted {
        self.cuts = Some((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, 0, max.max(1)));
        self
    }

    /// Whether the current chunk of [`Scripted::with_cuts`] is used up while records of it are still buffered
    /// or in flight (then the source waits); draws the next chunk's size when the last one is applied.
    fn cut_pending(&mut self) -> bool {
        let Some((x, left, max)) = self.cuts.as_mut() else {
            return false;
        };
        if *left > 0 {
            return false;
        }
        let core = lock(&self.core);
        if core.in_flight() || core.buffered() > 0 {
            return true;
        }
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *left = 1 + crate::units::len(*x % *max as u64);
        false
    }

    /// Takes every partition of the script over; each starts at its checkpoint, else the group's committed
    /// offset, else its first record.
    fn take_over(&mut self) -> Result<()> {
        let tps: Vec<Tp> = self
            .order
            .iter()
            .map(|r| r.tp.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let committed = self.ack.committed(&tps)?;
        let mut core = lock(&self.core);
        let acquired = core.take_over(&self.ack, &self.group, &tps, false)?;
        let mut starts = BTreeMap::new();
        for a in acquired {
            let first = self
                .order
                .iter()
                .find(|r| r.tp == a.tp)
                .map_or(0, |r| r.offset);
            let start = a
                .next
                .or_else(|| committed.get(&a.tp).copied())
                .unwrap_or(first);
            core.parts
                .insert(a.tp.clone(), PartState::new(a.fence, start, a.next));
            starts.insert(a.tp, start);
        }
        self.starts = Some(starts);
        Ok(())
    }
}

impl Source for Scripted {
    fn poll(&mut self, _timeout: Duration) -> Polled {
        if self.starts.is_none() {
            if let Err(e) = self.take_over() {
                return Polled::Failed(e);
            }
        }
        if self.paced {
            let core = lock(&self.core);
            if core.in_flight() || core.buffered() >= core.pipeline.max_records {
                drop(core);
                std::thread::sleep(Duration::from_millis(1));
                return Polled::Busy;
            }
        }
        if self.cut_pending() {
            std::thread::sleep(Duration::from_millis(1));
            return Polled::Busy;
        }
        let starts = self
            .starts
            .as_ref()
            .expect("a record's partition is taken over before its records come");
        while let Some(r) = self.order.pop_front() {
            if starts.get(&r.tp).is_some_and(|s| r.offset < *s) {
                continue;
            }
            self.delivered.fetch_add(1, Ordering::Relaxed);
            if let Some((_, left, _)) = self.cuts.as_mut() {
                *left -= 1;
            }
            return Polled::Record(r.record());
        }
        Polled::Idle
    }

    fn ack(&self) -> &dyn Ack {
        &self.ack
    }

    fn finished(&mut self, _idle_turns: u32) -> bool {
        self.order.is_empty()
    }

    fn interrupted(&self) -> Option<Error> {
        None
    }

    fn flush_on_error(&self) -> bool {
        false
    }
}
