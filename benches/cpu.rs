//! Pure-CPU parts of the per-record path, in ns/record (`cargo bench --bench cpu`).
//!
//! - `decode/json_event`: a seed event (≈ 200 bytes) → typed fields ([`replaysafe::decode::decode`]);
//! - `delivery_key`: decoded fields → the delivery key (generation, key fields, partition-by day);
//! - `decide/json_event`: the whole pre-database step `run` takes per record (decode, horizon, filters);
//! - `decode/debezium_schemaless`, `decode/debezium_with_schema`: a Debezium change event → change, built-in
//!   fields and every row-projection column converted to PostgreSQL text; `decode/debezium_with_schema_uncached`
//!   the same with the Connect schema parsed again for every record (the schema cache off, as before it existed).
//!
//! Criterion reports time per iteration; each iteration is one record, so the figure is ns/record.

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
    for (name, value, cache) in [
        ("debezium_schemaless", CDC_SCHEMALESS, true),
        ("debezium_with_schema", CDC_SCHEMA, true),
        ("debezium_with_schema_uncached", CDC_SCHEMA, false),
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
                        replaysafe::decode::record(&p, Some(CDC_KEY), Some(black_box(value)), None)
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
                            replaysafe::decode::debezium::convert::to_pg(
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

criterion_group!(cpu, json_event, delivery_key, decide, debezium_envelope);
criterion_main!(cpu);
