//! What one `prove` works on: the fixture's records, the scratch topic they are published to (librdkafka's
//! embedded mock cluster, or `--brokers`), and variants of the user's pipeline on scratch schemas.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::{self, Pipeline};
use crate::decode::debezium::OLD_KEY_HEADER;
use crate::engine::{Record, Tp};
use crate::error::{Error, Result};

/// One record of the fixture as published on the scratch topic.
#[derive(Clone, Debug)]
pub struct Rec {
    /// Topic and partition.
    pub tp: Tp,
    /// Offset on the scratch topic.
    pub offset: i64,
    /// Timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// The Debezium old-key header.
    pub old_key: Option<Vec<u8>>,
}

impl Rec {
    /// The engine's record (decided by the engine).
    pub fn record(&self) -> Record {
        Record {
            tp: self.tp.clone(),
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: self.key.clone(),
            value: self.value.clone(),
            old_key: self.old_key.clone(),
            decided: None,
        }
    }
}

/// Reads a kcat `-J` file (as `load` reads it).
///
/// # Errors
/// [`Error::Usage`] when the file cannot be read; the line's error for a line that is not a kcat record of one
/// of the pipeline's topics.
pub fn read_fixture(p: &Pipeline, path: &Path) -> Result<Vec<Rec>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read --records {}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let r = crate::source::kcat::parse_line(p, line.trim(), &at)
            .map_err(|e| Error::Usage(format!("--records: {e}")))?;
        out.push(Rec {
            tp: r.tp,
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: r.key,
            value: r.value,
            old_key: r.old_key,
        });
    }
    if out.is_empty() {
        return Err(Error::Usage(format!(
            "--records {}: no records",
            path.display()
        )));
    }
    Ok(out)
}

/// Takes up to `max` records from `topic` on `brokers` (from its beginning, partitions in turn: at most
/// `⌈max / partitions⌉` of each, fewer where a partition ends first).
///
/// The consumer is assigned its partitions explicitly and commits nothing, but it needs a `group.id` all the
/// same: librdkafka refuses `assign` without one (`Local: Unknown group`). It takes one of its own
/// (`replaysafe-prove-sample-<pid>`), never the pipeline's group, which joins nothing and holds no offsets.
///
/// # Errors
/// A Kafka error; [`Error::Usage`] when the topic is missing or empty.
pub fn sample_topic(p: &Pipeline, brokers: &str, topic: &str, max: usize) -> Result<Vec<Rec>> {
    let mut config = crate::source::kafka::consumer_config(p, brokers, &[]);
    config.set(
        "group.id",
        format!("replaysafe-prove-sample-{}", std::process::id()),
    );
    config.set("enable.auto.commit", "false");
    let c: BaseConsumer = config.create()?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let parts: Vec<i32> = md
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if parts.is_empty() {
        return Err(Error::Usage(format!(
            "--from-topic {topic}: no such topic on {}",
            crate::endpoint::mask_urls(brokers)
        )));
    }
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for part in &parts {
        let (lo, hi) = c.fetch_watermarks(topic, *part, Duration::from_secs(10))?;
        if hi > lo {
            tpl.add_partition_offset(topic, *part, Offset::Offset(lo))?;
            ends.insert(*part, hi);
        }
    }
    if ends.is_empty() {
        return Err(Error::Usage(format!(
            "--from-topic {topic}: the topic holds no records on {brokers}"
        )));
    }
    c.assign(&tpl)?;
    let per = max.div_ceil(ends.len());
    // Per partition: records taken, and the next offset to read (a partition is done at `per` records or at
    // its end — transaction markers leave offsets without records, so by position, not by count).
    let mut taken: BTreeMap<i32, (usize, i64)> = BTreeMap::new();
    let done = |taken: &BTreeMap<i32, (usize, i64)>| {
        ends.iter().all(|(p, end)| {
            taken
                .get(p)
                .is_some_and(|(n, next)| *n >= per || next >= end)
        })
    };
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while out.len() < max && !done(&taken) && std::time::Instant::now() < deadline {
        let Some(m) = c.poll(Duration::from_millis(500)) else {
            // Idle: a partition whose last records are transaction markers ends there.
            if let Ok(pos) = c.position() {
                for e in pos.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        let t = taken.entry(e.partition()).or_insert((0, 0));
                        t.1 = t.1.max(o);
                    }
                }
            }
            continue;
        };
        let m = m?;
        let t = taken.entry(m.partition()).or_insert((0, 0));
        t.1 = t.1.max(m.offset() + 1);
        if t.0 >= per || m.offset() >= ends[&m.partition()] {
            continue;
        }
        t.0 += 1;
        out.push(Rec {
            tp: (topic.to_string(), m.partition()),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            old_key: crate::decode::debezium::old_key_header(&m).map(<[u8]>::to_vec),
        });
    }
    if out.is_empty() {
        return Err(Error::Usage(format!(
            "--from-topic {topic}: no records read within 60 s"
        )));
    }
    Ok(out)
}

