//! Schema-registry framed records (issue 14 part 1): case C41 on a plain-JSON pipeline (no registry), and
//! Avro / JSON Schema values and keys through the real registry started by `scripts/registry-start`
//! (`tests/it/registry.rs` helpers).

use crate::cases::{case_topic, load, ORDERS};
use crate::common::*;

/// The dead letters as (offset, reason, detail, value).
pub fn dead_letters(db: &Db) -> Vec<(i64, String, String, Option<Vec<u8>>)> {
    db.query(
        "SELECT \"offset\", reason, detail, value FROM {s}.replaysafe_dead_letters ORDER BY partition, \"offset\"",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// The ORDERS pipeline of the cases, with `extra` appended to its `[source]`-less text.
pub fn orders(topic: &str, group: &str, db: &Db, extra: &str) -> Pipeline {
    let text = ORDERS.replace("MAXBYTES", "") + extra;
    let text = text.replace("{schema}.", &format!("\"{}\".", db.schema));
    pipeline(&text, topic, group, &db.schema)
}

/// C41: on a pipeline that reads plain JSON, a JSON Schema frame, an Avro frame and a truncated frame are each
/// quarantined as `schema-registry` with a reason that names the frame (not the parser's "line 1 column 1"),
/// their raw bytes kept (bytea); the partition never stalls; a replay adds no second dead letter.
#[test]
fn c41_framed_values_on_a_json_pipeline_are_quarantined_by_name() {
    let db = Db::fresh("c41");
    let (topic, map) = case_topic("C41", "c41", 1, None);
    let group = unique("g");
    let p = orders(&topic, &group, &db, "");
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (5, 2, 0, 0, 3)
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 3, "{dl:?}");
    let recs = load("C41", None);
    for (i, (case_offset, want)) in [
        (601, "schema-registry framed payload (magic 0, schema id 7)"),
        (602, "unsupported encoding: schema-registry Avro"),
        (603, "truncated schema-registry frame"),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(dl[i].0, map[&(0, case_offset)]);
        assert_eq!(dl[i].1, "schema-registry", "{dl:?}");
        assert!(dl[i].2.starts_with(want), "{case_offset}: {dl:?}");
        assert_eq!(dl[i].3, recs[i + 1].rec.value, "raw bytes kept");
    }
    assert!(dl[1].2.contains("schema id 8"), "{dl:?}");
    let order = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = 'o-600'",
        &[],
    );
    assert_eq!(order.len(), 1);
    assert_eq!(
        (order[0].get::<_, String>(0), order[0].get::<_, i64>(1)),
        ("SHIPPED".to_string(), 3)
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 2);
    let end = map[&(0, 604)] + 1;
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(end));
    assert_eq!(committed(&group, &topic, 1), vec![Some(end)]);
    let again = run_caught_up(&orders(&topic, &unique("g2"), &db, "").path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 2, 3)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        3
    );
}

/// `[source]` for JSON events read as schema-registry Avro from `url`.
pub fn avro_source(url: &str) -> String {
    format!("\n[source]\nformat = \"json\"\nencoding = \"avro\"\nschema-registry = {{ url = \"{url}\" }}\n")
}

/// A registry that does not answer is not the record's fault: the run retries for `--connect-timeout`, then
/// stops with exit 1 naming the registry — no dead letter, no checkpoint past the record.
#[test]
fn registry_down_stops_the_run_without_dead_letters() {
    let db = Db::fresh("regdown");
    let topic = new_topic("regdown", 1);
    let frame = [0u8, 0, 0, 0, 1, 2, b'a'].to_vec();
    let rec = Rec {
        partition: 0,
        key: Some(b"k".to_vec()),
        value: Some(frame),
        timestamp_ms: None,
    };
    produce(&topic, &[rec]);
    let group = unique("g");
    let p = orders(
        &topic,
        &group,
        &db,
        &avro_source("http://127.0.0.1:1/apis/ccompat/v7"),
    );
    let config = p.path.to_str().expect("utf-8 path").to_string();
    let out = replaysafe_with(
        &[
            "run",
            "--config",
            &config,
            "--until-caught-up",
            "--connect-timeout",
            "5",
        ],
        &[],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("schema registry http://127.0.0.1:1/apis/ccompat/v7: gave up after")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    let cp = db.checkpoint(&group, &topic, 0);
    assert!(
        cp.unwrap_or(0) == 0,
        "checkpoint {cp:?} moved past the record"
    );
    assert!(committed(&group, &topic, 1)[0].unwrap_or(0) == 0);
}

/// The registry's Confluent-compatible base URL (`scripts/registry-start`'s `REGISTRY_URL`, exported by
/// scripts/test).
pub fn registry_url() -> String {
    std::env::var("REGISTRY_URL").expect(
        "REGISTRY_URL is not set: run the tests through scripts/test (scripts/registry-start)",
    )
}

/// Registers `schema` (`schema_type` AVRO or JSON) under `subject` in the real registry; returns its id.
pub fn register(subject: &str, schema_type: &str, schema: &str) -> u32 {
    let body = serde_json::json!({ "schemaType": schema_type, "schema": schema }).to_string();
    let mut resp = ureq::post(&format!("{}/subjects/{subject}/versions", registry_url()))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .send(body.as_bytes())
        .expect("register a schema");
    let v: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    v["id"].as_u64().unwrap_or_else(|| panic!("no id in {v}")) as u32
}

/// A schema-registry frame: magic 0, `id` big-endian, `body`.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend(id.to_be_bytes());
    f.extend(body);
    f
}

