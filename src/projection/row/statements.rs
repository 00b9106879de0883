//! A row projection's statements, prepared once per connection: entity locks, state reads, upserts,
//! tombstones, conflicts.

use sha2::{Digest, Sha256};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Statement, Transaction};

use super::change::{ChangeKind, RowChange};
use super::plan::{RowPlan, TombstoneMode, TruncatePolicy, VersionPlan};
use super::table::{Shape, CONFLICTS, TRUNCATES, UNRESOLVED};
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::ident::QualifiedName;
use crate::model::apply_error::{classify, ApplyError};

/// The prepared statements of one row projection on one connection.
pub struct Prepared {
    /// The resolved shape.
    pub shape: Shape,
    pub(super) fetch_live: Statement,
    /// `$1` old keys (JSON array texts): the live rows whose `_unresolved` waits for one of them, key column
    /// texts then the marker. Not locked: it says which entities to lock.
    pub(super) fetch_unresolved: Statement,
    pub(super) fetch_tomb: Option<Statement>,
    pub(super) upsert: Statement,
    pub(super) delete_live: Option<Statement>,
    pub(super) upsert_tomb: Option<Statement>,
    pub(super) delete_tomb: Option<Statement>,
    pub(super) conflict: Statement,
    pub(super) truncate: Statement,
    /// Version-column projections with a tombstone table: the truncate turns older tombstones into ones without a
    /// version of their own, at its position.
    pub(super) truncate_tombs: Option<Statement>,
    /// A version column under `truncate = "truncate"`: a change after the stored state in source order applies
    /// even when its version did not grow (see [`compare`]).
    pub(super) reloads: bool,
    pub(super) mark_truncate: Statement,
    pub(super) watermark: Option<Statement>,
    pub(super) lock: Locks,
    /// The claimed states per (entity, version) ([`super::history`]).
    pub(super) history: super::history::Statements,
    /// Every value a batch brings, cast to its column's type and printed back ([`super::canon`]).
    pub(super) canon: Statement,
}

/// The statements that serialize one projection table's entities across concurrent batch transactions.
pub(super) struct Locks {
    /// `$1` classid, `$2` objid: the table-wide lock, shared (every batch that touches the table).
    pub(super) table_shared: Statement,
    /// The same lock, exclusive (a batch that applies a truncate to the table, or has more than
    /// [`MAX_ENTITY_LOCKS`] entities of it).
    pub(super) table_exclusive: Statement,
    /// `$1..$k` key column texts, `$k+1` the table's seed: one exclusive lock per distinct entity, taken in
    /// ascending lock-id order.
    pub(super) entities: Statement,
    /// The table lock's `(classid, objid)`.
    pub(super) table_id: (i32, i32),
    /// Seed of the entity lock ids (derived from the table name: two tables never share an entity lock).
    pub(super) seed: i64,
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
/// The low 32 bits of `h` (two's complement): the `int4` second key of a table's advisory lock.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the low 32 bits are the key, by design"
)]
fn low32(h: i64) -> i32 {
    h as i32
}

fn hash64(text: &str) -> i64 {
    let d = Sha256::digest(text.as_bytes());
    i64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The entity-lock statements of a row projection table (docs/guarantees.md "The four answers", 2).
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
        table_id: (TABLE_LOCK_CLASS, low32(hash64(&name))),
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
/// one lock per entity the fold reads or writes (its changes' keys, the old keys of primary-key changes, and
/// `waiting`: the new keys whose `_unresolved` columns wait for a key this batch deletes) in ascending
/// id order. Locks are held until the transaction ends. Returns whether the table lock is exclusive (it then
/// covers every entity).
///
/// Row projections lock in projection order, after the ledger claims and the checkpoint row: a transaction only
/// ever waits for a lock later in that one order than every lock it holds, so these locks add no deadlock (see
/// docs/guarantees.md "The four answers", 2). The row statements that follow (state reads `FOR UPDATE`, upserts,
/// tombstones, conflicts, truncates) touch only rows of entities locked here (or the whole table under the
/// exclusive lock), so no other replaysafe batch holds any of their row locks and their own row order needs no sort
/// (case C36).
pub(super) async fn lock_entities(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &[RowChange],
    waiting: &[Vec<String>],
    truncates: bool,
) -> std::result::Result<bool, ApplyError> {
    let l = &prepared.lock;
    let keys: Vec<&Vec<String>> = changes
        .iter()
        .filter(|c| c.kind != ChangeKind::Truncate)
        .flat_map(|c| std::iter::once(&c.key).chain(c.old_key.as_ref()))
        .chain(waiting)
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
        return Ok(exclusive);
    }
    let nk = prepared.shape.key.len();
    let cols: Vec<Vec<&str>> = (0..nk)
        .map(|i| keys.iter().map(|k| k[i].as_str()).collect())
        .collect();
    let mut params: Params = cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    params.push(&l.seed);
    tx.execute(&l.entities, &params).await.map_err(pg_err)?;
    Ok(false)
}

