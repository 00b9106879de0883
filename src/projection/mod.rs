//! Projections: what a batch's newly claimed rows (`landed`) change. One module per kind — [`counter`], [`sum`],
//! [`sql`], [`outbox`], [`row`] — each owning the check of its own keys, its DDL, its statement and its
//! settings; [`ProjectionKind`] is the registry: adding a kind is one module and one variant (its name, keys,
//! compile and settings below). The statement kinds run in the batch transaction through [`apply`]; row
//! projections through [`row::apply_rows`].

pub mod aggregate;
pub mod apply;
pub mod counter;
pub mod kind;
pub mod outbox;
pub mod row;
pub mod sql;
pub mod sum;

pub use kind::Aggregate;
pub use outbox::DEFAULT_OUTBOX_TABLE;

use std::collections::BTreeMap;

use cel_interpreter::Program;
use toml::Spanned;

use crate::config::fields::{cel_fields, compile_cel, field_definition, FieldPlan, Fields, Format};
use crate::config::raw::RawProjection;
use crate::config::source::Source;
use crate::error::Result;
use crate::ident::Ident;
use kind::{Compiled, Ctx, Settings};
use row::plan::RowPlan;

/// The built-in projection kinds: the registry of what a `[[projection]]` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl ProjectionKind {
    /// The kind named `kind = "…"`, if any.
    pub fn parse(name: &str) -> Option<ProjectionKind> {
        Some(match name {
            "counter" => ProjectionKind::Counter,
            "sum" => ProjectionKind::Sum,
            "sql" => ProjectionKind::Sql,
            "outbox" => ProjectionKind::Outbox,
            "row" => ProjectionKind::Row,
            _ => return None,
        })
    }

    /// The keys this kind takes besides `kind`, `name` and `filter`.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            ProjectionKind::Counter => counter::KEYS,
            ProjectionKind::Sum => sum::KEYS,
            ProjectionKind::Sql => sql::KEYS,
            ProjectionKind::Outbox => outbox::KEYS,
            ProjectionKind::Row => row::plan::KEYS,
        }
    }

    /// Checks the kind's own keys and builds its statement and DDL (a row projection's statements depend on
    /// its table's columns, which may come from the catalog: they are built by the sink).
    fn compile(self, ctx: &Ctx<'_>) -> Result<(Compiled, Option<RowPlan>)> {
        Ok(match self {
            ProjectionKind::Counter => (counter::compile(ctx)?, None),
            ProjectionKind::Sum => (sum::compile(ctx)?, None),
            ProjectionKind::Sql => (sql::compile(ctx)?, None),
            ProjectionKind::Outbox => (outbox::compile(ctx)?, None),
            ProjectionKind::Row => {
                let plan = row::plan::compile_entry(ctx)?;
                let compiled = Compiled {
                    name: plan.table.name.as_str().to_string(),
                    statement: String::new(),
                    setup: Vec::new(),
                    aggregate: None,
                    reads_record: false,
                };
                (compiled, Some(plan))
            }
        })
    }

    /// Records the kind's own keys, resolved, in `s`.
    fn settings(self, s: &mut Settings<'_>, row: Option<&RowPlan>) {
        match self {
            ProjectionKind::Counter => counter::settings(s),
            ProjectionKind::Sum => sum::settings(s),
            ProjectionKind::Sql => sql::settings(s),
            ProjectionKind::Outbox => outbox::settings(s),
            ProjectionKind::Row => {}
        }
        if let Some(r) = row {
            row::plan::settings(s, r);
        }
    }
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
    /// Every kind but `row`: what it reads of a record, which decides whether a copy of a state a row projection
    /// already claimed reaches it ([`Reads`]); `None` for a row projection.
    pub reads: Option<Reads>,
}

/// What a projection other than `row` reads of a landed record: whether a *copy* — a record under a new delivery
/// key whose row state every row projection it reached already claimed at its version — reaches it. A copy
/// reaches a projection unless an earlier claimed copy of that state gave it the same values (issue 34: which
/// copy arrives first never decides a table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reads {
    /// These fields (indices into `Pipeline::fields`, the filter's included; an outbox's also the identity key
    /// and `partition-by` fields, as its rows are unique by the delivery key): a copy that carries the same values
    /// (their decoded text) as an earlier copy of the state is a `duplicate` for it.
    Fields(Vec<usize>),
    /// The record itself: its coordinates (a `sql` statement naming `_topic`, `_partition`, `_offset`,
    /// `_timestamp` or `_generation`, or one that cannot be given the copy condition: `WITH RECURSIVE`). Every
    /// copy reaches it.
    Record,
}

/// The condition in `landed` under which a record reaches projection `n` (0-based): not marked as a copy it has
/// seen (`_skip`, the projections a copy does not reach, set by the row projections, NULL for any other record).
pub fn reach_condition(n: usize) -> String {
    format!("(_skip IS NULL OR {n} <> ALL (_skip))")
}

