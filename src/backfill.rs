//! `replaysafe backfill` and `replaysafe rebuild`: replay a window of the topic through the same idempotent
//! batch path as `run` (ledger claim + projections + checkpoint in one transaction).
//!
//! Partitions are assigned explicitly (no group subscription); each starts at the first offset at or after
//! `--from` (ListOffsets by timestamp, `offsets_for_times`) and stops before its stop offset (exclusive). The
//! checkpoint rows of the backfill's own group id make a second run of the same backfill a no-op.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

use crate::apply::{apply_batch, Applied};
use crate::config::Pipeline;
use crate::decode;
use crate::error::{Error, Result};
use crate::filter;
use crate::ident::{Ident, QualifiedName};
use crate::offsets::{self, StopFile};
use crate::sink::{checkpoint, ledger, schema, Batch, Item, Outcome, Pending, Sink, Tally};

/// Where the window ends.
#[derive(Debug, Clone)]
pub enum StopSpec {
    /// A snapshot file (`offsets snapshot`).
    Offsets(StopFile),
    /// Another group's positions, read now.
    Group(String),
    /// The first offset at or after this time (ms since the epoch), or the end captured with the lookup.
    Time(i64),
}

/// What to do with a partition that has no stop position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingStop {
    /// Stop at the partition's end as captured when planning.
    End,
    /// Leave the partition out.
    Skip,
    /// Refuse to start.
    Error,
}

/// Options of a backfill.
#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Window start, ms since the Unix epoch (record timestamps).
    pub from_ms: i64,
    /// Window end.
    pub stop: StopSpec,
    /// Keep only records for which this CEL expression is true (others are `filtered` by rule `--filter`).
    pub filter: Option<String>,
    /// Keep only records whose partition-by day lies in this window (rebuild).
    pub day_window: Option<(NaiveDate, NaiveDate)>,
    /// The backfill's own consumer group id (checkpoints, Kafka commits).
    pub group_id: String,
    /// Raise the topic's `retention.ms` when the window is close to expiring.
    pub ensure_retention: bool,
    /// Plan and print only.
    pub dry_run: bool,
    /// Policy for partitions without a stop position.
    pub missing_stop: MissingStop,
    /// Show a progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Offsets the replay must read whatever the times say, per `(topic, partition)`: `(lowest, highest)`,
    /// both inclusive (rebuild: where the window's ledger rows came from). Empty for a plain backfill.
    pub cover: BTreeMap<(String, i32), (i64, i64)>,
}

/// One partition of the plan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartitionPlan {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset to read.
    pub start_offset: i64,
    /// Stop offset (exclusive): next offset to read after the window.
    pub stop_offset: i64,
    /// How the start was found (`time`, `end-at-lookup`, `empty`, `checkpoint`; `ledger` when a rebuild's
    /// ledger rows lie below the time-based start).
    pub start_from: String,
}

/// Per-day outcome counts of a backfill.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DayCounts {
    /// Newly claimed and projected.
    pub landed: u64,
    /// Already in the ledger, or a row projection already holds that state.
    pub duplicate: u64,
    /// Claimed, but a row projection holds a newer version (or the same version with another state).
    #[serde(default)]
    pub stale: u64,
    /// Dropped by `--filter` or a pipeline filter rule.
    pub filtered: u64,
    /// Dead-lettered.
    pub quarantined: u64,
}

/// The backfill report (`-o report.json`; read by `verify diff --expect`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The backfill group id.
    pub group_id: String,
    /// The pipeline's production group.
    pub pipeline_group: String,
    /// Window start (RFC 3339).
    pub from: String,
    /// How the stop offsets were chosen.
    pub stop: String,
    /// The `--filter` expression.
    pub filter: Option<String>,
    /// Exact start/stop offsets used.
    pub partitions: Vec<PartitionPlan>,
    /// Retention findings and actions.
    pub retention: Vec<String>,
    /// Per partition-by day (`YYYY-MM-DD`, or `unknown` for undecodable records): the outcomes of the records
    /// this run consumed — the same outcomes as `accounting` (a resumed backfill: this session's records).
    pub per_day: BTreeMap<String, DayCounts>,
    /// The accounting line.
    pub accounting: String,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// `--to TIME` only: partitions where records after the stop offset carry a timestamp inside the window
    /// (out-of-order timestamps); they were not applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub past_the_stop: Vec<PastTheStop>,
    /// Rebuild only: the window's ledger rows per day before and after, and the rows that did not come back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildCheck>,
}

/// Records after a partition's `--to TIME` stop whose timestamps lie in `[--from, --to)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PastTheStop {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset read past the stop (the stop offset).
    pub scanned_from: i64,
    /// End of the scan (exclusive).
    pub scanned_to: i64,
    /// Records in the scanned range with a timestamp inside the window (not applied).
    pub earlier: u64,
}

/// Ledger rows of a rebuild's window of event days.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RebuildCheck {
    /// Per event day (`YYYY-MM-DD`): ledger rows before the rebuild deleted them, and after the replay.
    pub per_day: BTreeMap<String, LedgerRows>,
    /// Ledger rows of the window that the replay did not bring back (first [`MISSING_LISTED`]).
    pub missing: Vec<MissingRow>,
    /// How many ledger rows of the window did not come back.
    pub missing_total: u64,
}

/// Ledger rows of one day.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LedgerRows {
    /// Rows before the rebuild.
    pub before: u64,
    /// Rows after the replay.
    pub after: u64,
}

/// A ledger row deleted by a rebuild that the replay did not claim again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MissingRow {
    /// Event day.
    pub day: String,
    /// The delivery key (generation first), as stored.
    pub key: Vec<String>,
    /// Where it had come from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// How many missing rows a rebuild report lists by name.
pub const MISSING_LISTED: usize = 100;

