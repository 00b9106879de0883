//! Decoding a JSON record value into the pipeline's typed fields.
//!
//! Each field becomes the PostgreSQL text form of its type (bound as a `text[]` element and cast in SQL), after
//! validating it here so that one bad record is quarantined instead of failing its whole batch. Values
//! PostgreSQL would reject anyway (NUL characters in `text`/`jsonb`, out-of-range numbers) are caught here too.

use std::str::FromStr;

use bigdecimal::BigDecimal;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use crate::config::{EpochUnit, FieldPlan, FieldType, Pipeline};

use super::rejection::{Reason, Rejection};

/// One decoded field value: its PostgreSQL text form, and the JSON value it came from (for filters).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldValue {
    /// PostgreSQL input text for the field's type.
    pub text: String,
    /// Typed value for CEL filters.
    pub cel: CelValue,
}

/// A field value as filters see it.
#[derive(Debug, Clone, PartialEq)]
pub enum CelValue {
    /// text, uuid, date (ISO `YYYY-MM-DD`), timestamptz (RFC 3339) are strings in filters: the field's `text`
    /// (not copied per record; a filter reads it from there).
    String,
    /// bigint.
    Int(i64),
    /// numeric (as a double in filters only; the database keeps the exact decimal).
    Float(f64),
    /// boolean.
    Bool(bool),
    /// jsonb.
    Json(Value),
}

/// The typed fields of one record, in the order of `Pipeline::fields`; `None` for a missing optional field.
pub type Fields = Vec<Option<FieldValue>>;

pub(crate) fn check_size(pipeline: &Pipeline, bytes: &[u8]) -> Result<(), Rejection> {
    if bytes.len() > pipeline.max_record_bytes {
        return Err(Rejection::new(
            Reason::Oversize,
            format!(
                "value is {} bytes, above batch.max-record-bytes = {}",
                bytes.len(),
                pipeline.max_record_bytes
            ),
        ));
    }
    Ok(())
}

/// The detail of a value the JSON parser refused: an unpaired UTF-16 surrogate escape (`\ud800` not followed
/// by a low surrogate, or a lone `\udc00`) is named as such — serde_json reports it as "unexpected end of hex
/// escape" or "lone leading surrogate", and PostgreSQL's jsonb refuses it too (RFC 8259 §8.2: such a string
/// has no Unicode meaning); anything else is the parser's message.
pub(crate) fn not_json(bytes: &[u8], e: &serde_json::Error) -> String {
    match unpaired_surrogate(bytes) {
        Some((escape, at)) => {
            format!("value is not valid JSON: unpaired surrogate {escape} at byte {at}")
        }
        None => format!("value is not valid JSON: {e}"),
    }
}

/// The first `\uXXXX` escape in `bytes` that is a UTF-16 surrogate without its partner, and its byte offset.
fn unpaired_surrogate(bytes: &[u8]) -> Option<(String, usize)> {
    let hex = |at: usize| -> Option<u16> {
        let h = bytes.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    };
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        if bytes.get(i + 1) != Some(&b'u') {
            i += 2; // another escape (`\\`, `\"`, …): its second byte is not a new escape
            continue;
        }
        let Some(u) = hex(i + 2) else {
            i += 2;
            continue;
        };
        let escape = String::from_utf8_lossy(&bytes[i..i + 6]).into_owned();
        match u {
            0xD800..=0xDBFF => {
                let low = (bytes.get(i + 6..i + 8) == Some(b"\\u"))
                    .then(|| hex(i + 8))
                    .flatten();
                if !matches!(low, Some(0xDC00..=0xDFFF)) {
                    return Some((escape, i));
                }
                i += 12;
            }
            0xDC00..=0xDFFF => return Some((escape, i)),
            _ => i += 6,
        }
    }
    None
}

