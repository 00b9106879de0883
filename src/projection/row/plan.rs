//! `[[projection]] kind = "row"`: a version-guarded row-state projection (a table keyed by the entity's primary
//! key, holding the newest state seen), with tombstones for deletes and a conflict record for equal versions
//! with different payloads.

use cel_interpreter::Program;
use toml::Spanned;

use crate::config::fields::{cel_fields, table_name, FieldPlan, FieldType, Format};
use crate::config::raw::RawProjection;
use crate::config::source::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};
use crate::projection::kind::{Ctx, Settings};

/// How a column's values are read and written: the PostgreSQL type (validated text used in DDL and casts) and
/// what family of values it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlType {
    /// The type as written in SQL, e.g. `numeric(12,2)`, `timestamp(3)`, `text[]`.
    pub sql: String,
    /// The value family of the type (of the element type for arrays).
    pub kind: Kind,
    /// Whether it is a one-dimensional array of `kind`.
    pub array: bool,
    /// The type modifier's first number (precision of `timestamp(p)`/`time(p)`, `numeric(p,s)`), if any.
    pub precision: Option<u32>,
    /// The scale of `numeric(p,s)`, if any.
    pub scale: Option<u32>,
}

/// Families of PostgreSQL types, by how a Debezium value is converted to their text input form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// smallint, integer, bigint.
    Integer,
    /// real, double precision.
    Float,
    /// numeric / decimal.
    Numeric,
    /// boolean.
    Boolean,
    /// text, varchar, char, citext, and anything else taken as text.
    Text,
    /// date.
    Date,
    /// timestamp without time zone.
    Timestamp,
    /// timestamptz.
    Timestamptz,
    /// time without time zone.
    Time,
    /// json / jsonb.
    Json,
    /// uuid.
    Uuid,
    /// bytea.
    Bytea,
    /// interval (Debezium `MicroDuration` µs, or an ISO 8601 string with `interval.handling.mode=string`).
    Interval,
}

impl SqlType {
    /// Parses a type name as PostgreSQL's `format_type()` prints it (or as a user writes it in the pipeline file).
    ///
    /// # Errors
    /// A message when the text is not a plain type name with an optional `(p[,s])` modifier and `[]`.
    pub fn parse(raw: &str) -> std::result::Result<SqlType, String> {
        let t = raw.trim().to_ascii_lowercase();
        let (base, array) = match t.strip_suffix("[]") {
            Some(b) => (b.trim().to_string(), true),
            None => (t.clone(), false),
        };
        // `name(p[,s]) [tail]`, e.g. format_type's `timestamp(3) with time zone`.
        let (name, modifier, tail) = match (base.find('('), base.find(')')) {
            (Some(i), Some(j)) if j > i => (
                base[..i].trim().to_string(),
                Some(base[i + 1..j].to_string()),
                base[j + 1..].trim().to_string(),
            ),
            (None, None) => (base.clone(), None, String::new()),
            _ => return Err(format!("`{raw}` is not a type name")),
        };
        let full = if tail.is_empty() {
            name.clone()
        } else {
            format!("{name} {tail}")
        };
        if !full
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == ' ' || c == '_')
            || full.is_empty()
        {
            return Err(format!("`{raw}` is not a type name"));
        }
        let nums: Vec<u32> = match &modifier {
            None => Vec::new(),
            Some(m) => m
                .split(',')
                .map(|n| n.trim().parse::<u32>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| format!("`{raw}`: the type modifier must be numbers"))?,
        };
        let kind = match full.as_str() {
            "smallint" | "integer" | "int" | "int2" | "int4" | "int8" | "bigint" => Kind::Integer,
            "real" | "float4" | "float8" | "double precision" => Kind::Float,
            "numeric" | "decimal" => Kind::Numeric,
            "boolean" | "bool" => Kind::Boolean,
            "date" => Kind::Date,
            "timestamp" | "timestamp without time zone" => Kind::Timestamp,
            "timestamptz" | "timestamp with time zone" => Kind::Timestamptz,
            "time" | "time without time zone" => Kind::Time,
            "json" | "jsonb" => Kind::Json,
            "uuid" => Kind::Uuid,
            "bytea" => Kind::Bytea,
            "interval" => Kind::Interval,
            "text"
            | "varchar"
            | "character varying"
            | "character"
            | "char"
            | "bpchar"
            | "citext"
            | "name"
            | "inet"
            | "cidr"
            | "macaddr"
            | "money"
            | "xml"
            | "timetz"
            | "time with time zone"
            | "bit"
            | "bit varying"
            | "varbit" => Kind::Text,
            other => return Err(format!("unsupported column type `{other}`")),
        };
        let bad_modifier = match kind {
            Kind::Numeric => {
                nums.len() > 2
                    || nums.first().is_some_and(|p| !(1..=1000).contains(p))
                    || matches!((nums.first(), nums.get(1)), (Some(p), Some(s)) if s > p)
            }
            Kind::Timestamp | Kind::Timestamptz | Kind::Time | Kind::Interval => {
                nums.len() > 1 || nums.first().is_some_and(|p| *p > 6)
            }
            Kind::Text => {
                nums.len() > 1 || nums.first().is_some_and(|n| !(1..=10_485_760).contains(n))
            }
            _ => !nums.is_empty(),
        };
        if bad_modifier {
            return Err(format!("`{raw}`: invalid type modifier"));
        }
        Ok(SqlType {
            sql: t,
            kind,
            array,
            precision: nums.first().copied(),
            scale: nums.get(1).copied(),
        })
    }
}

