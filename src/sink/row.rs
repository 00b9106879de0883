//! Row projections in the batch transaction: the changes a batch newly claimed are grouped per entity, ordered
//! by version, folded against the stored state (read `FOR UPDATE`), and written once per entity.
//!
//! Rules (README "Debezium CDC to a table"):
//! - an upsert applies only when its version is strictly newer than the stored one (live row or tombstone);
//! - a delete leaves a tombstone `(key, _version, _deleted_at)` so an older write can never resurrect the row;
//! - an equal version with the same row state is a duplicate; with a different state it is a conflict, recorded in
//!   `replaysafe_conflicts`, and the stored row is left unchanged;
//! - a strictly newer version with the same row state only moves the stored version: the record is landed (a
//!   snapshot read of an unchanged row is a duplicate);
//! - each batch first locks its entities (transaction-scoped advisory locks, in one global order), so concurrent
//!   batches of other partitions apply one entity's changes one transaction at a time;
//! - Debezium's unchanged-TOAST placeholder keeps the stored value (or the last real value earlier in the batch).

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Statement, Transaction};

use crate::config::{
    ColumnSpec, Pipeline, ProjectionPlan, RowPlan, SqlType, TombstoneMode, TruncatePolicy,
    VersionPlan,
};
use crate::decode::debezium::convert::{to_pg, Pg};
use crate::decode::debezium::{Change, Op};
use crate::decode::{Reason, Rejection};
use crate::error::{Error, Result};
use crate::ident::{Ident, QualifiedName};

/// Name of the conflicts table (in the pipeline schema).
pub const CONFLICTS: &str = "replaysafe_conflicts";
/// Name of the truncate table (in the pipeline schema): one row per truncate applied, per projection; the
/// newest is the projection's *truncate watermark* (source-position versions older than it are stale on every
/// entity, also ones that arrive later from another partition).
pub const TRUNCATES: &str = "replaysafe_truncates";

/// A row projection resolved against the database: its columns (from the pipeline file or the catalog) and key.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Index of the projection in `Pipeline::projections`.
    pub index: usize,
    /// The projection's name.
    pub name: String,
    /// Its columns.
    pub columns: Vec<ColumnSpec>,
    /// Indices into `columns` of the primary key.
    pub key: Vec<usize>,
}

async fn catalog_columns(
    c: &impl GenericClient,
    table: &QualifiedName,
) -> Result<Option<Vec<(String, String)>>> {
    let rows = c
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class r ON r.oid = a.attrelid JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE n.nspname = $1 AND r.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
}

async fn catalog_pk(c: &impl GenericClient, table: &QualifiedName) -> Result<Vec<String>> {
    let rows = c
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_class r ON r.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true \
             JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = k.attnum \
             WHERE n.nspname = $1 AND r.relname = $2 AND i.indisprimary ORDER BY k.ord",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Resolves a row projection's columns and key: from the pipeline file, or from the existing table.
///
/// # Errors
/// [`Error::Schema`] when the table is missing and `columns` is not given, has no primary key and `key` is not
/// given, or has a column type replaysafe cannot convert to.
pub async fn resolve(c: &impl GenericClient, p: &Pipeline, index: usize) -> Result<Shape> {
    let proj = &p.projections[index];
    let plan = proj.row.as_ref().expect("row projection");
    let columns: Vec<ColumnSpec> = match &plan.columns {
        Some(cols) => cols.clone(),
        None => {
            let found = catalog_columns(c, &plan.table).await?.ok_or_else(|| {
                Error::Schema(format!(
                    "row projection `{}`: table {} does not exist; create it (the source table's DDL) or declare `columns`",
                    proj.name, plan.table
                ))
            })?;
            let mut out = Vec::new();
            for (name, ty) in found {
                if name.starts_with('_') {
                    continue;
                }
                let ty = SqlType::parse(&ty).map_err(|m| {
                    Error::Schema(format!(
                        "row projection `{}`: column {name} of {}: {m}",
                        proj.name, plan.table
                    ))
                })?;
                out.push(ColumnSpec {
                    name: Ident::new(&name).map_err(|m| {
                        Error::Schema(format!(
                            "row projection `{}`: column `{name}`: {m}",
                            proj.name
                        ))
                    })?,
                    ty,
                    unit: None,
                    field: None,
                });
            }
            out
        }
    };
    let key_names: Vec<String> = if plan.key.is_empty() {
        let pk = catalog_pk(c, &plan.table).await?;
        if pk.is_empty() {
            return Err(Error::Schema(format!(
                "row projection `{}`: set `key` (the table {} has no primary key yet)",
                proj.name, plan.table
            )));
        }
        pk
    } else {
        plan.key.iter().map(|k| k.as_str().to_string()).collect()
    };
    let mut key = Vec::new();
    for k in &key_names {
        let i = columns
            .iter()
            .position(|c| c.name.as_str() == k)
            .ok_or_else(|| {
                Error::Schema(format!(
                    "row projection `{}`: key column `{k}` is not a column of {}",
                    proj.name, plan.table
                ))
            })?;
        key.push(i);
    }
    Ok(Shape {
        index,
        name: proj.name.clone(),
        columns,
        key,
    })
}

/// DDL for a row projection: the table (when `columns` are declared) or the bookkeeping columns added to an
/// existing one, the tombstone table, and the conflicts table. Idempotent.
///
/// # Errors
/// As [`resolve`], and [`Error::Postgres`].
pub async fn setup(c: &impl GenericClient, p: &Pipeline, index: usize) -> Result<()> {
    let proj = &p.projections[index];
    let plan = proj.row.as_ref().expect("row projection");
    let t = &plan.table;
    let deleted = if plan.tombstones == TombstoneMode::Column {
        ", _deleted_at timestamptz"
    } else {
        ""
    };
    let exec = |sql: String| async move {
        c.batch_execute(&sql).await.map_err(|e| {
            Error::Schema(format!(
                "setup of row projection `{}`: {e}: {sql}",
                proj.name
            ))
        })
    };
    let schema_exists = !c
        .query(
            "SELECT 1 FROM pg_namespace WHERE nspname = $1",
            &[&t.schema.as_str()],
        )
        .await?
        .is_empty();
    if !schema_exists {
        exec(format!("CREATE SCHEMA IF NOT EXISTS {}", t.schema)).await?;
    }
    if let Some(cols) = &plan.columns {
        let defs: Vec<String> = cols
            .iter()
            .map(|c| {
                let null = if plan.key.contains(&c.name) {
                    " NOT NULL"
                } else {
                    ""
                };
                format!("{} {}{null}", c.name, c.ty.sql)
            })
            .collect();
        let key: Vec<String> = plan.key.iter().map(|k| k.to_string()).collect();
        exec(format!(
            "CREATE TABLE IF NOT EXISTS {t} ({}, _version bigint[] NOT NULL, _sha256 bytea NOT NULL, _delivery text, \
             _updated_at timestamptz NOT NULL DEFAULT now(){deleted}, _position bigint[], PRIMARY KEY ({}))",
            defs.join(", "),
            key.join(", ")
        ))
        .await?;
    } else {
        exec(format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS _version bigint[], ADD COLUMN IF NOT EXISTS _sha256 bytea, \
             ADD COLUMN IF NOT EXISTS _delivery text, ADD COLUMN IF NOT EXISTS _updated_at timestamptz DEFAULT now(){}",
            if deleted.is_empty() { "" } else { ", ADD COLUMN IF NOT EXISTS _deleted_at timestamptz" }
        ))
        .await?;
    }
    // The source position of the change that wrote each state (tables made before it was kept get the column).
    exec(format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS _position bigint[]"
    ))
    .await?;
    let shape = resolve(c, p, index).await?;
    if plan.tombstones == TombstoneMode::Column {
        refuse_not_null(c, &proj.name, &shape, t).await?;
    }
    if plan.tombstones == TombstoneMode::Table {
        let defs: Vec<String> = shape
            .key
            .iter()
            .map(|&i| {
                format!(
                    "{} {} NOT NULL",
                    shape.columns[i].name, shape.columns[i].ty.sql
                )
            })
            .collect();
        let key: Vec<String> = shape
            .key
            .iter()
            .map(|&i| shape.columns[i].name.to_string())
            .collect();
        exec(format!(
            "CREATE TABLE IF NOT EXISTS {} ({}, _version bigint[] NOT NULL, _delivery text, \
             _deleted_at timestamptz NOT NULL DEFAULT now(), _last jsonb, _position bigint[], PRIMARY KEY ({}))",
            plan.tombstone_table,
            defs.join(", "),
            key.join(", ")
        ))
        .await?;
        exec(format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS _position bigint[]",
            plan.tombstone_table
        ))
        .await?;
    }
    exec(create_conflicts(p)).await?;
    exec(format!(
        "CREATE TABLE IF NOT EXISTS {} (projection text NOT NULL, version bigint[] NOT NULL, topic text NOT NULL, \
         partition integer NOT NULL, \"offset\" bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (projection, version))",
        p.table(TRUNCATES)
    ))
    .await?;
    Ok(())
}

