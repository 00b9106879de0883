//! Debezium column values → PostgreSQL text input, driven by the Connect schema when the message has one and by
//! the projection column's type otherwise.
//!
//! Sources: Debezium PostgreSQL connector documentation, "Data type mappings" — `Decimal` is the unscaled value as
//! big-endian two's-complement bytes with the scale in the schema parameters (`decimal.handling.mode=precise`),
//! `VariableScaleDecimal` is `{scale, value}`, `io.debezium.time.Date` is days since the epoch,
//! `Timestamp`/`MicroTimestamp`/`NanoTimestamp` are ms/µs/ns since the epoch without a zone, `ZonedTimestamp` is
//! an ISO-8601 string, `Time`/`MicroTime`/`NanoTime` count since midnight; `bytes` are base64 in the JSON
//! converter. The output follows PostgreSQL's own output format where it matters for comparisons (timestamps
//! `YYYY-MM-DD HH:MM:SS.ffffff`, bytea `\x…`, arrays `{a,b}`).

use std::str::FromStr;

use base64::Engine;
use bigdecimal::BigDecimal;
use chrono::{DateTime, NaiveDate, NaiveTime};
use num_bigint::BigInt;
use serde_json::Value;

use super::types::{ColumnSpec, Kind, SqlType, Unit};
use crate::config::fields::DecimalHandling;
use crate::decode::debezium::envelope::{Cell, UNAVAILABLE, UNAVAILABLE_BASE64};

/// A converted value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pg {
    /// PostgreSQL input text.
    Text(String),
    /// SQL NULL.
    Null,
    /// Debezium's placeholder for an unchanged TOASTed value: keep what is stored.
    Unchanged,
    /// The column is not a member of the row image (dropped at the source, or never there) and the projection's
    /// `absent = "keep"`: keep what is stored; NULL for a row not stored yet. Unlike [`Pg::Unchanged`], never
    /// taken from an old key's row.
    Absent,
}

fn b64(s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| format!("`{}` is not base64: {e}", short(s)))
}

fn short(s: &str) -> String {
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s.to_string()
    }
}

fn is_placeholder(v: &Value) -> bool {
    match v {
        Value::String(s) => s == UNAVAILABLE || s == UNAVAILABLE_BASE64,
        Value::Array(a) => a.iter().any(is_placeholder),
        _ => false,
    }
}

/// Decimal text of an unscaled big-endian two's-complement integer and a scale.
pub fn decimal_from_bytes(bytes: &[u8], scale: i64) -> String {
    let unscaled = BigInt::from_signed_bytes_be(bytes);
    BigDecimal::new(unscaled, scale).to_string()
}

fn schema_name(s: Option<&Value>) -> Option<&str> {
    s.and_then(|s| s.get("name")).and_then(Value::as_str)
}

fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n
            .to_string()
            .parse::<i64>()
            .map_err(|_| format!("`{n}` is not a whole number")),
        Value::String(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("`{}` is not a whole number", short(s))),
        other => Err(format!("expected a whole number, got {other}")),
    }
}

/// pgjdbc's `PGStatement.DATE_POSITIVE_INFINITY` / `DATE_NEGATIVE_INFINITY`: what Debezium's PostgreSQL
/// connector writes for a timestamp `infinity` / `-infinity`, in every unit (`Timestamp`, `MicroTimestamp`,
/// `NanoTimestamp`; Debezium PostgreSQL connector documentation, "Temporal types").
const PG_INFINITY: i64 = 9_223_372_036_825_200_000;
const PG_NEG_INFINITY: i64 = -9_223_372_036_832_400_000;

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Days => "days",
        Unit::Millis => "milliseconds",
        Unit::Micros => "microseconds",
        Unit::Nanos => "nanoseconds",
    }
}

/// PostgreSQL's earliest `date` and `timestamp`: 4714-11-24 BC (astronomical year −4713; PostgreSQL
/// documentation, "Date/Time Types"). Its latest lie beyond what a count of days or epoch units reaches here.
fn earliest() -> NaiveDate {
    NaiveDate::from_ymd_opt(-4713, 11, 24).expect("a valid calendar date")
}

