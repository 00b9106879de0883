//! `replaysafe offsets snapshot`: another group's positions, without joining that group.
//!
//! When the group is a replaysafe pipeline its checkpoint rows in PostgreSQL are the authority (Kafka's
//! committed offsets are written after them and may lag); otherwise Kafka's committed offsets are used. A
//! partition with no position is listed with `next_offset: null`, never as 0.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::sink::{self, checkpoint};

/// One partition's position in a [`StopFile`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StopEntry {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to read (Kafka's convention); `None`: the group has no position there.
    pub next_offset: Option<i64>,
}

/// The JSON written by `offsets snapshot` and read by `backfill --to-offsets`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopFile {
    /// The group whose positions these are.
    pub group: String,
    /// When the snapshot was taken (RFC 3339).
    pub taken_at: String,
    /// `postgres-checkpoints` or `kafka-committed`.
    pub source: String,
    /// Disagreements between the two sources, for the operator.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// One entry per partition of the pipeline's topics.
    pub partitions: Vec<StopEntry>,
    /// The consumer groups with checkpoints in this generation (at most 20, sorted): what a misspelled group is
    /// told to choose from. Not written to the file.
    #[serde(default, skip_serializing)]
    pub known_groups: Vec<String>,
}

impl StopFile {
    /// `offsets snapshot`'s refusal of a group with no position on any partition (a misspelled group, most
    /// likely): `Some` the message naming the group and the groups that have checkpoints.
    pub fn unknown_group(&self) -> Option<String> {
        if self.partitions.iter().any(|e| e.next_offset.is_some()) {
            return None;
        }
        let known = match self.known_groups.as_slice() {
            [] => "none has checkpoints in this schema and generation".to_string(),
            g => format!("groups with checkpoints here: {}", g.join(", ")),
        };
        Some(format!(
            "group {} has no position on any partition of {}: no checkpoint in PostgreSQL and no committed \
             offset in Kafka — is the group name right? ({known}; Kafka's own list: `kafka-consumer-groups.sh \
             --bootstrap-server … --list`). Nothing written; --allow-empty writes the file anyway (a backfill \
             with it then needs --missing-stop)",
            self.group,
            self.partitions
                .iter()
                .map(|e| e.topic.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Takes the snapshot of `group`'s positions.
///
/// # Errors
/// [`Error::Kafka`] / [`Error::Postgres`].
pub fn snapshot(
    pipeline: &Pipeline,
    brokers: &str,
    database_url: &str,
    group: &str,
) -> Result<StopFile> {
    let probe = crate::source::kafka::consumer_config(pipeline, brokers, &[]);
    crate::source::kafka::reachable(&probe, brokers, &pipeline.kafka.topics[0])?;
    // The pipeline's properties (security included); `group` only names whose offsets are read.
    let consumer: BaseConsumer = probe.clone().set("group.id", group).create()?;
    let parts = crate::source::kafka::partitions(&consumer, &pipeline.kafka.topics)?;
    let mut tpl = TopicPartitionList::new();
    for (t, p) in &parts {
        tpl.add_partition(t, *p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
    let kafka: BTreeMap<(String, i32), i64> = committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let generation = pipeline.identity.generation.clone().unwrap_or_default();
    let (checkpoints, known_groups): (BTreeMap<(String, i32), i64>, Vec<String>) = rt.block_on(async {
        let client = sink::connect_with(database_url, &pipeline.postgres.timeouts).await?;
        let table = pipeline.table(checkpoint::CHECKPOINTS).to_string();
        let exists: Option<String> = client.query_one("SELECT to_regclass($1)::text", &[&table]).await?.get(0);
        if exists.is_none() {
            return Ok::<_, Error>((BTreeMap::new(), Vec::new()));
        }
        let known = client
            .query(
                &format!(
                    "SELECT DISTINCT consumer_group FROM {table} WHERE generation = $1 ORDER BY 1 LIMIT 20"
                ),
                &[&generation],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let rows = client
            .query(
                &format!(
                    "SELECT topic, partition, next_offset FROM {table} WHERE consumer_group = $1 AND generation = $2 \
                     AND next_offset IS NOT NULL"
                ),
                &[&group, &generation],
            )
            .await?;
        Ok((rows.iter().map(|r| ((r.get(0), r.get(1)), r.get(2))).collect(), known))
    })?;
    let use_db = !checkpoints.is_empty();
    let mut warnings = Vec::new();
    let mut entries = Vec::new();
    for (t, p) in parts {
        let k = kafka.get(&(t.clone(), p)).copied();
        let c = checkpoints.get(&(t.clone(), p)).copied();
        if use_db && k.is_some() && k != c {
            warnings.push(format!(
                "{t}/{p}: PostgreSQL checkpoint {} and Kafka committed offset {} differ; the checkpoint is used",
                c.map_or("none".into(), |v| v.to_string()),
                k.map_or("none".into(), |v| v.to_string())
            ));
        }
        let next_offset = if use_db { c } else { k };
        entries.push(StopEntry {
            topic: t,
            partition: p,
            next_offset,
        });
    }
    warnings.extend(no_position(group, &entries));
    for w in &warnings {
        tracing::warn!("{w}");
    }
    Ok(StopFile {
        group: group.to_string(),
        taken_at: chrono::Utc::now().to_rfc3339(),
        source: if use_db {
            "postgres-checkpoints"
        } else {
            "kafka-committed"
        }
        .to_string(),
        warnings,
        partitions: entries,
        known_groups,
    })
}

/// Warnings for partitions where the group has no position (written as `null`, never as 0).
fn no_position(group: &str, entries: &[StopEntry]) -> Vec<String> {
    let missing: Vec<String> = entries
        .iter()
        .filter(|e| e.next_offset.is_none())
        .map(|e| format!("{}/{}", e.topic, e.partition))
        .collect();
    if missing.is_empty() {
        Vec::new()
    } else if missing.len() == entries.len() {
        vec![format!(
            "group {group} has no position on any partition ({}): no checkpoint in PostgreSQL and no committed \
             offset in Kafka — is the group name right? A backfill with this file needs --missing-stop",
            missing.join(", ")
        )]
    } else {
        vec![format!(
            "group {group} has no position on {} (written as null; a backfill with this file needs \
             --missing-stop for them)",
            missing.join(", ")
        )]
    }
}
