//! Projections: what a batch's newly claimed rows (`landed`) change. One module per kind — [`counter`], [`sum`],
//! [`sql`], [`outbox`], [`row`] — each owning the check of its own keys, its DDL, its statement and its
//! settings; [`ProjectionKind`] is the registry (adding a kind = one module + one variant).

pub mod apply;
pub mod row;

use std::collections::{BTreeMap, HashSet};

use cel_interpreter::Program;
use toml::Spanned;

use crate::config::fields::{
    cel_fields, compile_cel, delivery_key_sql, field_definition, ident, message_key_sql,
    table_name, FieldPlan, FieldType, Fields, Format,
};
use crate::config::raw::RawProjection;
use crate::config::source::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};
use row::plan::RowPlan;

/// The built-in projection kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionKind {
    /// `counter`: `column += number of landed rows` per group.
    Counter,
    /// `sum`: `target += sum(field)` per group, for each `add` entry.
    Sum,
    /// `sql`: the user's statement over `landed`.
    Sql,
    /// `outbox`: one outbox row per landed record, unique by delivery key.
    Outbox,
    /// `row`: a version-guarded row-state table (see [`RowPlan`]).
    Row,
}

/// A projection compiled to SQL over `landed`.
pub struct ProjectionPlan {
    /// Name (defaults to the table, or `projection-N`).
    pub name: String,
    /// The kind.
    pub kind: ProjectionKind,
    /// The statement run in each batch transaction.
    pub statement: String,
    /// Statements `init` runs (idempotent DDL).
    pub setup: Vec<String>,
    /// Only rows for which this CEL expression is true reach the projection.
    pub filter: Option<(String, Program)>,
    /// Index of this projection's pass column in `landed` (when it has a filter).
    pub pass_column: Option<usize>,
    /// counter/sum: the table, its group-by field indices and its value columns.
    pub aggregate: Option<Aggregate>,
    /// row: the row projection.
    pub row: Option<RowPlan>,
    /// What determines the projection's result, `setting → value` (kind, effective filter, the kind's keys
    /// resolved, and `field <name>` definitions of the fields it reads). Recorded with the ledger, so a ledger
    /// whose claims were projected under other settings is refused (`sink::schema`).
    pub settings: BTreeMap<String, String>,
}

/// The shape of a counter or sum projection's table.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// The table.
    pub table: QualifiedName,
    /// Field indices of the group-by columns (the primary key).
    pub group_by: Vec<usize>,
    /// The value columns (counter: one; sum: the `add` targets).
    pub values: Vec<Ident>,
    /// Per value column, the field it adds (sum: the `add` field's index; counter: `None`).
    pub value_fields: Vec<Option<usize>>,
}

impl std::fmt::Debug for ProjectionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProjectionPlan")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("statement", &self.statement)
            .finish()
    }
}