impl Report {
    /// Rebuild only: `Some(message)` when a day of the window ends with fewer ledger rows than it had, naming
    /// the days and the first rows that did not come back.
    pub fn rebuild_shortfall(&self) -> Option<String> {
        let check = self.rebuild.as_ref()?;
        let short: Vec<String> = check
            .per_day
            .iter()
            .filter(|(_, r)| r.after < r.before)
            .map(|(d, r)| format!("{d}: {} before, {} after", r.before, r.after))
            .collect();
        if short.is_empty() && check.missing_total == 0 {
            return None;
        }
        let named: Vec<String> = check
            .missing
            .iter()
            .take(10)
            .map(|m| {
                format!(
                    "{} key {} from {}/{} offset {}",
                    m.day,
                    m.key.join("|"),
                    m.topic,
                    m.partition,
                    m.offset
                )
            })
            .collect();
        Some(format!(
            "the rebuild did not bring back {} ledger row(s) of the window ({}); first: {}; see `rebuild.missing` \
             in the report and the per-day filtered/quarantined counts",
            check.missing_total,
            if short.is_empty() { "no day ended short".to_string() } else { short.join(", ") },
            named.join(", ")
        ))
    }
}

/// Marks a record on which `--filter` failed to evaluate; the backfill stops before applying it.
const FILTER_FAILED: &str = "\u{0}--filter failed: ";

fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

fn lookup_times(
    consumer: &BaseConsumer,
    parts: &[(String, i32)],
    ts: i64,
) -> Result<BTreeMap<(String, i32), Offset>> {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition_offset(t, *p, Offset::Offset(ts))?;
    }
    let got = consumer.offsets_for_times(tpl, Duration::from_secs(30))?;
    Ok(got
        .elements()
        .iter()
        .map(|e| ((e.topic().to_string(), e.partition()), e.offset()))
        .collect())
}