/// Decodes `value` (the raw record value) into the pipeline's fields.
///
/// # Errors
/// A [`Rejection`] saying why the record must be quarantined.
pub fn decode(pipeline: &Pipeline, value: Option<&[u8]>) -> Result<Fields, Rejection> {
    let bytes = value.ok_or_else(|| {
        Rejection::new(
            Reason::NullValue,
            "null value (a Kafka tombstone) on a topic of JSON events",
        )
    })?;
    check_size(pipeline, bytes)?;
    let json: Value = serde_json::from_slice(bytes)
        .map_err(|e| Rejection::new(Reason::InvalidJson, not_json(bytes, &e)))?;
    if !json.is_object() {
        return Err(Rejection::new(
            Reason::InvalidJson,
            "value is JSON but not an object",
        ));
    }
    pipeline.fields.iter().map(|f| field(f, &json)).collect()
}

pub(crate) fn field(f: &FieldPlan, json: &Value) -> Result<Option<FieldValue>, Rejection> {
    let name = f.name.as_str();
    match lookup(json, &f.pointer) {
        None | Some(Value::Null) if f.optional => Ok(None),
        None | Some(Value::Null) => Err(Rejection::new(
            Reason::MissingField,
            format!("field `{name}` ({}) is missing or null", f.pointer),
        )),
        Some(v) => convert(f, v).map(Some).map_err(|m| {
            Rejection::new(
                Reason::InvalidField,
                format!("field `{name}` ({}): {m}", f.pointer),
            )
        }),
    }
}

/// `json.pointer(pointer)` (RFC 6901) without its two `String`s per token: a pointer without `~` escapes (every
/// usual `[fields]` path) is walked token by token on the borrowed text; one with escapes goes to serde_json.
fn lookup<'v>(json: &'v Value, pointer: &str) -> Option<&'v Value> {
    if pointer.is_empty() {
        return Some(json);
    }
    if pointer.contains('~') {
        return json.pointer(pointer);
    }
    pointer
        .strip_prefix('/')?
        .split('/')
        .try_fold(json, |target, token| match target {
            Value::Object(map) => map.get(token),
            // As serde_json's pointer: no sign, no leading zero.
            Value::Array(list)
                if !token.starts_with('+') && (token == "0" || !token.starts_with('0')) =>
            {
                token.parse::<usize>().ok().and_then(|i| list.get(i))
            }
            _ => None,
        })
}

fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}

fn no_nul(s: &str) -> Result<(), String> {
    if s.contains('\0') {
        Err("contains a NUL character, which PostgreSQL text and jsonb cannot store".into())
    } else {
        Ok(())
    }
}

