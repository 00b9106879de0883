//! `replaysafe rebuild`: zero a window of event days in the aggregates and the ledger, then replay it.

use std::path::PathBuf;

use replaysafe::error::Error;
use replaysafe::ops;
use replaysafe::ops::rebuild::RebuildOptions;

use crate::cmd::resolve::{progress, write_json, Replay};
use crate::cmd::signals;

/// `rebuild`'s arguments.
#[derive(clap::Args)]
pub struct RebuildArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// First event day (YYYY-MM-DD).
    #[arg(long)]
    pub from: chrono::NaiveDate,
    /// Last event day (YYYY-MM-DD, inclusive).
    #[arg(long)]
    pub to: chrono::NaiveDate,
    /// A fresh group id for the replay.
    #[arg(long)]
    pub group_id: String,
    /// Confirms that every other writer of the projection tables is paused.
    #[arg(long)]
    pub i_paused_other_writers: bool,
    /// Hours of record time read before --from and after --to, to reach events never landed; landed events
    /// are re-read from the offsets the ledger holds for them, however late they arrived.
    #[arg(long, default_value_t = 24)]
    pub slack_hours: i64,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
}

impl RebuildArgs {
    /// Resolves the arguments into a [`Replay`] and the rebuild's options.
    ///
    /// # Errors
    /// The pipeline file's errors.
    pub fn options(self) -> anyhow::Result<(Replay, RebuildOptions)> {
        let replay = Replay::new(&self.config, self.brokers)?;
        let opts = RebuildOptions {
            from: self.from,
            to: self.to,
            group_id: self.group_id,
            slack_hours: self.slack_hours,
            others_paused: self.i_paused_other_writers,
            progress: progress(),
        };
        Ok((replay, opts))
    }
}

/// Rebuilds the window, then writes the report.
///
/// # Errors
/// The pipeline file's errors, the rebuild's refusals and failures, and a day left with fewer ledger rows.
pub fn run(a: RebuildArgs) -> anyhow::Result<()> {
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