/// Plans the window: start and stop offsets per partition, checks retention and the ledger horizon.
///
/// # Errors
/// [`Error::Usage`] for refused options; [`Error::Other`] when the window's oldest records are gone.
pub fn plan(
    pipeline: &Pipeline,
    brokers: &str,
    database_url: &str,
    opts: &BackfillOptions,
) -> Result<(Vec<PartitionPlan>, Vec<String>, String)> {
    if opts.group_id == pipeline.kafka.group_id {
        return Err(usage(format!(
            "--group-id {} is the pipeline's production group: a backfill must use its own group id",
            opts.group_id
        )));
    }
    if let Some(f) = &opts.filter {
        pipeline
            .compile_filter(f)
            .map_err(|m| usage(format!("--filter: {m}")))?;
    }
    if opts.from_ms < 0 {
        return Err(usage(
            "--from must be after 1970-01-01 (Kafka record timestamps start there)".into(),
        ));
    }
    if let StopSpec::Time(to) = opts.stop {
        if to < opts.from_ms {
            return Err(usage("--to is before --from: the window is empty".into()));
        }
    }
    if let StopSpec::Offsets(f) = &opts.stop {
        let mut seen = std::collections::HashSet::new();
        for e in &f.partitions {
            if e.next_offset.is_some_and(|o| o < 0) {
                return Err(usage(format!(
                    "stop file: {}/{} has a negative next_offset",
                    e.topic, e.partition
                )));
            }
            if !seen.insert((e.topic.clone(), e.partition)) {
                return Err(usage(format!(
                    "stop file: {}/{} is listed twice",
                    e.topic, e.partition
                )));
            }
            if !pipeline.kafka.topics.contains(&e.topic) {
                return Err(usage(format!(
                    "stop file: topic {} is not one of the pipeline's topics",
                    e.topic
                )));
            }
        }
    }
    let stop_group = match &opts.stop {
        StopSpec::Offsets(f) => Some(f.group.clone()),
        StopSpec::Group(g) => Some(g.clone()),
        StopSpec::Time(_) => None,
    };
    if stop_group.as_deref() == Some(opts.group_id.as_str()) {
        return Err(usage(format!(
            "--group-id {} is the group the stop offsets come from",
            opts.group_id
        )));
    }
    if let (Some(h), Some(from)) = (
        ledger::horizon_start(pipeline),
        DateTime::from_timestamp_millis(opts.from_ms),
    ) {
        if opts.day_window.is_none() && from.date_naive() < h {
            return Err(usage(format!(
                "the window starts {} but the ledger horizon only covers days from {h}: duplicates older than that \
                 cannot be recognised; start the window at {h} or later, or `replaysafe rebuild` the days from {h}",
                from.date_naive()
            )));
        }
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", &opts.group_id)
        .create()?;
    let parts = offsets::partitions(&consumer, &pipeline.kafka.topics)?;
    // Ends captured before the lookups: "End" means the end as it was at the lookup (case C15).
    let mut marks = BTreeMap::new();
    for (t, p) in &parts {
        marks.insert(
            (t.clone(), *p),
            consumer.fetch_watermarks(t, *p, Duration::from_secs(30))?,
        );
    }
    let starts = lookup_times(&consumer, &parts, opts.from_ms)?;
    let (stops, stop_desc): (BTreeMap<(String, i32), Option<i64>>, String) = match &opts.stop {
        StopSpec::Offsets(f) => (
            parts
                .iter()
                .map(|tp| {
                    let e = f
                        .partitions
                        .iter()
                        .find(|e| e.topic == tp.0 && e.partition == tp.1);
                    (tp.clone(), e.and_then(|e| e.next_offset))
                })
                .collect(),
            format!(
                "offsets of group {} taken {} ({})",
                f.group, f.taken_at, f.source
            ),
        ),
        StopSpec::Group(g) => {
            let f = offsets::snapshot(pipeline, brokers, database_url, g)?;
            let m = f
                .partitions
                .iter()
                .map(|e| ((e.topic.clone(), e.partition), e.next_offset))
                .collect();
            (
                m,
                format!("offsets of group {g} read at start ({})", f.source),
            )
        }
        StopSpec::Time(ts) => {
            let got = lookup_times(&consumer, &parts, *ts)?;
            let m = parts
                .iter()
                .map(|tp| {
                    let stop = match got.get(tp) {
                        Some(Offset::Offset(o)) => *o,
                        _ => marks[tp].1,
                    };
                    (tp.clone(), Some(stop))
                })
                .collect();
            (
                m,
                format!(
                    "first offset at or after {}",
                    DateTime::from_timestamp_millis(*ts)
                        .unwrap_or_default()
                        .to_rfc3339()
                ),
            )
        }
    };
    let mut plans = Vec::new();
    let mut retention = Vec::new();
    for tp in &parts {
        let (low, high) = marks[tp];
        let (start, start_from) = match starts.get(tp) {
            Some(Offset::Offset(o)) => (*o, "time"),
            Some(Offset::End) if low == high => (high, "empty"),
            Some(Offset::End) => (high, "end-at-lookup"),
            other => {
                return Err(Error::Other(format!(
                    "{}/{}: the broker answered {other:?} to the timestamp lookup; refusing to guess a position",
                    tp.0, tp.1
                )))
            }
        };
        let stop = match stops.get(tp).copied().flatten() {
            Some(s) => s,
            None => match opts.missing_stop {
                MissingStop::End => high,
                MissingStop::Skip => continue,
                MissingStop::Error => {
                    return Err(usage(format!(
                        "{}/{} has no stop offset ({}); choose with --missing-stop=end|skip",
                        tp.0, tp.1, stop_desc
                    )))
                }
            },
        };
        let stop = if stop > high {
            retention.push(format!(
                "{}/{}: stop offset {stop} is beyond the partition's end {high}; capped at {high}",
                tp.0, tp.1
            ));
            high
        } else {
            stop
        };
        let (start, stop, start_from) = match opts.cover.get(tp) {
            Some(&range) => cover(tp, range, (low, high), (start, stop, start_from))?,
            None => (start, stop, start_from),
        };
        if stop < start {
            retention.push(format!(
                "{}/{}: stop offset {stop} is below the start offset {start} (from {start_from}): nothing of this \
                 partition is in the window; stop raised to {start}",
                tp.0, tp.1
            ));
        }
        if start < low {
            return Err(Error::Other(format!(
                "{}/{}: offsets {start}..{low} of the window are gone from the broker (log start offset {low}); \
                 the backfill cannot be complete — nothing was applied",
                tp.0, tp.1
            )));
        }
        plans.push(PartitionPlan {
            topic: tp.0.clone(),
            partition: tp.1,
            start_offset: start,
            stop_offset: stop.max(start),
            start_from: start_from.into(),
        });
    }
    if let Some((tp, _)) = opts.cover.iter().find(|(tp, _)| !parts.contains(tp)) {
        return Err(Error::Other(format!(
            "{}/{}: the window's ledger rows came from this partition, which the topic no longer has; refused \
             before deleting anything",
            tp.0, tp.1
        )));
    }
    retention.extend(check_retention(brokers, pipeline, opts)?);
    Ok((plans, retention, stop_desc))
}

/// Widens a partition's `(start, stop, start_from)` to cover the offsets `lo..=hi` a rebuild must re-read, or
/// refuses when part of that range is no longer in the partition (`marks`: log start and end offsets).
fn cover(
    tp: &(String, i32),
    (lo, hi): (i64, i64),
    (low, high): (i64, i64),
    (start, stop, start_from): (i64, i64, &'static str),
) -> Result<(i64, i64, &'static str)> {
    if lo < low {
        return Err(Error::Other(format!(
            "{}/{}: the window's ledger rows came from offsets {lo}..={hi}, but offsets [{lo}, {low}) are gone from \
             the topic (log start offset {low}, retention): the rebuild would delete events it cannot re-read; \
             refused before deleting anything",
            tp.0, tp.1
        )));
    }
    if hi >= high {
        return Err(Error::Other(format!(
            "{}/{}: the window's ledger rows came from offsets up to {hi}, but the partition ends at {high} (was the \
             topic recreated? then set [identity] generation): refused before deleting anything",
            tp.0, tp.1
        )));
    }
    let from = if lo < start { "ledger" } else { start_from };
    Ok((start.min(lo), stop.max(hi + 1), from))
}

/// Margin before retention would delete the window's oldest records during the run.
const RETENTION_MARGIN_MS: i64 = 6 * 3_600_000;

fn check_retention(
    brokers: &str,
    pipeline: &Pipeline,
    opts: &BackfillOptions,
) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut notes = Vec::new();
    let age = Utc::now().timestamp_millis() - opts.from_ms;
    for t in &pipeline.kafka.topics {
        let spec = ResourceSpecifier::Topic(t);
        let res = rt.block_on(admin.describe_configs([&spec], &AdminOptions::new()))?;
        let Some(Ok(resource)) = res.into_iter().next() else {
            continue;
        };
        let retention: i64 = resource
            .get("retention.ms")
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse().ok())
            .unwrap_or(604_800_000);
        if retention < 0 {
            notes.push(format!("{t}: retention.ms = {retention} (unlimited)"));
            continue;
        }
        if age + RETENTION_MARGIN_MS <= retention {
            notes.push(format!("{t}: retention.ms = {retention}; the window's oldest records are {age} ms old: safe"));
            continue;
        }
        let wanted = age + 7 * 86_400_000;
        if opts.ensure_retention && !opts.dry_run {
            // AlterConfigs replaces a topic's dynamic configuration: keep every other dynamic value.
            let keep: Vec<(String, String)> = resource
                .entries
                .iter()
                .filter(|e| {
                    !e.is_default && !e.is_read_only && !e.is_sensitive && e.name != "retention.ms"
                })
                .filter(|e| matches!(e.source, rdkafka::admin::ConfigSource::DynamicTopic))
                .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
                .collect();
            let wanted_s = wanted.to_string();
            let mut alter =
                AlterConfig::new(ResourceSpecifier::Topic(t)).set("retention.ms", &wanted_s);
            for (k, v) in &keep {
                alter = alter.set(k, v);
            }
            let r = rt.block_on(admin.alter_configs([&alter], &AdminOptions::new()))?;
            for x in r {
                x.map_err(|(_, e)| Error::Other(format!("raising retention.ms of {t}: {e}")))?;
            }
            notes.push(format!(
                "{t}: retention.ms raised from {retention} to {wanted} (--ensure-retention)"
            ));
        } else {
            let msg = format!(
                "{t}: retention.ms = {retention} but the window's oldest records are {age} ms old: retention may delete \
                 them during the run (margin {RETENTION_MARGIN_MS} ms); --ensure-retention raises it to {wanted}"
            );
            tracing::warn!("{msg}");
            notes.push(msg);
        }
    }
    Ok(notes)
}

struct Part {
    plan: PartitionPlan,
    fence: i64,
    next: i64,
    done: bool,
    buffer: Vec<(Item, Option<NaiveDate>)>,
}

