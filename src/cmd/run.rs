//! `replaysafe run`: consume, land idempotently, project, checkpoint, commit offsets.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use replaysafe::error::EXIT_SHUTDOWN_TIMEOUT;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url};
use crate::cmd::signals;

/// `run`'s arguments.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The pipeline file (TOML; see reference.toml).
    #[arg(short, long)]
    pub config: PathBuf,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Exit 0 once every assigned partition is caught up and applied (for batch jobs and tests).
    #[arg(long)]
    pub until_caught_up: bool,
    /// Seconds between summary log lines.
    #[arg(long, default_value_t = 10)]
    pub summary_interval: u64,
    /// Seconds between ledger prunes while running (dropping day partitions older than the horizon; also
    /// done on start).
    #[arg(long, default_value_t = 3600)]
    pub prune_interval: u64,
    /// Seconds a SIGINT/SIGTERM drain (apply and commit what is buffered, leave the group) may take; past
    /// it `run` exits with code 4 (what was committed stays; the rest is read again on restart).
    #[arg(long, default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Issue no DDL (as `[postgres] manage-schema = false`): the tables and the ledger's day partitions must
    /// exist (`init` by their owner); a batch needing a missing partition stops uncommitted, naming it; no
    /// prune (the owner's `init` prunes). docs/operations.md "Privileges".
    #[arg(long)]
    pub no_ddl: bool,
    /// Also relay the pipeline's outbox to `[outbox] topic` in this process (docs/reference.md "Outbox relay");
    /// with --until-caught-up the rows left are published before the exit (within --shutdown-timeout).
    #[arg(long)]
    pub relay: bool,
}

/// Runs the pipeline until a signal (or caught up), then prints the accounting line.
///
/// # Errors
/// The pipeline file's errors and what stopped the run (its exit code: docs/operations.md "Exit codes").
pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        config,
        brokers: flag,
        metrics_addr,
        until_caught_up,
        summary_interval,
        prune_interval,
        shutdown_timeout,
        no_ddl,
        relay,
    } = a;
    let mut p = config::load(&config)?;
    p.postgres.manage_schema &= !no_ddl;
    let p = Arc::new(p);
    let opts = ops::run::RunOptions {
        brokers: brokers(&p, flag)?,
        database_url: database_url(&p)?,
        until_caught_up,
        shutdown: Arc::new(AtomicBool::new(false)),
        give_up: Some(Arc::new(AtomicBool::new(false))),
        summary_interval: Duration::from_secs(summary_interval.max(1)),
        crash_after_batches: None,
        extra_properties: Vec::new(),
        prune_interval: Duration::from_secs(prune_interval.max(1)),
        state: Some(Arc::default()),
    };
    signals_with_deadline(
        opts.shutdown.clone(),
        opts.give_up.clone().expect("set above"),
        opts.state.clone().expect("set above"),
        Duration::from_secs(shutdown_timeout),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(addr) = metrics_addr {
        let _guard = rt.enter();
        replaysafe::metrics_http::install(addr, &replaysafe::metrics_http::labels(&p))?;
        replaysafe::metrics_http::register(&p);
        replaysafe::sink::probe::spawn_probe(rt.handle(), p.clone(), opts.database_url.clone());
        replaysafe::db_gauges::spawn(rt.handle(), p.clone(), opts.database_url.clone());
    }
    let beside = match relay {
        true => Some(ops::outbox::Beside::start(
            rt.handle(),
            p.clone(),
            &relay_options(&opts),
        )?),
        false => None,
    };
    let tally = ops::run::run_on(rt.handle().clone(), p, opts.clone());
    let relayed = beside.map(|b| {
        let drain = tally.is_ok() && !opts.shutdown.load(Ordering::Relaxed);
        b.finish(rt.handle(), drain, Duration::from_secs(shutdown_timeout))
    });
    let tally = tally.context("run failed")?;
    println!("{}", tally.line());
    // The consumer's accounting stands; a relay that could not publish what was left is an error of its own.
    if let Some(n) = relayed.transpose().context("outbox relay")? {
        tracing::info!(published = n, "outbox relay stopped");
    }
    Ok(())
}

/// `run --relay`: the relay's options from `run`'s.
fn relay_options(opts: &ops::run::RunOptions) -> ops::outbox::RelayOptions {
    ops::outbox::RelayOptions {
        brokers: opts.brokers.clone(),
        database_url: opts.database_url.clone(),
        outbox: None,
        topic: None,
        until_empty: false,
        shutdown: opts.shutdown.clone(),
    }
}

/// `run`'s signal handling: the first SIGINT/SIGTERM starts the drain (`shutdown`); if the process is still
/// running `timeout` later, the drain's database retries are ended (`give_up`), the accounting line so far is
/// printed (records not confirmed applied counted `buffered`: [`replaysafe::engine::Reporter::tally`]) and the process
/// exits with [`EXIT_SHUTDOWN_TIMEOUT`].
fn signals_with_deadline(
    shutdown: Arc<AtomicBool>,
    give_up: Arc<AtomicBool>,
    state: Arc<std::sync::OnceLock<replaysafe::engine::Reporter>>,
    timeout: Duration,
) {
    let fired = Arc::new(AtomicBool::new(false));
    signals(fired.clone());
    std::thread::spawn(move || {
        while !fired.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        shutdown.store(true, Ordering::Relaxed);
        std::thread::sleep(timeout);
        give_up.store(true, Ordering::Relaxed);
        tracing::error!(
            timeout_s = timeout.as_secs(),
            "the drain did not finish within --shutdown-timeout (a batch still waiting for the database?): \
             exiting with code {EXIT_SHUTDOWN_TIMEOUT}; what was committed stays, records not applied yet \
             (`buffered`) are read again from the checkpoints on restart"
        );
        // Bounded: when the loop itself is stuck holding the state, the accounting it last published.
        match state.get() {
            Some(r) => println!("{}", r.tally(Duration::from_secs(1)).line()),
            None => tracing::error!("no accounting line: the engine had not started"),
        }
        std::process::exit(EXIT_SHUTDOWN_TIMEOUT);
    });
}