/// Refuses `tombstones = "column"` on a table whose non-key columns are `NOT NULL`: the tombstone of an entity
/// never seen (its delete arrives before its create — from another partition, or the create is past the topic's
/// retention) is a row with only its key, which such a table rejects — the delete would be quarantined and a later
/// older insert would resurrect the row.
async fn refuse_not_null(
    c: &impl GenericClient,
    projection: &str,
    shape: &Shape,
    table: &QualifiedName,
) -> Result<()> {
    let rows = c
        .query(
            "SELECT a.attname::text FROM pg_attribute a JOIN pg_class r ON r.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace WHERE n.nspname = $1 AND r.relname = $2 \
             AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull ORDER BY a.attnum",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    let keys: Vec<&str> = shape
        .key
        .iter()
        .map(|&i| shape.columns[i].name.as_str())
        .collect();
    let bad: Vec<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|n| {
            shape.columns.iter().any(|c| c.name.as_str() == n) && !keys.contains(&n.as_str())
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(Error::Schema(format!(
        "row projection `{projection}`: tombstones = \"column\" keeps a row with only its key for an entity deleted \
         before it was seen, but column(s) {} of {table} are NOT NULL; drop the constraint (ALTER TABLE {table} ALTER \
         COLUMN … DROP NOT NULL) or use tombstones = \"table\"",
        bad.join(", ")
    )))
}

/// `CREATE TABLE` for `replaysafe_conflicts`: one row per change that claimed a stored version with a different
/// row state.
pub fn create_conflicts(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, projection text NOT NULL, table_name text NOT NULL, \
         entity jsonb NOT NULL, version bigint[] NOT NULL, stored_delivery text, incoming_delivery text, \
         stored_sha256 bytea, incoming_sha256 bytea NOT NULL, stored jsonb, incoming jsonb NOT NULL, \
         topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, consumer_group text NOT NULL, \
         detected_at timestamptz NOT NULL DEFAULT now(), UNIQUE (projection, entity, version, incoming_sha256))",
        p.table(CONFLICTS)
    )
}

/// The prepared statements of one row projection on one connection.
pub struct Prepared {
    /// The resolved shape.
    pub shape: Shape,
    fetch_live: Statement,
    fetch_tomb: Option<Statement>,
    upsert: Statement,
    delete_live: Option<Statement>,
    upsert_tomb: Option<Statement>,
    delete_tomb: Option<Statement>,
    conflict: Statement,
    truncate: Statement,
    /// Version-column projections with a tombstone table: the truncate turns older tombstones into ones without a
    /// version of their own, at its position.
    truncate_tombs: Option<Statement>,
    /// A version column under `truncate = "truncate"`: a change after the stored state in source order applies
    /// even when its version did not grow (see [`compare`]).
    reloads: bool,
    mark_truncate: Statement,
    watermark: Option<Statement>,
    lock: Locks,
}

/// The statements that serialize one projection table's entities across concurrent batch transactions.
struct Locks {
    /// `$1` classid, `$2` objid: the table-wide lock, shared (every batch that touches the table).
    table_shared: Statement,
    /// The same lock, exclusive (a batch that applies a truncate to the table, or has more than
    /// [`MAX_ENTITY_LOCKS`] entities of it).
    table_exclusive: Statement,
    /// `$1..$k` key column texts, `$k+1` the table's seed: one exclusive lock per distinct entity, taken in
    /// ascending lock-id order.
    entities: Statement,
    /// The table lock's `(classid, objid)`.
    table_id: (i32, i32),
    /// Seed of the entity lock ids (derived from the table name: two tables never share an entity lock).
    seed: i64,
}

fn key_unnest(shape: &Shape, first: usize) -> (String, String, String) {
    // (unnest params, alias columns, join condition against `t`)
    let params: Vec<String> = (0..shape.key.len())
        .map(|i| format!("${}::text[]", first + i))
        .collect();
    let alias: Vec<String> = (0..shape.key.len()).map(|i| format!("k{i}")).collect();
    let join: Vec<String> = shape
        .key
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            format!(
                "t.{} = u.k{i}::{}",
                shape.columns[c].name, shape.columns[c].ty.sql
            )
        })
        .collect();
    (params.join(", "), alias.join(", "), join.join(" AND "))
}

/// `classid` of replaysafe's table-wide advisory locks (two-`int4` key space, apart from the `bigint` one of the
/// entity locks): "rsaf".
const TABLE_LOCK_CLASS: i32 = 0x7273_6166;