/// Runs a backfill (or only plans it with `dry_run`) and returns its report.
///
/// # Errors
/// As [`plan`]; [`Error::Other`] when records of the window disappear during the run (retention), naming the
/// lost range; database and Kafka errors.
pub fn backfill(
    pipeline: Arc<Pipeline>,
    brokers: &str,
    database_url: &str,
    opts: &BackfillOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<Report> {
    let (plans, retention, stop_desc) = plan(&pipeline, brokers, database_url, opts)?;
    let from = DateTime::from_timestamp_millis(opts.from_ms)
        .unwrap_or_default()
        .to_rfc3339();
    let mut report = Report {
        group_id: opts.group_id.clone(),
        pipeline_group: pipeline.kafka.group_id.clone(),
        from,
        stop: stop_desc,
        filter: opts.filter.clone(),
        partitions: plans.clone(),
        retention,
        per_day: BTreeMap::new(),
        accounting: String::new(),
        dry_run: opts.dry_run,
        past_the_stop: Vec::new(),
        rebuild: None,
    };
    if opts.dry_run {
        report.accounting = Tally::default().line();
        return Ok(report);
    }
    let keep = match &opts.filter {
        Some(f) => Some(
            pipeline
                .compile_filter(f)
                .map_err(|m| usage(format!("--filter: {m}")))?,
        ),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let group = opts.group_id.clone();
    let mut sink = rt.block_on(async {
        let mut admin = crate::sink::connect(database_url).await?;
        schema::init(&mut admin, &pipeline).await?;
        Ok::<_, Error>(
            Sink::open(pipeline.clone(), database_url)
                .await?
                .with_group(&group),
        )
    })?;
    // Take over the backfill group's checkpoints; a rerun resumes (or finds the window done).
    let mut parts: Vec<Part> = Vec::new();
    let stmt = checkpoint::acquire_checkpoint(&pipeline);
    let generation = pipeline.identity.generation.clone().unwrap_or_default();
    for pl in plans {
        let (next, fence): (Option<i64>, i64) = rt.block_on(async {
            let row = sink
                .client()
                .query_one(&stmt, &[&group, &pl.topic, &pl.partition, &generation])
                .await?;
            Ok::<_, Error>((row.get(0), row.get(1)))
        })?;
        let resume = match next {
            Some(n) => {
                let (low, _) = watermarks(brokers, &group, &pl.topic, pl.partition)?;
                if n < low && n < pl.stop_offset {
                    return Err(Error::Other(format!(
                        "{}/{}: this backfill stopped at offset {n}, but offsets [{n}, {low}) were deleted by retention \
                         since; the records before {n} stay applied. Nothing was skipped: decide explicitly (a new \
                         --group-id starts the window again from what is left)",
                        pl.topic, pl.partition
                    )));
                }
                if n > pl.start_offset && n < pl.stop_offset {
                    report.retention.push(format!(
                        "{}/{}: resumed at offset {n} (this backfill group's checkpoint); offsets [{}, {n}) were \
                         applied by an earlier session and are not in this report's counts",
                        pl.topic, pl.partition, pl.start_offset
                    ));
                }
                n.max(pl.start_offset)
            }
            None => {
                let upd = format!(
                    "UPDATE {} SET next_offset = $5 WHERE consumer_group = $1 AND topic = $2 AND partition = $3 \
                     AND fence = $4 AND generation = $6",
                    pipeline.table(checkpoint::CHECKPOINTS)
                );
                rt.block_on(sink.client().execute(
                    &upd,
                    &[
                        &group,
                        &pl.topic,
                        &pl.partition,
                        &fence,
                        &pl.start_offset,
                        &generation,
                    ],
                ))?;
                pl.start_offset
            }
        };
        let done = resume >= pl.stop_offset;
        parts.push(Part {
            plan: pl,
            fence,
            next: resume,
            done,
            buffer: Vec::new(),
        });
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set("queued.max.messages.kbytes", "16384")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in parts.iter().filter(|p| !p.done) {
        tpl.add_partition_offset(&p.plan.topic, p.plan.partition, Offset::Offset(p.next))?;
    }
    consumer.assign(&tpl)?;
    let total: i64 = parts
        .iter()
        .map(|p| p.plan.stop_offset - p.plan.start_offset)
        .sum();
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::new(total.max(0) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} records  {per_sec}  ETA {eta}  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut tally = Tally::default();
    let started = Instant::now();
    let mut last_log = Instant::now();
    let mut oldest: Option<Instant> = None;
    let give_up_flag = shutdown.clone();
    let give_up = move || give_up_flag.load(Ordering::Relaxed);
    let result: Result<()> = loop {
        if parts.iter().all(|p| p.done && p.buffer.is_empty()) {
            break Ok(());
        }
        if shutdown.load(Ordering::Relaxed) {
            break Err(Error::Other(
                "interrupted; rerun the same backfill command to resume from its checkpoints (a rebuild: rerun it with a new --group-id)".into(),
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                let Some(part) = parts
                    .iter_mut()
                    .find(|p| p.plan.topic == msg.topic() && p.plan.partition == msg.partition())
                else {
                    continue;
                };
                if part.done || msg.offset() >= part.plan.stop_offset {
                    part.done = true;
                    continue;
                }
                let value = msg.payload();
                let (pending, day) = decide(
                    &pipeline,
                    msg.key(),
                    value,
                    crate::decode::debezium::old_key_header(&msg),
                    keep.as_ref(),
                    opts.day_window,
                );
                if let Pending::Filtered(rule) = &pending {
                    if let Some(detail) = rule.strip_prefix(FILTER_FAILED) {
                        break Err(usage(format!(
                            "--filter failed on {}/{} offset {}: {detail}; nothing of that record was applied, \
                             fix the expression and rerun the same command",
                            msg.topic(),
                            msg.partition(),
                            msg.offset()
                        )));
                    }
                }
                let item = Item::from_message(&msg, pending);
                part.buffer.push((item, day));
                oldest.get_or_insert_with(Instant::now);
                if msg.offset() + 1 >= part.plan.stop_offset {
                    part.done = true;
                }
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange)))
            | Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                break Err(lost_range(&consumer, &parts));
            }
            Some(Err(e)) => tracing::warn!("kafka: {e}"),
            None => {
                // Idle: a partition whose position passed the stop (transaction markers) is done too.
                if let Ok(pos) = consumer.position() {
                    for p in parts.iter_mut().filter(|p| !p.done) {
                        if let Some(e) = pos.find_partition(&p.plan.topic, p.plan.partition) {
                            if let Offset::Offset(o) = e.offset() {
                                if o >= p.plan.stop_offset && p.buffer.is_empty() {
                                    p.done = true;
                                }
                            }
                        }
                    }
                }
            }
        }
        let full = parts
            .iter()
            .any(|p| p.buffer.len() >= pipeline.max_records || (p.done && !p.buffer.is_empty()));
        let lingered = oldest.is_some_and(|t| t.elapsed() >= pipeline.linger);
        if full || lingered {
            oldest = None;
            let mut commit = TopicPartitionList::new();
            for part in parts.iter_mut().filter(|p| !p.buffer.is_empty()) {
                let buffered = std::mem::take(&mut part.buffer);
                let days: Vec<Option<NaiveDate>> = buffered.iter().map(|(_, d)| *d).collect();
                let items: Vec<Item> = buffered.into_iter().map(|(i, _)| i).collect();
                let end = items.last().map(|i| i.offset + 1).unwrap_or(part.next);
                let batch = Batch {
                    topic: part.plan.topic.clone(),
                    partition: part.plan.partition,
                    fence: part.fence,
                    expected: Some(part.next),
                    end,
                    items,
                };
                match rt.block_on(apply_batch(&mut sink, &batch, &give_up))? {
                    Applied::Committed(outcomes) => {
                        for (o, d) in outcomes.iter().zip(&days) {
                            tally.add(o);
                            let key = d.map_or_else(|| "unknown".to_string(), |d| d.to_string());
                            let c = report.per_day.entry(key).or_default();
                            match o {
                                Outcome::Landed => c.landed += 1,
                                Outcome::Duplicate => c.duplicate += 1,
                                Outcome::Stale { .. } => c.stale += 1,
                                Outcome::Filtered(_) => c.filtered += 1,
                                Outcome::Quarantined(_) => c.quarantined += 1,
                            }
                        }
                        bar.inc((end - part.next).max(0) as u64);
                        part.next = end;
                        commit.add_partition_offset(
                            &part.plan.topic,
                            part.plan.partition,
                            Offset::Offset(end),
                        )?;
                    }
                    Applied::Fenced => {
                        return Err(Error::Other(format!(
                            "another process runs backfill group {group} on {}/{}; stopped",
                            part.plan.topic, part.plan.partition
                        )))
                    }
                }
            }
            if commit.count() > 0 {
                let _ = consumer.commit(&commit, rdkafka::consumer::CommitMode::Async);
            }
        }
        if !opts.progress && last_log.elapsed() >= Duration::from_secs(5) {
            last_log = Instant::now();
            let done: i64 = parts.iter().map(|p| p.next - p.plan.start_offset).sum();
            let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-3);
            let eta = if rate > 0.0 {
                (total - done) as f64 / rate
            } else {
                f64::INFINITY
            };
            let remaining: Vec<String> = parts
                .iter()
                .filter(|p| !p.done)
                .map(|p| {
                    format!(
                        "{}/{}: {} left",
                        p.plan.topic,
                        p.plan.partition,
                        p.plan.stop_offset - p.next
                    )
                })
                .collect();
            tracing::info!(
                "backfill {done}/{total} records, {rate:.0}/s, ETA {eta:.0} s; {}",
                remaining.join(", ")
            );
        }
    };
    bar.finish_and_clear();
    result?;
    report.accounting = tally.line();
    if let StopSpec::Time(to) = opts.stop {
        // Information about records not in the window: a failure to read it never fails the applied backfill.
        match past_the_stop(brokers, &group, &report.partitions, opts.from_ms, to) {
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

/// `--to TIME`: how far past each partition's stop the scan for out-of-order timestamps reads — up to the
/// first record at or after `--to` + this (ms) …
pub const PAST_STOP_SCAN_MS: i64 = 3_600_000;
/// … and at least this many records (or to the partition's end).
pub const PAST_STOP_SCAN_RECORDS: i64 = 1_000;

/// A partition stops at its first record at or after `--to`; records after it may still carry earlier
/// timestamps (several producers, retries). Reads past each stop — up to the first record at or after
/// `to_ms + PAST_STOP_SCAN_MS`, at least [`PAST_STOP_SCAN_RECORDS`] records, never beyond the end — and counts
/// the records whose timestamp lies in `[from_ms, to_ms)`. Nothing read here is applied.
fn past_the_stop(
    brokers: &str,
    group: &str,
    plans: &[PartitionPlan],
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<PastTheStop>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .create()?;
    let parts: Vec<(String, i32)> = plans
        .iter()
        .map(|p| (p.topic.clone(), p.partition))
        .collect();
    let ends = lookup_times(&consumer, &parts, to_ms.saturating_add(PAST_STOP_SCAN_MS))?;
    let mut scans: BTreeMap<(String, i32), PastTheStop> = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in plans {
        let tp = (p.topic.clone(), p.partition);
        let (low, high) =
            consumer.fetch_watermarks(&p.topic, p.partition, Duration::from_secs(30))?;
        let by_time = match ends.get(&tp) {
            Some(Offset::Offset(o)) => *o,
            _ => high,
        };
        let from = p.stop_offset.max(low);
        let to = by_time.max(from + PAST_STOP_SCAN_RECORDS).min(high);
        if to > from {
            tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(from))?;
            scans.insert(
                tp,
                PastTheStop {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    scanned_from: from,
                    scanned_to: to,
                    earlier: 0,
                },
            );
        }
    }
    if scans.is_empty() {
        return Ok(Vec::new());
    }
    consumer.assign(&tpl)?;
    let mut open: std::collections::BTreeSet<(String, i32)> = scans.keys().cloned().collect();
    let mut idle_since = Instant::now();
    while !open.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                idle_since = Instant::now();
                let tp = (msg.topic().to_string(), msg.partition());
                let Some(s) = scans.get_mut(&tp) else {
                    continue;
                };
                if msg.offset() >= s.scanned_to {
                    open.remove(&tp);
                    continue;
                }
                let ts = msg.timestamp().to_millis().unwrap_or(i64::MAX);
                if ts >= from_ms && ts < to_ms {
                    s.earlier += 1;
                }
                if msg.offset() + 1 >= s.scanned_to {
                    open.remove(&tp);
                }
            }
            Some(Err(e)) => {
                return Err(Error::Other(format!("reading past the stop offsets: {e}")));
            }
            None => {
                // Transaction markers or compaction can leave the last offsets without a record.
                let pos = consumer.position()?;
                open.retain(|(t, p)| {
                    !matches!(pos.find_partition(t, *p).map(|e| e.offset()),
                        Some(Offset::Offset(o)) if o >= scans[&(t.clone(), *p)].scanned_to)
                });
                if !open.is_empty() && idle_since.elapsed() >= Duration::from_secs(30) {
                    // Bounded: report what was read (the backfill itself has completed).
                    for (t, p) in &open {
                        let s = scans.get_mut(&(t.clone(), *p)).expect("scanned");
                        if let Some(Offset::Offset(o)) =
                            pos.find_partition(t, *p).map(|e| e.offset())
                        {
                            s.scanned_to = o.clamp(s.scanned_from, s.scanned_to);
                        }
                        tracing::warn!(
                            "{t}/{p}: no record for 30 s past the stop; scan ends at {}",
                            s.scanned_to
                        );
                    }
                    break;
                }
            }
        }
    }
    let found: Vec<PastTheStop> = scans.into_values().filter(|s| s.earlier > 0).collect();
    for s in &found {
        tracing::warn!(
            "{}/{}: {} record(s) after the stop offset {} carry timestamps inside the window and were not applied \
             (offsets [{}, {}) read); --to-offsets reaches them",
            s.topic, s.partition, s.earlier, s.scanned_from, s.scanned_from, s.scanned_to
        );
    }
    Ok(found)
}

