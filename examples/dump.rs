//! Writes a topic's records to stdout in the format of `kcat -C -J -e` (one JSON envelope per line: topic,
//! partition, offset, tstype, ts, broker, key, payload), for `replaysafe load` and `scripts/bench` on machines
//! without kcat.
//!
//! `cargo run --release --example dump -- BROKERS TOPIC > FILE` reads every partition from its start to its end
//! at the time of the call.
#![allow(
    clippy::disallowed_methods,
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "a benchmark tool with its own Kafka client; a panic is a broken run"
)]

use std::io::Write;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: dump BROKERS TOPIC");
        std::process::exit(2);
    }
    let (brokers, topic) = (&args[1], &args[2]);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "replaysafe-dump")
        .set("enable.auto.commit", "false")
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    let mut remaining = Vec::new();
    for p in md.topics()[0].partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(30))?;
        if high > low {
            tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            remaining.push((p.id(), high));
        }
    }
    consumer.assign(&tpl)?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out.lock());
    let mut n = 0u64;
    while !remaining.is_empty() {
        let Some(m) = consumer.poll(Duration::from_secs(10)) else {
            return Err("no record for 10 s before the end of the topic".into());
        };
        let m = m?;
        let Some(i) = remaining.iter().position(|(p, _)| *p == m.partition()) else {
            continue;
        };
        write!(
            out,
            "{{\"topic\":{},\"partition\":{},\"offset\":{}",
            serde_json::to_string(m.topic())?,
            m.partition(),
            m.offset()
        )?;
        match m.timestamp() {
            Timestamp::CreateTime(t) => write!(out, ",\"tstype\":\"create\",\"ts\":{t}")?,
            Timestamp::LogAppendTime(t) => write!(out, ",\"tstype\":\"logappend\",\"ts\":{t}")?,
            Timestamp::NotAvailable => {}
        }
        write!(out, ",\"broker\":-1,\"key\":")?;
        match m.key() {
            Some(k) => write!(
                out,
                "{}",
                serde_json::to_string(&String::from_utf8_lossy(k))?
            )?,
            None => write!(out, "null")?,
        }
        write!(out, ",\"payload\":")?;
        match m.payload() {
            Some(v) => writeln!(
                out,
                "{}}}",
                serde_json::to_string(&String::from_utf8_lossy(v))?
            )?,
            None => writeln!(out, "null}}")?,
        }
        n += 1;
        if m.offset() + 1 >= remaining[i].1 {
            remaining.swap_remove(i);
        }
    }
    out.flush()?;
    eprintln!("dumped {n} records of {topic}");
    Ok(())
}
