//! The ledger: its DDL, the claim statement (`INSERT … ON CONFLICT DO NOTHING RETURNING`), its day partitions,
//! and the horizon (claim horizon read in the batch transaction, prune of expired partitions).
//!
//! `claim` — the claim statement and step 2 of the batch transaction; `partitions` — the day partitions;
//! `horizon` — the claim horizon and the prune.

mod claim;
mod horizon;
mod partitions;

pub(in crate::sink) use claim::claim_batch;
pub use claim::{claim, param_type};
pub(in crate::sink) use horizon::apply_horizon;
pub use horizon::{
    claim_horizon, current_horizon, drop_expired_partitions, horizon_start, Horizon,
};
pub(in crate::sink) use partitions::ensure_batch_partitions;
pub use partitions::{
    create_partitions_ahead, ensure_partitions, existing_partitions, partition_name,
    require_key_constraints, DEFAULT_DAYS_AHEAD,
};

use tokio_postgres::GenericClient;

use crate::config::{FieldType, Pipeline};
use crate::ident::{Ident, QualifiedName};

/// Ledger columns other than the fixed bookkeeping ones: `(column, type)` for the key fields, the
/// partition-by field and `ledger.columns`, in that order without repeats.
pub fn ledger_field_columns(p: &Pipeline) -> Vec<usize> {
    let mut cols: Vec<usize> = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !cols.contains(&pb) {
            cols.push(pb);
        }
    }
    for &c in &p.ledger.columns {
        if !cols.contains(&c) {
            cols.push(c);
        }
    }
    cols
}

/// The fields of the delivery key as the ledger keeps it: the key fields, then the partition-by field.
fn key_fields(p: &Pipeline) -> Vec<usize> {
    let mut idx = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !idx.contains(&pb) {
            idx.push(pb);
        }
    }
    idx
}

/// The ledger's delivery-key columns: generation, key fields, partition-by field (a primary key of a ledger of
/// the earlier layout; the fields of [`key_type`]).
pub fn ledger_pk(p: &Pipeline) -> Vec<String> {
    let mut pk = vec!["generation".to_string()];
    pk.extend(key_fields(p).iter().map(|&i| p.fields[i].name.to_string()));
    pk
}

/// The ledger's delivery-key type, `<ledger>_key` beside it: a composite of the [`ledger_pk`] columns with their
/// types. Each day partition (the table itself without `partition-by`) holds `EXCLUDE USING hash` on a row of
/// it ([`key_constraint`]): two rows with equal keys cannot both be there, like the primary key it replaces, and
/// the claim's `ON CONFLICT DO NOTHING` (no conflict target) takes it as its arbiter. Why a hash and not a
/// B-tree: a hash index entry holds a 4-byte hash code whatever the key (PostgreSQL manual, "Hash Indexes"),
/// so the ledger's index is ≈ 31 bytes/event instead of ≈ 52 (issue 15: ledger ≤ 100 bytes/event); a hash index
/// is single-column, hence the composite (hashable since PostgreSQL 14: `record_ops`), and it cannot be `UNIQUE`,
/// hence an exclusion constraint (manual, "CREATE TABLE" → `EXCLUDE`; `ON CONFLICT DO NOTHING` accepts exclusion
/// constraints as arbiters, `DO UPDATE` does not — the ledger never updates).
pub fn key_type(p: &Pipeline) -> QualifiedName {
    QualifiedName {
        schema: p.ledger.table.schema.clone(),
        name: Ident::new(&format!("{}_key", p.ledger.table.name.as_str()))
            .expect("a ledger name of at most 53 bytes leaves room for `_key`"),
    }
}

/// The types of [`key_type`]'s fields, in [`ledger_pk`]'s order, as PostgreSQL's `format_type` spells them.
pub fn key_type_fields(p: &Pipeline) -> Vec<&'static str> {
    let mut types = vec!["text"];
    types.extend(key_fields(p).iter().map(|&i| match p.fields[i].ty.sql() {
        "timestamptz" => "timestamp with time zone",
        other => other,
    }));
    types
}

