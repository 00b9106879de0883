//! Which log a checkpoint's offset belongs to (cases C46, C47): the topic id (KIP-516) and the cluster id kept
//! beside each checkpoint, compared with the broker's at every take-over before the stored offset is used. A
//! topic deleted and re-created under the same name (another topic id) or another cluster (a failover to a
//! MirrorMaker 2 replica) holds other records at the same offsets: the stored offset would skip the records
//! below it, so the partition is refused ([`Error::LogChanged`], exit 7) until the operator decides — `offsets
//! start` (an explicit start on this log) or a new `[identity] generation` (docs/guarantees.md "A recreated topic, another
//! cluster"). A checkpoint without ids (written by an earlier version, or just created) is not refused: the
//! broker's ids are recorded in it ([`record`]). A topic re-created under a running `run` member that keeps its
//! partitions is seen by [`crate::source::logwatch`] and named by [`recreated_under_run`].

use crate::config::Pipeline;
use crate::engine::takeover::{self, Acquired};
use crate::engine::{Core, Tp};
use crate::error::{Error, Result};
use crate::sink::checkpoint;
use crate::source::kafka::LogIds;

/// What differs between a stored log and the broker's, in words; `None` when nothing known differs.
pub fn difference(
    stored: (Option<&str>, Option<&str>),
    topic: &str,
    now: &LogIds,
) -> Option<String> {
    let cluster_differs =
        matches!((stored.1, now.cluster.as_deref()), (Some(a), Some(b)) if a != b);
    let topic_differs = matches!((stored.0, now.topic(topic)), (Some(a), Some(b)) if a != b);
    let shown = |v: Option<&str>| v.map_or("(not recorded)".to_string(), str::to_string);
    let ids = format!(
        "topic id {} of cluster {}, but the broker now serves topic id {} of cluster {}",
        shown(stored.0),
        shown(stored.1),
        shown(now.topic(topic)),
        shown(now.cluster.as_deref())
    );
    if cluster_differs {
        Some(format!(
            "{ids}: these brokers are another cluster (a failover to a replica, e.g. MirrorMaker 2), whose log holds \
             the records at other offsets"
        ))
    } else if topic_differs {
        Some(format!(
            "{ids}: the topic was deleted and re-created under the same name, its offsets begin again"
        ))
    } else {
        None
    }
}

/// Refuses a checkpoint written on another log than the broker's: the message names the topic and partition,
/// both ids, the stored offset and the ways forward.
///
/// # Errors
/// [`Error::LogChanged`].
pub fn check(p: &Pipeline, group: &str, a: &Acquired, now: &LogIds) -> Result<()> {
    let Some(next) = a.next else {
        return Ok(());
    };
    let (topic, partition) = (&a.tp.0, a.tp.1);
    let stored = (a.stored_ids.0.as_deref(), a.stored_ids.1.as_deref());
    let Some(why) = difference(stored, topic, now) else {
        return Ok(());
    };
    let generation = p.identity.generation.clone().unwrap_or_default();
    Err(Error::LogChanged(format!(
        "{topic}/{partition}: the checkpoint of group `{group}` (generation `{generation}`, next offset {next}) was \
         written on {why}. Offset {next} of this log is not where the group stopped, so nothing was consumed \
         (exit 7). Decide where this log starts: `replaysafe offsets start -c {file} --topic {topic} --partition \
         {partition}` with --from-earliest, --from-time TIME, --from-offset N or --from-mm2 SOURCE-ALIAS (the \
         replaced checkpoint is kept in {retired}; the ledger recognises every record already applied by its \
         delivery key), or give the pipeline a new [identity] generation (docs/guarantees.md \"A recreated topic, another \
         cluster\")",
        file = p.source.path,
        retired = p.table(checkpoint::RETIRED),
    )))
}

