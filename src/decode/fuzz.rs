//! Property tests of the decoders (issue 35.6): hostile bytes reach the JSON, Debezium envelope, Avro, JSON
//! Schema, registry-frame and `kcat -J` line decoders first. Each is fed arbitrary bytes and mutations of valid
//! records (bytes flipped, inserted, deleted, duplicated, cut; JSON-significant bytes favoured), and must end
//! every input as a value or a named rejection ([`Reason`] with a detail) — never a panic; where an encoder
//! exists (serde_json for JSON events, Debezium envelopes and kcat lines, apache-avro's datum writer, the frame
//! header) decode(encode(x)) gives x back.
//!
//! Bounded: `PROPTEST_CASES` cases per property (proptest's default, 256), no regression files written; the
//! whole set runs in a few seconds as ordinary unit tests (`cargo test`, `.ci/run` through `scripts/test`).

use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{Decoded, Reason, Rejection};
use crate::config::{parse, Pipeline};

/// proptest's configuration from the environment (`PROPTEST_CASES`, default 256), without regression files.
fn cases() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const HEAD: &str = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n";

const FIELDS: &str = "[fields]\nevent_id = { path = \"/event_id\", type = \"uuid\" }\n\
    kind = { path = \"/kind\", type = \"text\" }\n\
    n = { path = \"/n\", type = \"bigint\" }\n\
    amount = { path = \"/data/amount\", type = \"numeric\", optional = true }\n\
    day = { path = \"/day\", type = \"date\" }\n\
    at = { path = \"/at\", type = \"timestamptz\", optional = true }\n\
    flag = { path = \"/flag\", type = \"boolean\", optional = true }\n\
    doc = { path = \"/doc\", type = \"jsonb\", optional = true }\n\
    [identity]\nkey = [\"event_id\"]\n";

/// A JSON-event pipeline reading every field type.
fn json_pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| parse("fuzz.toml", &format!("{HEAD}{FIELDS}")).expect("valid"))
}

/// A Debezium pipeline with a field of its own (the full envelope decode) and a row projection.
fn debezium_pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| {
        let text = format!(
            "{HEAD}[source]\nformat = \"debezium\"\n[fields]\nname = {{ path = \"/after/name\", type = \"text\", \
             optional = true }}\n[[projection]]\nkind = \"row\"\ntable = \"a\"\nkey = [\"id\"]\n\
             columns = {{ id = \"bigint\", name = \"text\" }}\n"
        );
        parse("fuzz.toml", &text).expect("valid")
    })
}

/// The Avro schema of [`avro_pipeline`]'s records (schema id [`AVRO_ID`]).
const AVRO_SCHEMA: &str = r#"{"type":"record","name":"E","namespace":"fuzz","fields":[
 {"name":"event_id","type":{"type":"string","logicalType":"uuid"}},
 {"name":"kind","type":"string"},
 {"name":"n","type":"long"},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"flag","type":["null","boolean"],"default":null},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"data","type":{"type":"record","name":"D","fields":[
   {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":20,"scale":2}],"default":null}]}}]}"#;
const AVRO_ID: u32 = 7;
const JSON_SCHEMA_ID: u32 = 8;

/// A pipeline of schema-registry framed records (`encoding`), its registry's answers for [`AVRO_ID`] and
/// [`JSON_SCHEMA_ID`] cached (the registry itself, a closed port, is never asked: every frame of these tests
/// carries one of the two ids).
fn framed_pipeline(encoding: &str) -> Pipeline {
    let text = format!(
        "{HEAD}[source]\nformat = \"json\"\nencoding = \"{encoding}\"\n\
         schema-registry = {{ url = \"http://127.0.0.1:1\" }}\n{FIELDS}"
    );
    let p = parse("fuzz.toml", &text).expect("valid");
    let registry = super::registry::client(p.registry.as_ref().expect("registry"));
    let avro = json!({ "schema": AVRO_SCHEMA, "schemaType": "AVRO" }).to_string();
    registry.cache_answer(AVRO_ID, &avro).expect("avro schema");
    let js = json!({ "schema": "{\"type\":\"object\"}", "schemaType": "JSON" }).to_string();
    registry
        .cache_answer(JSON_SCHEMA_ID, &js)
        .expect("json schema");
    p
}

fn avro_pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| framed_pipeline("avro"))
}

fn json_schema_pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| framed_pipeline("json-schema"))
}

