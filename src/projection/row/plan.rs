//! `[[projection]] kind = "row"`: a version-guarded row-state projection (a table keyed by the entity's primary
//! key, holding the newest state seen), with tombstones for deletes and a conflict record for equal versions
//! with different payloads.

use cel_interpreter::Program;
use toml::Spanned;

use super::types::{ColumnSpec, SqlType, Unit};
use crate::config::fields::{cel_fields, table_name, FieldPlan, FieldType, Format};
use crate::config::raw::RawProjection;
use crate::config::source::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};
use crate::projection::kind::{Ctx, Settings};

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

/// What a Debezium change whose `after` lacks a mapped column does to that column (`absent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbsentPolicy {
    /// `keep` (default): an absent member is not a NULL — the stored value stays (a new row gets NULL).
    Keep,
    /// `null`: an absent member writes NULL (the column was dropped at the source and its values should go).
    Null,
}

/// What a Debezium row projection does with members of `after` that are none of its columns (`new-columns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewColumns {
    /// `ignore` (default): not stored.
    Ignore,
    /// `extra`: kept as a JSON object in the table's `_extra jsonb` column (NULL when there are none).
    Extra,
    /// `add`: added to the projection's table (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`, typed from the Connect
    /// schema, or from the JSON value when schemas are off) before the batch, then written like the other
    /// columns; carried, never judged (the row state hash leaves them out, as `_extra`).
    Add,
}

/// What a Debezium row projection does when a change's `after` does not match its columns (`schema-drift`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaDrift {
    /// `lenient` (default): `absent` and `new-columns` say what happens.
    Lenient,
    /// `strict`: a mapped column absent from `after`, or (under `new-columns = "ignore"`) a member no column
    /// maps, stops the partition with an error naming the field and topic/partition/offset; nothing of the batch
    /// is committed.
    Strict,
}

/// What a Debezium row projection does with a change that has no Kafka key (a source table without a primary
/// key: Debezium sends a null key, DBZ-916), `keyless`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyless {
    /// `refuse` (default): the partition stops at the first such change (exit 2, topic/partition/offset and the
    /// source table named, nothing of the batch committed): its rows cannot be told apart (identical rows would
    /// merge, a delete would remove every copy) and a null key spreads one row's changes over partitions.
    Refuse,
    /// `key`: the projection's `key` columns, taken from the row image, identify the row — the operator vouches
    /// that they are unique at the source and that the topic has one partition (null keys give no per-row
    /// order across partitions).
    Key,
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
    /// Debezium: what a mapped column absent from `after` does.
    pub absent: AbsentPolicy,
    /// Debezium: what members of `after` outside the columns do.
    pub new_columns: NewColumns,
    /// Debezium: whether a change that does not match the columns stops the partition.
    pub schema_drift: SchemaDrift,
    /// Debezium: what a change without a Kafka key does.
    pub keyless: Keyless,
}

impl RowPlan {
    /// Where this projection keeps its tombstones: its tombstone table, every row of it (`tombstones = "table"`),
    /// or its own table, the rows whose `_deleted_at` is set (`"column"`) — `(qualified table, SQL condition)`.
    pub fn tombstone_rows(&self) -> (String, &'static str) {
        match self.tombstones {
            TombstoneMode::Table => (self.tombstone_table.to_string(), "true"),
            TombstoneMode::Column => (self.table.to_string(), "_deleted_at IS NOT NULL"),
        }
    }
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
        name: Ident::new(&tomb_name).expect("a built-in name is a valid SQL identifier"),
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
    let (absent, new_columns) = evolution(src, json, rp)?;
    let schema_drift = drift(src, json, rp)?;
    let keyless = keyless(src, json, rp)?;
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
        absent,
        new_columns,
        schema_drift,
        keyless,
    })
}

/// `keyless` (refuse or key): Debezium only.
fn keyless(src: &Source, json: bool, rp: &RawProjection) -> Result<Keyless> {
    match rp.keyless.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None => Ok(Keyless::Refuse),
        Some((t, _)) if json => {
            Err(src.error(t.span(), "`keyless` applies to Debezium row projections"))
        }
        Some((_, "refuse")) => Ok(Keyless::Refuse),
        Some((_, "key")) => Ok(Keyless::Key),
        Some((t, other)) => Err(src.error(
            t.span(),
            format!("`keyless` must be \"refuse\" or \"key\", not `{other}`"),
        )),
    }
}

/// `schema-drift` (lenient or strict): Debezium only.
fn drift(src: &Source, json: bool, rp: &RawProjection) -> Result<SchemaDrift> {
    match rp.schema_drift.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None => Ok(SchemaDrift::Lenient),
        Some((t, _)) if json => Err(src.error(
            t.span(),
            "`schema-drift` applies to Debezium row projections",
        )),
        Some((_, "lenient")) => Ok(SchemaDrift::Lenient),
        Some((_, "strict")) => Ok(SchemaDrift::Strict),
        Some((t, other)) => Err(src.error(
            t.span(),
            format!("`schema-drift` must be \"lenient\" or \"strict\", not `{other}`"),
        )),
    }
}

