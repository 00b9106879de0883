//! `replaysafe prove`: that replay is harmless for the pipeline, boundary by boundary, on a fixture of its records.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url};
use crate::cmd::signals;

/// `prove`'s arguments.
#[derive(clap::Args)]
pub struct ProveArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// The fixture: a file in `kcat -C -J` format (as `load` reads).
    #[arg(
        long,
        required_unless_present = "from_topic",
        conflicts_with = "from_topic"
    )]
    pub records: Option<PathBuf>,
    /// Take the fixture from this live topic instead (its first --max records, partitions in turn), on the
    /// pipeline's brokers (`[kafka] brokers` or KAFKA_BROKERS).
    #[arg(long, requires = "max")]
    pub from_topic: Option<String>,
    /// With --from-topic: records to take.
    #[arg(long)]
    pub max: Option<usize>,
    /// Run the scratch topics on this Kafka cluster (topics `<topic>.prove-<id>`, deleted at the end unless
    /// --keep) instead of the embedded mock cluster.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Keep the scratch schemas (`rsprove_<id>_<n>`) and --brokers topics (their names are printed).
    #[arg(long)]
    pub keep: bool,
    /// Random interleavings of the partitions tried (boundary 4).
    #[arg(long, default_value_t = 20)]
    pub shuffles: u32,
    /// Seed of the shuffles (default: from the clock; printed, so a failure can be rerun).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the report as JSON on stdout (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Exit code of `prove` when a boundary failed (docs/operations.md "Exit codes").
const EXIT_PROVE_FAILED: i32 = 6;

/// Runs the boundaries and prints the report; exits 6 when one fails.
///
/// # Errors
/// The pipeline file's errors and what stopped a boundary from running.
pub fn run(a: ProveArgs) -> anyhow::Result<()> {
    let ProveArgs {
        config,
        records,
        from_topic,
        max,
        brokers: scratch,
        keep,
        shuffles,
        seed,
        json,
    } = a;
    let p = config::load(&config)?;
    let fixture = match (records, from_topic) {
        (Some(file), _) => ops::prove::Fixture::File(file),
        (None, Some(topic)) => ops::prove::Fixture::Topic {
            brokers: brokers(&p, None)?,
            topic,
            max: max.unwrap_or(1000),
        },
        (None, None) => unreachable!("clap requires one"),
    };
    let opts = ops::prove::ProveOptions {
        fixture,
        database_url: database_url(&p)?,
        brokers: scratch,
        keep,
        shuffles,
        seed: seed.unwrap_or_else(|| chrono::Utc::now().timestamp_millis().unsigned_abs()),
        progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        interrupt: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.interrupt.clone());
    let report = ops::prove::prove(&config, opts).context("prove failed")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    if !report.passed {
        std::process::exit(EXIT_PROVE_FAILED);
    }
    Ok(())
}
