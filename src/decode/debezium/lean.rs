//! The envelope parsed with only what the change needs, for pipelines whose `[fields]` read nothing but the
//! built-in CDC fields (`_source`, `_entity`, `_position`, `_op`, `_snapshot`, `_day`): the members nothing reads
//! (`source.version`, `connector`, `name`, `snapshot`, `xmin`, `transaction`, …) are parsed as the full parse
//! parses them — so the same records are valid JSON — and dropped at once, and no document holds the envelope,
//! so the row images are moved into the change instead of copied.
//!
//! The lean parse is only a shortcut: it returns `None` whenever the record is not an unmistakable change
//! envelope (not an object, no `op` or no `source` member, a `source` that is not an object, a serde_json marker
//! key, the schema cache off), and the caller then takes the full parse, which decides and words every skip and
//! rejection. An envelope with `op` and `source` is never a heartbeat, transaction metadata or a flattened row
//! (`envelope::classify`), so on it both parses decide the same; `envelope`'s tests compare the two on every
//! fixture record and on adversarial ones.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::schema;

/// Envelope members kept: what `envelope::classify`, `source_position` and the row images read.
const ENVELOPE: &[&str] = &["before", "after", "source", "op", "ts_ms", "status", "id"];
/// `source` members kept: what `envelope::source_position` reads.
const SOURCE: &[&str] = &[
    "db", "schema", "table", "lsn", "sequence", "txId", "ts_ms", "snapshot",
];

/// The prefix of the member names serde_json gives a meaning of its own under its `arbitrary_precision` and
/// `raw_value` features (`$serde_json::private::Number`, `…::RawValue`): an object holding one is left to the
/// full parse, which reads it as `serde_json::Value` does.
const MARKER: &str = "$serde_json::private::";

/// A JSON object with only the members in `keep` (the `source` member itself pruned to [`SOURCE`] when
/// `nested`); any other JSON value is an error (the caller falls back to the full parse).
#[derive(Clone, Copy)]
struct Pruned {
    keep: &'static [&'static str],
    nested: bool,
}

impl<'de> DeserializeSeed<'de> for Pruned {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Pruned {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut out = Map::new();
        while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
            if k.starts_with(MARKER) {
                return Err(serde::de::Error::custom("a serde_json marker key"));
            }
            if self.nested && k == "source" {
                let source = m.next_value_seed(Pruned {
                    keep: SOURCE,
                    nested: false,
                })?;
                out.insert(k.into_owned(), Value::Object(source));
            } else if self.keep.contains(&k.as_ref()) {
                // A repeated member: the last one wins, as in `serde_json::Value`.
                out.insert(k.into_owned(), m.next_value::<Value>()?);
            } else {
                // Parsed as the full parse parses it (string escapes and UTF-8, the nesting limit), then dropped:
                // a member nobody reads must still be valid JSON for the record to be taken as a change.
                m.next_value::<Value>()?;
            }
        }
        Ok(out)
    }
}

/// A member name, borrowed from the record when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A pruned envelope and its parsed Connect schema (`None` without one).
pub type Lean = (Map<String, Value>, Option<Arc<schema::Parsed>>);

/// The envelope as a pruned object.
struct Envelope(Map<String, Value>);

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pruned {
            keep: ENVELOPE,
            nested: true,
        }
        .deserialize(d)
        .map(Envelope)
    }
}

/// The JSON converter's wrapper around a pruned envelope: exactly the two members `schema` and `payload`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped<'a> {
    #[serde(borrow)]
    schema: &'a serde_json::value::RawValue,
    payload: Envelope,
}

