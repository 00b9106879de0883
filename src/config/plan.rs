//! Stage two: the validated pipeline. Identifiers are checked ([`Ident`]), field references resolved to
//! indices, filters compiled (CEL), projections compiled to SQL over the `landed` relation.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use cel_interpreter::Program;
use chrono::NaiveDate;
use chrono_tz::Tz;
use toml::Spanned;

use super::raw::{RawField, RawPipeline, RawProjection};
use super::row::RowPlan;
use super::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};

/// Default `batch.max-records`.
pub const DEFAULT_MAX_RECORDS: usize = 5000;
/// Default `batch.linger-ms`.
pub const DEFAULT_LINGER_MS: u64 = 50;
/// Default `batch.max-record-bytes` (8 MiB): larger record values are quarantined as `oversize`.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 8 * 1024 * 1024;
/// Default `postgres.connections`: partitions are committed in parallel on this many connections.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Default `ledger.table`.
pub const DEFAULT_LEDGER_TABLE: &str = "replaysafe_ledger";
/// Default outbox table for `kind = "outbox"`.
pub const DEFAULT_OUTBOX_TABLE: &str = "replaysafe_outbox";

/// The validated pipeline.
#[derive(Debug)]
pub struct Pipeline {
    /// What the record values are: JSON events or Debezium change events.
    pub format: Format,
    /// Debezium without schemas: how `numeric` values are encoded.
    pub decimal_handling: DecimalHandling,
    /// Where the pipeline came from (for messages).
    pub source: Source,
    /// `[kafka]`.
    pub kafka: KafkaPlan,
    /// `[postgres]`.
    pub postgres: PostgresPlan,
    /// Records per partition batch (one transaction), at most.
    pub max_records: usize,
    /// How long a partial batch may wait for more records.
    pub linger: Duration,
    /// Record values larger than this many bytes are quarantined as `oversize`.
    pub max_record_bytes: usize,
    /// `[fields]`, in name order; indices elsewhere point into this.
    pub fields: Vec<FieldPlan>,
    /// `[identity]`.
    pub identity: IdentityPlan,
    /// `[ledger]`.
    pub ledger: LedgerPlan,
    /// `[[filter]]` rules, in file order.
    pub filters: Vec<FilterPlan>,
    /// `[[projection]]`s, in file order (also the order they run in each batch).
    pub projections: Vec<ProjectionPlan>,
}

/// Where a group with no checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPolicy {
    /// The oldest offset the broker still has.
    Earliest,
    /// The end of the partition (only records produced from now on).
    Latest,
}

/// `[kafka]`, validated.
#[derive(Debug, Clone)]
pub struct KafkaPlan {
    /// `bootstrap.servers`; `None` means "take `KAFKA_BROKERS` or `--brokers`".
    pub brokers: Option<String>,
    /// The consumer group (also the checkpoint's owner).
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// `None`: a partition with neither checkpoint nor committed offset is an error (exit 3).
    pub start: Option<StartPolicy>,
    /// Passed to librdkafka as is (after the forced settings are checked).
    pub properties: Vec<(String, String)>,
}

/// `[postgres]`, validated.
#[derive(Debug, Clone)]
pub struct PostgresPlan {
    /// Connection string; `None` means `DATABASE_URL`.
    pub url: Option<String>,
    /// The schema all replaysafe tables and unqualified projection tables live in.
    pub schema: Ident,
    /// Connections used to commit partitions in parallel.
    pub connections: usize,
}

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
        NaiveDate::from_ymd_opt(1990, 1, 1).expect("valid"),
        NaiveDate::from_ymd_opt(2100, 12, 31).expect("valid"),
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

/// `[identity]`: what identifies a change.
#[derive(Debug, Clone)]
pub struct IdentityPlan {
    /// Indices into `fields` forming the delivery key.
    pub key: Vec<usize>,
    /// Stream generation: part of every delivery key when set.
    pub generation: Option<String>,
    /// Index of the `date` field the ledger is range-partitioned by (one partition per day).
    pub partition_by: Option<usize>,
}

