//! `replaysafe load`: the records of a `kcat -C -J` file through the same path as `run`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url};
use crate::cmd::signals;

/// `load`'s arguments.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// The pipeline file (its fields, projections and database; `[kafka] topics` must name the file's topics).
    #[arg(short, long)]
    pub config: PathBuf,
    /// Checkpoints and dead-letter rows under this consumer group (default:
    /// `replaysafe-load-<file stem>-<8 hex digits of the SHA-256 of the file's absolute path>`: rerunning the
    /// same file resumes). The pipeline's own `[kafka] group-id` is refused without --take-over.
    #[arg(long)]
    pub group_id: Option<String>,
    /// Write the pipeline's own group's checkpoints (`[kafka] group-id`), as if its `run` had read the file:
    /// stop that `run` first (it would be fenced; a running one takes its partitions back and this load
    /// fails), and only with a dump of the live topic — the broker must answer and every partition's offsets
    /// must be below its end.
    #[arg(long, conflicts_with = "group_id")]
    pub take_over: bool,
    /// Kafka bootstrap servers to check the file's offsets against the live topic's end; overrides the file
    /// and KAFKA_BROKERS. Without any, a load under its own group is not checked (warned).
    #[arg(long)]
    pub brokers: Option<String>,
    /// A line whose bytes are not UTF-8 (kcat copies a binary key or value unescaped) is quarantined as
    /// `undecodable-value` — the dead letter's value is the whole line — instead of stopping the load there.
    #[arg(long)]
    quarantine_invalid_utf8: bool,
    /// The records: `kcat -C -J -e -b BROKERS -t TOPIC -X isolation.level=read_committed > FILE`.
    pub file: PathBuf,
}

/// Applies the file's records, then prints the accounting line.
///
/// # Errors
/// The pipeline file's errors, a bad line or a runtime failure (earlier lines stay applied).
pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    let LoadArgs {
        config,
        group_id: group,
        take_over,
        brokers: flag,
        quarantine_invalid_utf8,
        file,
    } = a;
    let p = Arc::new(config::load(&config)?);
    let opts = ops::load::LoadOptions {
        database_url: database_url(&p)?,
        group,
        take_over,
        quarantine_invalid_utf8,
        brokers: brokers(&p, flag).ok(),
        shutdown: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.shutdown.clone());
    let tally = ops::load::load(p, &file, opts).context("load failed")?;
    println!("{}", tally.line());
    Ok(())
}
