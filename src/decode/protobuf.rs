//! Schema-registry Protobuf (`[source] encoding = "protobuf"`): a frame's body → the JSON the rest of the decoder
//! reads.
//!
//! The body after the 5-byte frame is the message-indexes array, then the Protobuf message (Confluent
//! documentation "Wire format", Protobuf): a zig-zag varint count, then that many zig-zag varint indexes — the
//! first picks a top-level message of the schema's `.proto` file (in declaration order), each next one a message
//! nested in the previous; the single byte `0` (count 0) means `[0]`, the file's first message. The registry
//! serves the schema as `.proto` text and its imports as `references` (`name` = the import path), compiled here by
//! `protox` into descriptors that `prost-reflect` decodes a message with. `google/protobuf/*.proto` (well-known
//! types) and the files Confluent's serializers and `ProtobufConverter` import without registering them
//! (`confluent/meta.proto`, `confluent/type/decimal.proto`, `google/type/date.proto`,
//! `google/type/timeofday.proto`) resolve without a reference.
//!
//! JSON mapping (proto3's JSON mapping where it keeps the fields comparable with Avro's and JSON's): fields by
//! their `.proto` names (not lowerCamelCase), every field present — a field without presence at its default
//! (`0`, `""`, `false`, the first enum value), a field with presence (`optional`, a message, a oneof member) that
//! is not set `null`; 64-bit integers as JSON numbers (not proto3's strings: a version or an amount compares as a
//! number, as from Avro's `long`), `NaN`/`Infinity` as strings, bytes as base64, enums by name (the number when the
//! schema does not name it), map keys as text, sorted. Values as Avro's logical types give them to JSON events:
//! `google.protobuf.Timestamp` → RFC 3339, `confluent.type.Decimal` → its decimal text (`"12.50"`),
//! `google.type.Date` → `"2024-04-25"`, `google.type.TimeOfDay` → `"12:34:56.5"`; the other well-known types by
//! proto3's mapping (wrappers → the value or `null`, `Struct`/`Value` → JSON, `Duration` → `"1.5s"`). Debezium
//! pipelines get the envelope as the JSON converter without schemas writes it (the payload alone), so
//! `decimal-handling` says how `numeric` arrives.

use std::collections::HashMap;

use base64::Engine;
use bigdecimal::BigDecimal;
use num_bigint::BigInt;
use prost_reflect::{
    DynamicMessage, FileDescriptor, MapKey, MessageDescriptor, ReflectMessage, Value as Proto,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use serde_json::{json, Map, Value};

use super::registry::Reference;

/// A registry's Protobuf schema, compiled: its file's descriptor (with the files it imports).
#[derive(Debug)]
pub struct ProtoSchema {
    file: FileDescriptor,
}

/// The files Confluent's Protobuf serializers and `ProtobufConverter` import without registering them as
/// references (their registry knows them; Confluent `ProtobufSchema`'s known dependencies), by import path.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "confluent/meta.proto",
        "syntax = \"proto3\";\npackage confluent;\nimport \"google/protobuf/descriptor.proto\";\n\
         message Meta { string doc = 1; map<string, string> params = 2; repeated string tags = 3; }\n\
         extend google.protobuf.FileOptions { Meta file_meta = 1088; }\n\
         extend google.protobuf.MessageOptions { Meta message_meta = 1088; }\n\
         extend google.protobuf.FieldOptions { Meta field_meta = 1088; }\n\
         extend google.protobuf.EnumOptions { Meta enum_meta = 1088; }\n\
         extend google.protobuf.EnumValueOptions { Meta enum_value_meta = 1088; }\n",
    ),
    (
        "confluent/type/decimal.proto",
        "syntax = \"proto3\";\npackage confluent.type;\n\
         message Decimal { bytes value = 1; uint32 precision = 2; int32 scale = 3; }\n",
    ),
    (
        "google/type/date.proto",
        "syntax = \"proto3\";\npackage google.type;\nmessage Date { int32 year = 1; int32 month = 2; int32 day = 3; }\n",
    ),
    (
        "google/type/timeofday.proto",
        "syntax = \"proto3\";\npackage google.type;\n\
         message TimeOfDay { int32 hours = 1; int32 minutes = 2; int32 seconds = 3; int32 nanos = 4; }\n",
    ),
];

/// `.proto` sources by import path: the registry's references, or the [`BUILT_IN`] files.
struct Sources(HashMap<String, String>);