/// Whether a rejection is named: a quarantine reason (never "registry unavailable": no registry is asked) and
/// a detail.
fn named(r: &Rejection) -> bool {
    Reason::ALL.contains(&r.reason) && !r.detail.trim().is_empty()
}

/// Decodes one record; fails the property on anything but fields, a skip or a named rejection (a panic fails it
/// anyway).
fn decodes_or_names(
    p: &Pipeline,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<(), TestCaseError> {
    match super::record(p, key, value, None) {
        Ok(Decoded::Fields { fields, .. }) => {
            prop_assert_eq!(fields.len(), p.fields.len());
            Ok(())
        }
        Ok(Decoded::Skip(rule)) => {
            prop_assert!(!rule.is_empty());
            Ok(())
        }
        Err(r) => {
            prop_assert!(named(&r), "unnamed rejection {:?}", r);
            Ok(())
        }
    }
}

/// One change to a valid record's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the byte at (index mod length).
    Set(usize, u8),
    /// Insert a byte.
    Insert(usize, u8),
    /// Remove up to `n` bytes from an index.
    Delete(usize, usize),
    /// Cut the record at an index.
    Truncate(usize),
    /// Copy a stretch of the record to another place (a repeated member, a nested copy).
    Duplicate(usize, usize, usize),
}

/// Bytes that matter to JSON, Avro varints and frames, favoured over uniform ones.
fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(b"{}[]\":,\\0123456789-+.eEtfnu \x00\x01\x7f\x80\xff\x1b\n".to_vec()),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..32, any::<usize>())
            .prop_map(|(a, n, b)| Mutation::Duplicate(a, n, b)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..5)
}

/// `bytes` with `ms` applied in order (indices taken modulo the current length).
fn mutate(bytes: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in ms {
        let len = b.len().max(1);
        match *m {
            Mutation::Set(i, v) if !b.is_empty() => b[i % len] = v,
            Mutation::Set(_, v) => b.push(v),
            Mutation::Insert(i, v) => b.insert(i % (b.len() + 1), v),
            Mutation::Delete(i, n) if !b.is_empty() => {
                let at = i % len;
                b.drain(at..(at + n).min(b.len()));
            }
            Mutation::Delete(..) => {}
            Mutation::Truncate(i) => b.truncate(i % (b.len() + 1)),
            Mutation::Duplicate(a, n, to) if !b.is_empty() => {
                let at = a % len;
                let piece = b[at..(at + n).min(b.len())].to_vec();
                let to = to % (b.len() + 1);
                b.splice(to..to, piece);
            }
            Mutation::Duplicate(..) => {}
        }
    }
    b
}

/// A valid JSON event: its fields as sent, and the text each decodes to.
#[derive(Debug, Clone)]
struct Event {
    id: uuid::Uuid,
    kind: String,
    n: i64,
    /// Cents (the amount has 2 decimals), or none.
    cents: Option<i64>,
    /// Days since 1970-01-01 (a date within PostgreSQL's and chrono's range).
    day: i32,
    flag: Option<bool>,
    doc: Option<Value>,
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        "[^\u{0}]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z~/]{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn event() -> impl Strategy<Value = Event> {
    (
        any::<u128>(),
        // Any text PostgreSQL stores: every character but NUL (controls, escapes and astral ones included).
        "[^\u{0}]{0,40}",
        any::<i64>(),
        prop::option::of(any::<i64>()),
        -700_000i32..2_000_000,
        prop::option::of(any::<bool>()),
        prop::option::of(json_value()),
    )
        .prop_map(|(id, kind, n, cents, day, flag, doc)| Event {
            id: uuid::Uuid::from_u128(id),
            kind,
            n,
            cents,
            day,
            flag,
            doc,
        })
}

fn date(days: i32) -> chrono::NaiveDate {
    chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch")
        + chrono::Duration::days(i64::from(days))
}

