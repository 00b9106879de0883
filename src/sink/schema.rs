//! Creating and checking the tables a pipeline needs, and the ledger's day partitions.

use tokio_postgres::{Client, GenericClient, Transaction};

use super::ledger::DDL_LOCK;
use super::{checkpoint, dead_letters, ledger, marks, projset, projstart};
use crate::config::{FieldType, Pipeline};
use crate::error::{Error, Result};

/// Creates (or leaves alone, when present and compatible) the schema, ledger, checkpoint and dead-letter tables
/// and the tables of built-in projections, runs each `sql` projection's `setup`, then checks that the ledger has
/// the columns the pipeline expects and that every projection statement compiles against the database. The
/// schema and replaysafe's own tables are created only when missing (a role without `CREATE` gets past them when
/// its owner made them); projection setup is idempotent DDL run every time.
///
/// # Errors
/// [`Error::Schema`] when an existing table does not match or a projection statement does not compile;
/// [`Error::Privilege`] when the role may not create or alter what is needed (the message says how to split DDL
/// from the runtime role); [`Error::Postgres`] for connection problems.
pub async fn init(client: &mut Client, p: &Pipeline) -> Result<()> {
    init_unchecked(client, p)
        .await
        .map_err(|e| super::privileges::explain(e, p))
}

async fn init_unchecked(client: &mut Client, p: &Pipeline) -> Result<()> {
    // Existing projection columns of another type: refused before anything is created or recorded.
    check_column_types(client, p).await?;
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    // The projection record and the projection tables' marks are checked before anything is created: a
    // refused start leaves the database as it was.
    let start = projection_start(&tx, p).await?;
    let schema_missing: bool = tx
        .query_one(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&p.postgres.schema.as_str()],
        )
        .await?
        .get(0);
    if schema_missing {
        let stmt = format!("CREATE SCHEMA IF NOT EXISTS {}", p.postgres.schema);
        tx.batch_execute(&stmt)
            .await
            .map_err(|e| schema_error("creating the schema", &stmt, e))?;
    }
    // A ledger of the primary-key layout uses no key type: nothing is asked of it (nor of its role).
    if !super::privileges::table_exists(&tx, &p.ledger.table.to_string()).await?
        || ledger::key_is_hashed(&tx, p).await?
    {
        ensure_key_type(&tx, p).await?;
    }
    for (table, stmt) in own_tables(p) {
        if super::privileges::table_exists(&tx, &table).await? {
            continue;
        }
        tx.batch_execute(&stmt)
            .await
            .map_err(|e| schema_error("creating replaysafe tables", &stmt, e))?;
    }
    upgrade_old_ledger(&tx, p).await?;
    let resolvable: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attname = 'resolved_by' AND NOT attisdropped)",
            &[&p.table(dead_letters::DEAD_LETTERS).to_string()],
        )
        .await?
        .get(0);
    if !resolvable {
        tx.batch_execute(&dead_letters::upgrade_dead_letters(p))
            .await?;
    }
    tx.batch_execute(&dead_letters::upgrade_dead_letters_log(p))
        .await?;
    tx.batch_execute(&checkpoint::upgrade_checkpoints(p))
        .await?;
    tx.execute(
        &format!(
            "INSERT INTO {} (ledger) VALUES ($1) ON CONFLICT (ledger) DO NOTHING",
            p.table(ledger::HORIZON)
        ),
        &[&p.ledger.table.to_string()],
    )
    .await?;
    for proj in &p.projections {
        for stmt in &proj.setup {
            tx.batch_execute(stmt).await.map_err(|e| {
                schema_error(&format!("setup of projection `{}`", proj.name), stmt, e)
            })?;
            // The operator's SQL may have set what every session pins (`SET search_path`, `datestyle` …).
            super::pin(&tx, &p.postgres.timeouts).await?;
        }
    }
    crate::projection::apply::setup(&tx, p).await?;
    record_projections(&tx, p, start).await?;
    tx.commit().await?;
    check_ledger(client, p).await?;
    check_statements(client, p).await
}

