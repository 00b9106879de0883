//! The group source (`run`, `demo`): a consumer-group subscription.
//!
//! - on assignment the checkpoint row is taken over (fence bumped) and the partition is positioned at the
//!   checkpoint; Kafka's committed offset is used only when no checkpoint exists, then `kafka.start`
//!   ([`crate::source::start`]); a start resolved that way is written to the checkpoint before anything is consumed;
//! - on revocation the flush in flight is settled and the buffered records of revoked partitions are applied,
//!   their offsets committed synchronously, and only then are they given up; on a lost assignment they are
//!   abandoned, never committed;
//! - a take-over that finds the checkpoint row locked past `postgres.lock-timeout-ms` (a frozen previous owner)
//!   does not wait in the callback: the partition is assigned paused and unpositioned, and the take-over is
//!   retried from the poll loop with backoff ([`crate::source::pending`]); revoked meanwhile, it is dropped;
//! - a fenced batch (another writer bumped the fence) pauses its partition; after [`fence_grace`] the group
//!   coordinator is asked whether this member still owns it (a synchronous offset commit carries the member id
//!   and generation). Confirmed, the partition is taken over again through the normal path (the other writer —
//!   a `load --take-over`, a manual fence bump — is fenced in turn); refused, this process is the zombie and the
//!   rebalance that follows gives the partition up (its pending entry is dropped at the revocation). Neither
//!   within `max.poll.interval.ms`: the run fails (exit 1) and leaves the group — it never idles holding it;
//! - a member that is not a steady member of its group (librdkafka's `cgrp` statistics) for longer than
//!   `max.poll.interval.ms + session.timeout.ms`, or whose group coordinator has answered none of its requests
//!   for as long — a group coordinator that never answers again — fails the run (exit 1) instead of idling
//!   without partitions ([`crate::source::membership`]);
//! - eager (`range`, `roundrobin`) and incremental (`cooperative-sticky`, `group.protocol = consumer`)
//!   rebalancing share these callbacks: an incremental revoke lists only the partitions that move, the kept
//!   ones stay held and positioned (nothing is taken over or sought again), and the assign that follows lists
//!   only the new ones (`incremental_assign` / `incremental_unassign`); a fatal `group.instance.id` fence is
//!   named with the id ([`instance_fenced`]);
//! - its positions ([`Source::positions`]) let the engine step an idle checkpoint over transaction markers; a
//!   thread keeps the `replaysafe_consumer_lag` gauge ([`crate::source::lag`]);
//! - with `until_caught_up` it is finished once every assigned partition's position is at its high watermark
//!   and nothing is buffered or in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::ClientContext;

use crate::config::Pipeline;
use crate::engine::takeover::{self, Acquired};
use crate::engine::{lock, Ack, CommitMode, Core, Offsets, PartState, Polled, Shared, Source, Tp};
use crate::error::{Error, Result};
use crate::sink::checkpoint;
use crate::source::kafka::{consumer_config, kafka_commit, partitions, watermarks, STATISTICS};
use crate::source::logwatch::{self, LogWatch};
use crate::source::membership::{Membership, STATS_INTERVAL_MS};
use crate::source::pending::Pending;
use crate::source::queues::Split;
use crate::source::start;

/// The group's consumer, as the engine's acknowledgement: commits offsets, pauses a fenced partition.
pub type GroupConsumer = BaseConsumer<Ctx>;

/// The consumer context: rebalance callbacks reach the engine's state.
pub struct Ctx {
    core: Shared,
    pipeline: Arc<Pipeline>,
    /// A group-less client for watermark queries: on the consumer's own connection they would queue behind
    /// long-polling fetches (`fetch.wait.max.ms`) and take up to half a second each.
    side: Arc<BaseConsumer>,
    /// The consumer's configuration (reading back an old generation's last record).
    config: ClientConfig,
    assigned_once: AtomicBool,
    /// Partitions were revoked and the assignment that follows (possibly empty) has not arrived yet: between
    /// the two a member holds nothing, and "every held partition is at its end" says nothing about the group —
    /// `--until-caught-up` must not end there (found by scripts/bench-scale: 4 workers joining one group
    /// exited 0 with 37,134 records unconsumed).
    awaiting_assign: AtomicBool,
    /// A rebalance was served: librdkafka deactivated the partition queues, [`Group::poll`] splits them again.
    reassigned: AtomicBool,
    /// Assigned partitions whose take-over waits for a locked checkpoint row (paused, unpositioned) or for the
    /// coordinator to confirm a fenced partition is still ours; lock it after the engine's state.
    pending: Mutex<Pending>,
    /// How long a fenced partition waits before its ownership is checked ([`fence_grace`]).
    fence_grace: Duration,
    /// How long a fenced partition may stay neither confirmed nor revoked before the run fails
    /// (`max.poll.interval.ms`).
    fence_limit: Duration,
    /// The member is finishing (`--until-caught-up` caught up) or [`Source::close`] has begun: offset commits are
    /// sent without waiting for their reply. A synchronous commit waits for the group coordinator without a bound
    /// in librdkafka (`rd_kafka_commit` waits with `RD_POLL_INFINITE`), so after a broker restart a closing member
    /// could wait past `--shutdown-timeout` (confluentinc/librdkafka#3740); librdkafka still waits for the replies
    /// before the member leaves the group, within [`CLOSE_TIMEOUT`].
    closing: AtomicBool,
    /// The engine's shutdown flag (SIGINT/SIGTERM): the drain's commits do not wait for replies either.
    shutdown: Arc<AtomicBool>,
    /// The bounded wait for a steady group membership, fed by librdkafka's statistics ([`Membership`]).
    membership: Membership,
    /// Kafka's committed offsets may be behind the checkpoints: an offset commit failed (a coordinator loading
    /// after a broker restart answers `COORDINATOR_LOAD_IN_PROGRESS`, nothing retries it) or partitions were
    /// just assigned (their committed offsets may predate the checkpoint). The engine then commits every held
    /// checkpoint again when idle ([`Ack::recommit_due`]), at most once per [`RECOMMIT_EVERY`].
    recommit: Recommit,
    /// librdkafka's own announcements of a topic's new id: a topic re-created under this member while it keeps
    /// its partitions stops the run before any record of the new log is handed over
    /// ([`crate::source::logwatch`]).
    watch: LogWatch,
}

