//! The JSON converter's `{"schema": …, "payload": …}` form (`schemas.enable=true`), with the Connect schemas
//! parsed once per distinct schema text: a topic's records repeat the same schema bytes until the source table
//! changes, so each record parses only its payload (and looks its schema up by its bytes).
//!
//! Kafka Connect `JsonConverter`: the schema is a struct schema whose `fields` are `{field, type, name?,
//! parameters?, items?, fields?}`; Debezium's envelope schema has the struct fields `before` and `after` (the row
//! schema) and its heartbeat schema is named [`super::envelope::HEARTBEAT_SCHEMA`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The Connect schema of each field of a row (or key) struct: field name → its schema.
pub type RowSchema = Vec<(String, Arc<Value>)>;

/// What the decode reads from a record's Connect schema, parsed once per distinct schema text.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The schema's `name`.
    pub name: Option<String>,
    /// The fields of the schema itself (a key's columns).
    pub fields: RowSchema,
    /// The fields of its `before` struct field (an envelope's old row).
    pub before: RowSchema,
    /// The fields of its `after` struct field (an envelope's new row).
    pub after: RowSchema,
}

impl Parsed {
    fn of(schema: &Value) -> Parsed {
        Parsed {
            name: schema
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string),
            fields: row_schema(Some(schema)),
            before: struct_fields(schema, "before"),
            after: struct_fields(schema, "after"),
        }
    }
}

/// The Connect schema of each field of struct field `name` of `schema`.
fn struct_fields(schema: &Value, name: &str) -> RowSchema {
    let st = schema
        .get("fields")
        .and_then(Value::as_array)
        .and_then(|fs| {
            fs.iter()
                .find(|f| f.get("field").and_then(Value::as_str) == Some(name))
        });
    row_schema(st)
}

fn row_schema(st: Option<&Value>) -> RowSchema {
    st.and_then(|s| s.get("fields"))
        .and_then(Value::as_array)
        .map(|fs| {
            fs.iter()
                .filter_map(|f| Some((f.get("field")?.as_str()?.to_string(), Arc::new(f.clone()))))
                .collect()
        })
        .unwrap_or_default()
}

/// The wrapper form: exactly the two members `schema` and `payload`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped<'a> {
    #[serde(borrow)]
    schema: &'a RawValue,
    payload: Value,
}

/// Distinct schema texts kept per thread; the map is emptied when it is full (a topic with more live schema
/// versions than this parses some schemas again, nothing else).
pub const CACHE_ENTRIES: usize = 64;

/// A schema text and its parse.
type Known = (Box<[u8]>, Arc<Parsed>);

thread_local! {
    static CACHE: RefCell<HashMap<Box<[u8]>, Arc<Parsed>>> = RefCell::new(HashMap::new());
    /// The two schema texts this thread looked up last (a record's key and its value each have one), most
    /// recent first, and their parses ([`split_known`]).
    static LAST: RefCell<[Option<Known>; 2]> = const { RefCell::new([None, None]) };
    static UNCACHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the cache off on this thread: every record's schema is parsed again, as before the cache
/// existed. For measuring what the cache saves (`benches/cpu.rs`); nothing else calls it.
pub fn without_cache<R>(f: impl FnOnce() -> R) -> R {
    UNCACHED.with(|u| u.set(true));
    let r = f();
    UNCACHED.with(|u| u.set(false));
    r
}

/// Whether the schema cache is on on this thread (it is, except inside [`without_cache`]).
pub(super) fn cache_on() -> bool {
    !UNCACHED.with(std::cell::Cell::get)
}

/// The payload and parsed schema of a wrapper that opens with exactly one of the two schema texts this thread
/// looked up last — `{"schema":` + that text + `,"payload":`, as the JSON converter writes it (compact,
/// `schema` first) — so that a topic's repeated schema is neither scanned nor hashed again. A JSON value's text
/// ends where its own syntax ends, so the bytes after the known text are the payload and the closing `}`. The
/// payload is returned as `[payload]`: parsed, it nests as deep as inside the wrapper, so serde_json's nesting
/// limit decides as on the whole record. The caller parses it and takes the usual path when it does not parse.
pub(super) fn split_known(bytes: &[u8]) -> Option<(Vec<u8>, Arc<Parsed>)> {
    if !cache_on() {
        return None;
    }
    let rest = bytes.strip_prefix(b"{\"schema\":")?;
    LAST.with(|last| {
        last.borrow().iter().flatten().find_map(|(text, parsed)| {
            let payload = rest
                .strip_prefix(&**text)?
                .strip_prefix(b",\"payload\":")?
                .trim_ascii_end()
                .strip_suffix(b"}")?;
            let mut nested = Vec::with_capacity(payload.len() + 2);
            nested.push(b'[');
            nested.extend_from_slice(payload);
            nested.push(b']');
            Some((nested, parsed.clone()))
        })
    })
}

/// The parsed schema of this schema text, from the cache or parsed now.
pub(super) fn cached(raw: &RawValue) -> Option<Arc<Parsed>> {
    let p = lookup(raw)?;
    let text = raw.get().as_bytes();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last[0].as_ref().is_none_or(|(t, _)| **t != *text) {
            last[1] = last[0].take();
            last[0] = Some((text.into(), p.clone()));
        }
    });
    Some(p)
}