/// Creates the ledger's key type ([`ledger::key_type`]) when no object of its name exists. A leftover type of a
/// dropped ledger is kept (day partitions detached for an archive may still use it); its fields are compared
/// with the pipeline's by [`check_key_constraint`].
///
/// # Errors
/// [`Error::Schema`] when a table, view, index or sequence has the type's name.
async fn ensure_key_type(tx: &Transaction<'_>, p: &Pipeline) -> Result<()> {
    let name = ledger::key_type(p).to_string();
    let kind: Option<i8> = tx
        .query_opt(
            "SELECT relkind::\"char\" FROM pg_class WHERE oid = to_regclass($1)",
            &[&name],
        )
        .await?
        .map(|r| r.get(0));
    match kind {
        None => {
            let stmt = ledger::create_key_type(p);
            tx.batch_execute(&stmt)
                .await
                .map_err(|e| schema_error("creating the ledger's key type", &stmt, e))
        }
        Some(k) if k.to_ne_bytes() == [b'c'] => Ok(()),
        Some(_) => Err(Error::Schema(format!(
            "{name} is the name of the ledger's delivery-key type, and a table, view, index or sequence has it: \
             rename that, or give the pipeline another [ledger] table"
        ))),
    }
}

/// replaysafe's own tables of the pipeline, each with the statement creating it (the projection record's
/// statement creates its hand-over table too, named here).
fn own_tables(p: &Pipeline) -> [(String, String); 8] {
    [
        (p.ledger.table.to_string(), ledger::create_ledger(p)),
        (
            p.table(ledger::SOURCES).to_string(),
            ledger::create_sources(p),
        ),
        (
            p.table(checkpoint::CHECKPOINTS).to_string(),
            checkpoint::create_checkpoints(p),
        ),
        (
            p.table(dead_letters::DEAD_LETTERS).to_string(),
            dead_letters::create_dead_letters(p),
        ),
        (
            p.table(checkpoint::GROUP_STARTS).to_string(),
            checkpoint::create_group_starts(p),
        ),
        (
            p.table(ledger::HORIZON).to_string(),
            ledger::create_horizon(p),
        ),
        (
            p.table(super::lifecycle::PRUNED).to_string(),
            super::lifecycle::create_pruned(p),
        ),
        (
            p.table(projset::HANDOVER).to_string(),
            projset::create_tables(p),
        ),
    ]
}

/// A ledger of the first layout (a `topic` column, no `_source_id`) is migrated in place in `tx`
/// ([`ledger::upgrade_ledger`]): its delivery keys stay, its provenance moves to the sources table.
///
/// # Errors
/// [`Error::Schema`] when the migration fails (the transaction then leaves the ledger as it was).
async fn upgrade_old_ledger(tx: &Transaction<'_>, p: &Pipeline) -> Result<()> {
    // The rows an interrupted rebuild deleted wait in its pending table (`LIKE` the ledger): migrated alike, so the
    // rerun's `INSERT … SELECT *` and its re-read still match.
    let pending = super::ledger::pending_table(p).to_string();
    for table in [p.ledger.table.to_string(), pending] {
        let old: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'topic' \
                 AND NOT attisdropped) AND NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
                 AND attname = '_source_id' AND NOT attisdropped)",
                &[&table],
            )
            .await?
            .get(0);
        if !old {
            continue;
        }
        let stmt = ledger::upgrade_ledger(p, &table);
        tx.batch_execute(&stmt)
            .await
            .map_err(|e| schema_error("migrating the ledger to interned sources", &stmt, e))?;
        tracing::info!(%table, "ledger migrated: topic, partition and consumer group interned into {}", p.table(ledger::SOURCES));
    }
    Ok(())
}

/// The projection record and the projection tables' marks, checked before anything is created
/// ([`projstart::start`]); a new, empty ledger behind its group's checkpoints is warned about.
///
/// # Errors
/// As [`projset::start`].
async fn projection_start(tx: &Transaction<'_>, p: &Pipeline) -> Result<projstart::Start> {
    let start = projstart::start(tx, p).await?;
    if start.record.is_none() && !start.ledger_rows {
        warn_new_ledger_behind_checkpoints(tx, p).await?;
    }
    Ok(start)
}

/// Records the projections (and the hand-over point of added ones) and marks their tables, in `tx`.
///
/// # Errors
/// [`Error::Postgres`].
async fn record_projections(
    tx: &Transaction<'_>,
    p: &Pipeline,
    start: projstart::Start,
) -> Result<()> {
    projstart::record(tx, p, start).await?;
    marks::write(tx, p).await
}