impl FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(text) => File::from_source(name, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

impl ProtoSchema {
    /// Compiles schema `id`'s `.proto` `text` with the files it imports: `references` (by their `name`, the
    /// import path), then the built-in files and the well-known types.
    ///
    /// # Errors
    /// The compiler's message (a syntax error, an import no reference names, an unknown type), or a file that
    /// declares no message.
    pub fn compile(id: u32, text: &str, references: &[Reference]) -> Result<ProtoSchema, String> {
        let main = format!("replaysafe-schema-{id}.proto");
        let mut refs: HashMap<String, String> = references
            .iter()
            .map(|r| (r.name.clone(), r.text.clone()))
            .collect();
        refs.insert(main.clone(), text.to_string());
        let mut resolver = ChainFileResolver::new();
        resolver.add(Sources(refs));
        resolver.add(Sources(
            BUILT_IN
                .iter()
                .map(|(n, t)| ((*n).to_string(), (*t).to_string()))
                .collect(),
        ));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler
            .open_file(&main)
            .map_err(|e| one_line(&e.to_string()))?;
        let file = compiler
            .descriptor_pool()
            .get_file_by_name(&main)
            .ok_or("the compiled schema is missing")?;
        if file.messages().len() == 0 {
            return Err("the schema declares no message".into());
        }
        Ok(ProtoSchema { file })
    }
}

fn one_line(s: &str) -> String {
    crate::printable::bounded(&s.split_whitespace().collect::<Vec<_>>().join(" "), 300)
}

/// Decodes a frame's body (message indexes, then the message) written with `schema` into JSON bytes (the bare
/// value, see the module's mapping).
///
/// # Errors
/// What is wrong: the message indexes are cut short, negative or name no message of the schema; the message does
/// not decode (truncated, a field of the wrong wire type); a timestamp, date or decimal out of range.
pub fn to_json(schema: &ProtoSchema, body: &[u8]) -> Result<Vec<u8>, String> {
    let (indexes, rest) = message_indexes(body)?;
    let desc = message_at(&schema.file, &indexes)?;
    let m = DynamicMessage::decode(desc.clone(), rest).map_err(|e| {
        format!(
            "the Protobuf data does not match message {} (message indexes {indexes:?}): {e}",
            desc.full_name()
        )
    })?;
    serde_json::to_vec(&message(&m)?).map_err(|e| e.to_string())
}

/// Reads a zig-zag varint (at most 5 bytes: Confluent writes the indexes as 32-bit ints).
fn zigzag(bytes: &[u8], at: &mut usize) -> Result<i32, String> {
    let mut v: u32 = 0;
    for shift in 0..5 {
        let b = *bytes
            .get(*at)
            .ok_or("truncated message indexes: the body ends inside a varint")?;
        *at += 1;
        v |= u32::from(b & 0x7f) << (7 * shift);
        if b & 0x80 == 0 {
            return Ok(i32::from_ne_bytes(
                ((v >> 1) ^ (v & 1).wrapping_neg()).to_ne_bytes(),
            ));
        }
    }
    Err("malformed message indexes: a varint longer than 5 bytes".into())
}

/// The message indexes at the start of `body` (`[0]` for the single byte 0) and the message bytes after them.
///
/// # Errors
/// An empty body, a cut-short or overlong varint, a negative count or index, more indexes than bytes.
pub fn message_indexes(body: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    if body.is_empty() {
        return Err(
            "no message indexes after the frame (a Protobuf frame's body opens with them)".into(),
        );
    }
    let mut at = 0;
    let count = zigzag(body, &mut at)?;
    let Some(count) = usize::try_from(count).ok().filter(|c| *c <= body.len()) else {
        return Err(format!(
            "malformed message indexes: a count of {count} (the body is {} bytes)",
            body.len()
        ));
    };
    if count == 0 {
        return Ok((vec![0], &body[at..]));
    }
    let mut indexes = Vec::with_capacity(count);
    for _ in 0..count {
        let i = zigzag(body, &mut at)?;
        let i = usize::try_from(i)
            .map_err(|_| format!("malformed message indexes: a negative index {i}"))?;
        indexes.push(i);
    }
    Ok((indexes, &body[at..]))
}

/// The message the indexes name: the file's `indexes[0]`-th top-level message, then nested ones.
fn message_at(file: &FileDescriptor, indexes: &[usize]) -> Result<MessageDescriptor, String> {
    let bad = |n: usize| {
        format!(
            "message indexes {indexes:?} name no message of the schema ({} top-level: {})",
            file.messages().len(),
            file.messages()
                .map(|m| m.name().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ) + if n > 0 { " or its nested messages" } else { "" }
    };
    let first = indexes.first().copied().unwrap_or(0);
    let mut m = file.messages().nth(first).ok_or_else(|| bad(0))?;
    for (n, &i) in indexes.iter().enumerate().skip(1) {
        let child = m.child_messages().nth(i);
        m = child.ok_or_else(|| bad(n))?;
    }
    Ok(m)
}

/// A message as JSON: a well-known or Confluent type by its mapping, another message as an object of every
/// field.
fn message(m: &DynamicMessage) -> Result<Value, String> {
    let desc = m.descriptor();
    let int = |name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_i32())
            .unwrap_or(0)
    };
    match desc.full_name() {
        "google.protobuf.Timestamp" => {
            let secs = m
                .get_field_by_name("seconds")
                .and_then(|v| v.as_i64())
                .unwrap_or(0);
            let nanos = u32::try_from(int("nanos"))
                .map_err(|_| format!("timestamp nanos {} below 0", int("nanos")))?;
            super::avro::rfc3339(secs, nanos)
        }
        "confluent.type.Decimal" => {
            let bytes = m
                .get_field_by_name("value")
                .and_then(|v| v.as_bytes().cloned())
                .unwrap_or_default();
            let n = BigDecimal::new(
                BigInt::from_signed_bytes_be(&bytes),
                i64::from(int("scale")),
            );
            Ok(Value::String(n.to_string()))
        }
        "google.type.Date" => {
            let (y, mo, d) = (int("year"), int("month"), int("day"));
            let day = u32::try_from(mo)
                .ok()
                .zip(u32::try_from(d).ok())
                .and_then(|(mo, d)| chrono::NaiveDate::from_ymd_opt(y, mo, d))
                .ok_or_else(|| format!("google.type.Date {y}-{mo}-{d} is not a calendar date"))?;
            Ok(Value::String(super::day::text(day)))
        }
        "google.type.TimeOfDay" => {
            let micros = ((i64::from(int("hours")) * 60 + i64::from(int("minutes"))) * 60
                + i64::from(int("seconds")))
                * 1_000_000
                + i64::from(int("nanos")) / 1_000;
            super::avro::time_of_day(micros)
        }
        n if n.starts_with("google.protobuf.") => {
            let opts = prost_reflect::SerializeOptions::new()
                .stringify_64_bit_integers(false)
                .use_proto_field_name(true)
                .skip_default_fields(false);
            m.serialize_with_options(serde_json::value::Serializer, &opts)
                .map_err(|e| format!("{n}: {e}"))
        }
        _ => {
            let mut out = Map::new();
            for f in desc.fields() {
                let v = if f.supports_presence() && !m.has_field(&f) {
                    Value::Null
                } else {
                    value(&m.get_field(&f), &f.kind())?
                };
                out.insert(f.name().to_string(), v);
            }
            Ok(Value::Object(out))
        }
    }
}

