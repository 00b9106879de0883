//! Avro binary (a schema-registry frame's body) → the JSON the rest of the decoder reads.
//!
//! Debezium pipelines get exactly what Kafka Connect's `JsonConverter` with `schemas.enable=true` writes:
//! `{"schema": <Connect schema>, "payload": <value>}`, the Connect schema rebuilt from the Avro schema's
//! `connect.name` / `connect.parameters` / `connect.version` properties (written by the Avro converters, Confluent
//! and Apicurio `AvroData`) and Avro's logical types (`decimal` → `org.apache.kafka.connect.data.Decimal` with
//! its `scale`, `date`, `time-millis`, `timestamp-millis`), bytes as base64 — so Debezium's logical types
//! (Decimal, VariableScaleDecimal, MicroTimestamp, ZonedTimestamp, Json, Uuid, …) reach
//! [`crate::projection::row::convert`] as they do from the JSON converter. JSON-event pipelines get the bare value with
//! the logical types as text (`decimal` → `"12.50"`, `date` → `"2024-04-25"`, timestamps → RFC 3339).
//!
//! Avro specification 1.12, "Binary Encoding", "Logical Types"; Kafka Connect `JsonConverter` (schema JSON:
//! `type`, `optional`, `name`, `version`, `parameters`, `fields[].field`, `items`, `keys`, `values`).

use std::collections::HashMap;

use apache_avro::types::Value as Avro;
use base64::Engine;
use bigdecimal::BigDecimal;
use num_bigint::BigInt;
use serde_json::{json, Map, Value};

/// An Avro schema's JSON texts, parsed (its references' first, then its own), with the Kafka Connect schema
/// (JsonConverter form) derived from them once: deriving it took most of a record's decode time when it was
/// done per record.
#[derive(Debug)]
pub struct SchemaJson {
    texts: Vec<Value>,
    connect: Value,
    connect_text: String,
}

impl SchemaJson {
    /// The texts (references first, the schema last) and their Connect schema.
    pub fn new(texts: Vec<Value>) -> SchemaJson {
        let mut names = HashMap::new();
        let connect = match texts.split_last() {
            Some((main, deps)) => {
                for d in deps {
                    connect_schema(d, "", &mut names);
                }
                connect_schema(main, "", &mut names)
            }
            None => Value::Null,
        };
        let connect_text = connect.to_string();
        SchemaJson {
            texts,
            connect,
            connect_text,
        }
    }
}

/// Decodes one Avro datum written with `schema` (`refs` the schemas it references; `json` the JSON texts,
/// parsed, of the references then the schema) into JSON bytes: the Connect `{"schema": …, "payload": …}` form
/// (schema first, as the JSON converter writes it) when `connect` is true (Debezium), the bare value otherwise.
///
/// # Errors
/// What is wrong with the datum: it does not match the schema, is truncated, has bytes left over, or holds a
/// value JSON cannot carry (an Avro `duration`).
pub fn to_json(
    schema: &apache_avro::Schema,
    refs: &[apache_avro::Schema],
    json: &SchemaJson,
    datum: &[u8],
    connect: bool,
) -> Result<Vec<u8>, String> {
    let mut rest = Strict(datum);
    let value = if refs.is_empty() {
        apache_avro::from_avro_datum(schema, &mut rest, None)
    } else {
        let names: Vec<&apache_avro::Schema> = refs.iter().chain([schema]).collect();
        apache_avro::from_avro_datum_schemata(schema, names, &mut rest, None)
    }
    .map_err(|e| format!("the Avro data does not match its schema: {e}"))?;
    // With references, apache-avro's validate_schemata panics on an order it cannot resolve: the decode
    // against the resolved names (and the strict reader) is the check then.
    if refs.is_empty() && !value.validate(schema) {
        return Err("the Avro data does not match its schema".into());
    }
    if !rest.0.is_empty() {
        return Err(format!(
            "{} bytes are left after the Avro datum (a frame holds one datum)",
            rest.0.len()
        ));
    }
    if json.texts.is_empty() {
        return Err("no schema".into());
    }
    let payload = payload(&value, Some(&json.connect), connect)?;
    if !connect {
        return serde_json::to_vec(&payload).map_err(|e| e.to_string());
    }
    let mut out = Vec::with_capacity(json.connect_text.len() + datum.len() * 2 + 32);
    out.extend_from_slice(b"{\"schema\":");
    out.extend_from_slice(json.connect_text.as_bytes());
    out.extend_from_slice(b",\"payload\":");
    serde_json::to_writer(&mut out, &payload).map_err(|e| e.to_string())?;
    out.push(b'}');
    Ok(out)
}