/// `[ledger]`.
#[derive(Debug, Clone)]
pub struct LedgerPlan {
    /// The ledger table.
    pub table: QualifiedName,
    /// Days the ledger keeps; events older are quarantined as `beyond-horizon`; `None` keeps everything.
    pub horizon_days: Option<u32>,
    /// Extra field indices stored in each ledger row.
    pub columns: Vec<usize>,
}

/// A named `[[filter]]` rule: records for which `drop-if` is true are counted `filtered` and not claimed.
pub struct FilterPlan {
    /// The rule's name (the `rule` label of the `filtered` outcome).
    pub name: String,
    /// The CEL source.
    pub expr: String,
    /// The compiled program.
    pub program: Program,
}

impl std::fmt::Debug for FilterPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterPlan")
            .field("name", &self.name)
            .field("expr", &self.expr)
            .finish()
    }
}

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

impl Pipeline {
    /// The field with this index.
    pub fn field(&self, i: usize) -> &FieldPlan {
        &self.fields[i]
    }

    /// Qualifies a replaysafe-owned table name with the pipeline schema.
    pub fn table(&self, name: &str) -> QualifiedName {
        QualifiedName {
            schema: self.postgres.schema.clone(),
            name: Ident::new(name).expect("static name"),
        }
    }

    /// Number of projection pass columns in `landed`.
    pub fn pass_columns(&self) -> usize {
        self.projections
            .iter()
            .filter(|p| p.pass_column.is_some())
            .count()
    }

    /// Compiles a CEL expression over this pipeline's fields (e.g. `backfill --filter`).
    ///
    /// # Errors
    /// A message when it does not compile or names an undeclared field.
    pub fn compile_filter(&self, expr: &str) -> std::result::Result<Program, String> {
        compile_cel(&self.fields, expr)
    }