fn watermarks(brokers: &str, group: &str, topic: &str, partition: i32) -> Result<(i64, i64)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()?;
    Ok(c.fetch_watermarks(topic, partition, Duration::from_secs(30))?)
}

fn lost_range(consumer: &BaseConsumer, parts: &[Part]) -> Error {
    let mut lost = Vec::new();
    for p in parts.iter().filter(|p| !p.done) {
        if let Ok((low, _)) =
            consumer.fetch_watermarks(&p.plan.topic, p.plan.partition, Duration::from_secs(10))
        {
            if p.next < low {
                lost.push(format!(
                    "{}/{} offsets [{}, {low})",
                    p.plan.topic, p.plan.partition, p.next
                ));
            }
        }
    }
    Error::Other(format!(
        "records of the window were deleted by retention during the backfill: {}; what was applied before stays \
         applied (checkpoints); nothing was skipped silently",
        if lost.is_empty() { "a partition's position is out of range".to_string() } else { lost.join(", ") }
    ))
}

fn decide(
    pipeline: &Pipeline,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
    keep: Option<&cel_interpreter::Program>,
    window: Option<(NaiveDate, NaiveDate)>,
) -> (Pending, Option<NaiveDate>) {
    let (fields, change) = match decode::record(pipeline, key, value, old_key) {
        Ok(decode::Decoded::Fields { fields, change }) => (fields, change),
        Ok(decode::Decoded::Skip(rule)) => return (Pending::Filtered(rule.to_string()), None),
        Err(r) => return (Pending::Quarantine(r), None),
    };
    let day = decode::partition_day(pipeline, &fields);
    if let (Some((a, b)), Some(d)) = (window, day) {
        if d < a || d > b {
            return (Pending::Filtered("outside-rebuild-window".into()), day);
        }
    }
    if let Some(program) = keep {
        let ctx = filter::context(pipeline, &fields);
        match filter::eval(program, "--filter", &ctx) {
            Ok(true) => {}
            Ok(false) => return (Pending::Filtered("--filter".into()), day),
            // The operator's own expression failing is not the record's fault: stop (see the loop).
            Err(detail) => return (Pending::Filtered(format!("{FILTER_FAILED}{detail}")), day),
        }
    }
    (filter::pending(pipeline, fields, change), day)
}