/// Unit of an integer temporal value in a schemaless Debezium message (with schemas the Connect schema name
/// says it: `io.debezium.time.MicroTimestamp` is µs, `Timestamp` ms, `NanoTimestamp` ns, `Date` days).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Days since 1970-01-01 (dates).
    Days,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
    /// Nanoseconds.
    Nanos,
}

/// One column of a row projection.
#[derive(Debug, Clone)]
pub struct ColumnSpec {
    /// Column name.
    pub name: Ident,
    /// Its type.
    pub ty: SqlType,
    /// Unit of integer temporal values in schemaless messages; default: from the type (date: days;
    /// `timestamp(p)`/`time(p)` with p ≤ 3: ms, otherwise µs — Debezium's `time.precision.mode=adaptive`).
    pub unit: Option<Unit>,
    /// JSON mode: the field this column is taken from.
    pub field: Option<usize>,
}

/// What orders changes to one entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPlan {
    /// Debezium's source position `(commit LSN, change LSN)` from `source.sequence` (or `source.lsn`).
    SourcePosition,
    /// A bigint field of a JSON event (index into the pipeline's fields).
    Field(usize),
    /// A whole-number column of the Debezium row image (e.g. a `version` column).
    Column(Ident),
}

/// Where deletes leave their versioned tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TombstoneMode {
    /// A side table `<table>_tombstones (key…, _version, _deleted_at)`; the projection holds live rows only.
    Table,
    /// A `_deleted_at` column in the projection; a deleted row stays with its last values.
    Column,
}

/// What a Debezium truncate (`op = t`) does to the projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TruncatePolicy {
    /// Stop with an error naming topic/partition/offset (nothing of the batch is committed).
    Stop,
    /// Delete every row older than the truncate (leaving tombstones), in the batch transaction.
    Truncate,
    /// Count the record as applied and leave the projection alone.
    Ignore,
}

/// A compiled `kind = "row"` projection.
pub struct RowPlan {
    /// The projection table.
    pub table: QualifiedName,
    /// The tombstone side table (`<table>_tombstones`), used when `tombstones = "table"`.
    pub tombstone_table: QualifiedName,
    /// Debezium: the source table `schema.table` whose changes this projection takes (default: a source table
    /// with the projection table's name).
    pub source_table: Option<String>,
    /// Primary-key columns; empty means "the table's primary key" (read from the catalog at start-up).
    pub key: Vec<Ident>,
    /// The columns; `None` means "every column of the existing table" (read from the catalog at start-up).
    pub columns: Option<Vec<ColumnSpec>>,
    /// What orders changes.
    pub version: VersionPlan,
    /// JSON mode: CEL expression saying the event deletes the entity.
    pub delete_if: Option<(String, Program)>,
    /// Where tombstones live.
    pub tombstones: TombstoneMode,
    /// Truncate policy.
    pub truncate: TruncatePolicy,
}

impl std::fmt::Debug for RowPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowPlan")
            .field("table", &self.table)
            .field("key", &self.key)
            .field("version", &self.version)
            .finish()
    }
}

fn unit(src: &Source, s: &Spanned<String>) -> Result<Unit> {
    Ok(match s.get_ref().as_str() {
        "days" => Unit::Days,
        "ms" => Unit::Millis,
        "us" => Unit::Micros,
        "ns" => Unit::Nanos,
        other => {
            return Err(src.error(
                s.span(),
                format!("unknown unit `{other}`: expected days, ms, us or ns"),
            ))
        }
    })
}

