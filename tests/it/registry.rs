//! Schema-registry framed records (issue 14 part 1): case C41 on a plain-JSON pipeline (no registry), and
//! Avro / JSON Schema values and keys through the real registry started by `scripts/registry-start`
//! (`tests/it/registry.rs` helpers).

use crate::cases::{case_topic, load, ORDERS};
use crate::common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Avro's zig-zag varint of `n` (a long, a length, a block count).
fn varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// A frame of a few bytes whose Avro body declares a map of 500 million entries (or a 400 MB string) must be
/// quarantined as `schema-registry`, never make the process reserve gigabytes (the Avro decoder reserves the
/// declared count before reading an entry: without a bound the worker aborts on the failed allocation). The good
/// record after it lands; the accounting adds up; a replay under another group adds no second dead letter.
#[test]
fn avro_declared_lengths_cannot_allocate_beyond_the_record() {
    let db = Db::fresh("r14bomb");
    let topic = new_topic("r14bomb", 1);
    let bomb_schema = r#"{"type":"record","name":"Bomb","namespace":"r14","fields":[
        {"name":"m","type":{"type":"map","values":"long"}},{"name":"s","type":"string"}]}"#;
    let bomb = register(&format!("{topic}-bomb"), "AVRO", bomb_schema);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    let mut string_bomb = varint(0); // an empty map, then a string of 400 MB that is not there
    string_bomb.extend(varint(400_000_000));
    let rec = |value: Vec<u8>| Rec {
        partition: 0,
        key: Some(b"o-1".to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    produce(
        &topic,
        &[
            rec(frame(bomb, &varint(500_000_000))),
            rec(frame(bomb, &string_bomb)),
            rec(frame(id, &placed)),
        ],
    );
    let group = unique("g");
    let p = orders(&topic, &group, &db, &avro_source(&registry_url()));
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (3, 1, 0, 0, 2)
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 2, "{dl:?}");
    for (i, (offset, reason, detail, _)) in dl.iter().enumerate() {
        assert_eq!((*offset, reason.as_str()), (i as i64, "schema-registry"));
        assert!(
            detail.contains(&format!("schema id {bomb}"))
                && detail.contains("does not match its schema"),
            "{detail}"
        );
    }
    assert_eq!(
        db.text("SELECT status FROM {s}.orders WHERE order_id = 'o-1'"),
        Some("PLACED".to_string())
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    let again =
        run_caught_up(&orders(&topic, &unique("g2"), &db, &avro_source(&registry_url())).path);
    let a = again.tally();
    assert_eq!((a.landed, a.duplicate, a.quarantined), (0, 1, 2));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        2
    );
}

/// A one-request-per-connection HTTP proxy to the registry that the test controls: the first `ok_first`
/// requests are forwarded, then every request fails (alternately HTTP 503 and a connection closed without an
/// answer) for `down` after the first failure, then requests are forwarded again. Returns its base URL and the
/// count of failed requests.
fn flaky_registry(ok_first: u32, down: Duration) -> (String, Arc<AtomicU32>) {
    let upstream = registry_url();
    let rest = upstream.trim_start_matches("http://");
    let (hostport, path) = rest.split_once('/').expect("registry URL with a path");
    let hostport = hostport.to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let failed = Arc::new(AtomicU32::new(0));
    let f = failed.clone();
    std::thread::spawn(move || {
        let mut served = 0u32;
        let mut down_since: Option<Instant> = None;
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let head = read_head(&mut c);
            let is_down = served >= ok_first && down_since.is_none_or(|t| t.elapsed() < down);
            if is_down {
                down_since.get_or_insert_with(Instant::now);
                let n = f.fetch_add(1, Ordering::SeqCst);
                if n % 2 == 0 {
                    let _ = c.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndown",
                    );
                }
                continue;
            }
            served += 1;
            forward(&hostport, &head, &mut c);
        }
    });
    (format!("http://127.0.0.1:{port}/{path}"), failed)
}