/// The first 8 bytes of SHA-256 of `text`, as a signed integer.
fn hash64(text: &str) -> i64 {
    let d = Sha256::digest(text.as_bytes());
    i64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The entity-lock statements of a row projection table (README "The four answers", 2).
///
/// An entity's lock id is `hashtextextended` (PostgreSQL's 64-bit text hash) of its key values cast to the key
/// columns' types and back to text — the form PostgreSQL compares, so `{ABC…}` and `abc…` of a uuid key, or
/// `007` and `7` of a bigint key, are one entity — seeded by the table name. The ids are deduplicated and sorted
/// by `array_agg(DISTINCT … ORDER BY …)` (an ordered aggregate: its order is part of its result), and the locks
/// are taken by a function scan of that array, which reads the elements in array order: there is no sort that
/// could run after the lock function was already evaluated, so every transaction takes its locks in ascending
/// id order and two batches cannot deadlock on them.
async fn prepare_locks(
    c: &tokio_postgres::Client,
    shape: &Shape,
    table: &QualifiedName,
) -> Result<Locks> {
    let prep = |sql: String| async move {
        c.prepare(&sql)
            .await
            .map_err(|e| Error::Schema(format!("row projection locks: {e}: {sql}")))
    };
    let (kp, ka, _) = key_unnest(shape, 1);
    let canonical: Vec<String> = shape
        .key
        .iter()
        .enumerate()
        .map(|(i, &col)| format!("u.k{i}::{}::text", shape.columns[col].ty.sql))
        .collect();
    let seed = shape.key.len() + 1;
    let entities = prep(format!(
        "SELECT pg_advisory_xact_lock(l.id) FROM unnest((SELECT array_agg(DISTINCT s.id ORDER BY s.id) FROM \
         (SELECT hashtextextended(json_build_array({})::text, ${seed}::bigint) AS id FROM unnest({kp}) AS u({ka})) s)) \
         AS l(id)",
        canonical.join(", ")
    ))
    .await?;
    let name = table.to_string();
    Ok(Locks {
        table_shared: prep("SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)".into())
            .await?,
        table_exclusive: prep("SELECT pg_advisory_xact_lock($1::int4, $2::int4)".into()).await?,
        entities,
        table_id: (TABLE_LOCK_CLASS, hash64(&name) as i32),
        seed: hash64(&name),
    })
}

/// Most entity locks one batch takes per row projection; a batch with more distinct entities takes the table lock
/// exclusively instead. Every advisory lock occupies a slot of PostgreSQL's shared lock table
/// (`max_locks_per_transaction` × connections, shared by all sessions): `postgres.connections` batches of
/// `batch.max-records` distinct entities each would exhaust it ("out of shared memory"). Small batches (live
/// traffic) lock per entity and run side by side; large ones (catch-up, snapshots) serialize per table.
pub const MAX_ENTITY_LOCKS: usize = 512;

/// Serializes this batch's entities of one projection table against every other batch transaction, before any
/// stored state is read: the table-wide lock — exclusive when the batch applies a truncate (which touches every
/// row) or has more than [`MAX_ENTITY_LOCKS`] distinct entities, shared otherwise — then, under the shared lock,
/// one lock per entity the fold reads or writes (its changes' keys and the old keys of primary-key changes) in
/// ascending id order. Locks are held until the transaction ends.
///
/// Row projections lock in projection order, after the ledger claims and the checkpoint row: a transaction only
/// ever waits for a lock later in that one order than every lock it holds, so these locks add no deadlock (see
/// README "The four answers", 2).
async fn lock_entities(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &[RowChange],
    truncates: bool,
) -> std::result::Result<(), crate::sink::ApplyError> {
    let l = &prepared.lock;
    let keys: Vec<&Vec<String>> = changes
        .iter()
        .filter(|c| c.kind != ChangeKind::Truncate)
        .flat_map(|c| std::iter::once(&c.key).chain(c.old_key.as_ref()))
        .collect::<std::collections::HashSet<_>>()
        .into_iter()
        .collect();
    let exclusive = truncates || keys.len() > MAX_ENTITY_LOCKS;
    let table = if exclusive {
        &l.table_exclusive
    } else {
        &l.table_shared
    };
    tx.execute(table, &[&l.table_id.0, &l.table_id.1])
        .await
        .map_err(pg_err)?;
    if exclusive || keys.is_empty() {
        return Ok(());
    }
    let nk = prepared.shape.key.len();
    let cols: Vec<Vec<&str>> = (0..nk)
        .map(|i| keys.iter().map(|k| k[i].as_str()).collect())
        .collect();
    let mut params: Params = cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    params.push(&l.seed);
    tx.execute(&l.entities, &params).await.map_err(pg_err)?;
    Ok(())
}

/// Prepares a row projection's statements.
///
/// # Errors
/// [`Error::Schema`] when a statement does not compile (missing table or column).
pub async fn prepare(c: &tokio_postgres::Client, p: &Pipeline, shape: Shape) -> Result<Prepared> {
    let plan = p.projections[shape.index].row.as_ref().expect("row");
    let t = &plan.table;
    let tomb = &plan.tombstone_table;
    let column_mode = plan.tombstones == TombstoneMode::Column;
    let prep = |sql: String| async move {
        c.prepare(&sql)
            .await
            .map_err(|e| Error::Schema(format!("row projection: {e}: {sql}")))
    };
    let (kp, ka, kj) = key_unnest(&shape, 1);
    let cols_text: Vec<String> = shape
        .columns
        .iter()
        .map(|c| format!("t.{}::text", c.name))
        .collect();
    let deleted_expr = if column_mode {
        "t._deleted_at IS NOT NULL"
    } else {
        "false"
    };
    let fetch_live = prep(format!(
        "SELECT u.ord, t._version, t._sha256, t._delivery, {deleted_expr}, {}, t._position FROM unnest({kp}) \
         WITH ORDINALITY AS u({ka}, ord) JOIN {t} t ON {kj} FOR UPDATE OF t",
        cols_text.join(", ")
    ))
    .await?;
    let fetch_tomb = if column_mode {
        None
    } else {
        Some(
            prep(format!(
                "SELECT u.ord, t._version, t._delivery, t._last, t._position FROM unnest({kp}) WITH ORDINALITY \
                 AS u({ka}, ord) JOIN {tomb} t ON {kj} FOR UPDATE OF t"
            ))
            .await?,
        )
    };
    // Upsert: one text[] per column, then versions (text '{a,b}'), hashes, deliveries (, deleted flags).
    let n = shape.columns.len();
    let mut params: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
    params.push(format!("${}::text[]", n + 1));
    params.push(format!("${}::bytea[]", n + 2));
    params.push(format!("${}::text[]", n + 3));
    if column_mode {
        params.push(format!("${}::boolean[]", n + 4));
    }
    params.push(format!("${}::text[]", n + 4 + usize::from(column_mode)));
    let mut alias: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    alias.extend(["v", "h", "d"].map(String::from));
    if column_mode {
        alias.push("del".into());
    }
    alias.push("pos".into());
    let names: Vec<String> = shape.columns.iter().map(|c| c.name.to_string()).collect();
    let mut select: Vec<String> = shape
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("u.c{i}::{}", c.ty.sql))
        .collect();
    select.extend(["u.v::bigint[]", "u.h", "u.d", "now()"].map(String::from));
    let mut target = names.clone();
    target.extend(["_version", "_sha256", "_delivery", "_updated_at"].map(String::from));
    if column_mode {
        select.push("CASE WHEN u.del THEN now() END".into());
        target.push("_deleted_at".into());
    }
    select.push("u.pos::bigint[]".into());
    target.push("_position".into());
    let key_cols: Vec<String> = shape.key.iter().map(|&i| names[i].clone()).collect();
    let updates: Vec<String> = target
        .iter()
        .filter(|c| !key_cols.contains(c))
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect();
    let upsert = prep(format!(
        "INSERT INTO {t} AS t ({}) SELECT {} FROM unnest({}) AS u({}) ON CONFLICT ({}) DO UPDATE SET {} \
         WHERE t._version <= EXCLUDED._version OR cardinality(EXCLUDED._version) = 0 \
         OR EXCLUDED._position > t._position",
        target.join(", "),
        select.join(", "),
        params.join(", "),
        alias.join(", "),
        key_cols.join(", "),
        updates.join(", ")
    ))
    .await?;
    // A version column under `truncate = "truncate"` may order a state by its source position ([`compare`]): the
    // fold, which decided under the entity's lock, then removes the other table's row whatever its version.
    let reloads =
        matches!(plan.version, VersionPlan::Column(_)) && plan.truncate == TruncatePolicy::Truncate;
    let (delete_live, upsert_tomb, delete_tomb) = if column_mode {
        (None, None, None)
    } else {
        let k = shape.key.len();
        let kv = format!("${}::text[]", k + 1);
        let kd = format!("${}::text[]", k + 2);
        let kl = format!("${}::text[]", k + 3);
        let kpos = format!("${}::text[]", k + 4);
        let key_select: Vec<String> = shape
            .key
            .iter()
            .enumerate()
            .map(|(i, &c)| format!("u.k{i}::{}", shape.columns[c].ty.sql))
            .collect();
        (
            Some(
                prep(format!(
                    "DELETE FROM {t} t USING unnest({kp}, {kv}) AS u({ka}, v) WHERE {kj} AND (t._version <= u.v::bigint[] \
                     OR cardinality(u.v::bigint[]) = 0 OR {reloads})"
                ))
                .await?,
            ),
            Some(
                prep(format!(
                    "INSERT INTO {tomb} AS t ({}, _version, _delivery, _deleted_at, _last, _position) SELECT {}, u.v::bigint[], u.d, \
                     now(), u.l::jsonb, u.pos::bigint[] FROM unnest({kp}, {kv}, {kd}, {kl}, {kpos}) AS u({ka}, v, d, l, pos) \
                     ON CONFLICT ({}) DO UPDATE SET _last = EXCLUDED._last, _version = EXCLUDED._version, \
                     _delivery = EXCLUDED._delivery, _deleted_at = EXCLUDED._deleted_at, _position = EXCLUDED._position \
                     WHERE t._version < EXCLUDED._version OR cardinality(t._version) = 0 \
                     OR cardinality(EXCLUDED._version) = 0 OR EXCLUDED._position > t._position",
                    key_cols.join(", "),
                    key_select.join(", "),
                    key_cols.join(", ")
                ))
                .await?,
            ),
            Some(
                prep(format!(
                    "DELETE FROM {tomb} t USING unnest({kp}, {kv}) AS u({ka}, v) WHERE {kj} AND (t._version < u.v::bigint[] OR {reloads})"
                ))
                .await?,
            ),
        )
    };
    let conflict = prep(format!(
        "INSERT INTO {} (projection, table_name, entity, version, stored_delivery, incoming_delivery, stored_sha256, \
         incoming_sha256, stored, incoming, topic, partition, \"offset\", consumer_group) \
         SELECT $1, $2, u.e::jsonb, u.v::bigint[], u.sd, u.id, u.sh, u.ih, u.s::jsonb, u.i::jsonb, $3, $4, u.o, $5 \
         FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::bytea[], $12::text[], \
         $13::text[], $14::bigint[]) AS u(e, v, sd, id, sh, ih, s, i, o) \
         ON CONFLICT (projection, entity, version, incoming_sha256) DO NOTHING",
        p.table(CONFLICTS)
    ))
    .await?;
    // Truncate: $1 its source position, $2 its delivery. Ordered by source position: every older row becomes a
    // tombstone at the truncate's position. Under a version column the tombstones have no version of their own
    // (`{}`): rows inserted after the truncate are ordered against them by source position, whatever their
    // version (a reload at the same or a lower version applies).
    let by_column = matches!(plan.version, VersionPlan::Column(_));
    let (tomb_version, older) = if by_column {
        (
            "'{}'::bigint[]",
            "(_position IS NULL OR _position < $1::text::bigint[])",
        )
    } else {
        ("$1::text::bigint[]", "_version < $1::text::bigint[]")
    };
    let truncate = if column_mode {
        prep(format!(
            "UPDATE {t} SET _deleted_at = coalesce(_deleted_at, now()), _version = {tomb_version}, \
             _position = $1::text::bigint[], _delivery = $2, _updated_at = now() \
             WHERE {older} AND ({by_column} OR _deleted_at IS NULL)"
        ))
        .await?
    } else {
        prep(format!(
            "WITH gone AS (DELETE FROM {t} WHERE {older} RETURNING {kc}) \
             INSERT INTO {tomb} AS t ({kc}, _version, _delivery, _deleted_at, _position) \
             SELECT {kc}, {tomb_version}, $2, now(), $1::text::bigint[] \
             FROM gone ON CONFLICT ({kc}) DO UPDATE SET _version = EXCLUDED._version, _delivery = EXCLUDED._delivery, \
             _deleted_at = EXCLUDED._deleted_at, _position = EXCLUDED._position \
             WHERE t._version < EXCLUDED._version OR {by_column}",
            kc = key_cols.join(", ")
        ))
        .await?
    };
    let truncate_tombs = if by_column && !column_mode {
        Some(
            prep(format!(
                "UPDATE {tomb} SET _version = '{{}}', _position = $1::text::bigint[] WHERE {older}"
            ))
            .await?,
        )
    } else {
        None
    };
    let mark_truncate = prep(format!(
        "INSERT INTO {} (projection, version, topic, partition, \"offset\") VALUES ($1, $2::text::bigint[], $3, $4, $5) \
         ON CONFLICT DO NOTHING",
        p.table(TRUNCATES)
    ))
    .await?;
    let watermark = if plan.version == VersionPlan::SourcePosition || by_column {
        Some(
            prep(format!(
                "SELECT max(version) FROM {} WHERE projection = $1",
                p.table(TRUNCATES)
            ))
            .await?,
        )
    } else {
        None
    };
    let lock = prepare_locks(c, &shape, t).await?;
    Ok(Prepared {
        mark_truncate,
        watermark,
        lock,
        shape,
        fetch_live,
        fetch_tomb,
        upsert,
        delete_live,
        upsert_tomb,
        delete_tomb,
        conflict,
        truncate,
        truncate_tombs,
        reloads,
    })
}