pub const ORDER_AVRO: &str = r#"{"type":"record","name":"OrderEvent","namespace":"shop","fields":[
 {"name":"event_id","type":{"type":"string","logicalType":"uuid"}},
 {"name":"event_type","type":"string"},
 {"name":"entity_id","type":"string"},
 {"name":"version","type":"long"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"data","type":{"type":"record","name":"Data","fields":[
   {"name":"customer_id","type":["null","string"],"default":null},
   {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}],"default":null}]}}]}"#;

pub fn order_avro(
    schema: &apache_avro::Schema,
    n: u32,
    event_type: &str,
    entity: &str,
    version: i64,
    customer: Option<&str>,
    cents: Option<i64>,
) -> Vec<u8> {
    use apache_avro::types::Value as A;
    let opt = |v: Option<A>| match v {
        Some(v) => A::Union(1, Box::new(v)),
        None => A::Union(0, Box::new(A::Null)),
    };
    let amount = cents.map(|c| A::Decimal(num_bigint_bytes(c).into()));
    let v = A::Record(vec![
        (
            "event_id".into(),
            A::Uuid(uuid::Uuid::parse_str(&format!("c41a0000-0000-4000-8000-{n:012}")).unwrap()),
        ),
        ("event_type".into(), A::String(event_type.into())),
        ("entity_id".into(), A::String(entity.into())),
        ("version".into(), A::Long(version)),
        ("occurred_at".into(), A::TimestampMillis(1_714_003_206_000)),
        (
            "data".into(),
            A::Record(vec![
                (
                    "customer_id".into(),
                    opt(customer.map(|c| A::String(c.into()))),
                ),
                ("amount".into(), opt(amount)),
            ]),
        ),
    ]);
    apache_avro::to_avro_datum(schema, v).expect("encodes")
}

/// Big-endian two's complement of `n` (an Avro decimal's unscaled value).
fn num_bigint_bytes(n: i64) -> Vec<u8> {
    let b = n.to_be_bytes();
    let skip = b
        .windows(2)
        .take_while(|w| (w[0] == 0 && w[1] & 0x80 == 0) || (w[0] == 0xff && w[1] & 0x80 != 0))
        .count();
    b[skip..].to_vec()
}

