//! The Kafka side shared by the group and assign sources: the consumer configuration, partitions from
//! metadata, copying a record for the engine, committing offsets.
#![allow(
    clippy::disallowed_methods,
    reason = "the one place that builds clients of the pipeline's cluster (clippy.toml)"
)]

use std::time::Duration;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Pipeline;
use crate::engine::types::{Offsets, Record};
use crate::error::{Error, Result};

/// `statistics.interval.ms`: only `run`'s group consumer emits librdkafka statistics, for its membership
/// watchdog (`source/membership.rs`); the pipeline's value is kept off every other client, whose statistics
/// nobody would read (a client that does not poll its main queue would pile them up there).
pub const STATISTICS: &str = "statistics.interval.ms";

/// The librdkafka configuration of the pipeline's consumer: `brokers`, the pipeline's group and properties
/// (but [`STATISTICS`]), then `extra` (tests, demo); auto-commit, offset store and offset reset are forced off,
/// `isolation.level` is forced to `read_committed` (case C42).
pub fn consumer_config(p: &Pipeline, brokers: &str, extra: &[(String, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("group.id", &p.kafka.group_id)
        .set("client.id", "replaysafe")
        // Bounded prefetch keeps memory flat (librdkafka defaults: 64 MiB and 100,000 messages per partition
        // queue). 4 MiB per partition still holds ~20,000 seed events, more than a flush takes; at 16 MiB a
        // 1M-event first pass peaked at 150 MiB RSS, at 4 MiB at 68 MiB, with no loss of throughput.
        .set("queued.max.messages.kbytes", "4096")
        .set("queued.min.messages", "20000")
        // librdkafka (≥ 2.4) pauses a partition's fetching this long once the queue is full (default 1000 ms).
        .set("fetch.queue.backoff.ms", "50")
        // Bytes per partition per fetch (librdkafka's name for `max.partition.fetch.bytes`; default 1 MiB),
        // counted compressed: librdkafka decompresses a whole fetched batch and keeps it until its last record
        // is consumed, outside `queued.max.messages.kbytes`. Debezium envelopes with their JSON schema compress
        // ~10× under lz4: at 1 MiB, librdkafka held 177 MiB of decompressed batches (heaptrack) and a CDC run
        // peaked at 322 MiB RSS; at 256 KiB, 210 MiB, events/s unchanged, the seed first pass 101–111 MiB
        // (was 127–138). A record batch larger than this is still fetched whole (Kafka's fetch protocol).
        // Not set when the pipeline names it under either name: librdkafka applies a ClientConfig's entries in
        // hash order, so a default beside the alias would win in some processes and not in others.
        ;
    let named = |k: &str| p.kafka.properties.iter().chain(extra).any(|(e, _)| e == k);
    if !named("fetch.message.max.bytes") && !named("max.partition.fetch.bytes") {
        c.set("fetch.message.max.bytes", "262144");
    }
    for (k, v) in p.kafka.properties.iter().chain(extra) {
        if k != STATISTICS {
            c.set(k, v);
        }
    }
    // Forced: offsets are ours to commit, after the database; positions are chosen explicitly on assignment,
    // and an out-of-range position later is an error, never a silent jump (librdkafka CONFIGURATION.md).
    // Records of aborted producer transactions are never delivered: read_committed, set explicitly rather than
    // left to a default (the Java client's is read_uncommitted; `[kafka.properties]` may not override it).
    c.set("isolation.level", "read_committed");
    c.set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set_log_level(RDKafkaLogLevel::Warning);
    c
}

/// The librdkafka configuration of a client that is not a consumer (the admin client of backfill's retention
/// check): `brokers` and the pipeline's `[kafka.properties]` (but [`STATISTICS`]) — its security settings (`security.protocol`,
/// `sasl.*`, `ssl.*`) above all — with nothing forced. librdkafka ignores consumer-only properties on such a
/// client (a `CONFWARN` log line, not an error).
pub fn client_config(p: &Pipeline, brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", "replaysafe");
    for (k, v) in &p.kafka.properties {
        if k != STATISTICS {
            c.set(k, v);
        }
    }
    c.set_log_level(RDKafkaLogLevel::Warning);
    c
}

/// How the pipeline's clients reach the brokers, for `check --connect`: `security.protocol` (default
/// `PLAINTEXT`), and when set `sasl.mechanism`, `sasl.username` and `ssl.ca.location` — never a password or a key
/// (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, … are not looked at).
pub fn security_summary(p: &Pipeline) -> String {
    let get = |k: &str| {
        p.kafka
            .properties
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let mut parts = vec![get("security.protocol").unwrap_or("PLAINTEXT").to_string()];
    if let Some(m) = get("sasl.mechanism") {
        parts.push(match get("sasl.username") {
            Some(u) => format!("{m} as `{u}`"),
            None => m.to_string(),
        });
    }
    if let Some(ca) = get("ssl.ca.location") {
        parts.push(format!("CA {ca}"));
    }
    parts.join(", ")
}

/// Copies a consumed record for the engine.
pub fn record(msg: &BorrowedMessage<'_>) -> Record {
    Record {
        tp: (msg.topic().to_string(), msg.partition()),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis(),
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
        old_key: crate::decode::debezium::old_key_header(msg).map(<[u8]>::to_vec),
        decided: None,
    }
}

/// Commits offsets to Kafka; a failure is only logged (the checkpoint in PostgreSQL is authoritative).
/// Returns whether the commit was sent (sync: and acknowledged) without an error; an asynchronous commit's own
/// result reaches the consumer context's `commit_callback`.
pub fn kafka_commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    offsets: &Offsets,
    mode: crate::engine::CommitMode,
) -> bool {
    match consumer.commit(&offset_list(offsets), rd_mode(mode)) {
        Ok(()) => true,
        Err(e) => {
            // The checkpoint is the truth; a failed Kafka commit only delays lag reporting.
            tracing::warn!(
                "kafka offset commit failed (checkpoint in PostgreSQL is authoritative): {e}"
            );
            false
        }
    }
}

/// The engine's acknowledged offsets (next offset to read per partition) as librdkafka's list, in their order.
pub fn offset_list(offsets: &Offsets) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for ((topic, partition), next) in offsets {
        // Only a negative partition id is refused, and no held partition has one.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
    }
    tpl
}

/// The engine's commit mode as librdkafka's.
pub fn rd_mode(mode: crate::engine::CommitMode) -> CommitMode {
    match mode {
        crate::engine::CommitMode::Sync => CommitMode::Sync,
        crate::engine::CommitMode::Async => CommitMode::Async,
    }
}

/// The partitions of the pipeline's topics, from broker metadata.
///
/// # Errors
/// [`Error::Kafka`]; [`Error::Other`] when a topic does not exist.
pub fn partitions(consumer: &BaseConsumer, topics: &[String]) -> Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    for t in topics {
        let md = consumer.fetch_metadata(Some(t), Duration::from_secs(30))?;
        let topic = md
            .topics()
            .first()
            .ok_or_else(|| Error::Other(format!("topic {t} not found")))?;
        if topic.error().is_some() || topic.partitions().is_empty() {
            return Err(Error::Other(format!(
                "topic {t} does not exist on the broker"
            )));
        }
        for p in topic.partitions() {
            out.push((t.clone(), p.id()));
        }
    }
    out.sort();
    Ok(out)
}

