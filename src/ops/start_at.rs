//! `replaysafe offsets start`: the operator's explicit start of a group's partitions on the log the brokers serve
//! now — after a topic was deleted and re-created under the same name (case C46) or a failover to a MirrorMaker 2
//! replica (case C47), which `run` refuses (exit 7, `source::identity`). Each partition's checkpoint is replaced
//! in one transaction: the old row is copied to `replaysafe_checkpoints_retired`, the fence is bumped (a running
//! owner's next batch fails and takes the partition over again), and the row gets the new next offset, the
//! broker's topic id and cluster id and — when those differ from the stored ones — a new incarnation tag, so the
//! new log's dead letters are rows of their own. Re-read records are recognised by their delivery keys in the
//! ledger (which never hold topic, partition or offset): applied ones count as duplicates.
//!
//! Where from: the log start, a time (the first record at or after it, Kafka's ListOffsets by timestamp), an
//! offset, or MirrorMaker 2's translated offset for the group ([`mm2_offsets`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::sink::{self, checkpoint};
use crate::source::kafka::{self, LogIds};

/// Where the partitions start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// The log start (`--from-earliest`).
    Earliest,
    /// The first record at or after this time, ms since the epoch (`--from-time`); the log end when none is.
    Time(i64),
    /// This offset (`--from-offset`, one partition).
    Offset(i64),
    /// The downstream offset MirrorMaker 2 translated for the group, from `<alias>.checkpoints.internal` on these
    /// brokers (`--from-mm2 ALIAS`, the source cluster's alias).
    Mm2(String),
}

/// What `offsets start` is asked.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The group whose checkpoints move (default: the pipeline's `group-id`).
    pub group: String,
    /// Only this topic (default: every topic of the pipeline).
    pub topic: Option<String>,
    /// Only this partition (needs `topic`).
    pub partition: Option<i32>,
    /// Where from.
    pub from: From,
}

/// One partition's new start, as printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Topic and partition.
    pub tp: (String, i32),
    /// The checkpoint replaced (`None`: there was none).
    pub was: Option<i64>,
    /// The new next offset.
    pub now: i64,
    /// The line for the operator.
    pub line: String,
}

/// How long reading MirrorMaker 2's checkpoints topic may take.
pub const MM2_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Moves the checkpoints of the selected partitions to the chosen start on the brokers' current log.
///
/// # Errors
/// [`Error::Usage`] for a selection or start that does not exist (a group without checkpoints of the selected
/// topics — [`known_group`] —, an unknown topic or partition, an offset outside the log, no MirrorMaker 2
/// checkpoint for a partition); Kafka and database errors.
pub fn start(
    p: &Pipeline,
    brokers: &str,
    database_url: &str,
    opts: &StartOptions,
) -> Result<Vec<Moved>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut client = rt.block_on(sink::connect_with(database_url, &p.postgres.timeouts))?;
    let topics: Vec<String> = match &opts.topic {
        Some(t) => vec![t.clone()],
        None => p.kafka.topics.clone(),
    };
    rt.block_on(known_group(&client, p, &opts.group, &topics))?;
    let probe = kafka::consumer_config(p, brokers, &[]);
    let topic0 = opts
        .topic
        .clone()
        .unwrap_or_else(|| p.kafka.topics[0].clone());
    kafka::reachable(&probe, brokers, &topic0)?;
    let consumer: BaseConsumer = probe.clone().set("group.id", &opts.group).create()?;
    let parts = selected(p, &consumer, opts)?;
    let topics: Vec<String> = {
        let mut t: Vec<String> = parts.iter().map(|(t, _)| t.clone()).collect();
        t.dedup();
        t
    };
    let ids = kafka::log_ids(&consumer, &topics)?;
    let positions = positions(&consumer, &parts, opts)?;
    rt.block_on(async {
        let mut out = Vec::new();
        for (tp, (offset, why)) in positions {
            out.push(replace(&mut client, p, &opts.group, &tp, offset, &why, &ids).await?);
        }
        Ok(out)
    })
}

