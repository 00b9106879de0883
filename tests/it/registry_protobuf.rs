//! Schema-registry Protobuf (`[source] encoding = "protobuf"`, issue 43 item 5) through the real registry
//! (`scripts/registry-start`): schemas registered as `PROTOBUF` with `references` (imports) in the
//! Confluent-compatible API, values and keys framed as Confluent's serializers frame them (magic 0, schema id,
//! message indexes, message). The messages are encoded here by hand (tag, wire type, payload) so that the test
//! does not share the decoder's library.

use crate::common::*;
use crate::registry::{dead_letters, frame, orders, registry_url};

/// A varint.
fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Field `n` as a varint (wire type 0).
fn int(n: u32, v: u64) -> Vec<u8> {
    let mut out = varint(u64::from(n) << 3);
    out.extend(varint(v));
    out
}

/// Field `n` as length-delimited bytes (wire type 2): a string, bytes or a message.
fn ld(n: u32, v: &[u8]) -> Vec<u8> {
    let mut out = varint((u64::from(n) << 3) | 2);
    out.extend(varint(v.len() as u64));
    out.extend(v);
    out
}

/// Registers a `PROTOBUF` schema under `subject` with `refs` (name, subject, version); returns its id.
fn register_proto(subject: &str, schema: &str, refs: &[(&str, &str, u32)]) -> u32 {
    let refs: Vec<serde_json::Value> = refs
        .iter()
        .map(|(n, s, v)| serde_json::json!({"name": n, "subject": s, "version": v}))
        .collect();
    let body = serde_json::json!({"schemaType": "PROTOBUF", "schema": schema, "references": refs});
    let mut resp = ureq::post(&format!("{}/subjects/{subject}/versions", registry_url()))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .send(body.to_string().as_bytes())
        .expect("register a schema");
    let v: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    v["id"].as_u64().unwrap_or_else(|| panic!("no id in {v}")) as u32
}

/// The event schema: its second message (indexes `[1]`) is the event. No `import`: the test kit's Apicurio
/// 2.4.2 answers HTTP 500 ("Could not initialize class okio.internal._PathKt") to any Protobuf schema that
/// imports a file, a well-known type or a reference — imports, references and the well-known/Confluent types are
/// covered by `src/decode/protobuf.rs`'s unit tests.
const ORDER_V1: &str = "syntax = \"proto3\";\npackage shop;\nmessage Other { string x = 1; }\n\
    message OrderEvent { string event_id = 1; string event_type = 2; string entity_id = 3; int64 version = 4;\n\
    string occurred_at = 5; Data data = 6; }\n\
    message Data { optional string customer_id = 1; optional string amount = 2; }\n";

/// An `OrderEvent` (message indexes `[1]` first).
fn order(n: u32, kind: &str, entity: &str, version: u64, data: &[u8]) -> Vec<u8> {
    let mut m = vec![2, 2];
    m.extend(ld(1, format!("c43a0000-0000-4000-8000-{n:012}").as_bytes()));
    m.extend(ld(2, kind.as_bytes()));
    m.extend(ld(3, entity.as_bytes()));
    m.extend(int(4, version));
    m.extend(ld(5, b"2024-04-25T00:00:06.500Z"));
    m.extend(ld(6, data));
    m
}

/// `cents` as decimal text.
fn cents(c: u16) -> Vec<u8> {
    format!("{}.{:02}", c / 100, c % 100).into_bytes()
}

fn protobuf_source(url: &str) -> String {
    format!("\n[source]\nformat = \"json\"\nencoding = \"protobuf\"\nschema-registry = {{ url = \"{url}\" }}\n")
}

