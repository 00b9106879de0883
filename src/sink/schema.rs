//! Creating and checking the tables a pipeline needs, and the ledger's day partitions.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::ledger::DDL_LOCK;
use super::{checkpoint, dead_letters, ledger};
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
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
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
    for (table, stmt) in [
        (p.ledger.table.clone(), ledger::create_ledger(p)),
        (
            p.table(checkpoint::CHECKPOINTS),
            checkpoint::create_checkpoints(p),
        ),
        (
            p.table(dead_letters::DEAD_LETTERS),
            dead_letters::create_dead_letters(p),
        ),
        (
            p.table(checkpoint::GROUP_STARTS),
            checkpoint::create_group_starts(p),
        ),
        (p.table(ledger::HORIZON), ledger::create_horizon(p)),
    ] {
        if super::privileges::table_exists(&tx, &table.to_string()).await? {
            continue;
        }
        tx.batch_execute(&stmt)
            .await
            .map_err(|e| schema_error("creating replaysafe tables", &stmt, e))?;
    }
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
        }
    }
    for (i, proj) in p.projections.iter().enumerate() {
        if proj.row.is_some() {
            super::row::setup(&tx, p, i).await?;
        }
    }
    tx.commit().await?;
    check_column_types(client, p).await?;
    check_ledger(client, p).await?;
    check_owner(client, p).await?;
    check_statements(client, p).await
}

/// Prefix of the ledger table comment recording the projections its claims were made for (format 2): followed by
/// a JSON object `{projection name: {setting: value}}` ([`crate::config::ProjectionPlan::settings`]).
const OWNER_V2: &str = "replaysafe projections v2 ";
/// Prefix of the format-1 comment (replaysafe before format 2): a digest of the projections' names and kinds.
const OWNER_V1: &str = "replaysafe projections sha256:";
/// What every projection record written by replaysafe starts with; any other comment is not one.
const OWNER_PREFIX: &str = "replaysafe projections ";

/// Format 1: the digest of the projections' names and kinds (kept to recognise ledgers written before format 2).
fn projection_digest_v1(p: &Pipeline) -> String {
    let mut parts: Vec<String> = p
        .projections
        .iter()
        .map(|x| format!("{}:{:?}", x.name, x.kind))
        .collect();
    parts.sort();
    let digest = Sha256::digest(parts.join("\n").as_bytes());
    format!("{OWNER_V1}{}", hex::encode(digest))
}

type Settings = BTreeMap<String, BTreeMap<String, String>>;

fn projection_settings(p: &Pipeline) -> Settings {
    p.projections
        .iter()
        .map(|x| (x.name.clone(), x.settings.clone()))
        .collect()
}

/// The projections a ledger's claims were made for, as recorded in the ledger's table comment. A delivery key
/// claimed under one definition of the projections is never projected again, so a ledger that holds rows and
/// was recorded with other projections — another set, or one whose settings (filter, group-by, targets,
/// payload, key, columns, version, the fields it reads …) differ — is refused.
pub(super) fn projection_record(p: &Pipeline) -> String {
    format!(
        "{OWNER_V2}{}",
        serde_json::to_string(&projection_settings(p)).expect("strings serialise")
    )
}

/// What differs between the recorded projections and the pipeline's, one sentence each. Settings present on one
/// side only (written by another version of replaysafe) are not compared.
fn settings_changes(old: &Settings, new: &Settings) -> Vec<String> {
    let mut out = Vec::new();
    for (name, o) in old {
        match new.get(name) {
            None => out.push(format!(
                "projection `{name}` ({}) is no longer in the pipeline",
                o.get("kind").map_or("?", String::as_str)
            )),
            Some(n) => {
                for (k, ov) in o {
                    if let Some(nv) = n.get(k) {
                        if nv != ov {
                            let shown = |v: &str| {
                                if v.is_empty() {
                                    "none".to_string()
                                } else {
                                    format!("`{v}`")
                                }
                            };
                            out.push(format!(
                                "projection `{name}`: `{k}` was {}, now {}",
                                shown(ov),
                                shown(nv)
                            ));
                        }
                    }
                }
            }
        }
    }
    for (name, n) in new {
        if !old.contains_key(name) {
            out.push(format!(
                "projection `{name}` ({}) is new",
                n.get("kind").map_or("?", String::as_str)
            ));
        }
    }
    out
}

