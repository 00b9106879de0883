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

const EDGE_COLUMNS: &str =
    "id bigint PRIMARY KEY, ts timestamp(6), tz timestamptz, n numeric, d date, k int";

const EDGE_COMPARED: &str = "id, ts, tz, n, d, k";

const EDGE_SRC: &str = "id, ts, tz, CASE WHEN n = 'NaN' THEN NULL ELSE n END, d, k";

/// The Apicurio AvroConverter settings for keys and values (`scripts/connect-start` with the registry's jars).
fn avro_converters() -> Vec<(String, String)> {
    let v2 = registry_url().replace("/apis/ccompat/v7", "/apis/registry/v2");
    let mut props = Vec::new();
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
    props
}

/// Real Debezium → Avro through the registry, values at the edges: timestamps before the epoch and at year 1,
/// `timestamptz` with offsets, `infinity`, numerics of changing scale, NaN, and `k` retyped int → text at the
/// source mid-stream (a new schema id) into a `text` column. Every row equals the source's; a replay lands 0.
#[test]
fn avro_edges_and_a_retype_with_real_debezium() {
    let lib = std::env::var("REGISTRY_CONVERTER_LIB").expect("REGISTRY_CONVERTER_LIB");
    let db = Db::fresh("r14edge");
    let src = unique_name("r14edge");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({EDGE_COLUMNS});
         CREATE TABLE {{s}}.items (id bigint PRIMARY KEY, ts timestamp(6), tz timestamptz, n numeric, d date, k text)"
    ));
    let mut props = avro_converters();
    props.push(("topic.prefix".into(), src.clone()));
    props.push(("table.include.list".into(), format!("{src}.items")));
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
        format!("INSERT INTO {src}.items VALUES (1, '1969-12-31 23:59:59.999999', '1969-12-31 23:59:59.999999+05:30', -0.000001, '1969-12-31', 7)"),
        format!("INSERT INTO {src}.items VALUES (2, '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', 12345678901234567890.12345, '0001-01-01', -1)"),
        format!("INSERT INTO {src}.items VALUES (3, '2024-02-29 12:00:00.5', '2024-03-31 02:30:00-09:30', 1e-20, '2024-02-29', 0)"),
        format!("INSERT INTO {src}.items VALUES (4, 'infinity', '-infinity', 'NaN', 'infinity', NULL)"),
        format!("INSERT INTO {src}.items VALUES (5, '-infinity', 'infinity', 0, '-infinity', 5)"),
        format!("ALTER TABLE {src}.items ALTER COLUMN k TYPE text"),
        format!("UPDATE {src}.items SET k = 'seven', n = 1.50 WHERE id = 1"),
        format!("INSERT INTO {src}.items (id, k) VALUES (900, 'marker')"),
    ] {
        db.execute(&stmt);
    }
    read_values_raw_count(&topic, 7);
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"avro\"\nschema-registry = {{ url = \"{}\" }}\n[batch]\nlinger-ms = 10\n\
         [[projection]]\nkind = \"row\"\ntable = \"items\"\nsource-table = \"{src}.items\"\n",
        registry_url()
    );
    let out = run_caught_up(&pipeline(&text, &topic, &unique("g"), &db.schema).path);
    let dl = dead_letters(&db);
    // Compared as values (numeric 1.50 = 1.5: Debezium's VariableScaleDecimal drops trailing zeros); a NaN
    // numeric arrives as null (decimal.handling.mode=precise cannot carry it), so the source's NaN reads NULL.
    let srcq = format!("SELECT row({}) AS r FROM {src}.items", EDGE_SRC);
    let dstq = format!("SELECT row({EDGE_COMPARED}) AS r FROM {{s}}.items");
    let diff = db.column::<String>(&format!(
        "SELECT 'src ' || r::text FROM ({srcq} EXCEPT {dstq}) a UNION ALL SELECT 'dst ' || r::text FROM ({dstq} EXCEPT {srcq}) b"
    ));
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    assert!(dl.is_empty(), "{dl:?}\n{}", out.stdout);
    assert_eq!(diff, Vec::<String>::new());
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (7, 7, 0));
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 7, 0)
    );
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}

/// Waits (bounded) until `topic` partition 0 holds at least `n` records.
fn read_values_raw_count(topic: &str, n: i64) {
    use rdkafka::consumer::Consumer;
    let c = consumer(&[("group.id", &unique_name("wc"))]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((lo, hi)) = c.fetch_watermarks(topic, 0, Duration::from_secs(5)) {
            if hi - lo >= n {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{topic}: fewer than {n} records");
        std::thread::sleep(Duration::from_millis(300));
    }
}
