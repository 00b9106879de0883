//! `replaysafe run`: the engine over the group source (see [`crate::source::group`] and [`crate::engine`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Pipeline;
use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::source::group::{self, Group};

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
    /// Set to end the database retries of the drain (`--shutdown-timeout` passed); `None`: `shutdown` ends them.
    pub give_up: Option<Arc<AtomicBool>>,
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
    /// Filled with the engine's state once it starts, for a report from outside the run (`run`'s
    /// `--shutdown-timeout` exit prints the accounting line from it: [`crate::engine::Reporter::tally`]).
    pub state: Option<Arc<std::sync::OnceLock<crate::engine::Reporter>>>,
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
    run_timed(rt, pipeline, opts).map(|(tally, _)| tally)
}

/// As [`run_on`], also returning the applying time: from the first record polled to the last checkpoint
/// commit (`None` when nothing committed), without the consumer-group join.
///
/// # Errors
/// As [`run`].
pub fn run_timed(
    rt: tokio::runtime::Handle,
    pipeline: Arc<Pipeline>,
    opts: RunOptions,
) -> Result<(Tally, Option<Duration>)> {
    let mut o = Options::new(&opts.database_url, opts.shutdown.clone());
    o.give_up = opts.give_up.clone();
    o.summary_interval = Some(opts.summary_interval);
    o.crash_after_batches = opts.crash_after_batches;
    o.prune_interval = Some(opts.prune_interval);
    let config = group::config(&pipeline, &opts.brokers, &opts.extra_properties);
    // The brokers answer (within --connect-timeout) before any table is created.
    crate::source::kafka::reachable(&config, &opts.brokers, &pipeline.kafka.topics[0])?;
    // A misspelled topic is refused before the database is touched (nothing created).
    crate::ops::check::require_topics(&pipeline, &opts.brokers, &opts.extra_properties)?;
    // Kafka keeping records longer than the ledger remembers them is warned about (docs/replay.md "The ledger's
    // lifecycle").
    crate::ops::ledger::warn_retention(&pipeline, &opts.brokers);
    let engine = Engine::start(&rt, pipeline.clone(), o)?;
    if let Some(state) = &opts.state {
        let _ = state.set(engine.reporter());
    }
    let source = Group::subscribe(engine.shared(), config, opts.until_caught_up)?;
    engine.run_timed(source)
}
