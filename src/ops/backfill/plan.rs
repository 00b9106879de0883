//! Planning a backfill's window: start and stop offsets per partition, the retention and horizon checks.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::ops::backfill::options::{BackfillOptions, MissingStop, PartitionPlan, StopSpec};
use crate::ops::offsets;
use crate::sink::ledger;
use crate::source::kafka::partitions;

fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

pub(crate) fn lookup_times(
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

/// Refuses options that cannot make a sound window (before anything is read).
///
/// # Errors
/// [`Error::Usage`] naming the option.
fn validate(pipeline: &Pipeline, opts: &BackfillOptions) -> Result<()> {
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
    Ok(())
}

type Marks = BTreeMap<(String, i32), (i64, i64)>;
type Stops = BTreeMap<(String, i32), Option<i64>>;

/// Each partition's stop offset (`None`: the stop names no position for it) and how they were chosen.
fn stop_offsets(
    pipeline: &Pipeline,
    brokers: &str,
    database_url: &str,
    opts: &BackfillOptions,
    consumer: &BaseConsumer,
    parts: &[(String, i32)],
    marks: &Marks,
) -> Result<(Stops, String)> {
    Ok(match &opts.stop {
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
            let got = lookup_times(consumer, parts, *ts)?;
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
    })
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
    validate(pipeline, opts)?;
    let probe = crate::source::kafka::consumer_config(pipeline, brokers, &[]);
    crate::source::kafka::reachable(&probe, brokers, &pipeline.kafka.topics[0])?;
    // The pipeline's properties (security included), under the backfill's group.
    let consumer: BaseConsumer = probe.clone().set("group.id", &opts.group_id).create()?;
    let parts = partitions(&consumer, &pipeline.kafka.topics)?;
    // Ends captured before the lookups: "End" means the end as it was at the lookup (case C15).
    let mut marks = BTreeMap::new();
    for (t, p) in &parts {
        marks.insert(
            (t.clone(), *p),
            crate::source::kafka::watermarks(&consumer, t, *p, Duration::from_secs(30))?,
        );
    }
    let starts = lookup_times(&consumer, &parts, opts.from_ms)?;
    let (stops, stop_desc) = stop_offsets(
        pipeline,
        brokers,
        database_url,
        opts,
        &consumer,
        &parts,
        &marks,
    )?;
    let mut plans = Vec::new();
    let mut retention = Vec::new();
    // Per plan: the log start offset and the stop before it was raised to the start (the lookup's notes).
    let (mut lows, mut raw_stops) = (Vec::new(), Vec::new());
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
        lows.push(low);
        raw_stops.push(stop);
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
    // What the time lookup skipped, and a window empty by time over offsets that hold records (issue 41 item 8).
    if opts.cover.is_empty() {
        let from = chrono::DateTime::from_timestamp_millis(opts.from_ms)
            .map_or_else(|| opts.from_ms.to_string(), |t| t.to_rfc3339());
        for note in super::lookup::notes(&plans, &lows, &raw_stops, &from) {
            match note.contains("nothing of this partition read") {
                true => tracing::warn!("{note}"),
                false => tracing::info!("{note}"),
            }
            retention.push(note);
        }
        if !matches!(opts.stop, StopSpec::Time(_)) {
            super::lookup::refuse_empty(&consumer, &plans, &lows, &raw_stops)?;
        }
    }
    // Offsets whose ledger rows a prune dropped (docs/replay.md "The ledger's lifecycle"): refused before anything
    // runs.
    let windows: Vec<(String, i32, i64, i64)> = plans
        .iter()
        .map(|x| (x.topic.clone(), x.partition, x.start_offset, x.stop_offset))
        .collect();
    let first_day = opts.day_window.map(|(from, _)| from);
    crate::ops::ledger::refuse_below_pruned(
        pipeline,
        database_url,
        &opts.group_id,
        &windows,
        first_day,
    )?;
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
    let admin: AdminClient<DefaultClientContext> =
        crate::source::kafka::client_config(pipeline, brokers).create()?;
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
