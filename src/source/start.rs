//! Where an assigned partition starts when PostgreSQL holds no checkpoint for it in this stream generation
//! (docs/guarantees.md "Where a partition starts").
//!
//! In order:
//! 1. **Another generation's checkpoint** of the same group (the file's `[identity] generation` changed, or
//!    another generation wrote its checkpoint after this generation's — then this one is stale): the
//!    record that generation applied last is read back from the broker and compared with the fingerprint stored
//!    beside its checkpoint ([`fingerprint`]). The same record → the topic is the same one: continue from that
//!    checkpoint (re-reading from Kafka's lagging committed offset would land the records in between again under
//!    new delivery keys). Another record, none, or a log that ends below it → the topic was recreated: start at
//!    its beginning. A checkpoint without a fingerprint (written by an earlier version) whose offset the log still
//!    holds, and a last record no longer at its offset while later ones are (a compacted topic), cannot be told
//!    apart: refused, naming the two statements that decide it. Kafka's committed offsets
//!    are not used: they belong to whichever generation committed last.
//! 2. **Kafka's committed offset** for the group.
//! 3. **A partition added after the group began** (its number is at or above the topic's partition count when
//!    the group first resolved a start, kept in `replaysafe_group_starts`): it holds only records newer than the
//!    group, so it is read from its beginning — also under `start = "latest"` (whose "latest" would skip the
//!    records produced between the partition's creation and its assignment) and when `start` is unset.
//! 4. **`[kafka] start`** for a group that begins; the partition count is recorded for step 3.
//! 5. Otherwise [`Error::NoStartPosition`] (exit 3).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::sink::checkpoint::{fingerprint, NOTHING_APPLIED};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::Client;

use crate::config::{Pipeline, StartPolicy};
use crate::error::{Error, Result};
use crate::sink::checkpoint;

/// How long reading back one record of an old generation may take before the assignment fails.
pub const READ_BACK_TIMEOUT: Duration = Duration::from_secs(15);

/// A partition that has no checkpoint in this generation, with what the broker and the group say of it.
#[derive(Debug, Clone)]
pub struct Unpositioned {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The broker's log start offset.
    pub low: i64,
    /// The broker's log end offset (next offset to be written).
    pub high: i64,
    /// Kafka's committed offset for the group (next offset to read), if any.
    pub committed: Option<i64>,
    /// The checkpoint table, schema-qualified (for the statements a refusal suggests).
    pub checkpoints: String,
    /// The broker's `(topic id, cluster id)` of the partition's log (`None`: not answered).
    pub ids: (Option<String>, Option<String>),
}

/// Where a partition starts (next offset to read) and why, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The first offset to read.
    pub offset: i64,
    /// Why, in words.
    pub from: String,
}

/// A checkpoint another generation of the group left for a partition.
#[derive(Debug, Clone)]
pub struct OldCheckpoint {
    /// That generation ('' for none).
    pub generation: String,
    /// Its next offset to read.
    pub next_offset: i64,
    /// The fingerprint of the last record it applied: offset, timestamp ms, SHA-256 ([`fingerprint`]).
    pub last: Option<(i64, Option<i64>, Vec<u8>)>,
    /// Without `last`: the checkpoint holds a resolved start position and that generation applied no record of
    /// the partition ([`NOTHING_APPLIED`]) — as opposed to a checkpoint of an earlier replaysafe.
    pub applied_nothing: bool,
    /// `(topic id, cluster id)` of the log that checkpoint was written on (`None`: not recorded).
    pub ids: (Option<String>, Option<String>),
}

/// What reading back an old generation's last record found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// The record at that offset has the stored timestamp and fingerprint.
    Same,
    /// Another record at that offset.
    Different,
    /// No record at that offset any more, but later ones (the log was compacted, or the offset holds a
    /// transaction marker): the first offset found after it. Cannot tell the same topic from a recreated one.
    Gone(i64),
}