/// `cents` as the decimal text with two places.
fn amount(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let c = cents.unsigned_abs();
    format!("{sign}{}.{:02}", c / 100, c % 100)
}

impl Event {
    fn json(&self) -> Vec<u8> {
        let mut v = json!({
            "event_id": self.id.to_string().to_uppercase(),
            "kind": self.kind,
            "n": self.n,
            "day": date(self.day).format("%Y-%m-%d").to_string(),
            "data": { "amount": self.cents.map(amount) },
        });
        if let Some(f) = self.flag {
            v["flag"] = json!(f);
        }
        if let Some(d) = &self.doc {
            v["doc"] = d.clone();
        }
        serde_json::to_vec(&v).expect("json")
    }

    /// The decoded fields' text, in [`FIELDS`] order (none: absent).
    fn expected(&self) -> Vec<Option<String>> {
        vec![
            Some(self.id.hyphenated().to_string()),
            Some(self.kind.clone()),
            Some(self.n.to_string()),
            self.cents.map(amount),
            Some(date(self.day).format("%Y-%m-%d").to_string()),
            None,
            self.flag.map(|b| b.to_string()),
            self.doc
                .clone()
                .filter(|d| !d.is_null())
                .map(|d| d.to_string()),
        ]
    }
}

/// The decoded fields' text, in [`FIELDS`] order whatever order the pipeline keeps them in.
fn texts(p: &Pipeline, key: Option<&[u8]>, value: &[u8]) -> Result<Vec<Option<String>>, String> {
    const ORDER: [&str; 8] = [
        "event_id", "kind", "n", "amount", "day", "at", "flag", "doc",
    ];
    match super::record(p, key, Some(value), None) {
        Ok(Decoded::Fields { fields, .. }) => Ok(ORDER
            .iter()
            .map(|name| {
                let i = p
                    .fields
                    .iter()
                    .position(|f| f.name.as_str() == *name)
                    .expect("field");
                fields[i].as_ref().map(|v| v.text.clone())
            })
            .collect()),
        Ok(Decoded::Skip(r)) => Err(format!("skipped as {r}")),
        Err(r) => Err(format!("{}: {}", r.reason.as_str(), r.detail)),
    }
}

/// The amounts compared as numbers (`1.50` and `1.5` are one value).
fn same_amount(a: &Option<String>, b: &Option<String>) -> bool {
    use std::str::FromStr;
    match (a, b) {
        (Some(a), Some(b)) => {
            bigdecimal::BigDecimal::from_str(a).ok() == bigdecimal::BigDecimal::from_str(b).ok()
        }
        (None, None) => true,
        _ => false,
    }
}

fn assert_fields(got: Vec<Option<String>>, want: Vec<Option<String>>) -> Result<(), TestCaseError> {
    prop_assert!(
        same_amount(&got[3], &want[3]),
        "amount {:?} != {:?}",
        got[3],
        want[3]
    );
    for i in (0..want.len()).filter(|&i| i != 3) {
        prop_assert_eq!(&got[i], &want[i], "field {}", i);
    }
    Ok(())
}

/// A frame: magic byte 0, the schema id big-endian, the body.
fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend(id.to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// The Avro datum of `e` (its `doc` and `at` are not in the Avro schema).
fn avro_datum(e: &Event) -> Vec<u8> {
    use apache_avro::types::Value as A;
    let schema = apache_avro::Schema::parse_str(AVRO_SCHEMA).expect("schema");
    let amount = match e.cents {
        None => A::Union(0, Box::new(A::Null)),
        Some(c) => A::Union(
            1,
            Box::new(A::Decimal(apache_avro::Decimal::from(
                num_bigint::BigInt::from(c).to_signed_bytes_be(),
            ))),
        ),
    };
    let flag = match e.flag {
        None => A::Union(0, Box::new(A::Null)),
        Some(b) => A::Union(1, Box::new(A::Boolean(b))),
    };
    let value = A::Record(vec![
        ("event_id".into(), A::Uuid(e.id)),
        ("kind".into(), A::String(e.kind.clone())),
        ("n".into(), A::Long(e.n)),
        ("day".into(), A::Date(e.day)),
        ("flag".into(), flag),
        ("tags".into(), A::Array(vec![A::String(e.kind.clone())])),
        ("data".into(), A::Record(vec![("amount".into(), amount)])),
    ]);
    apache_avro::to_avro_datum(&schema, value).expect("encodes")
}

/// A Debezium change event (JSON converter, `schemas.enable=false`) of table `public.a`.
fn envelope(op: &str, id: i64, name: &str, lsn: (u32, u32)) -> Vec<u8> {
    let row = json!({ "id": id, "name": name });
    let (before, after) = match op {
        "d" => (row, Value::Null),
        _ => (Value::Null, row),
    };
    let v = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1,
        "source": { "connector": "postgresql", "name": "s", "db": "d", "schema": "public", "table": "a",
                    "snapshot": "false", "lsn": lsn.1, "sequence": format!("[\"{}\",\"{}\"]", lsn.0, lsn.1) },
        "transaction": null,
    });
    serde_json::to_vec(&v).expect("json")
}

