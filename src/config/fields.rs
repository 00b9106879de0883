//! `[fields]`: the typed fields of a record (`FieldPlan`), how keys of the file name them, and the SQL
//! expressions over them shared by the ledger and the projections (delivery key, message key).

use std::collections::HashSet;

use cel_interpreter::Program;
use chrono::NaiveDate;
use chrono_tz::Tz;
use toml::Spanned;

use super::raw::RawField;
use super::source::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};

/// `[source] format`: how record values are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON events: `[fields]` are JSON pointers into the value.
    Json,
    /// Debezium change events (JSON converter, with or without `schemas.enable`): the delivery key is the
    /// source position, `[fields]` point into the unwrapped envelope, and `row` projections apply changes.
    Debezium,
}

/// `[source] decimal-handling`: how schemaless Debezium messages encode `numeric` (the connector's
/// `decimal.handling.mode`). With schemas enabled the Connect schema decides and this is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecimalHandling {
    /// Decide per value: a JSON number or a string that is a decimal and not valid base64 is a decimal; a
    /// string that is base64 and not a decimal is `precise` bytes; a string that is both (e.g. `"1234"`) is
    /// quarantined as ambiguous.
    Auto,
    /// `precise`: base64 of the unscaled two's-complement integer; the scale comes from `numeric(p,s)`.
    Precise,
    /// `string`: decimal strings.
    String,
    /// `double`: JSON numbers.
    Double,
}

/// `[source] interval-handling`: the connector's `interval.handling.mode` (Debezium PostgreSQL connector
/// documentation, "Basic types" / `interval.handling.mode`). Values are read the same way under both (a JSON
/// number is `io.debezium.time.MicroDuration` microseconds, a string an ISO 8601 duration); the mode tells
/// `check` whether interval columns receive the approximate numeric form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalHandling {
    /// `numeric` (Debezium's default): microseconds, with a month counted as 30.4375 days and a year as 365.25
    /// days — the months and years of the source value are not kept.
    Numeric,
    /// `string`: an ISO 8601 duration (`P1Y2M3DT4H5M6.78S`), exact.
    String,
}

/// Built-in fields of Debezium pipelines: `(name, type)`, read from the decoded envelope.
pub const CDC_FIELDS: [(&str, FieldType); 6] = [
    ("_source", FieldType::Text),
    ("_entity", FieldType::Text),
    ("_position", FieldType::Text),
    ("_op", FieldType::Text),
    ("_snapshot", FieldType::Boolean),
    ("_day", FieldType::Date),
];

/// The PostgreSQL type a field is extracted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// `uuid`, normalised (lower case, hyphenated; braces, `urn:uuid:` and the 32-digit form accepted).
    Uuid,
    /// `text`.
    Text,
    /// `bigint` (a JSON integer or a string of digits).
    Bigint,
    /// `numeric` (a JSON number or a decimal string, kept exactly).
    Numeric,
    /// `date` (`YYYY-MM-DD`, or the calendar day of an RFC 3339 timestamp in the field's time zone).
    Date,
    /// `timestamptz` (RFC 3339, or a number of milliseconds since the Unix epoch).
    Timestamptz,
    /// `boolean`.
    Boolean,
    /// `jsonb` (any JSON value).
    Jsonb,
}

impl FieldType {
    /// The PostgreSQL type name.
    pub fn sql(self) -> &'static str {
        match self {
            FieldType::Uuid => "uuid",
            FieldType::Text => "text",
            FieldType::Bigint => "bigint",
            FieldType::Numeric => "numeric",
            FieldType::Date => "date",
            FieldType::Timestamptz => "timestamptz",
            FieldType::Boolean => "boolean",
            FieldType::Jsonb => "jsonb",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "uuid" => FieldType::Uuid,
            "text" => FieldType::Text,
            "bigint" => FieldType::Bigint,
            "numeric" => FieldType::Numeric,
            "date" => FieldType::Date,
            "timestamptz" => FieldType::Timestamptz,
            "boolean" => FieldType::Boolean,
            "jsonb" => FieldType::Jsonb,
            _ => return None,
        })
    }
}

/// Unit of epoch numbers in `date` and `timestamptz` fields (`unit`): time since 1970-01-01T00:00:00Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochUnit {
    /// `s`: seconds.
    Seconds,
    /// `ms`: milliseconds (the default).
    Millis,
    /// `us`: microseconds.
    Micros,
}