/// Collects librdkafka's error callbacks (`Connect to … failed: Connection refused`, `Failed to resolve …`) for
/// [`reachable`]'s message.
#[derive(Default)]
struct Reasons(std::sync::Mutex<Vec<String>>);

impl rdkafka::ClientContext for Reasons {
    fn error(&self, error: KafkaError, reason: &str) {
        let mut all = self
            .0
            .lock()
            .expect("reasons: a thread panicked holding this lock");
        // "1/1 brokers are down" follows every failed connect: keep the reason that says why.
        let informative = !reason.contains("brokers are down") || all.is_empty();
        // Repeated attempts differ only in the "(after N ms in state …)" tail.
        let head = reason.split(" (after ").next().unwrap_or(reason);
        if informative && !all.iter().any(|r| r.starts_with(head)) {
            tracing::debug!("kafka: {error}: {reason}");
            all.push(reason.to_string());
        }
    }

    /// librdkafka logs a failed connection (`FAIL`: `Connect to … failed: Connection refused`) from its broker
    /// threads; the error callback would need a poll.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if (level as i32) <= (RDKafkaLogLevel::Warning as i32) || fac == "FAIL" {
            self.error(
                KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                message,
            );
        }
    }
}

impl ConsumerContext for Reasons {}

/// Waits until the brokers answer a metadata request for `topic` (with the pipeline's client configuration:
/// security properties included), for at most `--connect-timeout` ([`crate::endpoint::connect_timeout`]),
/// warning every 5 s with the address and the cause.
///
/// # Errors
/// [`Error::Connect`] naming the brokers, where they came from and the cause (connection refused, DNS lookup
/// failed, authentication failed — at once, not retried —, timed out); [`Error::Kafka`] when the configuration
/// is refused.
pub fn reachable(config: &ClientConfig, brokers: &str, topic: &str) -> Result<()> {
    let mut c = config.clone();
    c.remove("group.id");
    c.remove(STATISTICS);
    let probe: BaseConsumer<Reasons> = c.create_with_context(Reasons::default())?;
    let started = std::time::Instant::now();
    let deadline = started + crate::endpoint::connect_timeout();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let attempt = left
            .min(Duration::from_secs(5))
            .max(Duration::from_millis(100));
        let result = probe.fetch_metadata(Some(topic), attempt);
        // Serve the log and error events queued meanwhile (they reach the context only through a poll).
        let drain = std::time::Instant::now() + Duration::from_millis(50);
        while std::time::Instant::now() < drain {
            let _ = probe.poll(Duration::from_millis(10));
        }
        let reasons = probe
            .context()
            .0
            .lock()
            .expect("reasons: a thread panicked holding this lock")
            .clone();
        if result.is_ok() {
            return Ok(());
        }
        let e = crate::endpoint::kafka_error(brokers, &reasons, None);
        if !e.transient || std::time::Instant::now() >= deadline {
            // Authentication is not retried; anything else once --connect-timeout has passed.
            let waited = Some(started.elapsed()).filter(|_| e.transient);
            let e = crate::endpoint::kafka_error(brokers, &reasons, waited);
            return Err(Error::Connect(e));
        }
        tracing::warn!("{e}; retrying for up to --connect-timeout");
    }
}

