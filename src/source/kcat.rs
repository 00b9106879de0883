//! One line of a `kcat -C -J` dump → a [`Record`], decided (the format: `source/file.rs`).

use serde::Deserialize;

use crate::config::Pipeline;
use crate::decode::{Reason, Rejection};
use crate::engine::decide::decide;
use crate::engine::Record;
use crate::error::{Error, Result};
use crate::model::Pending;

/// One line of `kcat -C -J` output.
#[derive(Deserialize)]
struct Envelope {
    topic: String,
    partition: i32,
    offset: i64,
    #[serde(default)]
    tstype: Option<String>,
    #[serde(default)]
    ts: Option<i64>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    payload: Option<String>,
    /// kcat could not decode the value (`-s value=avro` and a schema-registry or Avro error): `payload` is null.
    #[serde(default)]
    payload_error: Option<String>,
    /// kcat could not decode the key.
    #[serde(default)]
    key_error: Option<String>,
    /// The record's headers: `["name", "value", "name", null, …]` (kcat's default) or `{"name": ["value", …]}`.
    #[serde(default)]
    headers: Option<serde_json::Value>,
}

/// One kcat line (`at`: `file:line`) → the record, decided.
///
/// # Errors
/// [`Error::Other`] naming `at`: not a kcat record, a payload inlined as an object, headers of another shape, a
/// topic not in the pipeline.
pub(crate) fn parse_line(pipeline: &Pipeline, text: &str, at: &str) -> Result<Record> {
    let env = envelope(text, at)?;
    if !pipeline.kafka.topics.contains(&env.topic) {
        return Err(Error::Other(format!(
            "{at}: topic `{}` is not in the pipeline's [kafka] topics",
            env.topic
        )));
    }
    let headers =
        headers(env.headers.as_ref()).map_err(|m| Error::Other(format!("{at}: `headers`: {m}")))?;
    // The first such header, as from the broker (`decode::debezium::old_key_header`).
    let old_key = headers
        .iter()
        .find(|(name, _)| name == crate::decode::debezium::envelope::OLD_KEY_HEADER)
        .and_then(|(_, v)| v.clone())
        .map(String::into_bytes);
    let timestamp_ms = match env.tstype.as_deref() {
        Some("create" | "logappend") | None => env.ts,
        Some(_) => None,
    };
    let key = env.key.map(String::into_bytes);
    let value = env.payload.map(String::into_bytes);
    // Every error kcat reported, under the member's own name (`payload_error`, `key_error`).
    let undecodable: Vec<String> = [
        ("value", "payload_error", &env.payload_error),
        ("key", "key_error", &env.key_error),
    ]
    .into_iter()
    .filter_map(|(what, member, e)| {
        e.as_ref()
            .map(|e| format!("the {what} could not be decoded (kcat's {member} in the dump): {e}"))
    })
    .collect();
    let decided = match undecodable.is_empty() {
        false => Pending::Quarantine(Rejection::new(
            Reason::UndecodableValue,
            undecodable.join("; "),
        )),
        true => decide(
            pipeline,
            key.as_deref(),
            value.as_deref(),
            old_key.as_deref(),
        ),
    };
    Ok(Record {
        tp: (env.topic, env.partition),
        offset: env.offset,
        timestamp_ms,
        key,
        value,
        old_key,
        decided: Some(decided),
    })
}

/// Parses the envelope of a kcat line.
///
/// # Errors
/// [`Error::Other`] naming `at`; a `payload` that is an object (kcat `-s value=avro` inlines the decoded value,
/// not its bytes) is named as such.
fn envelope(text: &str, at: &str) -> Result<Envelope> {
    serde_json::from_str(text).map_err(|e| {
        let lax: Option<serde_json::Value> = serde_json::from_str(text).ok();
        let inlined = lax
            .as_ref()
            .is_some_and(|v| v["payload"].is_object() || v["key"].is_object());
        if inlined {
            Error::Other(format!(
                "{at}: the key or payload is an object (kcat -s key/value=avro decodes it): the record's bytes are \
                 not in the dump, so it cannot be replayed as consumed; dump without -s"
            ))
        } else {
            Error::Other(format!(
                "{at}: not a kcat -J record (topic, partition, offset, key, payload): {e}"
            ))
        }
    })
}

/// A header: name and value (`None`: a header without a value).
type Header = (String, Option<String>);