impl EpochUnit {
    /// Every unit, coarsest first.
    pub const ALL: [EpochUnit; 3] = [EpochUnit::Seconds, EpochUnit::Millis, EpochUnit::Micros];

    /// The name used in the pipeline file: `s`, `ms` or `us`.
    pub fn as_str(self) -> &'static str {
        match self {
            EpochUnit::Seconds => "s",
            EpochUnit::Millis => "ms",
            EpochUnit::Micros => "us",
        }
    }

    /// Microseconds per unit.
    pub fn micros(self) -> i64 {
        match self {
            EpochUnit::Seconds => 1_000_000,
            EpochUnit::Millis => 1_000,
            EpochUnit::Micros => 1,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        EpochUnit::ALL.into_iter().find(|u| u.as_str() == s)
    }
}

/// Default `plausible-range` of `date`/`timestamptz` epoch numbers: 1990-01-01 to 2100-12-31.
pub fn default_plausible_range() -> (NaiveDate, NaiveDate) {
    (
        NaiveDate::from_ymd_opt(1990, 1, 1).expect("a valid calendar date"),
        NaiveDate::from_ymd_opt(2100, 12, 31).expect("a valid calendar date"),
    )
}

/// One typed column extracted from each record value.
#[derive(Debug, Clone)]
pub struct FieldPlan {
    /// Column name in `landed` (and in the ledger when it is part of the key or `ledger.columns`).
    pub name: Ident,
    /// RFC 6901 JSON pointer into the record value.
    pub pointer: String,
    /// The type.
    pub ty: FieldType,
    /// For `date` fields taken from a timestamp: the zone whose calendar day is taken (default UTC).
    pub time_zone: Tz,
    /// `date` and `timestamptz` fields: the unit of epoch numbers (JSON numbers and numeric strings).
    pub unit: EpochUnit,
    /// `date` and `timestamptz` fields: the first and last day (UTC, inclusive) an epoch number may fall on;
    /// outside, the record is quarantined as `invalid-field` naming the unit that would fit.
    pub plausible: (NaiveDate, NaiveDate),
    /// Missing or null is allowed (the column is NULL) instead of a quarantine.
    pub optional: bool,
}

pub(crate) fn ident(src: &Source, s: &Spanned<String>) -> Result<Ident> {
    Ident::new(s.get_ref()).map_err(|m| src.error(s.span(), m))
}

/// Validates a JSON pointer per RFC 6901: empty, or `/`-separated tokens where `~` is only `~0` or `~1`.
pub(crate) fn check_pointer(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Ok(());
    }
    if !p.starts_with('/') {
        return Err(format!("`{p}` is not a JSON pointer (RFC 6901): it must be empty or start with `/`, e.g. `/data/amount`"));
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "`{p}` is not a JSON pointer: `~` must be followed by 0 or 1 (RFC 6901 §3)"
            ));
        }
    }
    Ok(())
}

pub(crate) struct Fields<'a> {
    pub(crate) src: &'a Source,
    pub(crate) plans: Vec<FieldPlan>,
}

impl Fields<'_> {
    pub(crate) fn index(&self, s: &Spanned<String>) -> Result<usize> {
        self.plans
            .iter()
            .position(|f| f.name.as_str() == s.get_ref())
            .ok_or_else(|| {
                let known = self
                    .plans
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                self.src.error(
                    s.span(),
                    format!("unknown field `{}` (declared fields: {known})", s.get_ref()),
                )
            })
    }

    pub(crate) fn list(&self, v: &Spanned<Vec<Spanned<String>>>, what: &str) -> Result<Vec<usize>> {
        if v.get_ref().is_empty() {
            return Err(self
                .src
                .error(v.span(), format!("`{what}` must name at least one field")));
        }
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for s in v.get_ref() {
            let i = self.index(s)?;
            if !seen.insert(i) {
                return Err(self.src.error(
                    s.span(),
                    format!("field `{}` listed twice in `{what}`", s.get_ref()),
                ));
            }
            out.push(i);
        }
        Ok(out)
    }

    pub(crate) fn compile_cel(&self, s: &Spanned<String>) -> Result<Program> {
        compile_cel(&self.plans, s.get_ref()).map_err(|m| self.src.error(s.span(), m))
    }
}