/// The scratch cluster: the mock cluster (kept alive here) or the user's brokers.
pub struct Cluster {
    _mock: Option<MockCluster<'static, rdkafka::producer::DefaultProducerContext>>,
    /// Bootstrap servers.
    pub brokers: String,
    /// The suffix of scratch topics on a real cluster (empty on the mock cluster); also of the consumer groups.
    pub suffix: String,
    /// The scratch topics created on a real cluster (deleted at the end unless `--keep`).
    created: std::sync::Mutex<Vec<String>>,
    /// The security settings of the pipeline's `[kafka.properties]` (`security.*`, `sasl.*`, `ssl.*`) on a
    /// real cluster, for prove's own producer, admin and offset committer (none on the mock cluster).
    security: Vec<(String, String)>,
}

impl Cluster {
    /// Starts the mock cluster (`brokers = None`) or uses `brokers` with the security settings of `properties`
    /// (the pipeline's `[kafka.properties]`); `run_id` names scratch topics there.
    ///
    /// # Errors
    /// A Kafka error.
    pub fn open(
        brokers: Option<String>,
        run_id: &str,
        properties: &[(String, String)],
    ) -> Result<Cluster> {
        let security = properties
            .iter()
            .filter(|(k, _)| {
                ["security.", "sasl.", "ssl."]
                    .iter()
                    .any(|p| k.starts_with(p))
            })
            .cloned()
            .collect();
        Ok(match brokers {
            Some(b) => Cluster {
                _mock: None,
                brokers: b,
                suffix: format!(".prove-{run_id}"),
                created: Default::default(),
                security,
            },
            None => {
                let mock = MockCluster::new(1)?;
                Cluster {
                    brokers: mock.bootstrap_servers(),
                    _mock: Some(mock),
                    suffix: String::new(),
                    created: Default::default(),
                    security: Vec::new(),
                }
            }
        })
    }

    /// Creates the scratch topics of `records` (named `topic + suffix`, as many partitions as the records
    /// use) and publishes them in order; returns them as published (their topic and new offsets).
    ///
    /// # Errors
    /// A Kafka error.
    pub fn publish(&self, records: &[Rec], rt: &tokio::runtime::Runtime) -> Result<Vec<Rec>> {
        let mut parts: BTreeMap<String, i32> = BTreeMap::new();
        for r in records {
            let n = parts.entry(r.tp.0.clone()).or_insert(1);
            *n = (*n).max(r.tp.1 + 1);
        }
        let named: Vec<(String, i32)> = parts
            .iter()
            .map(|(t, n)| (format!("{t}{}", self.suffix), *n))
            .collect();
        self.create_topics(&named, rt)?;
        let producer: BaseProducer = self.client().set("enable.idempotence", "true").create()?;
        let mut next: BTreeMap<Tp, i64> = BTreeMap::new();
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let topic = format!("{}{}", r.tp.0, self.suffix);
            let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&topic).partition(r.tp.1);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v.as_slice());
            }
            if let Some(ts) = r.timestamp_ms {
                rec = rec.timestamp(ts);
            }
            if let Some(old) = &r.old_key {
                rec = rec.headers(OwnedHeaders::new().insert(Header {
                    key: OLD_KEY_HEADER,
                    value: Some(old.as_slice()),
                }));
            }
            send(&producer, rec)?;
            let tp = (topic.clone(), r.tp.1);
            let o = next.entry(tp.clone()).or_insert(0);
            out.push(Rec {
                tp,
                offset: *o,
                ..r.clone()
            });
            *o += 1;
        }
        producer.flush(Duration::from_secs(30))?;
        Ok(out)
    }
}