/// One claimed record as a row projection sees it.
#[derive(Debug, Clone)]
pub struct RowChange {
    /// Kafka offset (the record's identity in the batch).
    pub offset: i64,
    /// Key column texts, in key order.
    pub key: Vec<String>,
    /// The version (compared element-wise).
    pub version: Vec<i64>,
    /// Upsert, delete or truncate.
    pub kind: ChangeKind,
    /// Upserts: one value per column.
    pub values: Vec<Pg>,
    /// The delivery key, as a JSON array text (for the conflicts table and `_delivery`).
    pub delivery: String,
    /// A primary-key change's previous key (key column texts): where unchanged TOASTed values come from.
    pub old_key: Option<Vec<String>>,
    /// A snapshot read (`op = r`).
    pub snapshot: bool,
    /// Debezium: the source position `[commit LSN, change LSN]` (the version too, unless a version column is
    /// used). What orders a change against a state when either has no version of its own.
    pub position: Option<Vec<i64>>,
}

/// Turns an upsert whose new row leaves a row projection's `filter` into a delete of the row at the upsert's
/// version (deletes and truncates are left as they are).
pub fn leave_filter(change: &mut RowChange) {
    if change.kind == ChangeKind::Upsert {
        change.kind = ChangeKind::Delete;
        change.values.clear();
        change.old_key = None;
    }
}