/// The pruned envelope of a record value and its parsed Connect schema (as [`schema::parse`] gives it), or
/// `None` when the record is not plainly a change envelope — then the caller parses it in full.
pub fn parse(bytes: &[u8]) -> Option<Lean> {
    if !schema::cache_on() {
        return None; // measuring the full parse (`schema::without_cache`)
    }
    if let Some((payload, schema)) = schema::split_known(bytes) {
        if let Ok((Envelope(env),)) = serde_json::from_slice(&payload) {
            return plain(env, Some(schema));
        }
    }
    let opens = |member: &[u8]| {
        let t = bytes.trim_ascii_start();
        t.strip_prefix(b"{")
            .is_some_and(|r| r.trim_ascii_start().starts_with(member))
    };
    // The wrapper, in either member order (the JSON converter writes `schema` first); when it is not one, the
    // object is taken as a bare envelope, as the full parse takes it.
    let wrapped = (opens(b"\"schema\"") || opens(b"\"payload\""))
        .then(|| serde_json::from_slice::<Wrapped<'_>>(bytes).ok())
        .flatten();
    let (env, schema) = match wrapped {
        Some(w) => (w.payload.0, schema::cached(w.schema)),
        None => (serde_json::from_slice::<Envelope>(bytes).ok()?.0, None),
    };
    plain(env, schema)
}

/// The envelope and its schema when it is plainly a change envelope (`op` and an object `source`).
fn plain(env: Map<String, Value>, schema: Option<Arc<schema::Parsed>>) -> Option<Lean> {
    (env.contains_key("op") && env.get("source").is_some_and(Value::is_object))
        .then_some((env, schema))
}

/// The elements of `source.sequence` (Debezium writes `["<commit LSN>","<change LSN>"]`, an element `null` for
/// none) read without a JSON parse, as `parse_i64` reads each element of the parsed array; `None` for any
/// other shape (escapes, unquoted numbers, whitespace between tokens), which the caller parses as JSON.
pub fn sequence(s: &str) -> Option<Vec<Option<i64>>> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner
        .split(',')
        .map(|e| match e {
            "null" => Some(None),
            _ => {
                let t = e.strip_prefix('"')?.strip_suffix('"')?;
                // No escape, no quote, no control character (which JSON forbids in a string).
                let plain = !t.contains(['"', '\\']) && !t.bytes().any(|b| b < 0x20);
                plain.then(|| t.trim().parse().ok())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand reading of `source.sequence` agrees with the JSON parse on what it accepts and declines the rest.
    #[test]
    fn sequence_is_read_as_the_json_parse_reads_it() {
        assert_eq!(
            sequence(r#"["33000136","33000200"]"#),
            Some(vec![Some(33000136), Some(33000200)])
        );
        assert_eq!(
            sequence(r#"[null,"33000200"]"#),
            Some(vec![None, Some(33000200)])
        );
        assert_eq!(sequence(r#"["x",""]"#), Some(vec![None, None]));
        assert_eq!(sequence("[]"), Some(vec![]));
        for other in [
            r#"[1,2]"#,
            r#"[ "1"]"#,
            r#"["1\u0030"]"#,
            "",
            "1",
            r#"["1""#,
        ] {
            assert_eq!(sequence(other), None, "{other}");
        }
    }

    /// Only members the change needs are kept; anything but a plain envelope object is declined.
    #[test]
    fn keeps_what_the_change_reads() {
        let v = br#"{"before":null,"after":{"id":1},"source":{"version":"x","db":"app","table":"t","lsn":5,"xmin":null},"op":"c","transaction":{"id":"1"}}"#;
        let (env, schema) = parse(v).unwrap();
        assert!(schema.is_none());
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(keys, ["after", "before", "op", "source"]);
        let source: Vec<&str> = env["source"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(source, ["db", "lsn", "table"]);
        for declined in [
            &br#"{"op":"c"}"#[..],
            br#"{"source":{},"after":{}}"#,
            br#"{"op":"c","source":null}"#,
            br#"[1]"#,
            b"null",
            br#"{"schema":{},"payload":{"op":"c","source":{}},"x":1}"#,
            br#"{"schema":{},"payload":null}"#,
        ] {
            assert!(
                parse(declined).is_none(),
                "{}",
                String::from_utf8_lossy(declined)
            );
        }
    }
}
