//! Issue 34, item 4: the same temporal values through the four encodings a Debezium pipeline accepts —
//! schemaless JSON (units from the column types, Debezium's `time.precision.mode=adaptive`), JSON with schema
//! (Connect names; µs into a `timestamp(3)` column), Avro through the real schema registry (Avro logical types
//! only: `timestamp-micros` into `timestamp(3)`, `local-timestamp-micros`, `date`, `time-micros`, `duration`)
//! and JSON Schema (registry-framed schemaless JSON) — store identical rows in `timestamp(3)`, `timestamp(6)`,
//! `timestamptz`, `date`, `time(6)` and `interval` columns: microseconds, year 1, 9999-12-31, a `timestamptz`
//! of 9999-12-31 23:59:59.999999-05 (year 10000 in UTC), BC, 24:00:00, infinity and -infinity. A day before
//! PostgreSQL's first is quarantined, the reason naming the column and the value as it arrived; so is an
//! impossible timestamp string (JSON encodings), naming the column, its type and the value.

use apache_avro::types::Value as A;
use serde_json::{json, Value};

use crate::common::*;
use crate::registry::{dead_letters, frame, register, registry_url};

/// One entity's values: µs since the epoch (or Debezium's infinity sentinels) of the three timestamp columns,
/// days of the date, µs since midnight of the time, ms of the interval; `tz` as Debezium's ZonedTimestamp
/// string.
struct Values {
    id: i64,
    ts: i64,
    tz: &'static str,
    tz_us: i64,
    d: i32,
    tm: i64,
    iv_ms: u32,
}

const INF: i64 = 9_223_372_036_825_200_000;
const NEG_INF: i64 = -9_223_372_036_832_400_000;

fn values() -> Vec<Values> {
    let v = |id, ts, tz, tz_us, d, tm, iv_ms| Values {
        id,
        ts,
        tz,
        tz_us,
        d,
        tm,
        iv_ms,
    };
    vec![
        v(
            1,
            1_700_000_000_123_456,
            "2023-11-14T22:13:20.123456Z",
            1_700_000_000_123_456,
            19_675,
            45_296_789_012,
            7_384_005,
        ),
        v(
            2,
            -62_135_596_800_000_000,
            "0001-01-01T00:00:00Z",
            -62_135_596_800_000_000,
            -719_162,
            0,
            0,
        ),
        v(
            3,
            253_402_300_799_999_000,
            "+10000-01-01T04:59:59.999999Z",
            253_402_318_799_999_999,
            2_932_896,
            86_400_000_000,
            86_399_999,
        ),
        v(
            4,
            -63_517_780_800_000_000,
            "-0043-03-15T12:00:00Z",
            -63_517_780_800_000_000,
            -735_160,
            1,
            1,
        ),
        v(
            5,
            INF,
            "infinity",
            INF,
            -2_147_472_692,
            43_200_000_000,
            1_000,
        ),
        v(
            6,
            NEG_INF,
            "-infinity",
            NEG_INF,
            -2_147_472_691,
            43_200_000_000,
            1_000,
        ),
        // A day before 4714-11-24 BC: no PostgreSQL date.
        v(7, 0, "1970-01-01T00:00:00Z", 0, -2_440_589, 0, 0),
    ]
}

/// The rows every encoding must store (ids 1–6).
const EXPECTED: &[&str] = &[
    r#"(1,"2023-11-14 22:13:20.123","2023-11-14 22:13:20.123456","2023-11-14 22:13:20.123456+00",2023-11-14,12:34:56.789012,02:03:04.005)"#,
    r#"(2,"0001-01-01 00:00:00","0001-01-01 00:00:00","0001-01-01 00:00:00+00",0001-01-01,00:00:00,00:00:00)"#,
    r#"(3,"9999-12-31 23:59:59.999","9999-12-31 23:59:59.999","10000-01-01 04:59:59.999999+00",9999-12-31,24:00:00,23:59:59.999)"#,
    r#"(4,"0044-03-15 12:00:00 BC","0044-03-15 12:00:00 BC","0044-03-15 12:00:00+00 BC","0044-03-15 BC",00:00:00.000001,00:00:00.001)"#,
    r#"(5,infinity,infinity,infinity,infinity,12:00:00,00:00:01)"#,
    r#"(6,-infinity,-infinity,-infinity,-infinity,12:00:00,00:00:01)"#,
];