async fn check_owner(client: &mut Client, p: &Pipeline) -> Result<()> {
    let want = projection_record(p);
    let table = p.ledger.table.to_string();
    let have: Option<String> = client
        .query_one(
            "SELECT obj_description(to_regclass($1), 'pg_class')",
            &[&table],
        )
        .await?
        .get(0);
    if have.as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    let has_rows: bool = client
        .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {table})"), &[])
        .await?
        .get(0);
    let fix = "The records already claimed were projected under the recorded definition and are never projected \
               again, so the tables would mix both. To apply the change, give this pipeline its own [ledger] table, \
               new projection tables and a new [kafka] group-id with start = \"earliest\" (checkpoints belong to \
               the group: under the old group-id it would resume where the old pipeline stopped, and the new \
               tables would miss every earlier record), or empty the ledger and those tables and consume from the \
               beginning under a new group-id; changing a projection of a live pipeline in place is not supported \
               yet";
    match have.as_deref() {
        // A comment replaysafe did not write (a DBA's note on a ledger from before the check): no record of
        // the projections, as with no comment; replaced, and said so.
        Some(h) if has_rows && !h.starts_with(OWNER_PREFIX) => {
            tracing::warn!(
                ledger = %table,
                replaced = %h,
                "the ledger's table comment is not a replaysafe projection record; replacing it with the record of \
                 this pipeline's projections (replaysafe keeps its projection record in the ledger's comment)"
            );
        }
        Some(h) if has_rows => {
            if let Some(json) = h.strip_prefix(OWNER_V2) {
                let old: Settings = serde_json::from_str(json).map_err(|e| {
                    Error::Schema(format!(
                        "ledger {table}: its comment records projections in an unreadable form ({e}); restore it or \
                         use another [ledger] table"
                    ))
                })?;
                let changes = settings_changes(&old, &projection_settings(p));
                if !changes.is_empty() {
                    return Err(Error::Schema(format!(
                        "ledger {table} already holds delivery keys claimed for other projections: {}. {fix}",
                        changes.join("; ")
                    )));
                }
                // Equal on every setting both record (another replaysafe version may record more).
            } else if h == projection_digest_v1(p) {
                // Format 1 recorded only names and kinds: those match, the settings cannot be compared. Recorded
                // in format 2 from now on, so later changes are caught.
                tracing::info!(
                    ledger = %table,
                    "ledger recorded its projections' names and kinds only (replaysafe before format 2); recording \
                     their settings now — a settings change made before this start cannot be detected"
                );
            } else {
                let names: Vec<&str> = p.projections.iter().map(|x| x.name.as_str()).collect();
                return Err(Error::Schema(format!(
                    "ledger {table} already holds delivery keys claimed for a different set of projections than \
                     this pipeline's [{}]: records already in the ledger would never reach the new or other \
                     projections. {fix}",
                    names.join(", ")
                )));
            }
        }
        None if !has_rows => warn_new_ledger_behind_checkpoints(client, p).await?,
        _ => {}
    }
    let stmt: String = client
        .query_one(
            "SELECT format('COMMENT ON TABLE %s IS %L', $1::text, $2::text)",
            &[&table, &want],
        )
        .await?
        .get(0);
    client.batch_execute(&stmt).await?;
    Ok(())
}

/// A new, empty ledger under a group that already has checkpoints (a changed pipeline given its own ledger but
/// the old `group-id`): `run` resumes at those checkpoints, so the records before them never reach the new
/// ledger and its tables. Said as a warning naming a checkpoint (a deliberate `start = "latest"`-like choice
/// stays possible).
///
/// # Errors
/// [`Error::Postgres`] when the checkpoints cannot be read.
async fn warn_new_ledger_behind_checkpoints(client: &Client, p: &Pipeline) -> Result<()> {
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
                     or rebuild from the topic: a new [ledger] table, new (or emptied) projection tables and a \
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
        Some(db) if super::retryable(db.code().code()) => Error::Postgres(e),
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
    let mut expect: Vec<(String, String)> = vec![("generation".into(), "text".into())];
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
                     its own [ledger] table, new projection tables and a new [kafka] group-id (README \
                     \"Changing a field type or a projection\")",
                    p.ledger.table
                )))
            }
            Some(_) => {}
        }
    }
    // The primary key must be exactly what the pipeline deduplicates on.
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
    let want: Vec<String> = ledger::ledger_pk(p)
        .iter()
        .map(|c| c.trim_matches('"').to_string())
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
    use super::*;

    fn settings(entries: &[(&str, &[(&str, &str)])]) -> Settings {
        entries
            .iter()
            .map(|(name, kv)| {
                (
                    name.to_string(),
                    kv.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn settings_changes_name_what_changed_and_ignore_settings_one_side_lacks() {
        let old = settings(&[
            ("totals", &[("kind", "sum"), ("filter", "amount > 0.0")]),
            ("gone", &[("kind", "counter")]),
        ]);
        let new = settings(&[
            (
                "totals",
                &[
                    ("kind", "sum"),
                    ("filter", "amount > 100.0"),
                    ("later", "x"),
                ],
            ),
            ("added", &[("kind", "outbox")]),
        ]);
        assert_eq!(
            settings_changes(&old, &new),
            [
                "projection `gone` (counter) is no longer in the pipeline",
                "projection `totals`: `filter` was `amount > 0.0`, now `amount > 100.0`",
                "projection `added` (outbox) is new",
            ]
        );
        assert!(settings_changes(&new, &new).is_empty());
    }
}
