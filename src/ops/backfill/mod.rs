//! `replaysafe backfill`: replay a window of the topic through the engine (the same idempotent batch path as
//! `run`: ledger claim + projections + checkpoint in one transaction) over the assign source.
//!
//! Partitions are assigned explicitly (no group subscription); each starts at the first offset at or after
//! `--from` (ListOffsets by timestamp, `offsets_for_times`) and stops before its stop offset (exclusive). The
//! checkpoint rows of the backfill's own group id make a second run of the same backfill a no-op.

mod lookup;
pub mod options;
pub(crate) mod plan;
pub mod report;
mod scan;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use chrono::DateTime;

use crate::config::Pipeline;
use crate::engine::{Engine, Extras, Options};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::source::assign::{Assign, Range};

pub use options::{BackfillOptions, MissingStop, PartitionPlan, StopSpec};
pub use plan::plan;
pub use report::{
    DayCounts, LedgerRows, MissingRow, PastTheStop, RebuildCheck, Report, MISSING_LISTED,
};
pub use scan::{PAST_STOP_SCAN_MS, PAST_STOP_SCAN_RECORDS};

/// Runs a backfill (or only plans it with `dry_run`) and returns its report.
///
/// # Errors
/// As [`plan`]; [`Error::Usage`] when `--filter` fails on a record (what came before is applied);
/// [`Error::Other`] when records of the window disappear during the run (retention), naming the lost range;
/// database and Kafka errors.
pub fn backfill(
    pipeline: Arc<Pipeline>,
    brokers: &str,
    database_url: &str,
    opts: &BackfillOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<Report> {
    let (plans, retention, stop) = plan(&pipeline, brokers, database_url, opts)?;
    // Kafka keeping records longer than the ledger remembers them: warned (docs/replay.md "The ledger's lifecycle").
    crate::ops::ledger::warn_retention(&pipeline, brokers);
    let mut report = Report {
        group_id: opts.group_id.clone(),
        pipeline_group: pipeline.kafka.group_id.clone(),
        from: DateTime::from_timestamp_millis(opts.from_ms)
            .unwrap_or_default()
            .to_rfc3339(),
        stop,
        filter: opts.filter.clone(),
        partitions: plans.clone(),
        retention,
        per_day: BTreeMap::new(),
        counts: report::COUNTS_COVER.to_string(),
        accounting: String::new(),
        dry_run: opts.dry_run,
        pipeline: Some(crate::ops::fingerprint::pipeline_fingerprint(&pipeline)),
        past_the_stop: Vec::new(),
        rebuild: None,
    };
    if opts.dry_run {
        report.accounting = Tally::default().line();
        return Ok(report);
    }
    let per_day = Arc::new(Mutex::new(BTreeMap::new()));
    let reached = report::Reached::default();
    let session = Session {
        per_day: &per_day,
        reached: &reached,
        notes: &mut report.retention,
        partitions: &mut report.partitions,
    };
    let signalled = shutdown.clone();
    let tally = match replay(&pipeline, brokers, database_url, opts, shutdown, session) {
        Ok(t) => t,
        Err(e) => {
            // Interrupted or failed: what this session applied and what is left, for the rerun.
            let how = if signalled.load(std::sync::atomic::Ordering::Relaxed) {
                "interrupted"
            } else {
                "stopped by an error"
            };
            tracing::warn!("{}", report::stopped(how, &report.partitions, &reached));
            return Err(e);
        }
    };
    report.per_day = report::per_day_report(&per_day);
    report.accounting = tally.line();
    if let StopSpec::Time(to) = opts.stop {
        // Information about records not in the window: a failure to read it never fails the applied backfill.
        match scan::past_the_stop(
            &pipeline,
            brokers,
            &opts.group_id,
            &report.partitions,
            opts.from_ms,
            to,
        ) {
            Ok(found) => report.past_the_stop = found,
            Err(e) => {
                let note = format!(
                    "reading past the stop offsets for out-of-order timestamps failed: {e}"
                );
                tracing::warn!("{note}");
                report.retention.push(note);
            }
        }
    }
    Ok(report)
}

/// What a session of the replay fills in: per-day counts and the offsets reached (shared with the engine's
/// observer), the report's notes, and its partitions (their start moved to where this session resumed).
struct Session<'a> {
    per_day: &'a report::PerDay,
    reached: &'a report::Reached,
    notes: &'a mut Vec<String>,
    partitions: &'a mut Vec<PartitionPlan>,
}

/// The engine over the assign source with the backfill's extras (`--filter`, a rebuild's day window, per-day
/// counts into `per_day`).
fn replay(
    pipeline: &Arc<Pipeline>,
    brokers: &str,
    database_url: &str,
    opts: &BackfillOptions,
    shutdown: Arc<AtomicBool>,
    s: Session<'_>,
) -> Result<Tally> {
    let plans = s.partitions.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut o = Options::new(database_url, shutdown);
    o.group = Some(opts.group_id.clone());
    o.prune_on_start = false;
    o.extras = Extras::new(pipeline, opts.filter.as_deref(), opts.day_window)?;
    o.observer = Some(Box::new(
        report::Progress::new(&plans, opts.progress, s.per_day.clone(), s.reached.clone())
            .with_sums(pipeline),
    ));
    let engine = Engine::start(rt.handle(), pipeline.clone(), o)?;
    let ranges = plans
        .iter()
        .map(|p| Range {
            tp: (p.topic.clone(), p.partition),
            start: p.start_offset,
            stop: p.stop_offset,
        })
        .collect();
    let group = &opts.group_id;
    let source = Assign::open(
        engine.shared(),
        brokers,
        group,
        ranges,
        s.notes,
        opts.keep_group,
    )?;
    report::resumed_at(s.partitions, source.starts());
    engine.run(source)
}