/// `CREATE TYPE` for [`key_type`].
pub fn create_key_type(p: &Pipeline) -> String {
    let attrs: Vec<String> = ledger_pk(p)
        .iter()
        .zip(key_type_fields(p))
        .map(|(name, ty)| format!("{name} {ty}"))
        .collect();
    format!("CREATE TYPE {} AS ({})", key_type(p), attrs.join(", "))
}

/// The delivery key of ledger row `alias` (columns as in [`ledger_pk`]; `""` for the bare column names) as a
/// [`key_type`] value — the expression the key constraint's hash index is built on, so a lookup written with it
/// uses the index.
pub fn key_row(p: &Pipeline, alias: &str) -> String {
    let dot = if alias.is_empty() { "" } else { "." };
    let cols: Vec<String> = ledger_pk(p)
        .iter()
        .map(|c| format!("{alias}{dot}{c}"))
        .collect();
    format!("ROW({})::{}", cols.join(", "), key_type(p))
}

/// The table constraint every day partition (or the unpartitioned ledger) holds: no two rows with equal
/// delivery keys ([`key_type`]). `fillfactor = 100`: the index's buckets split when full (75 by default),
/// which keeps it ≈ 31 bytes/event under random keys (B-tree: ≈ 52; hash at 75: ≈ 45; measured on 300,000 keys).
pub fn key_constraint(p: &Pipeline) -> String {
    format!(
        "EXCLUDE USING hash (({}) WITH =) WITH (fillfactor = 100)",
        key_row(p, "")
    )
}

/// Whether the ledger's delivery keys are kept by [`key_constraint`]s (no primary key on the ledger). A ledger
/// created before them keeps its primary key, and its new day partitions inherit it.
///
/// # Errors
/// [`crate::error::Error::Postgres`].
pub async fn key_is_hashed(c: &impl GenericClient, p: &Pipeline) -> crate::error::Result<bool> {
    Ok(c.query_one(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass($1) AND indisprimary)",
        &[&p.ledger.table.to_string()],
    )
    .await?
    .get(0))
}

/// Name of the sources table (in the pipeline schema): the `(topic, partition, consumer group)` a ledger row was
/// claimed from, interned as a `smallint` id ([`create_sources`]).
pub const SOURCES: &str = "replaysafe_sources";

/// `CREATE TABLE` for the sources table: `id` (smallint identity, referenced by the ledger's `_source_id`) →
/// `(topic, partition, consumer_group)`, with the time it was first claimed from (`created_at`). Rows are never
/// changed or deleted. At most 32,767 sources per schema: one more fails the claim loudly (the identity's
/// maximum), never silently.
pub fn create_sources(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id smallint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
         topic text NOT NULL, partition integer NOT NULL, consumer_group text NOT NULL, \
         created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (topic, partition, consumer_group))",
        p.table(SOURCES)
    )
}

/// Inserts the batch's source (`$1` topic, `$2` partition int4, `$3` consumer group) when missing, run in the batch
/// transaction before the claim. `WHERE NOT EXISTS` first, so an existing source takes no identity value; a
/// concurrent first insert of the same source is waited for by `ON CONFLICT` and seen by the claim (a new
/// statement under READ COMMITTED).
pub fn ensure_source(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {t} (topic, partition, consumer_group) SELECT $1, $2, $3 WHERE NOT EXISTS \
         (SELECT 1 FROM {t} WHERE topic = $1 AND partition = $2 AND consumer_group = $3) ON CONFLICT DO NOTHING",
        t = p.table(SOURCES)
    )
}

/// The ledger rows with their provenance spelled out, for readers: a parenthesised subquery over `table` (the
/// ledger, or one of its day partitions, as written in SQL) with every ledger column plus `topic`, `partition`
/// and `consumer_group` from the sources table; use it as `FROM {ledger_rows} l`.
pub fn ledger_rows_of(p: &Pipeline, table: &str) -> String {
    format!(
        "(SELECT l_.*, s_.topic, s_.partition, s_.consumer_group FROM {table} l_ JOIN {} s_ ON s_.id = l_._source_id)",
        p.table(SOURCES)
    )
}