/// A field's value as JSON (`kind` names an enum's values).
fn value(v: &Proto, kind: &prost_reflect::Kind) -> Result<Value, String> {
    Ok(match v {
        Proto::Bool(b) => Value::Bool(*b),
        Proto::I32(i) => json!(i),
        Proto::I64(i) => json!(i),
        Proto::U32(i) => json!(i),
        Proto::U64(i) => json!(i),
        Proto::F32(f) => super::avro::float(f64::from(*f)),
        Proto::F64(f) => super::avro::float(*f),
        Proto::String(s) => Value::String(s.clone()),
        Proto::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        Proto::EnumNumber(n) => match kind.as_enum().and_then(|e| e.get_value(*n)) {
            Some(ev) => Value::String(ev.name().to_string()),
            None => json!(n),
        },
        Proto::Message(m) => message(m)?,
        Proto::List(items) => Value::Array(
            items
                .iter()
                .map(|i| value(i, kind))
                .collect::<Result<_, _>>()?,
        ),
        Proto::Map(entries) => {
            let value_kind = kind
                .as_message()
                .map(|e| e.map_entry_value_field().kind())
                .unwrap_or_else(|| kind.clone());
            let mut keys: Vec<(&MapKey, &Proto)> = entries.iter().collect();
            keys.sort_by(|a, b| a.0.cmp(b.0));
            let mut out = Map::new();
            for (k, v) in keys {
                let key = match k {
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(i) => i.to_string(),
                    MapKey::I64(i) => i.to_string(),
                    MapKey::U32(i) => i.to_string(),
                    MapKey::U64(i) => i.to_string(),
                    MapKey::String(s) => s.clone(),
                };
                out.insert(key, value(v, &value_kind)?);
            }
            Value::Object(out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    const ORDER: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "confluent/type/decimal.proto";
message Other { string x = 1; }
message OrderEvent {
  string event_id = 1;
  int64 version = 2;
  google.protobuf.Timestamp occurred_at = 3;
  optional string customer_id = 4;
  confluent.type.Decimal amount = 5;
  Kind kind = 6;
  map<string, int64> tags = 7;
  repeated double scores = 8;
  message Line { uint64 qty = 1; }
  Line line = 9;
  enum Kind { UNKNOWN = 0; PLACED = 1; }
}
"#;

    fn schema() -> ProtoSchema {
        ProtoSchema::compile(7, ORDER, &[]).expect("compiles")
    }

    #[test]
    fn message_indexes_follow_the_wire_format() {
        assert_eq!(message_indexes(&[0, 9]).unwrap(), (vec![0], &[9u8][..]));
        // count 2 (zig-zag 4), indexes 1 (2) and 0 (0)
        assert_eq!(message_indexes(&[4, 2, 0]).unwrap(), (vec![1, 0], &[][..]));
        assert!(message_indexes(&[])
            .unwrap_err()
            .contains("no message indexes"));
        assert!(message_indexes(&[1]).unwrap_err().contains("count of -1"));
        assert!(message_indexes(&[4, 2]).unwrap_err().contains("truncated"));
        assert!(message_indexes(&[0xff; 6])
            .unwrap_err()
            .contains("longer than 5"));
    }

    #[test]
    fn a_message_becomes_the_json_of_its_fields() {
        let s = schema();
        let desc = s.file.messages().nth(1).unwrap();
        let mut m = DynamicMessage::new(desc.clone());
        m.set_field_by_name("event_id", Proto::String("e-1".into()));
        m.set_field_by_name("version", Proto::I64(9_007_199_254_740_993));
        let mut ts = DynamicMessage::new(
            desc.parent_pool()
                .get_message_by_name("google.protobuf.Timestamp")
                .unwrap(),
        );
        ts.set_field_by_name("seconds", Proto::I64(1_714_003_206));
        ts.set_field_by_name("nanos", Proto::I32(500_000_000));
        m.set_field_by_name("occurred_at", Proto::Message(ts));
        let mut dec = DynamicMessage::new(
            desc.parent_pool()
                .get_message_by_name("confluent.type.Decimal")
                .unwrap(),
        );
        dec.set_field_by_name("value", Proto::Bytes(vec![0x04, 0xe2].into()));
        dec.set_field_by_name("scale", Proto::I32(2));
        m.set_field_by_name("amount", Proto::Message(dec));
        m.set_field_by_name("kind", Proto::EnumNumber(1));
        let mut body = vec![2, 2]; // indexes [1]
        body.extend(m.encode_to_vec());
        let v: Value = serde_json::from_slice(&to_json(&s, &body).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"event_id": "e-1", "version": 9_007_199_254_740_993i64,
                   "occurred_at": "2024-04-25T00:00:06.500Z", "customer_id": null, "amount": "12.50",
                   "kind": "PLACED", "tags": {}, "scores": [], "line": null})
        );
        let e = to_json(&s, &[2, 4]).unwrap_err();
        assert!(e.contains("message indexes [2] name no message"), "{e}");
        // Nested messages count the map fields' entry types (`TagsEntry` is [1, 0]): [1, 1] is `Line`.
        let line: Value =
            serde_json::from_slice(&to_json(&s, &[4, 2, 2, 0x08, 3]).unwrap()).unwrap();
        assert_eq!(line, json!({"qty": 3}));
        let e = to_json(&s, &[4, 2, 10]).unwrap_err();
        assert!(e.contains("[1, 5]") && e.contains("nested"), "{e}");
        let e = to_json(&s, &[2, 2, 0x0a, 0x05, b'e']).unwrap_err();
        assert!(e.contains("does not match message shop.OrderEvent"), "{e}");
    }

    #[test]
    fn imports_resolve_from_references_or_fail_naming_the_file() {
        let e = ProtoSchema::compile(
            3,
            "syntax = \"proto3\";\nimport \"other.proto\";\nmessage A { B b = 1; }\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("other.proto"), "{e}");
        let r = Reference {
            name: "other.proto".into(),
            text: "syntax = \"proto3\";\nmessage B { int32 n = 1; }\n".into(),
        };
        let s = ProtoSchema::compile(
            3,
            "syntax = \"proto3\";\nimport \"other.proto\";\nmessage A { B b = 1; }\n",
            &[r],
        )
        .expect("the reference resolves the import");
        let v: Value =
            serde_json::from_slice(&to_json(&s, &[0, 0x0a, 2, 0x08, 5]).unwrap()).unwrap();
        assert_eq!(v, json!({"b": {"n": 5}}));
    }
}