/// A record's key and value bytes.
type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

/// The real Debezium records of `tests/fixtures/debezium/` (3 kB at most each): key and value bytes.
fn debezium_fixtures() -> &'static [KeyValue] {
    static F: OnceLock<Vec<KeyValue>> = OnceLock::new();
    F.get_or_init(|| {
        let files = [
            include_str!("../../tests/fixtures/debezium/schema-on.jsonl"),
            include_str!("../../tests/fixtures/debezium/schema-off.jsonl"),
            include_str!("../../tests/fixtures/debezium/schema-off-bytes-numeric.jsonl"),
        ];
        let bytes = |v: &Value| (!v.is_null()).then(|| serde_json::to_vec(v).expect("json"));
        files
            .iter()
            .flat_map(|f| f.lines())
            .filter(|l| l.len() < 3000)
            .map(|l| serde_json::from_str::<Value>(l).expect("fixture"))
            .map(|r| (bytes(&r["key"]), bytes(&r["value"])))
            .collect()
    })
}

/// A `kcat -C -J` line of topic `t`.
fn kcat_line(
    partition: i32,
    offset: i64,
    ts: Option<i64>,
    key: Option<&str>,
    payload: Option<&str>,
) -> String {
    json!({ "topic": "t", "partition": partition, "offset": offset, "tstype": "create", "ts": ts,
            "broker": 0, "headers": ["h", "v"], "key": key, "payload": payload })
    .to_string()
}

/// A hostile scalar for a typed field: a JSON number of any size and exponent (written raw), the same as a
/// string, an RFC 3339-like timestamp with out-of-range parts, or number-like text.
fn hostile_scalar() -> impl Strategy<Value = String> {
    let number = "-?[0-9]{1,60}(\\.[0-9]{0,40})?([eE][-+]?[0-9]{1,22})?";
    prop_oneof![
        number.prop_map(|n| n.to_string()),
        number.prop_map(|n| json!(n).to_string()),
        "[0-9]{1,7}-[0-9]{1,3}-[0-9]{1,3}(T[0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{0,12})?(Z|[-+][0-9]{1,3}:[0-9]{1,3}))?"
            .prop_map(|t| json!(t).to_string()),
        "[-+0-9.eE_ xT:Z]{0,24}".prop_map(|t| json!(t).to_string()),
        Just("1e9223372036854775808".to_string()),
        Just("-9223372036854775809".to_string()),
        Just("\"NaN\"".to_string()),
        Just("\"-0\"".to_string()),
    ]
}