/// A new, empty ledger under a group that already has checkpoints (a changed pipeline given its own ledger but
/// the old `group-id`): `run` resumes at those checkpoints, so the records before them never reach the new
/// ledger and its tables. Said as a warning naming a checkpoint (a deliberate `start = "latest"`-like choice
/// stays possible).
///
/// # Errors
/// [`Error::Postgres`] when the checkpoints cannot be read.
async fn warn_new_ledger_behind_checkpoints(
    client: &impl GenericClient,
    p: &Pipeline,
) -> Result<()> {
    let table = p.table(checkpoint::CHECKPOINTS).to_string();
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    if !exists {
        return Ok(());
    }
    let row = client
        .query_opt(
            &format!(
                "SELECT topic, partition, next_offset FROM {} WHERE consumer_group = $1 AND next_offset > 0 \
                 ORDER BY topic, partition LIMIT 1",
                p.table(checkpoint::CHECKPOINTS)
            ),
            &[&p.kafka.group_id],
        )
        .await?;
    if let Some(r) = row {
        let (topic, partition, next): (String, i32, i64) = (r.get(0), r.get(1), r.get(2));
        tracing::warn!(
            ledger = %p.ledger.table,
            group = %p.kafka.group_id,
            "the ledger is new, but group `{}` already has checkpoints (e.g. {topic}/{partition} at offset {next}): \
             `run` resumes there, and the records before them never reach this ledger and its projection tables; \
             to build them from the topic's beginning use a new [kafka] group-id with start = \"earliest\"",
            p.kafka.group_id
        );
    }
    Ok(())
}

/// A column of a projection table that holds a field's values (or a declared row column), with what the
/// pipeline expects it to be.
struct TypedColumn<'a> {
    projection: &'a str,
    table: String,
    column: &'a str,
    /// The type the pipeline writes (PostgreSQL spelling as in the pipeline).
    ty: String,
    /// Where that type comes from, for the message.
    from: String,
    /// A sum target adding a bigint field: `bigint` is accepted besides `numeric` (exact either way).
    or_bigint: bool,
}

/// `check --database`: the row projections' destination columns ([`crate::projection::row::table::column_notes`])
/// and the declared column types against the existing tables ([`check_column_types`]: an enum, jsonb or domain
/// column declared with another type is named), as findings — before any batch.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn destination_findings(
    client: &mut Client,
    p: &Pipeline,
) -> Result<Vec<super::privileges::Finding>> {
    let mut out = Vec::new();
    for (i, proj) in p.projections.iter().enumerate() {
        if proj.row.is_none() {
            continue;
        }
        for (ok, what) in crate::projection::row::table::column_notes(&*client, p, i).await? {
            out.push(super::privileges::Finding {
                ok,
                what: format!("row projection `{}`: {what}", proj.name),
            });
        }
    }
    match check_column_types(client, p).await {
        Ok(()) => {}
        Err(Error::Schema(what)) => out.push(super::privileges::Finding { ok: false, what }),
        Err(e) => return Err(e),
    }
    Ok(out)
}

