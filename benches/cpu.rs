//! Pure-CPU parts of the per-record path, in ns/record (`cargo bench --bench cpu`).
//!
//! - `decode/json_event`: a seed event (≈ 200 bytes) → typed fields ([`replaysafe::decode::decode`]);
//! - `delivery_key`: decoded fields → the delivery key (generation, key fields, partition-by day);
//! - `decide/json_event`: the whole pre-database step `run` takes per record (decode, horizon, filters);
//! - `decode/debezium_schemaless`, `decode/debezium_with_schema`: a Debezium change event → change, built-in
//!   fields and every row-projection column converted to PostgreSQL text; `decode/debezium_with_schema_key` the
//!   same with the key wrapped too (as the JSON converter writes both); `decode/debezium_with_schema_uncached`
//!   the same with the Connect schema parsed again for every record (the schema cache off, as before it existed).
//! - `decode/debezium_avro`: the same change as schema-registry Avro (`[source] encoding = "avro"`, the schema
//!   in the registry client's cache, as after the first record of its id), the same conversions;
//!   `decode/avro_to_json` the Avro → JSON-converter step alone.
//!
//! Criterion reports time per iteration; each iteration is one record, so the figure is ns/record.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::disallowed_methods,
    reason = "a benchmark fixture: a panic is a broken fixture"
)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

const SEED: &str = include_str!("../bench/seed.toml");

const EVENT: &[u8] = br#"{"event_id":"5f0c6a3e-2b1d-4c8e-9a7f-3d2e1b0c9a8f","customer_id":"c-04217","amount":"-123.45","occurred_at":"2024-04-27T13:14:15.123+00:00","event_type":"purchase"}"#;

fn pipeline() -> replaysafe::config::Pipeline {
    let text = SEED
        .replace("{group}", "bench")
        .replace("{topic}", "bench.seed")
        .replace("{schema}", "bench_cpu");
    replaysafe::config::parse("seed.toml", &text).expect("seed pipeline")
}

fn json_event(c: &mut Criterion) {
    let p = pipeline();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    g.bench_function("json_event", |b| {
        b.iter(|| replaysafe::decode::decode(&p, Some(black_box(EVENT))).expect("valid"))
    });
    g.finish();
}

fn delivery_key(c: &mut Criterion) {
    let p = pipeline();
    let fields = replaysafe::decode::decode(&p, Some(EVENT)).expect("valid");
    let mut g = c.benchmark_group("delivery_key");
    g.throughput(Throughput::Elements(1));
    g.bench_function("json_event", |b| {
        b.iter(|| replaysafe::decode::delivery_key(&p, black_box(&fields)).expect("complete"))
    });
    g.finish();
}

fn decide(c: &mut Criterion) {
    let p = pipeline();
    let mut g = c.benchmark_group("decide");
    g.throughput(Throughput::Elements(1));
    g.bench_function("json_event", |b| {
        b.iter(|| replaysafe::engine::decide(&p, None, Some(black_box(EVENT)), None))
    });
    g.finish();
}

/// A Debezium pipeline: `accounts` as a row projection.
const CDC: &str = r#"
[kafka]
group-id = "bench"
topics = ["pg.public.accounts"]
[source]
format = "debezium"
[[projection]]
kind = "row"
table = "accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)", updated_at = "timestamptz" }
"#;

