//! Generates Debezium PostgreSQL-connector change events of `public.accounts` for the CDC bench (bench/cdc.sh).
//!
//! `cdcgen produce BROKERS TOPIC N ENCODING [REGISTRY_URL]` creates TOPIC (8 partitions, retention off) and
//! writes N envelopes; ENCODING is `json` (JsonConverter, `schemas.enable=false`), `json-schema`
//! (`schemas.enable=true`, Decimal as base64 bytes) or `avro` (schema-registry frame: magic 0, 4-byte schema
//! id, Avro binary; key and value schemas registered under `TOPIC-key`/`TOPIC-value` at REGISTRY_URL, the
//! Confluent-compatible API). `cdcgen replay BROKERS TOPIC N ENCODING I [REGISTRY_URL]` writes event I again
//! (an older envelope replayed after newer ones). `cdcgen csv N` prints every event as a CSV row
//! `id,owner,balance,updated_at,op,prev_commit_lsn,lsn` (the ceiling's COPY input).
//!
//! The workload: N/4 entities (`id` 1..=N/4), four rounds: round 0 creates every entity, rounds 1–2 update it,
//! round 3 deletes every tenth entity and updates the others. Keys go to partition `id % 8`. Event i has change
//! LSN `10_000_000 + 100·i`, transaction `1000 + i/4`, `sequence`
//! `["<previous transaction's last LSN>","<LSN>"]` (so the source position rises with i).
#![allow(
    clippy::disallowed_methods,
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "a benchmark tool with its own Kafka client; a panic is a broken run"
)]

use std::time::{Duration, Instant};

use base64::Engine;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One change of the workload.
struct Ev {
    id: i64,
    op: &'static str,
    owner: String,
    cents: i64,
    updated_ms: i64,
    lsn: i64,
    prev_commit: i64,
    tx: i64,
    ts_ms: i64,
}

fn event(i: usize, n: usize) -> Ev {
    let e = (n / 4).max(1);
    let (id, round) = ((i % e) as i64 + 1, i / e);
    let op = match round {
        0 => "c",
        3 if id % 10 == 0 => "d",
        _ => "u",
    };
    let lsn_of = |j: usize| 10_000_000 + 100 * j as i64;
    let tx = 1000 + (i / 4) as i64;
    let prev_commit = if i < 4 {
        9_999_900
    } else {
        lsn_of((i / 4) * 4 - 1)
    };
    let ts_ms = 1_714_003_200_000 + i as i64;
    Ev {
        id,
        op,
        owner: format!("acct-{id}-r{round}"),
        cents: (id * 7919 + round as i64 * 104_729) % 9_999_999 - 1_000_000,
        updated_ms: ts_ms,
        lsn: lsn_of(i),
        prev_commit,
        tx,
        ts_ms,
    }
}