/// The shortest time between two commits of every held checkpoint after a failed offset commit.
pub const RECOMMIT_EVERY: Duration = Duration::from_secs(1);

/// Whether the held checkpoints are to be committed to Kafka again, and when that was last done.
#[derive(Default)]
struct Recommit {
    due: AtomicBool,
    last: Mutex<Option<Instant>>,
}

impl Recommit {
    /// Asks for a commit of every held checkpoint.
    fn ask(&self) {
        self.due.store(true, Ordering::Relaxed);
    }

    /// Whether one is due now (and then it counts as done): asked for, and none in the last [`RECOMMIT_EVERY`].
    fn take(&self) -> bool {
        if !self.due.load(Ordering::Relaxed) {
            return false;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < RECOMMIT_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        self.due.store(false, Ordering::Relaxed);
        true
    }
}

/// A librdkafka duration property of `config` in ms, or `default_ms`.
fn config_ms(config: &ClientConfig, key: &str, default_ms: u64) -> Duration {
    Duration::from_millis(
        config
            .get(key)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default_ms),
    )
}

/// The wait after a fenced batch before asking the coordinator: two heartbeats (`heartbeat.interval.ms`,
/// librdkafka default 3 s), at least 2 s — a member the group has expelled (a zombie woken after
/// `session.timeout.ms`) learns it from its next heartbeat and gives its partitions up instead.
pub fn fence_grace(config: &ClientConfig) -> Duration {
    (config_ms(config, "heartbeat.interval.ms", 3_000) * 2).max(Duration::from_secs(2))
}

impl ClientContext for Ctx {
    fn stats_raw(&self, statistics: &[u8]) {
        self.membership.observe(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // A refused credential (a rotated SASL password) is bounded like a member stuck outside its group, and
        // named by /readyz and the exit message ([`Membership::refused`]).
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication) {
            self.membership.refused(reason);
        }
        tracing::error!("librdkafka: {error}: {reason}");
    }
}

impl ConsumerContext for Ctx {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        // An asynchronous offset commit failed (librdkafka logs COMMITFAIL) — e.g. REBALANCE_IN_PROGRESS or
        // ILLEGAL_GENERATION during a rebalance (case C48): never fatal, never retried at once (a commit loop
        // would keep the group rebalancing); the checkpoints still held are committed again at most once per
        // RECOMMIT_EVERY, and the next batch's commit supersedes it anyway.
        if let Err(e) = result {
            tracing::info!(
                partitions = offsets.count(),
                "kafka offset commit rejected, superseded by a later one (the PostgreSQL checkpoint is \
                 authoritative): {e}"
            );
            self.recommit.ask();
        }
    }

    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        tracing::info!(
            protocol = if cooperative { "incremental" } else { "eager" },
            partitions = tpl.count(),
            "rebalance: {}",
            match err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => "assign",
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => "revoke",
                _ => "error",
            }
        );
        let mut core = lock(&self.core);
        self.reassigned.store(true, Ordering::Relaxed);
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assigned_once.store(true, Ordering::Relaxed);
                self.awaiting_assign.store(false, Ordering::Relaxed);
                let blocked = match self.on_assign(&mut core, consumer, tpl) {
                    Ok(blocked) => blocked,
                    Err(e) => {
                        tracing::error!("cannot take over partitions: {e}");
                        core.fatal.get_or_insert(e);
                        // Assign nothing we could not position (an incremental assignment: the partitions held
                        // before are kept, the run stops with the error).
                        if !cooperative {
                            let _ = consumer.unassign();
                        }
                        return;
                    }
                };
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                // A partition paused by a fenced batch stays paused in librdkafka across a rebalance: the
                // partitions taken over are resumed explicitly (found by the chaos harness: a zombie given its
                // fenced partitions back never read them again). Those whose take-over waits stay paused:
                // nothing is fetched from them.
                let taken = taken_over(tpl, &blocked);
                if let Err(e) = r
                    .and_then(|()| consumer.resume(&taken))
                    .and_then(|()| consumer.pause(&blocked))
                {
                    core.fatal.get_or_insert(Error::Kafka(e));
                }
                // The time spent in this callback (take-overs, positions) is ours, not the group's.
                self.membership.settled();
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.awaiting_assign.store(true, Ordering::Relaxed);
                let revoked: Vec<Tp> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                let lost = consumer.assignment_lost();
                {
                    // A pending take-over of a revoked partition is just dropped (nothing was consumed).
                    let mut pending = lock_pending(self);
                    for tp in &revoked {
                        pending.remove(tp);
                    }
                }
                if let Err(e) = on_revoke(&mut core, consumer, &revoked, lost) {
                    tracing::error!("revoking partitions: {e}");
                    core.fatal.get_or_insert(e);
                }
                {
                    // A batch fenced while settling above left its partition pending: it is given up now.
                    let mut pending = lock_pending(self);
                    for tp in &revoked {
                        pending.remove(tp);
                    }
                }
                let r = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = r {
                    tracing::warn!("unassign: {e}");
                }
                self.membership.settled();
            }
            other => {
                tracing::error!("rebalance error: {other:?}");
                *lock_pending(self) = Pending::default();
                // Under the cooperative protocols (cooperative-sticky, KIP-848) librdkafka refuses `unassign`
                // ("Changes to the current assignment must be made using incremental_assign() or
                // incremental_unassign()"): the whole assignment is given up incrementally instead.
                let r = match cooperative {
                    true => consumer
                        .assignment()
                        .and_then(|all| consumer.incremental_unassign(&all)),
                    false => consumer.unassign(),
                };
                if let Err(e) = r {
                    tracing::warn!("unassign after a rebalance error: {e}");
                }
            }
        }
    }
}