/// What a change does to its entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Insert, update or snapshot read.
    Upsert,
    /// Delete (leaves a tombstone).
    Delete,
    /// Truncate of the whole table.
    Truncate,
}

/// How one claimed record fared in a row projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowResult {
    /// The entity's stored state changed.
    Applied,
    /// A strictly newer version with the row state already stored (another field changed, or the same state
    /// confirmed again): the row takes the new version and delivery; the record is `landed`.
    Unchanged,
    /// The same state was already stored at this version, or a snapshot read (`op = r`) found the state already
    /// stored: a `duplicate`, no side effects.
    Same,
    /// Older than the stored version (or tombstone).
    Stale,
    /// The stored version is equal and the state differs: recorded in `replaysafe_conflicts`.
    Conflict,
}

/// Whether a change belongs to this row projection.
pub fn matches(plan: &RowPlan, table: &QualifiedName, change: &Change) -> bool {
    match &plan.source_table {
        Some(s) => s == &change.table,
        None => change.table.rsplit('.').next() == Some(table.name.as_str()),
    }
}

fn key_from(change: &Change, name: &str) -> Option<crate::decode::debezium::Cell> {
    let find = |r: &Option<crate::decode::debezium::Row>| {
        r.as_ref()
            .and_then(|r| r.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone()))
    };
    find(&change.key)
        .or_else(|| find(&change.after))
        .or_else(|| find(&change.before))
}

/// Builds the row projection's view of one Debezium change.
///
/// # Errors
/// A [`Rejection`] when a value cannot be converted to its column's type or a key/version column is missing.
pub fn from_change(
    shape: &Shape,
    plan: &RowPlan,
    offset: i64,
    change: &Change,
    delivery: String,
    dec: crate::config::DecimalHandling,
) -> std::result::Result<RowChange, Rejection> {
    let bad = |m: String| Rejection {
        reason: Reason::InvalidField,
        detail: m,
    };
    let kind = match change.op {
        Op::Truncate => ChangeKind::Truncate,
        Op::Delete => ChangeKind::Delete,
        _ => ChangeKind::Upsert,
    };
    let mut key = Vec::new();
    if kind != ChangeKind::Truncate {
        for &k in &shape.key {
            let col = &shape.columns[k];
            let cell = key_from(change, col.name.as_str()).ok_or_else(|| {
                bad(format!(
                    "key column `{}` is in neither the Debezium key nor the row",
                    col.name.as_str()
                ))
            })?;
            match to_pg(&cell, col, dec)
                .map_err(|m| bad(format!("key column `{}`: {m}", col.name.as_str())))?
            {
                Pg::Text(t) => key.push(t),
                _ => return Err(bad(format!("key column `{}` is null", col.name.as_str()))),
            }
        }
    }
    let version = match &plan.version {
        VersionPlan::SourcePosition | VersionPlan::Field(_) => change.position.to_vec(),
        // A truncate has no row: with a version column it tombstones every row at its own version.
        VersionPlan::Column(_) if kind == ChangeKind::Truncate => Vec::new(),
        VersionPlan::Column(c) => {
            let img = if kind == ChangeKind::Delete {
                &change.before
            } else {
                &change.after
            };
            let found = img
                .as_ref()
                .and_then(|r| r.iter().find(|(n, _)| n == c.as_str()))
                .map(|(_, cell)| cell.value.clone())
                .filter(|v| !v.is_null());
            let v = found.as_ref().and_then(|value| match value {
                serde_json::Value::Number(n) => n.to_string().parse::<i64>().ok(),
                serde_json::Value::String(s) => s.parse::<i64>().ok(),
                _ => None,
            });
            // A delete under REPLICA IDENTITY DEFAULT carries only the key in `before`: Debezium fills the other
            // columns with null, or with 0 when the column is NOT NULL. Such a delete (version null, 0 or not a
            // number) has no version of its own and is ordered by its source position (in the fold).
            if kind == ChangeKind::Delete && v.is_none_or(|v| v == 0) {
                return Ok(RowChange {
                    offset,
                    key,
                    version: Vec::new(),
                    kind,
                    values: Vec::new(),
                    delivery,
                    old_key: None,
                    snapshot: false,
                    position: Some(change.position.to_vec()),
                });
            }
            let v = v.ok_or_else(|| {
                bad(format!(
                    "version column `{}` is missing or not a whole number",
                    c.as_str()
                ))
            })?;
            vec![v]
        }
    };
    let old_key = match &change.old_key {
        Some(row) if kind == ChangeKind::Upsert => {
            let mut k = Vec::new();
            for &i in &shape.key {
                let col = &shape.columns[i];
                match row
                    .iter()
                    .find(|(n, _)| n == col.name.as_str())
                    .map(|(_, c)| to_pg(c, col, dec))
                {
                    Some(Ok(Pg::Text(t))) => k.push(t),
                    _ => break,
                }
            }
            (k.len() == shape.key.len()).then_some(k)
        }
        _ => None,
    };
    let mut values = Vec::new();
    if kind == ChangeKind::Upsert {
        let after = change.after.as_ref().expect("upserts have after");
        for col in &shape.columns {
            let v = match after.iter().find(|(n, _)| n == col.name.as_str()) {
                Some((_, cell)) => to_pg(cell, col, dec)
                    .map_err(|m| bad(format!("column `{}`: {m}", col.name.as_str())))?,
                None => Pg::Null,
            };
            values.push(v);
        }
    }
    Ok(RowChange {
        offset,
        key,
        version,
        kind,
        values,
        delivery,
        old_key,
        snapshot: change.op == Op::Read,
        position: Some(change.position.to_vec()),
    })
}

#[derive(Debug, Clone)]
struct State {
    /// Empty: no version of its own (a tombstone of a key-only delete or of a truncate under a version column).
    version: Vec<i64>,
    deleted: bool,
    sha: Vec<u8>,
    delivery: Option<String>,
    values: Vec<Option<String>>,
    /// The source position of the change that wrote it (`None`: JSON events, or written before it was kept).
    position: Option<Vec<i64>>,
}