/// Compiles a row projection (the `table` is already resolved).
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn compile(
    src: &Source,
    format: Format,
    fields: &[FieldPlan],
    field_index: &dyn Fn(&Spanned<String>) -> Result<usize>,
    compile_cel: &dyn Fn(&Spanned<String>) -> Result<Program>,
    p: &Spanned<RawProjection>,
    table: QualifiedName,
) -> Result<RowPlan> {
    let rp = p.get_ref();
    let tomb_name = format!("{}_tombstones", table.name.as_str());
    if tomb_name.len() > 63 {
        return Err(src.error(
            p.span(),
            "row projection table names must be at most 52 bytes (tombstones live in `<table>_tombstones`)",
        ));
    }
    let tombstone_table = QualifiedName {
        schema: table.schema.clone(),
        name: Ident::new(&tomb_name).expect("valid"),
    };
    let json = format == Format::Json;
    let key = key(src, json, fields, field_index, p)?;
    let columns = match &rp.columns {
        None if json => Some(
            fields
                .iter()
                .enumerate()
                .filter(|(_, f)| !f.name.as_str().starts_with('_'))
                .map(|(i, f)| ColumnSpec {
                    name: f.name.clone(),
                    ty: SqlType::parse(f.ty.sql()).expect("field types are SQL types"),
                    unit: None,
                    field: Some(i),
                })
                .collect(),
        ),
        None => None,
        Some(c) => Some(columns(src, json, fields, field_index, c)?),
    };
    check_columns(src, p, &key, &columns)?;
    let version = version(src, json, fields, field_index, p, &columns)?;
    let delete_if = match &rp.delete_if {
        Some(d) if json => Some((d.get_ref().clone(), compile_cel(d)?)),
        Some(d) => {
            return Err(src.error(
                d.span(),
                "`delete-if` applies to JSON events; Debezium deletes are `op = d`",
            ))
        }
        None => None,
    };
    let (tombstones, truncate) = modes(src, rp)?;
    let source_table = source_table(src, json, rp)?;
    Ok(RowPlan {
        table,
        tombstone_table,
        source_table,
        key,
        columns,
        version,
        delete_if,
        tombstones,
        truncate,
    })
}

/// `key`: the entity's key columns (JSON: non-optional, non-jsonb fields), each once; required over JSON events.
fn key(
    src: &Source,
    json: bool,
    fields: &[FieldPlan],
    field_index: &dyn Fn(&Spanned<String>) -> Result<usize>,
    p: &Spanned<RawProjection>,
) -> Result<Vec<Ident>> {
    let rp = p.get_ref();
    let mut key = Vec::new();
    if let Some(k) = &rp.key {
        for s in k.get_ref() {
            let id = Ident::new(s.get_ref()).map_err(|m| src.error(s.span(), m))?;
            if json {
                let i = field_index(s)?;
                if fields[i].optional || fields[i].ty == FieldType::Jsonb {
                    return Err(src.error(
                        s.span(),
                        format!(
                            "row key field `{}` must be a non-optional, non-jsonb field",
                            s.get_ref()
                        ),
                    ));
                }
            }
            if key.contains(&id) {
                return Err(src.error(s.span(), format!("`{}` listed twice in `key`", s.get_ref())));
            }
            key.push(id);
        }
    }
    if json && key.is_empty() {
        return Err(src.error(
            p.span(),
            "a `row` projection over JSON events needs `key` (the entity's fields)",
        ));
    }
    Ok(key)
}

/// The key columns are among `columns`; no column name starts with `_` (reserved).
fn check_columns(
    src: &Source,
    p: &Spanned<RawProjection>,
    key: &[Ident],
    columns: &Option<Vec<ColumnSpec>>,
) -> Result<()> {
    let rp = p.get_ref();
    if let Some(cols) = &columns {
        for k in key {
            if !cols.iter().any(|c| &c.name == k) {
                return Err(src.error(
                    rp.key.as_ref().map(|k| k.span()).unwrap_or(p.span()),
                    format!("key column `{}` is not one of `columns`", k.as_str()),
                ));
            }
        }
        if cols.iter().any(|c| c.name.as_str().starts_with('_')) {
            return Err(src.error(
                p.span(),
                "row projection column names starting with `_` are reserved (_version, _sha256, _delivery, _updated_at, _deleted_at)",
            ));
        }
    }
    Ok(())
}