/// An epoch count in `unit` as PostgreSQL timestamp text (`YYYY-MM-DD HH:MM:SS[.f][ BC]`); Debezium's infinity
/// sentinels as `infinity` / `-infinity`.
///
/// # Errors
/// A message naming the value as it arrived and its unit when no PostgreSQL timestamp is that instant.
fn timestamp(n: i64, unit: Unit) -> Result<String, String> {
    if unit != Unit::Days {
        match n {
            PG_INFINITY => return Ok("infinity".into()),
            PG_NEG_INFINITY => return Ok("-infinity".into()),
            _ => {}
        }
    }
    let (secs, nanos) = match unit {
        Unit::Millis => (n.div_euclid(1_000), n.rem_euclid(1_000) * 1_000_000),
        Unit::Micros => (n.div_euclid(1_000_000), n.rem_euclid(1_000_000) * 1_000),
        Unit::Nanos => (n.div_euclid(1_000_000_000), n.rem_euclid(1_000_000_000)),
        Unit::Days => return date(n),
    };
    let t = DateTime::from_timestamp(secs, u32::try_from(nanos).expect("rem_euclid: 0..10^9"))
        .ok_or_else(|| {
            format!(
                "{n} ({} since 1970-01-01) is out of range for a timestamp",
                unit_name(unit)
            )
        })?
        .naive_utc();
    if t.date() < earliest() {
        return Err(format!(
            "{n} ({} since 1970-01-01) is {}, before PostgreSQL's earliest timestamp 4714-11-24 00:00:00 BC",
            unit_name(unit),
            crate::decode::day::timestamp_text(t)
        ));
    }
    Ok(crate::decode::day::timestamp_text(t))
}

/// A count since midnight in `unit` as PostgreSQL time text; exactly 24 hours is PostgreSQL's `24:00:00`.
///
/// # Errors
/// A message naming the value as it arrived and its unit when it is not a time of day (below 0, above 24 h).
fn time(n: i64, unit: Unit) -> Result<String, String> {
    let per = match unit {
        Unit::Millis => 1_000_000,
        Unit::Micros => 1_000,
        Unit::Nanos => 1,
        Unit::Days => return Err("a time is not counted in days".into()),
    };
    const DAY_NANOS: i64 = 86_400_000_000_000;
    let out_of_range = || {
        format!(
            "{n} ({} since midnight) is out of range for a time of day (00:00:00 to 24:00:00)",
            unit_name(unit)
        )
    };
    let nanos = n.checked_mul(per).ok_or_else(out_of_range)?;
    if nanos == DAY_NANOS {
        return Ok("24:00:00".into());
    }
    if !(0..DAY_NANOS).contains(&nanos) {
        return Err(out_of_range());
    }
    let t = NaiveTime::from_num_seconds_from_midnight_opt(
        u32::try_from(nanos / 1_000_000_000).expect("below 86 400, checked above"),
        u32::try_from(nanos % 1_000_000_000).expect("0..10^9: nanos is not negative"),
    )
    .ok_or_else(out_of_range)?;
    Ok(crate::decode::day::time_text(t))
}

/// What Debezium's PostgreSQL connector writes for a `date` `infinity` / `-infinity` (PostgreSQL's
/// `DATEVAL_NOEND` / `DATEVAL_NOBEGIN`, `INT_MAX` / `INT_MIN` days after 2000-01-01, shifted to the Unix epoch in
/// 32 bits: they wrap), as Debezium 3.6.1 writes them; far outside PostgreSQL's date range, so never a real date.
const PG_DATE_INFINITY: i64 = -2_147_472_692;
const PG_DATE_NEG_INFINITY: i64 = -2_147_472_691;