/// The request head (up to the blank line); GETs carry no body.
fn read_head(c: &mut TcpStream) -> String {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match c.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `head` upstream with `Connection: close` and copies the answer back.
fn forward(hostport: &str, head: &str, c: &mut TcpStream) {
    let Ok(mut up) = TcpStream::connect(hostport) else {
        return;
    };
    let mut lines: Vec<&str> = head
        .lines()
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    let req = format!("{}\r\n\r\n", lines.join("\r\n"));
    if up.write_all(req.as_bytes()).is_ok() {
        up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        let _ = up.read_to_end(&mut answer);
        let _ = c.write_all(&answer);
    }
}

/// The registry fails mid-run (HTTP 503 and dropped connections for 3 s, after the first schema was fetched):
/// the record whose schema id is new waits on the registry, retried with backoff within `--connect-timeout`, and
/// lands when the registry answers again — no dead letter, every record landed, the checkpoint at the end.
#[test]
fn registry_failing_mid_run_is_retried_not_dead_lettered() {
    let db = Db::fresh("r14flaky");
    let topic = new_topic("r14flaky", 2);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let v2 = ORDER_AVRO.replacen(
        r#""name":"OrderEvent","#,
        r#""name":"OrderEvent","doc":"v2","#,
        1,
    );
    let id2 = register(&format!("{topic}-value"), "AVRO", &v2);
    assert_ne!(id, id2, "a second schema id");
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let rec = |partition: i32, key: &str, value: Vec<u8>| Rec {
        partition,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    let shipped = order_avro(&schema, 2, "OrderShipped", "o-1", 2, None, None);
    let other = order_avro(&schema, 3, "OrderPlaced", "o-2", 1, Some("c-2"), None);
    produce(
        &topic,
        &[
            rec(0, "o-1", frame(id, &placed)),
            rec(0, "o-1", frame(id2, &shipped)),
            rec(1, "o-2", frame(id2, &other)),
        ],
    );
    let (url, failed) = flaky_registry(1, Duration::from_secs(3));
    let group = unique("g");
    let p = orders(&topic, &group, &db, &avro_source(&url));
    let config = p.path.to_str().unwrap().to_string();
    let out = replaysafe_with(
        &[
            "run",
            "--config",
            &config,
            "--until-caught-up",
            "--connect-timeout",
            "60",
        ],
        &[],
        Duration::from_secs(180),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(failed.load(Ordering::SeqCst) >= 2, "the registry failed");
    assert!(
        out.stderr.contains("schema registry unavailable, retrying"),
        "{}",
        out.stderr
    );
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (3, 3, 0));
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert_eq!(
        db.column::<String>("SELECT order_id || ' ' || status FROM {s}.orders ORDER BY order_id"),
        vec!["o-1 SHIPPED".to_string(), "o-2 PLACED".to_string()]
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(1));
}

/// A newcomer's wrong registry URL (Apicurio's native `/apis/registry/v2`, the one the Connect converters take)
/// answers 404 for every id: that is the configuration's fault, not the records' — the run stops (exit 1)
/// naming the URL, no dead letter, the checkpoint before the record; with the right URL the rerun lands it.
#[test]
fn a_registry_url_that_is_not_the_confluent_api_stops_instead_of_dead_lettering() {
    let db = Db::fresh("r14url");
    let topic = new_topic("r14url", 1);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    produce(
        &topic,
        &[Rec {
            partition: 0,
            key: Some(b"o-1".to_vec()),
            value: Some(frame(id, &placed)),
            timestamp_ms: None,
        }],
    );
    let group = unique("g");
    let wrong = registry_url().replace("/apis/ccompat/v7", "/apis/registry/v2");
    let out = try_run(&orders(&topic, &group, &db, &avro_source(&wrong)).path);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("does not serve the Confluent-compatible API")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert!(db.checkpoint(&group, &topic, 0).unwrap_or(0) == 0);
    let t = run_caught_up(&orders(&topic, &group, &db, &avro_source(&registry_url())).path).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (1, 1, 0));
    assert_eq!(
        db.text("SELECT status FROM {s}.orders WHERE order_id = 'o-1'"),
        Some("PLACED".to_string())
    );
}

/// A server that answers every request with HTTP 200 and an HTML page (a proxy's login page, a UI).
fn html_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            read_head(&mut c);
            let body = "<html><body>Sign in</body></html>";
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    format!("http://127.0.0.1:{port}/apis/ccompat/v7")
}