fn balance(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("ms")
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// The unscaled value as minimal big-endian two's-complement bytes (Connect's Decimal).
fn unscaled(cents: i64) -> Vec<u8> {
    let b = cents.to_be_bytes();
    let mut k = 0;
    while k < 7 && ((b[k] == 0 && b[k + 1] & 0x80 == 0) || (b[k] == 0xff && b[k + 1] & 0x80 != 0)) {
        k += 1;
    }
    b[k..].to_vec()
}

fn source_json(ev: &Ev) -> String {
    format!(
        r#"{{"version":"3.6.1.Final","connector":"postgresql","name":"bench","ts_ms":{},"snapshot":"false","db":"app","sequence":"[\"{}\",\"{}\"]","ts_us":{},"ts_ns":{},"schema":"public","table":"accounts","txId":{},"lsn":{},"xmin":null}}"#,
        ev.ts_ms - 5,
        ev.prev_commit,
        ev.lsn,
        (ev.ts_ms - 5) * 1000,
        (ev.ts_ms - 5) * 1_000_000,
        ev.tx,
        ev.lsn
    )
}

fn row_json(ev: &Ev, schema: bool) -> String {
    let bal = if schema {
        format!(
            "\"{}\"",
            base64::engine::general_purpose::STANDARD.encode(unscaled(ev.cents))
        )
    } else {
        format!("\"{}\"", balance(ev.cents))
    };
    format!(
        r#"{{"id":{},"owner":"{}","balance":{bal},"updated_at":"{}"}}"#,
        ev.id,
        ev.owner,
        rfc3339(ev.updated_ms)
    )
}

fn payload_json(ev: &Ev, schema: bool) -> String {
    let (before, after) = if ev.op == "d" {
        (
            format!(
                r#"{{"id":{},"owner":null,"balance":null,"updated_at":null}}"#,
                ev.id
            ),
            "null".to_string(),
        )
    } else {
        ("null".to_string(), row_json(ev, schema))
    };
    format!(
        r#"{{"before":{before},"after":{after},"source":{},"transaction":null,"op":"{}","ts_ms":{},"ts_us":{},"ts_ns":{}}}"#,
        source_json(ev),
        ev.op,
        ev.ts_ms,
        ev.ts_ms * 1000,
        ev.ts_ms * 1_000_000
    )
}

/// The JsonConverter's `schema` member of the value (Debezium 3.6 PostgreSQL connector's shape).
const VALUE_SCHEMA: &str = r#"{"type":"struct","fields":[{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"string","optional":true,"field":"owner"},{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"balance"},{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"updated_at"}],"optional":true,"name":"bench.public.accounts.Value","field":"before"},{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"string","optional":true,"field":"owner"},{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"balance"},{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1,"field":"updated_at"}],"optional":true,"name":"bench.public.accounts.Value","field":"after"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"int64","optional":true,"field":"txId"},{"type":"int64","optional":true,"field":"lsn"},{"type":"int64","optional":true,"field":"xmin"}],"optional":false,"name":"io.debezium.connector.postgresql.Source","version":1,"field":"source"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"total_order"},{"type":"int64","optional":false,"field":"data_collection_order"}],"optional":true,"name":"event.block","version":1,"field":"transaction"},{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":"bench.public.accounts.Envelope","version":2}"#;
const KEY_SCHEMA: &str = r#"{"type":"struct","fields":[{"type":"int64","optional":false,"field":"id"}],"optional":false,"name":"bench.public.accounts.Key"}"#;

/// The Avro schemas the registry-aware Avro converters write (`connect.name` on logical types).
const AVRO_VALUE: &str = r#"{"type":"record","name":"Envelope","namespace":"bench.public.accounts","fields":[
 {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
   {"name":"id","type":"long"},
   {"name":"owner","type":["null","string"],"default":null},
   {"name":"balance","type":["null",{"type":"bytes","scale":2,"precision":12,"connect.version":1,
     "connect.parameters":{"scale":"2","connect.decimal.precision":"12"},
     "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
   {"name":"updated_at","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.time.ZonedTimestamp"}],"default":null}],
   "connect.name":"bench.public.accounts.Value"}],"default":null},
 {"name":"after","type":["null","Value"],"default":null},
 {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
   {"name":"version","type":"string"},{"name":"connector","type":"string"},{"name":"name","type":"string"},
   {"name":"ts_ms","type":"long"},{"name":"snapshot","type":["null","string"],"default":null},
   {"name":"db","type":"string"},{"name":"sequence","type":["null","string"],"default":null},
   {"name":"schema","type":"string"},{"name":"table","type":"string"},
   {"name":"txId","type":["null","long"],"default":null},{"name":"lsn","type":["null","long"],"default":null},
   {"name":"xmin","type":["null","long"],"default":null}]}},
 {"name":"op","type":"string"},
 {"name":"ts_ms","type":["null","long"],"default":null}],
 "connect.name":"bench.public.accounts.Envelope"}"#;
const AVRO_KEY: &str = r#"{"type":"record","name":"Key","namespace":"bench.public.accounts","fields":[{"name":"id","type":"long"}],"connect.name":"bench.public.accounts.Key"}"#;

/// Registers `schema` under `subject`; returns its id.
fn register(url: &str, subject: &str, schema: &str) -> Res<u32> {
    let body = serde_json::json!({ "schema": schema }).to_string();
    let mut resp = ureq::post(format!("{url}/subjects/{subject}/versions"))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .send(body.as_str())?;
    let v: serde_json::Value = serde_json::from_str(&resp.body_mut().read_to_string()?)?;
    Ok(v["id"].as_u64().ok_or(format!("no id in {v}"))? as u32)
}

fn frame(id: u32, datum: Vec<u8>) -> Vec<u8> {
    let mut f = vec![0];
    f.extend(id.to_be_bytes());
    f.extend(datum);
    f
}

struct Avro {
    key: apache_avro::Schema,
    value: apache_avro::Schema,
    key_id: u32,
    value_id: u32,
}