impl ProjectionPlan {
    /// The tables this projection writes, qualified SQL text (what `check --database` checks a role's grants
    /// on): a counter's or sum's table; a row projection's table and the tables beside it
    /// ([`row::tables`]); an outbox's table; none for `sql` (its tables are the user's statement's).
    pub fn tables(&self, p: &crate::config::Pipeline) -> Vec<String> {
        match self.kind {
            ProjectionKind::Counter | ProjectionKind::Sum => {
                self.aggregate.iter().map(|a| a.table.to_string()).collect()
            }
            ProjectionKind::Row => self.row.iter().flat_map(|r| row::tables(r, p)).collect(),
            ProjectionKind::Outbox => self.settings.get("table").into_iter().cloned().collect(),
            ProjectionKind::Sql => Vec::new(),
        }
    }
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

/// Compiles `[[projection]]` number `n` (0-based): checks its kind and the keys it takes, its filter (Debezium:
/// side effects skip snapshot reads unless `snapshots = "include"`), then lets the kind check its own keys and
/// build its statement and DDL.
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
    let kind = check_keys(src, format, rp)?;
    let filter = filter(src, format, fields, p, kind, pass_column)?;
    let pass = pass_column.map(|i| format!("\"_pass_{i}\""));
    let reach = (kind != ProjectionKind::Row).then(|| reach_condition(n));
    let where_pass = match (&pass, &reach) {
        (Some(c), Some(r)) => format!(" WHERE {c} AND {r}"),
        (Some(c), None) => format!(" WHERE {c}"),
        (None, Some(r)) => format!(" WHERE {r}"),
        (None, None) => String::new(),
    };
    let ctx = Ctx {
        src,
        format,
        fields,
        schema,
        key,
        partition_by,
        p,
        n,
        pass,
        reach,
        where_pass,
    };
    let (compiled, row) = kind.compile(&ctx)?;
    let name = match &rp.name {
        Some(nm) if nm.get_ref().trim().is_empty() => {
            return Err(src.error(nm.span(), "`name` must not be empty"))
        }
        Some(nm) => nm.get_ref().clone(),
        None => compiled.name,
    };
    let settings = settings(
        &fields.plans,
        schema,
        rp,
        kind,
        filter.as_ref().map(|f| f.0.as_str()),
        row.as_ref(),
    );
    // An outbox row is unique by the delivery key: it reads the identity fields too (not the generation: a
    // replay under a new generation sends nothing it sent before).
    let identity: &[usize] = if kind == ProjectionKind::Outbox {
        key
    } else {
        &[]
    };
    let reads = match (kind, compiled.reads_record) {
        (ProjectionKind::Row, _) => None,
        (_, true) => Some(Reads::Record),
        _ => Some(Reads::Fields(
            fields
                .plans
                .iter()
                .enumerate()
                .filter(|(i, f)| {
                    settings.contains_key(&format!("field {}", f.name.as_str()))
                        || identity.contains(i)
                        || (kind == ProjectionKind::Outbox && partition_by == Some(*i))
                })
                .map(|(i, _)| i)
                .collect(),
        )),
    };
    Ok(ProjectionPlan {
        name,
        kind,
        statement: compiled.statement,
        setup: compiled.setup,
        filter,
        pass_column,
        aggregate: compiled.aggregate,
        row,
        settings,
        reads,
    })
}

/// The entry's kind, after rejecting keys that do not apply to it (so a typo never silently does nothing) and
/// checking `snapshots`.
fn check_keys(src: &Source, format: Format, rp: &RawProjection) -> Result<ProjectionKind> {
    let Some(kind) = ProjectionKind::parse(rp.kind.get_ref()) else {
        return Err(src.error(
            rp.kind.span(),
            format!(
                "unknown projection kind `{}`: expected counter, sum, sql, outbox or row",
                rp.kind.get_ref()
            ),
        ));
    };
    let allowed = kind.keys();
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
    Ok(kind)
}

/// The entry's effective filter. Debezium: snapshot reads are observed state, not business actions; side
/// effects (every kind but `row`) skip them by default.
fn filter(
    src: &Source,
    format: Format,
    fields: &Fields<'_>,
    p: &Spanned<RawProjection>,
    kind: ProjectionKind,
    pass_column: Option<usize>,
) -> Result<Option<(String, Program)>> {
    let rp = p.get_ref();
    let filter = match &rp.filter {
        Some(f) => Some((f.get_ref().clone(), fields.compile_cel(f)?)),
        None => None,
    };
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
    Ok(filter)
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
    kind: ProjectionKind,
    filter: Option<&str>,
    row: Option<&RowPlan>,
) -> BTreeMap<String, String> {
    let mut s = Settings {
        fields,
        schema,
        rp,
        out: BTreeMap::new(),
        used: Vec::new(),
    };
    s.put("kind", rp.kind.get_ref().clone());
    s.put("filter", filter.unwrap_or("").to_string());
    kind.settings(&mut s, row);
    if let Some(f) = filter {
        if let Ok(program) = Program::compile(f) {
            s.used.extend(cel_fields(&program, fields));
        }
    }
    let Settings { mut out, used, .. } = s;
    for f in fields {
        if used.iter().any(|u| u == f.name.as_str()) {
            out.insert(format!("field {}", f.name.as_str()), field_definition(f));
        }
    }
    out
}