/// Converts one JSON value to the field's type.
fn convert(f: &FieldPlan, v: &Value) -> Result<FieldValue, String> {
    let s = |text: String| FieldValue {
        cel: CelValue::String,
        text,
    };
    match f.ty {
        FieldType::Uuid => {
            let raw = v
                .as_str()
                .ok_or_else(|| format!("expected a UUID string, got {}", excerpt(v)))?;
            let id = uuid::Uuid::parse_str(raw.trim())
                .map_err(|e| format!("`{raw}` is not a UUID: {e}"))?;
            Ok(s(id.hyphenated().to_string()))
        }
        FieldType::Text => {
            let text = match v {
                Value::String(t) => t.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return Err(format!("expected text, got {}", excerpt(v))),
            };
            no_nul(&text)?;
            Ok(s(text))
        }
        FieldType::Bigint => {
            let n = match v {
                Value::Number(n) => n.to_string().parse::<i64>().ok(),
                Value::String(t) => t.trim().parse::<i64>().ok(),
                _ => None,
            }
            .ok_or_else(|| format!("expected a 64-bit integer, got {}", excerpt(v)))?;
            Ok(FieldValue {
                text: n.to_string(),
                cel: CelValue::Int(n),
            })
        }
        FieldType::Numeric => {
            let raw = match v {
                Value::Number(n) => n.to_string(),
                Value::String(t) => t.trim().to_string(),
                _ => return Err(format!("expected a decimal number, got {}", excerpt(v))),
            };
            // PostgreSQL numeric input: digits, one point, an optional exponent; no separators such as `_`.
            let plain = raw
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            let d = BigDecimal::from_str(&raw)
                .ok()
                .filter(|_| plain)
                .ok_or_else(|| {
                    format!(
                        "{} is not a decimal number",
                        excerpt(&Value::String(raw.clone()))
                    )
                })?;
            // PostgreSQL numeric: up to 131072 digits before and 16383 after the point.
            let (_, scale) = d.as_bigint_and_exponent();
            if !(-131_072..=16_383).contains(&scale) || d.digits() > 140_000 {
                return Err(format!(
                    "`{raw}` is outside the range of PostgreSQL numeric"
                ));
            }
            let f64v = raw.parse::<f64>().unwrap_or(f64::NAN);
            Ok(FieldValue {
                text: d.to_string(),
                cel: CelValue::Float(f64v),
            })
        }
        FieldType::Date => {
            if let Some(raw) = v.as_str().map(str::trim) {
                if let Some(d) = super::day::parse(raw) {
                    return Ok(s(super::day::text(d)));
                }
            }
            let ts = instant(f, v)?;
            Ok(s(super::day::text(
                ts.with_timezone(&f.time_zone).date_naive(),
            )))
        }
        FieldType::Timestamptz => Ok(s(super::day::rfc3339(instant(f, v)?))),
        FieldType::Boolean => {
            let b = match v {
                Value::Bool(b) => *b,
                Value::String(t) if t == "true" => true,
                Value::String(t) if t == "false" => false,
                _ => return Err(format!("expected a boolean, got {}", excerpt(v))),
            };
            Ok(FieldValue {
                text: b.to_string(),
                cel: CelValue::Bool(b),
            })
        }
        FieldType::Jsonb => {
            if holds_nul(v) {
                return Err("contains \\u0000, which PostgreSQL jsonb cannot store".into());
            }
            let text = v.to_string();
            Ok(FieldValue {
                text,
                cel: CelValue::Json(v.clone()),
            })
        }
    }
}

/// Whether a JSON value holds a NUL character in a string or an object key (PostgreSQL's jsonb refuses
/// `\u0000`; the six characters `\\u0000` — an escaped backslash before `u0000` — are an ordinary string).
fn holds_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(holds_nul),
        Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// The instant a `date` or `timestamptz` value names: an RFC 3339 timestamp, or an epoch number (a JSON number