/// A schemaless update (C04's shape, ≈ 480 bytes) and the same row with the JSON converter's schema (C20's shape,
/// Decimal as base64 bytes).
const CDC_KEY: &[u8] = br#"{"id":1}"#;
/// The key as the JSON converter writes it with `schemas.enable=true` (real traffic: key and value wrapped).
const CDC_KEY_SCHEMA: &[u8] = br#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"pg.public.accounts.Key"},"payload":{"id":1}}"#;
const CDC_SCHEMALESS: &[u8] = br#"{"before":null,"after":{"id":1,"owner":"acct-one","balance":"150.00","updated_at":"2024-04-25T00:08:20Z"},"source":{"version":"2.5.4.Final","connector":"postgresql","name":"pg","ts_ms":1714003700000,"snapshot":"false","db":"app","sequence":"[\"33000136\",\"33000200\"]","schema":"public","table":"accounts","txId":901,"lsn":33000200,"xmin":null},"op":"u","ts_ms":1714003700250,"transaction":null}"#;
const CDC_SCHEMA: &[u8] = br#"{"schema":{"type":"struct","optional":false,"name":"pg.public.accounts.Envelope","fields":[{"type":"struct","optional":true,"field":"before","name":"pg.public.accounts.Value","fields":[{"type":"int32","optional":false,"field":"id"},{"type":"string","optional":true,"field":"owner"},{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"balance"},{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","field":"updated_at"}]},{"type":"struct","optional":true,"field":"after","name":"pg.public.accounts.Value","fields":[{"type":"int32","optional":false,"field":"id"},{"type":"string","optional":true,"field":"owner"},{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"balance"},{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","field":"updated_at"}]},{"type":"struct","optional":false,"field":"source","fields":[]},{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]},"payload":{"before":null,"after":{"id":1,"owner":"acct-one","balance":"OpY=","updated_at":"2024-04-25T00:08:20Z"},"source":{"version":"2.5.4.Final","connector":"postgresql","name":"pg","ts_ms":1714003700000,"snapshot":"false","db":"app","sequence":"[\"33000136\",\"33000200\"]","schema":"public","table":"accounts","txId":901,"lsn":33000200,"xmin":null},"op":"u","ts_ms":1714003700250,"transaction":null}}"#;

/// Debezium envelope → change + built-in fields (delivery key parts), then every column of the row projection
/// converted to PostgreSQL text: what the CDC path does per record before the database.
fn debezium_envelope(c: &mut Criterion) {
    let p = replaysafe::config::parse("cdc.toml", CDC).expect("cdc pipeline");
    let cols = p.projections[0]
        .row
        .as_ref()
        .unwrap()
        .columns
        .clone()
        .unwrap();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    for (name, key, value, cache) in [
        ("debezium_schemaless", CDC_KEY, CDC_SCHEMALESS, true),
        ("debezium_with_schema", CDC_KEY, CDC_SCHEMA, true),
        ("debezium_with_schema_key", CDC_KEY_SCHEMA, CDC_SCHEMA, true),
        ("debezium_with_schema_uncached", CDC_KEY, CDC_SCHEMA, false),
    ] {
        let run = |f: &mut dyn FnMut()| {
            if cache {
                f()
            } else {
                replaysafe::decode::debezium::schema::without_cache(f)
            }
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                run(&mut || {
                    let decoded =
                        replaysafe::decode::record(&p, Some(key), Some(black_box(value)), None)
                            .expect("valid");
                    let replaysafe::decode::Decoded::Fields {
                        change: Some(ch), ..
                    } = decoded
                    else {
                        panic!("a change")
                    };
                    let after = ch.after.as_ref().unwrap();
                    for col in &cols {
                        let cell = &after
                            .iter()
                            .find(|(n, _)| n == col.name.as_str())
                            .unwrap()
                            .1;
                        black_box(
                            replaysafe::projection::row::convert::to_pg(
                                cell,
                                col,
                                p.decimal_handling,
                            )
                            .expect("converts"),
                        );
                    }
                })
            })
        });
    }
    g.finish();
}

/// The Avro schema the Avro converters write for the accounts envelope (`connect.name` on logical types).
const AVRO_SCHEMA: &str = r#"{"type":"record","name":"Envelope","namespace":"pg.public.accounts","fields":[
 {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
   {"name":"id","type":"int"},
   {"name":"owner","type":["null","string"],"default":null},
   {"name":"balance","type":["null",{"type":"bytes","scale":2,"precision":12,"connect.version":1,
     "connect.parameters":{"scale":"2","connect.decimal.precision":"12"},
     "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
   {"name":"updated_at","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.time.ZonedTimestamp"}],"default":null}],
   "connect.name":"pg.public.accounts.Value"}],"default":null},
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
 "connect.name":"pg.public.accounts.Envelope"}"#;

