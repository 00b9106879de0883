//! What the time lookup of `--from` skipped (issue 41 item 8). Kafka's ListOffsets by timestamp
//! (`offsets_for_times`) answers the earliest offset whose record timestamp is at or after `--from` (Kafka
//! protocol, ListOffsets: "the earliest offset whose timestamp is greater than or equal to the given
//! timestamp"); it trusts record timestamps, which producers set (CreateTime) and can get wrong — a clock behind,
//! or the event's time used as the record's. Each partition's note says which offsets the window starts after
//! and why; a window that holds nothing by time while the offsets below an explicit stop hold records is refused
//! rather than reported as a success with nothing applied.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::ops::backfill::options::PartitionPlan;

/// How long reading one record's timestamp may wait for the broker.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One note per partition whose time-based start skips offsets of the log (`lows`: log start offsets; `stops`:
/// the stop offsets before they were raised to the start): the range skipped and why. A partition that reads
/// nothing although offsets below its stop hold records is said so first (and logged as a warning by
/// [`super::plan`]). Time-based starts only (`time`, `end-at-lookup`).
pub(crate) fn notes(
    plans: &[PartitionPlan],
    lows: &[i64],
    stops: &[i64],
    from: &str,
) -> Vec<String> {
    plans
        .iter()
        .zip(lows.iter().zip(stops))
        .filter(|(p, (low, _))| p.start_offset > **low && p.start_from != "ledger")
        .map(|(p, (low, stop))| {
            let why = match p.start_from.as_str() {
                "end-at-lookup" => "no record of the partition carries a timestamp at or after --from".into(),
                _ => format!(
                    "offset {} is the first whose record timestamp is at or after --from",
                    p.start_offset
                ),
            };
            let none = match stop > low && p.start_offset >= *stop {
                true => format!("nothing of this partition read although offsets {low}..{stop} lie below its stop; "),
                false => String::new(),
            };
            format!(
                "{}/{}: {none}offsets {low}..{} ({} record(s) at most) not read: {why} ({from}; Kafka's time lookup \
                 trusts the producers' record timestamps)",
                p.topic,
                p.partition,
                p.start_offset,
                p.start_offset - low
            )
        })
        .collect()
}

/// Refuses a window that reads nothing although the offsets below its explicit stops (`--to-offsets`,
/// `--to-group`) hold records: every one of them carries a timestamp before `--from`. Names them, the latest
/// timestamp read below a stop, and the `--from` that reads from there.
///
/// # Errors
/// [`Error::Other`] when the plan reads no record but some partition holds records below its stop.
pub(crate) fn refuse_empty(
    consumer: &BaseConsumer,
    plans: &[PartitionPlan],
    lows: &[i64],
    stops: &[i64],
) -> Result<()> {
    if plans.iter().any(|p| p.stop_offset > p.start_offset) {
        return Ok(());
    }
    let held: Vec<(&PartitionPlan, i64, i64)> = plans
        .iter()
        .zip(lows.iter().zip(stops))
        .filter(|(_, (low, stop))| *stop > *low)
        .map(|(p, (low, stop))| (p, *low, *stop))
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    let ranges: Vec<String> = held
        .iter()
        .map(|(p, low, stop)| format!("{}/{} offsets {low}..{stop}", p.topic, p.partition))
        .collect();
    let earliest = held
        .iter()
        .filter_map(|(p, low, stop)| {
            last_timestamp(consumer, &p.topic, p.partition, *low, *stop).map(|(o, ts)| (p, o, ts))
        })
        .min_by_key(|(_, _, ts)| *ts);
    let advice = match earliest {
        Some((p, o, ts)) => {
            let at = chrono::DateTime::from_timestamp_millis(ts)
                .map_or_else(|| format!("{ts} ms"), |t| t.to_rfc3339());
            format!(
                "the last record below the stop of {}/{} (offset {o}), the earliest of the partitions' last, \
                 carries {at}: if the records below the stops belong to the window, rerun with --from {at} or \
                 earlier (records already counted are duplicates)",
                p.topic, p.partition
            )
        }
        None => "their timestamps could not be read; give an earlier --from".to_string(),
    };
    Err(Error::Other(format!(
        "the window holds no record by record time, yet the offsets below its stop hold records ({}): every one \
         carries a timestamp before --from — Kafka's time lookup trusts the producers' record timestamps, which may \
         be wrong (a clock behind, the event's time as the record's). Nothing was applied; {advice}",
        ranges.join(", ")
    )))
}

/// The offset and timestamp of the last record below `stop` (read from `stop - 1`, or the first record after
/// `low` when that offset holds none), within [`READ_TIMEOUT`].
fn last_timestamp(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    low: i64,
    stop: i64,
) -> Option<(i64, i64)> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset((stop - 1).max(low)))
        .ok()?;
    consumer.assign(&tpl).ok()?;
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut found = None;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() < stop => {
                found = m.timestamp().to_millis().map(|ts| (m.offset(), ts));
                break;
            }
            Some(Ok(_)) => break,
            Some(Err(_)) => break,
            None => {}
        }
    }
    let _ = consumer.unassign();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(start: i64, stop: i64, from: &str) -> PartitionPlan {
        PartitionPlan {
            topic: "t".into(),
            partition: 0,
            start_offset: start,
            stop_offset: stop,
            start_from: from.into(),
        }
    }

    #[test]
    fn notes_name_what_the_time_lookup_skipped_and_a_partition_that_reads_nothing() {
        let n = notes(&[plan(5, 9, "time")], &[2], &[9], "F");
        assert_eq!(n.len(), 1);
        assert!(n[0].starts_with(
            "t/0: offsets 2..5 (3 record(s) at most) not read: offset 5 is the first"
        ));
        let n = notes(&[plan(9, 9, "end-at-lookup")], &[0], &[7], "F");
        assert!(
            n[0].contains("nothing of this partition read although offsets 0..7"),
            "{n:?}"
        );
        assert!(n[0].contains("no record of the partition carries"), "{n:?}");
        // From the log start, or a rebuild's ledger start: nothing skipped to note.
        assert!(notes(
            &[plan(0, 9, "time"), plan(3, 9, "ledger")],
            &[0, 0],
            &[9, 9],
            "F"
        )
        .is_empty());
    }
}
