//! Stage two: the validated pipeline. Identifiers are checked ([`Ident`]), field references resolved to
//! indices, filters compiled (CEL), projections compiled to SQL over the `landed` relation.

use std::collections::HashSet;
use std::time::Duration;

use cel_interpreter::Program;
use chrono_tz::Tz;
use toml::Spanned;

use super::fields::{
    compile_cel, default_plausible_range, field_plan, ident, DecimalHandling, EpochUnit, FieldPlan,
    FieldType, Fields, Format, CDC_FIELDS,
};
use super::kafka::{kafka, KafkaPlan};
use super::raw::RawPipeline;
use super::source::Source;
use super::timeouts::{timeouts, Timeouts};
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};
use crate::projection::row::plan::{TombstoneMode, VersionPlan};
use crate::projection::ProjectionPlan;

/// Default `batch.max-records`.
pub const DEFAULT_MAX_RECORDS: usize = 5000;
/// Default `batch.max-bytes` (8 MiB): a partition batch holds at most this many bytes of record keys and values.
pub const DEFAULT_MAX_BYTES: usize = 8 * 1024 * 1024;
/// Default `batch.linger-ms`.
pub const DEFAULT_LINGER_MS: u64 = 50;
/// Default `batch.max-record-bytes` (8 MiB): larger record values are quarantined as `oversize`.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 8 * 1024 * 1024;
/// Default `postgres.connections`: partitions are committed in parallel on this many connections.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Default `ledger.table`.
pub const DEFAULT_LEDGER_TABLE: &str = "replaysafe_ledger";
/// The validated pipeline.
#[derive(Debug)]
pub struct Pipeline {
    /// What the record values are: JSON events or Debezium change events.
    pub format: Format,
    /// Debezium without schemas: how `numeric` values are encoded.
    pub decimal_handling: DecimalHandling,
    /// Debezium: the connector's `interval.handling.mode` as `[source] interval-handling` says it.
    pub interval_handling: super::IntervalHandling,
    /// `[source] encoding`: plain JSON, or schema-registry framed Avro / JSON.
    pub encoding: super::Encoding,
    /// `[source] schema-registry` when the encoding needs one; its client (with the schema cache) is
    /// `crate::decode::registry::client`.
    pub registry: Option<super::RegistryPlan>,
    /// Where the pipeline came from (for messages).
    pub source: Source,
    /// `[kafka]`.
    pub kafka: KafkaPlan,
    /// `[postgres]`.
    pub postgres: PostgresPlan,
    /// Records per partition batch (one transaction), at most.
    pub max_records: usize,
    /// Bytes of record keys and values per partition batch, at most (a record larger than this is a batch of its
    /// own). With `max_records`, it bounds what a worker holds: read-ahead stops at `connections` batches' worth of
    /// either while a flush is in flight, so memory follows the bytes, not only the count, of large records
    /// (Debezium envelopes with their schema are ~3 KB, rows with large text far more).
    pub max_bytes: usize,
    /// How long a partial batch may wait for more records.
    pub linger: Duration,
    /// Record values larger than this many bytes are quarantined as `oversize`.
    pub max_record_bytes: usize,
    /// `[fields]`, in name order; indices elsewhere point into this.
    pub fields: Vec<FieldPlan>,
    /// Whether every field is a built-in CDC field read as itself (`_source` at `/_source`, …): a Debezium
    /// record's document then needs nothing of the envelope (`decode::debezium::envelope::Doc::BuiltIns`).
    pub built_in_fields_only: bool,
    /// `[identity]`.
    pub identity: IdentityPlan,
    /// `[ledger]`.
    pub ledger: LedgerPlan,
    /// `[[filter]]` rules, in file order.
    pub filters: Vec<FilterPlan>,
    /// `[[projection]]`s, in file order (also the order they run in each batch).
    pub projections: Vec<ProjectionPlan>,
    /// `[errors]`: the declared error tolerance.
    pub errors: super::errors::ErrorsPlan,
    /// `[outbox]`: the outbox relay's settings.
    pub outbox: super::outbox::OutboxPlan,
    /// `[source] transactions = "atomic"`: Debezium source transactions buffered and applied in one batch
    /// transaction (`None`: per record, the default).
    pub transactions: Option<super::txn::TxPlan>,
}

