//! The statement projections (counter, sum, sql, outbox) in the batch transaction: each runs its one prepared
//! statement over `landed`.

use tokio_postgres::{Statement, Transaction};

use crate::config::Pipeline;
use crate::error::Error;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::Batch;

/// Step 3b of the batch transaction: the statement projections (counters, sums, `sql`, outbox), only when
/// something landed.
///
/// # Errors
/// As [`classify`]; a projection's own failure names the projection.
pub async fn apply_statements(
    tx: &Transaction<'_>,
    stmts: &[Option<Statement>],
    p: &Pipeline,
    batch: &Batch,
) -> std::result::Result<(), ApplyError> {
    for (stmt, proj) in stmts.iter().zip(&p.projections) {
        let Some(stmt) = stmt else { continue };
        tx.execute(stmt, &[])
            .await
            .map_err(|e| match classify(e, false) {
                ApplyError::Fatal(Error::Postgres(e)) => ApplyError::Fatal(Error::Other(format!(
                    "projection `{}` failed on {}/{}: {}",
                    proj.name,
                    batch.topic,
                    batch.partition,
                    e.as_db_error()
                        .map(|d| d.message().to_string())
                        .unwrap_or_else(|| e.to_string())
                ))),
                other => other,
            })?;
    }
    Ok(())
}