/// Options of a rebuild.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// First event day of the window (inclusive).
    pub from: NaiveDate,
    /// Last event day of the window (inclusive).
    pub to: NaiveDate,
    /// The fresh group id that replays the window.
    pub group_id: String,
    /// Hours of record time read before `from` and after `to`, for events never landed (landed ones are re-read
    /// from the offsets their ledger rows hold).
    pub slack_hours: i64,
    /// The operator confirmed that other writers of the projection tables are paused.
    pub others_paused: bool,
    /// Show a progress bar.
    pub progress: bool,
}

/// Rebuilds a window of event days: in one transaction deletes the window's rows from every counter/sum
/// projection and from the ledger, then replays the records of those days under a fresh group id. The replay
/// reads, per partition, at least the offsets the window's ledger rows came from (lowest to highest) and the
/// record times `slack_hours` around the window. The report's `rebuild` section compares the window's ledger
/// rows per day before and after ([`Report::rebuild_shortfall`]).
///
/// # Errors
/// [`Error::Usage`] without `others_paused`, without `partition-by`, or when a projection cannot be zeroed per
/// day (kind sql or outbox, or not grouped by the day); [`Error::Other`] before deleting anything when the window's
/// ledger rows came from offsets the topic no longer holds (retention, recreated topic), another generation or a
/// foreign topic, or when ledger rows appeared outside the planned offsets (a writer not paused); then as
/// [`backfill`].
pub fn rebuild(
    pipeline: Arc<Pipeline>,
    brokers: &str,
    database_url: &str,
    opts: &RebuildOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<Report> {
    if !opts.others_paused {
        return Err(usage(
            "rebuild deletes the window's aggregate rows and replays them: pause every other writer of those tables, \
             then pass --i-paused-other-writers"
                .into(),
        ));
    }
    let day = pipeline.identity.partition_by.ok_or_else(|| {
        usage("rebuild works per event day: the pipeline needs identity.partition-by".into())
    })?;
    if opts.to < opts.from || opts.slack_hours < 0 {
        return Err(usage(format!(
            "rebuild --from {} --to {} --slack-hours {}: the window needs --from <= --to and a slack >= 0",
            opts.from, opts.to, opts.slack_hours
        )));
    }
    let mut deletes = Vec::new();
    for p in &pipeline.projections {
        match &p.aggregate {
            Some(a) if a.group_by.contains(&day) => deletes.push(format!(
                "DELETE FROM {} WHERE {} BETWEEN $1 AND $2",
                a.table, pipeline.fields[day].name
            )),
            _ => {
                return Err(usage(format!(
                    "projection `{}` cannot be zeroed per day (only counter/sum projections grouped by the \
                     partition-by field can); rebuild refused",
                    p.name
                )))
            }
        }
    }
    let slack = opts.slack_hours * 3_600_000;
    let from_ms = opts
        .from
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp_millis()
        - slack;
    let to_ms = opts
        .to
        .succ_opt()
        .unwrap_or(opts.to)
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp_millis()
        + slack;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    // This connection lives until the report is complete: it keeps the deleted ledger rows (a temporary table).
    let mut client = rt.block_on(async {
        let mut client = crate::sink::connect(database_url).await?;
        schema::init(&mut client, &pipeline).await?;
        Ok::<_, Error>(client)
    })?;
    // A group with checkpoints would resume where it stopped after the window was deleted again: refuse.
    let table = pipeline.table(checkpoint::CHECKPOINTS).to_string();
    let used: bool = rt
        .block_on(client.query_one(
            &format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE consumer_group = $1)"),
            &[&opts.group_id],
        ))?
        .get(0);
    if used {
        return Err(usage(format!(
            "--group-id {} has been used before: a rebuild deletes the window again and must replay it from the \
             start, so give every rebuild (also a rerun after an interruption) a new group id",
            opts.group_id
        )));
    }
    // Days the ledger no longer remembers (the durable horizon, README answer 4): their records would be
    // quarantined as beyond-horizon after the window was zeroed.
    let horizon = rt.block_on(ledger::current_horizon(&client, &pipeline))?;
    if let Some(oldest) = horizon.and_then(|h| h.oldest).filter(|o| opts.from < *o) {
        return Err(usage(format!(
            "the window starts {} but the ledger horizon only recognises event days from {oldest} (older days \
             were pruned, or are past horizon-days): their records would be quarantined as beyond-horizon after \
             the window was zeroed; rebuild from {oldest} on",
            opts.from
        )));
    }
    // Ledger rows an interrupted rebuild deleted and did not re-land are kept until a rebuild completes.
    rt.block_on(unfinished_rebuild(&client, &pipeline, opts))?;
    // Where the window's events came from: the replay reads at least those offsets, whatever their times.
    let sources = rt.block_on(window_sources(&client, &pipeline, opts))?;
    let cover = cover_of(&pipeline, &sources)?;
    let bopts = BackfillOptions {
        from_ms,
        stop: StopSpec::Time(to_ms),
        filter: None,
        day_window: Some((opts.from, opts.to)),
        group_id: opts.group_id.clone(),
        ensure_retention: false,
        dry_run: false,
        missing_stop: MissingStop::End,
        progress: opts.progress,
        cover: cover.clone(),
    };
    // Plan first (retention, the ledger's offsets still in the topic) so nothing is deleted when the replay
    // cannot re-read it all.
    plan(&pipeline, brokers, database_url, &bopts)?;
    rt.block_on(delete_window(
        &mut client,
        &pipeline,
        opts,
        &deletes,
        &cover,
    ))?;
    let mut report = backfill(pipeline.clone(), brokers, database_url, &bopts, shutdown)?;
    report.rebuild = Some(rt.block_on(rebuild_check(&client, &pipeline, opts))?);
    // The replay completed: the deleted rows are accounted for in this report.
    rt.block_on(client.execute(
        &format!(
            "DELETE FROM {} WHERE {} BETWEEN $1 AND $2",
            pending_table(&pipeline),
            pipeline.fields[day].name
        ),
        &[&opts.from, &opts.to],
    ))?;
    Ok(report)
}

