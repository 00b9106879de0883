//! Real Debezium output through a registry-aware converter: the Debezium 3.6.1 PostgreSQL connector under
//! `scripts/connect-start` with Apicurio's `AvroConverter` (jars from `scripts/registry-start`'s
//! `REGISTRY_CONVERTER_LIB`) for keys and values, writing Confluent-framed Avro (4-byte content id) to the
//! real registry; replaysafe reads it with `[source] encoding = "avro"` into a row projection.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::connect::{drop_slot, unique_name, Connect};
use crate::registry::{dead_letters, registry_url};

const COLUMNS: &str =
    "id bigint PRIMARY KEY, amount numeric(12,2), big numeric, created timestamp(6), \
    seen timestamptz, due date, doc jsonb, uid uuid, note text";
const COMPARED: &str = "id, amount, big, created, seen, due, doc, uid, note";

/// Waits (bounded) until `topic` partition 0 holds at least `n` records; returns its high watermark.
fn wait_count(topic: &str, n: i64) -> i64 {
    use rdkafka::consumer::Consumer;
    let c = consumer(&[("group.id", &unique_name("wc"))]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((lo, hi)) = c.fetch_watermarks(topic, 0, Duration::from_secs(5)) {
            if hi - lo >= n {
                return hi;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: fewer than {n} records after 120 s"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The first record's value bytes of `topic`.
fn first_value(topic: &str) -> Vec<u8> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let c = consumer(&[
        ("group.id", &unique_name("fv")),
        ("auto.offset.reset", "earliest"),
    ]);
    c.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(500)) {
            if let Some(v) = m.payload() {
                return v.to_vec();
            }
        }
        assert!(Instant::now() < deadline, "{topic}: no record");
    }
}

fn differences(db: &Db, src: &str) -> Vec<String> {
    let q = |a: &str, b: &str| -> Vec<String> {
        db.column(&format!(
            "SELECT row({COMPARED})::text FROM {a}.items EXCEPT SELECT row({COMPARED})::text FROM {b}.items"
        ))
    };
    let mut d = q(src, "{s}");
    d.extend(
        q("{s}", src)
            .into_iter()
            .map(|r| format!("projection only: {r}")),
    );
    d
}

/// Debezium → Apicurio AvroConverter (keys and values, schema on) → replaysafe row projection: inserts,
/// updates, a delete (tombstone) and a snapshot row land with Decimal, VariableScaleDecimal, MicroTimestamp,
/// ZonedTimestamp, Date, Json and Uuid values equal to the source; a replay under another group lands nothing.
#[test]
fn debezium_avro_keys_and_values_through_the_registry() {
    let lib = std::env::var("REGISTRY_CONVERTER_LIB")
        .expect("REGISTRY_CONVERTER_LIB is not set: run the tests through scripts/test");
    let db = Db::fresh("ravrocdc");
    let src = unique_name("dbzsrc_avro");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({COLUMNS});
         INSERT INTO {src}.items (id, amount, big, note) VALUES (0, 0.00, 1.5, 'snapshot row');
         CREATE TABLE {{s}}.items ({COLUMNS})"
    ));
    let v2 = registry_url().replace("/apis/ccompat/v7", "/apis/registry/v2");
    let mut props: Vec<(String, String)> = Vec::new();
    for side in ["key", "value"] {
        let p = |k: &str, v: &str| (format!("{side}.converter{k}"), v.to_string());
        props.extend([
            p("", "io.apicurio.registry.utils.converter.AvroConverter"),
            p(".apicurio.registry.url", &v2),
            p(".apicurio.registry.auto-register", "true"),
            p(".apicurio.registry.find-latest", "true"),
            p(".apicurio.registry.as-confluent", "true"),
            p(".apicurio.registry.use-id", "contentId"),
            p(".apicurio.registry.headers.enabled", "false"),
        ]);
    }
    let table = format!("{src}.items");
    props.push(("topic.prefix".into(), src.clone()));
    props.push(("table.include.list".into(), table.clone()));
    let refs: Vec<(&str, &str)> = props
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut connect = Connect::start_with_env(
        &dir.path().join(&src),
        &refs,
        &[("CONNECT_EXTRA_LIB", lib.as_str())],
    );
    let topic = connect.topic(&src, "items");
    for stmt in [
        format!("INSERT INTO {src}.items VALUES (1, 123.45, 12345678901234567890.123456789, '2024-01-02 03:04:05.123456', \
                 '2024-01-02 01:04:05.5+00', '2024-12-31', '{{\"a\": [1, 2]}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'one')"),
        format!("UPDATE {src}.items SET amount = -7.90, note = 'one updated' WHERE id = 1"),
        format!("INSERT INTO {src}.items (id, amount, note) VALUES (2, 2.00, 'two')"),
        format!("DELETE FROM {src}.items WHERE id = 2"),
        format!("INSERT INTO {src}.items (id, note) VALUES (900, 'marker')"),
    ] {
        db.execute(&stmt);
    }
    // 1 snapshot read + 5 changes + the delete's Kafka tombstone.
    wait_count(&topic, 7);
    let raw = first_value(&topic);
    assert_eq!(raw[0], 0, "a schema-registry frame (magic byte 0)");
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"avro\"\nschema-registry = {{ url = \"{}\" }}\n[batch]\nlinger-ms = 10\n\
         [[projection]]\nkind = \"row\"\ntable = \"items\"\nsource-table = \"{src}.items\"\n",
        registry_url()
    );
    let group = unique("g");
    let p = pipeline(&text, &topic, &group, &db.schema);
    let out = run_caught_up(&p.path);
    out.assert_ok();
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (7, 6, 0),
        "{}",
        out.stdout
    );
    assert_eq!(t.filtered, 1, "the Kafka tombstone after the delete");
    assert_eq!(differences(&db, &src), Vec::<String>::new());
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.items_tombstones WHERE id = 2"),
        1
    );
    let big: String = db.query("SELECT big::text FROM {s}.items WHERE id = 1", &[])[0].get(0);
    assert_eq!(
        big, "12345678901234567890.123456789",
        "VariableScaleDecimal exact"
    );
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!((again.landed, again.quarantined), (0, 0));
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}