/// `absent` (keep or null) and `new-columns` (ignore or extra): Debezium only.
fn evolution(src: &Source, json: bool, rp: &RawProjection) -> Result<(AbsentPolicy, NewColumns)> {
    for k in [&rp.absent, &rp.new_columns].into_iter().flatten() {
        if json {
            return Err(src.error(
                k.span(),
                "`absent` and `new-columns` apply to Debezium row projections",
            ));
        }
    }
    let absent = match rp.absent.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None | Some((_, "keep")) => AbsentPolicy::Keep,
        Some((_, "null")) => AbsentPolicy::Null,
        Some((t, other)) => {
            return Err(src.error(
                t.span(),
                format!("`absent` must be \"keep\" or \"null\", not `{other}`"),
            ))
        }
    };
    let new_columns = match rp.new_columns.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None | Some((_, "ignore")) => NewColumns::Ignore,
        Some((_, "extra")) => NewColumns::Extra,
        Some((_, "add")) => NewColumns::Add,
        Some((t, other)) => {
            return Err(src.error(
                t.span(),
                format!("`new-columns` must be \"ignore\", \"extra\" or \"add\", not `{other}`"),
            ))
        }
    };
    Ok((absent, new_columns))
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
    "absent",
    "new-columns",
    "schema-drift",
    "keyless",
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
    s.put("absent", format!("{:?}", r.absent).to_lowercase());
    s.put("new-columns", format!("{:?}", r.new_columns).to_lowercase());
    // `schema-drift` is not recorded: it never changes what a landed record projects (a strict stop commits
    // nothing), so switching it after a stop needs no projection change.
    if let Some((_, program)) = &r.delete_if {
        s.used.extend(cel_fields(program, fields));
    }
}

#[cfg(test)]
mod tests {
    const DBZ: &str = r#"
[kafka]
group-id = "g"
topics = ["t"]
[source]
format = "debezium"
[[projection]]
kind = "row"
table = "accounts"
key = ["id"]
columns = { id = "bigint" }
"#;

    /// `absent` and `new-columns`: their values, defaults, and the refusals (`add`, unknown values, JSON events).
    #[test]
    fn absent_and_new_columns_are_validated() {
        use super::{AbsentPolicy, NewColumns};
        let p = crate::config::parse("p.toml", DBZ).unwrap();
        let r = p.projections[0].row.as_ref().unwrap();
        assert_eq!(
            (r.absent, r.new_columns),
            (AbsentPolicy::Keep, NewColumns::Ignore)
        );
        let p = crate::config::parse(
            "p.toml",
            &format!("{DBZ}absent = \"null\"\nnew-columns = \"extra\"\n"),
        )
        .unwrap();
        let r = p.projections[0].row.as_ref().unwrap();
        assert_eq!(
            (r.absent, r.new_columns),
            (AbsentPolicy::Null, NewColumns::Extra)
        );
        let p = crate::config::parse(
            "p.toml",
            &format!("{DBZ}new-columns = \"add\"\nschema-drift = \"strict\"\n"),
        )
        .unwrap();
        let r = p.projections[0].row.as_ref().unwrap();
        assert_eq!(
            (r.new_columns, r.schema_drift),
            (NewColumns::Add, super::SchemaDrift::Strict)
        );
        for (extra, needle) in [
            ("new-columns = \"all\"", "`new-columns` must be"),
            ("schema-drift = \"loose\"", "`schema-drift` must be"),
            ("absent = \"drop\"", "`absent` must be"),
        ] {
            let e = crate::config::parse("p.toml", &format!("{DBZ}{extra}\n"))
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(needle) && e.contains("p.toml:"), "{extra}: {e}");
        }
        let json = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nid = { path = \"/id\", type = \"bigint\" }\n\
                    v = { path = \"/v\", type = \"bigint\" }\n[identity]\nkey = [\"id\"]\n[[projection]]\nkind = \"row\"\ntable = \"a\"\n\
                    key = [\"id\"]\nversion = \"v\"\n";
        assert!(crate::config::parse("p.toml", json).is_ok());
        let e = crate::config::parse("p.toml", &format!("{json}absent = \"keep\"\n"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("apply to Debezium"), "{e}");
        let e = crate::config::parse("p.toml", &format!("{json}schema-drift = \"strict\"\n"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("applies to Debezium"), "{e}");
    }

    /// `keyless` and `[source] interval-handling`: defaults, values, refusals naming `file:line`.
    #[test]
    fn keyless_and_interval_handling_are_validated() {
        let p = crate::config::parse("p.toml", DBZ).unwrap();
        assert_eq!(
            p.projections[0].row.as_ref().unwrap().keyless,
            super::Keyless::Refuse
        );
        assert_eq!(
            p.interval_handling,
            crate::config::IntervalHandling::Numeric
        );
        let p = crate::config::parse("p.toml", &format!("{DBZ}keyless = \"key\"\n")).unwrap();
        assert_eq!(
            p.projections[0].row.as_ref().unwrap().keyless,
            super::Keyless::Key
        );
        let with = DBZ.replace(
            "format = \"debezium\"",
            "format = \"debezium\"\ninterval-handling = \"string\"",
        );
        let p = crate::config::parse("p.toml", &with).unwrap();
        assert_eq!(p.interval_handling, crate::config::IntervalHandling::String);
        for text in [
            format!("{DBZ}keyless = \"multiset\"\n"),
            DBZ.replace(
                "format = \"debezium\"",
                "format = \"debezium\"\ninterval-handling = \"iso\"",
            ),
        ] {
            let e = crate::config::parse("p.toml", &text)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("p.toml:") && e.contains("must be"), "{e}");
        }
    }
}
