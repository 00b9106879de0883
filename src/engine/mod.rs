//! The one consume loop, for every source (`run`, `load`, `backfill`, `rebuild`, `demo`):
//!
//! ```text
//! source.poll ─► decide (decode, filters) ─► buffer per partition ─► flush: batches applied in the background
//!   ▲                                                                 over postgres.connections connections
//!   └──────────── ack (Kafka commit) ◄── settle (outcomes, tally, checkpoints) ◄──┘
//! ```
//!
//! - a partition's buffer is flushed when it holds `batch.max-records` or its oldest record has waited
//!   `batch.linger-ms`; the flush takes every partition's buffer and applies them on a background thread (one
//!   transaction per batch, partitions in parallel) while polling goes on ([`state::Core::launch`]);
//! - the next flush first settles the one in flight ([`state::Core::settle`]): outcomes are counted, each
//!   partition's checkpoint advances, and only then is the source acknowledged (Kafka offsets committed);
//! - a source ([`Source`]) takes partitions over (checkpoint row, fence bumped) and positions them; it says when
//!   it is finished (caught up, every stop reached, end of file);
//! - when idle with nothing buffered or in flight, a checkpoint below the source's position (control records:
//!   transaction markers) steps to it through a batch without records ([`Engine`]'s `step_over_markers`).

pub mod apply;
pub mod decide;
pub mod flush;
mod prune;
pub mod retry;
pub mod state;
pub mod takeover;
pub mod txapply;
pub mod txbuf;
pub mod types;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::{Item, Tally};
use crate::sink::{ledger, verify, Sink};

pub use decide::{decide, Extras};
pub use state::Core;
pub use types::{Ack, CommitMode, NoAck, Observer, Offsets, PartState, Polled, Record, Tp};

/// The engine's state, shared with the source.
pub type Shared = Arc<Mutex<Core>>;

/// How often the loop publishes its accounting for a report from outside ([`Core::publish`]; ms between
/// publications, so the loop does not count its buffers for every record).
const PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// A handle for reporting a run's accounting from outside it (`run`'s `--shutdown-timeout` exit):
/// [`Reporter::tally`].
#[derive(Clone)]
pub struct Reporter {
    core: Shared,
    published: Arc<state::Published>,
}

impl Reporter {
    /// The tally so far, with `buffered` = records consumed and not confirmed applied ([`Core::held`]: in
    /// partition buffers or open source transactions, in a flush whose outcome is unknown, or dropped with a
    /// batch that did not commit — read again from the checkpoints on restart, where what did commit is
    /// recognised as duplicate). Read under the state's lock when it comes within `wait`; otherwise (a thread
    /// holding it waits on the database) as the loop last published it ([`Core::publish`]: at most
    /// [`PUBLISH_EVERY`] old, and at the start of a drain).
    pub fn tally(&self, wait: Duration) -> Tally {
        let deadline = Instant::now() + wait;
        loop {
            match self.core.try_lock() {
                Ok(c) => {
                    let mut t = c.tally.clone();
                    t.buffered = c.held();
                    return t;
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(_) => return self.published.tally(),
            }
        }
    }
}

/// Locks the shared state.
pub fn lock(core: &Shared) -> MutexGuard<'_, Core> {
    core.lock()
        .expect("engine state: a thread panicked holding this lock")
}

/// Where records come from: a group subscription, explicit partitions with stop offsets, a file.
pub trait Source {
    /// Waits up to `timeout` for the next record.
    fn poll(&mut self, timeout: Duration) -> Polled;
    /// The acknowledgement of committed batches.
    fn ack(&self) -> &dyn Ack;
    /// Whether everything the source will deliver has been delivered (checked every turn; `idle_turns`
    /// counts the consecutive polls that returned nothing). The engine then applies what is buffered and ends.
    fn finished(&mut self, idle_turns: u32) -> bool;
    /// On shutdown: `None` for a clean end (what is buffered is applied first), or the error to return (what
    /// is buffered is applied first only when [`Source::flush_on_error`]).
    fn interrupted(&self) -> Option<Error>;
    /// Whether buffered records are applied before returning a [`Polled::Failed`] error.
    fn flush_on_error(&self) -> bool;
    /// The loop ended (whatever the result): give partitions up. What is in flight is settled afterwards.
    fn close(&mut self) {}
    /// The consumer's position per partition (next offset it will deliver), where known: a Kafka consumer's
    /// position steps over control records (transaction markers) the application never sees. Used only when
    /// the loop is idle ([`Engine`] steps a checkpoint over them). The default knows none.
    fn positions(&self) -> Vec<(Tp, i64)> {
        Vec::new()
    }
}