/// At most this many other groups are named when `offsets start` refuses a group ([`known_group`]).
const GROUPS_NAMED: i64 = 20;

/// Refuses a group that has no checkpoint of any of `topics` in any generation — a misspelled `--group` would
/// otherwise get checkpoint rows of its own, and the group meant would keep its old positions. A group that never
/// ran starts where `[kafka] start` says; after a generation change the old generation's rows count.
///
/// # Errors
/// [`Error::Usage`] naming the group, the topics and the groups that do have checkpoints of them (at most
/// [`GROUPS_NAMED`]), with the query that lists them all; a database error.
pub async fn known_group(
    client: &tokio_postgres::Client,
    p: &Pipeline,
    group: &str,
    topics: &[String],
) -> Result<()> {
    let t = p.table(checkpoint::CHECKPOINTS);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&t.to_string()])
        .await?
        .get(0);
    let listing = format!(
        "SELECT consumer_group, generation, topic, count(*) AS partitions FROM {t} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    );
    if !exists {
        return Err(Error::Usage(format!(
            "offsets start: group `{group}` has no checkpoints: {t} does not exist (no `run` of this pipeline has \
             taken a partition over in this database); a group that never ran starts where [kafka] start says. \
             Nothing was changed"
        )));
    }
    let held: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {t} WHERE consumer_group = $1 AND topic = ANY($2)"),
            &[&group, &topics],
        )
        .await?
        .get(0);
    if held > 0 {
        return Ok(());
    }
    let others: Vec<String> = client
        .query(
            &format!(
                "SELECT DISTINCT consumer_group FROM {t} WHERE topic = ANY($1) ORDER BY 1 LIMIT {GROUPS_NAMED}"
            ),
            &[&topics],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let named = match others.is_empty() {
        true => "no group has checkpoints of them yet".to_string(),
        false => format!(
            "groups with checkpoints of them: {}{}",
            others
                .iter()
                .map(|g| format!("`{}`", crate::printable::escape_controls(g)))
                .collect::<Vec<_>>()
                .join(", "),
            if crate::units::bigint_len(others.len()) == GROUPS_NAMED {
                ", …"
            } else {
                ""
            }
        ),
    };
    Err(Error::Usage(format!(
        "offsets start: group `{}` has no checkpoint of {} in {t} (a misspelled --group?); {named}. List every \
         group's checkpoints with `{listing}`; a group that never ran starts where [kafka] start says. \
         Nothing was changed",
        crate::printable::escape_controls(group),
        topics.join(", "),
    )))
}

/// The partitions `opts` selects, refused when a named one does not exist.
fn selected(
    p: &Pipeline,
    consumer: &BaseConsumer,
    opts: &StartOptions,
) -> Result<Vec<(String, i32)>> {
    if opts.partition.is_some() && opts.topic.is_none() {
        return Err(Error::Usage("--partition needs --topic".into()));
    }
    if let Some(t) = &opts.topic {
        if !p.kafka.topics.contains(t) {
            return Err(Error::Usage(format!(
                "--topic {t} is not one of the pipeline's [kafka] topics ({})",
                p.kafka.topics.join(", ")
            )));
        }
    }
    let all = kafka::partitions(consumer, &p.kafka.topics)?;
    let parts: Vec<(String, i32)> = all
        .into_iter()
        .filter(|(t, n)| {
            opts.topic.as_ref().is_none_or(|x| x == t) && opts.partition.is_none_or(|x| x == *n)
        })
        .collect();
    if parts.is_empty() {
        return Err(Error::Usage(format!(
            "{}/{}: no such partition on the broker",
            opts.topic.as_deref().unwrap_or("?"),
            opts.partition.unwrap_or(-1)
        )));
    }
    if matches!(opts.from, From::Offset(_)) && parts.len() != 1 {
        return Err(Error::Usage(
            "--from-offset moves one partition: give --topic and --partition".into(),
        ));
    }
    Ok(parts)
}