impl Cluster {
    /// Creates `topics` (name, partitions): on the mock cluster directly, else through the admin API.
    fn create_topics(&self, topics: &[(String, i32)], rt: &tokio::runtime::Runtime) -> Result<()> {
        if let Some(mock) = &self._mock {
            for (t, n) in topics {
                mock.create_topic(t, *n, 1)?;
            }
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = self.client().create()?;
        let new: Vec<NewTopic> = topics
            .iter()
            .map(|(t, n)| NewTopic::new(t, *n, TopicReplication::Fixed(1)))
            .collect();
        for r in rt.block_on(admin.create_topics(&new, &AdminOptions::new()))? {
            match r {
                Ok(t) => self
                    .created
                    .lock()
                    .expect("topics: a thread panicked holding this lock")
                    .push(t),
                Err((t, code)) => {
                    return Err(Error::Other(format!("creating scratch topic {t}: {code}")))
                }
            }
        }
        Ok(())
    }

    /// A client configuration for the scratch cluster: its bootstrap servers and security settings.
    #[allow(
        clippy::disallowed_methods,
        reason = "prove's scratch cluster (the mock cluster or --brokers), not the pipeline's"
    )]
    pub fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.security {
            c.set(k, v);
        }
        c
    }

    /// The scratch topics this `prove` created on `--brokers` (none on the mock cluster).
    pub fn scratch_topics(&self) -> Vec<String> {
        self.created
            .lock()
            .expect("topics: a thread panicked holding this lock")
            .clone()
    }

    /// Deletes the scratch topics created on `--brokers` (the mock cluster goes with the process).
    ///
    /// # Errors
    /// A Kafka error, or a topic the cluster refused to delete (named).
    pub fn delete_topics(&self, rt: &tokio::runtime::Runtime) -> Result<()> {
        let topics = self.scratch_topics();
        if topics.is_empty() {
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = self.client().create()?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        for r in rt.block_on(admin.delete_topics(&names, &AdminOptions::new()))? {
            if let Err((t, code)) = r {
                return Err(Error::Other(format!("deleting scratch topic {t}: {code}")));
            }
        }
        self.created
            .lock()
            .expect("topics: a thread panicked holding this lock")
            .clear();
        Ok(())
    }
}