fn lookup(raw: &RawValue) -> Option<Arc<Parsed>> {
    let bytes = raw.get().as_bytes();
    if let Some(p) = CACHE.with(|c| c.borrow().get(bytes).cloned()) {
        return Some(p);
    }
    let v: Value = serde_json::from_str(raw.get()).ok()?;
    if v.is_null() {
        return None;
    }
    let p = Arc::new(Parsed::of(&v));
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHE_ENTRIES {
            c.clear();
        }
        c.insert(bytes.into(), p.clone());
    });
    Some(p)
}

/// Parses a record key or value: the payload and, in the wrapper form, its parsed schema (`None` for a bare
/// value or a `null` schema). Unwraps only when `schema` and `payload` are the only two members (a stray
/// `payload` member of a bare envelope is not a wrapper).
///
/// # Errors
/// serde_json's error when the bytes are not JSON.
pub fn parse(bytes: &[u8]) -> serde_json::Result<(Value, Option<Arc<Parsed>>)> {
    if let Some((payload, schema)) = split_known(bytes) {
        if let Ok((v,)) = serde_json::from_slice::<(Value,)>(&payload) {
            return Ok((v, Some(schema)));
        }
    }
    if starts_as_wrapper(bytes) && cache_on() {
        if let Ok(w) = serde_json::from_slice::<Wrapped<'_>>(bytes) {
            return Ok((w.payload, cached(w.schema)));
        }
    }
    let v: Value = serde_json::from_slice(bytes)?;
    Ok(match v {
        Value::Object(mut m)
            if m.len() == 2 && m.contains_key("schema") && m.contains_key("payload") =>
        {
            let payload = m.remove("payload").unwrap_or(Value::Null);
            let schema = m.remove("schema").filter(|s| !s.is_null());
            (payload, schema.map(|s| Arc::new(Parsed::of(&s))))
        }
        other => (other, None),
    })
}