/// `[postgres]`, validated.
#[derive(Debug, Clone)]
pub struct PostgresPlan {
    /// Connection string (after `${NAME}` expansion); `None` means `DATABASE_URL`.
    pub url: Option<String>,
    /// TLS and password settings (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `password-file`).
    pub connection: super::ConnectionPlan,
    /// The schema all replaysafe tables and unqualified projection tables live in.
    pub schema: Ident,
    /// Connections used to commit partitions in parallel.
    pub connections: usize,
    /// Lock, statement and idle-in-transaction timeouts pinned on every session.
    pub timeouts: Timeouts,
    /// `manage-schema` (default true): `run`, `load`, `backfill` and `rebuild` create missing tables and ledger
    /// day partitions and prune expired partitions. `false` (or `run --no-ddl`): they issue no DDL — the tables
    /// and partitions must exist (`replaysafe init` by their owner), a missing partition stops the batch uncommitted
    /// (docs/operations.md "Privileges").
    pub manage_schema: bool,
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

/// `[ledger] future-days` when not set: the days `init` creates ahead by default.
pub const DEFAULT_FUTURE_DAYS: u32 = 7;

/// The largest `[ledger] future-days`: what `init --days` accepts, so a `--no-ddl` pipeline's missing partition
/// can always be created by the `init` its error names.
pub const MAX_FUTURE_DAYS: u32 = 366;

/// `[ledger]`.
#[derive(Debug, Clone)]
pub struct LedgerPlan {
    /// The ledger table.
    pub table: QualifiedName,
    /// Days the ledger keeps; events older are quarantined as `beyond-horizon`; `None` keeps everything.
    pub horizon_days: Option<u32>,
    /// `future-days` (0..=[`MAX_FUTURE_DAYS`], default [`DEFAULT_FUTURE_DAYS`]): how many days after the
    /// database's UTC date an event's partition-by day may be; later ones are quarantined as `future-day` (no
    /// ledger partition is created for them). Only with `partition-by`.
    pub future_days: u32,
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

impl Pipeline {
    /// The field with this index.
    pub fn field(&self, i: usize) -> &FieldPlan {
        &self.fields[i]
    }

    /// Qualifies a replaysafe-owned table name with the pipeline schema.
    pub fn table(&self, name: &str) -> QualifiedName {
        QualifiedName {
            schema: self.postgres.schema.clone(),
            name: Ident::new(name).expect("a built-in name is a valid SQL identifier"),
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
                "the ledger keeps the days of `{}` from today − {d} on (by the database's UTC date); older partitions are dropped {}, the day pruned below is kept in replaysafe_horizon and only moves forward (a longer horizon-days later does not reopen pruned days), and every claim older than it — run, load, backfill, rebuild — is quarantined as beyond-horizon in its batch transaction",
                self.fields[p].name.as_str(),
                if self.postgres.manage_schema {
                    "on start and every --prune-interval (with run --no-ddl: by `init`)"
                } else {
                    "by `init` (manage-schema = false: run the owner's `init --days N` daily)"
                }
            ),
            _ => "no horizon: the ledger keeps every delivery key forever".to_string(),
        };
        let horizon = match self.identity.partition_by {
            Some(_) => format!(
                "{horizon}; an event day after today + {} (future-days) is quarantined as future-day, with no ledger partition",
                self.ledger.future_days
            ),
            None => horizon,
        };
        let rows: Vec<String> = self
            .projections
            .iter()
            .filter_map(|p| {
                let r = p.row.as_ref()?;
                let version = match &r.version {
                    VersionPlan::SourcePosition => {
                        "the source position [commit LSN, change LSN]".to_string()
                    }
                    VersionPlan::Field(i) => {
                        format!("the field `{}`", self.fields[*i].name.as_str())
                    }
                    VersionPlan::Column(c) => format!("the column `{}`", c.as_str()),
                };
                let tomb = match r.tombstones {
                    TombstoneMode::Table => {
                        format!("tombstones in {}", r.tombstone_table)
                    }
                    TombstoneMode::Column => "tombstones as `_deleted_at`".to_string(),
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
                 versioned tombstone (kept for good, or with horizon-days as long as the horizon: the prune purges older ones), so an older write never resurrects a row; \
                 an equal version with a different state is a conflict recorded in replaysafe_conflicts; stale and \
                 conflicting changes are the row projections' verdict only: every other projection gets each claimed \
                 change once, whatever its version or arrival order; a copy of a state already claimed at its \
                 version reaches only the projections it gives values no earlier copy gave them (the outbox gets \
                 every event id); aggregates are commutative increments of the changes \
                 claimed",
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
             3. What commits atomically: one transaction per partition batch (at most {max} records or {bytes} bytes of keys and values, {linger} ms): ledger \
             claims, projections [{projections}], dead letters and the checkpoint of group `{group}`; the Kafka offset is \
             committed after it.\n\
             4. How long the guarantees survive: {horizon}.",
            ledger = self.ledger.table,
            max = self.max_records,
            bytes = self.max_bytes,
            linger = self.linger.as_millis(),
            group = self.kafka.group_id,
        )
    }
}

fn positive(src: &Source, v: &Option<Spanned<i64>>, key: &str, default: u64) -> Result<u64> {
    match v {
        None => Ok(default),
        Some(s) if *s.get_ref() > 0 => Ok(crate::units::count(*s.get_ref())),
        Some(s) => Err(src.error(s.span(), format!("`{key}` must be a positive whole number"))),
    }
}

/// Turns the raw file into a [`Pipeline`].
///
/// # Errors
/// [`Error::Config`] naming `file:line:column` of the first problem.
pub fn validate(src: &Source, raw: RawPipeline) -> Result<Pipeline> {
    let kafka = kafka(src, &raw)?;
    let postgres = postgres(src, &raw)?;
    let schema = postgres.schema.clone();
    // [batch]
    let max_records = positive(
        src,
        &raw.batch.max_records,
        "max-records",
        DEFAULT_MAX_RECORDS as u64,
    )
    .map(crate::units::len)?;
    let max_bytes = positive(
        src,
        &raw.batch.max_bytes,
        "max-bytes",
        DEFAULT_MAX_BYTES as u64,
    )
    .map(crate::units::len)?;
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
    )
    .map(crate::units::len)?;