/// Days since 1970-01-01 as PostgreSQL date text (`YYYY-MM-DD[ BC]`); Debezium's infinity sentinels as
/// `infinity` / `-infinity`.
///
/// # Errors
/// A message naming the count as it arrived when no PostgreSQL date is that day.
fn date(days: i64) -> Result<String, String> {
    match days {
        PG_DATE_INFINITY => return Ok("infinity".into()),
        PG_DATE_NEG_INFINITY => return Ok("-infinity".into()),
        _ => {}
    }
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid calendar date");
    let day = chrono::Duration::try_days(days)
        .and_then(|d| epoch.checked_add_signed(d))
        .ok_or_else(|| format!("{days} (days since 1970-01-01) is out of range for a date"))?;
    if day < earliest() {
        return Err(format!(
            "{days} (days since 1970-01-01) is {}, before PostgreSQL's earliest date 4714-11-24 BC",
            crate::decode::day::text(day)
        ));
    }
    Ok(crate::decode::day::text(day))
}

fn default_unit(ty: &SqlType) -> Unit {
    match ty.kind {
        Kind::Date => Unit::Days,
        // time.precision.mode=adaptive: precision 0..=3 → milliseconds, 4..=6 (and none) → microseconds.
        Kind::Timestamp | Kind::Time | Kind::Timestamptz => match ty.precision {
            Some(p) if p <= 3 => Unit::Millis,
            _ => Unit::Micros,
        },
        _ => Unit::Micros,
    }
}