impl Ack for GroupConsumer {
    fn acknowledges(&self) -> bool {
        true
    }

    fn commit(&self, offsets: &Offsets, mode: CommitMode) {
        let ctx = self.context();
        let mode = match ctx.closing.load(Ordering::Relaxed) || ctx.shutdown.load(Ordering::Relaxed)
        {
            true => CommitMode::Async,
            false => mode,
        };
        if !kafka_commit(self, offsets, mode) {
            ctx.recommit.ask();
        }
    }

    fn recommit_due(&self) -> bool {
        self.context().recommit.take()
    }

    fn rewind(&self, tp: &Tp, offset: i64) -> Option<Error> {
        // Bounded: librdkafka's seek waits for the fetcher at most this long.
        match self.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10)) {
            Ok(()) => None,
            Err(e) => Some(Error::Other(format!(
                "{}/{}: the checkpoint moved back to offset {offset} under this process and seeking there failed \
                 ({e}); rerun to resume from the checkpoint",
                tp.0, tp.1
            ))),
        }
    }

    fn fenced(&self, tp: &Tp) -> Option<Error> {
        // Not held any more (only when revoked meanwhile): stop reading it until the next assignment.
        pause_one(self, tp);
        None
    }

    fn fenced_at(&self, tp: &Tp, at: i64) -> Option<Error> {
        pause_one(self, tp);
        let ctx = self.context();
        tracing::warn!(
            topic = %tp.0,
            partition = tp.1,
            checkpoint = at,
            grace_ms = crate::units::ms(ctx.fence_grace),
            "partition paused after a fenced batch: once the group coordinator confirms this member still owns it, \
             it is taken over again from its checkpoint (the other writer is fenced then); otherwise the \
             rebalance gives it up"
        );
        lock_pending(ctx).fenced(tp, at, ctx.fence_grace);
        None
    }
}

/// The acknowledgement of a closed group source: nothing is held any more.
struct Closed;

impl Ack for Closed {
    fn acknowledges(&self) -> bool {
        false
    }

    fn commit(&self, _: &Offsets, _: CommitMode) {}

    fn fenced(&self, _: &Tp) -> Option<Error> {
        None
    }
}

/// Pauses `tp` (nothing is fetched from it); a failure is only logged.
fn pause_one(consumer: &GroupConsumer, tp: &Tp) {
    let mut paused = TopicPartitionList::new();
    paused.add_partition(&tp.0, tp.1);
    if let Err(e) = consumer.pause(&paused) {
        tracing::warn!(topic = %tp.0, partition = tp.1, "pausing a fenced partition: {e}");
    }
}

/// Gives the group client's log lines back to its main queue ([`LogWatch::detach`]), before it closes.
fn detach_watch(consumer: &GroupConsumer) {
    let ctx = consumer.context();
    ctx.watch.detach(consumer.client(), &|level, fac, line| {
        ClientContext::log(&**ctx, level, fac, line)
    });
}

impl Ctx {
    /// Reads the log lines librdkafka queued ([`LogWatch::drain`]) and stops the run when it now reads a held
    /// partition's topic under another topic id than its checkpoint's: the topic was re-created under this member.
    /// Only partitions the engine holds count (a partition taken over later is compared at its take-over).
    fn log_changed(&self, core: &Shared) -> Option<Error> {
        let changed = self
            .watch
            .drain(&|level, fac, line| ClientContext::log(self, level, fac, line));
        self.stop_on(core, changed)
    }

    /// The error naming the held partitions of `changed` ([`crate::source::identity::recreated_under_run`]), if
    /// any is held.
    fn stop_on(&self, core: &Shared, changed: Vec<logwatch::Changed>) -> Option<Error> {
        if changed.is_empty() {
            return None;
        }
        let core = lock(core);
        let held: Vec<_> = changed
            .into_iter()
            .filter(|c| core.parts.contains_key(&c.0))
            .collect();
        if held.is_empty() {
            return None;
        }
        let next = |tp: &Tp| core.parts.get(tp).and_then(|st| st.next);
        Some(crate::source::identity::recreated_under_run(
            &self.pipeline,
            &self.pipeline.kafka.group_id,
            &held,
            &next,
        ))
    }

    /// A position out of range: asks the broker for the held topics' ids ([`crate::source::kafka::log_ids`],
    /// bounded by its timeout) and names a re-created topic whose new log ends below the checkpoint. `None` when
    /// every held topic is on its checkpoint's log (or the broker does not say).
    fn live_ids_differ(&self, core: &Shared, side: &BaseConsumer) -> Option<Error> {
        if let Some(e) = self.log_changed(core) {
            return Some(e);
        }
        let topics = self.watch.held_topics();
        if topics.is_empty() {
            return None;
        }
        match crate::source::kafka::log_ids(side, &topics) {
            Ok(ids) => self.stop_on(core, self.watch.differ(&ids)),
            Err(e) => {
                tracing::warn!(
                    "a position is out of range; asking the broker for the topic ids failed: {e}"
                );
                None
            }
        }
    }