/// How long [`watermarks`] keeps retrying a transient broker error (a partition without a leader yet — a topic
/// just created, a broker restarting or failing over — or a request timeout) before it gives up.
pub const WATERMARK_RETRY: Duration = Duration::from_secs(30);

/// The partition's low and high watermarks (first offset kept, next offset to be written), asked of the
/// partition's leader with `timeout` per attempt. Errors Kafka documents as retriable (`NOT_LEADER_OR_FOLLOWER`,
/// `LEADER_NOT_AVAILABLE`, `UNKNOWN_TOPIC_OR_PARTITION` while metadata propagates, timeouts, transport failures;
/// Kafka protocol guide, "Error Codes") are retried with backoff (100 ms doubling to 2 s) for at most
/// [`WATERMARK_RETRY`]; a leader election is not a reason to stop a worker.
///
/// # Errors
/// [`Error::Kafka`]: a non-retriable error, or the last retriable one after [`WATERMARK_RETRY`].
pub fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64)> {
    let deadline = std::time::Instant::now() + WATERMARK_RETRY;
    let mut pause = Duration::from_millis(100);
    loop {
        match consumer.fetch_watermarks(topic, partition, timeout) {
            Ok(w) => return Ok(w),
            Err(e) if retriable(&e) && std::time::Instant::now() + pause < deadline => {
                tracing::warn!(%topic, partition, "watermarks: {e}; retrying in {pause:?}");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether a Kafka client error is one the broker expects the client to retry (leadership moving, metadata not
/// propagated yet, a timeout, a connection lost).
fn retriable(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    let code = match e {
        KafkaError::MetadataFetch(c) | KafkaError::OffsetFetch(c) => *c,
        _ => return false,
    };
    matches!(
        code,
        C::NotLeaderForPartition
            | C::LeaderNotAvailable
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::BrokerNotAvailable
            | C::NotCoordinator
            | C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
    )
}

/// Which log a partition's offsets belong to: the cluster's id and each topic's id (KIP-516), as the broker
/// answers them. A checkpoint keeps both (`replaysafe_checkpoints.cluster_id`, `topic_id`): the same offset on
/// another cluster (a MirrorMaker 2 replica) or on a topic deleted and re-created under the same name is another
/// record (docs/guarantees.md "A recreated topic, another cluster").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogIds {
    /// The cluster id (`rd_kafka_clusterid`, Kafka's `cluster.id`: 22 characters of URL-safe base64); `None`
    /// when the broker did not say in time.
    pub cluster: Option<String>,
    /// Topic name → topic id (KIP-516, base64 as `kafka-topics --describe` prints `TopicId`); a topic missing
    /// here was not described (it does not exist, or the broker predates topic ids).
    pub topics: std::collections::BTreeMap<String, String>,
}

impl LogIds {
    /// The topic's id, if known.
    pub fn topic(&self, topic: &str) -> Option<&str> {
        self.topics.get(topic).map(String::as_str)
    }
}

/// How long [`log_ids`] waits for the cluster id and for the topics' description.
pub const LOG_IDS_TIMEOUT: Duration = Duration::from_secs(30);

/// The cluster id and the ids of `topics`, asked of the brokers `consumer` talks to, each answer within
/// [`LOG_IDS_TIMEOUT`].
///
/// # Errors
/// [`Error::Other`] when DescribeTopics fails or a topic's description carries an error (naming the topic and
/// librdkafka's message).
pub fn log_ids<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[String],
) -> Result<LogIds> {
    let cluster = consumer.client().fetch_cluster_id(LOG_IDS_TIMEOUT);
    if cluster.as_deref().is_some_and(is_mock_cluster) {
        // librdkafka's mock cluster (`demo`, `prove`'s scratch cluster) names no controller, so DescribeTopics
        // would wait out its timeout and fail; its topics are created fresh for each run and carry no ids.
        return Ok(LogIds {
            cluster,
            topics: std::collections::BTreeMap::new(),
        });
    }
    let topics = describe_topic_ids(consumer.client().native_ptr(), topics, LOG_IDS_TIMEOUT)?;
    Ok(LogIds { cluster, topics })
}

/// Whether `cluster_id` is librdkafka's in-process mock cluster's (`rdkafka_mock.c` names it `mockCluster<hex>`).
fn is_mock_cluster(cluster_id: &str) -> bool {
    cluster_id.starts_with("mockCluster")
}

/// Topic name → topic id through librdkafka's `rd_kafka_DescribeTopics` (librdkafka ≥ 2.3; KIP-516 ids from
/// the broker's Metadata v12 answer), which the `rdkafka` crate (0.39) does not bind safely: the raw binding of
/// `rdkafka-sys`, every object it allocates destroyed before returning. `rk` is a live client handle (any
/// client type may run admin requests); the answer is awaited on a private queue for at most `timeout`.
/// A topic the broker does not know is left out of the map.
///
/// # Errors
/// [`Error::Other`]: the request failed or timed out, or a described topic carries an error other than
/// UNKNOWN_TOPIC_OR_PART.
fn describe_topic_ids(
    rk: *mut rdkafka::bindings::rd_kafka_t,
    topics: &[String],
    timeout: Duration,
) -> Result<std::collections::BTreeMap<String, String>> {
    use rdkafka::bindings as rd;
    use std::ffi::{CStr, CString};
    let mut out = std::collections::BTreeMap::new();
    if topics.is_empty() {
        return Ok(out);
    }
    let names: Vec<CString> = topics
        .iter()
        .map(|t| {
            CString::new(t.as_str())
                .map_err(|_| Error::Other(format!("topic name {t:?} holds a NUL")))
        })
        .collect::<Result<_>>()?;
    let mut ptrs: Vec<*const std::os::raw::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `rk` outlives this call (the caller holds its client); every pointer read below belongs to the
    // event, which is destroyed last; the collection, options and queue are destroyed on every path.
    unsafe {
        let coll = rd::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len());
        let opts = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as std::os::raw::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(opts, ms, errstr.as_mut_ptr(), errstr.len());
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_DescribeTopics(rk, coll, opts, queue);
        let event = rd::rd_kafka_queue_poll(queue, ms.saturating_add(1000));
        rd::rd_kafka_TopicCollection_destroy(coll);
        rd::rd_kafka_AdminOptions_destroy(opts);
        rd::rd_kafka_queue_destroy(queue);
        if event.is_null() {
            return Err(Error::Other(format!(
                "describing topics {topics:?} (their topic ids) took longer than {} s",
                timeout.as_secs()
            )));
        }
        let text = |p: *const std::os::raw::c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let result = (|| {
            if rd::rd_kafka_event_error(event)
                != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                return Err(Error::Other(format!(
                    "describing topics {topics:?} (their topic ids): {}",
                    text(rd::rd_kafka_event_error_string(event))
                )));
            }
            let res = rd::rd_kafka_event_DescribeTopics_result(event);
            let mut n = 0usize;
            let descs = rd::rd_kafka_DescribeTopics_result_topics(res, &mut n);
            for i in 0..n {
                let d = *descs.add(i);
                let name = text(rd::rd_kafka_TopicDescription_name(d));
                let err = rd::rd_kafka_TopicDescription_error(d);
                if !err.is_null() {
                    let code = rd::rd_kafka_error_code(err);
                    if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                        || code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    {
                        continue;
                    }
                    return Err(Error::Other(format!(
                        "describing topic `{name}` (its topic id): {}",
                        text(rd::rd_kafka_error_string(err))
                    )));
                }
                let id = rd::rd_kafka_TopicDescription_topic_id(d);
                if !id.is_null() {
                    let b64 = text(rd::rd_kafka_Uuid_base64str(id));
                    // The all-zero id: a broker without topic ids.
                    if !b64.is_empty() && b64 != "AAAAAAAAAAAAAAAAAAAAAA" {
                        out.insert(name, b64);
                    }
                }
            }
            Ok(())
        })();
        rd::rd_kafka_event_destroy(event);
        result?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefetch bounds are defaults: a pipeline's `[kafka.properties]` value wins.
    #[test]
    fn fetch_size_is_bounded_unless_the_pipeline_sets_it() {
        let reference = include_str!("../../reference.toml");
        let p = crate::config::parse("reference.toml", reference).unwrap();
        let c = consumer_config(&p, "127.0.0.1:9092", &[]);
        assert_eq!(c.get("fetch.message.max.bytes"), Some("262144"));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
        let text = reference.replace(
            "\"fetch.max.bytes\" = 52428800",
            "\"fetch.max.bytes\" = 52428800\n\"fetch.message.max.bytes\" = 1048576",
        );
        let p = crate::config::parse("p.toml", &text).unwrap();
        let c = consumer_config(&p, "127.0.0.1:9092", &[]);
        assert_eq!(c.get("fetch.message.max.bytes"), Some("1048576"));
        // The Java client's name is librdkafka's alias: the default is not set beside it.
        let text = text.replace(
            "\"fetch.message.max.bytes\"",
            "\"max.partition.fetch.bytes\"",
        );
        let p = crate::config::parse("p.toml", &text).unwrap();
        let c = consumer_config(&p, "127.0.0.1:9092", &[]);
        assert_eq!(c.get("fetch.message.max.bytes"), None);
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("1048576"));
    }
}