/// How a change compares with a stored state: by version when both have one of their own, else by source
/// position. A state replaysafe never versioned (an existing table's row) is older than any change. `None`: the
/// two cannot be ordered (a state written before positions were kept, against a change without a version).
///
/// `reloads` (a version column under `truncate = "truncate"`): a change that comes after the stored state in
/// source order is newer even when its version did not grow. A version column grows with every change of a row
/// except across a truncate, and a truncate has no key: it lands on any partition, so the rows reloaded after it
/// can be applied before it is — they must not be judged against the rows it will remove (stale, or a conflict),
/// or the truncate then removes them too. A change newer by version applies as before (positions of another
/// database after a move are not comparable).
fn compare(
    version: &[i64],
    position: Option<&Vec<i64>>,
    s: &State,
    reloads: bool,
) -> Option<std::cmp::Ordering> {
    if !version.is_empty() && !s.version.is_empty() {
        let by_version = version.cmp(&s.version);
        if reloads && by_version != std::cmp::Ordering::Greater {
            if let (Some(a), Some(b)) = (position, &s.position) {
                if a > b {
                    return Some(std::cmp::Ordering::Greater);
                }
            }
        }
        return Some(by_version);
    }
    match (position, &s.position) {
        (Some(a), Some(b)) => Some(a.cmp(b)),
        _ if s.version.is_empty() => Some(std::cmp::Ordering::Greater),
        _ => None,
    }
}

fn hash(values: &[Option<String>], deleted: bool) -> Vec<u8> {
    let mut h = Sha256::new();
    if deleted {
        h.update(b"deleted");
    } else {
        for v in values {
            match v {
                None => h.update(b"N"),
                Some(t) => {
                    h.update(b"V");
                    h.update((t.len() as u64).to_be_bytes());
                    h.update(t.as_bytes());
                }
            }
        }
    }
    h.finalize().to_vec()
}

fn version_text(v: &[i64]) -> String {
    format!(
        "{{{}}}",
        v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    )
}

