//! The test broker: topics, producing records, committed offsets, retention loss and partition changes.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::{brokers, wait_until};

/// A single-threaded tokio runtime for one blocking helper call.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An admin client on the test broker.
pub fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap()
}

/// A consumer on the test broker with the given extra settings (`group.id` …); it joins no group by itself.
pub fn consumer(settings: &[(&str, &str)]) -> BaseConsumer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers());
    for (k, v) in settings {
        c.set(*k, *v);
    }
    c.create().unwrap()
}

/// Creates a topic on the test broker. Retention is off (`retention.ms=-1`) unless `configs` says otherwise:
/// the cases carry 2024 timestamps, which the broker's default 7-day retention would delete at once.
pub fn create_topic(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let rt = runtime();
    let admin = admin();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    if !configs.iter().any(|(k, _)| *k == "retention.ms") {
        topic = topic.set("retention.ms", "-1");
    }
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let res = rt
        .block_on(admin.create_topics([&topic], &AdminOptions::new()))
        .unwrap();
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// One record to produce.
#[derive(Clone, Debug)]
pub struct Rec {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

impl Rec {
    /// A record of UTF-8 `key` and `value` (JSON text) with CreateTime `ts` (ms since the epoch).
    pub fn json(partition: i32, key: &str, value: &str, ts: i64) -> Rec {
        Rec {
            partition,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            timestamp_ms: Some(ts),
        }
    }
}

/// A producer on the test broker that batches for `linger_ms`.
fn producer(linger_ms: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("message.max.bytes", "4194304")
        .set("linger.ms", linger_ms)
        .create()
        .unwrap()
}

/// The rdkafka record of `r` for `topic`.
fn future_record<'a>(topic: &'a str, r: &'a Rec) -> FutureRecord<'a, [u8], [u8]> {
    let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(r.partition);
    if let Some(k) = &r.key {
        fr = fr.key(k.as_slice());
    }
    if let Some(v) = &r.value {
        fr = fr.payload(v.as_slice());
    }
    if let Some(ts) = r.timestamp_ms {
        fr = fr.timestamp(ts);
    }
    fr
}

/// Produces records in order (each acknowledged before the next) and returns their offsets.
pub fn produce(topic: &str, records: &[Rec]) -> Vec<i64> {
    let rt = runtime();
    let producer = producer("5");
    rt.block_on(async {
        let mut offsets = Vec::new();
        for chunk in records.chunks(2000) {
            let futs = chunk
                .iter()
                .map(|r| producer.send(future_record(topic, r), Duration::from_secs(30)));
            // Sends are queued in order on one producer with idempotence defaults: order within a partition holds.
            for r in futures::future::join_all(futs).await {
                let delivery = r.unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
                offsets.push(delivery.offset);
            }
        }
        offsets
    })
}

/// Produces records in order (each acknowledged before the next), each with a `__debezium.oldkey` header when
/// it has one (a primary-key change's create: the old key's JSON bytes).
pub fn produce_with_old_keys(topic: &str, records: &[(Rec, Option<Vec<u8>>)]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let rt = runtime();
    let producer = producer("0");
    rt.block_on(async {
        for (r, old) in records {
            let mut fr = future_record(topic, r);
            if let Some(old) = old {
                fr = fr.headers(OwnedHeaders::new().insert(Header {
                    key: "__debezium.oldkey",
                    value: Some(old.as_slice()),
                }));
            }
            producer
                .send(fr, Duration::from_secs(30))
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        }
    });
}

/// Produces each record in a record batch of its own (each acknowledged before the next is sent): with a
/// pipeline's small `max.partition.fetch.bytes`, every fetch then brings a few records of *each* partition.
pub fn produce_singly(topic: &str, records: &[Rec]) {
    let rt = runtime();
    let producer = producer("0");
    rt.block_on(async {
        for r in records {
            producer
                .send(future_record(topic, r), Duration::from_secs(30))
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        }
    });
}

/// The consumer group's committed offsets (next offset to read) per partition, without joining the group.
pub fn committed(group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c = consumer(&[("group.id", group)]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(20)).unwrap();
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// Asserts that no partition of `topic` has a committed offset past `at` (next offset to read) for `group`: none,
/// or the start written to the checkpoint before anything is consumed (case C17), which the member commits again
/// once idle after its assignment — whether that happens before a crash or a refusal stops the run is timing.
pub fn assert_nothing_committed_past(
    group: &str,
    topic: &str,
    partitions: i32,
    at: i64,
    what: &str,
) {
    let got = committed(group, topic, partitions);
    assert!(
        got.iter().all(|c| c.is_none_or(|o| o == at)),
        "{what}: committed offsets {got:?} go past offset {at}"
    );
}

/// Advances a partition's log start offset (the admin DeleteRecords call): real retention loss.
pub fn delete_records_before(topic: &str, partition: i32, offset: i64) {
    let rt = runtime();
    let admin = admin();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    rt.block_on(admin.delete_records(&tpl, &AdminOptions::new()))
        .unwrap();
}

/// Deletes a topic and waits until the broker no longer lists it.
pub fn delete_topic(name: &str) {
    let rt = runtime();
    let admin = admin();
    rt.block_on(admin.delete_topics(&[name], &AdminOptions::new()))
        .unwrap();
    let c = consumer(&[]);
    wait_until(Duration::from_secs(60), "topic deletion", || {
        let md = c
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .unwrap();
        md.topics()
            .first()
            .is_none_or(|t| t.error().is_some() || t.partitions().is_empty())
    });
    std::thread::sleep(Duration::from_secs(1));
}

/// Raises a topic's partition count to `total` (the admin CreatePartitions call) and waits until the broker's
/// metadata shows them.
pub fn add_partitions(topic: &str, total: usize) {
    let rt = runtime();
    let admin = admin();
    let res = rt
        .block_on(admin.create_partitions(
            [&rdkafka::admin::NewPartitions::new(topic, total)],
            &AdminOptions::new(),
        ))
        .unwrap();
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("create partitions of {t}: {e}"));
    }
    let c = consumer(&[]);
    wait_until(
        Duration::from_secs(30),
        "new partitions in metadata",
        || {
            let md = c
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .unwrap();
            md.topics()
                .first()
                .is_some_and(|t| t.partitions().len() == total)
        },
    );
}