    /// Takes ownership of newly assigned partitions and sets each one's starting offset in `tpl`. A partition
    /// whose checkpoint row stays locked past the lock timeout is left pending ([`Pending`]): set to the log's
    /// beginning in `tpl` only to be assigned, returned to be paused, taken over later from the poll loop.
    fn on_assign(
        &self,
        core: &mut Core,
        consumer: &GroupConsumer,
        tpl: &mut TopicPartitionList,
    ) -> Result<TopicPartitionList> {
        let elems: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        // The connections come back from the flush in flight (if any) first.
        let (acquired, blocked) = take_over_or_defer(core, consumer, &elems)?;
        let (starts, fenced) = self.position(core, consumer, acquired)?;
        if !starts.is_empty() {
            // Kafka's committed offsets of these partitions may be behind their checkpoints (commits that failed
            // before the previous owner lost them): committed again once the loop is idle.
            self.recommit.ask();
        }
        for (tp, start) in starts {
            tpl.set_partition_offset(&tp.0, tp.1, Offset::Offset(start))?;
        }
        let mut paused = TopicPartitionList::new();
        let mut pending = lock_pending(self);
        for (tp, at) in &fenced {
            paused.add_partition(&tp.0, tp.1);
            pending.fenced(tp, *at, self.fence_grace);
        }
        for b in &blocked {
            tpl.set_partition_offset(&b.tp.0, b.tp.1, Offset::Beginning)?;
            paused.add_partition(&b.tp.0, b.tp.1);
            pending.blocked(b);
        }
        Ok(paused)
    }

    /// Positions partitions just taken over: the checkpoint, else [`Ctx::unpositioned_start`] (written to the
    /// checkpoint before anything is consumed). Returns each one's start; they are held by the engine from now —
    /// except the partitions whose start could not be written because another writer bumped the fence meanwhile
    /// (a `load --take-over`), returned second with that start: not held, to be paused and taken over again
    /// like a fenced batch's partition once the group coordinator confirms the assignment.
    #[allow(clippy::type_complexity)]
    fn position(
        &self,
        core: &mut Core,
        consumer: &GroupConsumer,
        acquired: Vec<Acquired>,
    ) -> Result<(Vec<(Tp, i64)>, Vec<(Tp, i64)>)> {
        let p = self.pipeline.clone();
        let group = p.kafka.group_id.clone();
        let committed = committed_offsets(consumer, &acquired)?;
        // The log each checkpoint was written on, before its offset is used (cases C46, C47).
        let ids = crate::source::identity::broker_ids(&self.side, &acquired)?;
        for a in &acquired {
            crate::source::identity::check(&p, &group, a, &ids)?;
            // The log this partition's checkpoint is on, for the watch under the running member.
            self.watch.hold(
                &a.tp,
                a.stored_ids.0.as_deref().or(ids.topic(&a.tp.0)),
                a.stored_ids.1.as_deref().or(ids.cluster.as_deref()),
            );
        }
        let unrecorded: Vec<_> = acquired
            .iter()
            .map(crate::source::identity::recordable)
            .collect();
        let mut resolved: Vec<(Tp, i64, i64)> = Vec::new();
        let mut starts = Vec::new();
        let mut fenced = Vec::new();
        for Acquired {
            tp, next, fence, ..
        } in acquired
        {
            let (topic, partition) = (&tp.0, tp.1);
            let (low, high) = watermarks(&self.side, topic, partition, Duration::from_secs(10))?;
            let (start, from) = match next {
                Some(n) => (n, "checkpoint".to_string()),
                None => {
                    let u = start::Unpositioned {
                        committed: committed.get(&tp).copied(),
                        topic: topic.clone(),
                        partition,
                        low,
                        high,
                        checkpoints: p.table(checkpoint::CHECKPOINTS).to_string(),
                        ids: (ids.topic(topic).map(str::to_string), ids.cluster.clone()),
                    };
                    let s = self.unpositioned_start(core, &u, &committed)?;
                    (s.offset, s.from)
                }
            };
            if start < low {
                return Err(Error::Other(format!(
                    "{topic}/{partition}: the {from} is offset {start} but the broker's log starts at {low}: records \
                     {start}..{low} were deleted (retention) before they were applied. Nothing was consumed; decide \
                     explicitly (e.g. reset the checkpoint) after checking what was lost"
                )));
            }
            let high = self.end_at_least(topic, partition, start, high)?;
            if start > high {
                return Err(Error::Other(format!(
                    "{topic}/{partition}: the {from} is offset {start} but the broker's partition ends at {high}: \
                     a position past the end (a `load` of another cluster's dump, a topic recreated under the same \
                     generation, records lost by the broker?) would skip the records that arrive at offsets \
                     {high}..{start}. Nothing was consumed; decide explicitly (e.g. reset the checkpoint) after \
                     checking where the data came from"
                )));
            }
            tracing::info!(%topic, partition, offset = start, from, fence, low, high, "partition assigned");
            starts.push((tp.clone(), start));
            if next.is_none() {
                resolved.push((tp.clone(), fence, start));
            }
            core.parts
                .insert(tp, PartState::new(fence, start, Some(start)));
        }
        // A start resolved from Kafka's committed offset or from `start` is written to the checkpoint before
        // anything is consumed, so a crash before the first batch cannot resolve `latest` again and skip what
        // arrived in between (case C17).
        let rt = core.runtime();
        fail::fail_point!("before-write-start");
        #[cfg(feature = "failpoints")]
        if let Some(Some(release)) = fail::eval("hold-before-write-start", |path| path) {
            crate::sink::fault::hold_until(std::path::Path::new(&release));
        }
        for (tp, fence, start) in &resolved {
            let n = rt.block_on(takeover::write_start(
                core.sink(),
                &p,
                &group,
                tp,
                *fence,
                *start,
                true,
            ))?;
            if n != 1 {
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    "another writer took the partition over while it was being assigned: paused; once the group \
                     coordinator confirms this member owns it, it is taken over again from its checkpoint"
                );
                core.parts.remove(tp);
                crate::health::fenced(tp);
                fenced.push((tp.clone(), *start));
            }
        }
        crate::source::identity::record(core, &group, &unrecorded, &ids)?;
        Ok((starts, fenced))
    }

    /// The partition's end (high watermark), asked again after 1 s when `start` is past `high` (a leader just
    /// elected may report a high watermark that has not caught up yet).
    ///
    /// # Errors
    /// As [`watermarks`].
    fn end_at_least(&self, topic: &str, partition: i32, start: i64, high: i64) -> Result<i64> {
        if start <= high {
            return Ok(high);
        }
        std::thread::sleep(Duration::from_secs(1));
        Ok(watermarks(&self.side, topic, partition, Duration::from_secs(10))?.1)
    }

    /// Where a partition without a checkpoint in this generation starts ([`start`] module docs): another
    /// generation's checkpoint, Kafka's committed offset, "added after the group began", or `start`.
    fn unpositioned_start(
        &self,
        core: &mut Core,
        u: &start::Unpositioned,
        committed: &HashMap<Tp, i64>,
    ) -> Result<start::Start> {
        let p = &self.pipeline;
        let group = p.kafka.group_id.clone();
        let generation = p.identity.generation.clone().unwrap_or_default();
        let rt = core.runtime();
        let client = core.sink().client();
        let old = rt.block_on(start::old_checkpoints(
            client,
            p,
            &group,
            &generation,
            &u.topic,
        ))?;
        if !old.is_empty() {
            return start::after_generation_change(
                u,
                &group,
                &generation,
                old.get(&u.partition),
                |o, ts, sha| start::read_back(&self.config, &u.topic, u.partition, o, (ts, sha)),
            );
        }
        let now = partitions(&self.side, std::slice::from_ref(&u.topic))?.len();
        let positioned: Vec<i32> = committed
            .keys()
            .filter(|(t, _)| *t == u.topic)
            .map(|(_, part)| *part)
            .collect();
        let client = core.sink().client();
        let began = rt.block_on(start::group_began_with(
            client,
            p,
            &group,
            &generation,
            &u.topic,
            i32::try_from(now).unwrap_or(i32::MAX),
            &positioned,
        ))?;
        start::without_generation_change(u, &group, began, p.kafka.start)
    }
}