/// Checks that every projection column holding a field's values (counter/sum group-by columns, row projection
/// columns, sum targets: `numeric`, or `bigint` for a bigint field) has the type the pipeline writes: PostgreSQL would otherwise cast new values into the old type, so
/// `'007'` (text) and `7` (bigint) would become two groups of one entity, silently.
///
/// # Errors
/// [`Error::Schema`] naming the projection, the column, the table's type and the field's type.
pub(super) async fn check_column_types(client: &mut Client, p: &Pipeline) -> Result<()> {
    let mut cols: Vec<TypedColumn<'_>> = Vec::new();
    for proj in &p.projections {
        if let Some(a) = &proj.aggregate {
            for &i in &a.group_by {
                let f = &p.fields[i];
                cols.push(TypedColumn {
                    projection: &proj.name,
                    table: a.table.to_string(),
                    column: f.name.as_str(),
                    ty: f.ty.sql().to_string(),
                    from: format!("field `{}`", f.name.as_str()),
                    or_bigint: false,
                });
            }
            // Sum targets: anything but numeric (or bigint for a bigint field) rounds or truncates the sums
            // silently (PostgreSQL's assignment cast: 1.5 into bigint is 2).
            for (col, fi) in a.values.iter().zip(&a.value_fields) {
                if let Some(i) = fi {
                    let f = &p.fields[*i];
                    cols.push(TypedColumn {
                        projection: &proj.name,
                        table: a.table.to_string(),
                        column: col.as_str(),
                        ty: "numeric".to_string(),
                        from: format!("the sum of field `{}` ({})", f.name.as_str(), f.ty.sql()),
                        or_bigint: f.ty == FieldType::Bigint,
                    });
                }
            }
        }
        if let Some(r) = &proj.row {
            for c in r.columns.iter().flatten() {
                cols.push(TypedColumn {
                    projection: &proj.name,
                    table: r.table.to_string(),
                    column: c.name.as_str(),
                    ty: c.ty.sql.clone(),
                    from: match c.field {
                        Some(i) => format!("field `{}`", p.fields[i].name.as_str()),
                        None => format!("`columns` of projection `{}`", proj.name),
                    },
                    or_bigint: false,
                });
            }
        }
    }
    if cols.is_empty() {
        return Ok(());
    }
    let tx = client.transaction().await?;
    // PostgreSQL spells the expected types itself: a throw-away table with them (types are validated names).
    let defs: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| format!("c{i} {}", c.ty))
        .collect();
    tx.batch_execute(&format!(
        "CREATE TEMP TABLE replaysafe_typecheck ({}) ON COMMIT DROP",
        defs.join(", ")
    ))
    .await?;
    let expected: Vec<String> = tx
        .query(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 'pg_temp.replaysafe_typecheck'::regclass AND attnum > 0 ORDER BY attnum",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (c, want) in cols.iter().zip(&expected) {
        let have: Option<String> = tx
            .query_opt(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                &[&c.table, &c.column],
            )
            .await?
            .map(|r| r.get(0));
        if let Some(have) = have {
            // varchar holds text values unchanged (a too long one fails loudly): the one accepted difference.
            let same = &have == want
                || (want == "text" && have.starts_with("character varying"))
                || (c.or_bigint && have == "bigint");
            if !same {
                return Err(Error::Schema(format!(
                    "projection `{}`: column `{}` of {} is {have}, but {} is {want}: PostgreSQL would cast the \
                     new values into the column's type (one entity could land in two groups or rows, a sum be \
                     rounded) or fail. \
                     Change the type back, or migrate deliberately: ALTER the column to {want} and convert its rows, \
                     or rebuild from the topic: a new [ledger] table, new projection tables and a \
                     new [kafka] group-id with start = \"earliest\"",
                    c.projection, c.column, c.table, c.from
                )));
            }
        }
    }
    tx.rollback().await?;
    Ok(())
}

fn schema_error(what: &str, stmt: &str, e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        // A lock or statement timeout, a terminated session: not a mismatch, retried by the caller.
        Some(db) if crate::model::retryable(db.code().code()) => Error::Postgres(e),
        Some(db) => Error::Schema(format!("{what}: {} (statement: {stmt})", db.message())),
        None => Error::Postgres(e),
    }
}

/// Checks the ledger's columns and types against the pipeline (a changed key or type would silently break
/// deduplication).
pub(super) async fn check_ledger(client: &Client, p: &Pipeline) -> Result<()> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            &[&p.ledger.table.to_string()],
        )
        .await?;
    let have: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut expect: Vec<(String, String)> = vec![
        ("generation".into(), "text".into()),
        ("_source_id".into(), "smallint".into()),
        ("offset".into(), "bigint".into()),
    ];
    for i in ledger::ledger_field_columns(p) {
        let f = &p.fields[i];
        let ty = match f.ty.sql() {
            "timestamptz" => "timestamp with time zone",
            other => other,
        };
        expect.push((f.name.as_str().to_string(), ty.to_string()));
    }
    for (name, ty) in &expect {
        match have.iter().find(|(n, _)| n == name) {
            None => {
                return Err(Error::Schema(format!(
                    "ledger {} has no column `{name}` ({ty}); it was created for another pipeline — use another \
                     [ledger] table (with a new [kafka] group-id: checkpoints belong to the group) or migrate it",
                    p.ledger.table
                )))
            }
            Some((_, t)) if t != ty => {
                return Err(Error::Schema(format!(
                    "ledger {} column `{name}` is {t}, the pipeline expects {ty} (field `{name}`'s type changed?): \
                     the delivery keys and columns already claimed hold the old type's values, so a key would no \
                     longer be recognised or a column mix both. Change the field's type back, or give the pipeline \
                     its own [ledger] table, new projection tables and a new [kafka] group-id (docs/replay.md \
                     \"Changing a field type or a projection\")",
                    p.ledger.table
                )))
            }
            Some(_) => {}
        }
    }
    let want: Vec<String> = ledger::ledger_pk(p)
        .iter()
        .map(|c| c.trim_matches('"').to_string())
        .collect();
    if ledger::key_is_hashed(client, p).await? {
        return check_key_constraint(client, p, &want).await;
    }
    // A ledger of the earlier layout: its primary key must be exactly what the pipeline deduplicates on.
    let pk: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
             AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass($1) AND i.indisprimary \
             ORDER BY array_position(i.indkey, a.attnum)",
            &[&p.ledger.table.to_string()],
        )
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    if pk != want {
        return Err(Error::Schema(format!(
            "ledger {} primary key is ({}), the pipeline's delivery key needs ({})",
            p.ledger.table,
            pk.join(", "),
            want.join(", ")
        )));
    }
    Ok(())
}