/// `version`: JSON events name a non-optional bigint field; Debezium a column of `columns` or
/// `source-position` (the default).
fn version(
    src: &Source,
    json: bool,
    fields: &[FieldPlan],
    field_index: &dyn Fn(&Spanned<String>) -> Result<usize>,
    p: &Spanned<RawProjection>,
    columns: &Option<Vec<ColumnSpec>>,
) -> Result<VersionPlan> {
    let rp = p.get_ref();
    if let (Some(v), Some(cols)) = (&rp.version, columns) {
        if !json
            && v.get_ref() != "source-position"
            && !cols.iter().any(|c| c.name.as_str() == v.get_ref())
        {
            return Err(src.error(
                v.span(),
                format!("version column `{}` is not one of `columns`", v.get_ref()),
            ));
        }
    }
    Ok(match &rp.version {
        None if json => {
            return Err(src.error(
                p.span(),
                "a `row` projection over JSON events needs `version` (a bigint field that orders the entity's events)",
            ))
        }
        None => VersionPlan::SourcePosition,
        Some(v) if !json && v.get_ref() == "source-position" => VersionPlan::SourcePosition,
        Some(v) if json => {
            let i = field_index(v)?;
            if fields[i].ty != FieldType::Bigint || fields[i].optional {
                return Err(src.error(
                    v.span(),
                    format!("`version` must name a non-optional bigint field; `{}` is not", v.get_ref()),
                ));
            }
            VersionPlan::Field(i)
        }
        Some(v) => VersionPlan::Column(Ident::new(v.get_ref()).map_err(|m| src.error(v.span(), m))?),
    })
}

/// `tombstones` (table or column) and `truncate` (stop, truncate or ignore).
fn modes(src: &Source, rp: &RawProjection) -> Result<(TombstoneMode, TruncatePolicy)> {
    let tombstones = match rp.tombstones.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None | Some((_, "table")) => TombstoneMode::Table,
        Some((_, "column")) => TombstoneMode::Column,
        Some((t, other)) => {
            return Err(src.error(
                t.span(),
                format!("`tombstones` must be \"table\" or \"column\", not `{other}`"),
            ))
        }
    };
    let truncate = match rp.truncate.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None | Some((_, "stop")) => TruncatePolicy::Stop,
        Some((_, "truncate")) => TruncatePolicy::Truncate,
        Some((_, "ignore")) => TruncatePolicy::Ignore,
        Some((t, other)) => {
            return Err(src.error(
                t.span(),
                format!("`truncate` must be \"stop\", \"truncate\" or \"ignore\", not `{other}`"),
            ))
        }
    };
    Ok((tombstones, truncate))
}

/// `source-table` (Debezium only): `schema.table` as in Debezium's source block.
fn source_table(src: &Source, json: bool, rp: &RawProjection) -> Result<Option<String>> {
    Ok(match &rp.source_table {
        Some(s) if json => {
            return Err(src.error(s.span(), "`source-table` applies to Debezium pipelines"))
        }
        Some(s) => {
            let parts: Vec<&str> = s.get_ref().split('.').collect();
            if parts.len() != 2 || parts.iter().any(|x| x.is_empty()) {
                return Err(src.error(
                    s.span(),
                    "`source-table` is `schema.table` as in Debezium's source block",
                ));
            }
            Some(s.get_ref().clone())
        }
        None => None,
    })
}

fn columns(
    src: &Source,
    json: bool,
    fields: &[FieldPlan],
    field_index: &dyn Fn(&Spanned<String>) -> Result<usize>,
    c: &Spanned<toml::Value>,
) -> Result<Vec<ColumnSpec>> {
    let bad = |m: &str| src.error(c.span(), m.to_string());
    let mut out: Vec<ColumnSpec> = Vec::new();
    match c.get_ref() {
        toml::Value::Array(items) if json => {
            for item in items {
                let name = item
                    .as_str()
                    .ok_or_else(|| bad("`columns` lists field names"))?;
                let spanned = Spanned::new(c.span(), name.to_string());
                let i = field_index(&spanned)?;
                out.push(ColumnSpec {
                    name: fields[i].name.clone(),
                    ty: SqlType::parse(fields[i].ty.sql()).expect("field types are SQL types"),
                    unit: None,
                    field: Some(i),
                });
            }
        }
        toml::Value::Table(t) if !json => {
            // In file order (toml's `preserve_order`): the table is created with its columns in this order.
            for (name, spec) in t {
                let id = Ident::new(name).map_err(|m| bad(&format!("column `{name}`: {m}")))?;
                let (ty, unit_s) = match spec {
                    toml::Value::String(s) => (s.clone(), None),
                    toml::Value::Table(st) => {
                        for k in st.keys() {
                            if k != "type" && k != "unit" {
                                return Err(bad(&format!("column `{name}`: unknown key `{k}` (type, unit)")));
                            }
                        }
                        let ty = st
                            .get("type")
                            .and_then(|v| v.as_str())
                            .ok_or_else(|| bad(&format!("column `{name}` needs `type`")))?;
                        (ty.to_string(), st.get("unit").and_then(|u| u.as_str()).map(str::to_string))
                    }
                    _ => return Err(bad(&format!("column `{name}`: a type string or {{ type, unit }}"))),
                };
                let ty = SqlType::parse(&ty).map_err(|m| bad(&format!("column `{name}`: {m}")))?;
                let unit = match unit_s {
                    None => None,
                    Some(u) => Some(unit(src, &Spanned::new(c.span(), u))?),
                };
                out.push(ColumnSpec {
                    name: id,
                    ty,
                    unit,
                    field: None,
                });
            }
        }
        _ if json => return Err(bad("`columns` of a row projection over JSON events is a list of field names")),
        _ => {
            return Err(bad(
                "`columns` of a Debezium row projection maps column names to types, e.g. { id = \"bigint\", balance = \"numeric(12,2)\" }",
            ))
        }
    }
    if out.is_empty() {
        return Err(bad("`columns` must name at least one column"));
    }
    Ok(out)
}