/// Options of the engine.
pub struct Options {
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// The group id of checkpoints, ledger and dead-letter rows, when not the pipeline's.
    pub group: Option<String>,
    /// Set to stop: buffered work is applied, then the loop ends ([`Source::interrupted`]).
    pub shutdown: Arc<AtomicBool>,
    /// Set to end the database retries of batches and take-overs; `None`: the same flag as `shutdown` (a stop
    /// gives up at once). `run` sets it only when its drain's `--shutdown-timeout` has passed.
    pub give_up: Option<Arc<AtomicBool>>,
    /// Interval of the summary log line, if any.
    pub summary_interval: Option<Duration>,
    /// `demo` and `prove`: after this many committed batches, end without acknowledging (a crash between the
    /// database commit and the offset commit).
    pub crash_after_batches: Option<u64>,
    /// `prove` only: lose COMMIT replies ([`crate::sink::fault::Fault`]); `None` everywhere else.
    pub fault: Option<Arc<crate::sink::fault::Fault>>,
    /// Drop ledger partitions older than the horizon on start.
    pub prune_on_start: bool,
    /// Prune periodically at this interval while running.
    pub prune_interval: Option<Duration>,
    /// The decision's extras (`--filter`, a rebuild's window, per-day tracking).
    pub extras: Extras,
    /// Sees committed batches.
    pub observer: Option<Box<dyn Observer>>,
    /// `replaysafe projection build`: feed only this projection, from the ledger rows claimed before its
    /// hand-over ([`crate::sink::Sink::for_build`]).
    pub build: Option<usize>,
}

impl Options {
    /// Options with the defaults: the pipeline's group, no summary, prune on start only, no extras.
    pub fn new(database_url: &str, shutdown: Arc<AtomicBool>) -> Options {
        Options {
            database_url: database_url.to_string(),
            group: None,
            shutdown,
            give_up: None,
            summary_interval: None,
            crash_after_batches: None,
            fault: None,
            prune_on_start: true,
            prune_interval: None,
            extras: Extras::default(),
            observer: None,
            build: None,
        }
    }
}

/// The engine: its state (shared with the source) and what the loop needs beside it.
pub struct Engine {
    core: Shared,
    pipeline: Arc<Pipeline>,
    database_url: String,
    extras: Extras,
    summary_interval: Option<Duration>,
    prune_interval: Option<Duration>,
}

impl Engine {
    /// Creates the tables (or checks them; only checks with `manage-schema = false`), prunes the ledger when asked
    /// (never without DDL), and opens `postgres.connections` connections — retried while the database is
    /// unavailable, for at most `--connect-timeout` ([`crate::endpoint::connect_timeout`]).
    ///
    /// # Errors
    /// [`Error::Schema`] when the database does not match; a database error; the connection error (address,
    /// origin, cause) once `--connect-timeout` has passed.
    pub fn start(
        rt: &tokio::runtime::Handle,
        pipeline: Arc<Pipeline>,
        mut opts: Options,
    ) -> Result<Engine> {
        let stop = opts.shutdown.clone();
        let give_up = move || stop.load(Ordering::Relaxed);
        let (url, group) = (&opts.database_url, opts.group.as_deref());
        let (prune, build) = (opts.prune_on_start, opts.build);
        let fault = opts.fault.clone();
        // Start-up waits for the database at most `--connect-timeout`, then exits with the error.
        let dl = Some(Instant::now() + crate::endpoint::connect_timeout());
        let sinks = rt.block_on(apply::retry_db_until("starting", &give_up, dl, || async {
            let mut admin = crate::sink::connect_with(url, &pipeline.postgres.timeouts).await?;
            verify::prepare(&mut admin, &pipeline).await?;
            // Without DDL (manage-schema = false) nothing is dropped: `init` run by the owner prunes.
            if prune && pipeline.postgres.manage_schema {
                let dropped = ledger::drop_expired_partitions(&mut admin, &pipeline).await?;
                if !dropped.is_empty() {
                    tracing::info!(?dropped, "dropped ledger partitions older than the horizon");
                }
            }
            let mut sinks = Vec::new();
            for _ in 0..pipeline.postgres.connections {
                let sink = Sink::open(pipeline.clone(), url)
                    .await?
                    .with_fault(fault.clone());
                let sink = match group {
                    Some(g) => sink.with_group(g),
                    None => sink,
                };
                sinks.push(match build {
                    Some(i) => sink.for_build(i).await?,
                    None => sink,
                });
            }
            Ok::<_, Error>(sinks)
        }))?;
        let core = Core {
            pipeline: pipeline.clone(),
            rt: rt.clone(),
            sinks,
            parts: Default::default(),
            tally: Tally::default(),
            batches: 0,
            fatal: None,
            crashed: false,
            unapplied: 0,
            published: Default::default(),
            published_at: Instant::now(),
            crash_after_batches: opts.crash_after_batches,
            shutdown: opts.shutdown.clone(),
            give_up: opts
                .give_up
                .clone()
                .unwrap_or_else(|| opts.shutdown.clone()),
            inflight: None,
            observer: opts.observer.take(),
            first_record: None,
            last_commit: None,
            tx: pipeline
                .transactions
                .clone()
                .map(|t| txbuf::TxBuf::new(t, pipeline.clone())),
        };
        Ok(Engine {
            core: Arc::new(Mutex::new(core)),
            pipeline,
            database_url: opts.database_url,
            extras: opts.extras,
            summary_interval: opts.summary_interval,
            prune_interval: opts.prune_interval,
        })
    }

