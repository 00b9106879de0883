//! The `replaysafe` binary: parses the command line ([`cli`]), sets up logging, dispatches to the command,
//! maps errors to exit codes (see README "Exit codes") and prints the error chain.

mod cli;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use cli::{
    brokers, database_url, read_json, write_json, Cli, Command, OffsetsCommand, VerifyCommand,
};
use replaysafe::error::{Error, EXIT_FAILURE, EXIT_OK, EXIT_SHUTDOWN_TIMEOUT};
use replaysafe::ops::{self, backfill::Report};
use replaysafe::{config, sink};

fn signals(flag: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("signal runtime");
        rt.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("signal received: finishing in-flight batches");
            flag.store(true, Ordering::Relaxed);
        });
    });
}

/// `run`'s signal handling: the first SIGINT/SIGTERM starts the drain (`shutdown`); if the process is still
/// running `timeout` later, the drain's database retries are ended (`give_up`) and the process exits with
/// [`EXIT_SHUTDOWN_TIMEOUT`].
fn signals_with_deadline(shutdown: Arc<AtomicBool>, give_up: Arc<AtomicBool>, timeout: Duration) {
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
             exiting with code {EXIT_SHUTDOWN_TIMEOUT}; what was committed stays, records not applied yet are \
             read again from the checkpoints on restart"
        );
        std::process::exit(EXIT_SHUTDOWN_TIMEOUT);
    });
}

fn check(config: PathBuf) -> anyhow::Result<()> {
    let p = config::load(&config)?;
    println!("{}: valid\n\n{}", config.display(), p.four_answers());
    Ok(())
}

fn init(config: PathBuf) -> anyhow::Result<()> {
    let p = config::load(&config)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        sink::schema::init(&mut client, &p).await
    })?;
    println!(
        "{}: tables ready in schema {}",
        config.display(),
        p.postgres.schema
    );
    Ok(())
}

fn run(
    config: PathBuf,
    flag: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    until_caught_up: bool,
    (summary_interval, prune_interval, shutdown_timeout): (u64, u64, u64),
) -> anyhow::Result<()> {
    let p = Arc::new(config::load(&config)?);
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
    };
    signals_with_deadline(
        opts.shutdown.clone(),
        opts.give_up.clone().expect("set above"),
        Duration::from_secs(shutdown_timeout),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(addr) = metrics_addr {
        let _guard = rt.enter();
        replaysafe::metrics_http::install(addr)?;
        replaysafe::health::spawn_probe(rt.handle(), p.clone(), opts.database_url.clone());
    }
    let tally = ops::run::run_on(rt.handle().clone(), p, opts).context("run failed")?;
    println!("{}", tally.line());
    Ok(())
}

fn load(
    config: PathBuf,
    (group, take_over): (Option<String>, bool),
    flag: Option<String>,
    file: PathBuf,
) -> anyhow::Result<()> {
    let p = Arc::new(config::load(&config)?);
    let opts = ops::load::LoadOptions {
        database_url: database_url(&p)?,
        group,
        take_over,
        brokers: brokers(&p, flag).ok(),
        shutdown: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.shutdown.clone());
    let tally = ops::load::load(p, &file, opts).context("load failed")?;
    println!("{}", tally.line());
    Ok(())
}

fn backfill(a: cli::BackfillArgs) -> anyhow::Result<()> {
    let output = a.output.clone();
    let (r, opts) = a.options()?;
    signals(r.shutdown.clone());
    let report =
        ops::backfill::backfill(r.pipeline, &r.brokers, &r.database_url, &opts, r.shutdown)?;
    eprintln!("{}", report.accounting);
    write_json(&report, output.as_ref())
}

fn rebuild(a: cli::RebuildArgs) -> anyhow::Result<()> {
    let output = a.output.clone();
    let (r, opts) = a.options()?;
    signals(r.shutdown.clone());
    let report = ops::rebuild::rebuild(r.pipeline, &r.brokers, &r.database_url, &opts, r.shutdown)?;
    eprintln!("{}", report.accounting);
    write_json(&report, output.as_ref())?;
    // A day that ends with fewer ledger rows than it had: exit 1 (the report says which rows).
    match report.rebuild_shortfall() {
        Some(msg) => Err(Error::Other(msg).into()),
        None => Ok(()),
    }
}

fn verify(command: VerifyCommand) -> anyhow::Result<()> {
    match command {
        VerifyCommand::Snapshot {
            config,
            table,
            filter,
            output,
        } => {
            let snap = ops::verify::snapshot(&config, &table, filter.as_deref())?;
            write_json(&snap, Some(&output))
        }
        VerifyCommand::Diff { before, expect } => {
            let before: ops::verify::Snapshot = read_json(&before)?;
            let report: Report = read_json(&expect)?;
            let (mismatches, table) = ops::verify::diff(&before, &report)?;
            print!("{table}");
            if mismatches.is_empty() {
                println!("verified: every day changed by exactly what the backfill landed");
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "{} day(s) differ from the backfill report",
                    mismatches.len()
                ))
            }
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Check { config } => check(config),
        Command::Init { config } => init(config),
        Command::Run {
            config,
            brokers,
            metrics_addr,
            until_caught_up,
            summary_interval,
            prune_interval,
            shutdown_timeout,
        } => run(
            config,
            brokers,
            metrics_addr,
            until_caught_up,
            (summary_interval, prune_interval, shutdown_timeout),
        ),
        Command::Load {
            config,
            group_id,
            take_over,
            brokers,
            file,
        } => load(config, (group_id, take_over), brokers, file),
        Command::Offsets {
            command:
                OffsetsCommand::Snapshot {
                    config,
                    group,
                    output,
                    brokers: flag,
                },
        } => {
            let p = config::load(&config)?;
            let snap = ops::offsets::snapshot(&p, &brokers(&p, flag)?, &database_url(&p)?, &group)?;
            write_json(&snap, output.as_ref())
        }
        Command::Backfill(a) => backfill(a),
        Command::Rebuild(a) => rebuild(a),
        Command::Verify { command } => verify(command),
        Command::Demo { brokers, events } => {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| replaysafe::demo::DEFAULT_DATABASE_URL.to_string());
            replaysafe::demo::demo(brokers, &url, events)?;
            Ok(())
        }
    }
}

/// Logs go to stderr (`REPLAYSAFE_LOG`, default `info,tokio_postgres=warn`); the demo's go to the file
/// [`replaysafe::demo::log_path`] so that its narrative on stdout reads as one story.
fn logging(cli: &Cli) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("REPLAYSAFE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"))
    };
    if matches!(cli.command, Command::Demo { .. }) {
        let path = replaysafe::demo::log_path();
        if let Ok(file) = std::fs::File::create(&path) {
            tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false)
                .init();
            return;
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() {
    let cli = Cli::parse();
    logging(&cli);
    // REPLAYSAFE_FAILPOINTS="name=action;…" (the `fail` crate's syntax), test builds only.
    #[cfg(feature = "failpoints")]
    if let Ok(spec) = std::env::var("REPLAYSAFE_FAILPOINTS") {
        for part in spec.split(';').filter(|s| !s.is_empty()) {
            if let Some((name, action)) = part.split_once('=') {
                fail::cfg(name, action).expect("valid failpoint spec");
            }
        }
    }
    let code = match execute(cli) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let code = e
                .chain()
                .find_map(|c| c.downcast_ref::<Error>())
                .map_or(EXIT_FAILURE, Error::exit_code);
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            code
        }
    };
    std::process::exit(code);
}