/// Decides the start of a partition after a generation change (step 1 of the module docs). `read` reads the
/// record at an offset back from the broker and compares it with the stored timestamp and fingerprint
/// ([`read_back`]); it is only called for an offset in `low..high`.
///
/// # Errors
/// [`Error::NoStartPosition`] when the topic cannot be told to be the same or recreated; errors of `read`.
pub fn after_generation_change(
    u: &Unpositioned,
    group: &str,
    generation: &str,
    old: Option<&OldCheckpoint>,
    read: impl FnOnce(i64, Option<i64>, &[u8]) -> Result<ReadBack>,
) -> Result<Start> {
    let at = format!("{}/{}", u.topic, u.partition);
    let Some(old) = old else {
        return Ok(Start {
            offset: u.low,
            from: "generation change: the earlier generation never read this partition, so from its beginning"
                .into(),
        });
    };
    let g = &old.generation;
    let recreated = |why: String| Start {
        offset: u.low,
        from: format!("generation change: topic recreated ({why}), so from its beginning"),
    };
    // The refused run already holds generation `generation`'s checkpoint row (next_offset NULL): the operator
    // decides by setting its next_offset.
    let undecidable = |why: String| {
        Error::NoStartPosition(format!(
            "{at}: [identity] generation changed to `{generation}`; {why}, so it cannot be told whether the topic \
             is the same one (continue at {next}) or was recreated (start at {low}). Decide by setting generation \
             `{generation}`'s checkpoint: to continue, UPDATE {tbl} SET next_offset = {next} WHERE \
             consumer_group = '{group}' AND generation = '{generation}' AND topic = '{topic}' AND partition = \
             {part}; to start over, the same with next_offset = {low}",
            next = old.next_offset,
            low = u.low,
            tbl = u.checkpoints,
            topic = u.topic,
            part = u.partition,
        ))
    };
    if let Some(decided) = by_log_ids(u, old, &at, recreated)? {
        return Ok(decided);
    }
    if old.next_offset > u.high {
        return Ok(recreated(format!(
            "its log ends at {} below generation `{g}`'s checkpoint {}",
            u.high, old.next_offset
        )));
    }
    if old.last.is_none() && old.applied_nothing {
        // No record of the partition was applied by that generation: nothing can be counted twice.
        // Below the log start: the caller refuses, naming the records lost before they were applied.
        if old.next_offset <= u.low {
            return Ok(Start {
                offset: old.next_offset,
                from: format!(
                    "generation change: generation `{g}` applied no record of this partition, so from its start \
                     {}",
                    old.next_offset
                ),
            });
        }
        return Err(undecidable(format!(
            "generation `{g}` applied no record of this partition since its start position {}",
            old.next_offset
        )));
    }
    let Some((last, ts, sha)) = &old.last else {
        if old.next_offset <= u.low {
            // Nothing between the checkpoint and the log start to tell the topic by: continuing and starting over
            // are the same at the log start; below it the caller refuses, naming the records lost before they were
            // applied.
            return Ok(Start {
                offset: old.next_offset,
                from: format!(
                    "generation change: generation `{g}`'s checkpoint {} is at or below the log start (no record \
                     to tell the topic by)",
                    old.next_offset
                ),
            });
        }
        return Err(undecidable(format!(
            "generation `{g}` stopped at offset {} but its checkpoint (written by an earlier replaysafe) has no \
             record fingerprint",
            old.next_offset
        )));
    };
    if *last >= u.high {
        return Ok(recreated(format!(
            "no record at offset {last}, which generation `{g}` applied last"
        )));
    }
    if *last < u.low {
        // Retention removed the record; everything up to the checkpoint is gone either way. A checkpoint below
        // the log start is returned as it is: the caller refuses, naming the records lost before they were
        // applied (as without a generation change).
        if old.next_offset <= u.low {
            return Ok(Start {
                offset: old.next_offset,
                from: format!(
                    "generation change: the record generation `{g}` applied last is gone (retention), so from its \
                     checkpoint {}",
                    old.next_offset
                ),
            });
        }
        return Err(undecidable(format!(
            "the record generation `{g}` applied last (offset {last}) was deleted by retention"
        )));
    }
    match read(*last, *ts, sha)? {
        ReadBack::Same => Ok(Start {
            offset: old.next_offset,
            from: format!(
                "generation change: topic unchanged (offset {last} is the record generation `{g}` applied last), \
                 so from generation `{g}`'s checkpoint"
            ),
        }),
        ReadBack::Different => Ok(recreated(format!(
            "offset {last} is not the record generation `{g}` applied last"
        ))),
        ReadBack::Gone(next) => Err(undecidable(format!(
            "the record generation `{g}` applied last (offset {last}) is no longer in the log (the next record is \
             at offset {next}: a compacted topic, or a recreated one)"
        ))),
    }
}