/// A registry URL that answers 200 with something other than the registry's JSON (an HTML page) is the
/// configuration's fault: the run stops (exit 1) naming it, no dead letter, the checkpoint before the record.
#[test]
fn a_registry_url_answering_html_stops_instead_of_dead_lettering() {
    let db = Db::fresh("r14html");
    let topic = new_topic("r14html", 1);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    produce(
        &topic,
        &[Rec {
            partition: 0,
            key: Some(b"o-1".to_vec()),
            value: Some(frame(1, &placed)),
            timestamp_ms: None,
        }],
    );
    let group = unique("g");
    let out = try_run(&orders(&topic, &group, &db, &avro_source(&html_server())).path);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("is not the Confluent-compatible API's (answer is not JSON")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert!(db.checkpoint(&group, &topic, 0).unwrap_or(0) == 0);
}

/// A schemaless Debezium change of `public.accounts`, as a JSON Schema converter writes it (the payload alone).
fn dbz_change(op: &str, before: serde_json::Value, after: serde_json::Value, lsn: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_760_000_000_000i64 + lsn,
        "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "accounts",
            "snapshot": "false", "txId": lsn / 10, "lsn": lsn, "ts_ms": 1_760_000_000_000i64 + lsn,
            "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 5)},
    }))
    .unwrap()
}

/// JSON Schema framed Debezium keys and values with nulls, over two partitions: an explicit null is a NULL, an
/// absent member keeps the stored value, a delete leaves a tombstone, the Kafka tombstone (null value) is
/// filtered; a key that is not framed is quarantined naming it; a replay under another group lands nothing.
#[test]
fn json_schema_debezium_values_with_nulls() {
    use serde_json::json;
    let db = Db::fresh("r14js");
    let topic = new_topic("r14js", 2);
    let id = register(
        &format!("{topic}-value"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
    );
    let kid = register(
        &format!("{topic}-key"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"id":{"type":"integer"}}}"#,
    );
    let rec = |partition: i32, key: i64, value: Option<Vec<u8>>| Rec {
        partition,
        key: Some(frame(kid, format!("{{\"id\":{key}}}").as_bytes())),
        value: value.map(|v| frame(id, &v)),
        timestamp_ms: None,
    };
    let null = serde_json::Value::Null;
    let mut plain_key = rec(
        1,
        9,
        Some(dbz_change(
            "c",
            null.clone(),
            json!({"id": 9, "owner": "n"}),
            400,
        )),
    );
    plain_key.key = Some(br#"{"id":9}"#.to_vec());
    produce(
        &topic,
        &[
            rec(
                0,
                1,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 1, "owner": null, "balance": "1.50"}),
                    100,
                )),
            ),
            rec(
                1,
                2,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 2, "owner": "two", "balance": null}),
                    110,
                )),
            ),
            rec(
                0,
                1,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 1, "owner": "one", "balance": "2.00"}),
                    200,
                )),
            ),
            rec(
                1,
                2,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 2, "owner": null, "balance": "3.00"}),
                    210,
                )),
            ),
            rec(
                0,
                1,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 1, "balance": null}),
                    300,
                )),
            ),
            rec(
                1,
                3,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 3, "owner": "three", "balance": "0.00"}),
                    310,
                )),
            ),
            rec(
                1,
                3,
                Some(dbz_change(
                    "d",
                    json!({"id": 3, "owner": null, "balance": null}),
                    null.clone(),
                    320,
                )),
            ),
            rec(1, 3, None),
            plain_key,
        ],
    );
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"json-schema\"\nschema-registry = {{ url = \"{}\" }}\ndecimal-handling = \"string\"\n\
         [[projection]]\nkind = \"row\"\ntable = \"accounts\"\nsource-table = \"public.accounts\"\nkey = [\"id\"]\n\
         columns = {{ id = \"bigint\", owner = \"text\", balance = \"numeric(12,2)\" }}\n",
        registry_url()
    );
    let group = unique("g");
    let out = run_caught_up(&pipeline(&text, &topic, &group, &db.schema).path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (9, 7, 0, 1, 1),
        "{}",
        out.stdout
    );
    assert_eq!(
        db.column::<String>(
            "SELECT concat_ws(' | ', id, coalesce(owner, 'NULL'), coalesce(balance::text, 'NULL')) FROM {s}.accounts ORDER BY id"
        ),
        vec!["1 | one | NULL", "2 | NULL | 3.00"]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.accounts_tombstones WHERE id = 3"),
        1
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].1, "schema-registry");
    assert!(
        dl[0].2.contains("the key is not schema-registry framed"),
        "{dl:?}"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(6));
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 7, 1)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        1
    );
}
