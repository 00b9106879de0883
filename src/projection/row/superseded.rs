//! What a replayed dead letter's record carries that a row projection's stored, newer row lacks: the
//! `superseded` settlement of `dead-letters replay` (case C50, `sink::dead_letters::settle_replayed`) — the
//! record was judged stale, yet its columns are not in the table, so its data is still missing.

use tokio_postgres::Transaction;

use super::plan::{TombstoneMode, VersionPlan};
use super::types::ColumnSpec;
use crate::config::Pipeline;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::Batch;
use crate::projection::ProjectionPlan;

/// For the stale records `stale` (offsets) of a replay batch: the columns of a JSON-mode row projection that
/// the record carries (not NULL in `pg_temp.landed`) and its entity's stored row holds as NULL — the record
/// reached that projection (its filter passed), the row is live (not a `_deleted_at` tombstone), and key and
/// version columns aside. Keyed by offset; columns in projection, then column order; projections whose columns
/// come from the catalog (Debezium) are not looked at.
///
/// # Errors
/// As [`classify`].
pub async fn columns(
    tx: &Transaction<'_>,
    p: &Pipeline,
    batch: &Batch,
    stale: &[i64],
) -> Result<std::collections::BTreeMap<i64, Vec<String>>, ApplyError> {
    let mut out: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
    if stale.is_empty() {
        return Ok(out);
    }
    for proj in &p.projections {
        let Some(sql) = sql(p, proj) else {
            continue;
        };
        let rows = tx
            .query(&sql, &[&batch.topic, &batch.partition, &stale])
            .await
            .map_err(|e| classify(e, false))?;
        for r in rows {
            let cols: Vec<Option<String>> = r.get(1);
            out.entry(r.get(0))
                .or_default()
                .extend(cols.into_iter().flatten());
        }
    }
    out.retain(|_, c| !c.is_empty());
    Ok(out)
}

/// The query of [`columns`] for one projection (`$1` topic, `$2` partition, `$3` offsets): one row
/// per stale record that found its entity, with the names of the columns missing there (NULLs for the others);
/// `None` for a projection that is not a JSON-mode row projection.
fn sql(p: &Pipeline, proj: &ProjectionPlan) -> Option<String> {
    let row = proj.row.as_ref()?;
    let VersionPlan::Field(version) = row.version else {
        return None;
    };
    let columns = row.columns.as_ref()?;
    let field = |c: &ColumnSpec| c.field.map(|i| &p.fields[i].name);
    let mut join = Vec::new();
    for k in &row.key {
        let c = columns.iter().find(|c| &c.name == k)?;
        join.push(format!(
            "t.{k}::pg_catalog.text = l.{}::pg_catalog.text",
            field(c)?
        ));
    }
    let checks: Vec<String> = columns
        .iter()
        .filter(|c| !row.key.contains(&c.name) && c.field != Some(version))
        .filter_map(|c| {
            let f = field(c)?;
            let name = c.name.as_str();
            Some(format!(
                "CASE WHEN l.{f} IS NOT NULL AND t.{} IS NULL THEN '{name}' END",
                c.name
            ))
        })
        .collect();
    if checks.is_empty() || join.is_empty() {
        return None;
    }
    if let Some(i) = proj.pass_column {
        join.push(format!("l.\"_pass_{i}\""));
    }
    if row.tombstones == TombstoneMode::Column {
        join.push("t._deleted_at IS NULL".into());
    }
    Some(format!(
        "SELECT l._offset, ARRAY[{}]::pg_catalog.text[] FROM pg_temp.landed l JOIN {} t ON {} \
         WHERE l._topic = $1 AND l._partition = $2 AND l._offset = ANY($3::bigint[]) ORDER BY l._offset",
        checks.join(", "),
        row.table,
        join.join(" AND ")
    ))
}