/// Compiles `[[projection]]` number `n` (0-based): checks its kind and keys, builds its statement and DDL.
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn projection(
    src: &Source,
    format: Format,
    fields: &Fields<'_>,
    schema: &Ident,
    key: &[usize],
    partition_by: Option<usize>,
    p: &Spanned<RawProjection>,
    n: usize,
    pass_column: Option<usize>,
) -> Result<ProjectionPlan> {
    let rp = p.get_ref();
    let kind = match rp.kind.get_ref().as_str() {
        "counter" => ProjectionKind::Counter,
        "sum" => ProjectionKind::Sum,
        "sql" => ProjectionKind::Sql,
        "outbox" => ProjectionKind::Outbox,
        "row" => ProjectionKind::Row,
        other => {
            return Err(src.error(
                rp.kind.span(),
                format!(
                    "unknown projection kind `{other}`: expected counter, sum, sql, outbox or row"
                ),
            ))
        }
    };
    // Reject keys that do not apply to this kind, so a typo never silently does nothing.
    let allowed: &[&str] = match kind {
        ProjectionKind::Counter => &["table", "group-by", "column"],
        ProjectionKind::Sum => &["table", "group-by", "add"],
        ProjectionKind::Sql => &["sql", "setup"],
        ProjectionKind::Outbox => &["table", "payload", "key", "snapshots"],
        ProjectionKind::Row => &[
            "table",
            "key",
            "columns",
            "version",
            "delete-if",
            "tombstones",
            "truncate",
            "source-table",
        ],
    };
    let allowed: Vec<&str> = match kind {
        ProjectionKind::Counter | ProjectionKind::Sum | ProjectionKind::Sql => {
            let mut a = allowed.to_vec();
            a.push("snapshots");
            a
        }
        _ => allowed.to_vec(),
    };
    if let Some(s) = &rp.snapshots {
        if format != Format::Debezium {
            return Err(src.error(s.span(), "`snapshots` applies to Debezium pipelines"));
        }
        if !matches!(s.get_ref().as_str(), "skip" | "include") {
            return Err(src.error(
                s.span(),
                format!(
                    "`snapshots` must be \"skip\" or \"include\", not `{}`",
                    s.get_ref()
                ),
            ));
        }
    }
    let present: [(&str, Option<std::ops::Range<usize>>); 15] = [
        ("table", rp.table.as_ref().map(|v| v.span())),
        ("group-by", rp.group_by.as_ref().map(|v| v.span())),
        ("column", rp.column.as_ref().map(|v| v.span())),
        ("add", rp.add.as_ref().map(|v| v.span())),
        ("sql", rp.sql.as_ref().map(|v| v.span())),
        ("setup", rp.setup.as_ref().map(|v| v.span())),
        ("payload", rp.payload.as_ref().map(|v| v.span())),
        ("key", rp.key.as_ref().map(|v| v.span())),
        ("columns", rp.columns.as_ref().map(|v| v.span())),
        ("version", rp.version.as_ref().map(|v| v.span())),
        ("delete-if", rp.delete_if.as_ref().map(|v| v.span())),
        ("tombstones", rp.tombstones.as_ref().map(|v| v.span())),
        ("truncate", rp.truncate.as_ref().map(|v| v.span())),
        ("source-table", rp.source_table.as_ref().map(|v| v.span())),
        ("snapshots", rp.snapshots.as_ref().map(|v| v.span())),
    ];
    for (k, span) in present {
        if let Some(span) = span {
            if !allowed.contains(&k) {
                return Err(src.error(
                    span,
                    format!(
                        "`{k}` does not apply to a `{}` projection",
                        rp.kind.get_ref()
                    ),
                ));
            }
        }
    }
    let filter = match &rp.filter {
        Some(f) => Some((f.get_ref().clone(), fields.compile_cel(f)?)),
        None => None,
    };
    // Debezium: snapshot reads are observed state, not business actions; side effects skip them by default.
    let filter = match (filter, pass_column.is_some() && kind != ProjectionKind::Row) {
        (Some((text, _)), true)
            if format == Format::Debezium
                && rp.snapshots.as_ref().map(|s| s.get_ref().as_str()) != Some("include") =>
        {
            let combined = format!("!_snapshot && ({text})");
            let program =
                compile_cel(&fields.plans, &combined).map_err(|m| src.error(p.span(), m))?;
            Some((combined, program))
        }
        (None, true) => {
            let text = "!_snapshot".to_string();
            let program = compile_cel(&fields.plans, &text).map_err(|m| src.error(p.span(), m))?;
            Some((text, program))
        }
        (f, _) => f,
    };
    let mut row = None;
    let pass = pass_column.map(|i| format!("\"_pass_{i}\""));
    let where_pass = pass
        .as_ref()
        .map(|c| format!(" WHERE {c}"))
        .unwrap_or_default();
    let need = |v: Option<&Spanned<String>>, k: &str| {
        v.cloned().ok_or_else(|| {
            src.error(
                p.span(),
                format!("a `{}` projection needs `{k}`", rp.kind.get_ref()),
            )
        })
    };

    let mut aggregate = None;
    let (name, statement, setup) = match kind {
        ProjectionKind::Counter | ProjectionKind::Sum => {
            let table_s = need(rp.table.as_ref(), "table")?;
            let table = table_name(src, schema, &table_s)?;
            let group_by_raw = rp.group_by.as_ref().ok_or_else(|| {
                src.error(
                    p.span(),
                    format!("a `{}` projection needs `group-by`", rp.kind.get_ref()),
                )
            })?;
            let group_by = fields.list(group_by_raw, "group-by")?;
            for (&i, s) in group_by.iter().zip(group_by_raw.get_ref()) {
                if fields.plans[i].optional {
                    return Err(src.error(
                        s.span(),
                        format!("group-by field `{}` must not be optional", s.get_ref()),
                    ));
                }
            }
            let gcols: Vec<String> = group_by
                .iter()
                .map(|&i| fields.plans[i].name.to_string())
                .collect();
            let gdefs: Vec<String> = group_by
                .iter()
                .map(|&i| {
                    format!(
                        "{} {} NOT NULL",
                        fields.plans[i].name,
                        fields.plans[i].ty.sql()
                    )
                })
                .collect();
            let g = gcols.join(", ");
            // (target column, select expression, column type)
            let mut targets: Vec<(Ident, String, &str)> = Vec::new();
            let mut value_fields: Vec<Option<usize>> = Vec::new();
            if kind == ProjectionKind::Counter {
                let c = match &rp.column {
                    Some(c) => ident(src, c)?,
                    None => Ident::new("n").expect("static"),
                };
                targets.push((c, "count(*)".to_string(), "bigint"));
                value_fields.push(None);
            } else {
                let add = rp
                    .add
                    .as_ref()
                    .ok_or_else(|| src.error(p.span(), "a `sum` projection needs `add`"))?;
                if add.get_ref().is_empty() {
                    return Err(
                        src.error(add.span(), "`add` must map at least one column to a field")
                    );
                }
                let adds: &BTreeMap<Spanned<String>, Spanned<String>> = add.get_ref();
                for (target, field) in adds {
                    let t = ident(src, target)?;
                    let fi = fields.index(field)?;
                    let f = &fields.plans[fi];
                    if !matches!(f.ty, FieldType::Numeric | FieldType::Bigint) {
                        return Err(src.error(
                            field.span(),
                            format!(
                                "`sum` adds numeric or bigint fields; `{}` is {}",
                                field.get_ref(),
                                f.ty.sql()
                            ),
                        ));
                    }
                    targets.push((t, format!("coalesce(sum({}), 0)", f.name), "numeric"));
                    value_fields.push(Some(fi));
                }
            }
            let tcols = targets
                .iter()
                .map(|(t, _, _)| t.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let texprs = targets
                .iter()
                .map(|(_, e, _)| e.clone())
                .collect::<Vec<_>>()
                .join(", ");
            let updates = targets
                .iter()
                .map(|(t, _, _)| format!("{t} = {table}.{t} + EXCLUDED.{t}"))
                .collect::<Vec<_>>()
                .join(", ");
            let statement = format!(
                "INSERT INTO {table} ({g}, {tcols}) SELECT {g}, {texprs} FROM landed{where_pass} GROUP BY {g} \
                 ON CONFLICT ({g}) DO UPDATE SET {updates}"
            );
            let tdefs = targets
                .iter()
                .map(|(t, _, ty)| format!("{t} {ty} NOT NULL DEFAULT 0"))
                .collect::<Vec<_>>();
            let setup = vec![format!(
                "CREATE TABLE IF NOT EXISTS {table} ({}, {}, PRIMARY KEY ({g}))",
                gdefs.join(", "),
                tdefs.join(", ")
            )];
            aggregate = Some(Aggregate {
                table: table.clone(),
                group_by: group_by.clone(),
                values: targets.iter().map(|(t, _, _)| t.clone()).collect(),
                value_fields,
            });
            (table.name.as_str().to_string(), statement, setup)
        }
        ProjectionKind::Sql => {
            let sql = need(rp.sql.as_ref(), "sql")?;
            let body = sql
                .get_ref()
                .trim()
                .trim_end_matches(';')
                .trim()
                .to_string();
            if body.is_empty() {
                return Err(src.error(sql.span(), "`sql` is empty"));
            }
            let statement = match &pass {
                None => body,
                Some(c) => {
                    let shadow = format!("landed AS (SELECT * FROM pg_temp.landed WHERE {c})");
                    let lower = body.to_ascii_lowercase();
                    if lower.starts_with("with recursive") {
                        return Err(src.error(
                            sql.span(),
                            "`filter` cannot be combined with a WITH RECURSIVE statement",
                        ));
                    } else if lower.starts_with("with")
                        && body[4..].starts_with(char::is_whitespace)
                    {
                        format!("WITH {shadow},{}", &body[4..])
                    } else {
                        format!("WITH {shadow} {body}")
                    }
                }
            };
            let setup = rp
                .setup
                .as_ref()
                .map(|s| vec![s.get_ref().clone()])
                .unwrap_or_default();
            (format!("projection-{}", n + 1), statement, setup)
        }
        ProjectionKind::Outbox => {
            let table = match &rp.table {
                Some(t) => table_name(src, schema, t)?,
                None => QualifiedName {
                    schema: schema.clone(),
                    name: Ident::new(DEFAULT_OUTBOX_TABLE).expect("static"),
                },
            };
            let payload: Vec<usize> = match &rp.payload {
                Some(pl) => fields.list(pl, "payload")?,
                None => (0..fields.plans.len()).collect(),
            };
            let message_key = match &rp.key {
                Some(k) => message_key_sql(&fields.plans, &fields.list(k, "key")?),
                None => "NULL".to_string(),
            };
            let dk = delivery_key_sql(&fields.plans, key, partition_by);
            let obj = payload
                .iter()
                .map(|&i| {
                    format!(
                        "'{}', {}",
                        fields.plans[i].name.as_str(),
                        fields.plans[i].name
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let statement = format!(
                "INSERT INTO {table} (delivery_key, source_topic, source_partition, source_offset, message_key, payload) \
                 SELECT {dk}, _topic, _partition, _offset, {message_key}, jsonb_build_object({obj}) \
                 FROM landed{where_pass} ORDER BY _offset ON CONFLICT (delivery_key) DO NOTHING"
            );
            let setup = vec![format!(
                "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, delivery_key text NOT NULL UNIQUE, \
                 source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, \
                 message_key text, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
                 published_at timestamptz)"
            )];
            (table.name.as_str().to_string(), statement, setup)
        }
        ProjectionKind::Row => {
            let table_s = need(rp.table.as_ref(), "table")?;
            let table = table_name(src, schema, &table_s)?;
            let plan = row::plan::compile(
                src,
                format,
                &fields.plans,
                &|s| fields.index(s),
                &|s| fields.compile_cel(s),
                p,
                table.clone(),
            )?;
            row = Some(plan);
            // Statements depend on the table's columns, which may come from the catalog: built by the sink.
            (table.name.as_str().to_string(), String::new(), Vec::new())
        }
    };
    let name = match &rp.name {
        Some(nm) if nm.get_ref().trim().is_empty() => {
            return Err(src.error(nm.span(), "`name` must not be empty"))
        }
        Some(nm) => nm.get_ref().clone(),
        None => name,
    };
    let settings = settings(
        &fields.plans,
        schema,
        rp,
        filter.as_ref().map(|f| f.0.as_str()),
        row.as_ref(),
    );
    Ok(ProjectionPlan {
        name,
        kind,
        statement,
        setup,
        filter,
        pass_column,
        aggregate,
        row,
        settings,
    })
}

/// What determines a projection's result, as `setting → value` text (see [`ProjectionPlan::settings`]): the
/// kind, the effective filter, the kind's own keys resolved (tables qualified, defaults filled in), and the
/// definition of every field the projection reads (`field <name>`: path, type, unit, time zone, plausible range,
/// optional). Every key of a kind is always present, so two definitions of one replaysafe version compare
/// key by key.
fn settings(
    fields: &[FieldPlan],
    schema: &Ident,
    rp: &RawProjection,
    filter: Option<&str>,
    row: Option<&RowPlan>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut used: Vec<String> = Vec::new();
    let list = |v: &Option<Spanned<Vec<Spanned<String>>>>| -> Vec<String> {
        v.as_ref()
            .map(|l| l.get_ref().iter().map(|s| s.get_ref().clone()).collect())
            .unwrap_or_default()
    };
    let text = |v: &Option<Spanned<String>>| v.as_ref().map(|s| s.get_ref().clone());
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), v);
    };
    let kind = rp.kind.get_ref().as_str();
    put("kind", kind.to_string());
    put("filter", filter.unwrap_or("").to_string());
    let table = |default: &str| {
        let t = text(&rp.table).unwrap_or_else(|| default.to_string());
        if t.contains('.') {
            t
        } else {
            format!("{}.{t}", schema.as_str())
        }
    };
    let group_by = list(&rp.group_by);
    match kind {
        "counter" => {
            put("table", table(""));
            put("group-by", group_by.join(", "));
            put("column", text(&rp.column).unwrap_or_else(|| "n".into()));
            used.extend(group_by.iter().cloned());
        }
        "sum" => {
            put("table", table(""));
            put("group-by", group_by.join(", "));
            let add: Vec<(String, String)> = rp
                .add
                .as_ref()
                .map(|a| {
                    a.get_ref()
                        .iter()
                        .map(|(t, f)| (t.get_ref().clone(), f.get_ref().clone()))
                        .collect()
                })
                .unwrap_or_default();
            put(
                "add",
                add.iter()
                    .map(|(t, f)| format!("{t} = {f}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            used.extend(group_by.iter().cloned());
            used.extend(add.iter().map(|(_, f)| f.clone()));
        }
        "sql" => {
            let sql = text(&rp.sql).unwrap_or_default();
            let sql = sql.trim().trim_end_matches(';').trim().to_string();
            // Fields the statement may read: every declared field named as a word in it.
            let words: HashSet<&str> = sql
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            used.extend(
                fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .filter(|n| words.contains(n))
                    .map(str::to_string),
            );
            put("sql", sql);
        }
        "outbox" => {
            put("table", table(DEFAULT_OUTBOX_TABLE));
            let payload = match &rp.payload {
                Some(_) => list(&rp.payload),
                None => fields.iter().map(|f| f.name.as_str().to_string()).collect(),
            };
            let key = list(&rp.key);
            put("payload", payload.join(", "));
            put("key", key.join(", "));
            put("message-key-encoding", "json-array-v1".into());
            used.extend(payload.iter().chain(&key).cloned());
        }
        _ => {}
    }
    if let Some(r) = row {
        put("table", r.table.to_string());
        put(
            "key",
            r.key
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
        put(
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
                used.push(fields[i].name.as_str().to_string());
            }
        }
        put(
            "version",
            match &r.version {
                row::plan::VersionPlan::SourcePosition => "source-position".to_string(),
                row::plan::VersionPlan::Field(i) => {
                    used.push(fields[*i].name.as_str().to_string());
                    fields[*i].name.as_str().to_string()
                }
                row::plan::VersionPlan::Column(c) => format!("column {}", c.as_str()),
            },
        );
        put(
            "delete-if",
            r.delete_if
                .as_ref()
                .map(|d| d.0.clone())
                .unwrap_or_default(),
        );
        put("tombstones", format!("{:?}", r.tombstones).to_lowercase());
        put("truncate", format!("{:?}", r.truncate).to_lowercase());
        put("source-table", r.source_table.clone().unwrap_or_default());
        if let Some((_, program)) = &r.delete_if {
            used.extend(cel_fields(program, fields));
        }
    }
    if let Some(f) = filter {
        if let Ok(program) = Program::compile(f) {
            used.extend(cel_fields(&program, fields));
        }
    }
    for f in fields {
        if used.iter().any(|u| u == f.name.as_str()) {
            out.insert(format!("field {}", f.name.as_str()), field_definition(f));
        }
    }
    out
}

/// Default outbox table for `kind = "outbox"`.
pub const DEFAULT_OUTBOX_TABLE: &str = "replaysafe_outbox";
