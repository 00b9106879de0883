//! `--to TIME`: the scan past each partition's stop for records with out-of-order timestamps.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::config::Pipeline;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::ops::backfill::options::PartitionPlan;
use crate::ops::backfill::plan::lookup_times;
use crate::ops::backfill::report::PastTheStop;

/// `--to TIME`: how far past each partition's stop the scan for out-of-order timestamps reads — up to the
/// first record at or after `--to` + this (ms) …
pub const PAST_STOP_SCAN_MS: i64 = 3_600_000;
/// … and at least this many records (or to the partition's end).
pub const PAST_STOP_SCAN_RECORDS: i64 = 1_000;

/// A partition stops at its first record at or after `--to`; records after it may still carry earlier
/// timestamps (several producers, retries). Reads past each stop — up to the first record at or after
/// `to_ms + PAST_STOP_SCAN_MS`, at least [`PAST_STOP_SCAN_RECORDS`] records, never beyond the end — and counts
/// the records whose timestamp lies in `[from_ms, to_ms)`. Nothing read here is applied.
pub(crate) fn past_the_stop(
    pipeline: &Pipeline,
    brokers: &str,
    group: &str,
    plans: &[PartitionPlan],
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<PastTheStop>> {
    // The pipeline's consumer configuration (security, isolation level; auto-commit off), under `group`.
    let consumer: BaseConsumer = crate::source::kafka::consumer_config(pipeline, brokers, &[])
        .set("group.id", group)
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
        let (low, high) = crate::source::kafka::watermarks(
            &consumer,
            &p.topic,
            p.partition,
            Duration::from_secs(30),
        )?;
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
                        let s = scans
                            .get_mut(&(t.clone(), *p))
                            .expect("every stopped partition has its scan");
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