/// After a generation change, what the log ids decide when both sides have them (cases C46, C47): another
/// cluster → refused ([`Error::LogChanged`]: the old generation's offsets mean nothing here); another topic id →
/// recreated; the same topic id on the same cluster → the same topic, from the old checkpoint. `None`: the ids
/// do not decide (not recorded), the fingerprint does.
///
/// # Errors
/// [`Error::LogChanged`].
fn by_log_ids(
    u: &Unpositioned,
    old: &OldCheckpoint,
    at: &str,
    recreated: impl FnOnce(String) -> Start,
) -> Result<Option<Start>> {
    let g = &old.generation;
    if let (Some(was), Some(now)) = (&old.ids.1, &u.ids.1) {
        if was != now {
            return Err(Error::LogChanged(format!(
                "{at}: generation `{g}`'s checkpoint {} was written on cluster {was}, but these brokers are cluster \
                 {now} (a failover to a replica?): its offsets mean nothing here, so nothing was consumed (exit 7). \
                 Decide where this log starts with `replaysafe offsets start` (docs/guarantees.md \"A recreated topic, another \
                 cluster\")",
                old.next_offset
            )));
        }
    }
    let (Some(was), Some(now)) = (&old.ids.0, &u.ids.0) else {
        return Ok(None);
    };
    if was != now {
        return Ok(Some(recreated(format!(
            "its topic id is {now}, generation `{g}`'s checkpoint was written on topic id {was}"
        ))));
    }
    Ok(Some(Start {
        offset: old.next_offset,
        from: format!(
            "generation change: topic unchanged (topic id {now}, as generation `{g}`'s checkpoint recorded), so \
             from generation `{g}`'s checkpoint"
        ),
    }))
}

/// Reads the record at `offset` back and compares it with a stored fingerprint, waiting at most
/// [`READ_BACK_TIMEOUT`]. `config` is the pipeline's consumer configuration: the partition is assigned by hand
/// (librdkafka needs a `group.id` for that, but joins no group and, with auto-commit off, commits nothing).
///
/// # Errors
/// [`Error::Kafka`] for client errors, [`Error::Other`] when nothing arrives in time.
pub fn read_back(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    offset: i64,
    stored: (Option<i64>, &[u8]),
) -> Result<ReadBack> {
    let c: BaseConsumer = config.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    c.assign(&tpl)?;
    let deadline = Instant::now() + READ_BACK_TIMEOUT;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match c.poll(left.min(Duration::from_millis(500))) {
            Some(Ok(m)) if m.topic() == topic && m.partition() == partition => {
                if m.offset() > offset {
                    return Ok(ReadBack::Gone(m.offset()));
                }
                let same = m.offset() == offset
                    && m.timestamp().to_millis() == stored.0
                    && fingerprint(m.key(), m.payload()) == stored.1;
                return Ok(if same {
                    ReadBack::Same
                } else {
                    ReadBack::Different
                });
            }
            Some(Err(e)) => return Err(Error::Kafka(e)),
            _ => {}
        }
    }
    Err(Error::Other(format!(
        "{topic}/{partition}: reading offset {offset} back (to compare it with the earlier generation's last \
         record) took longer than {} s",
        READ_BACK_TIMEOUT.as_secs()
    )))
}

/// The newest checkpoint of every other generation of `group` on `topic`, by partition.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn old_checkpoints(
    client: &Client,
    p: &Pipeline,
    group: &str,
    generation: &str,
    topic: &str,
) -> Result<HashMap<i32, OldCheckpoint>> {
    let rows = client
        .query(
            &format!(
                "SELECT DISTINCT ON (partition) partition, generation, next_offset, last_offset, last_timestamp, \
                 last_sha256, topic_id, cluster_id FROM {} WHERE consumer_group = $1 AND topic = $2 AND generation <> $3 \
                 AND next_offset IS NOT NULL ORDER BY partition, updated_at DESC",
                p.table(checkpoint::CHECKPOINTS)
            ),
            &[&group, &topic, &generation],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let offset = r.get::<_, Option<i64>>(3);
            let last = match (offset, r.get::<_, Option<Vec<u8>>>(5)) {
                (Some(o), Some(sha)) => Some((o, r.get::<_, Option<i64>>(4), sha)),
                _ => None,
            };
            (
                r.get(0),
                OldCheckpoint {
                    generation: r.get(1),
                    next_offset: r.get(2),
                    applied_nothing: last.is_none() && offset == Some(NOTHING_APPLIED),
                    last,
                    ids: (r.get(6), r.get(7)),
                },
            )
        })
        .collect())
}