/// A reader over the datum whose end is an error, not an end of file: apache-avro reads a string, or a union,
/// cut short by the end of the data as null (its `UnexpectedEof` special cases), which would turn a truncated
/// frame into a record of nulls.
struct Strict<'a>(&'a [u8]);

impl std::io::Read for Strict<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() && !buf.is_empty() {
            return Err(std::io::Error::other(
                "truncated: the data ends inside the Avro datum",
            ));
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

fn full_name(o: &Map<String, Value>, ns: &str) -> (String, String) {
    let name = o.get("name").and_then(Value::as_str).unwrap_or("");
    let ns = o.get("namespace").and_then(Value::as_str).unwrap_or(ns);
    if name.contains('.') || ns.is_empty() {
        let ns = name.rsplit_once('.').map_or(ns, |(n, _)| n);
        (name.to_string(), ns.to_string())
    } else {
        (format!("{ns}.{name}"), ns.to_string())
    }
}

/// The Kafka Connect schema (JsonConverter form) of an Avro schema; `names` collects named types for later
/// references by name.
pub fn connect_schema(s: &Value, ns: &str, names: &mut HashMap<String, Value>) -> Value {
    match s {
        Value::String(t) => match primitive(t, &Map::new()) {
            Some(p) => p,
            None => names
                .get(t.as_str())
                .or_else(|| names.get(&format!("{ns}.{t}")))
                .cloned()
                .unwrap_or_else(|| json!({"type": "string", "optional": false})),
        },
        Value::Array(members) => {
            let nullable = members.iter().any(|m| m.as_str() == Some("null"));
            let first = members.iter().find(|m| m.as_str() != Some("null"));
            let mut c = first.map_or(json!({"type": "string"}), |m| connect_schema(m, ns, names));
            c["optional"] = Value::Bool(nullable);
            c
        }
        Value::Object(o) => object(o, ns, names),
        _ => json!({"type": "string", "optional": false}),
    }
}

fn object(o: &Map<String, Value>, ns: &str, names: &mut HashMap<String, Value>) -> Value {
    let t = o.get("type").cloned().unwrap_or(Value::Null);
    let named = |c: Value, names: &mut HashMap<String, Value>| {
        let (full, _) = full_name(o, ns);
        names.insert(full, c.clone());
        c
    };
    match t.as_str() {
        Some("record") | Some("error") => {
            let (full, inner) = full_name(o, ns);
            let fields = o
                .get("fields")
                .and_then(Value::as_array)
                .map(|fs| {
                    fs.iter()
                        .map(|f| {
                            let mut c = connect_schema(
                                f.get("type").unwrap_or(&Value::Null),
                                &inner,
                                names,
                            );
                            c["field"] = f.get("name").cloned().unwrap_or(Value::Null);
                            c
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let mut c = json!({"type": "struct", "optional": false, "fields": fields});
            c["name"] = o
                .get("connect.name")
                .cloned()
                .unwrap_or(Value::String(full));
            props(&mut c, o);
            named(c, names)
        }
        Some("enum") => named(json!({"type": "string", "optional": false}), names),
        Some("fixed") => {
            let c = primitive("bytes", o).expect("bytes is an Avro primitive");
            named(c, names)
        }
        Some("array") => {
            let items = connect_schema(o.get("items").unwrap_or(&Value::Null), ns, names);
            json!({"type": "array", "optional": false, "items": items})
        }
        Some("map") => {
            let values = connect_schema(o.get("values").unwrap_or(&Value::Null), ns, names);
            json!({"type": "map", "optional": false, "keys": {"type": "string", "optional": false}, "values": values})
        }
        Some(p) => primitive(p, o).unwrap_or_else(|| connect_schema(&t, ns, names)),
        None => connect_schema(&t, ns, names),
    }
}

fn primitive(t: &str, o: &Map<String, Value>) -> Option<Value> {
    let connect_type = o.get("connect.type").and_then(Value::as_str);
    let ty = match t {
        "int" => connect_type
            .filter(|c| matches!(*c, "int8" | "int16"))
            .unwrap_or("int32"),
        "long" => "int64",
        "float" => "float32",
        "double" => "float64",
        "boolean" => "boolean",
        "string" => "string",
        "bytes" => "bytes",
        "null" => "string",
        _ => return None,
    };
    let logical = o.get("logicalType").and_then(Value::as_str);
    let (ty, name) = logical_type(ty, logical);
    let mut c = json!({"type": ty, "optional": false});
    if let Some(n) = o.get("connect.name").cloned().or(name.map(|n| json!(n))) {
        c["name"] = n;
    }
    props(&mut c, o);
    if logical == Some("decimal") && c["parameters"].get("scale").is_none() {
        let scale = o.get("scale").and_then(Value::as_i64).unwrap_or(0);
        if !c["parameters"].is_object() {
            c["parameters"] = json!({});
        }
        c["parameters"]["scale"] = Value::String(scale.to_string());
    }
    Some(c)
}

/// The Connect type and semantic name that carry an Avro logical type (Avro specification 1.12, "Logical
/// Types") the way Kafka Connect and Debezium name it, so its unit travels with the value
/// ([`crate::projection::row::convert`] reads the unit from the name, never from the projection column's type):
/// `date` days, `time-millis`/`time-micros` since midnight, `timestamp-*` and `local-timestamp-*` in ms/µs/ns
/// since the epoch (a local timestamp is a wall-clock time, Debezium's `Timestamp`/`MicroTimestamp`/
/// `NanoTimestamp`), `decimal` the unscaled bytes, `big-decimal` and `duration` as text (a decimal string, an ISO
/// 8601 duration). Other types keep their primitive type and have no name (`uuid` is a string).
fn logical_type<'a>(ty: &'a str, logical: Option<&str>) -> (&'a str, Option<&'static str>) {
    let name = match logical {
        Some("decimal") => "org.apache.kafka.connect.data.Decimal",
        Some("date") => "org.apache.kafka.connect.data.Date",
        Some("time-millis") => "org.apache.kafka.connect.data.Time",
        Some("time-micros") => "io.debezium.time.MicroTime",
        Some("timestamp-millis") => "org.apache.kafka.connect.data.Timestamp",
        Some("timestamp-micros" | "local-timestamp-micros") => "io.debezium.time.MicroTimestamp",
        Some("timestamp-nanos" | "local-timestamp-nanos") => "io.debezium.time.NanoTimestamp",
        Some("local-timestamp-millis") => "io.debezium.time.Timestamp",
        Some("duration") => return ("string", Some("io.debezium.time.Interval")),
        Some("big-decimal") => return ("string", None),
        _ => return (ty, None),
    };
    (ty, Some(name))
}

fn props(c: &mut Value, o: &Map<String, Value>) {
    if let Some(p) = o.get("connect.parameters").filter(|p| p.is_object()) {
        c["parameters"] = p.clone();
    }
    if let Some(v) = o.get("connect.version") {
        c["version"] = v.clone();
    }
}

fn b64(b: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

pub(super) fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
}

fn scale(cs: Option<&Value>) -> i64 {
    cs.and_then(|c| c.get("parameters"))
        .and_then(|p| p.get("scale"))
        .and_then(|s| s.as_str().and_then(|s| s.parse().ok()).or(s.as_i64()))
        .unwrap_or(0)
}

pub(super) fn rfc3339(secs: i64, nanos: u32) -> Result<Value, String> {
    chrono::DateTime::from_timestamp(secs, nanos)
        .map(|t| Value::String(super::day::rfc3339(t)))
        .ok_or_else(|| format!("timestamp {secs} s is out of range"))
}

/// An Avro `time-millis`/`time-micros` as JSON-event text (`HH:MM:SS[.ffffff]`, `24:00:00` for a whole day).
///
/// # Errors
/// A value below 0 or above 24 hours, named with its unit.
pub(super) fn time_of_day(micros: i64) -> Result<Value, String> {
    const DAY: i64 = 86_400_000_000;
    if micros == DAY {
        return Ok(Value::String("24:00:00".into()));
    }
    if !(0..DAY).contains(&micros) {
        return Err(format!(
            "time {micros} µs since midnight is out of range (00:00:00 to 24:00:00)"
        ));
    }
    let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(
        u32::try_from(micros / 1_000_000).expect("below 86 400, checked above"),
        u32::try_from(micros % 1_000_000 * 1_000).expect("below 10^9"),
    )
    .ok_or_else(|| format!("time {micros} µs since midnight is out of range"))?;
    Ok(Value::String(super::day::time_text(t)))
}

/// An Avro `duration` (months, days, milliseconds; Avro specification 1.12) as an ISO 8601 duration
/// (`P1M2DT0.003S`), which PostgreSQL's `interval` reads.
fn iso_duration(months: u32, days: u32, millis: u32) -> String {
    format!(
        "P{months}M{days}DT{}.{:03}S",
        millis / 1_000,
        millis % 1_000
    )
}

/// The JSON of one Avro value; `cs` its Connect schema (for a decimal's scale and the fields of records).
fn payload(v: &Avro, cs: Option<&Value>, connect: bool) -> Result<Value, String> {
    let field_schema = |name: &str| {
        cs.and_then(|c| c.get("fields"))
            .and_then(Value::as_array)
            .and_then(|fs| {
                fs.iter()
                    .find(|f| f.get("field").and_then(Value::as_str) == Some(name))
            })
    };
    Ok(match v {
        Avro::Null => Value::Null,
        Avro::Boolean(b) => Value::Bool(*b),
        Avro::Int(i) => json!(i),
        Avro::Long(i) => json!(i),
        Avro::Float(f) => float(f64::from(*f)),
        Avro::Double(f) => float(*f),
        Avro::Bytes(b) | Avro::Fixed(_, b) => b64(b),
        Avro::String(s) | Avro::Enum(_, s) => Value::String(s.clone()),
        Avro::Union(_, inner) => payload(inner, cs, connect)?,
        Avro::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| payload(i, cs.and_then(|c| c.get("items")), connect))
                .collect::<Result<_, _>>()?,
        ),
        Avro::Map(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(
                    k.clone(),
                    payload(&m[k], cs.and_then(|c| c.get("values")), connect)?,
                );
            }
            Value::Object(out)
        }
        Avro::Record(fields) => {
            let mut out = Map::new();
            for (name, fv) in fields {
                out.insert(name.clone(), payload(fv, field_schema(name), connect)?);
            }
            Value::Object(out)
        }
        Avro::Decimal(d) => {
            let bytes: Vec<u8> = d.try_into().map_err(|e| format!("decimal: {e}"))?;
            if connect {
                b64(&bytes)
            } else {
                let n = BigDecimal::new(BigInt::from_signed_bytes_be(&bytes), scale(cs));
                Value::String(n.to_string())
            }
        }
        Avro::BigDecimal(d) => Value::String(d.to_string()),
        Avro::Date(d) if connect => json!(d),
        Avro::Date(d) => {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid calendar date");
            let day = epoch
                .checked_add_signed(chrono::Duration::days(i64::from(*d)))
                .ok_or_else(|| format!("date {d} days is out of range"))?;
            Value::String(super::day::text(day))
        }
        Avro::TimeMillis(t) if connect => json!(t),
        Avro::TimeMicros(t) if connect => json!(t),
        Avro::TimeMillis(t) => time_of_day(i64::from(*t) * 1_000)?,
        Avro::TimeMicros(t) => time_of_day(*t)?,
        Avro::TimestampMillis(t) | Avro::LocalTimestampMillis(t) if connect => json!(t),
        Avro::TimestampMicros(t) | Avro::LocalTimestampMicros(t) if connect => json!(t),
        Avro::TimestampNanos(t) | Avro::LocalTimestampNanos(t) if connect => json!(t),
        Avro::TimestampMillis(t) | Avro::LocalTimestampMillis(t) => rfc3339(
            t.div_euclid(1_000),
            u32::try_from(t.rem_euclid(1_000) * 1_000_000).expect("below 10^9"),
        )?,
        Avro::TimestampMicros(t) | Avro::LocalTimestampMicros(t) => rfc3339(
            t.div_euclid(1_000_000),
            u32::try_from(t.rem_euclid(1_000_000) * 1_000).expect("below 10^9"),
        )?,
        Avro::TimestampNanos(t) | Avro::LocalTimestampNanos(t) => rfc3339(
            t.div_euclid(1_000_000_000),
            u32::try_from(t.rem_euclid(1_000_000_000)).expect("below 10^9"),
        )?,
        Avro::Uuid(u) => Value::String(u.hyphenated().to_string()),
        Avro::Duration(d) => Value::String(iso_duration(
            u32::from(d.months()),
            u32::from(d.days()),
            u32::from(d.millis()),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(schema: &str, v: Avro) -> (apache_avro::Schema, Value, Vec<u8>) {
        let s = apache_avro::Schema::parse_str(schema).expect("schema");
        let bytes = apache_avro::to_avro_datum(&s, v).expect("encode");
        (s, serde_json::from_str(schema).expect("json"), bytes)
    }

    #[test]
    fn debezium_logical_types_become_the_json_converters_schema_and_payload() {
        let schema = r#"{"type":"record","name":"Value","namespace":"pg.public.t","fields":[
            {"name":"id","type":"int"},
            {"name":"amount","type":["null",{"type":"bytes","scale":2,"precision":10,"connect.version":1,
              "connect.parameters":{"scale":"2","connect.decimal.precision":"10"},
              "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
            {"name":"at","type":{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}}]}"#;
        let d = apache_avro::Decimal::from(vec![0x04, 0xE2]); // 1250
        let v = Avro::Record(vec![
            ("id".into(), Avro::Int(7)),
            ("amount".into(), Avro::Union(1, Box::new(Avro::Decimal(d)))),
            ("at".into(), Avro::Long(1_714_003_200_000_000)),
        ]);
        let (s, j, bytes) = encode(schema, v);
        let text = to_json(&s, &[], &SchemaJson::new(vec![j.clone()]), &bytes, true).expect("ok");
        // Schema first, as the JSON converter writes it: the Debezium decoder's schema cache reads that form.
        assert!(
            text.starts_with(br#"{"schema":{"#),
            "{}",
            String::from_utf8_lossy(&text)
        );
        let (_, parsed) = crate::decode::debezium::schema::parse(&text).expect("parses");
        assert!(parsed.is_some(), "the wrapper's schema is read");
        let out: Value = serde_json::from_slice(&text).expect("json");
        assert_eq!(
            out["payload"],
            json!({"id": 7, "amount": "BOI=", "at": 1_714_003_200_000_000i64})
        );
        let f = &out["schema"]["fields"];
        assert_eq!(out["schema"]["name"], "pg.public.t.Value");
        assert_eq!(f[1]["name"], "org.apache.kafka.connect.data.Decimal");
        assert_eq!(f[1]["parameters"]["scale"], "2");
        assert_eq!(f[1]["optional"], true);
        assert_eq!(f[2]["name"], "io.debezium.time.MicroTimestamp");
        assert_eq!(f[2]["type"], "int64");

        let bare: Value = serde_json::from_slice(
            &to_json(&s, &[], &SchemaJson::new(vec![j.clone()]), &bytes, false).expect("ok"),
        )
        .expect("json");
        assert_eq!(bare["amount"], "12.50");
    }

    /// Issue 34 item 4: the Avro logical type decides the unit, never the projection column's precision — one
    /// instant 2023-11-14 22:13:20.123456 UTC as `timestamp-millis`, `-micros`, `-nanos` and their `local-`
    /// forms lands as the same text in `timestamp(3)`, `timestamp(6)` and `timestamptz` columns; `time-millis`
    /// and `time-micros` (24:00:00 included), `date` (year 1, 9999 and BC), `duration` and `big-decimal` too;
    /// `new-columns = "add"` types them from the name (`timestamp`, `time`, `date`, `interval`), not `bigint`.
    #[test]
    fn logical_types_carry_their_unit_to_the_column() {
        use crate::decode::debezium::Cell;
        use crate::ident::Ident;
        use crate::projection::row::convert::{to_pg, Pg};
        use crate::projection::row::types::{ColumnSpec, SqlType};
        let micros: i64 = 1_700_000_000_123_456;
        let cases: Vec<(&str, &str, Avro, &str, &str)> = vec![
            (
                "long",
                "timestamp-millis",
                Avro::TimestampMillis(micros / 1_000),
                "timestamp(3)",
                "2023-11-14 22:13:20.123",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(micros),
                "timestamp(3)",
                "2023-11-14 22:13:20.123456",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(micros),
                "timestamp(6)",
                "2023-11-14 22:13:20.123456",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(micros),
                "timestamptz",
                "2023-11-14 22:13:20.123456",
            ),
            (
                "long",
                "timestamp-nanos",
                Avro::TimestampNanos(micros * 1_000 + 789),
                "timestamp(6)",
                "2023-11-14 22:13:20.123456789",
            ),
            (
                "long",
                "local-timestamp-millis",
                Avro::LocalTimestampMillis(micros / 1_000),
                "timestamp(6)",
                "2023-11-14 22:13:20.123",
            ),
            (
                "long",
                "local-timestamp-micros",
                Avro::LocalTimestampMicros(micros),
                "timestamp(3)",
                "2023-11-14 22:13:20.123456",
            ),
            (
                "long",
                "local-timestamp-nanos",
                Avro::LocalTimestampNanos(micros * 1_000),
                "timestamp",
                "2023-11-14 22:13:20.123456",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(-62_135_596_800_000_000),
                "timestamp(3)",
                "0001-01-01 00:00:00",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(-62_167_219_200_000_000),
                "timestamp",
                "0001-01-01 00:00:00 BC",
            ),
            (
                "long",
                "timestamp-micros",
                Avro::TimestampMicros(253_402_300_799_999_999),
                "timestamp(6)",
                "9999-12-31 23:59:59.999999",
            ),
            (
                "int",
                "time-millis",
                Avro::TimeMillis(45_296_789),
                "time(6)",
                "12:34:56.789",
            ),
            (
                "long",
                "time-micros",
                Avro::TimeMicros(45_296_789_012),
                "time(3)",
                "12:34:56.789012",
            ),
            (
                "long",
                "time-micros",
                Avro::TimeMicros(86_400_000_000),
                "time",
                "24:00:00",
            ),
            ("int", "date", Avro::Date(2_932_896), "date", "9999-12-31"),
            ("int", "date", Avro::Date(-719_162), "date", "0001-01-01"),
            ("int", "date", Avro::Date(-719_163), "date", "0001-12-31 BC"),
        ];
        for (prim, logical, v, col_ty, want) in cases {
            let schema = format!(
                r#"{{"type":"record","name":"R","fields":[{{"name":"v","type":{{"type":"{prim}","logicalType":"{logical}"}}}}]}}"#
            );
            let (s, j, bytes) = encode(&schema, Avro::Record(vec![("v".into(), v)]));
            let out: Value = serde_json::from_slice(
                &to_json(&s, &[], &SchemaJson::new(vec![j]), &bytes, true).expect("decodes"),
            )
            .unwrap();
            let cell = Cell {
                value: out["payload"]["v"].clone(),
                schema: Some(std::sync::Arc::new(out["schema"]["fields"][0].clone())),
            };
            let col = ColumnSpec {
                name: Ident::new("v").unwrap(),
                ty: SqlType::parse(col_ty).unwrap(),
                unit: None,
                field: None,
            };
            assert_eq!(
                to_pg(&cell, &col, crate::config::DecimalHandling::Auto),
                Ok(Pg::Text(want.into())),
                "{logical} into {col_ty}"
            );
            let added = crate::projection::row::evolve::pg_type(&cell);
            assert!(
                matches!(added, Some("timestamp" | "time" | "date")),
                "{logical}: new-columns = \"add\" makes it {added:?}"
            );
        }
        // duration and big-decimal: text the column reads.
        let schema = r#"{"type":"record","name":"R","fields":[
            {"name":"d","type":{"type":"fixed","name":"D","size":12,"logicalType":"duration"}},
            {"name":"b","type":{"type":"bytes","logicalType":"big-decimal"}}]}"#;
        let d = apache_avro::Duration::new(
            apache_avro::Months::new(14),
            apache_avro::Days::new(3),
            apache_avro::Millis::new(4_005),
        );
        let big: bigdecimal::BigDecimal = "12345678901234567890.125".parse().unwrap();
        let (s, j, bytes) = encode(
            schema,
            Avro::Record(vec![
                ("d".into(), Avro::Duration(d)),
                ("b".into(), Avro::BigDecimal(big)),
            ]),
        );
        for connect in [true, false] {
            let out: Value = serde_json::from_slice(
                &to_json(&s, &[], &SchemaJson::new(vec![j.clone()]), &bytes, connect)
                    .expect("decodes"),
            )
            .unwrap();
            let p = if connect { &out["payload"] } else { &out };
            assert_eq!(p["d"], "P14M3DT4.005S");
            assert_eq!(p["b"], "12345678901234567890.125");
            if connect {
                assert_eq!(
                    out["schema"]["fields"][0]["name"],
                    "io.debezium.time.Interval"
                );
                assert_eq!(out["schema"]["fields"][1]["type"], "string");
            }
        }
    }

    /// JSON events: Avro times as text (`HH:MM:SS[.f]`), timestamps as RFC 3339 — PostgreSQL's form outside
    /// years 1–9999, never chrono's `+10000`.
    #[test]
    fn json_event_temporal_text() {
        let schema = r#"{"type":"record","name":"R","fields":[
            {"name":"t","type":{"type":"long","logicalType":"time-micros"}},
            {"name":"m","type":{"type":"int","logicalType":"time-millis"}},
            {"name":"ts","type":{"type":"long","logicalType":"timestamp-micros"}},
            {"name":"far","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;
        let (s, j, bytes) = encode(
            schema,
            Avro::Record(vec![
                ("t".into(), Avro::TimeMicros(86_400_000_000)),
                ("m".into(), Avro::TimeMillis(45_296_500)),
                ("ts".into(), Avro::TimestampMicros(1_700_000_000_123_456)),
                ("far".into(), Avro::TimestampMillis(253_402_300_800_000)),
            ]),
        );
        let out: Value = serde_json::from_slice(
            &to_json(&s, &[], &SchemaJson::new(vec![j]), &bytes, false).expect("decodes"),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"t": "24:00:00", "m": "12:34:56.5", "ts": "2023-11-14T22:13:20.123456Z",
                   "far": "10000-01-01 00:00:00+00"})
        );
    }

    #[test]
    fn truncated_or_trailing_data_is_refused() {
        let (s, j, bytes) = encode(
            r#"{"type":"record","name":"E","fields":[{"name":"a","type":"string"}]}"#,
            Avro::Record(vec![("a".into(), Avro::String("hello".into()))]),
        );
        for cut in 0..bytes.len() {
            let e = to_json(
                &s,
                &[],
                &SchemaJson::new(vec![j.clone()]),
                &bytes[..cut],
                false,
            )
            .expect_err("truncated");
            assert!(e.contains("does not match its schema"), "{e}");
        }
        let opt = r#"{"type":"record","name":"O","fields":[{"name":"a","type":"long"},{"name":"b","type":["null","long"]}]}"#;
        let (s2, j2, b2) = encode(
            opt,
            Avro::Record(vec![
                ("a".into(), Avro::Long(1)),
                ("b".into(), Avro::Union(1, Box::new(Avro::Long(5)))),
            ]),
        );
        for cut in 0..b2.len() {
            let e = to_json(
                &s2,
                &[],
                &SchemaJson::new(vec![j2.clone()]),
                &b2[..cut],
                false,
            )
            .expect_err("a union cut short is not a null");
            assert!(
                e.contains("truncated") || e.contains("does not match"),
                "{cut}: {e}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        let e = to_json(&s, &[], &SchemaJson::new(vec![j.clone()]), &long, false)
            .expect_err("trailing");
        assert!(e.contains("1 bytes are left"), "{e}");
    }

    #[test]
    fn schema_references_resolve() {
        let source = r#"{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[{"name":"lsn","type":"long"}]}"#;
        let env = r#"{"type":"record","name":"Envelope","namespace":"pg.public.t","fields":[
            {"name":"before","type":["null",{"type":"record","name":"Value","fields":[{"name":"id","type":"int"}]}],"default":null},
            {"name":"after","type":["null","Value"],"default":null},
            {"name":"source","type":"io.debezium.connector.postgresql.Source"}]}"#;
        let (s, refs) = apache_avro::Schema::parse_str_with_list(env, [source]).expect("parses");
        let v = Avro::Record(vec![
            ("before".into(), Avro::Union(0, Box::new(Avro::Null))),
            (
                "after".into(),
                Avro::Union(1, Box::new(Avro::Record(vec![("id".into(), Avro::Int(3))]))),
            ),
            (
                "source".into(),
                Avro::Record(vec![("lsn".into(), Avro::Long(42))]),
            ),
        ]);
        let names: Vec<&apache_avro::Schema> = refs.iter().chain([&s]).collect();
        let bytes = apache_avro::to_avro_datum_schemata(&s, names, v).expect("encodes");
        let json: Vec<Value> = [source, env]
            .iter()
            .map(|t| serde_json::from_str(t).unwrap())
            .collect();
        let out: Value = serde_json::from_slice(
            &to_json(&s, &refs, &SchemaJson::new(json), &bytes, true).expect("decodes"),
        )
        .unwrap();
        assert_eq!(out["payload"]["after"]["id"], 3);
        assert_eq!(out["payload"]["source"]["lsn"], 42);
        assert_eq!(
            out["schema"]["fields"][2]["name"],
            "io.debezium.connector.postgresql.Source"
        );
        assert_eq!(out["schema"]["fields"][1]["name"], "pg.public.t.Value");
    }

    #[test]
    fn named_types_are_resolved_by_reference() {
        let schema = r#"{"type":"record","name":"Envelope","namespace":"pg.public.t","fields":[
            {"name":"before","type":["null",{"type":"record","name":"Value","fields":[{"name":"id","type":"int"}]}],"default":null},
            {"name":"after","type":["null","Value"],"default":null}]}"#;
        let mut names = HashMap::new();
        let c = connect_schema(&serde_json::from_str(schema).expect("json"), "", &mut names);
        assert_eq!(c["fields"][1]["name"], "pg.public.t.Value");
        assert_eq!(c["fields"][1]["fields"][0]["field"], "id");
        assert_eq!(c["fields"][1]["optional"], true);
    }
}