/// The error of a topic deleted and re-created under a running worker that kept its partitions
/// ([`crate::source::logwatch`]): `changed` are the held partitions on another topic id than the one now read, each
/// with its checkpoint (next offset to read; `None`: nothing committed yet) from `next`. The message names the
/// topic, the partitions, both ids and the stored offsets, and the ways forward.
pub fn recreated_under_run(
    p: &Pipeline,
    group: &str,
    changed: &[crate::source::logwatch::Changed],
    next: &dyn Fn(&Tp) -> Option<i64>,
) -> Error {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let mut lines = Vec::new();
    for (tp, was, cluster, now) in changed {
        let at = next(tp).map_or("no checkpoint yet".to_string(), |n| {
            format!("next offset {n}")
        });
        lines.push(format!(
            "{}/{}: the topic was deleted and re-created under this running worker: the checkpoint of group \
             `{group}` (generation `{generation}`, {at}) was written on topic id {was} of cluster {}, but the \
             broker now serves topic id {now}, whose offsets begin again",
            tp.0,
            tp.1,
            cluster.as_deref().unwrap_or("(not recorded)"),
        ));
    }
    let topics: Vec<&str> = {
        let mut t: Vec<&str> = changed.iter().map(|c| c.0 .0.as_str()).collect();
        t.dedup();
        t
    };
    Error::LogChanged(format!(
        "{}. Stopped before any record of the new log was applied (exit 7); the checkpoints stay where the old log \
         left them. Decide where the new log starts: `replaysafe offsets start -c {file} --topic {topic}` with \
         --from-earliest, --from-time TIME or --from-offset N (the ledger recognises every record already applied \
         by its delivery key), or give the pipeline a new [identity] generation (docs/guarantees.md \"A recreated \
         topic, another cluster\")",
        lines.join("; "),
        file = p.source.path,
        topic = topics.first().copied().unwrap_or("TOPIC"),
    ))
}

/// Records the broker's ids in the checkpoints of `acquired` that hold none ([`takeover::record_log_ids`]),
/// after [`check`] accepted them. A checkpoint whose fence moved meanwhile is left as it is (its new owner
/// records them).
///
/// # Errors
/// A database error.
pub fn record(
    core: &mut Core,
    group: &str,
    acquired: &[(Tp, i64, (bool, bool))],
    now: &LogIds,
) -> Result<()> {
    let p = core.pipeline.clone();
    let rt = core.runtime();
    for (tp, fence, (has_topic, has_cluster)) in acquired {
        if *has_topic && *has_cluster {
            continue;
        }
        rt.block_on(takeover::record_log_ids(
            core.sink(),
            &p,
            group,
            tp,
            *fence,
            (now.topic(&tp.0), now.cluster.as_deref()),
        ))?;
    }
    Ok(())
}

/// The broker's log ids for the topics of `acquired` ([`crate::source::kafka::log_ids`]; nothing is asked when
/// `acquired` is empty).
///
/// # Errors
/// As [`crate::source::kafka::log_ids`].
pub fn broker_ids<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    acquired: &[Acquired],
) -> Result<LogIds> {
    let mut topics: Vec<String> = acquired.iter().map(|a| a.tp.0.clone()).collect();
    topics.sort();
    topics.dedup();
    if topics.is_empty() {
        return Ok(LogIds::default());
    }
    crate::source::kafka::log_ids(consumer, &topics)
}

/// What [`record`] needs of an acquired partition: its partition, fence and which ids it holds.
pub fn recordable(a: &Acquired) -> (Tp, i64, (bool, bool)) {
    (
        a.tp.clone(),
        a.fence,
        (a.stored_ids.0.is_some(), a.stored_ids.1.is_some()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(cluster: &str, topic: &str) -> LogIds {
        LogIds {
            cluster: Some(cluster.into()),
            topics: [("t".to_string(), topic.to_string())].into(),
        }
    }

    #[test]
    fn another_topic_id_or_cluster_differs_an_unrecorded_one_does_not() {
        let now = ids("C1", "B");
        assert!(difference((Some("A"), Some("C1")), "t", &now)
            .unwrap()
            .contains("re-created"));
        assert!(difference((Some("A"), Some("C0")), "t", &now)
            .unwrap()
            .contains("another cluster"));
        assert_eq!(difference((Some("B"), Some("C1")), "t", &now), None);
        assert_eq!(difference((None, None), "t", &now), None);
        assert_eq!(difference((Some("A"), None), "u", &now), None);
        // A broker that did not say: nothing known differs.
        assert_eq!(
            difference((Some("A"), Some("C0")), "t", &LogIds::default()),
            None
        );
    }
}