/// Per `(generation, topic, partition)`: lowest and highest offset and the number of the window's ledger rows.
type Sources = Vec<(String, String, i32, i64, i64, i64)>;

async fn window_sources(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
) -> Result<Sources> {
    let day = pipeline.identity.partition_by.expect("checked");
    let (ledger, pending, day) = (
        &pipeline.ledger.table,
        pending_table(pipeline),
        &pipeline.fields[day].name,
    );
    // With the rows an interrupted rebuild of the window deleted and did not re-land yet.
    let q = format!(
        "SELECT generation, topic, partition, min(\"offset\"), max(\"offset\"), count(*) FROM ( \
         SELECT generation, topic, partition, \"offset\" FROM {ledger} WHERE {day} BETWEEN $1 AND $2 UNION \
         SELECT generation, topic, partition, \"offset\" FROM {pending} WHERE {day} BETWEEN $1 AND $2) s \
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    );
    let rows = client.query(&q, &[&opts.from, &opts.to]).await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect())
}

/// The offsets the replay must cover; refuses ledger rows that no replay of this pipeline can bring back (another
/// generation, a topic no longer in the pipeline).
fn cover_of(pipeline: &Pipeline, sources: &Sources) -> Result<BTreeMap<(String, i32), (i64, i64)>> {
    let generation = pipeline.identity.generation.clone().unwrap_or_default();
    let foreign: Vec<String> = sources
        .iter()
        .filter(|s| s.0 != generation || !pipeline.kafka.topics.contains(&s.1))
        .map(|s| {
            format!(
                "{} row(s) of generation '{}' from {}/{} offsets {}..={}",
                s.5, s.0, s.1, s.2, s.3, s.4
            )
        })
        .collect();
    if !foreign.is_empty() {
        return Err(Error::Other(format!(
            "the window's ledger holds events this pipeline cannot re-read (generation '{generation}', topics {:?}): \
             {}; the rebuild would delete them for good — refused before deleting anything",
            pipeline.kafka.topics,
            foreign.join(", ")
        )));
    }
    Ok(sources
        .iter()
        .map(|s| ((s.1.clone(), s.2), (s.3, s.4)))
        .collect())
}

/// The durable table beside the ledger (`<ledger>_rebuilding`, same columns) holding the ledger rows a rebuild
/// deleted until its replay completed. A rebuild interrupted after the delete leaves them there, so its rerun
/// (which deletes the re-landed part again) still re-reads their offsets and compares against them.
pub fn pending_table(pipeline: &Pipeline) -> QualifiedName {
    let ledger = &pipeline.ledger.table;
    let name = Ident::new(&format!("{}_rebuilding", ledger.name.as_str())).unwrap_or_else(|_| {
        let h = <sha2::Sha256 as sha2::Digest>::digest(ledger.name.as_str().as_bytes());
        Ident::new(&format!(
            "replaysafe_rebuilding_{:02x}{:02x}{:02x}{:02x}",
            h[0], h[1], h[2], h[3]
        ))
        .expect("valid name")
    });
    QualifiedName {
        schema: ledger.schema.clone(),
        name,
    }
}