proptest! {
    #![proptest_config(cases())]

    /// Numbers, dates and timestamps of any size and shape in every typed field: a value or a named
    /// rejection; a bigint that fits reads back exactly.
    #[test]
    fn hostile_typed_values_end_as_fields_or_a_named_rejection(
        n in hostile_scalar(),
        day in hostile_scalar(),
        at in hostile_scalar(),
        amount in hostile_scalar(),
        id in "[0-9a-fA-F-]{0,40}",
    ) {
        let text = format!(
            "{{\"event_id\":{},\"kind\":{n},\"n\":{n},\"day\":{day},\"at\":{at},\"flag\":{n},\
             \"data\":{{\"amount\":{amount}}}}}",
            json!(id)
        );
        let p = json_pipeline();
        decodes_or_names(p, None, Some(text.as_bytes()))?;
        if let Ok(Decoded::Fields { fields, .. }) = super::record(p, None, Some(text.as_bytes()), None) {
            let i = p.fields.iter().position(|f| f.name.as_str() == "n").expect("n");
            let raw = n.trim_matches('"').trim().to_string();
            prop_assert_eq!(fields[i].as_ref().map(|v| v.text.clone()), raw.parse::<i64>().ok().map(|v| v.to_string()));
        }
    }

    /// Arbitrary bytes as a JSON event's value, key and Debezium key and value: a value or a named rejection.
    #[test]
    fn arbitrary_bytes_end_as_fields_or_a_named_rejection(
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..64)),
        value in prop::option::of(prop::collection::vec(any::<u8>(), 0..512)),
    ) {
        for p in [json_pipeline(), debezium_pipeline()] {
            decodes_or_names(p, key.as_deref(), value.as_deref())?;
        }
    }

    /// Mutations of valid JSON events: a value or a named rejection.
    #[test]
    fn mutated_json_events_end_as_fields_or_a_named_rejection(e in event(), ms in mutations()) {
        decodes_or_names(json_pipeline(), None, Some(&mutate(&e.json(), &ms)))?;
    }

    /// A JSON event decodes to the values it was encoded from (UUIDs normalised, any text but NUL kept as is).
    #[test]
    fn json_events_round_trip(e in event()) {
        let got = texts(json_pipeline(), None, &e.json()).map_err(TestCaseError::fail)?;
        assert_fields(got, e.expected())?;
    }

    /// Mutations of valid Debezium envelopes, ours and the real fixtures': a change, a skip or a named
    /// rejection.
    #[test]
    fn mutated_debezium_envelopes_end_as_a_change_or_a_named_rejection(
        op in prop::sample::select(vec!["c", "u", "d", "r"]),
        id in any::<i64>(),
        name in "[^\u{0}]{0,20}",
        fixture in any::<prop::sample::Index>(),
        ms in mutations(),
    ) {
        let p = debezium_pipeline();
        let key = serde_json::to_vec(&json!({ "id": id })).expect("json");
        let ours = envelope(op, id, &name, (1, 2));
        decodes_or_names(p, Some(&key), Some(&mutate(&ours, &ms)))?;
        decodes_or_names(p, Some(&mutate(&key, &ms)), Some(&ours))?;
        let (k, v) = fixture.get(debezium_fixtures());
        if let Some(v) = v {
            decodes_or_names(p, k.as_deref(), Some(&mutate(v, &ms)))?;
        }
    }

    /// A Debezium change decodes to its operation, table, position and row.
    #[test]
    fn debezium_envelopes_round_trip(
        op in prop::sample::select(vec!["c", "u", "d", "r"]),
        id in any::<i64>(),
        name in "[^\u{0}]{0,20}",
        commit in any::<u32>(),
        change in any::<u32>(),
    ) {
        let key = serde_json::to_vec(&json!({ "id": id })).expect("json");
        let value = envelope(op, id, &name, (commit, change));
        let decoded = super::record(debezium_pipeline(), Some(&key), Some(&value), None);
        let Ok(Decoded::Fields { fields, change: Some(c) }) = decoded else {
            return Err(TestCaseError::fail(format!("{op}: {decoded:?}")));
        };
        prop_assert_eq!(c.table.as_str(), "public.a");
        prop_assert_eq!(c.position, [i64::from(commit), i64::from(change)]);
        prop_assert_eq!(c.op.letter(), op);
        let row = if op == "d" { c.before.as_ref() } else { c.after.as_ref() };
        let row = row.ok_or_else(|| TestCaseError::fail("no row image"))?;
        let cell = |col: &str| row.iter().find(|(n, _)| n == col).map(|(_, c)| c.value.clone());
        prop_assert_eq!(cell("id"), Some(json!(id)));
        prop_assert_eq!(cell("name"), Some(json!(name)));
        let want = (op != "d").then(|| name.clone());
        prop_assert_eq!(fields[0].as_ref().map(|f| f.text.clone()), want, "the only field, `name`");
    }

    /// An Avro frame decodes to the values written; a mutated datum (behind the same frame header) ends as
    /// fields or a named rejection, and arbitrary bytes behind the header too.
    #[test]
    fn avro_frames_round_trip_and_mutations_are_named(
        e in event(),
        ms in mutations(),
        junk in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        let p = avro_pipeline();
        let datum = avro_datum(&e);
        let got = texts(p, None, &frame(AVRO_ID, &datum)).map_err(TestCaseError::fail)?;
        let mut want = e.expected();
        want[7] = None; // no `doc` in the Avro schema
        assert_fields(got, want)?;
        decodes_or_names(p, None, Some(&frame(AVRO_ID, &mutate(&datum, &ms))))?;
        decodes_or_names(p, None, Some(&frame(AVRO_ID, &junk)))?;
        // A frame whose id is the other schema's (JSON): named, not decoded.
        decodes_or_names(p, None, Some(&frame(JSON_SCHEMA_ID, &datum)))?;
    }

    /// A JSON Schema frame decodes to the event's values; mutations of its body end as fields or a named
    /// rejection.
    #[test]
    fn json_schema_frames_round_trip_and_mutations_are_named(e in event(), ms in mutations()) {
        let p = json_schema_pipeline();
        let body = e.json();
        let got = texts(p, None, &frame(JSON_SCHEMA_ID, &body)).map_err(TestCaseError::fail)?;
        assert_fields(got, e.expected())?;
        decodes_or_names(p, None, Some(&frame(JSON_SCHEMA_ID, &mutate(&body, &ms))))?;
    }

    /// Frames of any bytes: the schema id read back is the one written; shorter or unmagical input is named.
    #[test]
    fn frame_headers_round_trip(id in any::<u32>(), body in prop::collection::vec(any::<u8>(), 0..16),
                                bytes in prop::collection::vec(any::<u8>(), 0..8)) {
        prop_assert_eq!(super::framed::schema_id(&frame(id, &body), "value", true).ok(), Some(Some(id)));
        match super::framed::schema_id(&bytes, "value", true) {
            Ok(Some(id)) => prop_assert_eq!(id.to_be_bytes().to_vec(), bytes[1..5].to_vec()),
            Ok(None) => prop_assert!(false, "a required frame is never absent"),
            Err(r) => prop_assert!(named(&r)),
        }
        // On a plain-JSON pipeline a frame is quarantined by name, whatever follows it.
        decodes_or_names(json_pipeline(), None, Some(&frame(id, &body)))?;
    }

    /// A kcat line gives back its coordinates, timestamp, key and payload; a mutated line is a record or an
    /// error naming the line — never a panic.
    #[test]
    fn kcat_lines_round_trip_and_mutations_are_named(
        partition in 0i32..1000,
        offset in 0i64..i64::MAX,
        ts in prop::option::of(0i64..4_102_444_800_000),
        key in prop::option::of("[^\u{0}]{0,20}"),
        e in event(),
        ms in mutations(),
    ) {
        let p = json_pipeline();
        let payload = String::from_utf8(e.json()).expect("utf-8");
        let line = kcat_line(partition, offset, ts, key.as_deref(), Some(&payload));
        let r = crate::source::kcat::parse_line(p, &line, "f:1").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&r.tp, &("t".to_string(), partition));
        prop_assert_eq!(r.offset, offset);
        prop_assert_eq!(r.timestamp_ms, ts);
        prop_assert_eq!(r.key, key.map(String::into_bytes));
        prop_assert_eq!(r.value, Some(payload.into_bytes()));
        prop_assert!(matches!(r.decided, Some(crate::model::Pending::Claim { .. })), "{:?}", r.decided);
        let mutated = String::from_utf8_lossy(&mutate(line.as_bytes(), &ms)).into_owned();
        match crate::source::kcat::parse_line(p, &mutated, "f:1") {
            Ok(r) => prop_assert!(r.decided.is_some()),
            Err(e) => prop_assert!(e.to_string().starts_with("f:1"), "{}", e),
        }
    }
}
