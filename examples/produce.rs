//! Produces seed events (purchases and ~5% refunds, 10,000 customers, six days) to a topic, for benchmarks and
//! manual experiments.
//!
//! `cargo run --release --example produce -- BROKERS TOPIC EVENTS [PARTITIONS]` creates the topic (retention
//! off) if needed and prints the number of records written.
#![allow(
    clippy::disallowed_methods,
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "a benchmark tool with its own Kafka client; a panic is a broken run"
)]

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: produce BROKERS TOPIC EVENTS [PARTITIONS]");
        std::process::exit(2);
    }
    let (brokers, topic, n) = (&args[1], &args[2], args[3].parse::<usize>()?);
    let partitions: i32 = args.get(4).map(|p| p.parse()).transpose()?.unwrap_or(8);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new =
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)).set("retention.ms", "-1");
    for r in rt.block_on(admin.create_topics([&new], &AdminOptions::new()))? {
        if let Err((t, e)) = r {
            if e != RDKafkaErrorCode::TopicAlreadyExists {
                return Err(format!("create {t}: {e}").into());
            }
        }
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("compression.type", "lz4")
        .create()?;
    let t0 = 1_714_003_200_000i64; // 2024-04-25T00:00:00Z
    let started = Instant::now();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let day = (i * 6 / n) as i64;
        let ts = t0 + day * 86_400_000 + (x % 86_000_000) as i64;
        let customer = format!("c-{:05}", x % 10_000);
        let cents = (x >> 20) % 20_000 + 100;
        let sign = if (x >> 40) % 20 == 0 { "-" } else { "" };
        let occurred = chrono::DateTime::from_timestamp_millis(ts)
            .expect("ts")
            .to_rfc3339();
        let id = uuid::Uuid::from_u64_pair(x, i as u64);
        let value = format!(
            r#"{{"event_id":"{id}","customer_id":"{customer}","amount":"{sign}{}.{:02}","occurred_at":"{occurred}","event_type":"purchase"}}"#,
            cents / 100,
            cents % 100
        );
        let mut rec = BaseRecord::to(topic)
            .key(customer.as_str())
            .payload(value.as_str())
            .timestamp(ts);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(10));
                    rec = r;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    eprintln!(
        "produced {n} events to {topic} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    println!("{n}");
    Ok(())
}
