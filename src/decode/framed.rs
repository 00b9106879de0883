//! Schema-registry framing (`[source] encoding`): byte 0 the magic `0x00`, bytes 1–4 the schema id
//! (big-endian), then the serialized data (Confluent documentation "Wire format"; case C41).
//!
//! With `encoding = "json"` a value (or a Debezium key) that starts with `0x00` is a frame the pipeline does
//! not expect — no JSON text starts with that byte — and is quarantined as `schema-registry` with a reason that
//! names the frame, instead of the JSON parser's "line 1 column 1". With `avro` / `json-schema` the frame is
//! required, the schema is fetched by id ([`super::registry`]) and the body becomes the JSON text the rest of the
//! decoder reads ([`super::avro`], [`super::protobuf`]; JSON Schema's body is JSON already).

use std::borrow::Cow;

use super::registry::{Fetch, Schema};
use super::rejection::{Reason, Rejection};
use crate::config::{Encoding, Format, Pipeline};

/// The magic byte that opens a schema-registry frame.
pub const MAGIC: u8 = 0;
/// Magic byte + 4-byte schema id.
pub const HEADER: usize = 5;

fn reject(detail: String) -> Rejection {
    Rejection::new(Reason::SchemaRegistry, detail)
}

/// The schema id of a frame, or why `bytes` (the record's `part`, "value" or "key") is no frame.
///
/// # Errors
/// A `schema-registry` rejection: shorter than 5 bytes, or (when `required`) not opened by the magic byte.
pub fn schema_id(bytes: &[u8], part: &str, required: bool) -> Result<Option<u32>, Rejection> {
    match bytes.first() {
        Some(&MAGIC) if bytes.len() < HEADER => Err(reject(format!(
            "truncated schema-registry frame: the {part} is {} bytes, a frame has at least {HEADER} (magic byte 0x00 + \
             4-byte schema id)",
            bytes.len()
        ))),
        Some(&MAGIC) => Ok(Some(u32::from_be_bytes(
            bytes[1..HEADER].try_into().expect("4 bytes"),
        ))),
        _ if !required => Ok(None),
        None => Err(reject(format!(
            "truncated schema-registry frame: the {part} is empty"
        ))),
        Some(b) => Err(reject(format!(
            "the {part} is not schema-registry framed: byte 0 is 0x{b:02x}, not the magic byte 0x00 (a plain JSON \
             or string {part} where the pipeline's encoding expects a registry frame)"
        ))),
    }
}

/// The `part` ("value" or "key") as JSON text the decoder reads: unchanged for `encoding = "json"` (after
/// refusing a frame), the frame's body converted for `avro`, `json-schema` and `protobuf`.
///
/// # Errors
/// A `schema-registry` rejection (unexpected, truncated or unknown-id frame, data that does not match its
/// schema), or a `registry-unavailable` one (the registry could not be reached: the caller stops).
pub fn unframe<'a>(
    pipeline: &Pipeline,
    bytes: Option<&'a [u8]>,
    part: &str,
) -> Result<Option<Cow<'a, [u8]>>, Rejection> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let Some(plan) = pipeline.registry.as_ref() else {
        return match schema_id(bytes, part, false)? {
            None => Ok(Some(Cow::Borrowed(bytes))),
            Some(id) => Err(unexpected(bytes, part, id)),
        };
    };
    let registry = super::registry::client(plan);
    let id = schema_id(bytes, part, true)?.expect("a required frame is an id or an error");
    let body = &bytes[HEADER..];
    let schema = registry.schema(id).map_err(|e| match e {
        Fetch::Unknown(m) => reject(format!("unknown schema id {id} in the {part}'s frame: {m}")),
        Fetch::Unavailable(m) => Rejection::new(Reason::RegistryUnavailable, m),
    })?;
    match (pipeline.encoding, schema.as_ref()) {
        (Encoding::Avro, Schema::Avro { schema, refs, json }) => {
            bound_avro_allocations(pipeline.max_record_bytes);
            let connect = pipeline.format == Format::Debezium;
            super::avro::to_json(schema, refs, json, body, connect)
                .map(|v| Some(Cow::Owned(v)))
                .map_err(|m| reject(format!("schema id {id} ({part}): {m}")))
        }
        (Encoding::JsonSchema, Schema::Json) => Ok(Some(Cow::Borrowed(body))),
        (Encoding::Protobuf, Schema::Protobuf(schema)) => super::protobuf::to_json(schema, body)
            .map(|v| Some(Cow::Owned(v)))
            .map_err(|m| reject(format!("schema id {id} ({part}): {m}"))),
        (enc, s) => {
            let kind = match s {
                Schema::Avro { .. } => "AVRO",
                Schema::Json => "JSON",
                Schema::Protobuf(_) => "PROTOBUF",
                Schema::Other(t) => t.as_str(),
            };
            let article = if kind.starts_with(['A', 'E', 'I', 'O', 'U']) {
                "an"
            } else {
                "a"
            };
            Err(reject(format!(
                "schema id {id} ({part}) is {article} {kind} schema, but the pipeline's encoding is \"{}\"",
                enc.as_str()
            )))
        }
    }
}