/// [`ledger_rows_of`] the whole ledger.
pub fn ledger_rows(p: &Pipeline) -> String {
    ledger_rows_of(p, &p.ledger.table.to_string())
}

/// Storage order of a field column: 8-byte aligned types first, then 4-byte, then the rest (uuid, varlena), so
/// that PostgreSQL pads no byte between them (`pg_type.typalign`).
fn align_rank(ty: FieldType) -> u8 {
    match ty {
        FieldType::Bigint | FieldType::Timestamptz => 0,
        FieldType::Date => 1,
        _ => 3,
    }
}

/// `CREATE TABLE` for the ledger (range-partitioned by day when `partition-by` is set). Per row: `offset`
/// (bigint), the key / partition-by / `ledger.columns` fields, `_source_id` (smallint into [`SOURCES`]: topic,
/// partition, consumer group) and `generation` (text, '' for none), ordered so no alignment padding falls
/// between them; the claim time is not kept per row (`replaysafe_sources.created_at` is the source's first).
/// The seed pipeline's row is 56 bytes + a 4-byte line pointer (was 132 + 4 with topic, group and time). No
/// primary key: the delivery keys are kept by [`key_constraint`] on each day partition (created by the day
/// partitions' DDL; on the table itself without `partition-by`); [`create_key_type`] must have run before.
pub fn create_ledger(p: &Pipeline) -> String {
    let mut defs = vec!["\"offset\" bigint NOT NULL".to_string()];
    let key_like: Vec<usize> = {
        let mut k = p.identity.key.clone();
        k.extend(p.identity.partition_by);
        k
    };
    let mut fields = ledger_field_columns(p);
    fields.sort_by_key(|&i| align_rank(p.fields[i].ty));
    let def = |i: usize| {
        let f = &p.fields[i];
        let null = if key_like.contains(&i) {
            " NOT NULL"
        } else {
            ""
        };
        format!("{} {}{null}", f.name, f.ty.sql())
    };
    let (fixed, rest): (Vec<usize>, Vec<usize>) = fields
        .into_iter()
        .partition(|&i| align_rank(p.fields[i].ty) < 3);
    defs.extend(fixed.into_iter().map(def));
    defs.push("_source_id smallint NOT NULL".to_string());
    defs.push("generation text NOT NULL DEFAULT ''".to_string());
    defs.extend(rest.into_iter().map(def));
    let partition = match p.identity.partition_by {
        Some(i) => format!(" PARTITION BY RANGE ({})", p.fields[i].name),
        None => {
            defs.push(key_constraint(p));
            String::new()
        }
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}){partition}",
        p.ledger.table,
        defs.join(", ")
    )
}

/// Migrates `table`, a ledger of the first layout (per row `topic`, `partition`, `consumer_group` text and
/// `landed_at`) or its rebuild's pending table (same columns), in place, in the caller's transaction: its sources are interned into [`SOURCES`], every row gets its
/// `_source_id` (a source's `created_at` is its first row's `landed_at`, so `ledger stats` keeps its rate), and the
/// four columns are dropped. The delivery keys (primary key, rows, day partitions, grants)
/// stay as they were, so nothing already claimed is forgotten. Rows are rewritten once (the old partitions'
/// space is reused after VACUUM or freed when the horizon drops them); new day partitions get the compact rows.
pub fn upgrade_ledger(p: &Pipeline, table: &str) -> String {
    let (l, s) = (table, p.table(SOURCES).to_string());
    format!(
        "ALTER TABLE {l} ADD COLUMN _source_id smallint; \
         INSERT INTO {s} (topic, partition, consumer_group, created_at) \
           SELECT topic, partition, consumer_group, min(landed_at) FROM {l} GROUP BY 1, 2, 3 \
           ORDER BY 1, 2, 3 ON CONFLICT DO NOTHING; \
         UPDATE {l} l SET _source_id = s.id FROM {s} s \
           WHERE s.topic = l.topic AND s.partition = l.partition AND s.consumer_group = l.consumer_group; \
         ALTER TABLE {l} ALTER COLUMN _source_id SET NOT NULL, DROP COLUMN topic, DROP COLUMN partition, \
           DROP COLUMN consumer_group, DROP COLUMN landed_at"
    )
}