/// Protobuf values through the real registry on a JSON-event pipeline: v1 and v2 (`notes` added to the nested
/// `Data`) of the subject, records of both landing together (v1's `notes` null), int64 versions, an `optional`
/// field unset (null), the event named by message indexes `[1]`. An unknown schema id, message indexes that name no
/// message, a message cut short and a JSON-Schema id are dead letters naming the id and what is wrong, at their
/// offsets, raw bytes kept; a replay under another group is all duplicates.
#[test]
fn protobuf_values_through_the_registry_land_and_bad_frames_are_named() {
    let db = Db::fresh("rproto");
    let topic = new_topic("rproto", 2);
    let v1 = register_proto(&format!("{topic}-value"), ORDER_V1, &[]);
    let v2_text = ORDER_V1.replace(
        "optional string amount = 2; }",
        "optional string amount = 2; optional string notes = 3; }",
    );
    let v2 = register_proto(&format!("{topic}-value"), &v2_text, &[]);
    assert_ne!(v1, v2, "a second schema id");
    let json_id = crate::registry::register(
        &format!("{topic}-json"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
    );
    let placed = order(1, "OrderPlaced", "o-1", 1, &ld(1, b"c-1"));
    let mut paid_data = ld(2, &cents(1250));
    paid_data.extend(ld(3, b"gift"));
    let paid = order(2, "PaymentCaptured", "o-1", 2, &paid_data);
    let shipped = order(3, "OrderShipped", "o-1", 3, &[]);
    let other = order(4, "OrderPlaced", "o-2", 1, &ld(1, b"c-2"));
    let mut bad_index = shipped.clone();
    bad_index[1] = 8; // indexes [4]: the file has 2 messages
    let mut cut = paid.clone();
    cut.truncate(cut.len() - 3);
    let rec = |partition: i32, value: Vec<u8>| Rec {
        partition,
        key: Some(b"o-1".to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    let recs = [
        rec(0, frame(v1, &placed)),
        rec(0, frame(v2, &paid)),
        rec(0, frame(999_998, &placed)),
        rec(0, frame(v1, &bad_index)),
        rec(0, frame(v2, &cut)),
        rec(0, frame(json_id, b"{}")),
        rec(0, frame(v1, &shipped)),
        rec(1, frame(v2, &other)),
    ];
    produce(&topic, &recs);
    let group = unique("g");
    let source = protobuf_source(&registry_url());
    let out = run_caught_up(&orders(&topic, &group, &db, &source).path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (8, 4, 4),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        db.column::<String>(
            "SELECT concat_ws(' ', order_id, customer_id, status, version, coalesce(notes_length::text, '-')) \
             FROM {s}.orders ORDER BY order_id"
        ),
        vec!["o-1 c-1 SHIPPED 3 4", "o-2 c-2 PLACED 1 -"]
    );
    assert_eq!(
        db.text("SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-1'"),
        Some("12.50".to_string()),
        "the amount keeps its scale"
    );
    assert_eq!(
        db.column::<String>("SELECT DISTINCT day::text FROM {s}.processed_events"),
        vec!["2024-04-25".to_string()],
        "occurred_at → the event day"
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 4, "{dl:?}");
    assert!(dl.iter().all(|d| d.1 == "schema-registry"), "{dl:?}");
    assert_eq!(
        dl.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![2, 3, 4, 5],
        "the offsets"
    );
    let want = [
        "unknown schema id 999998 in the value's frame".to_string(),
        format!("schema id {v1} (value): message indexes [4] name no message of the schema (3 top-level: Other, OrderEvent, Data)"),
        format!("schema id {v2} (value): the Protobuf data does not match message shop.OrderEvent"),
        format!("schema id {json_id} (value) is a JSON schema, but the pipeline's encoding is \"protobuf\""),
    ];
    for (d, w) in dl.iter().zip(&want) {
        assert!(d.2.starts_with(w.as_str()), "{w}\n{dl:?}");
    }
    assert_eq!(
        dl[0].3.as_deref(),
        recs[2].value.as_deref(),
        "raw frame kept"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(7));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(1));
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

/// A Protobuf pipeline whose registry does not answer: retried for `--connect-timeout`, then exit 1 naming the
/// registry and the record's offset — no dead letter, no checkpoint past the record.
#[test]
fn protobuf_registry_down_stops_the_run_without_dead_letters() {
    let db = Db::fresh("rprotodown");
    let topic = new_topic("rprotodown", 1);
    produce(
        &topic,
        &[Rec {
            partition: 0,
            key: Some(b"o-1".to_vec()),
            value: Some(frame(1, &order(1, "OrderPlaced", "o-1", 1, &[]))),
            timestamp_ms: None,
        }],
    );
    let group = unique("g");
    let p = orders(
        &topic,
        &group,
        &db,
        &protobuf_source("http://127.0.0.1:1/apis/ccompat/v7"),
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
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert!(db.checkpoint(&group, &topic, 0).unwrap_or(0) == 0);
}

/// A Debezium change of `public.accounts` shaped as Confluent's ProtobufConverter writes the envelope (a message
/// `Envelope` with nested `Value` and `Source`): message indexes `[0]` (the single byte 0), then the message.
const ENVELOPE_PROTO: &str = "syntax = \"proto3\";\npackage pg.public.accounts;\n\
    message Envelope {\n  Value before = 1;\n  Value after = 2;\n  Source source = 3;\n  string op = 4;\n\
      optional int64 ts_ms = 5;\n\
      message Value { int64 id = 1; optional string owner = 2; optional string balance = 3; }\n\
      message Source { string connector = 1; string name = 2; string db = 3; string schema = 4; string table = 5;\n\
        string snapshot = 6; int64 txId = 7; int64 lsn = 8; int64 ts_ms = 9; string sequence = 10; }\n}\n";

/// A row image (`Envelope.Value`).
fn row(id: u64, owner: Option<&str>, balance: Option<u16>) -> Vec<u8> {
    let mut v = int(1, id);
    if let Some(o) = owner {
        v.extend(ld(2, o.as_bytes()));
    }
    if let Some(b) = balance {
        v.extend(ld(3, &cents(b)));
    }
    v
}

/// An envelope: `op`, the row images, the source block at `lsn`.
fn envelope(op: &str, before: Option<Vec<u8>>, after: Option<Vec<u8>>, lsn: u64) -> Vec<u8> {
    let mut m = vec![0u8];
    if let Some(b) = before {
        m.extend(ld(1, &b));
    }
    if let Some(a) = after {
        m.extend(ld(2, &a));
    }
    let mut s = Vec::new();
    for (n, v) in [
        (1, "postgresql"),
        (2, "pg"),
        (3, "app"),
        (4, "public"),
        (5, "accounts"),
        (6, "false"),
    ] {
        s.extend(ld(n, v.as_bytes()));
    }
    s.extend(int(7, lsn / 10));
    s.extend(int(8, lsn));
    s.extend(int(9, 1_760_000_000_000 + lsn));
    s.extend(ld(10, format!("[\"{}\",\"{lsn}\"]", lsn - 5).as_bytes()));
    m.extend(ld(3, &s));
    m.extend(ld(4, op.as_bytes()));
    m.extend(int(5, 1_760_000_000_000 + lsn));
    m
}

/// Protobuf-framed Debezium keys and values (the envelope Confluent's ProtobufConverter writes, registered as
/// `PROTOBUF` in the real registry; the converter itself is not on this test kit's Connect worker): creates,
/// updates with an unset `optional` owner (NULL) and a Decimal balance, a delete (tombstone), the Kafka tombstone
/// filtered; a key that is not framed is quarantined naming it; a replay under another group lands nothing.
#[test]
fn protobuf_debezium_keys_and_values() {
    let db = Db::fresh("rprotodbz");
    let topic = new_topic("rprotodbz", 2);
    let id = register_proto(&format!("{topic}-value"), ENVELOPE_PROTO, &[]);
    let kid = register_proto(
        &format!("{topic}-key"),
        "syntax = \"proto3\";\npackage pg.public.accounts;\nmessage Key { int64 id = 1; }\n",
        &[],
    );
    let rec = |partition: i32, key: u64, value: Option<Vec<u8>>| Rec {
        partition,
        key: Some(frame(kid, &[vec![0u8], int(1, key)].concat())),
        value: value.map(|v| frame(id, &v)),
        timestamp_ms: None,
    };
    let mut plain_key = rec(
        1,
        9,
        Some(envelope("c", None, Some(row(9, Some("n"), None)), 400)),
    );
    plain_key.key = Some(br#"{"id":9}"#.to_vec());
    produce(
        &topic,
        &[
            rec(
                0,
                1,
                Some(envelope("c", None, Some(row(1, None, Some(150))), 100)),
            ),
            rec(
                1,
                2,
                Some(envelope("c", None, Some(row(2, Some("two"), None)), 110)),
            ),
            rec(
                0,
                1,
                Some(envelope(
                    "u",
                    None,
                    Some(row(1, Some("one"), Some(200))),
                    200,
                )),
            ),
            rec(
                1,
                2,
                Some(envelope("u", None, Some(row(2, None, Some(300))), 210)),
            ),
            rec(
                1,
                3,
                Some(envelope(
                    "c",
                    None,
                    Some(row(3, Some("three"), Some(0))),
                    310,
                )),
            ),
            rec(
                1,
                3,
                Some(envelope(
                    "d",
                    Some(row(3, Some("three"), Some(0))),
                    None,
                    320,
                )),
            ),
            rec(1, 3, None),
            plain_key,
        ],
    );
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"protobuf\"\nschema-registry = {{ url = \"{}\" }}\ndecimal-handling = \"string\"\n\
         [[projection]]\nkind = \"row\"\ntable = \"accounts\"\nsource-table = \"public.accounts\"\nkey = [\"id\"]\n\
         columns = {{ id = \"bigint\", owner = \"text\", balance = \"numeric(12,2)\" }}\n",
        registry_url()
    );
    let group = unique("g");
    let out = run_caught_up(&pipeline(&text, &topic, &group, &db.schema).path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (8, 6, 0, 1, 1),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        db.column::<String>(
            "SELECT concat_ws(' | ', id, coalesce(owner, 'NULL'), coalesce(balance::text, 'NULL')) FROM {s}.accounts ORDER BY id"
        ),
        vec!["1 | one | 2.00", "2 | NULL | 3.00"]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.accounts_tombstones WHERE id = 3"),
        1
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!((dl[0].0, dl[0].1.as_str()), (5, "schema-registry"));
    assert!(
        dl[0].2.contains("the key is not schema-registry framed"),
        "{dl:?}"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(6));
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 6, 1)
    );
}