/// The partitions of `tpl` not in `blocked`: those taken over in this assignment.
fn taken_over(tpl: &TopicPartitionList, blocked: &TopicPartitionList) -> TopicPartitionList {
    let mut taken = TopicPartitionList::new();
    for e in tpl.elements() {
        if blocked.find_partition(e.topic(), e.partition()).is_none() {
            taken.add_partition(e.topic(), e.partition());
        }
    }
    taken
}

/// Kafka's committed offsets of the partitions without a checkpoint (used only for those).
fn committed_offsets(consumer: &GroupConsumer, acquired: &[Acquired]) -> Result<HashMap<Tp, i64>> {
    let mut committed = HashMap::new();
    let mut q = TopicPartitionList::new();
    for a in acquired.iter().filter(|a| a.next.is_none()) {
        q.add_partition(&a.tp.0, a.tp.1);
    }
    if q.count() == 0 {
        return Ok(committed);
    }
    let c = consumer.committed_offsets(q, Duration::from_secs(30))?;
    for e in c.elements() {
        if let Offset::Offset(o) = e.offset() {
            committed.insert((e.topic().to_string(), e.partition()), o);
        }
    }
    Ok(committed)
}

/// Settles the flush in flight, then takes `tps` over ([`takeover::acquire_or_defer`]): a partition whose
/// checkpoint row stays locked past the lock timeout comes back blocked instead of being waited for.
fn take_over_or_defer(
    core: &mut Core,
    ack: &dyn Ack,
    tps: &[Tp],
) -> Result<(Vec<Acquired>, Vec<takeover::Blocked>)> {
    core.settle(ack, CommitMode::Async)?;
    let stop = core.give_up_flag();
    let give_up = move || stop.load(Ordering::Relaxed);
    let p = core.pipeline.clone();
    let group = p.kafka.group_id.clone();
    let rt = core.runtime();
    rt.block_on(takeover::acquire_or_defer(
        core.sink(),
        &p,
        &group,
        tps,
        true,
        &give_up,
    ))
}

fn lock_pending(ctx: &Ctx) -> MutexGuard<'_, Pending> {
    ctx.pending
        .lock()
        .expect("pending take-overs: a thread panicked holding this lock")
}

fn on_revoke(core: &mut Core, consumer: &GroupConsumer, revoked: &[Tp], lost: bool) -> Result<()> {
    // What is in flight commits or is fenced as a whole; its outcomes are recorded before anything is given up.
    let settled = core.settle(consumer, CommitMode::Sync);
    crate::health::unfenced(revoked);
    if lost || core.crashed {
        // Another member may already own these: our buffered records are abandoned, never committed.
        for tp in revoked {
            if let Some(st) = core.parts.remove(tp) {
                tracing::warn!(topic = %tp.0, partition = tp.1, abandoned = st.buffered(), "assignment lost");
            }
        }
        return settled;
    }
    let result =
        settled.and_then(|()| core.flush(consumer, |tp, _| revoked.contains(tp), CommitMode::Sync));
    for tp in revoked {
        core.parts.remove(tp);
    }
    result
}

/// How long [`Source::close`] waits for the member to leave the group (the revocation applied, the last offsets
/// committed, LeaveGroup sent) before abandoning the client: a third of `run`'s default `--shutdown-timeout`.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The group source.
pub struct Group {
    /// The group's client; `None` once [`Source::close`] has handed it to the closing thread.
    consumer: Option<Arc<GroupConsumer>>,
    /// The partitions' own queues, polled round-robin ([`crate::source::queues`]).
    split: Split<Ctx>,
    core: Shared,
    side: Arc<BaseConsumer>,
    until_caught_up: bool,
    /// The `replaysafe_consumer_lag` updater ([`crate::source::lag`]).
    _lag: crate::source::lag::Lag,
    /// `--until-caught-up`: the wait for the partitions other members hold ([`crate::source::others`]).
    others: crate::source::others::Others,
    /// `session.timeout.ms` (librdkafka default 45 s): bounds that wait (twice this).
    session: Duration,
}