/// Bounds what the Avro decoder reserves for a declared length (a string's or bytes' length, an array's or map's
/// block count) to `max_record_bytes`: a datum cannot hold more than the record's bytes, while the decoder's own
/// bound (512 MiB *items*) let a frame of a few bytes declaring a map of 500 million entries reserve ~80 GB and
/// abort the process (a poison pill that crashes every restart). Such a frame now fails to decode and is
/// quarantined as `schema-registry`. `apache_avro`'s bound is process-wide and set once: the first pipeline's
/// limit holds (one pipeline per process).
fn bound_avro_allocations(max_record_bytes: usize) {
    apache_avro::util::max_allocation_bytes(max_record_bytes.max(1024));
}

/// The reason for a frame on a pipeline without a registry: JSON after the frame (JSON Schema) or binary (Avro,
/// Protobuf).
fn unexpected(bytes: &[u8], part: &str, id: u32) -> Rejection {
    let body = &bytes[HEADER..];
    let json = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| matches!(b, b'{' | b'['));
    if json {
        reject(format!(
            "schema-registry framed payload (magic 0, schema id {id}) in the {part}: JSON after the {HEADER}-byte frame \
             (a JSON Schema serializer); the pipeline reads plain JSON — set [source] encoding = \"json-schema\" and \
             schema-registry to read it"
        ))
    } else {
        reject(format!(
            "unsupported encoding: schema-registry Avro or Protobuf (magic 0, schema id {id}) in the {part}; the \
             pipeline reads plain JSON — set [source] encoding = \"avro\" (or \"protobuf\") and schema-registry to read it"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_named() {
        let e = schema_id(b"\0\0\x07", "value", false).expect_err("short");
        assert!(
            e.detail
                .starts_with("truncated schema-registry frame: the value is 3 bytes"),
            "{}",
            e.detail
        );
        assert_eq!(
            schema_id(b"\0\0\0\x01\x02{}", "value", false).expect("ok"),
            Some(258)
        );
        assert_eq!(schema_id(b"{}", "value", false).expect("ok"), None);
        let e = schema_id(b"{}", "key", true).expect_err("plain");
        assert!(e.detail.contains("byte 0 is 0x7b"), "{}", e.detail);
        let r = unexpected(b"\0\0\0\0\x07{\"a\":1}", "value", 7);
        assert!(
            r.detail
                .starts_with("schema-registry framed payload (magic 0, schema id 7)"),
            "{}",
            r.detail
        );
        let r = unexpected(b"\0\0\0\0\x08Hc41e", "value", 8);
        assert!(
            r.detail
                .starts_with("unsupported encoding: schema-registry Avro"),
            "{}",
            r.detail
        );
        assert!(r.detail.contains("schema id 8"), "{}", r.detail);
    }
}