/// A ledger without a primary key keeps its delivery keys by [`ledger::key_constraint`]: its key type's fields
/// must be `want` (the pipeline's [`ledger::ledger_pk`]), and every day partition (the table itself when not
/// partitioned) must hold an exclusion constraint.
///
/// # Errors
/// [`Error::Schema`] naming what differs or which table lacks the constraint.
async fn check_key_constraint(client: &Client, p: &Pipeline, want: &[String]) -> Result<()> {
    let key_type = ledger::key_type(p).to_string();
    let have: Vec<String> = client
        .query(
            "SELECT a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_class c \
             JOIN pg_attribute a ON a.attrelid = c.oid WHERE c.oid = to_regclass($1) AND c.relkind = 'c' \
             AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&key_type],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want: Vec<String> = want
        .iter()
        .zip(ledger::key_type_fields(p))
        .map(|(name, ty)| format!("{name} {ty}"))
        .collect();
    if have != want {
        return Err(Error::Schema(format!(
            "ledger {} has no primary key and its delivery-key type {key_type} is ({}); the pipeline's delivery \
             key needs ({}) (a type left by a dropped ledger of another key? `DROP TYPE {key_type}` once no table \
             uses it, then drop and create the ledger again)",
            p.ledger.table,
            have.join(", "),
            want.join(", ")
        )));
    }
    ledger::require_key_constraints(client, p).await
}

/// Prepares every statement a batch runs, so a projection that names a missing table or column fails before
/// anything is consumed.
pub(super) async fn check_statements(client: &mut Client, p: &Pipeline) -> Result<()> {
    client.batch_execute(&ledger::create_landed(p)).await?;
    let tx = client.transaction().await?;
    for (what, stmt) in [
        ("the ledger claim".to_string(), ledger::claim(p)),
        (
            "the dead-letter insert".to_string(),
            dead_letters::insert_dead_letters(p),
        ),
        (
            "the checkpoint update".to_string(),
            checkpoint::advance_checkpoint(p),
        ),
        (
            "the dead-letter resolution".to_string(),
            dead_letters::resolve_statement(p),
        ),
    ]
    .into_iter()
    .chain(
        p.projections
            .iter()
            .filter(|proj| proj.row.is_none())
            .map(|proj| {
                (
                    format!("projection `{}`", proj.name),
                    proj.statement.clone(),
                )
            }),
    ) {
        tx.prepare(&stmt)
            .await
            .map_err(|e| schema_error(&what, &stmt, e))?;
    }
    tx.rollback().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::plan::OWN_TABLES;

    /// `config::plan::OWN_TABLES` (what a projection table may not be named) holds every table the sink and
    /// the row projection keep beside the ledger.
    #[test]
    fn own_tables_lists_every_bookkeeping_table() {
        for t in [
            super::checkpoint::CHECKPOINTS,
            super::checkpoint::GROUP_STARTS,
            super::dead_letters::DEAD_LETTERS,
            super::ledger::SOURCES,
            super::ledger::HORIZON,
            super::projset::PROJECTION_SET,
            super::projset::HANDOVER,
            crate::sink::lifecycle::PRUNED,
            crate::projection::row::CONFLICTS,
            crate::projection::row::TRUNCATES,
            crate::projection::row::history::VERSIONS,
        ] {
            assert!(OWN_TABLES.contains(&t), "{t}");
        }
        assert_eq!(OWN_TABLES.len(), 11);
    }
}