impl Drop for Group {
    fn drop(&mut self) {
        // Not closed (a simulated crash): the client's log lines go back to its main queue before it is destroyed.
        if let Some(c) = &self.consumer {
            detach_watch(c);
        }
    }
}

impl Group {
    /// The group's client.
    ///
    /// # Panics
    /// After [`Source::close`] (the engine asks nothing of a closed source but its [`Source::ack`]).
    fn c(&self) -> &Arc<GroupConsumer> {
        self.consumer
            .as_ref()
            .expect("the consumer is not closed yet")
    }

    /// Subscribes to the pipeline's topics under its group.
    ///
    /// # Errors
    /// [`Error::Usage`] when a topic does not exist (the group would wait forever without a word); Kafka
    /// client errors.
    pub fn subscribe(core: Shared, config: ClientConfig, until_caught_up: bool) -> Result<Group> {
        let pipeline = lock(&core).pipeline.clone();
        // The helper clients (watermarks, reading back a record) emit no statistics: only the group's are read.
        let mut plain = config.clone();
        plain.remove(STATISTICS);
        let side: BaseConsumer = {
            let mut c = plain.clone();
            c.remove("group.id");
            c.create()?
        };
        partitions(&side, &pipeline.kafka.topics).map_err(|e| match e {
            Error::Other(m) => Error::Usage(m),
            other => other,
        })?;
        let side = Arc::new(side);
        // The group's own client reports topic id changes ([`crate::source::logwatch`]).
        let mut own = config.clone();
        let pass_debug = logwatch::configure(&mut own);
        let consumer: Arc<GroupConsumer> = Arc::new(own.create_with_context(Ctx {
            core: core.clone(),
            pipeline: pipeline.clone(),
            side: side.clone(),
            config: plain,
            assigned_once: AtomicBool::new(false),
            awaiting_assign: AtomicBool::new(false),
            reassigned: AtomicBool::new(false),
            pending: Mutex::new(Pending::default()),
            fence_grace: fence_grace(&config),
            fence_limit: config_ms(&config, "max.poll.interval.ms", 300_000),
            closing: AtomicBool::new(false),
            shutdown: lock(&core).shutdown.clone(),
            membership: Membership::new(&config),
            recommit: Recommit::default(),
            watch: LogWatch::new(pass_debug),
        })?);
        consumer.context().watch.attach(consumer.client())?;
        let topics: Vec<&str> = pipeline.kafka.topics.iter().map(String::as_str).collect();
        Consumer::subscribe(&*consumer, &topics)?;
        tracing::info!(group = %pipeline.kafka.group_id, ?topics, "consuming");
        let lag = crate::source::lag::spawn(Arc::downgrade(&core), side.clone());
        Ok(Group {
            consumer: Some(consumer),
            split: Split::default(),
            core,
            side,
            until_caught_up,
            _lag: lag,
            others: Default::default(),
            session: config_ms(&config, "session.timeout.ms", 45_000),
        })
    }

    /// Retries the take-overs that are due ([`Pending`]), outside the rebalance callback: a fenced partition
    /// first has its ownership confirmed ([`Group::confirmed`]); a partition taken over now is positioned, sought
    /// to its start and resumed; one still blocked waits for its next attempt.
    ///
    /// # Errors
    /// As the take-over; a fenced partition neither confirmed nor revoked within `max.poll.interval.ms`.
    fn retry_pending(&mut self) -> Result<()> {
        let ctx = self.c().context();
        let due = lock_pending(ctx).due(Instant::now());
        let mut tps = Vec::new();
        for (tp, fenced) in due {
            match fenced {
                Some(at) => {
                    if self.confirmed(&tp, at)? {
                        tps.push(tp);
                    }
                }
                None => tps.push(tp),
            }
        }
        if tps.is_empty() {
            return Ok(());
        }
        let mut core = lock(&self.core);
        let (acquired, blocked) = take_over_or_defer(&mut core, &**self.c(), &tps)?;
        for b in &blocked {
            lock_pending(ctx).blocked(b);
        }
        let (starts, fenced) = ctx.position(&mut core, self.c(), acquired)?;
        for (tp, at) in &fenced {
            lock_pending(ctx).fenced(tp, *at, ctx.fence_grace);
        }
        for (tp, start) in starts {
            if fenced.iter().any(|(f, _)| *f == tp) {
                continue;
            }
            lock_pending(ctx).remove(&tp);
            crate::health::unfenced(std::slice::from_ref(&tp));
            // Bounded: librdkafka's seek waits for the fetcher at most this long.
            self.c()
                .seek(&tp.0, tp.1, Offset::Offset(start), Duration::from_secs(10))?;
            let mut one = TopicPartitionList::new();
            one.add_partition(&tp.0, tp.1);
            self.c().resume(&one)?;
        }
        Ok(())
    }