/// or a numeric string, the same rule for both) in the field's `unit` that must fall within its
/// `plausible-range`. A leap second (`23:59:60`) is read as the second after it (`00:00:00` of the next minute),
/// as PostgreSQL and Unix time read it — for `date` and `timestamptz` fields alike.
fn instant(f: &FieldPlan, v: &Value) -> Result<DateTime<Utc>, String> {
    let raw = match v {
        Value::Number(n) => n.to_string(),
        Value::String(t) => t.trim().to_string(),
        _ => return Err(format!("expected a timestamp, got {}", excerpt(v))),
    };
    if !looks_numeric(&raw) {
        let ts = DateTime::parse_from_rfc3339(&raw).map_err(|_| {
            let what = if f.ty == FieldType::Date {
                "a date (YYYY-MM-DD), an RFC 3339 timestamp"
            } else {
                "an RFC 3339 timestamp"
            };
            format!(
                "{} is neither {what} nor an epoch number",
                excerpt(&Value::String(raw.clone()))
            )
        })?;
        let utc = ts.with_timezone(&Utc);
        let ns = utc.timestamp_subsec_nanos();
        return Ok(if ns >= 1_000_000_000 {
            DateTime::from_timestamp(utc.timestamp() + 1, ns - 1_000_000_000).unwrap_or(utc)
        } else {
            utc
        });
    }
    let at = |u: EpochUnit| {
        epoch_micros(&raw, u)
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .filter(|t| (f.plausible.0..=f.plausible.1).contains(&t.date_naive()))
    };
    if let Some(t) = at(f.unit) {
        return Ok(t);
    }
    let name = |u: EpochUnit| match u {
        EpochUnit::Seconds => "seconds",
        EpochUnit::Millis => "milliseconds",
        EpochUnit::Micros => "microseconds",
    };
    let read = match epoch_micros(&raw, f.unit) {
        Err(EpochError::TooFine) => {
            return Err(format!(
                "epoch number `{raw}` read as {} (unit = \"{}\") has non-zero digits finer than a microsecond \
                 (timestamps keep microseconds; it is not rounded)",
                name(f.unit),
                f.unit.as_str()
            ))
        }
        Ok(us) => match DateTime::from_timestamp_micros(us) {
            Some(t) => format!("is {}", t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            None => "is out of range".to_string(),
        },
        Err(EpochError::OutOfRange) => "is out of range".to_string(),
    };
    let fits: Vec<String> = EpochUnit::ALL
        .into_iter()
        .filter(|&u| u != f.unit)
        .filter_map(|u| {
            at(u).map(|t| {
                format!(
                    "likely unit: {} (unit = \"{}\" reads it as {})",
                    name(u),
                    u.as_str(),
                    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
                )
            })
        })
        .collect();
    let hint = if fits.is_empty() {
        "no unit (s, ms, us) gives a time in that range".to_string()
    } else {
        fits.join("; ")
    };
    Err(format!(
        "epoch number `{raw}` read as {} (unit = \"{}\") {read}, outside the plausible range {} .. {}; {hint}",
        name(f.unit),
        f.unit.as_str(),
        f.plausible.0,
        f.plausible.1
    ))
}

/// `-?digits(.digits)?`, optionally followed by an exponent (`e`/`E`, sign, digits): an epoch number written as
/// a JSON number or a string — Jackson, for one, writes a double `1782864000.5` as `1.7828640005E9`.
fn looks_numeric(raw: &str) -> bool {
    let (mantissa, exp) = match raw.find(['e', 'E']) {
        Some(i) => (&raw[..i], Some(&raw[i + 1..])),
        None => (raw, None),
    };
    let body = mantissa.strip_prefix('-').unwrap_or(mantissa);
    let (int, frac) = body.split_once('.').unwrap_or((body, "0"));
    let exp_ok = exp.is_none_or(|e| {
        let d = e.strip_prefix(['-', '+']).unwrap_or(e);
        !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
    });
    exp_ok
        && !int.is_empty()
        && !frac.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// Why an epoch number has no instant in a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochError {
    /// Beyond what a 64-bit microsecond count (or a timestamp) holds.
    OutOfRange,
    /// Non-zero digits finer than a microsecond.
    TooFine,
}

/// An epoch number (see [`looks_numeric`]) in `unit` as microseconds.
///
/// # Errors
/// [`EpochError::OutOfRange`] when it overflows, [`EpochError::TooFine`] when it has non-zero digits finer than
/// a microsecond.
fn epoch_micros(raw: &str, unit: EpochUnit) -> Result<i64, EpochError> {
    if !looks_numeric(raw) {
        return Err(EpochError::OutOfRange);
    }
    let expanded;
    let raw = if raw.contains(['e', 'E']) {
        // Exponent form: written out in plain digits (an exponent beyond ±40 is out of any range: no
        // 64-bit count of microseconds has more than 19 digits).
        let d = BigDecimal::from_str(raw).map_err(|_| EpochError::OutOfRange)?;
        let (digits, scale) = d.as_bigint_and_exponent();
        if !(-40..=40).contains(&scale) || digits.to_string().len() > 60 {
            return Err(EpochError::OutOfRange);
        }
        expanded = d.to_plain_string();
        expanded.as_str()
    } else {
        raw
    };
    let (neg, body) = match raw.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, raw),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let per = unit.micros();
    let digits = per.ilog10() as usize;
    let (kept, rest) = frac.split_at(frac.len().min(digits));
    if rest.bytes().any(|b| b != b'0') {
        return Err(EpochError::TooFine);
    }
    let mut fraction: i64 = 0;
    for i in 0..digits {
        let d = kept.as_bytes().get(i).map_or(0, |b| i64::from(b - b'0'));
        fraction = fraction * 10 + d;
    }
    let whole = int
        .parse::<i64>()
        .ok()
        .and_then(|w| w.checked_mul(per)?.checked_add(fraction))
        .ok_or(EpochError::OutOfRange)?;
    Ok(if neg { -whole } else { whole })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_in_jsonb_is_refused_and_the_six_characters_are_a_string() {
        let nul: Value = serde_json::from_str(r#"{"a": ["x\u0000"]}"#).unwrap();
        assert!(holds_nul(&nul));
        let key: Value = serde_json::from_str(r#"{"k\u0000": 1}"#).unwrap();
        assert!(holds_nul(&key));
        // The JSON text `"\\u0000"` is the string of the six characters \u0000, which jsonb stores.
        let six: Value =
            serde_json::from_str(r#"{"a": "\\u0000", "b": {"c": ["\\u0000"]}}"#).unwrap();
        assert_eq!(six["a"].as_str(), Some("\\u0000"));
        assert!(!holds_nul(&six));
    }

    #[test]
    fn lookup_finds_what_serde_json_pointer_finds() {
        let doc: Value = serde_json::from_str(
            r#"{"a": {"b": [10, {"c": 1}], "": 2, "x/y": 3, "t~u": 4}, "n": null, "01": 5}"#,
        )
        .unwrap();
        for p in [
            "",
            "/",
            "/a",
            "/a/b",
            "/a/b/0",
            "/a/b/1/c",
            "/a/b/01",
            "/a/b/+1",
            "/a/b/2",
            "/a/b/-1",
            "/a/",
            "/a/x~1y",
            "/a/t~0u",
            "/a/x/y",
            "/n",
            "/n/z",
            "/01",
            "a",
            "/missing/deeper",
        ] {
            assert_eq!(lookup(&doc, p), doc.pointer(p), "{p:?}");
        }
    }

    fn idx(p: &Pipeline, name: &str) -> usize {
        p.fields
            .iter()
            .position(|f| f.name.as_str() == name)
            .unwrap()
    }

    fn pipeline() -> Pipeline {
        crate::config::parse(
            "t.toml",
            r#"
[kafka]
group-id = "g"
topics = ["t"]
[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date", time-zone = "Europe/Berlin" }
amount = { path = "/data/amount", type = "numeric", optional = true }
n = { path = "/n", type = "bigint", optional = true }
[identity]
key = ["event_id"]
partition-by = "day"
"#,
        )
        .unwrap()
    }

    #[test]
    fn uuid_spellings_normalise_to_one_key() {
        let p = pipeline();
        let mut keys = Vec::new();
        for id in [
            "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
            "{3f2504e0-4f89-11d3-9a0c-0305e82c3301}",
            "3f2504e04f8911d39a0c0305e82c3301",
        ] {
            let v = format!(r#"{{"event_id":"{id}","occurred_at":"2024-04-25T00:00:00Z"}}"#);
            keys.push(
                decode(&p, Some(v.as_bytes())).unwrap()[idx(&p, "event_id")]
                    .clone()
                    .unwrap()
                    .text,
            );
        }
        assert!(
            keys.iter()
                .all(|k| k == "3f2504e0-4f89-11d3-9a0c-0305e82c3301"),
            "{keys:?}"
        );
        let bad = r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c330","occurred_at":"2024-04-25T00:00:00Z"}"#;
        assert_eq!(
            decode(&p, Some(bad.as_bytes())).unwrap_err().reason,
            Reason::InvalidField
        );
    }

    #[test]
    fn date_is_the_calendar_day_in_the_fields_zone() {
        let p = pipeline();
        let v = br#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301","occurred_at":"2024-04-25T22:30:00Z"}"#;
        let f = decode(&p, Some(v)).unwrap();
        // 22:30 UTC is 00:30 the next day in Berlin (CEST, UTC+2).
        assert_eq!(f[idx(&p, "day")].as_ref().unwrap().text, "2024-04-26");
    }

    #[test]
    fn numeric_is_exact_and_bad_values_are_rejected() {
        let p = pipeline();
        let v = br#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301","occurred_at":"2024-04-25","data":{"amount":"-12.3400000000000000001"}}"#;
        let f = decode(&p, Some(v)).unwrap();
        assert_eq!(f[idx(&p, "day")].as_ref().unwrap().text, "2024-04-25");
        assert_eq!(
            f[idx(&p, "amount")].as_ref().unwrap().text,
            "-12.3400000000000000001"
        );
        let bad = br#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301","occurred_at":"2024-04-25","data":{"amount":"12,5"}}"#;
        assert_eq!(
            decode(&p, Some(bad)).unwrap_err().reason,
            Reason::InvalidField
        );
    }

    #[test]
    fn unpaired_surrogates_are_named() {
        let p = pipeline();
        let lone = br#"{"event_id": "x", "name": "Dee \ud800"}"#;
        let r = decode(&p, Some(lone)).unwrap_err();
        assert_eq!(r.reason, Reason::InvalidJson);
        assert!(
            r.detail.contains("unpaired surrogate \\ud800"),
            "{}",
            r.detail
        );
        let trail = br#"{"name": "\udc00 x"}"#;
        assert!(decode(&p, Some(trail))
            .unwrap_err()
            .detail
            .contains("unpaired surrogate \\udc00"));
        // A pair is fine; an escaped backslash before `u` is text, not an escape.
        assert_eq!(unpaired_surrogate(br#""\ud83d\ude00""#), None);
        assert_eq!(unpaired_surrogate(br#""\\ud800""#), None);
        assert_eq!(
            unpaired_surrogate(br#""\ud800\u0041""#),
            Some(("\\ud800".into(), 1))
        );
    }

    #[test]
    fn null_truncated_and_missing_are_quarantined_with_reasons() {
        let p = pipeline();
        assert_eq!(decode(&p, None).unwrap_err().reason, Reason::NullValue);
        assert_eq!(
            decode(&p, Some(b"{\"event_id\": ")).unwrap_err().reason,
            Reason::InvalidJson
        );
        assert_eq!(
            decode(&p, Some(b"plain text")).unwrap_err().reason,
            Reason::InvalidJson
        );
        assert_eq!(
            decode(&p, Some(b"{\"occurred_at\":\"2024-04-25\"}"))
                .unwrap_err()
                .reason,
            Reason::MissingField
        );
    }

    fn temporal(unit: &str) -> Pipeline {
        crate::config::parse(
            "t.toml",
            &format!(
                r#"
[kafka]
group-id = "g"
topics = ["t"]
[fields]
id = {{ path = "/id", type = "text" }}
at = {{ path = "/t", type = "timestamptz"{unit} }}
day = {{ path = "/t", type = "date"{unit} }}
[identity]
key = ["id"]
"#
            ),
        )
        .unwrap()
    }

    fn at_and_day(p: &Pipeline, t: &str) -> Result<(String, String), Rejection> {
        let v = format!(r#"{{"id":"x","t":{t}}}"#);
        let f = decode(p, Some(v.as_bytes()))?;
        Ok((
            f[idx(p, "at")].clone().unwrap().text,
            f[idx(p, "day")].clone().unwrap().text,
        ))
    }

    #[test]
    fn epoch_numbers_follow_the_unit_and_numeric_strings_read_the_same() {
        let secs = temporal(", unit = \"s\"");
        for t in [
            "1782864000",
            "\"1782864000\"",
            "\" 1782864000 \"",
            "1782864000.0",
        ] {
            assert_eq!(
                at_and_day(&secs, t).unwrap(),
                ("2026-07-01T00:00:00Z".into(), "2026-07-01".into()),
                "{t}"
            );
        }
        assert_eq!(
            at_and_day(&secs, "1782864000.25").unwrap().0,
            "2026-07-01T00:00:00.250Z"
        );
        let ms = temporal("");
        for t in ["1782864000123", "\"1782864000123\""] {
            assert_eq!(
                at_and_day(&ms, t).unwrap(),
                ("2026-07-01T00:00:00.123Z".into(), "2026-07-01".into())
            );
        }
        let us = temporal(", unit = \"us\"");
        assert_eq!(
            at_and_day(&us, "\"1782864000123456\"").unwrap().0,
            "2026-07-01T00:00:00.123456Z"
        );
        // Finer than a microsecond: refused, not rounded, and said so (not "outside the plausible range").
        let r = at_and_day(&ms, "1782864000123.0004").unwrap_err();
        assert!(
            r.detail.contains("finer than a microsecond"),
            "{}",
            r.detail
        );
        assert!(!r.detail.contains("plausible"), "{}", r.detail);
        // Exponent notation (Jackson writes doubles so), as a number or a string, reads the same; a huge
        // exponent is out of range, quarantined, not expanded.
        for t in [
            "1.7828640005E9",
            "\"1.7828640005e9\"",
            "17828640005e-1",
            "1.7828640005e+9",
        ] {
            assert_eq!(
                at_and_day(&secs, t).unwrap(),
                ("2026-07-01T00:00:00.500Z".into(), "2026-07-01".into()),
                "{t}"
            );
        }
        for t in ["1e300", "\"1e-300\"", "1e999999999999"] {
            let r = at_and_day(&secs, t).unwrap_err();
            assert!(r.detail.contains("epoch number"), "{t}: {}", r.detail);
        }
    }

    #[test]
    fn implausible_epoch_numbers_are_quarantined_naming_field_and_likely_unit() {
        let ms = temporal("");
        for t in ["1782864000", "\"1782864000\""] {
            let r = at_and_day(&ms, t).unwrap_err();
            assert_eq!(r.reason, Reason::InvalidField);
            assert!(r.detail.contains("field `at` (/t)"), "{}", r.detail);
            assert!(r.detail.contains("1970-01-21"), "{}", r.detail);
            assert!(
                r.detail.contains("likely unit: seconds (unit = \"s\""),
                "{}",
                r.detail
            );
        }
        // A date field alone says the same (its own name).
        let p = crate::config::parse(
            "t.toml",
            r#"
[kafka]
group-id = "g"
topics = ["t"]
[fields]
id = { path = "/id", type = "text" }
day = { path = "/t", type = "date", plausible-range = ["2000-01-01", "2030-12-31"] }
[identity]
key = ["id"]
"#,
        )
        .unwrap();
        let r = decode(&p, Some(br#"{"id":"x","t":1782864000000000}"#)).unwrap_err();
        assert!(r.detail.contains("field `day` (/t)"), "{}", r.detail);
        assert!(
            r.detail.contains("likely unit: microseconds"),
            "{}",
            r.detail
        );
        let r = decode(&p, Some(br#"{"id":"x","t":"12"}"#)).unwrap_err();
        assert!(r.detail.contains("no unit (s, ms, us)"), "{}", r.detail);
        // Explicit dates and RFC 3339 text are not range-checked.
        assert!(decode(&p, Some(br#"{"id":"x","t":"1950-03-01"}"#)).is_ok());
        assert!(decode(&p, Some(br#"{"id":"x","t":"1950-03-01T10:00:00Z"}"#)).is_ok());
    }

    #[test]
    fn a_leap_second_is_the_next_second_for_date_and_timestamptz_alike() {
        let p = temporal("");
        assert_eq!(
            at_and_day(&p, "\"2016-12-31T23:59:60Z\"").unwrap(),
            ("2017-01-01T00:00:00Z".into(), "2017-01-01".into())
        );
        assert_eq!(
            at_and_day(&p, "\"2016-12-31T23:59:60.5Z\"").unwrap(),
            ("2017-01-01T00:00:00.500Z".into(), "2017-01-01".into())
        );
        assert_eq!(
            at_and_day(&p, "\"2016-12-31T23:59:59.999Z\"").unwrap(),
            ("2016-12-31T23:59:59.999Z".into(), "2016-12-31".into())
        );
    }
}
