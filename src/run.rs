//! `replaysafe run`: the consumer loop.
//!
//! Shape (after rust-rdkafka's `at_least_once` example and Materialize's "resume from the destination"):
//! - one thread polls a `BaseConsumer`; records are decoded and filtered as they arrive and buffered per
//!   partition;
//! - a partition's buffer is flushed as one transaction when it holds `batch.max-records` or its oldest record
//!   has waited `batch.linger-ms`; partitions are flushed in parallel on `postgres.connections` connections;
//! - after the transaction commits, the Kafka offset (next offset to read) is committed asynchronously, for
//!   tooling and lag only;
//! - on assignment the checkpoint row is taken over (fence bumped) and the partition is positioned at the
//!   checkpoint; Kafka's committed offset is used only when no checkpoint exists, then `kafka.start`;
//! - on revocation the buffered records of revoked partitions are applied, their offsets committed
//!   synchronously, and only then are they given up.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::ClientContext;

use crate::apply::{apply_batch, backoff, is_transient, retry_db, Applied};
use crate::config::Pipeline;
use crate::decode;
use crate::error::{Error, Result};
use crate::filter;
use crate::sink::{checkpoint, ledger, schema, Batch, Item, Outcome, Pending, Sink, Tally};
use crate::start;

/// Options of one run.
#[derive(Clone)]
pub struct RunOptions {
    /// `bootstrap.servers`, resolved.
    pub brokers: String,
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// Exit once every assigned partition is caught up (position ≥ high watermark, all applied).
    pub until_caught_up: bool,
    /// Set to stop: buffered work is applied and committed, then `run` returns.
    pub shutdown: Arc<AtomicBool>,
    /// Interval of the summary log line.
    pub summary_interval: Duration,
    /// Demo only: after this many committed batches, return without committing Kafka offsets (what a crash
    /// between the database commit and the offset commit leaves behind).
    pub crash_after_batches: Option<u64>,
    /// Extra librdkafka properties applied last (tests, demo).
    pub extra_properties: Vec<(String, String)>,
    /// Interval of the ledger prune while running (it also runs on start); `run --prune-interval`, default an
    /// hour.
    pub prune_interval: Duration,
}

/// Longest a periodic prune may take (connecting, waiting for locks, dropping) before it is abandoned and
/// tried again at the next interval.
const PRUNE_TIMEOUT: Duration = Duration::from_secs(120);