/// The topic's partition count when `group` began on it in `generation` (steps 3–4 of the module docs),
/// recording it now when nothing is recorded: as `partitions_now`, or — for a group that already holds
/// positions on the topic (checkpoints of an earlier version, or `positioned` partitions with a Kafka committed
/// offset) — one above the highest positioned partition.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn group_began_with(
    client: &Client,
    p: &Pipeline,
    group: &str,
    generation: &str,
    topic: &str,
    partitions_now: i32,
    positioned: &[i32],
) -> Result<i32> {
    let t = p.table(checkpoint::GROUP_STARTS);
    let select = format!(
        "SELECT partitions FROM {t} WHERE consumer_group = $1 AND generation = $2 AND topic = $3"
    );
    if let Some(r) = client
        .query_opt(&select, &[&group, &generation, &topic])
        .await?
    {
        return Ok(r.get(0));
    }
    let checkpointed: Option<i32> = client
        .query_one(
            &format!(
                "SELECT max(partition) FROM {} WHERE consumer_group = $1 AND generation = $2 AND topic = $3 \
                 AND next_offset IS NOT NULL",
                p.table(checkpoint::CHECKPOINTS)
            ),
            &[&group, &generation, &topic],
        )
        .await?
        .get(0);
    let began = match checkpointed
        .into_iter()
        .chain(positioned.iter().copied())
        .max()
    {
        Some(highest) => highest + 1,
        None => partitions_now,
    };
    client
        .execute(
            &format!(
                "INSERT INTO {t} (consumer_group, generation, topic, partitions) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT DO NOTHING"
            ),
            &[&group, &generation, &topic, &began],
        )
        .await?;
    Ok(client
        .query_one(&select, &[&group, &generation, &topic])
        .await?
        .get(0))
}