    let (format, decimal_handling) = source(src, &raw)?;
    let interval_handling = interval_handling(src, &raw, format)?;
    let transactions = super::txn::plan(src, raw.source.as_ref().map(|s| s.get_ref()), format)?;
    if transactions.is_some() && !kafka.topics.iter().any(|t| t.contains("transaction")) {
        tracing::warn!(
            "transactions = \"atomic\" but no topic of [kafka] topics names a transaction topic (Debezium's \
             <topic.prefix>.transaction): without END events every transaction waits transaction-timeout-ms and \
             is applied as it is"
        );
    }
    let fields = fields(src, &raw, format)?;
    let identity = identity(src, &raw, format, &fields)?;
    let ledger = ledger(src, &raw, &schema, &fields, &identity)?;
    let filters = filters(src, &raw, &fields)?;
    let projections = projections(src, &raw, format, &fields, &schema, &identity)?;
    refuse_own_tables(src, &raw, &schema, &ledger.table)?;
    let errors = super::errors::errors(src, raw.errors.as_ref())?;
    let outbox = super::outbox::outbox(
        src,
        raw.outbox.as_ref(),
        &kafka.topics,
        crate::units::ms(postgres.timeouts.idle_in_transaction),
        projections
            .iter()
            .any(|p| p.kind == crate::projection::ProjectionKind::Outbox),
    )?;
    let rs = raw.source.as_ref().map(|s| s.get_ref());
    let (encoding, registry) = super::registry::registry(
        src,
        rs.and_then(|s| s.encoding.as_ref()),
        rs.and_then(|s| s.schema_registry.as_ref()),
    )?;