/// The periodic ledger prune of a running `run`: every `prune_interval`, one prune in the background on its
/// own connection (never two at once), bounded by [`PRUNE_TIMEOUT`].
struct Pruner {
    last: Instant,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Pruner {
    fn tick(
        &mut self,
        rt: &tokio::runtime::Handle,
        p: &Arc<Pipeline>,
        opts: &RunOptions,
        now: Instant,
    ) {
        if p.ledger.horizon_days.is_none()
            || now.duration_since(self.last) < opts.prune_interval
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
        {
            return;
        }
        self.last = now;
        let (p, url) = (p.clone(), opts.database_url.clone());
        self.task = Some(rt.spawn(async move {
            let work = async {
                let mut client = crate::sink::connect(&url).await?;
                ledger::drop_expired_partitions(&mut client, &p).await
            };
            match tokio::time::timeout(PRUNE_TIMEOUT, work).await {
                Ok(Ok(dropped)) if !dropped.is_empty() => {
                    tracing::info!(?dropped, "dropped ledger partitions older than the horizon")
                }
                Ok(Ok(_)) => tracing::debug!("ledger prune: nothing to drop"),
                Ok(Err(e)) => {
                    tracing::warn!("ledger prune failed, retried at the next interval: {e}")
                }
                Err(_) => tracing::warn!(
                    "ledger prune did not finish in {PRUNE_TIMEOUT:?}; retried at the next interval"
                ),
            }
        }));
    }
}

/// A partition's state while assigned.
struct PartState {
    fence: i64,
    /// The offset the partition was positioned at on assignment.
    start: i64,
    /// Checkpoint in the database: next offset to read (`None`: nothing committed yet).
    next: Option<i64>,
    buffer: Vec<Item>,
    oldest: Option<Instant>,
}

type Tp = (String, i32);

struct Engine {
    pipeline: Arc<Pipeline>,
    /// A group-less client for watermark queries: on the consumer's own connection they would queue behind
    /// long-polling fetches (`fetch.wait.max.ms`) and take up to half a second each.
    side: BaseConsumer,
    rt: tokio::runtime::Handle,
    sinks: Vec<Sink>,
    parts: BTreeMap<Tp, PartState>,
    tally: Tally,
    batches: u64,
    assigned_once: bool,
    fatal: Option<Error>,
    opts: RunOptions,
    crashed: bool,
    /// The flush being applied in the background, holding the connections (`sinks` is empty meanwhile).
    inflight: Option<Inflight>,
    /// When the first record was buffered and when the last batch committed (throughput log line).
    first_record: Option<Instant>,
    last_commit: Option<Instant>,
}

type FlushResults = (Vec<Sink>, Vec<Vec<(Batch, Result<Applied>)>>);

/// A flush applied on a background thread; joined by [`Engine::settle`].
struct Inflight {
    handle: std::thread::JoinHandle<FlushResults>,
    started: Instant,
}

struct Ctx {
    engine: Arc<Mutex<Engine>>,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
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
        let mut engine = self.engine.lock().expect("engine lock");
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                engine.assigned_once = true;
                if let Err(e) = engine.on_assign(consumer, tpl) {
                    tracing::error!("cannot take over partitions: {e}");
                    engine.fatal.get_or_insert(e);
                    // Assign nothing we could not position.
                    let _ = consumer.unassign();
                    return;
                }
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = r {
                    engine.fatal.get_or_insert(Error::Kafka(e));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: Vec<Tp> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                let lost = consumer.assignment_lost();
                if let Err(e) = engine.on_revoke(consumer, &revoked, lost) {
                    tracing::error!("revoking partitions: {e}");
                    engine.fatal.get_or_insert(e);
                }
                let r = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = r {
                    tracing::warn!("unassign: {e}");
                }
            }
            other => {
                tracing::error!("rebalance error: {other:?}");
                let _ = consumer.unassign();
            }
        }
    }
}

impl Engine {
    fn give_up_flag(&self) -> Arc<AtomicBool> {
        self.opts.shutdown.clone()
    }