/// The row as Debezium's JSON converter writes it: schemaless (`schema = false`: `timestamp(3)` in ms, the
/// others in µs — the adaptive mode's units for these columns) or with the Connect schema's names (µs for
/// both timestamps).
fn json_row(v: &Values, schema: bool) -> Value {
    let sentinel = v.ts == INF || v.ts == NEG_INF;
    let t3 = if schema || sentinel {
        v.ts
    } else {
        v.ts / 1_000
    };
    json!({"id": v.id, "t3": t3, "t6": v.ts, "tz": v.tz, "d": v.d, "tm": v.tm, "iv": i64::from(v.iv_ms) * 1_000})
}

fn connect_row_schema(field: &str) -> Value {
    json!({"type": "struct", "optional": true, "field": field, "name": "pg.public.times.Value", "fields": [
        {"field": "id", "type": "int64", "optional": false},
        {"field": "t3", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"},
        {"field": "t6", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"},
        {"field": "tz", "type": "string", "optional": true, "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "d", "type": "int32", "optional": true, "name": "io.debezium.time.Date"},
        {"field": "tm", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTime"},
        {"field": "iv", "type": "int64", "optional": true, "name": "io.debezium.time.MicroDuration"}
    ]})
}

fn lsn(id: i64) -> i64 {
    1_000_000 + id * 100
}

fn json_records(values: &[Values], schema: bool, framed: Option<(u32, u32)>) -> Vec<Rec> {
    let mut out = Vec::new();
    for v in values {
        let mut r = envelope(
            (v.id % 2) as i32,
            "times",
            "c",
            Some(v.id),
            Value::Null,
            json_row(v, schema),
            lsn(v.id),
        );
        if schema {
            let payload: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
            let s = json!({"type": "struct", "optional": false, "name": "pg.public.times.Envelope", "fields": [
                connect_row_schema("before"), connect_row_schema("after"),
                {"field": "op", "type": "string", "optional": false}]});
            r.value = Some(
                json!({"schema": s, "payload": payload})
                    .to_string()
                    .into_bytes(),
            );
        }
        if let Some((key_id, value_id)) = framed {
            r.key = r.key.map(|k| frame(key_id, &k));
            r.value = r.value.map(|b| frame(value_id, &b));
        }
        out.push(r);
    }
    out
}

const AVRO_VALUE: &str = r#"{"type":"record","name":"Envelope","namespace":"pg.public.times","fields":[
 {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
   {"name":"id","type":"long"},
   {"name":"t3","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},
   {"name":"t6","type":["null",{"type":"long","logicalType":"local-timestamp-micros"}],"default":null},
   {"name":"tz","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},
   {"name":"d","type":["null",{"type":"int","logicalType":"date"}],"default":null},
   {"name":"tm","type":["null",{"type":"long","logicalType":"time-micros"}],"default":null},
   {"name":"iv","type":["null",{"type":"fixed","name":"Duration","size":12,"logicalType":"duration"}],"default":null}]}],"default":null},
 {"name":"after","type":["null","Value"],"default":null},
 {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
   {"name":"connector","type":"string"},{"name":"name","type":"string"},{"name":"db","type":"string"},
   {"name":"schema","type":"string"},{"name":"table","type":"string"},{"name":"snapshot","type":"string"},
   {"name":"txId","type":"long"},{"name":"lsn","type":"long"},{"name":"ts_ms","type":"long"},
   {"name":"sequence","type":"string"}]}},
 {"name":"op","type":"string"},
 {"name":"ts_ms","type":"long"}]}"#;

const AVRO_KEY: &str = r#"{"type":"record","name":"Key","namespace":"pg.public.times","fields":[{"name":"id","type":"long"}]}"#;