    /// Whether the group coordinator confirms this member still owns the fenced partition `tp`: it is still in
    /// the assignment, and a synchronous commit of `at` (its checkpoint as this process last committed it;
    /// PostgreSQL's checkpoint stays the truth) succeeds — the commit carries the member id and generation, and
    /// the coordinator refuses it (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS) unless the
    /// generation whose assignment gave us `tp` is still current, so nobody else can own it in Kafka's eyes.
    ///
    /// # Errors
    /// Not confirmed for longer than `max.poll.interval.ms` since the fence.
    fn confirmed(&self, tp: &Tp, at: i64) -> Result<bool> {
        let ctx = self.c().context();
        let assigned = self.c().assignment()?;
        if assigned.find_partition(&tp.0, tp.1).is_none() {
            // Given up already (revoked): nothing is held.
            lock_pending(ctx).remove(tp);
            crate::health::unfenced(std::slice::from_ref(tp));
            return Ok(false);
        }
        let check = || -> std::result::Result<(), String> {
            if self.c().assignment_lost() {
                return Err("the assignment is lost".into());
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(at))
                .map_err(|e| e.to_string())?;
            Consumer::commit(&**self.c(), &tpl, rdkafka::consumer::CommitMode::Sync)
                .map_err(|e| e.to_string())
        };
        let detail = match check() {
            Ok(()) => {
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    "the group coordinator confirms this member still owns the fenced partition: taking it over \
                     again (another writer bumped its fence: a `load --take-over`, a manual change?)"
                );
                return Ok(true);
            }
            Err(detail) => detail,
        };
        let waited = lock_pending(ctx).unconfirmed(tp, &detail);
        if waited > ctx.fence_limit {
            return Err(Error::Other(format!(
                "{}/{}: a batch was fenced by another writer {} s ago and the group has neither revoked the \
                 partition nor confirmed this member owns it ({detail}); exiting so that the group reassigns it",
                tp.0,
                tp.1,
                waited.as_secs()
            )));
        }
        Ok(false)
    }

    /// Every assigned partition's position is at its high watermark and nothing is buffered or in flight; never
    /// between a revocation and the assignment that follows it.
    fn caught_up(&self) -> bool {
        let parts: Vec<(Tp, i64)> = {
            let core = lock(&self.core);
            let ctx = self.c().context();
            if !ctx.assigned_once.load(Ordering::Relaxed)
                || ctx.awaiting_assign.load(Ordering::Relaxed)
                || core.buffered_free() > 0
                || core.in_flight()
                || !lock_pending(self.c().context()).is_empty()
            {
                return false;
            }
            core.parts
                .iter()
                .map(|(tp, st)| (tp.clone(), st.next.unwrap_or(st.start)))
                .collect()
        };
        let Ok(positions) = self.c().position() else {
            return false;
        };
        for ((topic, partition), applied) in parts {
            let Ok((_, high)) =
                self.side
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
            else {
                return false;
            };
            let pos = positions
                .find_partition(&topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            // The fetch position passes transaction markers the application never sees; before the first fetch
            // it is unknown, and what was applied (or the assigned start) tells.
            if pos.unwrap_or(applied).max(applied) < high {
                return false;
            }
        }
        true
    }
}

impl Source for Group {
    fn poll(&mut self, timeout: Duration) -> Polled {
        if let Err(e) = self.retry_pending() {
            return Polled::Failed(e);
        }
        let Group {
            consumer,
            split,
            core,
            side,
            ..
        } = self;
        let consumer = consumer.as_ref().expect("polled after close");
        let ctx = consumer.context();
        let group = &ctx.pipeline.kafka.group_id;
        if let Some(e) = ctx.membership.overdue(group) {
            return Polled::Failed(e);
        }
        if ctx.reassigned.swap(false, Ordering::Relaxed) {
            if let Err(e) = split.resplit(consumer) {
                return Polled::Failed(e);
            }
        }
        let stale = || ctx.reassigned.load(Ordering::Relaxed);
        let polled = split.poll(consumer, timeout, &stale);
        // After taking a record from librdkafka, before handing it over: a topic id librdkafka announced
        // meanwhile (any record of a re-created topic's new log was fetched after its announcement arrived).
        if ctx.watch.arrived() {
            if let Some(e) = ctx.log_changed(core) {
                return Polled::Failed(e);
            }
        }
        match polled {
            None => Polled::Idle,
            Some(Ok(r)) => Polled::Record(r),
            Some(Err(KafkaError::PartitionEOF(_))) => Polled::Idle,
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)))
            | Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                // A re-created topic whose new log ends below the checkpoint: named as such (exit 7).
                if let Some(e) = ctx.live_ids_differ(core, side) {
                    return Polled::Failed(e);
                }
                Polled::Failed(Error::Other(
                    "a partition's position is out of range on the broker (records deleted by retention while \
                     consuming?); stopping instead of skipping them"
                        .into(),
                ))
            }
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                Polled::Failed(fatal(consumer, &ctx.pipeline, code))
            }
            Some(Err(e)) => {
                tracing::warn!("kafka: {e}");
                Polled::Busy
            }
        }
    }

    fn ack(&self) -> &dyn Ack {
        match &self.consumer {
            Some(c) => &**c,
            // Closed: what its revoke callback committed is acknowledged; nothing is left to acknowledge.
            None => &Closed,
        }
    }

    fn finished(&mut self, idle_turns: u32) -> bool {
        if !(self.until_caught_up && idle_turns >= 3 && self.caught_up()) {
            self.others.reset();
            return false;
        }
        let done = self.others.caught_up(&self.core, &self.side, self.session);
        if done {
            // The engine's finish and the close that follow commit without waiting for replies.
            self.c().context().closing.store(true, Ordering::Relaxed);
        }
        done
    }

    fn interrupted(&self) -> Option<Error> {
        None
    }

    fn flush_on_error(&self) -> bool {
        // Leaving the group (close) hands the buffered records of revoked partitions back and applies them.
        false
    }

    fn positions(&self) -> Vec<(Tp, i64)> {
        let Some(Ok(tpl)) = self.consumer.as_ref().map(|c| c.position()) else {
            return Vec::new();
        };
        tpl.elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect()
    }

    fn close(&mut self) {
        if lock(&self.core).crashed {
            return;
        }
        self.split.clear();
        self.c().context().closing.store(true, Ordering::Relaxed);
        detach_watch(self.c());
        // Leaving the group — the revoke callback applies what is buffered and commits it, then LeaveGroup and
        // the client's drop (`rd_kafka_consumer_close`: it waits for the group coordinator without a bound,
        // confluentinc/librdkafka#3740) — runs on its own thread, waited for at most CLOSE_TIMEOUT.
        let Some(consumer) = self.consumer.take() else {
            return;
        };
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("consumer-close".into())
            .spawn(move || {
                consumer.unsubscribe();
                let _ = consumer.poll(Duration::from_millis(100));
                drop(consumer);
                let _ = done.send(());
            });
        if let Err(e) = spawned {
            tracing::warn!("leaving the consumer group: no thread to close the client on: {e}");
            return;
        }
        if finished.recv_timeout(CLOSE_TIMEOUT).is_err() {
            tracing::warn!(
                timeout_ms = crate::units::ms(CLOSE_TIMEOUT),
                "leaving the consumer group did not finish in time (group coordinator unreachable?): not waited \
                 for further — the coordinator expires this member after session.timeout.ms; what was applied \
                 is in the PostgreSQL checkpoints"
            );
        }
    }
}