/// Each partition's new next offset and why, checked against the log's bounds.
fn positions(
    consumer: &BaseConsumer,
    parts: &[(String, i32)],
    opts: &StartOptions,
) -> Result<BTreeMap<(String, i32), (i64, String)>> {
    let mut out = BTreeMap::new();
    let by_time = match &opts.from {
        From::Time(ms) => Some(crate::ops::backfill::plan::lookup_times(
            consumer, parts, *ms,
        )?),
        _ => None,
    };
    let mm2 = match &opts.from {
        From::Mm2(alias) => Some(mm2_offsets(consumer, alias, &opts.group)?),
        _ => None,
    };
    for tp in parts {
        let (low, high) = kafka::watermarks(consumer, &tp.0, tp.1, Duration::from_secs(30))?;
        let (offset, why) = match &opts.from {
            From::Earliest => (low, "the log start".to_string()),
            From::Offset(n) => (*n, format!("--from-offset {n}")),
            From::Time(ms) => match by_time.as_ref().and_then(|m| m.get(tp)) {
                Some(Offset::Offset(o)) => (*o, format!("the first record at or after {ms} ms")),
                _ => (high, format!("no record at or after {ms} ms: the log end")),
            },
            From::Mm2(alias) => match mm2.as_ref().and_then(|m| m.get(tp)) {
                Some(c) => (
                    c.downstream,
                    format!(
                        "MirrorMaker 2's checkpoint in {alias}.checkpoints.internal (upstream offset {} → {})",
                        c.upstream, c.downstream
                    ),
                ),
                None => {
                    return Err(Error::Usage(format!(
                        "{}/{}: {alias}.checkpoints.internal holds no checkpoint of group `{}` for this partition \
                         (is the alias right, does MirrorMaker 2 sync this group — sync.group.offsets / emit.checkpoints?); \
                         nothing was changed",
                        tp.0, tp.1, opts.group
                    )))
                }
            },
        };
        if offset < low || offset > high {
            return Err(Error::Usage(format!(
                "{}/{}: {why} is offset {offset}, outside the log [{low}, {high}]; nothing was changed",
                tp.0, tp.1
            )));
        }
        out.insert(tp.clone(), (offset, why));
    }
    Ok(out)
}