fn avro_records(values: &[Values], key_id: u32, value_id: u32) -> Vec<Rec> {
    let value_schema = apache_avro::Schema::parse_str(AVRO_VALUE).unwrap();
    let key_schema = apache_avro::Schema::parse_str(AVRO_KEY).unwrap();
    let some = |v: A| A::Union(1, Box::new(v));
    values
        .iter()
        .map(|v| {
            let l = lsn(v.id);
            let after = A::Record(vec![
                ("id".into(), A::Long(v.id)),
                ("t3".into(), some(A::TimestampMicros(v.ts))),
                ("t6".into(), some(A::LocalTimestampMicros(v.ts))),
                ("tz".into(), some(A::TimestampMicros(v.tz_us))),
                ("d".into(), some(A::Date(v.d))),
                ("tm".into(), some(A::TimeMicros(v.tm))),
                (
                    "iv".into(),
                    some(A::Duration(apache_avro::Duration::new(
                        apache_avro::Months::new(0),
                        apache_avro::Days::new(0),
                        apache_avro::Millis::new(v.iv_ms),
                    ))),
                ),
            ]);
            let s = |t: &str| A::String(t.into());
            let source = A::Record(vec![
                ("connector".into(), s("postgresql")),
                ("name".into(), s("pg")),
                ("db".into(), s("app")),
                ("schema".into(), s("public")),
                ("table".into(), s("times")),
                ("snapshot".into(), s("false")),
                ("txId".into(), A::Long(l / 10)),
                ("lsn".into(), A::Long(l)),
                ("ts_ms".into(), A::Long(1_714_003_200_000 + l)),
                ("sequence".into(), s(&format!("[\"{}\",\"{l}\"]", l - 36))),
            ]);
            let value = A::Record(vec![
                ("before".into(), A::Union(0, Box::new(A::Null))),
                ("after".into(), some(after)),
                ("source".into(), source),
                ("op".into(), s("c")),
                ("ts_ms".into(), A::Long(1_714_003_200_000 + l)),
            ]);
            let key = A::Record(vec![("id".into(), A::Long(v.id))]);
            Rec {
                partition: (v.id % 2) as i32,
                key: Some(frame(
                    key_id,
                    &apache_avro::to_avro_datum(&key_schema, key).unwrap(),
                )),
                value: Some(frame(
                    value_id,
                    &apache_avro::to_avro_datum(&value_schema, value).unwrap(),
                )),
                timestamp_ms: None,
            }
        })
        .collect()
}

fn text(source: &str) -> String {
    format!(
        "{DEBEZIUM_HEADER}{source}[batch]\nmax-records = 5000\nlinger-ms = 50\n[[projection]]\nkind = \"row\"\n\
         table = \"times\"\nsource-table = \"public.times\"\nkey = [\"id\"]\ncolumns = {{ id = \"bigint\", \
         t3 = \"timestamp(3)\", t6 = \"timestamp(6)\", tz = \"timestamptz\", d = \"date\", tm = \"time(6)\", \
         iv = \"interval\" }}\n"
    )
}

/// An impossible timestamp string (JSON encodings only: Avro's `timestamp-micros` cannot spell it).
fn impossible(framed: Option<(u32, u32)>) -> Rec {
    // Partition 1, beside id 7: dead letters are told apart by offset.
    let mut r = envelope(
        1,
        "times",
        "c",
        Some(8),
        Value::Null,
        json!({"id": 8, "tz": "2023-02-30T00:00:00Z"}),
        lsn(8),
    );
    if let Some((key_id, value_id)) = framed {
        r.key = r.key.map(|k| frame(key_id, &k));
        r.value = r.value.map(|b| frame(value_id, &b));
    }
    r
}