fn object(shape: &Shape, values: &[Option<String>]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = shape
        .columns
        .iter()
        .zip(values)
        .map(|(c, v)| {
            (
                c.name.as_str().to_string(),
                v.clone()
                    .map(serde_json::Value::String)
                    .unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    serde_json::Value::Object(m).to_string()
}

fn entity(shape: &Shape, key: &[String]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = shape
        .key
        .iter()
        .zip(key)
        .map(|(&c, v)| {
            (
                shape.columns[c].name.as_str().to_string(),
                serde_json::Value::String(v.clone()),
            )
        })
        .collect();
    serde_json::Value::Object(m).to_string()
}

/// Where the batch is: for the conflicts table.
pub struct Coordinates<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Consumer group.
    pub group: &'a str,
}

fn pg_err(e: tokio_postgres::Error) -> crate::sink::ApplyError {
    crate::sink::classify(e, false)
}

/// Applies a row projection's changes (in offset order; truncates split the batch) and returns each change's
/// result by offset.
///
/// # Errors
/// [`crate::sink::ApplyError`] from PostgreSQL, or `Fatal` for a truncate under `truncate = "stop"`.
pub async fn apply(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    proj: &ProjectionPlan,
    changes: Vec<RowChange>,
    at: &Coordinates<'_>,
) -> std::result::Result<HashMap<i64, RowResult>, crate::sink::ApplyError> {
    let plan = proj.row.as_ref().expect("row");
    let mut results = HashMap::new();
    if changes.is_empty() {
        return Ok(results);
    }
    let truncates = plan.truncate == TruncatePolicy::Truncate
        && changes.iter().any(|c| c.kind == ChangeKind::Truncate);
    lock_entities(tx, prepared, &changes, truncates).await?;
    let mut segment: Vec<RowChange> = Vec::new();
    for c in changes {
        if c.kind == ChangeKind::Truncate {
            fold_segment(
                tx,
                prepared,
                proj,
                std::mem::take(&mut segment),
                at,
                &mut results,
            )
            .await?;
            match plan.truncate {
                TruncatePolicy::Stop => {
                    return Err(crate::sink::ApplyError::Fatal(Error::Other(format!(
                        "{}/{} offset {}: TRUNCATE of the source table (Debezium op=t) reached row projection `{}`, \
                         whose policy is truncate = \"stop\"; nothing of this batch was committed. Set truncate = \
                         \"truncate\" (tombstone every older row) or \"ignore\" and restart",
                        at.topic, at.partition, c.offset, proj.name
                    ))))
                }
                TruncatePolicy::Ignore => {
                    results.insert(c.offset, RowResult::Applied);
                }
                TruncatePolicy::Truncate => {
                    // Ordered by its source position (also under a version column: a truncate has no version).
                    let at_pos = version_text(c.position.as_deref().unwrap_or(&c.version));
                    tx.execute(
                        &prepared.mark_truncate,
                        &[&proj.name, &at_pos, &at.topic, &at.partition, &c.offset],
                    )
                    .await
                    .map_err(pg_err)?;
                    let n = tx
                        .execute(&prepared.truncate, &[&at_pos, &c.delivery])
                        .await
                        .map_err(pg_err)?;
                    if let Some(st) = &prepared.truncate_tombs {
                        tx.execute(st, &[&at_pos]).await.map_err(pg_err)?;
                    }
                    tracing::info!(projection = %proj.name, topic = at.topic, partition = at.partition, offset = c.offset, rows = n, "truncate applied");
                    results.insert(c.offset, RowResult::Applied);
                }
            }
        } else {
            segment.push(c);
        }
    }
    fold_segment(tx, prepared, proj, segment, at, &mut results).await?;
    Ok(results)
}

type Params<'a> = Vec<&'a (dyn ToSql + Sync)>;

/// The stored state of each key (live row or tombstone), locked `FOR UPDATE`.
async fn fetch_states(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    keys: &[Vec<String>],
) -> std::result::Result<Vec<Option<State>>, crate::sink::ApplyError> {
    let shape = &prepared.shape;
    let mut state: Vec<Option<State>> = vec![None; keys.len()];
    if keys.is_empty() {
        return Ok(state);
    }
    let key_cols: Vec<Vec<&str>> = (0..shape.key.len())
        .map(|i| keys.iter().map(|k| k[i].as_str()).collect())
        .collect();
    let params: Params = key_cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    for r in tx
        .query(&prepared.fetch_live, &params)
        .await
        .map_err(pg_err)?
    {
        let ord: i64 = r.get(0);
        let values = (0..shape.columns.len())
            .map(|i| r.get::<_, Option<String>>(5 + i))
            .collect();
        state[(ord - 1) as usize] = Some(State {
            version: r.get::<_, Option<Vec<i64>>>(1).unwrap_or_default(),
            sha: r.get::<_, Option<Vec<u8>>>(2).unwrap_or_default(),
            delivery: r.get(3),
            deleted: r.get(4),
            values,
            position: r.get(5 + shape.columns.len()),
        });
    }
    if let Some(ft) = &prepared.fetch_tomb {
        for r in tx.query(ft, &params).await.map_err(pg_err)? {
            let ord: i64 = r.get(0);
            let version: Vec<i64> = r.get(1);
            let last: Option<serde_json::Value> = r.get(3);
            let position: Option<Vec<i64>> = r.get(4);
            let slot = &mut state[(ord - 1) as usize];
            // A live row and a tombstone for one key should not coexist; the newer one wins.
            if slot.as_ref().is_none_or(|s| {
                compare(&version, position.as_ref(), s, prepared.reloads)
                    != Some(std::cmp::Ordering::Less)
            }) {
                *slot = Some(State {
                    version,
                    position,
                    deleted: true,
                    sha: hash(&[], true),
                    delivery: r.get(2),
                    // The values the delete removed (for a later primary-key change's unchanged values).
                    values: shape
                        .columns
                        .iter()
                        .map(|c| {
                            last.as_ref()
                                .and_then(|l| l.get(c.name.as_str()))
                                .and_then(|v| v.as_str().map(str::to_string))
                        })
                        .collect(),
                });
            }
        }
    }
    Ok(state)
}

async fn fold_segment(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    proj: &ProjectionPlan,
    changes: Vec<RowChange>,
    at: &Coordinates<'_>,
    results: &mut HashMap<i64, RowResult>,
) -> std::result::Result<(), crate::sink::ApplyError> {
    if changes.is_empty() {
        return Ok(());
    }
    let shape = &prepared.shape;
    let plan = proj.row.as_ref().expect("row");
    // Entities in first-seen order.
    let mut order: Vec<Vec<String>> = Vec::new();
    let mut groups: HashMap<Vec<String>, Vec<RowChange>> = HashMap::new();
    for c in changes {
        if !groups.contains_key(&c.key) {
            order.push(c.key.clone());
        }
        groups.entry(c.key.clone()).or_default().push(c);
    }
    // Each entity's changes stay in offset order and each is judged against the state before it, exactly as if
    // the batch held one record: outcomes never depend on batch boundaries (a late older change is stale even
    // when the newer one is in the same batch).
    // Stored state, locked; plus the state of old keys of primary-key changes that need unchanged values.
    let mut old_keys: Vec<Vec<String>> = Vec::new();
    for g in groups.values() {
        for c in g {
            if let Some(k) = &c.old_key {
                if c.values.contains(&Pg::Unchanged)
                    && !groups.contains_key(k)
                    && !old_keys.contains(k)
                {
                    old_keys.push(k.clone());
                }
            }
        }
    }
    let nk = shape.key.len();
    let state = fetch_states(tx, prepared, &order).await?;
    // Last known values per key (live values, or the values a delete removed): unchanged TOASTed values of a
    // primary-key change come from the old key's.
    let mut last_values: HashMap<Vec<String>, Vec<Option<String>>> = HashMap::new();
    for (k, s) in old_keys
        .iter()
        .zip(fetch_states(tx, prepared, &old_keys).await?)
        .chain(order.iter().zip(state.iter().cloned()))
    {
        if let Some(s) = s {
            last_values.insert(k.clone(), s.values);
        }
    }

    // Fold.
    struct Conflict {
        entity: String,
        version: String,
        stored_delivery: Option<String>,
        incoming_delivery: String,
        stored_sha: Vec<u8>,
        incoming_sha: Vec<u8>,
        stored: String,
        incoming: String,
        offset: i64,
    }
    // The newest truncate this projection applied: older source positions are stale on every entity.
    let watermark: Option<Vec<i64>> = match &prepared.watermark {
        Some(st) => tx
            .query_one(st, &[&proj.name])
            .await
            .map_err(pg_err)?
            .get(0),
        None => None,
    };
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut resnapshot = 0u64;
    let mut finals: Vec<(usize, State)> = Vec::new();
    for (ei, key) in order.iter().enumerate() {
        let before = state[ei].clone();
        let mut cur = state[ei].clone();
        for c in &groups[key] {
            if c.snapshot && cur.is_some() {
                resnapshot += 1;
            }
            let incoming_values: Vec<Option<String>> = match c.kind {
                ChangeKind::Delete => cur
                    .as_ref()
                    .filter(|s| !s.deleted)
                    .map(|s| s.values.clone())
                    .unwrap_or_else(|| vec![None; shape.columns.len()]),
                _ => c
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Pg::Text(t) => Some(t.clone()),
                        Pg::Null => None,
                        // Unchanged TOAST value: the stored (or last real) value carries forward; for the new
                        // key of a primary-key change, the old key's.
                        Pg::Unchanged => match cur.as_ref().filter(|s| !s.deleted) {
                            Some(s) => s.values[i].clone(),
                            None => {
                                let v = c
                                    .old_key
                                    .as_ref()
                                    .and_then(|k| last_values.get(k))
                                    .and_then(|v| v[i].clone());
                                if v.is_none() {
                                    tracing::warn!(
                                        projection = %proj.name,
                                        topic = at.topic,
                                        partition = at.partition,
                                        offset = c.offset,
                                        column = shape.columns[i].name.as_str(),
                                        "unchanged-TOAST placeholder for a row with no stored value: written as NULL"
                                    );
                                }
                                v
                            }
                        },
                    })
                    .collect(),
            };
            let deleted = c.kind == ChangeKind::Delete;
            let sha = hash(&incoming_values, deleted);
            // A delete under a version column carries the version of the row it deletes (inclusive); when `before`
            // does not carry it (REPLICA IDENTITY DEFAULT) it has no version of its own and is ordered by its source
            // position — it never wins over a change it cannot be ordered against.
            let by_column = matches!(plan.version, VersionPlan::Column(_));
            let inclusive = deleted && by_column;
            let version = &c.version;
            let order = cur
                .as_ref()
                .map(|s| compare(version, c.position.as_ref(), s, prepared.reloads));
            use std::cmp::Ordering::{Equal, Less};
            let result = match (&cur, order) {
                // Older than the newest truncate (by source position): that truncate removed it.
                _ if watermark
                    .as_ref()
                    .is_some_and(|w| c.position.as_ref().is_some_and(|p| p < w)) =>
                {
                    RowResult::Stale
                }
                (Some(_), Some(None)) => {
                    return Err(crate::sink::ApplyError::Record {
                        offset: c.offset,
                        rejection: Rejection {
                            reason: Reason::InvalidField,
                            detail: format!(
                                "row projection `{}`: a delete without a version of its own (`before` holds only the \
                                 key: REPLICA IDENTITY DEFAULT) for {} cannot be ordered against the stored state, \
                                 which has no source position (written before replaysafe kept them); the row is kept. \
                                 Delete it by hand if the source no longer has it; set REPLICA IDENTITY FULL on the \
                                 source table so deletes carry the version column",
                                proj.name,
                                entity(shape, key)
                            ),
                        },
                    })
                }
                (Some(_), Some(Some(Less))) => RowResult::Stale,
                // Under a version column a delete carries the version of the row it deletes: a write at the
                // tombstone's version is that deleted state. (A version field or source position gives a delete a
                // version of its own: a write at it is another state at the same version, a conflict below.)
                (Some(s), Some(Some(Equal))) if s.deleted && !deleted && by_column => RowResult::Stale,
                // Equal version (but an inclusive delete of the stored row, which applies).
                (Some(s), Some(Some(Equal))) if s.deleted || !inclusive => {
                    if s.sha == sha {
                        RowResult::Same
                    } else {
                        conflicts.push(Conflict {
                            entity: entity(shape, key),
                            version: version_text(version),
                            stored_delivery: s.delivery.clone(),
                            incoming_delivery: c.delivery.clone(),
                            stored_sha: s.sha.clone(),
                            incoming_sha: sha.clone(),
                            stored: if s.deleted {
                                "null".into()
                            } else {
                                object(shape, &s.values)
                            },
                            incoming: if deleted {
                                "null".into()
                            } else {
                                object(shape, &incoming_values)
                            },
                            offset: c.offset,
                        });
                        RowResult::Conflict
                    }
                }
                // Newer, same row state: the row takes the version (and delivery). A newer business event is
                // landed for the other projections; a snapshot read is observed state, not an event: duplicate.
                (Some(s), _) if s.sha == sha && s.deleted == deleted => {
                    cur = Some(State {
                        version: version.clone(),
                        delivery: Some(c.delivery.clone()),
                        position: c.position.clone(),
                        ..s.clone()
                    });
                    if c.snapshot {
                        RowResult::Same
                    } else {
                        RowResult::Unchanged
                    }
                }
                // Newer, never seen (a delete of an unseen entity still leaves its tombstone: a late older insert
                // must not create it), or an inclusive delete of the stored version.
                _ => {
                    cur = Some(State {
                        version: version.clone(),
                        deleted,
                        sha,
                        delivery: Some(c.delivery.clone()),
                        values: incoming_values,
                        position: c.position.clone(),
                    });
                    RowResult::Applied
                }
            };
            if result == RowResult::Conflict {
                metrics::counter!("replaysafe_conflicts_total", "projection" => proj.name.clone())
                    .increment(1);
                tracing::warn!(projection = %proj.name, topic = at.topic, partition = at.partition, offset = c.offset, "conflict: equal version, different row state; stored row kept");
            }
            if result == RowResult::Applied {
                if let Some(s) = &cur {
                    last_values.insert(key.clone(), s.values.clone());
                }
            }
            results.insert(c.offset, result);
        }
        if let Some(s) = cur {
            let changed = before
                .as_ref()
                .is_none_or(|b| b.version != s.version || b.deleted != s.deleted || b.sha != s.sha);
            if changed {
                finals.push((ei, s));
            }
        }
    }

    if resnapshot > 0 {
        // C05: a snapshot read of an entity already stored means the connector snapshotted again (lost offsets,
        // a new slot). Rows deleted while it was down got no delete event and stay.
        metrics::counter!("replaysafe_resnapshot_reads_total", "projection" => proj.name.clone())
            .increment(resnapshot);
        tracing::warn!(
            projection = %proj.name,
            topic = at.topic,
            partition = at.partition,
            reads = resnapshot,
            "re-snapshot detected: snapshot reads of rows already stored (applied under the version guard); rows \
             deleted at the source while the connector was down received no delete event and remain — compare \
             with the source if that matters"
        );
    }

    // Writes.
    let column_mode = plan.tombstones == TombstoneMode::Column;
    type Final<'a> = Vec<&'a (usize, State)>;
    let (live, dead): (Final, Final) = finals.iter().partition(|(_, s)| !s.deleted || column_mode);
    if !live.is_empty() {
        let mut cols: Vec<Vec<Option<&str>>> =
            vec![Vec::with_capacity(live.len()); shape.columns.len()];
        let mut versions = Vec::new();
        let mut shas = Vec::new();
        let mut deliveries = Vec::new();
        let mut dels = Vec::new();
        let mut positions: Vec<Option<String>> = Vec::new();
        for (ei, s) in &live {
            for (i, c) in cols.iter_mut().enumerate() {
                // Key columns always come from the key (a column-mode delete of an unseen entity has no values).
                let v = match shape.key.iter().position(|&k| k == i) {
                    Some(kp) => Some(order[*ei][kp].as_str()),
                    None => s.values[i].as_deref(),
                };
                c.push(v);
            }
            versions.push(version_text(&s.version));
            shas.push(s.sha.clone());
            deliveries.push(s.delivery.clone());
            dels.push(s.deleted);
            positions.push(s.position.as_deref().map(version_text));
        }
        let mut params: Params = cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        params.push(&versions);
        params.push(&shas);
        params.push(&deliveries);
        if column_mode {
            params.push(&dels);
        }
        params.push(&positions);
        tx.execute(&prepared.upsert, &params)
            .await
            .map_err(pg_err)?;
        if let Some(dt) = &prepared.delete_tomb {
            let keys: Vec<Vec<&str>> = (0..nk)
                .map(|i| live.iter().map(|(ei, _)| order[*ei][i].as_str()).collect())
                .collect();
            let mut p: Params = keys.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
            p.push(&versions);
            tx.execute(dt, &p).await.map_err(pg_err)?;
        }
    }
    if !dead.is_empty() {
        let keys: Vec<Vec<&str>> = (0..nk)
            .map(|i| dead.iter().map(|(ei, _)| order[*ei][i].as_str()).collect())
            .collect();
        let versions: Vec<String> = dead.iter().map(|(_, s)| version_text(&s.version)).collect();
        let deliveries: Vec<Option<String>> =
            dead.iter().map(|(_, s)| s.delivery.clone()).collect();
        let lasts: Vec<String> = dead.iter().map(|(_, s)| object(shape, &s.values)).collect();
        let positions: Vec<Option<String>> = dead
            .iter()
            .map(|(_, s)| s.position.as_deref().map(version_text))
            .collect();
        let mut p: Params = keys.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        p.push(&versions);
        tx.execute(prepared.delete_live.as_ref().expect("table mode"), &p)
            .await
            .map_err(pg_err)?;
        p.push(&deliveries);
        p.push(&lasts);
        p.push(&positions);
        tx.execute(prepared.upsert_tomb.as_ref().expect("table mode"), &p)
            .await
            .map_err(pg_err)?;
    }
    if !conflicts.is_empty() {
        let e: Vec<&str> = conflicts.iter().map(|c| c.entity.as_str()).collect();
        let v: Vec<&str> = conflicts.iter().map(|c| c.version.as_str()).collect();
        let sd: Vec<Option<&str>> = conflicts
            .iter()
            .map(|c| c.stored_delivery.as_deref())
            .collect();
        let id: Vec<&str> = conflicts
            .iter()
            .map(|c| c.incoming_delivery.as_str())
            .collect();
        let sh: Vec<&[u8]> = conflicts.iter().map(|c| c.stored_sha.as_slice()).collect();
        let ih: Vec<&[u8]> = conflicts
            .iter()
            .map(|c| c.incoming_sha.as_slice())
            .collect();
        let s: Vec<&str> = conflicts.iter().map(|c| c.stored.as_str()).collect();
        let i: Vec<&str> = conflicts.iter().map(|c| c.incoming.as_str()).collect();
        let o: Vec<i64> = conflicts.iter().map(|c| c.offset).collect();
        let table = plan.table.to_string();
        tx.execute(
            &prepared.conflict,
            &[
                &proj.name,
                &table,
                &at.topic,
                &at.partition,
                &at.group,
                &e,
                &v,
                &sd,
                &id,
                &sh,
                &ih,
                &s,
                &i,
                &o,
            ],
        )
        .await
        .map_err(pg_err)?;
    }
    Ok(())
}
