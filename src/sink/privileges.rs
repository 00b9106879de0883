//! What a role needs to run a pipeline, checked without writing (`replaysafe check --database`), and the
//! message given when a role may not do the DDL it was asked to do (docs/operations.md "Privileges").
//!
//! The runtime needs, for the role in the connection string: `USAGE` on each schema the pipeline's tables live
//! in; `SELECT, INSERT, UPDATE, DELETE` on every table it reads or writes (replaysafe's own tables and the
//! projection tables; `UPDATE` also for the row locks `SELECT … FOR UPDATE / FOR SHARE` takes); `USAGE` on the
//! sequences of their `bigserial` columns (an identity column's sequence needs none: PostgreSQL does not check
//! it, manual "CREATE TABLE … GENERATED … AS IDENTITY"); `TEMPORARY` on the database (each session keeps the rows a batch
//! claimed in a temporary table; granted to PUBLIC by default). Creating tables, day partitions and dropping
//! expired partitions needs the tables' owner (PostgreSQL manual, "Privileges" and "ALTER TABLE": only the owner
//! may alter or drop a table or attach a partition to it).

use chrono::{Days, NaiveDate};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient};

use super::{checkpoint, dead_letters, ledger};
use crate::config::Pipeline;
use crate::error::{Error, Result};

/// Whether the table `name` (SQL text, e.g. `"s"."t"`) exists.
///
/// # Errors
/// [`Error::Postgres`].
pub(crate) async fn table_exists(c: &impl GenericClient, name: &str) -> Result<bool> {
    Ok(c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await?
        .get(0))
}

/// Every table the pipeline reads or writes, as SQL text: replaysafe's own (ledger, sources, checkpoints, dead letters,
/// group starts, horizon), then each projection's table (and a row projection's tombstone, conflict and truncate
/// tables). A `sql` projection's tables are its own business and not listed.
pub fn pipeline_tables(p: &Pipeline) -> Vec<String> {
    let mut out = vec![
        p.ledger.table.to_string(),
        p.table(ledger::SOURCES).to_string(),
        p.table(checkpoint::CHECKPOINTS).to_string(),
        p.table(dead_letters::DEAD_LETTERS).to_string(),
        p.table(checkpoint::GROUP_STARTS).to_string(),
        p.table(ledger::HORIZON).to_string(),
        p.table(super::lifecycle::PRUNED).to_string(),
        p.table(super::projset::PROJECTION_SET).to_string(),
        p.table(super::projset::HANDOVER).to_string(),
    ];
    for proj in &p.projections {
        out.extend(proj.tables(p));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|t| seen.insert(t.clone()));
    out
}

/// The tables of [`pipeline_tables`] that do not exist.
///
/// # Errors
/// [`Error::Postgres`].
pub(crate) async fn missing_tables(c: &impl GenericClient, p: &Pipeline) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for t in pipeline_tables(p) {
        if !table_exists(c, &t).await? {
            out.push(t);
        }
    }
    Ok(out)
}

/// What to do when a role may not do the DDL: said after every refusal.
pub const SPLIT_DDL: &str = "run `replaysafe init --config FILE` once as the owner of the schema and tables (it \
    creates them and the ledger's day partitions ahead, `--days N`), then start this role with `[postgres] manage-schema = \
    false` (every command) or `run --no-ddl`, which issue no DDL; docs/operations.md \"Privileges\" lists the grants";

/// Turns a refusal for lack of privilege (SQLSTATE 42501: "permission denied for …", "must be owner of …") met
/// while creating or altering the pipeline's objects into [`Error::Privilege`] saying how to split DDL from the
/// runtime role; other errors are returned unchanged.
pub fn explain(e: Error, p: &Pipeline) -> Error {
    let text = match &e {
        Error::Postgres(pg) if pg.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            super::describe(pg)
        }
        Error::Schema(m) if m.contains("permission denied") || m.contains("must be owner") => {
            m.clone()
        }
        _ => return e,
    };
    Error::Privilege(format!(
        "{text}: the role of the connection may not create or alter the objects of schema {} (manage-schema = \
         true asks it to); {SPLIT_DDL}",
        p.postgres.schema
    ))
}