/// Avro values through the real registry on a JSON-event pipeline: uuid, timestamp-millis and decimal logical
/// types reach the fields as the JSON path's values (paid 12.50); an unknown schema id, a truncated frame, a
/// plain JSON value and a JSON-Schema id are quarantined as `schema-registry` naming what is wrong; a replay
/// under another group is all duplicates.
#[test]
fn avro_values_through_the_registry_land_and_bad_frames_are_named() {
    let db = Db::fresh("ravro");
    let topic = new_topic("ravro", 2);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let json_id = register(
        &format!("{topic}-json"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
    );
    let rec = |partition: i32, key: &str, value: Vec<u8>| Rec {
        partition,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    let paid = order_avro(&schema, 2, "PaymentCaptured", "o-1", 2, None, Some(1250));
    let shipped = order_avro(&schema, 3, "OrderShipped", "o-1", 3, None, None);
    let other = order_avro(&schema, 4, "OrderPlaced", "o-2", 1, Some("c-2"), None);
    let mut cut = frame(id, &paid);
    cut.truncate(cut.len() - 4);
    let recs = [
        rec(0, "o-1", frame(id, &placed)),
        rec(0, "o-1", frame(id, &paid)),
        rec(0, "o-1", frame(999_999, &paid)),
        rec(0, "o-1", cut),
        rec(
            0,
            "o-1",
            br#"{"event_id":"c41a0000-0000-4000-8000-000000000009"}"#.to_vec(),
        ),
        rec(0, "o-1", frame(json_id, b"{}")),
        rec(0, "o-1", frame(id, &shipped)),
        rec(1, "o-2", frame(id, &other)),
    ];
    produce(&topic, &recs);
    let group = unique("g");
    let source = avro_source(&registry_url());
    let p = orders(&topic, &group, &db, &source);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (8, 4, 4),
        "{}",
        out.stdout
    );
    let order = db.query(
        "SELECT customer_id, status, version FROM {s}.orders WHERE order_id = 'o-1'",
        &[],
    );
    assert_eq!(
        (
            order[0].get::<_, String>(0),
            order[0].get::<_, String>(1),
            order[0].get::<_, i64>(2)
        ),
        ("c-1".to_string(), "SHIPPED".to_string(), 3)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.orders"),
        2,
        "both partitions"
    );
    let paid_total: String = db.query(
        "SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-1'",
        &[],
    )[0]
    .get(0);
    assert_eq!(paid_total, "12.50", "the Avro decimal keeps its scale");
    let day: Vec<String> = db.column("SELECT DISTINCT day::text FROM {s}.processed_events");
    assert_eq!(
        day,
        vec!["2024-04-25".to_string()],
        "timestamp-millis → the event day"
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 4, "{dl:?}");
    assert!(dl.iter().all(|d| d.1 == "schema-registry"), "{dl:?}");
    assert!(
        dl[0]
            .2
            .starts_with("unknown schema id 999999 in the value's frame"),
        "{dl:?}"
    );
    assert!(dl[1].2.contains("does not match its schema"), "{dl:?}");
    assert!(
        dl[2]
            .2
            .contains("not schema-registry framed: byte 0 is 0x7b"),
        "{dl:?}"
    );
    assert!(
        dl[3]
            .2
            .contains(&format!("schema id {json_id} (value) is a JSON schema")),
        "{dl:?}"
    );
    assert_eq!(
        dl[0].3.as_deref(),
        recs[2].value.as_deref(),
        "raw frame kept"
    );
    let again = run_caught_up(&orders(&topic, &unique("g2"), &db, &source).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 4, 4)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        4
    );
}

/// JSON Schema framed values (KafkaJsonSchemaSerializer's wire format) through the real registry: C41's record
/// 601 is applied (paid 12.50); an Avro id on this pipeline is named.
#[test]
fn json_schema_values_through_the_registry_land() {
    let db = Db::fresh("rjson");
    let topic = new_topic("rjson", 1);
    let id = register(
        &format!("{topic}-value"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"event_id":{"type":"string"}}}"#,
    );
    let avro_id = register(&format!("{topic}-avro"), "AVRO", ORDER_AVRO);
    let recs = load("C41", None);
    let body = |i: usize| recs[i].rec.value.clone().unwrap();
    let framed = |i: usize, id: u32| -> Vec<u8> {
        let b = body(i);
        let json = if b.first() == Some(&0) {
            b[5..].to_vec()
        } else {
            b
        };
        frame(id, &json)
    };
    let rec = |value: Vec<u8>| Rec {
        partition: 0,
        key: Some(b"o-600".to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    produce(
        &topic,
        &[
            rec(framed(0, id)),
            rec(framed(1, id)),
            rec(framed(4, id)),
            rec(framed(4, avro_id)),
        ],
    );
    let group = unique("g");
    let source = format!(
        "\n[source]\nformat = \"json\"\nencoding = \"json-schema\"\nschema-registry = {{ url = \"{}\" }}\n",
        registry_url()
    );
    let p = orders(&topic, &group, &db, &source);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (4, 3, 0, 1)
    );
    let dl = dead_letters(&db);
    assert!(
        dl[0]
            .2
            .contains(&format!("schema id {avro_id} (value) is an AVRO schema")),
        "{dl:?}"
    );
    let order = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = 'o-600'",
        &[],
    );
    assert_eq!(
        (order[0].get::<_, String>(0), order[0].get::<_, i64>(1)),
        ("SHIPPED".into(), 3)
    );
    let paid: String = db.query(
        "SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-60'",
        &[],
    )[0]
    .get(0);
    assert_eq!(
        paid, "12.50",
        "C41 record 601 applied through JSON Schema framing"
    );
}