/// Steps 2–5 of the module docs for a partition of a group whose generation did not change.
///
/// # Errors
/// [`Error::NoStartPosition`] when nothing gives a position.
pub fn without_generation_change(
    u: &Unpositioned,
    group: &str,
    began_with: i32,
    start: Option<StartPolicy>,
) -> Result<Start> {
    if let Some(c) = u.committed {
        return Ok(Start {
            offset: c,
            from: "committed offset".into(),
        });
    }
    if u.partition >= began_with {
        return Ok(Start {
            offset: u.low,
            from: format!(
                "partition added after the group began (the topic had {began_with} partition(s) then), so from \
                 its beginning"
            ),
        });
    }
    match start {
        Some(StartPolicy::Earliest) => Ok(Start {
            offset: u.low,
            from: "start = earliest".into(),
        }),
        Some(StartPolicy::Latest) => Ok(Start {
            offset: u.high,
            from: "start = latest".into(),
        }),
        None => Err(Error::NoStartPosition(format!(
            "{}/{} has no checkpoint in PostgreSQL and no committed offset for group `{group}`; set \
             `start = \"earliest\"` or `start = \"latest\"` in [kafka] to decide where a new group begins",
            u.topic, u.partition
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(partition: i32, low: i64, high: i64, committed: Option<i64>) -> Unpositioned {
        Unpositioned {
            topic: "t".into(),
            partition,
            low,
            high,
            committed,
            checkpoints: "s.replaysafe_checkpoints".into(),
            ids: (None, None),
        }
    }

    fn old(next: i64, last: Option<i64>) -> OldCheckpoint {
        OldCheckpoint {
            generation: "g1".into(),
            next_offset: next,
            last: last.map(|o| (o, Some(1), vec![1])),
            applied_nothing: false,
            ids: (None, None),
        }
    }

    #[test]
    fn a_partition_added_after_the_group_began_starts_at_its_beginning() {
        let s = without_generation_change(&u(1, 0, 5, None), "g", 1, Some(StartPolicy::Latest))
            .unwrap();
        assert_eq!(s.offset, 0);
        let s = without_generation_change(&u(1, 3, 5, None), "g", 1, None).unwrap();
        assert_eq!(s.offset, 3);
        // A partition that existed when the group began follows `start`.
        let s = without_generation_change(&u(0, 0, 5, None), "g", 1, Some(StartPolicy::Latest))
            .unwrap();
        assert_eq!(s.offset, 5);
        assert!(without_generation_change(&u(0, 0, 5, None), "g", 1, None).is_err());
        // The committed offset comes first.
        let s = without_generation_change(&u(1, 0, 5, Some(2)), "g", 1, None).unwrap();
        assert_eq!(s.offset, 2);
    }

    /// Cases C46, C47: recorded ids decide a generation change without reading a record back.
    #[test]
    fn log_ids_decide_a_generation_change() {
        let never = |_: i64, _: Option<i64>, _: &[u8]| -> Result<ReadBack> { panic!("not read") };
        let with = |topic: &str, cluster: &str| OldCheckpoint {
            ids: (Some(topic.into()), Some(cluster.into())),
            ..old(7, Some(6))
        };
        let mut now = u(0, 0, 10, None);
        now.ids = (Some("B".into()), Some("C1".into()));
        let s = after_generation_change(&now, "g", "g2", Some(&with("A", "C1")), never).unwrap();
        assert_eq!(s.offset, 0, "another topic id: recreated, {s:?}");
        let s = after_generation_change(&now, "g", "g2", Some(&with("B", "C1")), never).unwrap();
        assert_eq!(s.offset, 7, "the same topic id: continue, {s:?}");
        let e =
            after_generation_change(&now, "g", "g2", Some(&with("B", "C0")), never).unwrap_err();
        assert!(
            matches!(e, Error::LogChanged(_)),
            "another cluster: refused, {e}"
        );
        // Not recorded: the fingerprint decides.
        let diff = |_, _, _: &[u8]| Ok(ReadBack::Different);
        let s = after_generation_change(&now, "g", "g2", Some(&old(7, Some(6))), diff).unwrap();
        assert_eq!(s.offset, 0);
    }

    #[test]
    fn a_generation_change_continues_only_on_the_same_topic() {
        let same = |_, _, _: &[u8]| Ok(ReadBack::Same);
        let diff = |_, _, _: &[u8]| Ok(ReadBack::Different);
        let never = |_: i64, _: Option<i64>, _: &[u8]| -> Result<ReadBack> { panic!("not read") };
        assert_eq!(
            after_generation_change(
                &u(0, 0, 10, Some(4)),
                "g",
                "g2",
                Some(&old(7, Some(6))),
                same
            )
            .unwrap()
            .offset,
            7
        );
        assert_eq!(
            after_generation_change(&u(0, 0, 10, None), "g", "g2", Some(&old(7, Some(6))), diff)
                .unwrap()
                .offset,
            0
        );
        // The log ends below the checkpoint, or at the last record: recreated.
        for o in [old(12, Some(11)), old(7, Some(6))] {
            let s = after_generation_change(&u(0, 0, 5, None), "g", "g2", Some(&o), never).unwrap();
            assert_eq!(s.offset, 0, "{s:?}");
        }
        // No fingerprint and the log still holds the offset: refused.
        let e = after_generation_change(&u(0, 0, 10, None), "g", "g2", Some(&old(7, None)), never)
            .unwrap_err();
        assert!(matches!(e, Error::NoStartPosition(_)), "{e}");
        // The record at the last offset was compacted away (the next one is later): refused, never "recreated".
        let gone = |_, _, _: &[u8]| Ok(ReadBack::Gone(8));
        let e =
            after_generation_change(&u(0, 0, 10, None), "g", "g2", Some(&old(7, Some(6))), gone)
                .unwrap_err();
        assert!(matches!(e, Error::NoStartPosition(_)), "{e}");
        // A resolved start under which nothing was applied: from the log start when at or below it, else refused.
        let idle = |next| OldCheckpoint {
            applied_nothing: true,
            ..old(next, None)
        };
        let s =
            after_generation_change(&u(0, 0, 10, None), "g", "g2", Some(&idle(0)), never).unwrap();
        assert_eq!(s.offset, 0, "{s:?}");
        let e = after_generation_change(&u(0, 0, 10, None), "g", "g2", Some(&idle(4)), never)
            .unwrap_err();
        assert!(matches!(e, Error::NoStartPosition(_)), "{e}");
        // No fingerprint but nothing applied past the log start (an empty partition's checkpoint at 0): from
        // the checkpoint, not refused (below the log start the caller refuses: records were lost).
        for (low, next) in [(0, 0), (4, 4), (4, 2)] {
            let s = after_generation_change(
                &u(0, low, 10, None),
                "g",
                "g2",
                Some(&old(next, None)),
                never,
            )
            .unwrap();
            assert_eq!(s.offset, next, "{s:?}");
        }
        // Never read by the earlier generation.
        assert_eq!(
            after_generation_change(&u(3, 2, 10, None), "g", "g2", None, never)
                .unwrap()
                .offset,
            2
        );
        // The last record was deleted by retention and the checkpoint is below the log start: the checkpoint
        // (the caller refuses the records lost in between); at the log start exactly, the log start.
        assert_eq!(
            after_generation_change(&u(0, 9, 10, None), "g", "g2", Some(&old(7, Some(6))), never)
                .unwrap()
                .offset,
            7
        );
        assert_eq!(
            after_generation_change(&u(0, 7, 10, None), "g", "g2", Some(&old(7, Some(6))), never)
                .unwrap()
                .offset,
            7
        );
    }
}
