//! The assign source (`backfill`, `rebuild`): explicit partitions (no group subscription), each read from its
//! start offset and stopped before its stop offset (exclusive). The checkpoint rows of the source's own group
//! id make a second run of the same window a no-op: a partition resumes at its checkpoint.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;

use crate::engine::takeover;
use crate::engine::{lock, Ack, CommitMode, Offsets, PartState, Polled, Shared, Source, Tp};
use crate::error::{Error, Result};
use crate::source::identity;
use crate::source::kafka::{consumer_config, kafka_commit, record};

/// One partition to read: `[start, stop)`.
#[derive(Debug, Clone)]
pub struct Range {
    /// Topic and partition.
    pub tp: Tp,
    /// First offset to read.
    pub start: i64,
    /// Stop offset (exclusive).
    pub stop: i64,
}

struct Part {
    range: Range,
    done: bool,
}

/// The source's consumer as the engine's acknowledgement: commits offsets of its group; a fenced batch (another
/// process runs the same group) ends the run.
pub struct AssignAck {
    consumer: BaseConsumer,
    group: String,
    /// Whether offsets are committed to Kafka (a backfill's `--keep-group`).
    commit: bool,
}

impl Ack for AssignAck {
    fn acknowledges(&self) -> bool {
        self.commit
    }

    fn commit(&self, offsets: &Offsets, mode: CommitMode) {
        kafka_commit(&self.consumer, offsets, mode);
    }

    fn fenced(&self, tp: &Tp) -> Option<Error> {
        Some(Error::Other(format!(
            "another process runs backfill group {} on {}/{}; stopped",
            self.group, tp.0, tp.1
        )))
    }
}

/// The assign source.
pub struct Assign {
    core: Shared,
    ack: AssignAck,
    parts: Vec<Part>,
    /// Where each partition starts in this session (its range's start, or the checkpoint it resumes at).
    starts: Vec<(Tp, i64)>,
    /// When every partition was first done: from then on, the wait for checkpoints to reach their stops.
    all_done_at: Option<std::time::Instant>,
    /// The error of an interrupted session: the command to rerun ([`Assign::rerun`]).
    rerun: String,
}

/// What an interrupted backfill (or rebuild) says by default.
const RERUN_BACKFILL: &str =
    "interrupted; rerun the same backfill command to resume from its checkpoints (a \
     rebuild: rerun it with a new --group-id)";

/// Stops fetching a partition that reached its stop: polls then go idle (the engine steps checkpoints over
/// control records only when idle) instead of returning the records past the stop until the partition's end.
fn pause(consumer: &BaseConsumer, tp: &Tp) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    if let Err(e) = consumer.pause(&tpl) {
        tracing::debug!(topic = %tp.0, partition = tp.1, "pause after the stop: {e}");
    }
}

/// How long a finished assign source waits for the engine to step checkpoints over the control records before
/// their stops (a transactional producer's last markers) before it ends with them below (a rerun resumes there
/// and reads nothing).
const STEP_OVER_WAIT: Duration = Duration::from_secs(10);