fn avro_record(a: &Avro, ev: &Ev) -> Res<(Vec<u8>, Vec<u8>)> {
    use apache_avro::types::Value as A;
    let s = |t: &str| A::String(t.into());
    let some = |v: A| A::Union(1, Box::new(v));
    let null = || A::Union(0, Box::new(A::Null));
    let row = if ev.op == "d" {
        A::Record(vec![
            ("id".into(), A::Long(ev.id)),
            ("owner".into(), null()),
            ("balance".into(), null()),
            ("updated_at".into(), null()),
        ])
    } else {
        A::Record(vec![
            ("id".into(), A::Long(ev.id)),
            ("owner".into(), some(s(&ev.owner))),
            (
                "balance".into(),
                some(A::Decimal(unscaled(ev.cents).into())),
            ),
            ("updated_at".into(), some(s(&rfc3339(ev.updated_ms)))),
        ])
    };
    let (before, after) = if ev.op == "d" {
        (some(row), null())
    } else {
        (null(), some(row))
    };
    let source = A::Record(vec![
        ("version".into(), s("3.6.1.Final")),
        ("connector".into(), s("postgresql")),
        ("name".into(), s("bench")),
        ("ts_ms".into(), A::Long(ev.ts_ms - 5)),
        ("snapshot".into(), some(s("false"))),
        ("db".into(), s("app")),
        (
            "sequence".into(),
            some(s(&format!(r#"["{}","{}"]"#, ev.prev_commit, ev.lsn))),
        ),
        ("schema".into(), s("public")),
        ("table".into(), s("accounts")),
        ("txId".into(), some(A::Long(ev.tx))),
        ("lsn".into(), some(A::Long(ev.lsn))),
        ("xmin".into(), null()),
    ]);
    let env = A::Record(vec![
        ("before".into(), before),
        ("after".into(), after),
        ("source".into(), source),
        ("op".into(), s(ev.op)),
        ("ts_ms".into(), some(A::Long(ev.ts_ms))),
    ]);
    let key = A::Record(vec![("id".into(), A::Long(ev.id))]);
    Ok((
        frame(a.key_id, apache_avro::to_avro_datum(&a.key, key)?),
        frame(a.value_id, apache_avro::to_avro_datum(&a.value, env)?),
    ))
}

/// Key and value bytes of event `ev` in `enc`.
fn encode(enc: &str, avro: Option<&Avro>, ev: &Ev) -> Res<(Vec<u8>, Vec<u8>)> {
    Ok(match enc {
        "json" => (
            format!(r#"{{"id":{}}}"#, ev.id).into_bytes(),
            payload_json(ev, false).into_bytes(),
        ),
        "json-schema" => (
            format!(r#"{{"schema":{KEY_SCHEMA},"payload":{{"id":{}}}}}"#, ev.id).into_bytes(),
            format!(
                r#"{{"schema":{VALUE_SCHEMA},"payload":{}}}"#,
                payload_json(ev, true)
            )
            .into_bytes(),
        ),
        "avro" => avro_record(avro.ok_or("avro needs REGISTRY_URL")?, ev)?,
        other => return Err(format!("unknown encoding {other}").into()),
    })
}

fn avro_setup(enc: &str, url: Option<&String>, topic: &str) -> Res<Option<Avro>> {
    if enc != "avro" {
        return Ok(None);
    }
    let url = url.ok_or("avro needs REGISTRY_URL")?;
    Ok(Some(Avro {
        key: apache_avro::Schema::parse_str(AVRO_KEY)?,
        value: apache_avro::Schema::parse_str(AVRO_VALUE)?,
        key_id: register(url, &format!("{topic}-key"), AVRO_KEY)?,
        value_id: register(url, &format!("{topic}-value"), AVRO_VALUE)?,
    }))
}

fn create_topic(brokers: &str, topic: &str) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new = NewTopic::new(topic, 8, TopicReplication::Fixed(1)).set("retention.ms", "-1");
    for r in rt.block_on(admin.create_topics([&new], &AdminOptions::new()))? {
        if let Err((t, e)) = r {
            if e != RDKafkaErrorCode::TopicAlreadyExists {
                return Err(format!("create {t}: {e}").into());
            }
        }
    }
    Ok(())
}

fn produce(
    brokers: &str,
    topic: &str,
    events: impl Iterator<Item = Ev>,
    enc: &str,
    avro: Option<&Avro>,
) -> Res<usize> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("compression.type", "lz4")
        .create()?;
    let mut count = 0;
    for ev in events {
        let (k, v) = encode(enc, avro, &ev)?;
        let mut rec = BaseRecord::to(topic)
            .key(&k)
            .payload(&v)
            .partition((ev.id % 8) as i32)
            .timestamp(ev.ts_ms);
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
        count += 1;
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(count)
}

fn main() -> Res<()> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: cdcgen produce BROKERS TOPIC N ENCODING [REGISTRY_URL] | replay BROKERS TOPIC N ENCODING I [REGISTRY_URL] | csv N";
    match a.get(1).map(String::as_str) {
        Some("csv") if a.len() == 3 => {
            let n: usize = a[2].parse()?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for i in 0..n {
                let ev = event(i, n);
                use std::io::Write;
                writeln!(
                    out,
                    "{},{},{},{},{},{},{}",
                    ev.id,
                    ev.owner,
                    balance(ev.cents),
                    rfc3339(ev.updated_ms),
                    ev.op,
                    ev.prev_commit,
                    ev.lsn
                )?;
            }
        }
        Some("produce") if a.len() >= 6 => {
            let (brokers, topic, n, enc) = (&a[2], &a[3], a[4].parse::<usize>()?, a[5].as_str());
            create_topic(brokers, topic)?;
            let avro = avro_setup(enc, a.get(6), topic)?;
            let t0 = Instant::now();
            let c = produce(
                brokers,
                topic,
                (0..n).map(|i| event(i, n)),
                enc,
                avro.as_ref(),
            )?;
            eprintln!(
                "produced {c} {enc} envelopes to {topic} in {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            println!("{c}");
        }
        Some("replay") if a.len() >= 7 => {
            let (brokers, topic, n, enc) = (&a[2], &a[3], a[4].parse::<usize>()?, a[5].as_str());
            let i: usize = a[6].parse()?;
            let avro = avro_setup(enc, a.get(7), topic)?;
            let c = produce(
                brokers,
                topic,
                std::iter::once(event(i, n)),
                enc,
                avro.as_ref(),
            )?;
            println!("{c}");
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
    Ok(())
}
