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
        /// Seconds between ledger prunes while running (dropping day partitions older than the horizon; also
        /// done on start).
        #[arg(long, default_value_t = 3600)]
        prune_interval: u64,
    },
    /// Apply the records of a file in `kcat -C -J` format (one JSON envelope per line) through the same
    /// decode → batch → transaction → checkpoint path as `run`, without a broker; exit 0 when the whole file is
    /// applied, 1 on a bad line or runtime failure (earlier lines stay applied; a rerun resumes), 2 when the file
    /// cannot be opened or the database does not match.
    Load {
        /// The pipeline file (its fields, projections and database; `[kafka] topics` must name the file's topics).
        #[arg(short, long)]
        config: PathBuf,
        /// Checkpoints, ledger and dead-letter rows under this consumer group (default: the pipeline's).
        #[arg(long)]
        group_id: Option<String>,
        /// The records: `kcat -C -J -e -b BROKERS -t TOPIC > FILE`.
        file: PathBuf,
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
    /// Another group's positions, read without joining it.
    Offsets {
        #[command(subcommand)]
        command: OffsetsCommand,
    },
    /// Replay a window of the topic through the same idempotent path as `run`.
    Backfill(BackfillArgs),
    /// Zero a window of event days in the aggregates and the ledger, then replay it under a fresh group.
    Rebuild(RebuildArgs),
    /// Check that an aggregate changed by exactly what a backfill reported.
    Verify {
        #[command(subcommand)]
        command: VerifyCommand,
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

#[derive(Subcommand)]
enum OffsetsCommand {
    /// Write the group's positions per partition as JSON (checkpoints in PostgreSQL win over Kafka's).
    Snapshot {
        /// The pipeline file (its topics and database).
        #[arg(short, long)]
        config: PathBuf,
        /// The group to read.
        #[arg(long)]
        group: String,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
}

#[derive(clap::Args)]
struct BackfillArgs {
    /// The pipeline file.
    #[arg(short, long)]
    config: PathBuf,
    /// Window start: RFC 3339 time or YYYY-MM-DD (UTC midnight), compared with record timestamps.
    #[arg(long)]
    from: String,
    /// Stop at the offsets in this snapshot file (`offsets snapshot`).
    #[arg(long, group = "stop")]
    to_offsets: Option<PathBuf>,
    /// Stop at this group's current positions.
    #[arg(long, group = "stop")]
    to_group: Option<String>,
    /// Stop at the first record at or after this time.
    #[arg(long, group = "stop")]
    to: Option<String>,
    /// Keep only records for which this CEL expression over the fields is true.
    #[arg(long)]
    filter: Option<String>,
    /// The backfill's own consumer group id (never the production group).
    #[arg(long)]
    group_id: String,
    /// Raise the topic's retention.ms when the window could expire during the run.
    #[arg(long)]
    ensure_retention: bool,
    /// Print the plan (start/stop offsets, retention check) and stop.
    #[arg(long)]
    dry_run: bool,
    /// A partition without a stop position: stop at its current end, skip it, or refuse.
    #[arg(long, value_enum, default_value = "error")]
    missing_stop: replaysafe::backfill::MissingStop,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    brokers: Option<String>,
}

#[derive(clap::Args)]
struct RebuildArgs {
    /// The pipeline file.
    #[arg(short, long)]
    config: PathBuf,
    /// First event day (YYYY-MM-DD).
    #[arg(long)]
    from: chrono::NaiveDate,
    /// Last event day (YYYY-MM-DD, inclusive).
    #[arg(long)]
    to: chrono::NaiveDate,
    /// A fresh group id for the replay.
    #[arg(long)]
    group_id: String,
    /// Confirms that every other writer of the projection tables is paused.
    #[arg(long)]
    i_paused_other_writers: bool,
    /// Hours of record time read before --from and after --to, to reach events never landed; landed events
    /// are re-read from the offsets the ledger holds for them, however late they arrived.
    #[arg(long, default_value_t = 24)]
    slack_hours: i64,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    brokers: Option<String>,
}

#[derive(Subcommand)]
enum VerifyCommand {
    /// Save a counter projection's rows.
    Snapshot {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// The counter projection's table.
        #[arg(long)]
        table: String,
        /// Only rows matching this SQL condition (run read-only), e.g. "day between '2026-07-01' and '2026-07-06'".
        #[arg(long = "where")]
        filter: Option<String>,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare the table now with a snapshot: per day, the change must equal what the backfill landed.
    Diff {
        /// The snapshot taken before the backfill.
        #[arg(long)]
        before: PathBuf,
        /// The backfill report.
        #[arg(long)]
        expect: PathBuf,
    },
}

fn parse_time(s: &str) -> anyhow::Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp_millis());
    }
    Err(Error::Usage(format!(
        "`{s}` is neither an RFC 3339 time nor a date (YYYY-MM-DD)"
    ))
    .into())
}

fn write_json<T: serde::Serialize>(value: &T, path: Option<&PathBuf>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    match path {
        Some(p) => {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &PathBuf) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{}: {e}", path.display())).into())
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
            prune_interval,
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
                prune_interval: Duration::from_secs(prune_interval.max(1)),
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
        Command::Load {
            config,
            group_id,
            file,
        } => {
            let p = Arc::new(config::load(&config)?);
            let opts = replaysafe::source_file::LoadOptions {
                database_url: database_url(&p)?,
                group: group_id,
                shutdown: Arc::new(AtomicBool::new(false)),
            };
            signals(opts.shutdown.clone());
            let tally = replaysafe::source_file::load(p, &file, opts).context("load failed")?;
            println!("{}", tally.line());
            Ok(())
        }
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
            let snap =
                replaysafe::offsets::snapshot(&p, &brokers(&p, flag)?, &database_url(&p)?, &group)?;
            write_json(&snap, output.as_ref())
        }
        Command::Backfill(a) => {
            let p = Arc::new(config::load(&a.config)?);
            let stop = match (a.to_offsets, a.to_group, a.to) {
                (Some(f), _, _) => replaysafe::backfill::StopSpec::Offsets(read_json(&f)?),
                (_, Some(g), _) => replaysafe::backfill::StopSpec::Group(g),
                (_, _, Some(t)) => replaysafe::backfill::StopSpec::Time(parse_time(&t)?),
                _ => {
                    return Err(Error::Usage(
                        "give the window's end: --to-offsets, --to-group or --to".into(),
                    )
                    .into())
                }
            };
            let opts = replaysafe::backfill::BackfillOptions {
                from_ms: parse_time(&a.from)?,
                stop,
                filter: a.filter,
                day_window: None,
                group_id: a.group_id,
                ensure_retention: a.ensure_retention,
                dry_run: a.dry_run,
                missing_stop: a.missing_stop,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                cover: Default::default(),
            };
            let shutdown = Arc::new(AtomicBool::new(false));
            signals(shutdown.clone());
            let report = replaysafe::backfill::backfill(
                p.clone(),
                &brokers(&p, a.brokers)?,
                &database_url(&p)?,
                &opts,
                shutdown,
            )?;
            eprintln!("{}", report.accounting);
            write_json(&report, a.output.as_ref())
        }
        Command::Rebuild(a) => {
            let p = Arc::new(config::load(&a.config)?);
            let opts = replaysafe::backfill::RebuildOptions {
                from: a.from,
                to: a.to,
                group_id: a.group_id,
                slack_hours: a.slack_hours,
                others_paused: a.i_paused_other_writers,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            let shutdown = Arc::new(AtomicBool::new(false));
            signals(shutdown.clone());
            let report = replaysafe::backfill::rebuild(
                p.clone(),
                &brokers(&p, a.brokers)?,
                &database_url(&p)?,
                &opts,
                shutdown,
            )?;
            eprintln!("{}", report.accounting);
            write_json(&report, a.output.as_ref())?;
            // A day that ends with fewer ledger rows than it had: exit 1 (the report says which rows).
            match report.rebuild_shortfall() {
                Some(msg) => Err(Error::Other(msg).into()),
                None => Ok(()),
            }
        }
        Command::Verify {
            command:
                VerifyCommand::Snapshot {
                    config,
                    table,
                    filter,
                    output,
                },
        } => {
            let snap = replaysafe::verify::snapshot(&config, &table, filter.as_deref())?;
            write_json(&snap, Some(&output))
        }
        Command::Verify {
            command: VerifyCommand::Diff { before, expect },
        } => {
            let before: replaysafe::verify::Snapshot = read_json(&before)?;
            let report: replaysafe::backfill::Report = read_json(&expect)?;
            let (mismatches, table) = replaysafe::verify::diff(&before, &report)?;
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
