//! Creating and checking the tables a pipeline needs, and the ledger's day partitions.

use std::collections::HashSet;

use chrono::{Days, NaiveDate, Utc};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::sql;
use crate::config::Pipeline;
use crate::error::{Error, Result};

/// Advisory lock key serialising DDL from concurrent replaysafe processes (`hashtext('replaysafe-ddl')`).
const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('replaysafe-ddl'))";

/// Creates (or leaves alone, when present and compatible) the schema, ledger, checkpoint and dead-letter tables
/// and the tables of built-in projections, runs each `sql` projection's `setup`, then checks that the ledger has
/// the columns the pipeline expects and that every projection statement compiles against the database.
///
/// # Errors
/// [`Error::Schema`] when an existing table does not match or a projection statement does not compile;
/// [`Error::Postgres`] for connection problems.
pub async fn init(client: &mut Client, p: &Pipeline) -> Result<()> {
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {}",
        p.postgres.schema
    ))
    .await?;
    for stmt in [
        sql::create_ledger(p),
        sql::create_checkpoints(p),
        sql::create_dead_letters(p),
        sql::create_group_starts(p),
    ] {
        tx.batch_execute(&stmt)
            .await
            .map_err(|e| schema_error("creating replaysafe tables", &stmt, e))?;
    }
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
    check_ledger(client, p).await?;
    check_owner(client, p).await?;
    check_statements(client, p).await
}

/// The projections a ledger's claims were made for, as a digest stored in the ledger's table comment. A
/// delivery key claimed for one set of projections is never seen by projections added later or by another
/// pipeline sharing the ledger, so a different set on a ledger that holds rows is refused.
fn projection_digest(p: &Pipeline) -> String {
    let mut parts: Vec<String> = p
        .projections
        .iter()
        .map(|x| format!("{}:{:?}", x.name, x.kind))
        .collect();
    parts.sort();
    let digest = Sha256::digest(parts.join("\n").as_bytes());
    format!("replaysafe projections sha256:{}", hex::encode(digest))
}

async fn check_owner(client: &mut Client, p: &Pipeline) -> Result<()> {
    let want = projection_digest(p);
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
    if has_rows && have.is_some() {
        let names: Vec<&str> = p.projections.iter().map(|x| x.name.as_str()).collect();
        return Err(Error::Schema(format!(
            "ledger {table} already holds delivery keys claimed for a different set of projections than this \
             pipeline's [{}]: records already in the ledger would never reach the new or other projections. Give \
             this pipeline its own [ledger] table (a fresh table starts from the topic's beginning), or rebuild",
            names.join(", ")
        )));
    }
    // The digest is hex: safe as a literal (COMMENT takes no parameters).
    client
        .batch_execute(&format!("COMMENT ON TABLE {table} IS '{want}'"))
        .await?;
    Ok(())
}

fn schema_error(what: &str, stmt: &str, e: tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        Some(db) => Error::Schema(format!("{what}: {} (statement: {stmt})", db.message())),
        None => Error::Postgres(e),
    }
}

/// Checks the ledger's columns and types against the pipeline (a changed key or type would silently break
/// deduplication).
async fn check_ledger(client: &Client, p: &Pipeline) -> Result<()> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            &[&p.ledger.table.to_string()],
        )
        .await?;
    let have: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut expect: Vec<(String, String)> = vec![("generation".into(), "text".into())];
    for i in sql::ledger_field_columns(p) {
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
                     [ledger] table or migrate it",
                    p.ledger.table
                )))
            }
            Some((_, t)) if t != ty => {
                return Err(Error::Schema(format!(
                    "ledger {} column `{name}` is {t}, the pipeline expects {ty}",
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
    let want: Vec<String> = sql::ledger_pk(p)
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
async fn check_statements(client: &mut Client, p: &Pipeline) -> Result<()> {
    client.batch_execute(&sql::create_landed(p)).await?;
    let tx = client.transaction().await?;
    for (what, stmt) in [
        ("the ledger claim".to_string(), sql::claim(p)),
        (
            "the dead-letter insert".to_string(),
            sql::insert_dead_letters(p),
        ),
        (
            "the checkpoint update".to_string(),
            sql::advance_checkpoint(p),
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

/// Name of the ledger partition holding `day`: `<ledger>_pYYYYMMDD`.
pub fn partition_name(p: &Pipeline, day: NaiveDate) -> String {
    format!("{}_p{}", p.ledger.table.name.as_str(), day.format("%Y%m%d"))
}

/// The day partitions of the ledger that exist now.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn existing_partitions(client: &Client, p: &Pipeline) -> Result<HashSet<NaiveDate>> {
    if p.identity.partition_by.is_none() {
        return Ok(HashSet::new());
    }
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass($1)",
            &[&p.ledger.table.to_string()],
        )
        .await?;
    let prefix = format!("{}_p", p.ledger.table.name.as_str());
    Ok(rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            name.strip_prefix(&prefix)
                .and_then(|d| NaiveDate::parse_from_str(d, "%Y%m%d").ok())
        })
        .collect())
}

/// Creates the day partitions in `days` that are not in `known` (and adds them to `known`).
///
/// # Errors
/// [`Error::Postgres`].
pub async fn ensure_partitions(
    client: &mut Client,
    p: &Pipeline,
    known: &mut HashSet<NaiveDate>,
    days: impl IntoIterator<Item = NaiveDate>,
) -> Result<()> {
    let missing: Vec<NaiveDate> = days
        .into_iter()
        .filter(|d| !known.contains(d))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    for day in &missing {
        let next = day.checked_add_days(Days::new(1)).unwrap_or(*day);
        // Dates are rendered by chrono (digits and dashes only), never taken from input text.
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {}.\"{}\" PARTITION OF {} FOR VALUES FROM ('{}') TO ('{}')",
            p.ledger.table.schema,
            partition_name(p, *day),
            p.ledger.table,
            day.format("%Y-%m-%d"),
            next.format("%Y-%m-%d"),
        ))
        .await?;
    }
    tx.commit().await?;
    known.extend(missing);
    Ok(())
}

/// The oldest day the ledger horizon still covers (`today - horizon-days`, UTC), if there is a horizon.
pub fn horizon_start(p: &Pipeline) -> Option<NaiveDate> {
    let days = p.ledger.horizon_days?;
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(u64::from(days)))
}

/// Drops ledger partitions entirely older than the horizon. Returns the days dropped.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn drop_expired_partitions(client: &mut Client, p: &Pipeline) -> Result<Vec<NaiveDate>> {
    let Some(start) = horizon_start(p) else {
        return Ok(Vec::new());
    };
    let mut old: Vec<NaiveDate> = existing_partitions(client, p)
        .await?
        .into_iter()
        .filter(|d| *d < start)
        .collect();
    old.sort();
    if old.is_empty() {
        return Ok(old);
    }
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    for day in &old {
        tx.batch_execute(&format!(
            "DROP TABLE IF EXISTS {}.\"{}\"",
            p.ledger.table.schema,
            partition_name(p, *day)
        ))
        .await?;
    }
    tx.commit().await?;
    Ok(old)
}
