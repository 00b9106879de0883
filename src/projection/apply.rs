//! Every projection of a pipeline in the batch transaction, through one prepared set ([`Prepared`]): the sink
//! prepares it per connection ([`Prepared::new`]), keeps one projection for a build ([`Prepared::keep_only`]),
//! evolves it before a batch ([`Prepared::evolve`]) and applies it over the rows claimed ([`Prepared::apply`]) —
//! row projections first (they judge their own tables and take same-state redeliveries out of `landed`), then
//! the statement projections (counter, sum, sql, outbox), each its one prepared statement over `landed`. What a
//! kind needs at run time stays inside `projection/`.

use std::collections::{HashMap, HashSet};

use tokio_postgres::{Client, Statement, Transaction};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Outcome};
use crate::projection::row;

/// The tables each projection kind keeps besides what its `setup` statements create, in the schema transaction
/// (`init`, start-up): a row projection's table or bookkeeping columns, its tombstones and the conflicts table
/// ([`row::setup`]); the other kinds keep none. Idempotent.
///
/// # Errors
/// As [`row::setup`].
pub async fn setup(c: &impl tokio_postgres::GenericClient, p: &Pipeline) -> Result<()> {
    for (i, proj) in p.projections.iter().enumerate() {
        if proj.row.is_some() {
            row::setup(c, p, i).await?;
        }
    }
    Ok(())
}

/// One connection's prepared projections: the statement of each statement projection (`None` at a row
/// projection's index, or for one a build leaves out) and the prepared state of each row projection.
pub struct Prepared {
    statements: Vec<Option<Statement>>,
    rows: Vec<row::Prepared>,
}

impl Prepared {
    /// Prepares every projection of `p` on `client`: a statement projection's statement, a row projection's
    /// table shape (read from the catalog) and statements.
    ///
    /// # Errors
    /// [`Error::Schema`] when a statement does not compile or a row projection's table does not fit.
    pub async fn new(client: &Client, p: &Pipeline) -> Result<Prepared> {
        let mut statements = Vec::with_capacity(p.projections.len());
        let mut rows = Vec::new();
        for (i, proj) in p.projections.iter().enumerate() {
            if proj.row.is_some() {
                let shape = row::resolve(client, p, i).await?;
                rows.push(row::prepare(client, p, shape).await?);
                statements.push(None);
            } else {
                let stmt = client
                    .prepare(&proj.statement)
                    .await
                    .map_err(|e| Error::Schema(format!("{e}: {}", proj.statement)))?;
                statements.push(Some(stmt));
            }
        }
        Ok(Prepared { statements, rows })
    }

    /// Keeps projection number `index` only (`replaysafe projection build`).
    pub fn keep_only(&mut self, index: usize) {
        for (i, s) in self.statements.iter_mut().enumerate() {
            if i != index {
                *s = None;
            }
        }
        self.rows.retain(|r| r.shape.index == index);
    }

    /// Before a batch's transaction: a row projection with `new-columns = "add"` adds the columns the batch's
    /// changes bring ([`row::evolve::add_columns`]).
    ///
    /// # Errors
    /// As [`row::evolve::add_columns`].
    pub async fn evolve(
        &mut self,
        client: &Client,
        p: &Pipeline,
        batch: &Batch,
    ) -> std::result::Result<(), ApplyError> {
        row::evolve::add_columns(client, p, &mut self.rows, batch).await
    }

    /// Step 3 of the batch transaction over `landed` (the ledger ids claimed): the row projections
    /// ([`row::apply_rows`]: may take same-state redeliveries out of `landed`; returns the outcomes they decide,
    /// by ledger id), then, when something is left, the statement projections ([`apply_statements`]).
    ///
    /// # Errors
    /// As [`row::apply_rows`] and [`apply_statements`].
    pub async fn apply(
        &self,
        tx: &Transaction<'_>,
        p: &Pipeline,
        group: &str,
        batch: &Batch,
        landed: &mut HashSet<i64>,
    ) -> std::result::Result<HashMap<i64, Outcome>, ApplyError> {
        let overrides = row::apply_rows(tx, &self.rows, p, group, batch, landed).await?;
        if !landed.is_empty() {
            apply_statements(tx, &self.statements, p, batch).await?;
        }
        Ok(overrides)
    }
}

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