impl Assign {
    /// Takes over the checkpoints of `ranges` under `group` and assigns the partitions not yet done. A
    /// partition with a checkpoint resumes there (a note in `notes` when inside the range); one without is
    /// positioned at its start, written to the checkpoint. Offsets are committed to Kafka under `group` only
    /// with `commit` (a backfill's `--keep-group`): the checkpoints are what a rerun resumes from.
    ///
    /// # Errors
    /// [`Error::Other`] when a checkpoint lies below what retention left (the records after it are gone);
    /// [`Error::LogChanged`] when a checkpoint was written on another topic id or cluster ([`identity`]);
    /// database and Kafka errors.
    pub fn open(
        core: Shared,
        brokers: &str,
        group: &str,
        ranges: Vec<Range>,
        notes: &mut Vec<String>,
        commit: bool,
    ) -> Result<Assign> {
        // The pipeline's consumer configuration (its `[kafka.properties]`: security, fetch sizes; the bounded
        // prefetch of `run`), under the backfill's own group.
        let pipeline = lock(&core).pipeline.clone();
        let consumer: BaseConsumer = consumer_config(&pipeline, brokers, &[])
            .set("group.id", group)
            .create()?;
        let ack = AssignAck {
            consumer,
            group: group.to_string(),
            commit,
        };
        let mut parts = Vec::with_capacity(ranges.len());
        let mut starts = Vec::with_capacity(ranges.len());
        {
            let mut core = lock(&core);
            let tps: Vec<Tp> = ranges.iter().map(|r| r.tp.clone()).collect();
            let acquired = core.take_over(&ack, group, &tps, false)?;
            let pipeline = core.pipeline.clone();
            // The log each checkpoint was written on, before its offset is used (cases C46, C47).
            let ids = identity::broker_ids(&ack.consumer, &acquired)?;
            for a in &acquired {
                identity::check(&pipeline, group, a, &ids)?;
            }
            let unrecorded: Vec<_> = acquired.iter().map(identity::recordable).collect();
            let rt = core.runtime();
            for (range, a) in ranges.into_iter().zip(acquired) {
                let resume = match a.next {
                    Some(n) => {
                        let at = resume_at(&ack.consumer, &range, n, notes)?;
                        if at > n {
                            // A later window start (`--from`) than this group's checkpoint: the checkpoint
                            // moves forward to where this session reads, so the first compare-and-set holds.
                            rt.block_on(takeover::skip_forward(
                                core.sink(),
                                &pipeline,
                                group,
                                &range.tp,
                                a.fence,
                                at,
                            ))?;
                        }
                        at
                    }
                    None => {
                        rt.block_on(takeover::write_start(
                            core.sink(),
                            &pipeline,
                            group,
                            &range.tp,
                            a.fence,
                            range.start,
                            false,
                        ))?;
                        range.start
                    }
                };
                core.parts.insert(
                    range.tp.clone(),
                    PartState::new(a.fence, resume, Some(resume)),
                );
                starts.push((range.tp.clone(), resume));
                parts.push(Part {
                    done: resume >= range.stop,
                    range,
                });
            }
            identity::record(&mut core, group, &unrecorded, &ids)?;
        }
        let mut tpl = TopicPartitionList::new();
        for p in parts.iter().filter(|p| !p.done) {
            let next = lock(&core).parts[&p.range.tp].start;
            tpl.add_partition_offset(&p.range.tp.0, p.range.tp.1, Offset::Offset(next))?;
        }
        ack.consumer.assign(&tpl)?;
        Ok(Assign {
            core,
            ack,
            parts,
            starts,
            all_done_at: None,
            rerun: RERUN_BACKFILL.to_string(),
        })
    }

    /// Sets what an interrupted session says (the command that resumes it), e.g. for `projection build`.
    #[must_use]
    pub fn rerun(mut self, message: String) -> Assign {
        self.rerun = message;
        self
    }

    /// Where each partition starts in this session: its range's start, or the checkpoint it resumes at.
    pub fn starts(&self) -> &[(Tp, i64)] {
        &self.starts
    }

    /// Idle: a partition whose position passed the stop (transaction markers) is done too.
    fn check_positions(&mut self) {
        let Ok(pos) = self.ack.consumer.position() else {
            return;
        };
        let core = lock(&self.core);
        for p in self.parts.iter_mut().filter(|p| !p.done) {
            let (t, n) = &p.range.tp;
            if let Some(Offset::Offset(o)) = pos.find_partition(t, *n).map(|e| e.offset()) {
                if o >= p.range.stop
                    && core
                        .parts
                        .get(&p.range.tp)
                        .is_none_or(|s| s.buffered() == 0)
                {
                    p.done = true;
                }
            }
        }
    }

    /// The error for a position out of range: records of the window deleted by retention during the run.
    fn lost_range(&self) -> Error {
        let mut lost = Vec::new();
        let mut core = lock(&self.core);
        // What is in flight lands (or fails) first: the checkpoints then say where the loss begins.
        if let Err(e) = core.settle(&self.ack, CommitMode::Async) {
            return e;
        }
        for p in self.parts.iter().filter(|p| !p.done) {
            let (t, n) = &p.range.tp;
            let next = core
                .parts
                .get(&p.range.tp)
                .and_then(|s| s.next)
                .unwrap_or(p.range.start);
            if let Ok((low, _)) = self
                .ack
                .consumer
                .fetch_watermarks(t, *n, Duration::from_secs(10))
            {
                if next < low {
                    lost.push(format!("{t}/{n} offsets [{next}, {low})"));
                }
            }
        }
        Error::Other(format!(
            "records of the window were deleted by retention during the backfill: {}; what was applied before stays \
             applied (checkpoints); nothing was skipped silently",
            if lost.is_empty() { "a partition's position is out of range".to_string() } else { lost.join(", ") }
        ))
    }
}