#[test]
fn temporal_values_store_alike_through_every_encoding() {
    let vals = values();
    let url = registry_url();
    let registry = format!("schema-registry = {{ url = \"{url}\" }}\n");
    for encoding in ["json", "json-with-schema", "avro", "json-schema"] {
        let topic = new_topic("enc", 2);
        let (recs, source) = match encoding {
            "json" => {
                let mut r = json_records(&vals, false, None);
                r.push(impossible(None));
                (r, String::new())
            }
            "json-with-schema" => {
                let mut r = json_records(&vals, true, None);
                r.push(impossible(None));
                (r, String::new())
            }
            "avro" => {
                let k = register(&format!("{topic}-key"), "AVRO", AVRO_KEY);
                let v = register(&format!("{topic}-value"), "AVRO", AVRO_VALUE);
                (
                    avro_records(&vals, k, v),
                    format!("encoding = \"avro\"\n{registry}"),
                )
            }
            _ => {
                let any =
                    r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#;
                let k = register(&format!("{topic}-key"), "JSON", any);
                let v = register(&format!("{topic}-value"), "JSON", any);
                let mut r = json_records(&vals, false, Some((k, v)));
                r.push(impossible(Some((k, v))));
                (r, format!("encoding = \"json-schema\"\n{registry}"))
            }
        };
        let offsets = produce(&topic, &recs);
        let db = Db::fresh("enc");
        let out = run_text(&text(&source), &topic, &unique("g"), &db);
        out.assert_ok();
        let rows =
            db.strings("SELECT row(id, t3, t6, tz, d, tm, iv)::text FROM {s}.times ORDER BY id");
        assert_eq!(rows, EXPECTED, "{encoding}");
        let dl = dead_letters(&db);
        let json_encoding = encoding != "avro";
        assert_eq!(
            dl.len(),
            1 + usize::from(json_encoding),
            "{encoding}: {dl:?}"
        );
        // id 7: the day before PostgreSQL's first, named with the value as it arrived.
        let day = dl
            .iter()
            .find(|d| d.0 == offsets[6])
            .unwrap_or_else(|| panic!("{encoding}: {dl:?}"));
        assert_eq!(day.1, "invalid-field", "{encoding}");
        assert!(
            day.2.contains("column `d`")
                && day
                    .2
                    .contains("-2440589 (days since 1970-01-01) is 4714-11-23 BC"),
            "{encoding}: {}",
            day.2
        );
        if json_encoding {
            let bad = dl
                .iter()
                .find(|d| d.0 == offsets[7])
                .unwrap_or_else(|| panic!("{encoding}: {dl:?}"));
            assert_eq!(bad.1, "invalid-field", "{encoding}");
            assert!(
                bad.2.starts_with(
                    "row projection `times`: column `tz` (timestamptz): the value `2023-02-30T00:00:00Z` cannot be \
                     stored: date/time field value out of range"
                ),
                "{encoding}: {}",
                bad.2
            );
        }
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.quarantined),
            (recs.len() as u64, 6, 1 + u64::from(json_encoding)),
            "{encoding}"
        );
    }
}

/// `new-columns = "add"` over Avro with logical types only (no `connect.name`): the columns are added with the
/// types the logical types name — `timestamp`, `date`, `time`, `interval`, never `bigint` — and hold the values
/// the typed run stores (at full precision: the added `timestamp` keeps µs).
#[test]
fn avro_logical_types_type_the_columns_new_columns_adds() {
    let vals = values();
    let url = registry_url();
    let topic = new_topic("encadd", 2);
    let k = register(&format!("{topic}-key"), "AVRO", AVRO_KEY);
    let v = register(&format!("{topic}-value"), "AVRO", AVRO_VALUE);
    produce(&topic, &avro_records(&vals[..6], k, v));
    let db = Db::fresh("encadd");
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"avro\"\nschema-registry = {{ url = \"{url}\" }}\n[[projection]]\nkind = \"row\"\n\
         table = \"times\"\nsource-table = \"public.times\"\nkey = [\"id\"]\nnew-columns = \"add\"\n\
         columns = {{ id = \"bigint\" }}\n"
    );
    let out = run_text(&text, &topic, &unique("g"), &db);
    out.assert_ok();
    assert_eq!(
        db.strings(&format!(
            "SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = '\"{}\".times'::regclass AND a.attname IN ('t3', 't6', 'tz', 'd', 'tm', 'iv') \
             ORDER BY a.attname",
            db.schema
        )),
        vec![
            "d date",
            "iv interval",
            "t3 timestamp without time zone",
            "t6 timestamp without time zone",
            "tm time without time zone",
            "tz timestamp without time zone",
        ]
    );
    assert_eq!(
        db.strings("SELECT row(id, t3, t6, d, tm, iv)::text FROM {s}.times WHERE id IN (1, 3, 4) ORDER BY id"),
        vec![
            r#"(1,"2023-11-14 22:13:20.123456","2023-11-14 22:13:20.123456",2023-11-14,12:34:56.789012,02:03:04.005)"#,
            r#"(3,"9999-12-31 23:59:59.999","9999-12-31 23:59:59.999",9999-12-31,24:00:00,23:59:59.999)"#,
            r#"(4,"0044-03-15 12:00:00 BC","0044-03-15 12:00:00 BC","0044-03-15 BC",00:00:00.000001,00:00:00.001)"#,
        ]
    );
    assert_eq!(out.tally().landed, 6);
}