/// One partition's checkpoint replaced in one transaction (see the module docs).
async fn replace(
    client: &mut tokio_postgres::Client,
    p: &Pipeline,
    group: &str,
    tp: &(String, i32),
    offset: i64,
    why: &str,
    ids: &LogIds,
) -> Result<Moved> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let (t, r) = (
        p.table(checkpoint::CHECKPOINTS),
        p.table(checkpoint::RETIRED),
    );
    let (topic, partition) = (&tp.0, tp.1);
    let (topic_id, cluster_id) = (ids.topic(topic), ids.cluster.as_deref());
    let tx = client.transaction().await?;
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO {t} AS c (consumer_group, generation, topic, partition, next_offset, fence) \
                 VALUES ($1, $2, $3, $4, NULL, 1) ON CONFLICT (consumer_group, generation, topic, partition) \
                 DO UPDATE SET fence = c.fence + 1 RETURNING next_offset, topic_id, cluster_id, log"
            ),
            &[&group, &generation, topic, &partition],
        )
        .await?;
    let (was, old_topic, old_cluster, old_log): (
        Option<i64>,
        Option<String>,
        Option<String>,
        String,
    ) = (row.get(0), row.get(1), row.get(2), row.get(3));
    let other_log = matches!((&old_topic, topic_id), (Some(a), Some(b)) if a != b)
        || matches!((&old_cluster, cluster_id), (Some(a), Some(b)) if a != b);
    let log = if other_log {
        format!("{}/{}", cluster_id.unwrap_or(""), topic_id.unwrap_or(""))
    } else {
        old_log.clone()
    };
    let by = format!("offsets start: {why}");
    if was.is_some() {
        tx.execute(
            &format!(
                "INSERT INTO {r} (consumer_group, generation, topic, partition, next_offset, topic_id, cluster_id, \
                 log, last_offset, updated_at, retired_by) SELECT consumer_group, generation, topic, partition, \
                 next_offset, topic_id, cluster_id, log, last_offset, updated_at, $5 FROM {t} \
                 WHERE consumer_group = $1 AND generation = $2 AND topic = $3 AND partition = $4"
            ),
            &[&group, &generation, topic, &partition, &by],
        )
        .await?;
    }
    tx.execute(
        &format!(
            "UPDATE {t} SET next_offset = $5, topic_id = $6, cluster_id = $7, log = $8, last_offset = {}, \
             last_timestamp = NULL, last_sha256 = NULL, updated_at = now() \
             WHERE consumer_group = $1 AND generation = $2 AND topic = $3 AND partition = $4",
            crate::sink::checkpoint::NOTHING_APPLIED
        ),
        &[&group, &generation, topic, &partition, &offset, &topic_id, &cluster_id, &log],
    )
    .await?;
    tx.commit().await?;
    let shown = |v: Option<&str>| v.unwrap_or("(not recorded)").to_string();
    let line = format!(
        "{topic}/{partition}: group `{group}` starts at offset {offset} ({why}) on topic id {} of cluster {}; \
         replaced checkpoint {} (topic id {}, cluster {}){}",
        shown(topic_id),
        shown(cluster_id),
        was.map_or("none".to_string(), |w| w.to_string()),
        shown(old_topic.as_deref()),
        shown(old_cluster.as_deref()),
        if other_log {
            format!(", kept in {r}; this log's dead letters are tagged `{log}`")
        } else if was.is_some() {
            format!(", kept in {r}")
        } else {
            String::new()
        }
    );
    Ok(Moved {
        tp: tp.clone(),
        was,
        now: offset,
        line,
    })
}

/// One MirrorMaker 2 checkpoint: the group's committed offset upstream and its translation downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mm2Checkpoint {
    /// The group's committed offset on the source cluster.
    pub upstream: i64,
    /// Its translation on this cluster (the next offset to read here).
    pub downstream: i64,
}

/// The newest MirrorMaker 2 checkpoint of `group` per (topic, partition), read from `<alias>.checkpoints.internal`
/// on the brokers `consumer` talks to (from each partition's start to its end, within [`MM2_READ_TIMEOUT`]).
/// This is what `RemoteClusterUtils.translateOffsets` reads. The topic names are the replicated topics' names on
/// this cluster (`<alias>.<topic>` under the DefaultReplicationPolicy, the same name under the
/// IdentityReplicationPolicy); only names equal to the pipeline's topics are used.
///
/// # Errors
/// [`Error::Usage`] when the topic does not exist; [`Error::Other`] when it cannot be read in time; Kafka errors.
pub fn mm2_offsets(
    consumer: &BaseConsumer,
    alias: &str,
    group: &str,
) -> Result<BTreeMap<(String, i32), Mm2Checkpoint>> {
    let topic = format!("{alias}.checkpoints.internal");
    let parts = kafka::partitions(consumer, std::slice::from_ref(&topic)).map_err(|e| match e {
        Error::Other(m) => Error::Usage(format!(
            "{m} (MirrorMaker 2's checkpoints of source alias `{alias}`)"
        )),
        other => other,
    })?;
    read_checkpoints(consumer, &topic, &parts, group)
}

