//! The `replaysafe` binary: parses the command line, sets up logging, runs a command, maps errors to exit
//! codes (see README "Exit codes") and prints the error chain.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use replaysafe::error::{Error, EXIT_FAILURE, EXIT_OK};
use replaysafe::{config, run, sink};

/// Consume Apache Kafka into PostgreSQL so that replaying anything is harmless.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pipeline: consume, land idempotently, project, checkpoint, commit offsets.
    Run {
        /// The pipeline file (TOML; see reference.toml).
        #[arg(short, long)]
        config: PathBuf,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
        /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464).
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
        /// Exit 0 once every assigned partition is caught up and applied (for batch jobs and tests).
        #[arg(long)]
        until_caught_up: bool,
        /// Seconds between summary log lines.
        #[arg(long, default_value_t = 10)]
        summary_interval: u64,
    },
    /// Validate the pipeline file and print the four answers; exit 0 when valid, 2 when not.
    Check {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Create or upgrade the tables the pipeline needs (run does this too), then check them.
    Init {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Self-contained walk-through: first run, full replay under a fresh group, crash between database commit
    /// and offset commit — the counts stay identical.
    Demo {
        /// Use this Kafka cluster instead of librdkafka's in-process mock cluster. The demo (re)creates the
        /// PostgreSQL schema `replaysafe_demo` (DATABASE_URL, or the local default).
        #[arg(long)]
        brokers: Option<String>,
        /// Events to generate.
        #[arg(long, default_value_t = 600)]
        events: usize,
    },
}

fn database_url(p: &config::Pipeline) -> anyhow::Result<String> {
    p.postgres
        .url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .ok_or_else(|| Error::Config {
            location: p.source.locate(0),
            message: "no database: set [postgres] url or DATABASE_URL".into(),
        })
        .map_err(Into::into)
}

fn brokers(p: &config::Pipeline, flag: Option<String>) -> anyhow::Result<String> {
    flag.or_else(|| p.kafka.brokers.clone())
        .or_else(|| std::env::var("KAFKA_BROKERS").ok())
        .ok_or_else(|| Error::Config {
            location: p.source.locate(0),
            message: "no Kafka brokers: set [kafka] brokers, KAFKA_BROKERS or --brokers".into(),
        })
        .map_err(Into::into)
}

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

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Check { config } => {
            let p = config::load(&config)?;
            println!("{}: valid\n\n{}", config.display(), p.four_answers());
            Ok(())
        }
        Command::Init { config } => {
            let p = config::load(&config)?;
            let url = database_url(&p)?;
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async {
                let mut client = sink::connect(&url).await?;
                sink::schema::init(&mut client, &p).await
            })?;
            println!(
                "{}: tables ready in schema {}",
                config.display(),
                p.postgres.schema
            );
            Ok(())
        }
        Command::Run {
            config,
            brokers: flag,
            metrics_addr,
            until_caught_up,
            summary_interval,
        } => {
            let p = Arc::new(config::load(&config)?);
            let opts = run::RunOptions {
                brokers: brokers(&p, flag)?,
                database_url: database_url(&p)?,
                until_caught_up,
                shutdown: Arc::new(AtomicBool::new(false)),
                summary_interval: Duration::from_secs(summary_interval.max(1)),
                crash_after_batches: None,
                extra_properties: Vec::new(),
            };
            signals(opts.shutdown.clone());
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            if let Some(addr) = metrics_addr {
                let _guard = rt.enter();
                replaysafe::metrics_http::install(addr)?;
            }
            let tally = run::run_on(rt.handle().clone(), p, opts).context("run failed")?;
            println!("{}", tally.line());
            Ok(())
        }
        Command::Demo { brokers, events } => {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| replaysafe::demo::DEFAULT_DATABASE_URL.to_string());
            replaysafe::demo::demo(brokers, &url, events)?;
            Ok(())
        }
    }
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REPLAYSAFE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
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