    Ok(Pipeline {
        format,
        decimal_handling,
        interval_handling,
        encoding,
        registry,
        source: src.clone(),
        kafka,
        postgres,
        transactions,
        max_records,
        max_bytes,
        linger,
        max_record_bytes,
        identity,
        built_in_fields_only: fields.plans.iter().all(is_built_in),
        fields: fields.plans,
        ledger,
        filters,
        projections,
        errors,
        outbox,
    })
}

/// `[postgres]`: url, schema, connections (1 to 64), timeouts ([`timeouts`]).
fn postgres(src: &Source, raw: &RawPipeline) -> Result<PostgresPlan> {
    let schema = match &raw.postgres.schema {
        Some(s) => ident(src, s)?,
        None => Ident::new("public").expect("a built-in name is a valid SQL identifier"),
    };
    Ok(PostgresPlan {
        url: match &raw.postgres.url {
            Some(u) => Some(super::expand::expand_as(
                src,
                u.get_ref(),
                u.span(),
                super::expand::Secrecy::Url,
            )?),
            None => None,
        },
        connection: super::connection::connection(src, &raw.postgres)?,
        schema: schema.clone(),
        connections: match positive(
            src,
            &raw.postgres.connections,
            "connections",
            DEFAULT_CONNECTIONS as u64,
        )? {
            n @ 1..=64 => crate::units::len(n),
            _ => {
                let c = raw
                    .postgres
                    .connections
                    .as_ref()
                    .expect("the default is in range");
                return Err(src.error(c.span(), "`connections` must be between 1 and 64"));
            }
        },
        timeouts: timeouts(src, &raw.postgres)?,
        manage_schema: raw
            .postgres
            .manage_schema
            .as_ref()
            .is_none_or(|m| *m.get_ref()),
    })
}

/// `[source] interval-handling` (Debezium only): `numeric` (default, as the connector's) or `string`.
fn interval_handling(
    src: &Source,
    raw: &RawPipeline,
    format: Format,
) -> Result<super::IntervalHandling> {
    let Some(i) = raw
        .source
        .as_ref()
        .and_then(|s| s.get_ref().interval_handling.as_ref())
    else {
        return Ok(super::IntervalHandling::Numeric);
    };
    if format != Format::Debezium {
        return Err(src.error(
            i.span(),
            "`interval-handling` applies to format = \"debezium\"",
        ));
    }
    match i.get_ref().as_str() {
        "numeric" => Ok(super::IntervalHandling::Numeric),
        "string" => Ok(super::IntervalHandling::String),
        other => Err(src.error(
            i.span(),
            format!("`interval-handling` must be \"numeric\" or \"string\", not `{other}`"),
        )),
    }
}

/// `[source]`: the format and (Debezium) the decimal handling.
fn source(src: &Source, raw: &RawPipeline) -> Result<(Format, DecimalHandling)> {
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
    Ok((format, decimal_handling))
}

/// `[fields]` (at least one for JSON events; Debezium pipelines add the built-in CDC fields).
fn fields<'a>(src: &'a Source, raw: &RawPipeline, format: Format) -> Result<Fields<'a>> {
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
                name: Ident::new(name).expect("a built-in name is a valid SQL identifier"),
                pointer: format!("/{name}"),
                ty,
                time_zone: Tz::UTC,
                unit: EpochUnit::Millis,
                plausible: default_plausible_range(),
                optional: false,
            });
        }
    }
    Ok(Fields { src, plans })
}

/// Whether a field is one of the built-in CDC fields ([`CDC_FIELDS`]) read as itself (`/_source` as `_source`, …).
fn is_built_in(f: &FieldPlan) -> bool {
    CDC_FIELDS
        .iter()
        .any(|(n, _)| f.name.as_str() == *n && f.pointer.strip_prefix('/') == Some(*n))
}

/// `[identity]`: the delivery key fields (Debezium default: the source position), generation, partition-by.
fn identity(
    src: &Source,
    raw: &RawPipeline,
    format: Format,
    fields: &Fields<'_>,
) -> Result<IdentityPlan> {
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
                    .expect("every built-in field is in the field plans")
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
    Ok(IdentityPlan {
        key,
        generation,
        partition_by,
    })
}

