//! Pure-CPU parts of the per-record path, in ns/record (`cargo bench --bench cpu`).
//!
//! - `decode/json_event`: a seed event (≈ 200 bytes) → typed fields ([`replaysafe::decode::decode`]);
//! - `delivery_key`: decoded fields → the delivery key (generation, key fields, partition-by day);
//! - `decide/json_event`: the whole pre-database step `run` takes per record (decode, horizon, filters).
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
        b.iter(|| replaysafe::run::decide(&p, Some(black_box(EVENT)), None))
    });
    g.finish();
}

// Debezium envelope decode: the lead adds a `debezium_envelope` function here (an `EVENT`-like sample change
// event → typed fields through the Debezium decoder) and lists it in `criterion_group!` below, once that
// decoder exists.

criterion_group!(cpu, json_event, delivery_key, decide);
criterion_main!(cpu);