/// The accounts update of `CDC_SCHEMALESS` as one schema-registry Avro frame of schema id 1.
fn avro_frame() -> Vec<u8> {
    use apache_avro::types::Value as A;
    let schema = apache_avro::Schema::parse_str(AVRO_SCHEMA).expect("schema");
    let s = |t: &str| A::String(t.into());
    let some = |v: A| A::Union(1, Box::new(v));
    let row = A::Record(vec![
        ("id".into(), A::Int(1)),
        ("owner".into(), some(s("acct-one"))),
        ("balance".into(), some(A::Decimal(vec![0x3a, 0x98].into()))),
        ("updated_at".into(), some(s("2024-04-25T00:08:20Z"))),
    ]);
    let source = A::Record(vec![
        ("version".into(), s("3.6.1.Final")),
        ("connector".into(), s("postgresql")),
        ("name".into(), s("pg")),
        ("ts_ms".into(), A::Long(1_714_003_700_000)),
        ("snapshot".into(), some(s("false"))),
        ("db".into(), s("app")),
        ("sequence".into(), some(s(r#"["33000136","33000200"]"#))),
        ("schema".into(), s("public")),
        ("table".into(), s("accounts")),
        ("txId".into(), some(A::Long(901))),
        ("lsn".into(), some(A::Long(33_000_200))),
        ("xmin".into(), A::Union(0, Box::new(A::Null))),
    ]);
    let env = A::Record(vec![
        ("before".into(), A::Union(0, Box::new(A::Null))),
        ("after".into(), some(row)),
        ("source".into(), source),
        ("op".into(), s("u")),
        ("ts_ms".into(), some(A::Long(1_714_003_700_250))),
    ]);
    let mut frame = vec![0, 0, 0, 0, 1];
    frame.extend(apache_avro::to_avro_datum(&schema, env).expect("encodes"));
    frame
}

/// `decode/debezium_avro` (whole record, conversions included) and `decode/avro_to_json` (the Avro step).
fn debezium_avro(c: &mut Criterion) {
    let text = CDC.replace(
        "format = \"debezium\"",
        "format = \"debezium\"\nencoding = \"avro\"\nschema-registry = { url = \"http://127.0.0.1:1\" }",
    );
    let p = replaysafe::config::parse("cdc.toml", &text).expect("avro pipeline");
    let answer = serde_json::json!({ "schema": AVRO_SCHEMA }).to_string();
    replaysafe::decode::registry::client(p.registry.as_ref().unwrap())
        .cache_answer(1, &answer)
        .expect("schema");
    let key_schema = r#"{"type":"record","name":"Key","namespace":"pg.public.accounts","fields":[{"name":"id","type":"int"}]}"#;
    let key_answer = serde_json::json!({ "schema": key_schema }).to_string();
    replaysafe::decode::registry::client(p.registry.as_ref().unwrap())
        .cache_answer(2, &key_answer)
        .expect("key schema");
    let ks = apache_avro::Schema::parse_str(key_schema).expect("key schema");
    let mut key = vec![0, 0, 0, 0, 2];
    let kv =
        apache_avro::types::Value::Record(vec![("id".into(), apache_avro::types::Value::Int(1))]);
    key.extend(apache_avro::to_avro_datum(&ks, kv).expect("key"));
    let frame = avro_frame();
    let cols = p.projections[0]
        .row
        .as_ref()
        .unwrap()
        .columns
        .clone()
        .unwrap();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    g.bench_function("debezium_avro", |b| {
        b.iter(|| {
            let decoded = replaysafe::decode::record(&p, Some(&key), Some(black_box(&frame)), None)
                .expect("valid");
            let replaysafe::decode::Decoded::Fields {
                change: Some(ch), ..
            } = decoded
            else {
                panic!("a change")
            };
            let after = ch.after.as_ref().unwrap();
            for col in &cols {
                let cell = &after
                    .iter()
                    .find(|(n, _)| n == col.name.as_str())
                    .unwrap()
                    .1;
                black_box(
                    replaysafe::projection::row::convert::to_pg(cell, col, p.decimal_handling)
                        .expect("converts"),
                );
            }
        })
    });
    let schema = apache_avro::Schema::parse_str(AVRO_SCHEMA).expect("schema");
    let json = replaysafe::decode::avro::SchemaJson::new(vec![
        serde_json::from_str(AVRO_SCHEMA).expect("json")
    ]);
    g.bench_function("avro_to_json", |b| {
        b.iter(|| {
            replaysafe::decode::avro::to_json(&schema, &[], &json, black_box(&frame[5..]), true)
                .expect("ok")
        })
    });
    g.finish();
}

criterion_group!(
    cpu,
    json_event,
    delivery_key,
    decide,
    debezium_envelope,
    debezium_avro
);
criterion_main!(cpu);