    /// The state, to hand to a source.
    pub fn shared(&self) -> Shared {
        self.core.clone()
    }

    /// A handle reporting this run's accounting from outside it.
    pub fn reporter(&self) -> Reporter {
        Reporter {
            core: self.core.clone(),
            published: lock(&self.core).published.clone(),
        }
    }

    /// Runs the loop over `source` until it is finished, shut down or failed; returns the tally.
    ///
    /// # Errors
    /// The source's error, a batch's error, [`Source::interrupted`] on shutdown.
    pub fn run(self, source: impl Source) -> Result<Tally> {
        self.run_timed(source).map(|(tally, _)| tally)
    }

    /// As [`Engine::run`], also returning the time from the first record polled to the last checkpoint commit
    /// (`None` when nothing committed) — the applying time, without group joins or start-up.
    ///
    /// # Errors
    /// As [`Engine::run`].
    pub fn run_timed(self, mut source: impl Source) -> Result<(Tally, Option<Duration>)> {
        let result = self.turns(&mut source);
        source.close();
        // A flush still in flight (the loop ended on an error elsewhere) is waited for: its outcome is recorded.
        let settled = lock(&self.core).settle(source.ack(), CommitMode::Sync);
        let result = result.and(settled);
        // Closing the source's client may still apply what a revocation hands back.
        drop(source);
        let mut core = lock(&self.core);
        // A revocation served while closing may have failed after the loop's last look.
        let result = match core.fatal.take() {
            Some(e) => result.and(Err(e)),
            None => result,
        };
        if let Some(obs) = core.observer.as_mut() {
            obs.finish();
        }
        let applying = match (core.first_record, core.last_commit) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
            _ => None,
        };
        if let Some(d) = applying {
            let secs = d.as_secs_f64();
            tracing::info!(
                records = core.tally.total(),
                seconds = secs,
                rate = core.tally.total() as f64 / secs.max(1e-9),
                "throughput from first record to last checkpoint commit"
            );
        }
        tracing::info!("{}", core.tally.line());
        result.map(|()| (core.tally.clone(), applying))
    }

    fn turns(&self, source: &mut impl Source) -> Result<()> {
        let shutdown = lock(&self.core).shutdown.clone();
        let mut last_summary = Instant::now();
        let mut pruner = prune::Pruner::new(self.prune_interval);
        let mut idle_turns = 0u32;
        loop {
            if let Some(e) = lock(&self.core).fatal.take() {
                return Err(e);
            }
            if shutdown.load(Ordering::Relaxed) {
                let interrupted = source.interrupted();
                if interrupted.is_none() || source.flush_on_error() {
                    tracing::info!("shutting down: applying buffered records");
                    self.finish(source, false)?;
                }
                return interrupted.map_or(Ok(()), Err);
            }
            match source.poll(self.timeout()) {
                Polled::Record(r) => {
                    idle_turns = 0;
                    self.take(r)?;
                }
                Polled::Idle => idle_turns += 1,
                Polled::Busy => {}
                Polled::Failed(e) => {
                    if source.flush_on_error() {
                        self.finish(source, false)?;
                    }
                    return Err(e);
                }
            }
            // A rebalance callback during the poll may have failed (a partition it could not take over).
            if let Some(e) = lock(&self.core).fatal.take() {
                return Err(e);
            }
            let now = Instant::now();
            if let Some(t) = lock(&self.core).tx.as_mut() {
                t.idle(idle_turns >= 3);
            }
            crate::health::beat(Some(lock(&self.core).parts.len()));
            self.maybe_flush(source, now)?;
            if idle_turns >= 3 {
                // After the flush settled, before `finished` looks: a step launched now is settled first.
                self.step_over_markers(source);
                self.recommit(source);
            }
            if lock(&self.core).crashed {
                tracing::warn!("simulated crash: database committed, Kafka offsets not committed");
                return Ok(());
            }
            self.report(now, &mut last_summary);
            pruner.tick(
                &lock(&self.core).rt,
                &self.pipeline,
                &self.database_url,
                now,
            );
            if source.finished(idle_turns) {
                return self.finish(source, true);
            }
        }
    }

    /// The poll timeout: until the next linger deadline, at most 100 ms (10 ms while a flush runs, and then
    /// at least 2 ms: a batch may be overdue while it waits for the flush — poll briefly, never spin).
    fn timeout(&self) -> Duration {
        let core = lock(&self.core);
        let running = core.in_flight();
        let cap = Duration::from_millis(if running { 10 } else { 100 });
        let floor = Duration::from_millis(if running { 2 } else { 0 });
        core.next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(cap)
            .min(cap)
            .max(floor)
    }

    /// Decides and buffers one record.
    fn take(&self, mut r: Record) -> Result<()> {
        // A source may decide on its own thread (the file source); the decision's extras (`--filter`, a window,
        // per-day tracking) are only the engine's, so with extras the record is decided here.
        let pre = r.decided.take().filter(|_| self.extras.is_plain());
        let decided = match pre {
            Some(pending) => Ok((pending, None)),
            None => decide::decide_with(
                &self.pipeline,
                &self.extras,
                r.key.as_deref(),
                r.value.as_deref(),
                r.old_key.as_deref(),
            ),
        };
        let (pending, day) = match decided {
            Ok(d) => d,
            Err(detail) => {
                // The operator's expression failing is not the record's fault: stop before applying it (what
                // is in flight settles; what is buffered is not applied, a rerun resumes at the checkpoint).
                return Err(Error::Usage(format!(
                    "--filter failed on {}/{} offset {}: {detail}; nothing of that record was applied, fix the \
                     expression and rerun the same command",
                    r.tp.0, r.tp.1, r.offset
                )));
            }
        };
        if let crate::model::Pending::Quarantine(rej) = &pending {
            if rej.reason == crate::decode::Reason::RegistryUnavailable {
                // Not the record's fault: stop like an unreachable database; a rerun resumes at the checkpoint.
                return Err(Error::Other(format!(
                    "{} (record {}/{} offset {}); nothing of that record was applied, rerun when the registry \
                     answers",
                    rej.detail, r.tp.0, r.tp.1, r.offset
                )));
            }
        }
        let item = Item {
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: r.key,
            value: r.value,
            pending,
        };
        let mut core = lock(&self.core);
        let core = &mut *core;
        let item = match core.tx.as_mut() {
            Some(t) => match core.parts.get(&r.tp) {
                Some(st) => t.take(&r.tp, st.fence, item),
                None => Some(item),
            },
            _ => Some(item),
        };
        match item {
            Some(item) => core.push(&r.tp, item, day, self.extras.days),
            None => {
                core.first_record.get_or_insert_with(Instant::now);
                // Tests: a crash (no clean-up, as SIGKILL) with part of a source transaction buffered.
                fail::fail_point!("tx-record-held", |_| std::process::abort());
            }
        }
        Ok(())
    }

    /// Starts a flush when one is due: a partition is full or has waited long enough. While a flush runs,
    /// records keep accumulating (up to a full batch per connection) so that the next flush usually carries
    /// several partitions' batches and uses the connections in parallel.
    fn maybe_flush(&self, source: &impl Source, now: Instant) -> Result<()> {
        let mut core = lock(&self.core);
        let in_flight = core.inflight.as_ref().map(flush::Inflight::is_finished);
        let running = in_flight == Some(false);
        // A flush in flight is waited for only once the read-ahead is full ([`Core::read_ahead_full`]).
        if core.due(now) && (!running || core.read_ahead_full()) {
            core.settle(source.ack(), CommitMode::Async)?;
            if !core.crashed {
                core.launch(|_, st| st.buffered() > 0);
            }
        } else if in_flight == Some(true) {
            core.settle(source.ack(), CommitMode::Async)?;
        }
        Ok(())
    }

    /// A partition whose last records are control records (a transactional producer's COMMIT or ABORT marker,
    /// and the records of an aborted transaction a `read_committed` consumer skips) leaves the checkpoint below
    /// the consumer's position, and lag tools would show that gap forever. When the loop is idle with nothing
    /// buffered or in flight, every held partition whose position ([`Source::positions`]) is beyond its
    /// checkpoint gets a batch without records from the checkpoint to the position: the same fenced
    /// compare-and-set in its own transaction as any batch (fenced or rewound the same way), then the position is
    /// committed to Kafka when it settles. Everything below the position was delivered (a consumer's position
    /// only passes what the application polled, or control records) and, nothing being buffered, applied.
    fn step_over_markers(&self, source: &impl Source) {
        if lock(&self.core).buffered() > 0 || lock(&self.core).in_flight() {
            return;
        }
        let positions = source.positions();
        let mut core = lock(&self.core);
        // Atomic source transactions: never past a held record (the bounded cuts step over applied ones).
        let holds = core.tx.as_ref().is_some_and(txbuf::TxBuf::holds);
        if core.buffered() > 0 || core.in_flight() || core.crashed || holds {
            return;
        }
        let cuts: Vec<flush::Cut> = positions
            .into_iter()
            .filter_map(|(tp, pos)| {
                let st = core.parts.get(&tp)?;
                let next = st.next.filter(|n| pos > *n)?;
                tracing::debug!(topic = %tp.0, partition = tp.1, from = next, to = pos, "checkpoint steps over control records");
                Some(flush::step(&tp, st.fence, Some(next), pos))
            })
            .collect();
        core.launch_cuts(cuts);
    }

    /// Commits every held checkpoint to Kafka again (asynchronously) when the source asks for it
    /// ([`Ack::recommit_due`]): after a failed offset commit (e.g. a coordinator still loading after a broker
    /// restart) or an assignment, so Kafka's committed offsets (lag tools, `offsets snapshot`) do not stay behind
    /// the checkpoints of an idle partition. Only with nothing buffered or in flight: then each held partition's
    /// checkpoint is what this process last committed.
    fn recommit(&self, source: &impl Source) {
        let core = lock(&self.core);
        if core.buffered() > 0 || core.in_flight() || core.crashed {
            return;
        }
        if source.ack().recommit_due() {
            core.commit_checkpoints_with(source.ack(), CommitMode::Async);
        }
    }

    /// Applies everything buffered and acknowledges every checkpoint held. `at_end`: everything the source will
    /// deliver was read (caught up, every stop offset reached, the end of a file) — open source transactions are
    /// checked against the ledger, and those that began `transaction-timeout-ms` ago or longer (their records'
    /// timestamps) are applied as they are ([`txbuf::TxBuf::at_end`]); on a shutdown they stay open.
    fn finish(&self, source: &impl Source, at_end: bool) -> Result<()> {
        let mut core = lock(&self.core);
        // What a report from outside reads if this flush waits on the database past --shutdown-timeout.
        core.publish();
        let mut rounds = 1;
        if at_end {
            let now_ms = chrono::Utc::now().timestamp_millis();
            if let Some(t) = core.tx.as_mut() {
                t.at_end(now_ms);
                // A check, then what it or the age decided, then the partitions' records after them.
                rounds = 3;
            }
        }
        let mut r = Ok(());
        for _ in 0..rounds {
            r = core.flush(source.ack(), |_, _| true, CommitMode::Sync);
            if r.is_err() || core.crashed {
                break;
            }
        }
        core.commit_checkpoints(source.ack());
        if let Some((txs, records)) = core.tx.as_ref().map(txbuf::TxBuf::open_counts) {
            // Records after a held one stay buffered too (their partition's batches end before it).
            let after = core.buffered();
            if records + after > 0 {
                tracing::warn!(
                    transactions = txs,
                    records,
                    after,
                    "source transactions still incomplete are not applied: the checkpoints stay before their \
                     records, the next start reads them again (counted `buffered`)"
                );
            }
            core.tally.buffered = (records + after) as u64;
        }
        r
    }

    fn report(&self, now: Instant, last_summary: &mut Instant) {
        let mut core = lock(&self.core);
        let core = &mut *core;
        if now.duration_since(core.published_at) >= PUBLISH_EVERY {
            core.published_at = now;
            core.publish();
        }
        if let Some(obs) = core.observer.as_mut() {
            obs.tick(&core.parts, &core.tally);
        }
        if let Some(every) = self.summary_interval {
            if now.duration_since(*last_summary) >= every {
                *last_summary = now;
                tracing::info!("{} (batches {})", core.tally.line(), core.batches);
            }
        }
    }
}