    /// Takes ownership of newly assigned partitions and sets each one's starting offset.
    fn on_assign(
        &mut self,
        consumer: &BaseConsumer<Ctx>,
        tpl: &mut TopicPartitionList,
    ) -> Result<()> {
        // The connections come back from the flush in flight (if any) first.
        self.settle(consumer, CommitMode::Async)?;
        let p = self.pipeline.clone();
        let group = p.kafka.group_id.clone();
        let generation = p.identity.generation.clone().unwrap_or_default();
        let elems: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        let stmt = checkpoint::acquire_checkpoint(&p);
        let newer = checkpoint::newer_generation(&p);
        let stop = self.give_up_flag();
        let give_up = move || stop.load(Ordering::Relaxed);
        let sink = &mut self.sinks[0];
        let acquired: Vec<(String, i32, Option<i64>, i64)> = self.rt.block_on(async {
            let mut attempt = 0u32;
            loop {
                let result: Result<Vec<_>> = async {
                    if sink.is_closed() {
                        sink.reconnect().await?;
                    }
                    let mut out = Vec::new();
                    for (topic, partition) in &elems {
                        // Another generation of the group applied this partition after our checkpoint (a
                        // rolling deploy or a rollback of a generation change): ours is stale, resolve the
                        // partition as after a generation change (from the newest checkpoint).
                        let superseded = sink
                            .client()
                            .query_opt(&newer, &[&group, topic, partition, &generation])
                            .await?;
                        let row = sink
                            .client()
                            .query_one(&stmt, &[&group, topic, partition, &generation])
                            .await?;
                        let mut next = row.get::<_, Option<i64>>(0);
                        if let Some(r) = superseded {
                            let (other, at): (String, i64) = (r.get(0), r.get(1));
                            tracing::warn!(
                                %topic,
                                partition,
                                stale = ?next,
                                other_generation = %other,
                                other_next = at,
                                "generation `{other}` applied this partition after this generation's checkpoint; \
                                 continuing from the newest checkpoint instead"
                            );
                            next = None;
                        }
                        out.push((topic.clone(), *partition, next, row.get::<_, i64>(1)));
                    }
                    Ok(out)
                }
                .await;
                match result {
                    Err(e) if is_transient(&e) && !give_up() => {
                        attempt += 1;
                        tracing::warn!(
                            attempt,
                            "taking over partitions: database unavailable, retrying: {e}"
                        );
                        tokio::time::sleep(backoff(attempt)).await;
                    }
                    other => break other,
                }
            }
        })?;
        // Kafka's committed offsets, used only where there is no checkpoint yet.
        let without: Vec<&(String, i32, Option<i64>, i64)> =
            acquired.iter().filter(|a| a.2.is_none()).collect();
        let mut committed: HashMap<Tp, i64> = HashMap::new();
        if !without.is_empty() {
            let mut q = TopicPartitionList::new();
            for (t, part, _, _) in &without {
                q.add_partition(t, *part);
            }
            let c = consumer.committed_offsets(q, Duration::from_secs(30))?;
            for e in c.elements() {
                if let Offset::Offset(o) = e.offset() {
                    committed.insert((e.topic().to_string(), e.partition()), o);
                }
            }
        }
        let mut resolved: Vec<(String, i32, i64, i64)> = Vec::new();
        for (topic, partition, next, fence) in acquired {
            let (low, high) =
                self.side
                    .fetch_watermarks(&topic, partition, Duration::from_secs(30))?;
            let (start, from) = match next {
                Some(n) => (n, "checkpoint".to_string()),
                None => {
                    let u = start::Unpositioned {
                        committed: committed.get(&(topic.clone(), partition)).copied(),
                        topic: topic.clone(),
                        partition,
                        low,
                        high,
                        checkpoints: p.table(checkpoint::CHECKPOINTS).to_string(),
                    };
                    let s = self.unpositioned_start(&u, &committed)?;
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
            tracing::info!(%topic, partition, offset = start, from, fence, low, high, "partition assigned");
            tpl.set_partition_offset(&topic, partition, Offset::Offset(start))?;
            if next.is_none() {
                resolved.push((topic.clone(), partition, fence, start));
            }
            self.parts.insert(
                (topic, partition),
                PartState {
                    fence,
                    start,
                    next: Some(start),
                    buffer: Vec::new(),
                    oldest: None,
                },
            );
        }
        // A start resolved from Kafka's committed offset or from `start` is written to the checkpoint before
        // anything is consumed, so a crash before the first batch cannot resolve `latest` again and skip what
        // arrived in between (case C17).
        if !resolved.is_empty() {
            let stmt = format!(
                "UPDATE {} SET next_offset = $5, updated_at = now(), \
                 last_offset = CASE WHEN last_sha256 IS NULL THEN {} ELSE last_offset END \
                 WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND fence = $4 AND generation = $6",
                p.table(checkpoint::CHECKPOINTS),
                start::NOTHING_APPLIED
            );
            let sink = &mut self.sinks[0];
            self.rt.block_on(async {
                for (topic, partition, fence, start) in &resolved {
                    let n = sink.client().execute(&stmt, &[&group, topic, partition, fence, start, &generation]).await?;
                    if n != 1 {
                        return Err(Error::Other(format!(
                            "{topic}/{partition} was taken over by another consumer while being assigned"
                        )));
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Where a partition without a checkpoint in this generation starts ([`start`] module docs): another
    /// generation's checkpoint, Kafka's committed offset, "added after the group began", or `start`.
    fn unpositioned_start(
        &mut self,
        u: &start::Unpositioned,
        committed: &HashMap<Tp, i64>,
    ) -> Result<start::Start> {
        let p = self.pipeline.clone();
        let group = p.kafka.group_id.clone();
        let generation = p.identity.generation.clone().unwrap_or_default();
        let client = self.sinks[0].client();
        let old = self.rt.block_on(start::old_checkpoints(
            client,
            &p,
            &group,
            &generation,
            &u.topic,
        ))?;
        if !old.is_empty() {
            let config = consumer_config(&p, &self.opts);
            return start::after_generation_change(
                u,
                &group,
                &generation,
                old.get(&u.partition),
                |o, ts, sha| start::read_back(&config, &u.topic, u.partition, o, (ts, sha)),
            );
        }
        let now = crate::offsets::partitions(&self.side, std::slice::from_ref(&u.topic))?.len();
        let positioned: Vec<i32> = committed
            .keys()
            .filter(|(t, _)| *t == u.topic)
            .map(|(_, part)| *part)
            .collect();
        let client = self.sinks[0].client();
        let began = self.rt.block_on(start::group_began_with(
            client,
            &p,
            &group,
            &generation,
            &u.topic,
            i32::try_from(now).unwrap_or(i32::MAX),
            &positioned,
        ))?;
        start::without_generation_change(u, &group, began, p.kafka.start)
    }

    fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<Ctx>,
        revoked: &[Tp],
        lost: bool,
    ) -> Result<()> {
        // What is in flight commits or is fenced as a whole; its outcomes are recorded before anything is given up.
        let settled = self.settle(consumer, CommitMode::Sync);
        if lost || self.crashed {
            // Another member may already own these: our buffered records are abandoned, never committed.
            for tp in revoked {
                if let Some(st) = self.parts.remove(tp) {
                    tracing::warn!(topic = %tp.0, partition = tp.1, abandoned = st.buffer.len(), "assignment lost");
                }
            }
            return settled;
        }
        let result = settled
            .and_then(|()| self.flush(consumer, |tp, _| revoked.contains(tp), CommitMode::Sync));
        for tp in revoked {
            self.parts.remove(tp);
        }
        result
    }

    /// Decodes, filters and buffers one record.
    fn push(&mut self, topic: &str, partition: i32, item: Item) {
        let Some(st) = self.parts.get_mut(&(topic.to_string(), partition)) else {
            tracing::debug!(
                topic,
                partition,
                offset = item.offset,
                "record for a partition not held; ignored"
            );
            return;
        };
        if st.buffer.is_empty() {
            st.oldest = Some(Instant::now());
        }
        st.buffer.push(item);
        self.first_record.get_or_insert_with(Instant::now);
    }

    /// Flushes partitions selected by `which` and waits: the flush in flight (if any) is settled first, then
    /// the selected buffers are applied and their Kafka offsets committed with `mode`.
    fn flush(
        &mut self,
        consumer: &BaseConsumer<Ctx>,
        which: impl Fn(&Tp, &PartState) -> bool,
        mode: CommitMode,
    ) -> Result<()> {
        self.settle(consumer, mode)?;
        if self.crashed {
            return Ok(());
        }
        self.launch(which);
        self.settle(consumer, mode)
    }

    /// Cuts the buffers of the partitions selected by `which` into batches and starts applying them on a
    /// background thread — the connections move there until [`Engine::settle`] — so that polling and decoding
    /// the next records overlaps the transactions. At most one flush is in flight: `settle` comes first, which
    /// also makes each partition's `next` (the next batch's expected checkpoint) current.
    fn launch(&mut self, which: impl Fn(&Tp, &PartState) -> bool) {
        debug_assert!(self.inflight.is_none(), "one flush in flight at most");
        let max = self.pipeline.max_records;
        let mut batches: Vec<Batch> = Vec::new();
        for (tp, st) in self.parts.iter_mut() {
            if st.buffer.is_empty() || !which(tp, st) {
                continue;
            }
            let items = std::mem::take(&mut st.buffer);
            st.oldest = None;
            let mut expected = st.next;
            let mut it = items.into_iter().peekable();
            while it.peek().is_some() {
                let chunk: Vec<Item> = it.by_ref().take(max).collect();
                let end = chunk.last().expect("non-empty").offset + 1;
                batches.push(Batch {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    fence: st.fence,
                    expected,
                    end,
                    items: chunk,
                });
                expected = Some(end);
            }
        }
        if batches.is_empty() {
            return;
        }
        // Partition → connection by hash, so one partition's batches stay in order on one connection.
        let n = self.sinks.len();
        let mut lanes: Vec<Vec<Batch>> = (0..n).map(|_| Vec::new()).collect();
        for b in batches {
            let lane = (b.partition as usize + b.topic.len()) % n;
            lanes[lane].push(b);
        }
        tracing::debug!(
            batches = lanes.iter().map(Vec::len).sum::<usize>(),
            lanes = lanes.iter().filter(|l| !l.is_empty()).count(),
            records = lanes.iter().flatten().map(|b| b.items.len()).sum::<usize>(),
            "flush launched"
        );
        let mut sinks = std::mem::take(&mut self.sinks);
        let rt = self.rt.clone();
        let stop = self.give_up_flag();
        let started = Instant::now();
        let handle = std::thread::spawn(move || {
            let give_up = move || stop.load(Ordering::Relaxed);
            let results: Vec<Vec<(Batch, Result<Applied>)>> = rt.block_on(async {
                let futs = sinks.iter_mut().zip(lanes).map(|(sink, lane)| {
                    let give_up = &give_up;
                    async move {
                        let mut out = Vec::new();
                        // A fenced partition skips its own later batches only; an error stops the lane (the run
                        // ends with it, and the skipped batches were never committed).
                        let mut fenced: Vec<(String, i32)> = Vec::new();
                        let mut failed = false;
                        for b in lane {
                            let tp = (b.topic.clone(), b.partition);
                            if failed || fenced.contains(&tp) {
                                out.push((b, Ok(Applied::Fenced)));
                                continue;
                            }
                            let r = apply_batch(sink, &b, give_up).await;
                            match &r {
                                Ok(Applied::Committed(_)) => {}
                                Ok(Applied::Fenced) => fenced.push(tp),
                                Err(_) => failed = true,
                            }
                            out.push((b, r));
                        }
                        out
                    }
                });
                futures::future::join_all(futs).await
            });
            (sinks, results)
        });
        self.inflight = Some(Inflight { handle, started });
    }

    /// Waits for the flush in flight (if any), records its outcomes, and commits to Kafka — after the database
    /// commit — the offsets of the batches it committed, with `mode`.
    fn settle(&mut self, consumer: &BaseConsumer<Ctx>, mode: CommitMode) -> Result<()> {
        let Some(flight) = self.inflight.take() else {
            return Ok(());
        };
        let waited = Instant::now();
        let (sinks, results) = flight
            .handle
            .join()
            .map_err(|_| Error::Other("the flush thread panicked".into()))?;
        self.sinks = sinks;
        tracing::debug!(
            applied_ms = flight.started.elapsed().as_millis() as u64,
            waited_ms = waited.elapsed().as_millis() as u64,
            "flush settled"
        );
        metrics::histogram!("replaysafe_flush_seconds")
            .record(flight.started.elapsed().as_secs_f64());
        let mut commit = TopicPartitionList::new();
        let mut first_err = None;
        for (batch, r) in results.into_iter().flatten() {
            let tp = (batch.topic.clone(), batch.partition);
            match r {
                Ok(Applied::Committed(outcomes)) => {
                    self.batches += 1;
                    self.last_commit = Some(Instant::now());
                    metrics::counter!("replaysafe_batches_total").increment(1);
                    for o in &outcomes {
                        self.tally.add(o);
                        count_metric(o);
                    }
                    if let Some(st) = self.parts.get_mut(&tp) {
                        st.next = Some(batch.end);
                    }
                    commit.add_partition_offset(
                        &batch.topic,
                        batch.partition,
                        Offset::Offset(batch.end),
                    )?;
                }
                Ok(Applied::Fenced) => {
                    // Another owner holds the checkpoint: stop reading this partition until the next
                    // assignment; what we buffered is dropped (the owner resumes from the checkpoint).
                    if self.parts.remove(&tp).is_some() {
                        let mut paused = TopicPartitionList::new();
                        paused.add_partition(&tp.0, tp.1);
                        if let Err(e) = consumer.pause(&paused) {
                            tracing::warn!(topic = %tp.0, partition = tp.1, "pausing a fenced partition: {e}");
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if commit.count() > 0 {
            if let Some(limit) = self.opts.crash_after_batches {
                if self.batches >= limit {
                    self.crashed = true;
                    return Ok(());
                }
            }
            fail::fail_point!("after-db-commit-before-kafka-commit", |_| {
                std::process::abort();
            });
            if let Err(e) = consumer.commit(&commit, mode) {
                // The checkpoint is the truth; a failed Kafka commit only delays lag reporting.
                tracing::warn!(
                    "kafka offset commit failed (checkpoint in PostgreSQL is authoritative): {e}"
                );
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Commits every held partition's checkpoint to Kafka synchronously (clean exits).
    fn commit_checkpoints(&self, consumer: &BaseConsumer<Ctx>) {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), st) in &self.parts {
            if let Some(n) = st.next {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(n));
            }
        }
        if tpl.count() > 0 && !self.crashed {
            if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                tracing::warn!(
                    "final kafka offset commit failed (checkpoints are authoritative): {e}"
                );
            }
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.parts.values().any(|st| {
            st.buffer.len() >= self.pipeline.max_records
                || st
                    .oldest
                    .is_some_and(|t| now.duration_since(t) >= self.pipeline.linger)
        })
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.parts
            .values()
            .filter_map(|st| st.oldest)
            .min()
            .map(|t| t + self.pipeline.linger)
    }

    fn buffered(&self) -> usize {
        self.parts.values().map(|s| s.buffer.len()).sum()
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

/// Decides what to do with a record: decode, filters. The ledger horizon is decided per record in the batch
/// transaction ([`Sink::apply`]), against the database's clock and its durable pruned-below day.
pub fn decide(
    pipeline: &Pipeline,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
) -> Pending {
    let (fields, change) = match decode::record(pipeline, key, value, old_key) {
        Ok(decode::Decoded::Fields { fields, change }) => (fields, change),
        Ok(decode::Decoded::Skip(rule)) => return Pending::Filtered(rule.to_string()),
        Err(r) => return Pending::Quarantine(r),
    };
    filter::pending(pipeline, fields, change)
}

/// The librdkafka configuration of the pipeline's consumer.
pub fn consumer_config(p: &Pipeline, opts: &RunOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &opts.brokers)
        .set("group.id", &p.kafka.group_id)
        .set("client.id", "replaysafe")
        // Bounded prefetch keeps memory flat (librdkafka defaults: 64 MiB and 100,000 messages per partition
        // queue). 4 MiB per partition still holds ~20,000 seed events, more than a flush takes; at 16 MiB a
        // 1M-event first pass peaked at 150 MiB RSS, at 4 MiB at 68 MiB, with no loss of throughput.
        .set("queued.max.messages.kbytes", "4096")
        .set("queued.min.messages", "20000")
        // librdkafka (≥ 2.4) pauses a partition's fetching this long once the queue is full (default 1000 ms).
        .set("fetch.queue.backoff.ms", "50");
    for (k, v) in &p.kafka.properties {
        c.set(k, v);
    }
    for (k, v) in &opts.extra_properties {
        c.set(k, v);
    }
    // Forced: offsets are ours to commit, after the database; positions are chosen explicitly on assignment,
    // and an out-of-range position later is an error, never a silent jump (librdkafka CONFIGURATION.md).
    c.set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set_log_level(RDKafkaLogLevel::Warning);
    c
}

/// Runs the pipeline until shutdown (or until caught up), returning the tally of this run.
///
/// # Errors
/// [`Error::Schema`] before consuming anything when the database does not match; [`Error::NoStartPosition`]
/// when a partition has no position and `start` is unset; [`Error::Kafka`] / [`Error::Postgres`] for fatal
/// client errors; [`Error::Other`] for a projection that fails.
pub fn run(pipeline: Arc<Pipeline>, opts: RunOptions) -> Result<Tally> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    run_on(rt.handle().clone(), pipeline, opts)
}

/// As [`run`], on an existing runtime (must not be called from inside it).
///
/// # Errors
/// As [`run`].
pub fn run_on(
    rt: tokio::runtime::Handle,
    pipeline: Arc<Pipeline>,
    opts: RunOptions,
) -> Result<Tally> {
    let stop = opts.shutdown.clone();
    let give_up = move || stop.load(Ordering::Relaxed);
    let sinks = rt.block_on(retry_db("starting", &give_up, || async {
        let mut admin = crate::sink::connect(&opts.database_url).await?;
        schema::init(&mut admin, &pipeline).await?;
        let dropped = ledger::drop_expired_partitions(&mut admin, &pipeline).await?;
        if !dropped.is_empty() {
            tracing::info!(?dropped, "dropped ledger partitions older than the horizon");
        }
        let mut sinks = Vec::new();
        for _ in 0..pipeline.postgres.connections {
            sinks.push(Sink::open(pipeline.clone(), &opts.database_url).await?);
        }
        Ok::<_, Error>(sinks)
    }))?;
    let side: BaseConsumer = {
        let mut c = consumer_config(&pipeline, &opts);
        c.remove("group.id");
        c.create()?
    };
    // A topic that does not exist would leave the group waiting forever without a word.
    crate::offsets::partitions(&side, &pipeline.kafka.topics).map_err(|e| match e {
        Error::Other(m) => Error::Usage(m),
        other => other,
    })?;
    let engine = Arc::new(Mutex::new(Engine {
        pipeline: pipeline.clone(),
        side,
        rt: rt.clone(),
        sinks,
        parts: BTreeMap::new(),
        tally: Tally::default(),
        batches: 0,
        assigned_once: false,
        fatal: None,
        opts: opts.clone(),
        crashed: false,
        inflight: None,
        first_record: None,
        last_commit: None,
    }));
    let consumer: BaseConsumer<Ctx> =
        consumer_config(&pipeline, &opts).create_with_context(Ctx {
            engine: engine.clone(),
        })?;
    let topics: Vec<&str> = pipeline.kafka.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    tracing::info!(group = %pipeline.kafka.group_id, ?topics, "consuming");

    let mut last_summary = Instant::now();
    let mut pruner = Pruner {
        last: Instant::now(),
        task: None,
    };
    let mut idle_checks = 0u32;
    let result = loop {
        if let Some(e) = engine.lock().expect("engine").fatal.take() {
            break Err(e);
        }
        if opts.shutdown.load(Ordering::Relaxed) {
            tracing::info!("shutting down: applying buffered records");
            let mut eng = engine.lock().expect("engine");
            let r = eng.flush(&consumer, |_, _| true, CommitMode::Sync);
            eng.commit_checkpoints(&consumer);
            break r;
        }
        let timeout = {
            let eng = engine.lock().expect("engine");
            let cap = if eng.inflight.is_some() {
                Duration::from_millis(10)
            } else {
                Duration::from_millis(100)
            };
            // A batch may be overdue while a flush runs (it waits for the flush): poll briefly, never spin.
            let floor = if eng.inflight.is_some() {
                Duration::from_millis(2)
            } else {
                Duration::ZERO
            };
            eng.next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(cap)
                .min(cap)
                .max(floor)
        };
        let polled = consumer.poll(timeout);
        let mut idle = false;
        match polled {
            None => idle = true,
            Some(Ok(msg)) => {
                idle_checks = 0;
                let value = msg.payload();
                let pending = decide(
                    &pipeline,
                    msg.key(),
                    value,
                    crate::decode::debezium::old_key_header(&msg),
                );
                let item = Item::from_message(&msg, pending);
                let topic = msg.topic().to_string();
                let partition = msg.partition();
                drop(msg);
                engine.lock().expect("engine").push(&topic, partition, item);
            }
            Some(Err(KafkaError::PartitionEOF(_))) => idle = true,
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)))
            | Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                break Err(Error::Other(
                    "a partition's position is out of range on the broker (records deleted by retention while \
                     consuming?); stopping instead of skipping them"
                        .into(),
                ));
            }
            Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                break Err(Error::Other(format!("fatal Kafka consumer error: {code}")));
            }
            Some(Err(e)) => {
                tracing::warn!("kafka: {e}");
            }
        }
        let now = Instant::now();
        {
            let mut eng = engine.lock().expect("engine");
            let in_flight = eng.inflight.as_ref().map(|f| f.handle.is_finished());
            // While a flush runs, records keep accumulating (up to a full batch per connection), so the next
            // flush usually carries several partitions' batches and uses the connections in parallel.
            let cap = pipeline.max_records * pipeline.postgres.connections;
            let running = in_flight == Some(false);
            if eng.due(now) && !(running && eng.buffered() < cap) {
                // One partition is full or has waited long enough: once the flush in flight has settled, start
                // one for every partition with buffered records (they commit in parallel on their connections)
                // and go on polling and decoding while it runs.
                if let Err(e) = eng.settle(&consumer, CommitMode::Async) {
                    break Err(e);
                }
                if !eng.crashed {
                    eng.launch(|_, st| !st.buffer.is_empty());
                }
            } else if in_flight == Some(true) {
                if let Err(e) = eng.settle(&consumer, CommitMode::Async) {
                    break Err(e);
                }
            }
            if eng.crashed {
                tracing::warn!("simulated crash: database committed, Kafka offsets not committed");
                break Ok(());
            }
        }
        if now.duration_since(last_summary) >= opts.summary_interval {
            last_summary = now;
            let eng = engine.lock().expect("engine");
            tracing::info!("{} (batches {})", eng.tally.line(), eng.batches);
        }
        pruner.tick(&rt, &pipeline, &opts, now);
        if opts.until_caught_up && idle {
            idle_checks += 1;
            if idle_checks >= 3 && caught_up(&consumer, &engine) {
                let mut eng = engine.lock().expect("engine");
                let r = eng.flush(&consumer, |_, _| true, CommitMode::Sync);
                eng.commit_checkpoints(&consumer);
                break r;
            }
        }
    };
    let crashed = engine.lock().expect("engine").crashed;
    if !crashed {
        consumer.unsubscribe();
        // Serve the revoke callback so buffered work is applied and committed before we return.
        let _ = consumer.poll(Duration::from_millis(100));
    }
    // A flush still in flight (the loop ended on an error elsewhere) is waited for: its outcome is recorded.
    let result = {
        let mut eng = engine.lock().expect("engine");
        let settled = eng.settle(&consumer, CommitMode::Sync);
        result.and(settled)
    };
    // Closing the consumer serves any pending revoke (which applies what is still buffered).
    drop(consumer);
    let (tally, first, last) = {
        let eng = engine.lock().expect("engine");
        (eng.tally.clone(), eng.first_record, eng.last_commit)
    };
    if let (Some(a), Some(b)) = (first, last) {
        let secs = b.saturating_duration_since(a).as_secs_f64();
        tracing::info!(
            records = tally.total(),
            seconds = secs,
            rate = tally.total() as f64 / secs.max(1e-9),
            "throughput from first record to last checkpoint commit"
        );
    }
    tracing::info!("{}", tally.line());
    result.map(|_| tally)
}

/// Every assigned partition's position is at its high watermark and nothing is buffered.
fn caught_up(consumer: &BaseConsumer<Ctx>, engine: &Arc<Mutex<Engine>>) -> bool {
    let parts: Vec<(Tp, i64)> = {
        let eng = engine.lock().expect("engine");
        if !eng.assigned_once || eng.buffered() > 0 || eng.inflight.is_some() {
            return false;
        }
        eng.parts
            .iter()
            .map(|(tp, st)| (tp.clone(), st.next.unwrap_or(st.start)))
            .collect()
    };
    let positions = match consumer.position() {
        Ok(p) => p,
        Err(_) => return false,
    };
    for ((topic, partition), applied) in parts {
        let high = {
            let eng = engine.lock().expect("engine");
            eng.side
                .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                .map(|(_, h)| h)
        };
        let Ok(high) = high else {
            return false;
        };
        let pos = positions
            .find_partition(&topic, partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        // The fetch position passes transaction markers the application never sees; before the first fetch it
        // is unknown, and what was applied (or the assigned start) tells.
        let at = pos.unwrap_or(applied).max(applied);
        if at < high {
            return false;
        }
    }
    true
}