/// The `headers` member, in order: kcat's flat array of alternating names and values, or its map of a name to
/// the array of its values. Absent or `null`: no headers.
///
/// # Errors
/// What is wrong with the member's shape.
fn headers(v: Option<&serde_json::Value>) -> std::result::Result<Vec<Header>, String> {
    use serde_json::Value;
    let value = |v: &Value| match v {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Null => Ok(None),
        other => Err(format!(
            "a header value must be a string or null, not {other}"
        )),
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) if a.len() % 2 == 0 => a
            .chunks(2)
            .map(|pair| match &pair[0] {
                Value::String(name) => Ok((name.clone(), value(&pair[1])?)),
                other => Err(format!("a header name must be a string, not {other}")),
            })
            .collect(),
        Some(Value::Array(a)) => Err(format!(
            "{} elements: kcat writes names and values in pairs",
            a.len()
        )),
        Some(Value::Object(m)) => {
            let mut out = Vec::new();
            for (name, values) in m {
                let Value::Array(vs) = values else {
                    return Err(format!("header `{name}`: expected an array of values"));
                };
                for v in vs {
                    out.push((name.clone(), value(v)?));
                }
            }
            Ok(out)
        }
        Some(other) => Err(format!("expected an array or an object, not {other}")),
    }
}

/// A line whose bytes are not UTF-8 (`at`: `file:line`): kcat copies a binary key or value raw, so the line is
/// not JSON and its key and value cannot be recovered with certainty. Read leniently (each invalid byte as
/// U+FFFD) only to name the record. With `quarantine` the record is quarantined as
/// [`Reason::UndecodableValue`], its dead letter holding the whole line's bytes; else the load stops here.
///
/// # Errors
/// [`Error::Other`] naming the line, the record (when it can be read) and the byte.
pub(crate) fn not_utf8(
    pipeline: &Pipeline,
    line: &[u8],
    e: std::str::Utf8Error,
    (at, quarantine): (&str, bool),
) -> Result<Record> {
    let raw = line.trim_ascii();
    let lossy = String::from_utf8_lossy(raw);
    let env = envelope(&lossy, at)?;
    if !pipeline.kafka.topics.contains(&env.topic) {
        return Err(Error::Other(format!(
            "{at}: topic `{}` is not in the pipeline's [kafka] topics",
            env.topic
        )));
    }
    let byte = line[e.valid_up_to()];
    let what = format!(
        "{at}: {}/{}@{} is not UTF-8 (byte 0x{byte:02X} at byte {} of the line): kcat copies key and value bytes \
         unescaped",
        env.topic,
        env.partition,
        env.offset,
        e.valid_up_to()
    );
    if !quarantine {
        return Err(Error::Other(format!(
            "{what}; stopped before it. Rerun with --quarantine-invalid-utf8 to dead-letter the line, or repair \
             the dump"
        )));
    }
    let timestamp_ms = match env.tstype.as_deref() {
        Some("create" | "logappend") | None => env.ts,
        Some(_) => None,
    };
    let detail = format!("{what}; the dead letter's value is the whole line");
    Ok(Record {
        tp: (env.topic, env.partition),
        offset: env.offset,
        timestamp_ms,
        key: None,
        value: Some(raw.to_vec()),
        old_key: None,
        decided: Some(Pending::Quarantine(Rejection::new(
            Reason::UndecodableValue,
            detail,
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_order_duplicates_and_nulls() {
        let v: serde_json::Value = serde_json::from_str(
            r#"["trace-id","t-1","source","checkout","source","retry","flag",null]"#,
        )
        .unwrap();
        let h = headers(Some(&v)).unwrap();
        let want: Vec<Header> = vec![
            ("trace-id".into(), Some("t-1".into())),
            ("source".into(), Some("checkout".into())),
            ("source".into(), Some("retry".into())),
            ("flag".into(), None),
        ];
        assert_eq!(h, want);
        assert_eq!(headers(None).unwrap(), vec![]);
        let map: serde_json::Value =
            serde_json::from_str(r#"{"source":["a","b"],"flag":[null]}"#).unwrap();
        assert_eq!(headers(Some(&map)).unwrap().len(), 3);
        let odd: serde_json::Value = serde_json::from_str(r#"["a","b","c"]"#).unwrap();
        assert!(headers(Some(&odd)).unwrap_err().contains("pairs"));
    }

    #[test]
    fn an_inlined_payload_is_named() {
        let line = r#"{"topic":"t","partition":0,"offset":1,"key":"k","payload":{"a":1},"value_schema_id":3}"#;
        let e = envelope(line, "f:1").err().unwrap().to_string();
        assert!(e.contains("f:1") && e.contains("avro"), "{e}");
    }
}