/// Name of the horizon table (in the pipeline schema): the durable pruned-below day of each ledger.
pub const HORIZON: &str = "replaysafe_horizon";

/// `CREATE TABLE` for the horizon table: one row per ledger table (`ledger`, its schema-qualified name as
/// written in SQL), holding `pruned_below`: no delivery key of an event day before it is remembered any more
/// (those day partitions were dropped, or are to be dropped by the next prune). Claims of such days are
/// quarantined as `beyond-horizon` and their partitions are never re-created. `NULL`: nothing pruned yet. It
/// only moves forward, raised by the prune in the transaction that drops the partitions.
pub fn create_horizon(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (ledger text PRIMARY KEY, pruned_below date, \
         updated_at timestamptz NOT NULL DEFAULT now())",
        p.table(HORIZON)
    )
}

/// The ledger's claim horizon, read under a share lock on its horizon row (the prune updates that row, so a
/// claim and a prune serialize). Parameters: `$1` the ledger table (as in [`create_horizon`]), `$2` the
/// pipeline's `horizon-days` (int4, null for none). Returns one row: the oldest claimable day (the later of
/// `pruned_below` and the database's UTC date minus `$2`; null when neither), `pruned_below`, and the
/// database's UTC date.
pub fn horizon_statement(p: &Pipeline) -> String {
    format!(
        "WITH h AS (SELECT pruned_below FROM {} WHERE ledger = $1 FOR SHARE), \
         d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today) \
         SELECT greatest((SELECT pruned_below FROM h), d.today - $2::int), (SELECT pruned_below FROM h), d.today \
         FROM d",
        p.table(HORIZON)
    )
}

/// `CREATE TEMP TABLE landed`: the rows one batch newly claimed, visible to projection statements.
pub fn create_landed(p: &Pipeline) -> String {
    let mut defs = vec![
        "_generation text".to_string(),
        "_topic text".to_string(),
        "_partition integer".to_string(),
        "_offset bigint".to_string(),
        "_timestamp timestamptz".to_string(),
    ];
    defs.extend(
        p.fields
            .iter()
            .map(|f| format!("{} {}", f.name, f.ty.sql())),
    );
    defs.extend((0..p.pass_columns()).map(|i| format!("\"_pass_{i}\" boolean")));
    // The projections (by index) a copy of a claimed row state does not reach (`projection::reach_condition`).
    defs.push("_skip integer[]".to_string());
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS landed ({}) ON COMMIT DELETE ROWS",
        defs.join(", ")
    )
}

/// Advisory lock key serialising DDL from concurrent replaysafe processes (`hashtext('replaysafe-ddl')`).
pub(crate) const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('replaysafe-ddl'))";

/// The durable table beside the ledger (`<ledger>_rebuilding`, same columns) holding the ledger rows a rebuild
/// deleted until its replay completed (`replaysafe rebuild`). A rebuild interrupted after the delete leaves them there, so its rerun
/// (which deletes the re-landed part again) still re-reads their offsets and compares against them.
pub fn pending_table(pipeline: &crate::config::Pipeline) -> crate::ident::QualifiedName {
    let ledger = &pipeline.ledger.table;
    let name = crate::ident::Ident::new(&format!("{}_rebuilding", ledger.name.as_str()))
        .unwrap_or_else(|_| {
            let h = <sha2::Sha256 as sha2::Digest>::digest(ledger.name.as_str().as_bytes());
            crate::ident::Ident::new(&format!(
                "replaysafe_rebuilding_{:02x}{:02x}{:02x}{:02x}",
                h[0], h[1], h[2], h[3]
            ))
            .expect("a 26-character name of letters, digits and _ is a valid identifier")
        });
    crate::ident::QualifiedName {
        schema: ledger.schema.clone(),
        name,
    }
}