/// Prepares a row projection's statements.
///
/// # Errors
/// [`Error::Schema`] when a statement does not compile (missing table or column).
pub async fn prepare(c: &tokio_postgres::Client, p: &Pipeline, shape: Shape) -> Result<Prepared> {
    let plan = p.projections[shape.index]
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
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
    let (deleted_expr, last_version) = if column_mode {
        ("t._deleted_at IS NOT NULL", "t._last_version")
    } else {
        ("false", "NULL::bigint[]")
    };
    let fetch_live = prep(format!(
        "SELECT u.ord, t._version, t._sha256, t._delivery, {deleted_expr}, {}, t._position, t.{UNRESOLVED}::text, \
         {last_version} FROM unnest({kp}) WITH ORDINALITY AS u({ka}, ord) JOIN {t} t ON {kj} FOR UPDATE OF t",
        cols_text.join(", ")
    ))
    .await?;
    let key_text: Vec<String> = shape
        .key
        .iter()
        .map(|&k| format!("t.{}::text", shape.columns[k].name))
        .collect();
    let fetch_unresolved = prep(format!(
        "SELECT {}, t.{UNRESOLVED}::text FROM {t} t WHERE t.{UNRESOLVED} IS NOT NULL \
         AND (t.{UNRESOLVED} -> 'key') = ANY($1::text[]::jsonb[])",
        key_text.join(", ")
    ))
    .await?;
    let fetch_tomb = if column_mode {
        None
    } else {
        Some(
            prep(format!(
                "SELECT u.ord, t._version, t._delivery, t._last, t._position, t._last_version FROM unnest({kp}) WITH ORDINALITY \
                 AS u({ka}, ord) JOIN {tomb} t ON {kj} FOR UPDATE OF t"
            ))
            .await?,
        )
    };
    let (upsert, key_cols) = upsert_sql(&shape, t, column_mode);
    let upsert = prep(upsert).await?;
    // A version column under `truncate = "truncate"` may order a state by its source position ([`compare`]): the
    // fold, which decided under the entity's lock, then removes the other table's row whatever its version.
    let reloads =
        matches!(plan.version, VersionPlan::Column(_)) && plan.truncate == TruncatePolicy::Truncate;
    let (delete_live, upsert_tomb, delete_tomb) = if column_mode {
        (None, None, None)
    } else {
        let (delete_live, upsert_tomb, delete_tomb) =
            tombstone_sql(&shape, t, tomb, &key_cols, reloads);
        (
            Some(prep(delete_live).await?),
            Some(prep(upsert_tomb).await?),
            Some(prep(delete_tomb).await?),
        )
    };
    let conflict = prep(conflict_sql(p)).await?;
    let by_column = matches!(plan.version, VersionPlan::Column(_));
    let (truncate, truncate_tombs) = truncate_sql(plan, t, tomb, &key_cols, column_mode);
    let truncate = prep(truncate).await?;
    let truncate_tombs = match truncate_tombs {
        Some(sql) => Some(prep(sql).await?),
        None => None,
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
    let canon = prep(super::canon::canon_sql(&shape)).await?;
    let history = super::history::Statements {
        fetch: prep(super::history::fetch_sql(p)).await?,
        insert: prep(super::history::insert_sql(p)).await?,
        rewin: prep(super::history::rewin_sql(p)).await?,
        extend: prep(super::history::extend_sql(p)).await?,
        retag: prep(super::history::retag_sql(p)).await?,
        relabel: {
            let mut v = Vec::new();
            for sql in super::history::relabel_sql(p) {
                v.push(prep(sql).await?);
            }
            v
        },
    };
    Ok(Prepared {
        canon,
        history,
        mark_truncate,
        watermark,
        lock,
        shape,
        fetch_live,
        fetch_unresolved,
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

pub(super) fn pg_err(e: tokio_postgres::Error) -> ApplyError {
    classify(e, false)
}

pub(super) type Params<'a> = Vec<&'a (dyn ToSql + Sync)>;

/// The upsert of the states a fold ends with: one `text[]` per column, then versions (text `'{a,b}'`), hashes,
/// deliveries (, deleted flags), positions, `_unresolved` markers (, `_last_version`s: under `tombstones =
/// "column"`); a stored row changes only for a newer version (or position). Returns
/// the statement and the key column names.
fn upsert_sql(shape: &Shape, t: &QualifiedName, column_mode: bool) -> (String, Vec<String>) {
    let n = shape.columns.len();
    let mut params: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
    params.push(format!("${}::text[]", n + 1));
    params.push(format!("${}::bytea[]", n + 2));
    params.push(format!("${}::text[]", n + 3));
    if column_mode {
        params.push(format!("${}::boolean[]", n + 4));
    }
    params.push(format!("${}::text[]", n + 4 + usize::from(column_mode)));
    params.push(format!("${}::text[]", n + 5 + usize::from(column_mode)));
    if column_mode {
        params.push(format!("${}::text[]", n + 7));
    }
    let mut alias: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    alias.extend(["v", "h", "d"].map(String::from));
    if column_mode {
        alias.push("del".into());
    }
    alias.push("pos".into());
    alias.push("un".into());
    if column_mode {
        alias.push("lv".into());
    }
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
    select.push("u.un::jsonb".into());
    target.push(UNRESOLVED.into());
    if column_mode {
        select.push("u.lv::bigint[]".into());
        target.push("_last_version".into());
    }
    let key_cols: Vec<String> = shape.key.iter().map(|&i| names[i].clone()).collect();
    // A `GENERATED ALWAYS AS IDENTITY` column takes the source's value (the row's identity there) and is never
    // updated (PostgreSQL refuses both otherwise, SQLSTATE 428C9).
    let identity: Vec<String> = shape
        .columns
        .iter()
        .filter(|c| shape.identity.iter().any(|i| i == c.name.as_str()))
        .map(|c| c.name.to_string())
        .collect();
    let updates: Vec<String> = target
        .iter()
        .filter(|c| !key_cols.contains(c) && !identity.contains(c))
        .map(|c| {
            if c == "_deleted_at" {
                // A deleted row that only takes the values of a newer write at or before its delete
                // (`guard::keep_last`, the same delivery) keeps its deletion time.
                format!(
                    "{c} = CASE WHEN t.{c} IS NOT NULL AND EXCLUDED.{c} IS NOT NULL \
                     AND t._delivery IS NOT DISTINCT FROM EXCLUDED._delivery THEN t.{c} ELSE EXCLUDED.{c} END"
                )
            } else {
                format!("{c} = EXCLUDED.{c}")
            }
        })
        .collect();
    let overriding = if identity.is_empty() {
        ""
    } else {
        " OVERRIDING SYSTEM VALUE"
    };
    let sql = format!(
        "INSERT INTO {t} AS t ({}){overriding} SELECT {} FROM unnest({}) AS u({}) ON CONFLICT ({}) DO UPDATE SET {} \
         WHERE t._version <= EXCLUDED._version OR cardinality(EXCLUDED._version) = 0 \
         OR EXCLUDED._position > t._position",
        target.join(", "),
        select.join(", "),
        params.join(", "),
        alias.join(", "),
        key_cols.join(", "),
        updates.join(", ")
    );
    (sql, key_cols)
}

/// Table-mode tombstone statements: delete the live rows a fold ends deleted, upsert their tombstones (also at
/// their stored version: a tombstone that takes the values of a newer write at or before its delete,
/// `guard::keep_last`, keeps its deletion time), delete the tombstones of keys written live again. `reloads`: see [`Prepared`].
fn tombstone_sql(
    shape: &Shape,
    t: &QualifiedName,
    tomb: &QualifiedName,
    key_cols: &[String],
    reloads: bool,
) -> (String, String, String) {
    let (kp, ka, kj) = key_unnest(shape, 1);
    let k = shape.key.len();
    let kv = format!("${}::text[]", k + 1);
    let kd = format!("${}::text[]", k + 2);
    let kl = format!("${}::text[]", k + 3);
    let kpos = format!("${}::text[]", k + 4);
    let klv = format!("${}::text[]", k + 5);
    let key_select: Vec<String> = shape
        .key
        .iter()
        .enumerate()
        .map(|(i, &c)| format!("u.k{i}::{}", shape.columns[c].ty.sql))
        .collect();
    (
        format!(
                "DELETE FROM {t} t USING unnest({kp}, {kv}) AS u({ka}, v) WHERE {kj} AND (t._version <= u.v::bigint[] \
                 OR cardinality(u.v::bigint[]) = 0 OR {reloads})"
        ),
        format!(
                "INSERT INTO {tomb} AS t ({}, _version, _delivery, _deleted_at, _last, _position, _last_version) \
                 SELECT {}, u.v::bigint[], u.d, now(), u.l::jsonb, u.pos::bigint[], u.lv::bigint[] \
                 FROM unnest({kp}, {kv}, {kd}, {kl}, {kpos}, {klv}) AS u({ka}, v, d, l, pos, lv) \
                 ON CONFLICT ({}) DO UPDATE SET _last = EXCLUDED._last, _version = EXCLUDED._version, \
                 _delivery = EXCLUDED._delivery, _deleted_at = CASE WHEN t._delivery IS NOT DISTINCT FROM \
                 EXCLUDED._delivery THEN t._deleted_at ELSE EXCLUDED._deleted_at END, _position = EXCLUDED._position, \
                 _last_version = EXCLUDED._last_version \
                 WHERE t._version <= EXCLUDED._version OR cardinality(t._version) = 0 \
                 OR cardinality(EXCLUDED._version) = 0 OR EXCLUDED._position > t._position",
                key_cols.join(", "),
                key_select.join(", "),
                key_cols.join(", ")
        ),
        format!(
                "DELETE FROM {tomb} t USING unnest({kp}, {kv}) AS u({ka}, v) WHERE {kj} AND (t._version < u.v::bigint[] OR {reloads})"
        ),
    )
}

/// The insert of a fold's conflicts into the conflicts table. Parameters: `$1` projection, `$2` table, `$3`
/// topics, `$4` partitions (one per conflict: where its incoming state came from), `$5` group, then one array per
/// conflict column.
fn conflict_sql(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {} (projection, table_name, entity, version, stored_delivery, incoming_delivery, stored_sha256, \
         incoming_sha256, stored, incoming, topic, partition, \"offset\", consumer_group) \
         SELECT $1, $2, u.e::jsonb, u.v::bigint[], u.sd, u.id, u.sh, u.ih, u.s::jsonb, u.i::jsonb, u.t, u.p, u.o, $5 \
         FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::bytea[], $12::text[], \
         $13::text[], $14::bigint[], $3::text[], $4::integer[]) AS u(e, v, sd, id, sh, ih, s, i, o, t, p) \
         ON CONFLICT (projection, entity, version, incoming_sha256) DO NOTHING",
        p.table(CONFLICTS)
    )
}

/// The truncate statements: the projection's rows older than the truncate become tombstones at its position;
/// under a version column (table mode) the existing tombstones lose their version too.
fn truncate_sql(
    plan: &RowPlan,
    t: &QualifiedName,
    tomb: &QualifiedName,
    key_cols: &[String],
    column_mode: bool,
) -> (String, Option<String>) {
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
        format!(
            "UPDATE {t} SET _deleted_at = coalesce(_deleted_at, now()), _version = {tomb_version}, \
             _position = $1::text::bigint[], _delivery = $2, _updated_at = now() \
             WHERE {older} AND ({by_column} OR _deleted_at IS NULL)"
        )
    } else {
        format!(
            "WITH gone AS (DELETE FROM {t} WHERE {older} RETURNING {kc}) \
             INSERT INTO {tomb} AS t ({kc}, _version, _delivery, _deleted_at, _position) \
             SELECT {kc}, {tomb_version}, $2, now(), $1::text::bigint[] \
             FROM gone ON CONFLICT ({kc}) DO UPDATE SET _version = EXCLUDED._version, _delivery = EXCLUDED._delivery, \
             _deleted_at = EXCLUDED._deleted_at, _position = EXCLUDED._position \
             WHERE t._version < EXCLUDED._version OR {by_column}",
            kc = key_cols.join(", ")
        )
    };
    let truncate_tombs = if by_column && !column_mode {
        Some(format!(
            "UPDATE {tomb} SET _version = '{{}}', _position = $1::text::bigint[] WHERE {older}"
        ))
    } else {
        None
    };
    (truncate, truncate_tombs)
}