/// The error of a fatal consumer error (`code`, usually librdkafka's `_FATAL`; the underlying one is asked of the
/// client). A static member fenced for its `group.instance.id` — `FENCED_INSTANCE_ID` (classic protocol: the
/// member already in the group is fenced when another process joins with the same id) or
/// `UNRELEASED_INSTANCE_ID` (KIP-848: the joining one) — is named with the id's value and what to change.
fn fatal(consumer: &GroupConsumer, pipeline: &Pipeline, code: RDKafkaErrorCode) -> Error {
    let (code, reason) = consumer
        .client()
        .fatal_error()
        .unwrap_or((code, code.to_string()));
    let instance = pipeline
        .kafka
        .properties
        .iter()
        .rev()
        .find(|(k, _)| k == "group.instance.id")
        .map(|(_, v)| v.as_str());
    match (code, instance) {
        (RDKafkaErrorCode::FencedInstanceId | RDKafkaErrorCode::UnreleasedInstanceId, Some(id)) => {
            Error::Other(instance_fenced(&pipeline.kafka.group_id, id, &reason))
        }
        _ => Error::Other(format!("fatal Kafka consumer error: {code}: {reason}")),
    }
}

/// The message of a static member fenced because another process uses its `group.instance.id` (`id`).
pub fn instance_fenced(group: &str, id: &str, reason: &str) -> String {
    format!(
        "consumer group {group}: Kafka fenced this member because another process uses the same \
         `group.instance.id` = `{id}` ({reason}); every worker of a group needs its own value: set \
         \"group.instance.id\" in [kafka.properties] to a value unique to this worker (e.g. \"${{HOSTNAME}}\"), or \
         stop the other process using `{id}`; exiting — what was applied is in the PostgreSQL checkpoints"
    )
}

/// The consumer configuration of `run` ([`consumer_config`]), with the prefetch bound per partition: `run` polls
/// one queue per partition ([`crate::source::queues`]), and librdkafka applies `queued.max.messages.kbytes` to each
/// partition queue then instead of to the one consumer queue (librdkafka CONFIGURATION.md). 1 MiB per partition
/// (one fetch response, ~5,000 seed events) keeps the read-ahead of 8 partitions near the 4 MiB of one queue:
/// measured peak RSS of a 200,000-event first pass 150–160 MiB with 4 MiB per partition queue, 105 MiB before the
/// split. Also `statistics.interval.ms` = [`STATS_INTERVAL_MS`], which the group membership watchdog reads
/// ([`crate::source::membership`]). Set in `[kafka.properties]`, the pipeline's value stays.
pub fn config(p: &Pipeline, brokers: &str, extra: &[(String, String)]) -> ClientConfig {
    let mut c = consumer_config(p, brokers, extra);
    let set = |k: &str| p.kafka.properties.iter().chain(extra).any(|(e, _)| e == k);
    if !set("queued.max.messages.kbytes") {
        c.set("queued.max.messages.kbytes", "1024");
    }
    if !set("queued.min.messages") {
        c.set("queued.min.messages", "5000");
    }
    // The group membership watchdog reads librdkafka's statistics ([`crate::source::membership`]); the
    // pipeline's value is kept off every other client ([`consumer_config`]).
    let mut stats = p.kafka.properties.iter().chain(extra).rev();
    let stats = stats.find(|(k, _)| k == STATISTICS).map(|(_, v)| v.clone());
    c.set(
        STATISTICS,
        stats.unwrap_or_else(|| STATS_INTERVAL_MS.to_string()),
    );
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recommit_is_due_once_asked_and_at_most_once_a_second() {
        let r = Recommit::default();
        assert!(!r.take(), "never asked");
        r.ask();
        assert!(r.take());
        assert!(!r.take(), "done");
        r.ask();
        assert!(!r.take(), "asked again within RECOMMIT_EVERY");
        *r.last.lock().unwrap() = Some(Instant::now() - RECOMMIT_EVERY);
        assert!(r.take(), "asked, and the last one is RECOMMIT_EVERY ago");
    }

    /// Only `run`'s group consumer emits statistics (its membership bound reads them): the pipeline's value
    /// reaches it and no other client, and it has the default when the pipeline sets none.
    #[test]
    fn statistics_reach_the_group_consumer_only() {
        let reference = include_str!("../../reference.toml");
        let p = crate::config::parse("reference.toml", reference).unwrap();
        let group = config(&p, "127.0.0.1:9092", &[]);
        assert_eq!(group.get(STATISTICS), Some("5000"));
        let text = reference.replace(
            "\"fetch.max.bytes\" = 52428800",
            "\"fetch.max.bytes\" = 52428800\n\"statistics.interval.ms\" = 1000",
        );
        let p = crate::config::parse("p.toml", &text).unwrap();
        assert_eq!(
            crate::source::kafka::consumer_config(&p, "127.0.0.1:9092", &[]).get(STATISTICS),
            None
        );
        assert_eq!(
            crate::source::kafka::client_config(&p, "127.0.0.1:9092").get(STATISTICS),
            None
        );
        let group = config(&p, "127.0.0.1:9092", &[]);
        assert_eq!(group.get(STATISTICS), Some("1000"));
        let extra = [(STATISTICS.to_string(), "0".to_string())];
        let group = config(&p, "127.0.0.1:9092", &extra);
        assert_eq!(group.get(STATISTICS), Some("0"), "the last one named wins");
    }
}