/// One line of `check --database`: what was checked and whether it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Whether it holds.
    pub ok: bool,
    /// What, e.g. `INSERT on "s"."replaysafe_checkpoints"`, or what is missing and the GRANT that gives it.
    pub what: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.ok { "ok     " } else { "MISSING" };
        write!(f, "{mark} {}", self.what)
    }
}

/// Checks, inside a `READ ONLY` transaction (nothing can be written), what the connection's role needs to run
/// the pipeline: `TEMPORARY` on the database, `USAGE` on the schemas, `SELECT, INSERT, UPDATE, DELETE` on every
/// table of [`pipeline_tables`], `USAGE` on their sequences, the ledger's day partitions from the oldest
/// claimable day through today + `days`, the ledger's delivery-key constraint on each of its tables, and the
/// ledger's projection record. With `manage-schema = true` it
/// also says (as a note, never a failure) whether the role can do the DDL itself.
///
/// # Errors
/// [`Error::Postgres`] when the queries fail.
pub async fn check_database(client: &mut Client, p: &Pipeline, days: u32) -> Result<Vec<Finding>> {
    let tx = client.build_transaction().read_only(true).start().await?;
    let role: String = tx.query_one("SELECT current_user::text", &[]).await?.get(0);
    let mut out = vec![Finding {
        ok: true,
        what: format!("connected as role `{role}`"),
    }];
    let temp: bool = tx
        .query_one(
            "SELECT has_database_privilege(current_database(), 'TEMPORARY')",
            &[],
        )
        .await?
        .get(0);
    out.push(grant(
        temp,
        "TEMPORARY on the database (each session's `landed` temporary table)",
        &format!("GRANT TEMPORARY ON DATABASE <db> TO {role}"),
    ));
    let usable = schemas(&tx, p, &role, &mut out).await?;
    for t in pipeline_tables(p) {
        table(&tx, &t, &role, &mut out).await?;
    }
    // Names in a schema without USAGE cannot even be looked up (to_regclass refuses): checked once it is granted.
    let horizon = p.table(ledger::HORIZON).to_string();
    if usable && readable(&tx, &horizon).await? {
        partitions(&tx, p, days, &mut out).await?;
        out.extend(key_constraints(&tx, p).await?);
        let set = p.table(super::projset::PROJECTION_SET).to_string();
        if readable(&tx, &set).await? {
            out.push(record(&tx, p).await?);
        } else {
            out.push(Finding {
                ok: false,
                what: format!(
                    "ledger {}'s projection record not checked: it needs SELECT on {set} (listed above)",
                    p.ledger.table
                ),
            });
        }
    } else {
        let why = if table_oid(&tx, &horizon).await?.is_none() {
            "the tables do not exist yet (`replaysafe init` creates them)"
        } else {
            "they need USAGE on the schema and SELECT on the horizon table first"
        };
        out.push(Finding {
            ok: false,
            what: format!("ledger day partitions and projection record not checked: {why}"),
        });
    }
    if p.postgres.manage_schema {
        out.extend(ddl_note(&tx, p, &role).await?);
    }
    tx.rollback().await?;
    Ok(out)
}

fn grant(ok: bool, what: &str, fix: &str) -> Finding {
    Finding {
        ok,
        what: if ok {
            what.to_string()
        } else {
            format!("{what}: {fix}")
        },
    }
}

/// The OID of the table named `name` (SQL text, quoted or not), looked up in the catalog — without the `USAGE`
/// on its schema that `to_regclass` needs.
async fn table_oid(c: &impl GenericClient, name: &str) -> Result<Option<u32>> {
    Ok(c.query_opt(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = (parse_ident($1))[1] AND c.relname = (parse_ident($1))[2]",
        &[&name],
    )
    .await?
    .map(|r| r.get(0)))
}

/// Whether the table exists and the role may `SELECT` from it.
async fn readable(c: &impl GenericClient, name: &str) -> Result<bool> {
    Ok(match table_oid(c, name).await? {
        Some(oid) => c
            .query_one("SELECT has_table_privilege($1::oid, 'SELECT')", &[&oid])
            .await?
            .get(0),
        None => false,
    })
}