/// The keys a row projection takes.
pub(crate) const KEYS: &[&str] = &[
    "table",
    "key",
    "columns",
    "version",
    "delete-if",
    "tombstones",
    "truncate",
    "source-table",
];

/// Checks a row projection's `table` and compiles the rest of its keys ([`compile`]).
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
pub(crate) fn compile_entry(ctx: &Ctx<'_>) -> Result<RowPlan> {
    let table_s = ctx.need(ctx.raw().table.as_ref(), "table")?;
    let table = table_name(ctx.src, ctx.schema, &table_s)?;
    compile(
        ctx.src,
        ctx.format,
        &ctx.fields.plans,
        &|s| ctx.fields.index(s),
        &|s| ctx.fields.compile_cel(s),
        ctx.p,
        table,
    )
}

/// Records a row projection's keys, resolved (and marks the fields its columns, version and `delete-if` read).
pub(crate) fn settings(s: &mut Settings<'_>, r: &RowPlan) {
    let fields = s.fields;
    s.put("table", r.table.to_string());
    s.put(
        "key",
        r.key
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.put(
        "columns",
        match &r.columns {
            None => "(the existing table's)".to_string(),
            Some(cols) => cols
                .iter()
                .map(|c| {
                    let unit = c.unit.map(|u| format!(" unit {u:?}")).unwrap_or_default();
                    format!("{} {}{unit}", c.name.as_str(), c.ty.sql)
                })
                .collect::<Vec<_>>()
                .join(", "),
        },
    );
    for c in r.columns.iter().flatten() {
        if let Some(i) = c.field {
            s.used.push(fields[i].name.as_str().to_string());
        }
    }
    let version = match &r.version {
        VersionPlan::SourcePosition => "source-position".to_string(),
        VersionPlan::Field(i) => {
            s.used.push(fields[*i].name.as_str().to_string());
            fields[*i].name.as_str().to_string()
        }
        VersionPlan::Column(c) => format!("column {}", c.as_str()),
    };
    s.put("version", version);
    s.put(
        "delete-if",
        r.delete_if
            .as_ref()
            .map(|d| d.0.clone())
            .unwrap_or_default(),
    );
    s.put("tombstones", format!("{:?}", r.tombstones).to_lowercase());
    s.put("truncate", format!("{:?}", r.truncate).to_lowercase());
    s.put("source-table", r.source_table.clone().unwrap_or_default());
    if let Some((_, program)) = &r.delete_if {
        s.used.extend(cel_fields(program, fields));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_types_as_format_type_prints_them() {
        let t = SqlType::parse("timestamp(6) without time zone").unwrap();
        assert_eq!(
            (t.kind, t.precision, t.array),
            (Kind::Timestamp, Some(6), false)
        );
        let t = SqlType::parse("timestamp(3) with time zone").unwrap();
        assert_eq!((t.kind, t.precision), (Kind::Timestamptz, Some(3)));
        let t = SqlType::parse("numeric(12,2)").unwrap();
        assert_eq!(
            (t.kind, t.precision, t.scale),
            (Kind::Numeric, Some(12), Some(2))
        );
        let t = SqlType::parse("text[]").unwrap();
        assert_eq!((t.kind, t.array), (Kind::Text, true));
        assert_eq!(
            SqlType::parse("character varying(20)").unwrap().kind,
            Kind::Text
        );
        for bad in [
            "numeric(5,2,1)",
            "varchar(0)",
            "numeric(1000,2000)",
            "timestamp(7)",
            "int; drop table x",
            "numeric(1",
            "text)",
            "numeric(a)",
            "",
            "geometry",
        ] {
            assert!(SqlType::parse(bad).is_err(), "{bad}");
        }
    }
}