/// Compiles a CEL expression and checks that every variable it reads is one of `fields`.
pub(crate) fn compile_cel(
    fields: &[FieldPlan],
    expr: &str,
) -> std::result::Result<Program, String> {
    if expr.trim().is_empty() {
        return Err("the CEL expression is empty".into());
    }
    // The CEL parser (antlr4rust) panics on some malformed input: `cel::compile` catches it silently and
    // says where the expression fails.
    let program = crate::cel::compile(expr).map_err(|e| format!("CEL expression {e}"))?;
    for var in program.references().variables() {
        if !fields.iter().any(|f| f.name.as_str() == var) {
            let known = fields
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(format!(
                "CEL expression refers to `{var}`, which is not a declared field (fields: {known})"
            ));
        }
    }
    Ok(program)
}

pub(crate) fn field_plan(
    src: &Source,
    name: &Spanned<String>,
    f: &Spanned<RawField>,
) -> Result<FieldPlan> {
    let name_ident = ident(src, name)?;
    if matches!(
        name_ident.as_str(),
        "generation" | "topic" | "partition" | "offset" | "consumer_group" | "landed_at"
    ) {
        return Err(src.error(
            name.span(),
            format!(
                "`{}` is reserved for the ledger's own columns; name the field differently",
                name_ident.as_str()
            ),
        ));
    }
    if name_ident.as_str().starts_with('_') {
        return Err(src.error(
            name.span(),
            "field names starting with `_` are reserved for replaysafe's own columns",
        ));
    }
    let raw = f.get_ref();
    check_pointer(raw.path.get_ref()).map_err(|m| src.error(raw.path.span(), m))?;
    let ty = FieldType::parse(raw.ty.get_ref()).ok_or_else(|| {
        src.error(
            raw.ty.span(),
            format!(
                "unknown type `{}`: expected one of uuid, text, bigint, numeric, date, timestamptz, boolean, jsonb",
                raw.ty.get_ref()
            ),
        )
    })?;
    let time_zone = match &raw.time_zone {
        None => Tz::UTC,
        Some(tz) => {
            if ty != FieldType::Date {
                return Err(src.error(tz.span(), "`time-zone` only applies to `date` fields"));
            }
            tz.get_ref().parse::<Tz>().map_err(|_| {
                src.error(
                    tz.span(),
                    format!(
                        "unknown time zone `{}` (use an IANA name such as Europe/Berlin)",
                        tz.get_ref()
                    ),
                )
            })?
        }
    };
    let temporal = matches!(ty, FieldType::Date | FieldType::Timestamptz);
    let unit = match &raw.unit {
        None => EpochUnit::Millis,
        Some(u) if !temporal => {
            return Err(src.error(
                u.span(),
                "`unit` only applies to `date` and `timestamptz` fields",
            ))
        }
        Some(u) => EpochUnit::parse(u.get_ref()).ok_or_else(|| {
            src.error(
                u.span(),
                format!(
                    "unknown unit `{}`: expected \"s\", \"ms\" or \"us\"",
                    u.get_ref()
                ),
            )
        })?,
    };
    let plausible = match &raw.plausible_range {
        None => default_plausible_range(),
        Some(r) if !temporal => {
            return Err(src.error(
                r.span(),
                "`plausible-range` only applies to `date` and `timestamptz` fields",
            ))
        }
        Some(r) => {
            let days = r
                .get_ref()
                .iter()
                .map(|d| {
                    NaiveDate::parse_from_str(d.get_ref(), "%Y-%m-%d").map_err(|_| {
                        src.error(
                            d.span(),
                            format!("`{}` is not a date (YYYY-MM-DD)", d.get_ref()),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            match days.as_slice() {
                [a, b] if a <= b => (*a, *b),
                _ => {
                    return Err(src.error(
                        r.span(),
                        "`plausible-range` must be two dates, first ≤ last, e.g. [\"1990-01-01\", \"2100-12-31\"]",
                    ))
                }
            }
        }
    };
    Ok(FieldPlan {
        name: name_ident,
        pointer: raw.path.get_ref().clone(),
        ty,
        time_zone,
        unit,
        plausible,
        optional: raw.optional,
    })
}

/// SQL over `landed`: the delivery key of a row as text — a JSON array (PostgreSQL's `json` text) of the
/// generation (`""` for none), the `[identity] key` fields as text, then the `partition-by` day when it is not a
/// key field. The outbox's `delivery_key` and a resolved dead letter's `resolved_by` hold it.
pub fn delivery_key_sql(
    fields: &[FieldPlan],
    key: &[usize],
    partition_by: Option<usize>,
) -> String {
    let mut dk: Vec<String> = vec!["_generation".into()];
    dk.extend(key.iter().map(|&i| session_free_text(&fields[i])));
    if let Some(pb) = partition_by {
        if !key.contains(&pb) {
            dk.push(session_free_text(&fields[pb]));
        }
    }
    format!("json_build_array({})::text", dk.join(", "))
}

/// SQL text of a field's value that does not depend on the session's `DateStyle` or `TimeZone` (a database or
/// role default, `PGOPTIONS`): a date as `YYYY-MM-DD`, a timestamptz as PostgreSQL's ISO output in UTC
/// (`2026-07-01 00:00:00.5+00`) — what `::text` gives under the defaults (ISO, UTC), so delivery keys keep
/// their spelling; other types print the same under any setting.
fn session_free_text(f: &FieldPlan) -> String {
    let n = &f.name;
    match f.ty {
        FieldType::Date => format!("to_char({n}, 'YYYY-MM-DD')"),
        FieldType::Timestamptz => format!(
            "(rtrim(rtrim(to_char({n} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), '0'), '.') || '+00')"
        ),
        _ => format!("{n}::text"),
    }
}

/// SQL over `landed`: an outbox message key — a JSON array with one element per `key` field, in `key` order:
/// the value's canonical text as a JSON string, or `null` for a missing optional field, as PostgreSQL's `json`
/// text prints it (`["eu", null]`: elements separated by `, `, strings JSON-escaped, non-ASCII kept as UTF-8).
/// Canonical text, independent of session settings: text as is; uuid lower-case hyphenated; bigint and numeric
/// in PostgreSQL's output (numeric keeps its scale); boolean `true`/`false`; date `YYYY-MM-DD`; timestamptz
/// `YYYY-MM-DDTHH:MI:SS.ffffffZ` in UTC (always six fraction digits); jsonb PostgreSQL's jsonb text. This
/// encoding is part of replaysafe's interface (docs/reference.md "Tables"): changing it would re-key every consumer.
pub fn message_key_sql(fields: &[FieldPlan], key: &[usize]) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|&i| {
            let n = &fields[i].name;
            match fields[i].ty {
                FieldType::Text => n.to_string(),
                FieldType::Date => format!("to_char({n}, 'YYYY-MM-DD')"),
                FieldType::Timestamptz => {
                    format!("to_char({n} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
                }
                _ => format!("{n}::text"),
            }
        })
        .collect();
    format!("json_build_array({})::text", parts.join(", "))
}

pub(crate) fn table_name(
    src: &Source,
    schema: &Ident,
    t: &Spanned<String>,
) -> Result<QualifiedName> {
    // `schema.table` or `table` (in the pipeline schema).
    let parts: Vec<&str> = t.get_ref().split('.').collect();
    let err = |m: String| src.error(t.span(), m);
    match parts.as_slice() {
        [name] => Ok(QualifiedName {
            schema: schema.clone(),
            name: Ident::new(name).map_err(err)?,
        }),
        [s, name] => Ok(QualifiedName {
            schema: Ident::new(s).map_err(err)?,
            name: Ident::new(name).map_err(&err)?,
        }),
        _ => Err(err(format!(
            "`{}` is not a table name (`table` or `schema.table`)",
            t.get_ref()
        ))),
    }
}

/// A field's definition as compared by the ledger check: path, type, and what changes its values.
pub(crate) fn field_definition(f: &FieldPlan) -> String {
    let mut d = format!("path {} type {}", f.pointer, f.ty.sql());
    if matches!(f.ty, FieldType::Date | FieldType::Timestamptz) {
        d.push_str(&format!(
            " unit {} plausible-range {}..{}",
            f.unit.as_str(),
            f.plausible.0,
            f.plausible.1
        ));
    }
    if f.ty == FieldType::Date {
        d.push_str(&format!(" time-zone {}", f.time_zone.name()));
    }
    if f.optional {
        d.push_str(" optional");
    }
    d
}

/// The pipeline fields a CEL program reads, by name.
pub(crate) fn cel_fields(program: &Program, fields: &[FieldPlan]) -> Vec<String> {
    program
        .references()
        .variables()
        .iter()
        .filter_map(|v| fields.iter().find(|f| f.name.as_str() == *v))
        .map(|f| f.name.as_str().to_string())
        .collect()
}