/// `USAGE` on every schema a table of [`pipeline_tables`] lives in (and the pipeline's); returns whether every one exists and is usable.
async fn schemas(
    tx: &tokio_postgres::Transaction<'_>,
    p: &Pipeline,
    role: &str,
    out: &mut Vec<Finding>,
) -> Result<bool> {
    let mut all = true;
    let mut names: Vec<String> = vec![p.postgres.schema.as_str().to_string()];
    for t in pipeline_tables(p) {
        let row = tx.query_one("SELECT (parse_ident($1))[1]", &[&t]).await?;
        names.push(row.get(0));
    }
    names.sort();
    names.dedup();
    for s in names {
        let row = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1), \
                 EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1 AND has_schema_privilege(oid, 'USAGE'))",
                &[&s],
            )
            .await?;
        let (exists, usage): (bool, bool) = (row.get(0), row.get(1));
        all &= usage;
        out.push(if exists {
            grant(
                usage,
                &format!("USAGE on schema {s}"),
                &format!("GRANT USAGE ON SCHEMA {s} TO {role}"),
            )
        } else {
            Finding {
                ok: false,
                what: format!(
                    "schema {s} does not exist: `replaysafe init` (as its owner) creates it"
                ),
            }
        });
    }
    Ok(all)
}

/// `SELECT, INSERT, UPDATE, DELETE` on `t`, and `USAGE` on the sequences of its `serial` columns (`deptype =
/// 'a'`; an identity column's sequence, `deptype = 'i'`, is used without a privilege check).
async fn table(
    tx: &tokio_postgres::Transaction<'_>,
    t: &str,
    role: &str,
    out: &mut Vec<Finding>,
) -> Result<()> {
    let Some(oid) = table_oid(tx, t).await? else {
        out.push(Finding {
            ok: false,
            what: format!(
                "table {t} does not exist: `replaysafe init` (as the schema's owner) creates it"
            ),
        });
        return Ok(());
    };
    let mut missing = Vec::new();
    for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
        let ok: bool = tx
            .query_one(
                "SELECT has_table_privilege($1::oid, $2)",
                &[&oid, &privilege],
            )
            .await?
            .get(0);
        if !ok {
            missing.push(privilege);
        }
    }
    out.push(if missing.is_empty() {
        grant(true, &format!("SELECT, INSERT, UPDATE, DELETE on {t}"), "")
    } else {
        grant(
            false,
            &format!("{} on {t}", missing.join(", ")),
            &format!("GRANT {} ON {t} TO {role}", missing.join(", ")),
        )
    });
    let seqs = tx
        .query(
            "SELECT s.oid::regclass::text, has_sequence_privilege(s.oid, 'USAGE') FROM pg_depend d \
             JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' \
             WHERE d.refobjid = $1 AND d.classid = 'pg_class'::regclass AND d.deptype = 'a'",
            &[&oid],
        )
        .await?;
    for r in seqs {
        let (seq, ok): (String, bool) = (r.get(0), r.get(1));
        out.push(grant(
            ok,
            &format!("USAGE on sequence {seq}"),
            &format!("GRANT USAGE ON SEQUENCE {seq} TO {role}"),
        ));
    }
    Ok(())
}

/// The ledger's delivery keys are kept on every one of its tables ([`ledger::require_key_constraints`], what
/// `run` checks at start): `None` for a ledger that does not exist yet or keeps them by its primary key.
async fn key_constraints(c: &impl GenericClient, p: &Pipeline) -> Result<Option<Finding>> {
    let table = p.ledger.table.to_string();
    if !table_exists(c, &table).await? || !ledger::key_is_hashed(c, p).await? {
        return Ok(None);
    }
    let what = format!("ledger {table}: delivery-key constraint on every table");
    Ok(Some(match ledger::require_key_constraints(c, p).await {
        Ok(()) => Finding { ok: true, what },
        Err(Error::Schema(why)) => Finding {
            ok: false,
            what: why,
        },
        Err(e) => return Err(e),
    }))
}

