//! `replaysafe backfill`: replay a window of the topic through the same idempotent path as `run`.

use std::path::PathBuf;

use replaysafe::error::Error;
use replaysafe::ops;
use replaysafe::ops::backfill::{BackfillOptions, StopSpec};

use crate::cmd::resolve::{parse_time, progress, read_json, write_json, Replay};
use crate::cmd::signals;

/// `backfill`'s arguments.
#[derive(clap::Args)]
pub struct BackfillArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Window start: RFC 3339 time or YYYY-MM-DD (UTC midnight), compared with record timestamps.
    #[arg(long)]
    pub from: String,
    /// Stop at the offsets in this snapshot file (`offsets snapshot`).
    #[arg(long, group = "stop")]
    pub to_offsets: Option<PathBuf>,
    /// Stop at this group's current positions.
    #[arg(long, group = "stop")]
    pub to_group: Option<String>,
    /// Stop at the first record at or after this time.
    #[arg(long, group = "stop")]
    pub to: Option<String>,
    /// Keep only records for which this CEL expression over the fields is true.
    #[arg(long)]
    pub filter: Option<String>,
    /// The backfill's own consumer group id (never the production group).
    #[arg(long)]
    pub group_id: String,
    /// Raise the topic's retention.ms when the window could expire during the run.
    #[arg(long)]
    pub ensure_retention: bool,
    /// Print the plan (start/stop offsets, retention check) and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// A partition without a stop position: stop at its current end, skip it, or refuse.
    #[arg(long, value_enum, default_value = "error")]
    pub missing_stop: replaysafe::ops::backfill::MissingStop,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Also commit the backfill group's offsets to Kafka (by default none are: the group never appears in
    /// Kafka; the checkpoints in PostgreSQL are what a rerun resumes from).
    #[arg(long)]
    pub keep_group: bool,
}

impl BackfillArgs {
    /// Resolves the arguments into a [`Replay`] and the backfill's options.
    ///
    /// # Errors
    /// The pipeline file's errors; [`Error::Usage`] for a missing window end or an unreadable time or stop file.
    pub fn options(self) -> anyhow::Result<(Replay, BackfillOptions)> {
        let replay = Replay::new(&self.config, self.brokers)?;
        let stop = match (self.to_offsets, self.to_group, self.to) {
            (Some(f), _, _) => StopSpec::Offsets(read_json(&f)?),
            (_, Some(g), _) => StopSpec::Group(g),
            (_, _, Some(t)) => StopSpec::Time(parse_time(&t)?),
            _ => {
                return Err(Error::Usage(
                    "give the window's end: --to-offsets, --to-group or --to".into(),
                )
                .into())
            }
        };
        let opts = BackfillOptions {
            from_ms: parse_time(&self.from)?,
            stop,
            filter: self.filter,
            day_window: None,
            group_id: self.group_id,
            ensure_retention: self.ensure_retention,
            dry_run: self.dry_run,
            missing_stop: self.missing_stop,
            progress: progress(),
            cover: Default::default(),
            keep_group: self.keep_group,
        };
        Ok((replay, opts))
    }
}

/// Replays the window, then writes the report.
///
/// # Errors
/// The pipeline file's errors and the backfill's refusals and failures.
pub fn run(a: BackfillArgs) -> anyhow::Result<()> {
    let output = a.output.clone();
    let (r, opts) = a.options()?;
    signals(r.shutdown.clone());
    let report =
        ops::backfill::backfill(r.pipeline, &r.brokers, &r.database_url, &opts, r.shutdown)?;
    eprintln!("backfill, this session: {}", report.accounting);
    write_json(&report, output.as_ref())
}