    /// The four answers every replay-safe consumer must state, as printed by `replaysafe check`.
    pub fn four_answers(&self) -> String {
        let names = |ix: &[usize]| {
            ix.iter()
                .map(|&i| self.fields[i].name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut key = names(&self.identity.key);
        if let Some(g) = &self.identity.generation {
            key = format!("generation \"{g}\" + {key}");
        }
        if let Some(p) = self.identity.partition_by {
            key = format!(
                "{key} + the day `{}` (the ledger partition; the same key on another day is another delivery, so the day must be a value a replay cannot change)",
                self.fields[p].name.as_str()
            );
        }
        let projections = self
            .projections
            .iter()
            .map(|p| format!("{} ({:?})", p.name, p.kind).to_lowercase())
            .collect::<Vec<_>>()
            .join(", ");
        let horizon = match (self.ledger.horizon_days, self.identity.partition_by) {
            (Some(d), Some(p)) => format!(
                "the ledger keeps the days of `{}` from today − {d} on (by the database's UTC date); older partitions are dropped on start and every --prune-interval, the day pruned below is kept in replaysafe_horizon and only moves forward (a longer horizon-days later does not reopen pruned days), and every claim older than it — run, load, backfill, rebuild — is quarantined as beyond-horizon in its batch transaction",
                self.fields[p].name.as_str()
            ),
            _ => "no horizon: the ledger keeps every delivery key forever".to_string(),
        };
        let rows: Vec<String> = self
            .projections
            .iter()
            .filter_map(|p| {
                let r = p.row.as_ref()?;
                let version = match &r.version {
                    super::row::VersionPlan::SourcePosition => {
                        "the source position [commit LSN, change LSN]".to_string()
                    }
                    super::row::VersionPlan::Field(i) => {
                        format!("the field `{}`", self.fields[*i].name.as_str())
                    }
                    super::row::VersionPlan::Column(c) => format!("the column `{}`", c.as_str()),
                };
                let tomb = match r.tombstones {
                    super::row::TombstoneMode::Table => {
                        format!("tombstones in {}", r.tombstone_table)
                    }
                    super::row::TombstoneMode::Column => "tombstones as `_deleted_at`".to_string(),
                };
                Some(format!("{} by {version} ({tomb})", r.table))
            })
            .collect();
        let order = if rows.is_empty() {
            "offsets within a partition; aggregates are commutative increments, so order between partitions does not \
             matter; a duplicate delivery key is never applied twice"
                .to_string()
        } else {
            format!(
                "per entity, a version: row projections {} only accept a strictly newer version; deletes leave a \
                 versioned tombstone (kept for good, longer than any horizon), so an older write never resurrects a row; \
                 an equal version with a different state is a conflict recorded in replaysafe_conflicts; changes that \
                 are stale or already stored reach no other projection; aggregates are commutative increments of the \
                 changes applied",
                rows.join(", ")
            )
        };
        let key = if self.format == Format::Debezium {
            format!("{key} (Debezium: the source table, the record key and the source position — never the Kafka offset)")
        } else {
            key
        };
        format!(
            "1. What identifies a change: the delivery key {key}, claimed in {ledger}.\n\
             2. What orders changes: {order}.\n\
             3. What commits atomically: one transaction per partition batch (at most {max} records or {linger} ms): ledger \
             claims, projections [{projections}], dead letters and the checkpoint of group `{group}`; the Kafka offset is \
             committed after it.\n\
             4. How long the guarantees survive: {horizon}.",
            ledger = self.ledger.table,
            max = self.max_records,
            linger = self.linger.as_millis(),
            group = self.kafka.group_id,
        )
    }
}

fn ident(src: &Source, s: &Spanned<String>) -> Result<Ident> {
    Ident::new(s.get_ref()).map_err(|m| src.error(s.span(), m))
}

fn positive(src: &Source, v: &Option<Spanned<i64>>, key: &str, default: u64) -> Result<u64> {
    match v {
        None => Ok(default),
        Some(s) if *s.get_ref() > 0 => Ok(*s.get_ref() as u64),
        Some(s) => Err(src.error(s.span(), format!("`{key}` must be a positive whole number"))),
    }
}

/// Validates a JSON pointer per RFC 6901: empty, or `/`-separated tokens where `~` is only `~0` or `~1`.
fn check_pointer(p: &str) -> Result<(), String> {
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

struct Fields<'a> {
    src: &'a Source,
    plans: Vec<FieldPlan>,
}

impl Fields<'_> {
    fn index(&self, s: &Spanned<String>) -> Result<usize> {
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

    fn list(&self, v: &Spanned<Vec<Spanned<String>>>, what: &str) -> Result<Vec<usize>> {
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

    fn compile_cel(&self, s: &Spanned<String>) -> Result<Program> {
        compile_cel(&self.plans, s.get_ref()).map_err(|m| self.src.error(s.span(), m))
    }
}

/// Compiles a CEL expression and checks that every variable it reads is one of `fields`.
fn compile_cel(fields: &[FieldPlan], expr: &str) -> std::result::Result<Program, String> {
    if expr.trim().is_empty() {
        return Err("the CEL expression is empty".into());
    }
    // The CEL parser (antlr4rust) panics on some malformed input instead of returning an error.
    let compiled = std::panic::catch_unwind(|| Program::compile(expr))
        .map_err(|_| format!("CEL expression `{expr}` does not compile"))?;
    let program = compiled.map_err(|e| format!("CEL expression does not compile: {e}"))?;
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

fn field_plan(src: &Source, name: &Spanned<String>, f: &Spanned<RawField>) -> Result<FieldPlan> {
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

/// Turns the raw file into a [`Pipeline`].
///
/// # Errors
/// [`Error::Config`] naming `file:line:column` of the first problem.
pub fn validate(src: &Source, raw: RawPipeline) -> Result<Pipeline> {
    // [kafka]
    let rk = raw.kafka.get_ref();
    let group_id = rk.group_id.get_ref().trim().to_string();
    if group_id.is_empty() {
        return Err(src.error(rk.group_id.span(), "`group-id` must not be empty"));
    }
    if rk.topics.get_ref().is_empty() {
        return Err(src.error(rk.topics.span(), "`topics` must name at least one topic"));
    }
    let mut topics = Vec::new();
    for t in rk.topics.get_ref() {
        let name = t.get_ref();
        let legal = !name.is_empty()
            && name.len() <= 249
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !legal || name == "." || name == ".." {
            return Err(src.error(
                t.span(),
                format!("`{name}` is not a legal Kafka topic name (ASCII letters, digits, `.`, `_`, `-`, at most 249)"),
            ));
        }
        topics.push(name.clone());
    }
    let start = match &rk.start {
        None => None,
        Some(s) => Some(match s.get_ref().as_str() {
            "earliest" => StartPolicy::Earliest,
            "latest" => StartPolicy::Latest,
            other => {
                return Err(src.error(
                    s.span(),
                    format!("`start` must be \"earliest\" or \"latest\", not `{other}`"),
                ))
            }
        }),
    };
    let mut properties = Vec::new();
    for (k, v) in &rk.properties {
        let key = k.get_ref().as_str();
        let value = match v.get_ref() {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => {
                return Err(src.error(
                    v.span(),
                    format!("librdkafka property `{key}` must be a string, integer or boolean"),
                ))
            }
        };
        match key {
            "enable.auto.commit" | "enable.auto.offset.store" if value != "false" => {
                return Err(src.error(
                    k.span(),
                    format!("`{key}` is forced to false: offsets are committed only after the database transaction"),
                ))
            }
            "group.id" | "bootstrap.servers" | "auto.offset.reset" => {
                return Err(src.error(
                    k.span(),
                    format!("set `{key}` through `group-id`, `brokers` or `start` in [kafka], not in [kafka.properties]"),
                ))
            }
            _ => properties.push((key.to_string(), value)),
        }
    }
    let kafka = KafkaPlan {
        brokers: rk.brokers.as_ref().map(|b| b.get_ref().clone()),
        group_id,
        topics,
        start,
        properties,
    };

    // [postgres]
    let schema = match &raw.postgres.schema {
        Some(s) => ident(src, s)?,
        None => Ident::new("public").expect("static"),
    };
    let postgres = PostgresPlan {
        url: raw.postgres.url.as_ref().map(|u| u.get_ref().clone()),
        schema: schema.clone(),
        connections: match positive(
            src,
            &raw.postgres.connections,
            "connections",
            DEFAULT_CONNECTIONS as u64,
        )? {
            n @ 1..=64 => n as usize,
            _ => {
                let c = raw
                    .postgres
                    .connections
                    .as_ref()
                    .expect("the default is in range");
                return Err(src.error(c.span(), "`connections` must be between 1 and 64"));
            }
        },
    };

    // [batch]
    let max_records = positive(
        src,
        &raw.batch.max_records,
        "max-records",
        DEFAULT_MAX_RECORDS as u64,
    )? as usize;
    let linger = Duration::from_millis(positive(
        src,
        &raw.batch.linger_ms,
        "linger-ms",
        DEFAULT_LINGER_MS,
    )?);
    let max_record_bytes = positive(
        src,
        &raw.batch.max_record_bytes,
        "max-record-bytes",
        DEFAULT_MAX_RECORD_BYTES as u64,
    )? as usize;

    // [source]
    let format = match &raw.source {
        None => Format::Json,
        Some(s) => match s.get_ref().format.get_ref().as_str() {
            "json" => Format::Json,
            "debezium" => Format::Debezium,
            other => {
                return Err(src.error(
                    s.get_ref().format.span(),
                    format!("`format` must be \"json\" or \"debezium\", not `{other}`"),
                ))
            }
        },
    };

    let decimal_handling = match raw
        .source
        .as_ref()
        .and_then(|s| s.get_ref().decimal_handling.as_ref())
    {
        None => DecimalHandling::Auto,
        Some(d) => {
            if format != Format::Debezium {
                return Err(src.error(
                    d.span(),
                    "`decimal-handling` applies to format = \"debezium\"",
                ));
            }
            match d.get_ref().as_str() {
                "auto" => DecimalHandling::Auto,
                "precise" => DecimalHandling::Precise,
                "string" => DecimalHandling::String,
                "double" => DecimalHandling::Double,
                other => {
                    return Err(src.error(
                        d.span(),
                        format!(
                        "`decimal-handling` must be auto, precise, string or double, not `{other}`"
                    ),
                    ))
                }
            }
        }
    };

    // [fields]
    let mut plans = Vec::new();
    match &raw.fields {
        Some(f) if f.get_ref().is_empty() && format == Format::Json => {
            return Err(src.error(f.span(), "[fields] must declare at least one field"));
        }
        None if format == Format::Json => {
            return Err(src.error(0..0, "missing [fields]: declare at least one field"));
        }
        _ => {}
    }
    for (name, f) in raw.fields.iter().flat_map(|f| f.get_ref()) {
        plans.push(field_plan(src, name, f)?);
    }
    if format == Format::Debezium {
        for (name, ty) in CDC_FIELDS {
            plans.push(FieldPlan {
                name: Ident::new(name).expect("static"),
                pointer: format!("/{name}"),
                ty,
                time_zone: Tz::UTC,
                unit: EpochUnit::Millis,
                plausible: default_plausible_range(),
                optional: false,
            });
        }
    }
    let fields = Fields { src, plans };

    // [identity]
    let default_identity = crate::config::raw::RawIdentity {
        key: None,
        generation: None,
        partition_by: None,
    };
    let ri = match (&raw.identity, format) {
        (Some(i), _) => i.get_ref(),
        (None, Format::Debezium) => &default_identity,
        (None, Format::Json) => {
            return Err(src.error(0..0, "missing [identity]: name the delivery key fields"))
        }
    };
    let key = match (&ri.key, format) {
        (Some(k), _) => fields.list(k, "key")?,
        (None, Format::Debezium) => CDC_FIELDS[..3]
            .iter()
            .map(|(n, _)| {
                fields
                    .plans
                    .iter()
                    .position(|f| f.name.as_str() == *n)
                    .expect("built-in")
            })
            .collect(),
        (None, Format::Json) => {
            return Err(src.error(
                raw.identity.as_ref().map(|i| i.span()).unwrap_or(0..0),
                "[identity] needs `key`",
            ))
        }
    };
    let key_spans: Vec<Spanned<String>> = match &ri.key {
        Some(k) => k.get_ref().clone(),
        None => Vec::new(),
    };
    for (&i, s) in key.iter().zip(&key_spans) {
        let f = &fields.plans[i];
        if f.optional {
            return Err(src.error(
                s.span(),
                format!("key field `{}` must not be optional", s.get_ref()),
            ));
        }
        if f.ty == FieldType::Jsonb {
            return Err(src.error(
                s.span(),
                format!("key field `{}` cannot be jsonb", s.get_ref()),
            ));
        }
    }
    let generation = match &ri.generation {
        Some(g) if g.get_ref().trim().is_empty() => {
            return Err(src.error(
                g.span(),
                "`generation` must not be empty (leave it out instead)",
            ))
        }
        g => g.as_ref().map(|g| g.get_ref().clone()),
    };
    let partition_by = match &ri.partition_by {
        None => None,
        Some(p) => {
            let i = fields.index(p)?;
            let f = &fields.plans[i];
            if f.ty != FieldType::Date || f.optional {
                return Err(src.error(
                    p.span(),
                    format!(
                        "`partition-by` must name a non-optional `date` field; `{}` is {}",
                        p.get_ref(),
                        f.ty.sql()
                    ),
                ));
            }
            Some(i)
        }
    };

    // [ledger]
    let ledger_name = match &raw.ledger.table {
        Some(t) => ident(src, t)?,
        None => Ident::new(DEFAULT_LEDGER_TABLE).expect("static"),
    };
    if ledger_name.as_str().len() > 53 {
        let t = raw.ledger.table.as_ref().expect("default is short");
        return Err(src.error(
            t.span(),
            "ledger table name must be at most 53 bytes (day partitions add `_pYYYYMMDD`)",
        ));
    }
    let horizon_days = match &raw.ledger.horizon_days {
        None => None,
        Some(h) => {
            if *h.get_ref() <= 0 || *h.get_ref() > 100_000 {
                return Err(src.error(h.span(), "`horizon-days` must be between 1 and 100000"));
            }
            if partition_by.is_none() {
                return Err(src.error(
                    h.span(),
                    "`horizon-days` needs `identity.partition-by` (the day the horizon counts)",
                ));
            }
            Some(*h.get_ref() as u32)
        }
    };
    let mut columns = Vec::new();
    for c in &raw.ledger.columns {
        let i = fields.index(c)?;
        if !key.contains(&i) && Some(i) != partition_by && !columns.contains(&i) {
            columns.push(i);
        }
    }
    let ledger = LedgerPlan {
        table: QualifiedName {
            schema: schema.clone(),
            name: ledger_name,
        },
        horizon_days,
        columns,
    };

    // [[filter]]
    let mut filters = Vec::new();
    let mut filter_names = HashSet::new();
    for f in &raw.filter {
        let rf = f.get_ref();
        let name = rf.name.get_ref().trim().to_string();
        if name.is_empty() || !filter_names.insert(name.clone()) {
            return Err(src.error(rf.name.span(), "filter names must be non-empty and unique"));
        }
        let program = fields.compile_cel(&rf.drop_if)?;
        filters.push(FilterPlan {
            name,
            expr: rf.drop_if.get_ref().clone(),
            program,
        });
    }

    // [[projection]]
    let mut projections = Vec::new();
    let mut names = HashSet::new();
    for (n, p) in raw.projection.iter().enumerate() {
        let skip_snapshots = format == Format::Debezium
            && p.get_ref().kind.get_ref() != "row"
            && p.get_ref().snapshots.as_ref().map(|s| s.get_ref().as_str()) != Some("include");
        let pass_column = if p.get_ref().filter.is_some() || skip_snapshots {
            Some(
                projections
                    .iter()
                    .filter(|p: &&ProjectionPlan| p.pass_column.is_some())
                    .count(),
            )
        } else {
            None
        };
        let plan = projection(
            src,
            format,
            &fields,
            &schema,
            &key,
            partition_by,
            p,
            n,
            pass_column,
        )?;
        if !names.insert(plan.name.clone()) {
            return Err(src.error(
                p.span(),
                format!("two projections are named `{}`; set `name`", plan.name),
            ));
        }
        projections.push(plan);
    }

    Ok(Pipeline {
        format,
        decimal_handling,
        source: src.clone(),
        kafka,
        postgres,
        max_records,
        linger,
        max_record_bytes,
        identity: IdentityPlan {
            key,
            generation,
            partition_by,
        },
        fields: fields.plans,
        ledger,
        filters,
        projections,
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
/// encoding is part of replaysafe's interface (README "Tables"): changing it would re-key every consumer.
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

fn table_name(src: &Source, schema: &Ident, t: &Spanned<String>) -> Result<QualifiedName> {
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

#[allow(clippy::too_many_arguments)]
fn projection(
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
            let plan = super::row::compile(
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
                super::row::VersionPlan::SourcePosition => "source-position".to_string(),
                super::row::VersionPlan::Field(i) => {
                    used.push(fields[*i].name.as_str().to_string());
                    fields[*i].name.as_str().to_string()
                }
                super::row::VersionPlan::Column(c) => format!("column {}", c.as_str()),
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

/// A field's definition as compared by the ledger check: path, type, and what changes its values.
fn field_definition(f: &FieldPlan) -> String {
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
fn cel_fields(program: &Program, fields: &[FieldPlan]) -> Vec<String> {
    program
        .references()
        .variables()
        .iter()
        .filter_map(|v| fields.iter().find(|f| f.name.as_str() == *v))
        .map(|f| f.name.as_str().to_string())
        .collect()
}