/// Refuses a window that does not cover every day an interrupted rebuild deleted and did not finish (its rerun
/// must re-read those days' offsets, whatever window the operator types).
async fn unfinished_rebuild(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
) -> Result<()> {
    let day = &pipeline.fields[pipeline.identity.partition_by.expect("checked")].name;
    let pending = pending_table(pipeline);
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {pending} (LIKE {})",
            pipeline.ledger.table
        ))
        .await?;
    let r = client
        .query_one(
            &format!("SELECT min({day}), max({day}), count(*) FROM {pending}"),
            &[],
        )
        .await?;
    let (lo, hi, n): (Option<NaiveDate>, Option<NaiveDate>, i64) = (r.get(0), r.get(1), r.get(2));
    if let (Some(lo), Some(hi)) = (lo, hi) {
        if lo < opts.from || hi > opts.to {
            return Err(usage(format!(
                "an interrupted rebuild deleted {n} ledger row(s) of event days {lo}..={hi} (kept in {pending}) \
                 and did not finish replaying them; rerun the rebuild with a window covering those days \
                 (--from {} --to {}) and a new --group-id",
                lo.min(opts.from),
                hi.max(opts.to)
            )));
        }
        tracing::warn!(
            rows = n,
            "an interrupted rebuild of {lo}..={hi} deleted ledger rows it did not replay; this rebuild re-reads \
             their offsets and reports them"
        );
    }
    Ok(())
}

/// In one transaction: deletes the window from every aggregate and from the ledger, keeping the deleted ledger
/// rows in [`pending_table`] (once per key); rolls back when they came from offsets the plan does not cover (a
/// writer was not paused).
async fn delete_window(
    client: &mut tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
    deletes: &[String],
    cover: &BTreeMap<(String, i32), (i64, i64)>,
) -> Result<()> {
    let day = pipeline.identity.partition_by.expect("checked");
    let ledger = &pipeline.ledger.table;
    let pending = pending_table(pipeline);
    let same: Vec<String> = ledger::ledger_pk(pipeline)
        .iter()
        .map(|c| format!("k.{c} = d.{c}"))
        .collect();
    let tx = client.transaction().await?;
    for d in deletes {
        let n = tx.execute(d.as_str(), &[&opts.from, &opts.to]).await?;
        tracing::info!(rows = n, "{d}");
    }
    let n = tx
        .execute(
            &format!(
                "WITH d AS (DELETE FROM {ledger} WHERE {} BETWEEN $1 AND $2 RETURNING *) \
                 INSERT INTO {pending} SELECT * FROM d WHERE NOT EXISTS (SELECT 1 FROM {pending} k WHERE {})",
                pipeline.fields[day].name,
                same.join(" AND ")
            ),
            &[&opts.from, &opts.to],
        )
        .await?;
    tracing::info!(
        rows = n,
        "ledger rows of {}..={} deleted",
        opts.from,
        opts.to
    );
    let q = format!(
        "SELECT topic, partition, min(\"offset\"), max(\"offset\") FROM {pending} WHERE {} BETWEEN $1 AND $2 \
         GROUP BY 1, 2",
        pipeline.fields[day].name
    );
    for r in tx.query(&q, &[&opts.from, &opts.to]).await? {
        let (t, p, lo, hi): (String, i32, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        if !cover
            .get(&(t.clone(), p))
            .is_some_and(|&(a, b)| a <= lo && hi <= b)
        {
            tx.rollback().await?;
            return Err(Error::Other(format!(
                "{t}/{p}: ledger rows of the window appeared at offsets {lo}..={hi} after the rebuild was planned — \
                 another writer is running; nothing was deleted"
            )));
        }
    }
    tx.commit().await?;
    Ok(())
}

/// After the replay: ledger rows per day before and after, and the deleted rows that did not come back.
async fn rebuild_check(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
) -> Result<RebuildCheck> {
    let day = &pipeline.fields[pipeline.identity.partition_by.expect("checked")].name;
    let ledger = &pipeline.ledger.table;
    let removed = pending_table(pipeline);
    let mut check = RebuildCheck::default();
    for r in client
        .query(
            &format!("SELECT {day}::text, count(*) FROM {removed} WHERE {day} BETWEEN $1 AND $2 GROUP BY 1"),
            &[&opts.from, &opts.to],
        )
        .await?
    {
        check.per_day.entry(r.get(0)).or_default().before = r.get::<_, i64>(1) as u64;
    }
    for r in client
        .query(
            &format!("SELECT {day}::text, count(*) FROM {ledger} WHERE {day} BETWEEN $1 AND $2 GROUP BY 1"),
            &[&opts.from, &opts.to],
        )
        .await?
    {
        check.per_day.entry(r.get(0)).or_default().after = r.get::<_, i64>(1) as u64;
    }
    let pk = ledger::ledger_pk(pipeline);
    let same: Vec<String> = pk.iter().map(|c| format!("l.{c} = r.{c}")).collect();
    let key: Vec<String> = pk.iter().map(|c| format!("r.{c}::text")).collect();
    let gone = format!(
        "FROM {removed} r WHERE r.{day} BETWEEN $1 AND $2 AND NOT EXISTS (SELECT 1 FROM {ledger} l WHERE {})",
        same.join(" AND ")
    );
    check.missing_total = client
        .query_one(&format!("SELECT count(*) {gone}"), &[&opts.from, &opts.to])
        .await?
        .get::<_, i64>(0) as u64;
    let rows = client
        .query(
            &format!(
                "SELECT r.{day}::text, ARRAY[{}], r.topic, r.partition, r.\"offset\" {gone} \
                 ORDER BY 3, 4, 5 LIMIT {MISSING_LISTED}",
                key.join(", ")
            ),
            &[&opts.from, &opts.to],
        )
        .await?;
    check.missing = rows
        .iter()
        .map(|r| MissingRow {
            day: r.get(0),
            key: r.get(1),
            topic: r.get(2),
            partition: r.get(3),
            offset: r.get(4),
        })
        .collect();
    Ok(check)
}