/// The ledger's day partitions from the oldest claimable day (the later of today − `horizon-days` and the
/// durable pruned-below day; today without a horizon) through today + `days`, by the database's UTC date.
async fn partitions(
    tx: &tokio_postgres::Transaction<'_>,
    p: &Pipeline,
    days: u32,
    out: &mut Vec<Finding>,
) -> Result<()> {
    if p.identity.partition_by.is_none()
        || !table_exists(tx, &p.ledger.table.to_string()).await?
        || !table_exists(tx, &p.table(ledger::HORIZON).to_string()).await?
    {
        return Ok(());
    }
    let (from, to) = coverage(tx, p, days).await?;
    let have = ledger::existing_partitions(tx, p).await?;
    let mut missing = Vec::new();
    let mut d = from;
    while d <= to {
        if !have.contains(&d) {
            missing.push(ledger::partition_name(p, d));
        }
        d = d.checked_add_days(Days::new(1)).unwrap_or(NaiveDate::MAX);
    }
    out.push(if missing.is_empty() {
        grant(
            true,
            &format!("ledger day partitions {from} through {to}"),
            "",
        )
    } else {
        grant(
            false,
            &format!(
                "ledger day partitions {from} through {to}: {} missing ({})",
                missing.len(),
                missing.join(", ")
            ),
            &format!("create them as the ledger's owner with `replaysafe init --config FILE --days {days}`"),
        )
    });
    Ok(())
}

/// The days the ledger must have partitions for: from the oldest claimable day (or today) through today +
/// `days` — read without locking (the horizon row is not locked: this may run in a read-only transaction).
///
/// # Errors
/// [`Error::Postgres`].
pub async fn coverage(
    c: &impl GenericClient,
    p: &Pipeline,
    days: u32,
) -> Result<(NaiveDate, NaiveDate)> {
    let horizon = p.ledger.horizon_days.map(crate::units::int_days);
    let row = c
        .query_one(
            &format!(
                "SELECT greatest((SELECT pruned_below FROM {} WHERE ledger = $1), \
                 (now() AT TIME ZONE 'UTC')::date - coalesce($2::int, 0)), (now() AT TIME ZONE 'UTC')::date + $3::int",
                p.table(ledger::HORIZON)
            ),
            &[&p.ledger.table.to_string(), &horizon, &crate::units::int_days(days)],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Whether the ledger's projection record (`replaysafe_projection_set`) is this pipeline's projections (`init`
/// writes it; a `--no-ddl` start requires it).
async fn record(tx: &tokio_postgres::Transaction<'_>, p: &Pipeline) -> Result<Finding> {
    let ok = super::projset::matches(tx, p).await?;
    Ok(grant(
        ok,
        &format!("ledger {} records this pipeline's projections", p.ledger.table),
        "run `replaysafe init --config FILE` as the ledger's owner (it records them, or refuses a ledger claimed \
         for other projections)",
    ))
}

/// With `manage-schema = true`: whether the role may create in the schema and owns the ledger (creating day
/// partitions and pruning need that); a note only.
async fn ddl_note(
    tx: &tokio_postgres::Transaction<'_>,
    p: &Pipeline,
    role: &str,
) -> Result<Option<Finding>> {
    let ledger = table_oid(tx, &p.ledger.table.to_string()).await?;
    let row = tx
        .query_one(
            "SELECT coalesce((SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = $1), \
             has_database_privilege(current_database(), 'CREATE')), \
             coalesce((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $2::oid), true)",
            &[&p.postgres.schema.as_str(), &ledger],
        )
        .await?;
    let (create, owner): (bool, bool) = (row.get(0), row.get(1));
    if create && owner {
        return Ok(None);
    }
    Ok(Some(Finding {
        ok: true,
        what: format!(
            "note: role `{role}` may not {} — fine for `run --no-ddl` / `manage-schema = false`; with \
             manage-schema = true (this file) `run` creates day partitions and prunes, which it could not do",
            if create {
                "own the ledger (partitions, prune)"
            } else {
                "create objects in the schema"
            }
        ),
    }))
}