/// Array literal element quoting, as PostgreSQL's array output does it.
fn array_element(s: &str) -> String {
    let plain = !s.is_empty()
        && !s.eq_ignore_ascii_case("null")
        && !s
            .chars()
            .any(|c| matches!(c, '{' | '}' | ',' | '"' | '\\') || c.is_whitespace());
    if plain {
        s.to_string()
    } else {
        let mut out = String::from("\"");
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

/// Converts one scalar (non-array) value.
fn scalar(
    v: &Value,
    schema: Option<&Value>,
    kind: Kind,
    unit: Unit,
    scale: Option<u32>,
    dec: DecimalHandling,
) -> Result<String, String> {
    let name = schema_name(schema);
    // Logical types first: the schema says what the JSON value encodes.
    match name {
        Some("org.apache.kafka.connect.data.Decimal") => {
            let sc = schema
                .and_then(|s| s.pointer("/parameters/scale"))
                .and_then(|s| s.as_str().map(str::to_string).or(Some(s.to_string())))
                .and_then(|s| s.trim_matches('"').parse::<i64>().ok())
                .ok_or("Decimal schema without a `scale` parameter")?;
            return match v {
                Value::String(s) => Ok(decimal_from_bytes(&b64(s)?, sc)),
                Value::Number(n) => Ok(n.to_string()),
                other => Err(format!("Decimal value must be base64 bytes, got {other}")),
            };
        }
        Some("io.debezium.data.VariableScaleDecimal") => {
            let sc = v
                .get("scale")
                .map(int)
                .transpose()?
                .ok_or("VariableScaleDecimal without `scale`")?;
            let raw = v
                .get("value")
                .and_then(Value::as_str)
                .ok_or("VariableScaleDecimal without `value`")?;
            return Ok(decimal_from_bytes(&b64(raw)?, sc));
        }
        Some("io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => {
            return date(int(v)?)
        }
        Some("io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp") => {
            return timestamp(int(v)?, Unit::Millis)
        }
        Some("io.debezium.time.MicroTimestamp") => return timestamp(int(v)?, Unit::Micros),
        Some("io.debezium.time.NanoTimestamp") => return timestamp(int(v)?, Unit::Nanos),
        Some("io.debezium.time.Time" | "org.apache.kafka.connect.data.Time") => {
            return time(int(v)?, Unit::Millis)
        }
        Some("io.debezium.time.MicroTime") => return time(int(v)?, Unit::Micros),
        Some("io.debezium.time.NanoTime") => return time(int(v)?, Unit::Nanos),
        Some("io.debezium.time.MicroDuration") => return Ok(format!("{} microseconds", int(v)?)),
        _ => {}
    }
    let is_bytes = schema.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("bytes");
    match kind {
        Kind::Bytea => match v {
            Value::String(s) => Ok(format!("\\x{}", hex::encode(b64(s)?))),
            other => Err(format!("expected base64 bytes, got {other}")),
        },
        Kind::Numeric => match v {
            Value::Number(n) => Ok(n.to_string()),
            Value::String(s) => {
                let t = s.trim();
                let decimal = t
                    .chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
                    && BigDecimal::from_str(t).is_ok();
                // base64 of the unscaled integer (precise mode): a multiple of 4 characters that decodes.
                let bytes = t.len() % 4 == 0 && b64(t).is_ok();
                let precise = |sc: Option<u32>| {
                    match sc {
                    Some(sc) => Ok(decimal_from_bytes(&b64(t)?, i64::from(sc))),
                    None => Err(format!(
                        "`{}` is base64 decimal bytes (decimal.handling.mode=precise) but the scale is unknown: \
                         declare the column as numeric(p,s)",
                        short(s)
                    )),
                }
                };
                match dec {
                    _ if is_bytes => precise(scale),
                    DecimalHandling::Precise => precise(scale),
                    DecimalHandling::String | DecimalHandling::Double if decimal => Ok(t.to_string()),
                    DecimalHandling::String | DecimalHandling::Double => {
                        Err(format!("`{}` is not a decimal", short(s)))
                    }
                    DecimalHandling::Auto if decimal && bytes && scale.is_some() => Err(format!(
                        "`{}` is ambiguous without schemas: a decimal string or base64 decimal bytes; set \
                         [source] decimal-handling to the connector's decimal.handling.mode",
                        short(s)
                    )),
                    DecimalHandling::Auto if decimal => Ok(t.to_string()),
                    DecimalHandling::Auto if bytes => precise(scale),
                    DecimalHandling::Auto => Err(format!("`{}` is not a decimal", short(s))),
                }
            }
            Value::Object(o) if o.contains_key("scale") && o.contains_key("value") => {
                let sc = int(&o["scale"])?;
                let raw = o["value"]
                    .as_str()
                    .ok_or("variable-scale decimal without base64 `value`")?;
                Ok(decimal_from_bytes(&b64(raw)?, sc))
            }
            other => Err(format!("expected a decimal, got {other}")),
        },
        Kind::Date => match v {
            Value::Number(_) => date(int(v)?),
            Value::String(s) => Ok(crate::decode::day::iso_for_postgres(s).into_owned()),
            other => Err(format!("expected a date, got {other}")),
        },
        Kind::Timestamp | Kind::Timestamptz => match v {
            Value::Number(_) => timestamp(int(v)?, unit),
            // ZonedTimestamp / IsoTimestamp: Java's ISO text, signed years made PostgreSQL's.
            Value::String(s) => Ok(crate::decode::day::iso_for_postgres(s).into_owned()),
            other => Err(format!("expected a timestamp, got {other}")),
        },
        Kind::Time => match v {
            Value::Number(_) => time(int(v)?, unit),
            Value::String(s) => Ok(s.clone()),
            other => Err(format!("expected a time, got {other}")),
        },
        Kind::Interval => match v {
            // MicroDuration (interval.handling.mode=numeric, the default): microseconds.
            Value::Number(_) => Ok(format!("{} microseconds", int(v)?)),
            // interval.handling.mode=string: ISO 8601 (`P1DT2H`), which PostgreSQL reads as is.
            Value::String(s) => Ok(s.clone()),
            other => Err(format!("expected an interval, got {other}")),
        },
        Kind::Json => match v {
            Value::String(s) => Ok(s.clone()),
            other => Ok(other.to_string()),
        },
        Kind::Integer => Ok(int(v)?.to_string()),
        Kind::Boolean => match v {
            Value::Bool(b) => Ok(b.to_string()),
            other => Err(format!("expected a boolean, got {other}")),
        },
        Kind::Float | Kind::Uuid | Kind::Text => match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            other => Ok(other.to_string()),
        },
    }
}

/// Logs once per column name that an interval column receives Debezium's numeric interval
/// (`interval.handling.mode = numeric`, the default: `io.debezium.time.MicroDuration`, microseconds with a month
/// counted as 30.4375 days and a year as 365.25 days — Debezium PostgreSQL connector documentation, "Basic types"):
/// the microseconds are stored exactly, but months and years of the source value are not recoverable.
fn warn_numeric_interval(column: &str) {
    static WARNED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let mut w = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if w.insert(column.to_string()) {
        tracing::warn!(
            column,
            "interval column receives Debezium's numeric interval (interval.handling.mode = numeric): stored as \
             the exact microseconds it carries, but a source month arrives as 30.4375 days and a year as 365.25 \
             days (`1 mon` lands as 730:30:00); set interval.handling.mode = string on the connector (and \
             [source] interval-handling = \"string\") to keep months and years exactly"
        );
    }
}

/// Converts a cell of a Debezium row image for column `col`.
///
/// # Errors
/// A message naming what is wrong with the value (the record is then quarantined as `invalid-field`).
pub fn to_pg(cell: &Cell, col: &ColumnSpec, dec: DecimalHandling) -> Result<Pg, String> {
    if cell.value.is_null() {
        return Ok(Pg::Null);
    }
    if is_placeholder(&cell.value) {
        return Ok(Pg::Unchanged);
    }
    let unit = col.unit.unwrap_or_else(|| default_unit(&col.ty));
    let schema = cell.schema.as_deref();
    if col.ty.kind == Kind::Interval && cell.value.is_number() {
        warn_numeric_interval(col.name.as_str());
    }
    let text = if col.ty.array {
        let items = cell
            .value
            .as_array()
            .ok_or_else(|| format!("expected an array, got {}", cell.value))?;
        let item_schema = schema.and_then(|s| s.get("items"));
        let mut parts = Vec::with_capacity(items.len());
        for it in items {
            if it.is_null() {
                parts.push("NULL".to_string());
            } else {
                parts.push(array_element(&scalar(
                    it,
                    item_schema,
                    col.ty.kind,
                    unit,
                    col.ty.scale,
                    dec,
                )?));
            }
        }
        format!("{{{}}}", parts.join(","))
    } else {
        scalar(&cell.value, schema, col.ty.kind, unit, col.ty.scale, dec)?
    };
    if text.contains('\0') {
        return Err("contains a NUL character, which PostgreSQL text cannot store".into());
    }
    if !col.ty.array {
        fits(&text, &col.ty)?;
    }
    Ok(Pg::Text(text))
}

/// Whether a converted value fits the column's declared size, so that a source column retyped wider than the
/// projection's (int → bigint values in an `integer` column, numeric(12,2) → numeric(20,4), varchar(10) →
/// text) is quarantined with a reason naming the column instead of PostgreSQL's "value too long for type
/// character varying(5)" for the whole batch. PostgreSQL documentation, "Numeric Types" (a numeric(p,s) value
/// is rounded to s fractional digits and may then have at most p − s integer digits; integer ranges) and
/// "Character Types" (a longer value is an error unless the excess characters are all spaces).
///
/// # Errors
/// A message saying what does not fit.
pub fn fits(text: &str, ty: &SqlType) -> Result<(), String> {
    let base = ty.sql.split('(').next().unwrap_or("").trim();
    match ty.kind {
        Kind::Integer => {
            let n: i64 = text
                .parse()
                .map_err(|_| format!("`{}` is not a whole number", short(text)))?;
            let ok = match base {
                "smallint" | "int2" => i16::try_from(n).is_ok(),
                "integer" | "int" | "int4" => i32::try_from(n).is_ok(),
                _ => true,
            };
            if !ok {
                return Err(format!("{n} is out of range for {}", ty.sql));
            }
        }
        Kind::Numeric => {
            let (Some(p), Ok(v)) = (ty.precision, BigDecimal::from_str(text)) else {
                return Ok(());
            };
            let s = ty.scale.unwrap_or(0);
            if s > p {
                // PostgreSQL 15's numeric(p,s) with s > p (values below 10^(p-s)): left to PostgreSQL.
                return Ok(());
            }
            let r = v.with_scale_round(i64::from(s), bigdecimal::RoundingMode::HalfUp);
            let int = r.abs().with_scale(0);
            let digits = if int.sign() == num_bigint::Sign::NoSign {
                0
            } else {
                u32::try_from(int.to_string().len()).unwrap_or(u32::MAX)
            };
            if digits + s > p {
                return Err(format!(
                    "{} does not fit {} (at most {} digits before the point)",
                    short(text),
                    ty.sql,
                    p.saturating_sub(s)
                ));
            }
        }
        Kind::Text => {
            let sized = matches!(
                base,
                "varchar" | "character varying" | "char" | "character" | "bpchar"
            );
            if let (true, Some(n)) = (sized, ty.precision) {
                let len = text.trim_end_matches(' ').chars().count();
                if len > n as usize {
                    return Err(format!(
                        "a value of {len} characters does not fit {}",
                        ty.sql
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::Ident;

    fn col(ty: &str) -> ColumnSpec {
        ColumnSpec {
            name: Ident::new("c").unwrap(),
            ty: SqlType::parse(ty).unwrap(),
            unit: None,
            field: None,
        }
    }

    fn cell(v: Value, schema: Option<Value>) -> Cell {
        Cell {
            value: v,
            schema: schema.map(std::sync::Arc::new),
        }
    }

    #[test]
    fn decimal_bytes_are_signed_and_scaled() {
        let s = serde_json::json!({"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2"}});
        for (b, want) in [("AxY=", "7.90"), ("/5w=", "-1.00"), ("EtZ2", "12345.50")] {
            let got = to_pg(
                &cell(Value::String(b.into()), Some(s.clone())),
                &col("numeric"),
                DecimalHandling::Auto,
            )
            .unwrap();
            assert_eq!(got, Pg::Text(want.into()), "{b}");
        }
        // Without schemas: the scale comes from numeric(p,s); a string that is both a decimal and base64 needs the
        // connector's mode.
        let c = || cell(Value::String("1234".into()), None);
        assert!(to_pg(&c(), &col("numeric(12,2)"), DecimalHandling::Auto).is_err());
        assert_eq!(
            to_pg(&c(), &col("numeric(12,2)"), DecimalHandling::String).unwrap(),
            Pg::Text("1234".into())
        );
        assert_eq!(
            to_pg(&c(), &col("numeric(12,2)"), DecimalHandling::Precise).unwrap(),
            Pg::Text("-26588.24".into())
        );
        assert_eq!(
            to_pg(
                &cell(serde_json::json!(3600000000i64), None),
                &col("interval"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("3600000000 microseconds".into())
        );
        // Without schemas: the scale comes from numeric(p,s).
        let got = to_pg(
            &cell(Value::String("/5w=".into()), None),
            &col("numeric(12,2)"),
            DecimalHandling::Auto,
        )
        .unwrap();
        assert_eq!(got, Pg::Text("-1.00".into()));
    }

    #[test]
    fn temporal_units_follow_schema_or_column() {
        let micro = serde_json::json!({"type":"int64","name":"io.debezium.time.MicroTimestamp"});
        let v = serde_json::json!(1690366967048491i64);
        assert_eq!(
            to_pg(
                &cell(v.clone(), Some(micro)),
                &col("timestamp"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("2023-07-26 10:22:47.048491".into())
        );
        assert_eq!(
            to_pg(&cell(v, None), &col("timestamp(6)"), DecimalHandling::Auto).unwrap(),
            Pg::Text("2023-07-26 10:22:47.048491".into())
        );
        assert_eq!(
            to_pg(
                &cell(serde_json::json!(1690366967048i64), None),
                &col("timestamp(3)"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("2023-07-26 10:22:47.048".into())
        );
        assert_eq!(
            to_pg(
                &cell(serde_json::json!(20088), None),
                &col("date"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("2024-12-31".into())
        );
        assert_eq!(
            to_pg(
                &cell(serde_json::json!(45296500000i64), None),
                &col("time"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("12:34:56.5".into())
        );
    }

    /// Issue 34 item 4: every temporal value PostgreSQL holds converts from Debezium's numeric encodings to
    /// text PostgreSQL reads back as that value (year 1, 9999, BC, 24:00:00, infinity, µs); a value no
    /// PostgreSQL type holds is refused naming the value as it arrived and its unit.
    #[test]
    fn temporal_extremes_convert_or_name_the_value() {
        let named = |n: &str| serde_json::json!({"type": "int64", "name": n});
        let ok = |v: i64, schema: &str, ty: &str| {
            to_pg(
                &cell(serde_json::json!(v), Some(named(schema))),
                &col(ty),
                DecimalHandling::Auto,
            )
        };
        for (v, schema, ty, want) in [
            (2_932_896, "io.debezium.time.Date", "date", "9999-12-31"),
            (-719_162, "io.debezium.time.Date", "date", "0001-01-01"),
            (-719_163, "io.debezium.time.Date", "date", "0001-12-31 BC"),
            (-2_440_588, "io.debezium.time.Date", "date", "4714-11-24 BC"),
            (
                PG_DATE_INFINITY,
                "io.debezium.time.Date",
                "date",
                "infinity",
            ),
            (
                PG_DATE_NEG_INFINITY,
                "io.debezium.time.Date",
                "date",
                "-infinity",
            ),
            (
                86_400_000_000,
                "io.debezium.time.MicroTime",
                "time",
                "24:00:00",
            ),
            (
                86_399_999_999,
                "io.debezium.time.MicroTime",
                "time",
                "23:59:59.999999",
            ),
            (86_400_000, "io.debezium.time.Time", "time(3)", "24:00:00"),
            (0, "io.debezium.time.NanoTime", "time", "00:00:00"),
            (
                253_402_300_799_999_999,
                "io.debezium.time.MicroTimestamp",
                "timestamp",
                "9999-12-31 23:59:59.999999",
            ),
            (
                -62_135_596_800_000,
                "io.debezium.time.Timestamp",
                "timestamp(3)",
                "0001-01-01 00:00:00",
            ),
            (
                -62_167_219_200_000_000,
                "io.debezium.time.MicroTimestamp",
                "timestamp",
                "0001-01-01 00:00:00 BC",
            ),
            (
                253_402_300_800_000_000,
                "io.debezium.time.MicroTimestamp",
                "timestamp",
                "10000-01-01 00:00:00",
            ),
            (
                PG_INFINITY,
                "io.debezium.time.MicroTimestamp",
                "timestamp",
                "infinity",
            ),
            (
                PG_NEG_INFINITY,
                "io.debezium.time.Timestamp",
                "timestamp(3)",
                "-infinity",
            ),
        ] {
            assert_eq!(ok(v, schema, ty), Ok(Pg::Text(want.into())), "{v} {schema}");
        }
        for (v, schema, ty, needle) in [
            (
                -2_440_589,
                "io.debezium.time.Date",
                "date",
                "-2440589 (days since 1970-01-01) is 4714-11-23 BC, before",
            ),
            (
                86_400_000_001,
                "io.debezium.time.MicroTime",
                "time",
                "86400000001 (microseconds since midnight) is out of range",
            ),
            (
                -1,
                "io.debezium.time.Time",
                "time",
                "-1 (milliseconds since midnight)",
            ),
            (
                i64::MAX / 2,
                "io.debezium.time.Timestamp",
                "timestamp",
                "4611686018427387903 (milliseconds since 1970-01-01) is out of range",
            ),
            (
                i64::MAX / 2,
                "io.debezium.time.Date",
                "date",
                "4611686018427387903 (days since 1970-01-01) is out of range",
            ),
        ] {
            let e = ok(v, schema, ty).unwrap_err();
            assert!(e.contains(needle), "{v} {schema}: {e}");
        }
    }

    #[test]
    fn toast_placeholders_mean_unchanged() {
        for (v, ty) in [
            (serde_json::json!(UNAVAILABLE), "text"),
            (serde_json::json!([UNAVAILABLE]), "text[]"),
            (serde_json::json!(UNAVAILABLE_BASE64), "bytea"),
        ] {
            assert_eq!(
                to_pg(&cell(v, None), &col(ty), DecimalHandling::Auto).unwrap(),
                Pg::Unchanged
            );
        }
        assert_eq!(
            to_pg(
                &cell(serde_json::json!(["vip", "beta", "a b", null]), None),
                &col("text[]"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("{vip,beta,\"a b\",NULL}".into())
        );
        assert_eq!(
            to_pg(
                &cell(serde_json::json!("iVBORw0KGgo="), None),
                &col("bytea"),
                DecimalHandling::Auto
            )
            .unwrap(),
            Pg::Text("\\x89504e470d0a1a0a".into())
        );
    }
}
