//! Where the engine's records come from ([`crate::engine::Source`]): positions in, records and "finished" out.
//!
//! - [`group`]: a consumer-group subscription; partitions are taken over on assignment (checkpoint row, fence
//!   bumped) and positioned at the checkpoint (else [`crate::start`]); acknowledged by Kafka offset commits.
//! - [`assign`]: explicit partitions with start and stop offsets (backfill, rebuild); finished when every stop
//!   is reached; acknowledged by Kafka offset commits of its own group.
//! - [`file`]: the records of a `kcat -C -J` file; finished at its end; nothing acknowledged.

pub mod assign;
pub mod file;
pub mod group;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::TopicPartitionList;

use crate::config::Pipeline;
use crate::engine::Record;

/// The librdkafka configuration of the pipeline's consumer: `brokers`, the pipeline's group and properties,
/// then `extra` (tests, demo); auto-commit, offset store and offset reset are forced off.
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
        .set("fetch.queue.backoff.ms", "50");
    for (k, v) in &p.kafka.properties {
        c.set(k, v);
    }
    for (k, v) in extra {
        c.set(k, v);
    }
    // Forced: offsets are ours to commit, after the database; positions are chosen explicitly on assignment,
    // and an out-of-range position later is an error, never a silent jump (librdkafka CONFIGURATION.md).
    c.set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set_log_level(RDKafkaLogLevel::Warning);
    c
}

/// Copies a consumed record for the engine.
pub fn record(msg: &BorrowedMessage<'_>) -> Record {
    Record {
        tp: (msg.topic().to_string(), msg.partition()),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis(),
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
        old_key: crate::debezium::old_key_header(msg).map(<[u8]>::to_vec),
    }
}

/// Commits offsets to Kafka; a failure is only logged (the checkpoint in PostgreSQL is authoritative).
pub fn kafka_commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    offsets: &TopicPartitionList,
    mode: CommitMode,
) {
    if let Err(e) = consumer.commit(offsets, mode) {
        // The checkpoint is the truth; a failed Kafka commit only delays lag reporting.
        tracing::warn!(
            "kafka offset commit failed (checkpoint in PostgreSQL is authoritative): {e}"
        );
    }
}
