//! The read-only start of `manage-schema = false` / `run --no-ddl` ([`verify`]): the tables, columns, ledger
//! record and statements checked without DDL; [`prepare`] picks it or [`super::schema::init`].

use tokio_postgres::Client;

use super::schema::{check_column_types, check_ledger, check_statements, init};
use super::{dead_letters, ledger, projset};
use crate::config::Pipeline;
use crate::error::{Error, Result};

/// Makes the database ready for the pipeline: [`init`] when `manage-schema` is true, [`verify`] (no DDL) when it
/// is false (`run --no-ddl`).
///
/// # Errors
/// As [`init`] or [`verify`].
pub async fn prepare(client: &mut Client, p: &Pipeline) -> Result<()> {
    if p.postgres.manage_schema {
        init(client, p).await
    } else {
        verify(client, p)
            .await
            .map_err(crate::model::apply_error::explain_missing)
    }
}

/// The read-only counterpart of [`init`] for `manage-schema = false` / `run --no-ddl`: checks that the tables
/// exist (and the dead-letter table has its newer columns, the ledger its horizon row), then the same column,
/// ledger and statement checks as `init`, and that the projection record holds this pipeline's projections —
/// without creating, altering or commenting anything (only session-local temporary tables).
///
/// # Errors
/// [`Error::Schema`] naming what is missing or differs, with the fix: `replaysafe init` run by the owner.
pub async fn verify(client: &mut Client, p: &Pipeline) -> Result<()> {
    let by_init = "manage-schema = false (or `run --no-ddl`) creates and alters nothing: run `replaysafe init \
                   --config FILE` as the owner of the schema first";
    let missing = super::privileges::missing_tables(client, p).await?;
    if !missing.is_empty() {
        return Err(Error::Schema(format!(
            "{} {} missing; {by_init}",
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" }
        )));
    }
    let row = client
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
                 AND attname = 'resolved_by' AND NOT attisdropped) \
                 AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
                 AND attname = 'log' AND NOT attisdropped) \
                 AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($3) \
                 AND attname = 'log' AND NOT attisdropped), \
                 EXISTS (SELECT 1 FROM {} WHERE ledger = $2)",
                p.table(ledger::HORIZON)
            ),
            &[
                &p.table(dead_letters::DEAD_LETTERS).to_string(),
                &p.ledger.table.to_string(),
                &p.table(super::checkpoint::CHECKPOINTS).to_string(),
            ],
        )
        .await?;
    let (resolvable, horizon_row): (bool, bool) = (row.get(0), row.get(1));
    if !resolvable || !horizon_row {
        return Err(Error::Schema(format!(
            "{} needs an upgrade by this version's `init`; {by_init}",
            if resolvable {
                format!("the horizon row of ledger {}", p.ledger.table)
            } else {
                format!(
                    "{} (resolved_at, resolved_by, log) or {} (topic_id, cluster_id, log)",
                    p.table(dead_letters::DEAD_LETTERS),
                    p.table(super::checkpoint::CHECKPOINTS)
                )
            }
        )));
    }
    check_column_types(client, p).await?;
    check_ledger(client, p).await?;
    if !projset::matches(&*client, p).await? {
        return Err(Error::Schema(format!(
            "ledger {}: {} does not record this pipeline's projections as they are (init records them — an added \
             projection with its hand-over point — and refuses a changed one); {by_init}",
            p.ledger.table,
            p.table(projset::PROJECTION_SET)
        )));
    }
    check_statements(client, p).await
}