fn send(producer: &BaseProducer, mut rec: BaseRecord<'_, [u8], [u8]>) -> Result<()> {
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                producer.poll(Duration::from_millis(20));
                rec = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// How a boundary's pipeline differs from the user's: its scratch schema, and optionally its generation, batch
/// size, linger and connections, and its topics (the scratch topics).
#[derive(Clone, Default)]
pub struct Variant {
    /// The scratch schema.
    pub schema: String,
    /// `Some(g)`: `[identity] generation = g`.
    pub generation: Option<String>,
    /// `batch.max-records`.
    pub max_records: Option<usize>,
    /// `batch.linger-ms`.
    pub linger_ms: Option<u64>,
    /// `postgres.connections`.
    pub connections: Option<usize>,
}

/// The user's pipeline file, to derive variants from.
pub struct Base {
    /// The file's name (error locations).
    pub name: String,
    /// Its TOML.
    pub doc: toml::Table,
    /// The scratch topics' names, in `[kafka] topics` order.
    pub topics: Vec<String>,
    /// On the embedded mock cluster: `[kafka] brokers` and `[kafka.properties]` (SASL, TLS of the real
    /// cluster) are left out.
    pub mock: bool,
    /// Appended to every consumer group (the run id on `--brokers`, so that two `prove`s there never share a
    /// group; empty on the mock cluster, which is this process's own).
    pub group_suffix: String,
}

impl Base {
    /// The pipeline with `v` applied (parsed and validated again).
    ///
    /// # Errors
    /// The pipeline's own error (the variant keeps every key but those it sets).
    pub fn pipeline(&self, v: &Variant, group: &str) -> Result<Pipeline> {
        let mut doc = self.doc.clone();
        let mut set = |table: &str, key: &str, val: toml::Value| {
            let t = doc
                .entry(table.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(t) = t.as_table_mut() {
                t.insert(key.to_string(), val);
            }
        };
        set("postgres", "schema", toml::Value::String(v.schema.clone()));
        set(
            "kafka",
            "topics",
            toml::Value::Array(
                self.topics
                    .iter()
                    .cloned()
                    .map(toml::Value::String)
                    .collect(),
            ),
        );
        set(
            "kafka",
            "group-id",
            toml::Value::String(format!("{group}{}", self.group_suffix)),
        );
        // Every boundary reads its scratch topic from the start and owns its scratch schema.
        set("kafka", "start", toml::Value::String("earliest".into()));
        set("postgres", "manage-schema", toml::Value::Boolean(true));
        if let Some(g) = &v.generation {
            set("identity", "generation", toml::Value::String(g.clone()));
        }
        if let Some(n) = v.max_records {
            set(
                "batch",
                "max-records",
                toml::Value::Integer(crate::units::bigint_len(n)),
            );
        }
        if let Some(n) = v.linger_ms {
            set(
                "batch",
                "linger-ms",
                toml::Value::Integer(crate::units::bigint(n)),
            );
        }
        if let Some(n) = v.connections {
            set(
                "postgres",
                "connections",
                toml::Value::Integer(crate::units::bigint_len(n)),
            );
        }
        let from = self
            .doc
            .get("postgres")
            .and_then(|t| t.get("schema"))
            .and_then(|s| s.as_str())
            .unwrap_or("public");
        if self.mock {
            if let Some(k) = doc.get_mut("kafka").and_then(|k| k.as_table_mut()) {
                k.remove("properties");
                k.remove("brokers");
            }
        }
        requalify_sql(&mut doc, from, &v.schema);
        let text =
            toml::to_string(&doc).map_err(|e| Error::Other(format!("{}: {e}", self.name)))?;
        config::parse(&self.name, &text)
    }
}

/// `sql` projections name their tables themselves: `prove` runs them on the scratch schema by rewriting every
/// `<schema>.` (the pipeline's `[postgres] schema`, as a word, optionally quoted) in their `sql` and `setup`.
fn requalify_sql(doc: &mut toml::Table, from: &str, to: &str) {
    let Some(projections) = doc.get_mut("projection").and_then(|p| p.as_array_mut()) else {
        return;
    };
    for p in projections.iter_mut().filter_map(|p| p.as_table_mut()) {
        if p.get("kind").and_then(|k| k.as_str()) != Some("sql") {
            continue;
        }
        for key in ["sql", "setup"] {
            if let Some(toml::Value::String(text)) = p.get_mut(key) {
                *text = requalify(text, from, to);
            }
        }
    }
}

/// `text` with every `from.` and `"from".` that does not follow an identifier character spelled `to.`.
pub fn requalify(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let plain = format!("{from}.");
    let quoted = format!("\"{from}\".");
    while !rest.is_empty() {
        let before = out.chars().last();
        let boundary = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
        let hit = [&plain, &quoted].into_iter().find(|pat| {
            boundary && rest.len() >= pat.len() && rest[..pat.len()].eq_ignore_ascii_case(pat)
        });
        match hit {
            Some(pat) => {
                out.push_str(to);
                out.push('.');
                rest = &rest[pat.len()..];
            }
            None => {
                let c = rest.chars().next().expect("checked non-empty just above");
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// Whether a `sql` projection of `doc` does not name the pipeline's schema (its tables would be outside the
/// scratch schema): its number (1-based), for the refusal.
pub fn unqualified_sql(doc: &toml::Table, schema: &str) -> Option<usize> {
    let projections = doc.get("projection")?.as_array()?;
    projections.iter().enumerate().find_map(|(i, p)| {
        let sql = p.get("sql")?.as_str()?;
        (p.get("kind")?.as_str()? == "sql" && requalify(sql, schema, "\u{1}") == sql)
            .then_some(i + 1)
    })
}

/// A `sql` projection of `doc` whose `sql` or `setup` names (as `name.`, see [`requalify`]) a schema of the
/// database other than the pipeline's `schema` (and `pg_catalog`, `information_schema`): its number (1-based)
/// and that schema. Its statements would touch that schema, outside the scratch one.
///
/// # Errors
/// A database error.
pub async fn foreign_schema(
    client: &tokio_postgres::Client,
    doc: &toml::Table,
    schema: &str,
) -> Result<Option<(usize, String)>> {
    let Some(projections) = doc.get("projection").and_then(|p| p.as_array()) else {
        return Ok(None);
    };
    let names: Vec<String> = client
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE nspname <> ALL($1) AND nspname NOT LIKE 'pg\\_%'",
            &[&vec![schema, "information_schema"]],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (i, p) in projections.iter().enumerate() {
        if p.get("kind").and_then(|k| k.as_str()) != Some("sql") {
            continue;
        }
        for key in ["sql", "setup"] {
            let Some(text) = p.get(key).and_then(|t| t.as_str()) else {
                continue;
            };
            if let Some(n) = names.iter().find(|n| requalify(text, n, "\u{1}") != text) {
                return Ok(Some((i + 1, n.clone())));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requalify_rewrites_the_schema_as_a_word_only() {
        assert_eq!(
            requalify(
                "UPDATE shop.s SET x = 1 FROM landed, \"shop\".t, myshop.u",
                "shop",
                "scratch_1"
            ),
            "UPDATE scratch_1.s SET x = 1 FROM landed, scratch_1.t, myshop.u"
        );
    }
}