/// `[ledger]`: table (at most 53 bytes), horizon (needs partition-by), extra columns.
fn ledger(
    src: &Source,
    raw: &RawPipeline,
    schema: &Ident,
    fields: &Fields<'_>,
    identity: &IdentityPlan,
) -> Result<LedgerPlan> {
    let ledger_name = match &raw.ledger.table {
        Some(t) => ident(src, t)?,
        None => {
            Ident::new(DEFAULT_LEDGER_TABLE).expect("a built-in name is a valid SQL identifier")
        }
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
            if identity.partition_by.is_none() {
                return Err(src.error(
                    h.span(),
                    "`horizon-days` needs `identity.partition-by` (the day the horizon counts)",
                ));
            }
            Some(u32::try_from(*h.get_ref()).expect("within the range checked above"))
        }
    };
    let future_days = match &raw.ledger.future_days {
        None => DEFAULT_FUTURE_DAYS,
        Some(f) => {
            if *f.get_ref() < 0 || *f.get_ref() > i64::from(MAX_FUTURE_DAYS) {
                return Err(src.error(
                    f.span(),
                    format!("`future-days` must be between 0 and {MAX_FUTURE_DAYS}"),
                ));
            }
            if identity.partition_by.is_none() {
                return Err(src.error(
                    f.span(),
                    "`future-days` needs `identity.partition-by` (the day it bounds)",
                ));
            }
            u32::try_from(*f.get_ref()).expect("within 0..=MAX_FUTURE_DAYS, checked above")
        }
    };
    let mut columns = Vec::new();
    for c in &raw.ledger.columns {
        let i = fields.index(c)?;
        if !identity.key.contains(&i) && Some(i) != identity.partition_by && !columns.contains(&i) {
            columns.push(i);
        }
    }
    Ok(LedgerPlan {
        table: QualifiedName {
            schema: schema.clone(),
            name: ledger_name,
        },
        horizon_days,
        future_days,
        columns,
    })
}

/// The tables replaysafe keeps beside the ledger in the pipeline's schema (each one's constant lives with the
/// code that creates it: `sink::checkpoint`, `sink::dead_letters`, `sink::ledger`, `sink::projset`,
/// `sink::lifecycle`, `projection::row::table`; a test there keeps this list complete).
pub const OWN_TABLES: &[&str] = &[
    "replaysafe_checkpoints",
    "replaysafe_group_starts",
    "replaysafe_dead_letters",
    "replaysafe_sources",
    "replaysafe_horizon",
    "replaysafe_projection_set",
    "replaysafe_projection_handover",
    "replaysafe_pruned",
    "replaysafe_conflicts",
    "replaysafe_truncates",
    "replaysafe_row_versions",
];

/// What of replaysafe's own a table name in the pipeline's schema would be: one of [`OWN_TABLES`], the ledger,
/// its key type (`<ledger>_key`), a day partition (`<ledger>_pYYYYMMDD`) or a rebuild's pending table
/// (`<ledger>_rebuilding`); `None` for a free name.
pub fn own_table(ledger: &QualifiedName, t: &QualifiedName) -> Option<&'static str> {
    if t.schema != ledger.schema {
        return None;
    }
    let (name, l) = (t.name.as_str(), ledger.name.as_str());
    if OWN_TABLES.contains(&name) {
        return Some("one of replaysafe's own tables");
    }
    match name.strip_prefix(l) {
        Some("") => Some("the ledger"),
        Some("_key") => Some("the ledger's key type"),
        Some("_rebuilding") => Some("the ledger's rebuild table"),
        Some(rest)
            if rest.len() == 10
                && rest.starts_with("_p")
                && rest[2..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some("a day partition of the ledger")
        }
        _ => None,
    }
}

/// Refuses a projection `table` that names one of replaysafe's own tables ([`own_table`]): its DDL and writes would
/// land in replaysafe's bookkeeping.
fn refuse_own_tables(
    src: &Source,
    raw: &RawPipeline,
    schema: &Ident,
    ledger: &QualifiedName,
) -> Result<()> {
    for p in &raw.projection {
        let Some(t) = p.get_ref().table.as_ref() else {
            continue;
        };
        let q = super::fields::table_name(src, schema, t)?;
        if let Some(what) = own_table(ledger, &q) {
            return Err(src.error(
                t.span(),
                format!(
                    "projection table `{q}` is {what}; name the projection's table differently"
                ),
            ));
        }
    }
    Ok(())
}

/// `[[filter]]`: uniquely named drop rules, compiled.
fn filters(src: &Source, raw: &RawPipeline, fields: &Fields<'_>) -> Result<Vec<FilterPlan>> {
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
    Ok(filters)
}

/// `[[projection]]`: each compiled by its kind (see [`crate::projection`]), names unique; a pass column in
/// `landed` for each that has a filter (or, Debezium, skips snapshot reads).
fn projections(
    src: &Source,
    raw: &RawPipeline,
    format: Format,
    fields: &Fields<'_>,
    schema: &Ident,
    identity: &IdentityPlan,
) -> Result<Vec<ProjectionPlan>> {
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
        let plan = crate::projection::projection(
            src,
            format,
            fields,
            schema,
            &identity.key,
            identity.partition_by,
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
    Ok(projections)
}