/// Whether the text opens like the JSON converter's wrapper (`{"schema"` after whitespace).
pub(super) fn starts_as_wrapper(bytes: &[u8]) -> bool {
    let t = bytes.trim_ascii_start();
    t.strip_prefix(b"{")
        .map(<[u8]>::trim_ascii_start)
        .is_some_and(|r| r.starts_with(b"\"schema\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache hands out the same parse for the same schema bytes and a new one for other bytes; the
    /// wrapper is recognised only with exactly `schema` and `payload`.
    #[test]
    fn schemas_are_parsed_once_per_text() {
        let a = br#"{"schema":{"type":"struct","fields":[{"field":"after","type":"struct","fields":[{"field":"id","type":"int32"}]}]},"payload":{"op":"c"}}"#;
        let b = br#"{"schema":{"type":"struct","fields":[{"field":"after","type":"struct","fields":[{"field":"id","type":"int64"}]}]},"payload":{"op":"u"}}"#;
        let (pa, sa) = parse(a).unwrap();
        let (_, sa2) = parse(a).unwrap();
        let (pb, sb) = parse(b).unwrap();
        assert_eq!(pa["op"], "c");
        assert_eq!(pb["op"], "u");
        let (sa, sa2, sb) = (sa.unwrap(), sa2.unwrap(), sb.unwrap());
        assert!(Arc::ptr_eq(&sa, &sa2));
        assert!(!Arc::ptr_eq(&sa, &sb));
        assert_eq!(sa.after[0].1["type"], "int32");
        assert_eq!(sb.after[0].1["type"], "int64");
        // A third member: not a wrapper, the object as it is.
        let (v, s) = parse(br#"{"schema":1,"payload":2,"op":"c"}"#).unwrap();
        assert!(s.is_none());
        assert_eq!(v["op"], "c");
        // A null schema: the payload, no schema.
        let (v, s) = parse(br#"{"schema":null,"payload":{"op":"c"}}"#).unwrap();
        assert!(s.is_none());
        assert_eq!(v["op"], "c");
    }

    /// A record that repeats the schema text looked up last is split at the known text without scanning it, and
    /// gives what the full parse (cache off) gives; anything else after the known text takes the usual path.
    #[test]
    fn a_repeated_schema_text_is_recognised_without_a_scan() {
        let schema = r#"{"type":"struct","fields":[{"field":"after","type":"struct","fields":[{"field":"id","type":"int64"}]}]}"#;
        let rec = |tail: &str| format!(r#"{{"schema":{schema},"payload":{tail}"#).into_bytes();
        let (_, first) = parse(&rec(r#"{"op":"c"}}"#)).unwrap();
        let first = first.unwrap();
        for (tail, split) in [
            (r#"{"op":"u","after":{"id":7}}}"#, true),
            ("{\"op\":\"u\"} \n}\n", true),
            (r#"null}"#, true),
            (r#"{"op":"u"},"x":1}"#, false),
            (r#"{"op":"u"}"#, false),
            (r#"{"op":"u"}}}"#, false),
            (r#"{"op":"u"},{"a":1}}"#, false),
        ] {
            let bytes = rec(tail);
            let known = split_known(&bytes);
            assert!(known.is_some(), "{tail}");
            let got = parse(&bytes).map(|(v, s)| (v, s.map(|s| Arc::ptr_eq(&s, &first))));
            let want = without_cache(|| parse(&bytes)).map(|(v, s)| (v, s.map(|_| true)));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{tail}"),
                (Err(_), Err(_)) => {}
                (g, w) => panic!("{tail}: {g:?} against {w:?}"),
            }
            let payload_parses = serde_json::from_slice::<(Value,)>(&known.unwrap().0).is_ok();
            assert_eq!(payload_parses, split, "{tail}");
        }
        // Another schema text: not split (until it has been looked up); then both are known (a key's schema
        // and its value's alternate), a third one pushes the oldest out.
        let other = br#"{"schema":{"type":"string"},"payload":"x"}"#;
        assert!(split_known(other).is_none());
        parse(other).unwrap();
        assert!(split_known(other).is_some());
        assert!(split_known(&rec(r#"{"op":"u"}}"#)).is_some());
        parse(br#"{"schema":{"type":"int64"},"payload":1}"#).unwrap();
        assert!(split_known(other).is_some());
        assert!(split_known(&rec(r#"{"op":"u"}}"#)).is_none());
        // As deep as serde_json's nesting limit allows inside the wrapper, and one deeper: the split decides as
        // the whole record does.
        parse(&rec(r#"{"op":"c"}}"#)).unwrap();
        let mut outcomes = Vec::new();
        for depth in [125, 126, 127, 128] {
            let deep = format!(r#"{{"a":{}{}}}}}"#, "[".repeat(depth), "]".repeat(depth));
            let bytes = rec(&deep);
            let got = parse(&bytes).is_ok();
            let want = without_cache(|| parse(&bytes)).is_ok();
            assert_eq!(got, want, "depth {depth}");
            outcomes.push(want);
        }
        assert!(
            outcomes.contains(&true) && outcomes.contains(&false),
            "{outcomes:?}"
        );
    }
}