/// Where a partition with checkpoint `n` resumes.
fn resume_at(
    consumer: &BaseConsumer,
    range: &Range,
    n: i64,
    notes: &mut Vec<String>,
) -> Result<i64> {
    let (topic, partition) = (&range.tp.0, range.tp.1);
    let (low, _) =
        crate::source::kafka::watermarks(consumer, topic, partition, Duration::from_secs(30))?;
    if n < low && n < range.stop {
        return Err(Error::Other(format!(
            "{topic}/{partition}: this backfill stopped at offset {n}, but offsets [{n}, {low}) were deleted by \
             retention since; the records before {n} stay applied. Nothing was skipped: decide explicitly (a new \
             --group-id starts the window again from what is left)"
        )));
    }
    if n > range.start && n < range.stop {
        notes.push(format!(
            "{topic}/{partition}: resumed at offset {n} (this backfill group's checkpoint); offsets [{}, {n}) were \
             applied by an earlier session and are not in this report's counts",
            range.start
        ));
    }
    Ok(n.max(range.start))
}

impl Source for Assign {
    fn poll(&mut self, timeout: Duration) -> Polled {
        match self.ack.consumer.poll(timeout) {
            Some(Ok(msg)) => {
                let Some(part) = self
                    .parts
                    .iter_mut()
                    .find(|p| p.range.tp.0 == msg.topic() && p.range.tp.1 == msg.partition())
                else {
                    return Polled::Busy;
                };
                if part.done || msg.offset() >= part.range.stop {
                    part.done = true;
                    pause(&self.ack.consumer, &part.range.tp);
                    return Polled::Busy;
                }
                if msg.offset() + 1 >= part.range.stop {
                    part.done = true;
                    pause(&self.ack.consumer, &part.range.tp);
                }
                Polled::Record(record(&msg))
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange)))
            | Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                Polled::Failed(self.lost_range())
            }
            Some(Err(e)) => {
                tracing::warn!("kafka: {e}");
                Polled::Busy
            }
            None => {
                self.check_positions();
                Polled::Idle
            }
        }
    }

    fn ack(&self) -> &dyn Ack {
        &self.ack
    }

    /// Every partition done and its checkpoint at its stop — a range ending in control records (COMMIT/ABORT
    /// markers, records of an aborted transaction) is stepped over by the engine once idle ([`Source::positions`]),
    /// waited for at most [`STEP_OVER_WAIT`].
    fn finished(&mut self, _idle_turns: u32) -> bool {
        if !self.parts.iter().all(|p| p.done) {
            return false;
        }
        let since = *self.all_done_at.get_or_insert_with(std::time::Instant::now);
        let core = lock(&self.core);
        let at_stops = self.parts.iter().all(|p| {
            core.parts
                .get(&p.range.tp)
                .and_then(|s| s.next)
                .is_none_or(|n| n >= p.range.stop)
        });
        if !at_stops && since.elapsed() >= STEP_OVER_WAIT {
            tracing::warn!("checkpoints left below their stops (control records not stepped over); a rerun reads nothing");
            return true;
        }
        at_stops
    }

    /// The consumer's positions, capped at each range's stop: the checkpoint steps over control records up to the
    /// stop, never past it.
    fn positions(&self) -> Vec<(Tp, i64)> {
        let Ok(pos) = self.ack.consumer.position() else {
            return Vec::new();
        };
        self.parts
            .iter()
            .filter_map(|p| {
                let (t, n) = &p.range.tp;
                match pos.find_partition(t, *n)?.offset() {
                    Offset::Offset(o) => Some((p.range.tp.clone(), o.min(p.range.stop))),
                    _ => None,
                }
            })
            .collect()
    }

    fn interrupted(&self) -> Option<Error> {
        Some(Error::Other(self.rerun.clone()))
    }

    fn flush_on_error(&self) -> bool {
        // The error names the ranges lost after what was applied: nothing more is applied.
        false
    }
}