/// Reads every record of `parts` of the checkpoints topic with `consumer` (assigned by hand, nothing committed)
/// and keeps the newest checkpoint of `group` per partition.
fn read_checkpoints(
    consumer: &BaseConsumer,
    topic: &str,
    parts: &[(String, i32)],
    group: &str,
) -> Result<BTreeMap<(String, i32), Mm2Checkpoint>> {
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for (t, n) in parts {
        let (low, high) = kafka::watermarks(consumer, t, *n, Duration::from_secs(30))?;
        if high > low {
            ends.insert(*n, high);
            tpl.add_partition_offset(t, *n, Offset::Offset(low))?;
        }
    }
    let mut out = BTreeMap::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + MM2_READ_TIMEOUT;
    while !ends.is_empty() {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(Error::Other(format!(
                "reading {topic} took longer than {} s",
                MM2_READ_TIMEOUT.as_secs()
            )));
        };
        match consumer.poll(left.min(Duration::from_millis(500))) {
            Some(Ok(m)) => {
                if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                    if let Some((g, t, n, c)) = parse_checkpoint(k, v) {
                        if g == group {
                            out.insert((t, n), c);
                        }
                    }
                }
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => return Err(Error::Kafka(e)),
            None => {}
        }
    }
    let _ = consumer.unassign();
    Ok(out)
}

/// A record of MirrorMaker 2's checkpoints topic (Kafka's `org.apache.kafka.connect.mirror.Checkpoint`, value
/// version 0): key = group, topic (each a big-endian i16 length + UTF-8), partition (i32); value = version (i16,
/// 0), upstream offset (i64), downstream offset (i64), metadata (i16 length + UTF-8). `None` for anything else.
pub fn parse_checkpoint(key: &[u8], value: &[u8]) -> Option<(String, String, i32, Mm2Checkpoint)> {
    let mut k = Reader(key);
    let (group, topic, partition) = (k.string()?, k.string()?, k.i32()?);
    let mut v = Reader(value);
    if v.i16()? != 0 {
        return None;
    }
    let (upstream, downstream) = (v.i64()?, v.i64()?);
    Some((
        group,
        topic,
        partition,
        Mm2Checkpoint {
            upstream,
            downstream,
        },
    ))
}

/// Big-endian reads of Kafka's protocol types.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn i16(&mut self) -> Option<i16> {
        self.take::<2>().map(i16::from_be_bytes)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take::<4>().map(i32::from_be_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take::<8>().map(i64::from_be_bytes)
    }
    fn string(&mut self) -> Option<String> {
        let n = usize::try_from(self.i16()?).ok()?;
        let (s, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        String::from_utf8(s.to_vec()).ok()
    }
}

/// A MirrorMaker 2 checkpoint record's key and value (the inverse of [`parse_checkpoint`]; tests and fixtures
/// that emulate MirrorMaker 2).
pub fn checkpoint_record(
    group: &str,
    topic: &str,
    partition: i32,
    c: Mm2Checkpoint,
) -> (Vec<u8>, Vec<u8>) {
    let string = |s: &str, out: &mut Vec<u8>| {
        out.extend(i16::try_from(s.len()).unwrap_or(i16::MAX).to_be_bytes());
        out.extend(s.as_bytes());
    };
    let mut key = Vec::new();
    string(group, &mut key);
    string(topic, &mut key);
    key.extend(partition.to_be_bytes());
    let mut value = Vec::new();
    value.extend(0i16.to_be_bytes());
    value.extend(c.upstream.to_be_bytes());
    value.extend(c.downstream.to_be_bytes());
    string("", &mut value);
    (key, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_record_reads_back() {
        let c = Mm2Checkpoint {
            upstream: 1000,
            downstream: 995,
        };
        let (k, v) = checkpoint_record("g", "shop.order-events", 3, c);
        assert_eq!(
            parse_checkpoint(&k, &v),
            Some(("g".into(), "shop.order-events".into(), 3, c))
        );
        assert_eq!(parse_checkpoint(&k[..k.len() - 1], &v), None);
        let mut v1 = v.clone();
        v1[1] = 1;
        assert_eq!(parse_checkpoint(&k, &v1), None);
    }
}
