//! `new-columns = "add"`: a member of a Debezium change's `after` that no column of the row projection maps is
//! added to the projection's table before the batch (docs/cdc.md "Schema evolution mid-stream").
//!
//! The step runs before the batch transaction, in a transaction of its own that is idempotent (`ADD COLUMN IF
//! NOT EXISTS`; the catalog is read first, so a column another worker added is only picked up) and bounded by the
//! session's `lock_timeout` (`ALTER TABLE` takes an `ACCESS EXCLUSIVE` lock: it waits for the batches of other
//! workers that hold the table, at most that long; SQLSTATE 55P03 is transient and the batch is retried). Each
//! added column gets the comment [`MARK`], so the shape read from the catalog ([`super::resolve`]) knows it is an
//! added column after a restart too. Then the projection's statements are prepared again for the new column set.

use tokio_postgres::Client;

use super::plan::NewColumns;
use super::statements::{prepare, Prepared};
use super::table::resolve;
use crate::config::Pipeline;
use crate::decode::debezium::{Cell, Op};
use crate::error::Error;
use crate::ident::Ident;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Pending};

/// The comment `new-columns = "add"` puts on each column it adds (PostgreSQL `COMMENT ON COLUMN`).
pub const MARK: &str = "replaysafe: added by new-columns = add";

/// replaysafe's bookkeeping columns: a source column of one of these names is never added nor written (the
/// record is quarantined naming it).
pub const BOOKKEEPING: &[&str] = &[
    "_version",
    "_sha256",
    "_delivery",
    "_updated_at",
    "_position",
    "_deleted_at",
    "_extra",
    "_last",
    "_last_version",
];

/// Why a member of `after` cannot become a column under `new-columns = "add"`: its name is a bookkeeping column
/// or not a valid identifier. `None` when it can.
pub fn refused(name: &str) -> Option<String> {
    if BOOKKEEPING.contains(&name) {
        return Some(format!(
            "source column `{name}` has the name of a replaysafe bookkeeping column: it is not added to the table \
             (new-columns = \"add\") and never overwrites the bookkeeping value; rename it at the source"
        ));
    }
    Ident::new(name)
        .err()
        .map(|m| format!("source column cannot be added (new-columns = \"add\"): {m}"))
}

/// The PostgreSQL type for a new column: from its Connect schema (as [`crate::projection::row::convert::to_pg`]
/// reads its values), or — schemas off — from the JSON value (string → text, number → numeric, boolean →
/// boolean, object/array → jsonb). `None` for a null without a schema: nothing says its type yet (the column is
/// added with the first non-null value; the rows written before get NULL there, as a null would).
pub fn pg_type(cell: &Cell) -> Option<&'static str> {
    if let Some(s) = cell.schema.as_deref() {
        let by_name = match s.get("name").and_then(serde_json::Value::as_str) {
            Some(
                "org.apache.kafka.connect.data.Decimal" | "io.debezium.data.VariableScaleDecimal",
            ) => Some("numeric"),
            Some("io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => Some("date"),
            Some(
                "io.debezium.time.Timestamp"
                | "org.apache.kafka.connect.data.Timestamp"
                | "io.debezium.time.MicroTimestamp"
                | "io.debezium.time.NanoTimestamp",
            ) => Some("timestamp"),
            Some("io.debezium.time.ZonedTimestamp") => Some("timestamptz"),
            Some(
                "io.debezium.time.Time"
                | "org.apache.kafka.connect.data.Time"
                | "io.debezium.time.MicroTime"
                | "io.debezium.time.NanoTime",
            ) => Some("time"),
            Some("io.debezium.time.MicroDuration" | "io.debezium.time.Interval") => {
                Some("interval")
            }
            Some("io.debezium.data.Json") => Some("jsonb"),
            Some("io.debezium.data.Uuid") => Some("uuid"),
            _ => None,
        };
        if by_name.is_some() {
            return by_name;
        }
        return Some(match s.get("type").and_then(serde_json::Value::as_str) {
            Some("int8" | "int16") => "smallint",
            Some("int32") => "integer",
            Some("int64") => "bigint",
            Some("float32") => "real",
            Some("float64") => "double precision",
            Some("boolean") => "boolean",
            Some("bytes") => "bytea",
            Some("string") => "text",
            _ => "jsonb",
        });
    }
    use serde_json::Value::*;
    match &cell.value {
        Null => None,
        String(_) => Some("text"),
        Number(_) => Some("numeric"),
        Bool(_) => Some("boolean"),
        Array(_) | Object(_) => Some("jsonb"),
    }
}

/// The members of the batch's upserts for projection `rp` that it does not have as columns: name and type
/// (`None`: a schemaless null, nothing to add yet). Bookkeeping names and invalid identifiers are left out
/// (their records are quarantined by [`super::change::from_change`]).
fn unmapped(p: &Pipeline, rp: &Prepared, batch: &Batch) -> Vec<(String, Option<&'static str>)> {
    let plan = p.projections[rp.shape.index]
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let mut out: Vec<(String, Option<&'static str>)> = Vec::new();
    for it in &batch.items {
        let Pending::Claim {
            change: Some(ch), ..
        } = &it.pending
        else {
            continue;
        };
        if matches!(ch.op, Op::Delete | Op::Truncate) || !super::matches(plan, &plan.table, ch) {
            continue;
        }
        for (name, cell) in ch.after.iter().flatten() {
            if rp.shape.columns.iter().any(|c| c.name.as_str() == name)
                || rp.shape.generated.iter().any(|g| g == name)
                || refused(name).is_some()
            {
                continue;
            }
            let ty = pg_type(cell);
            match out.iter_mut().find(|(n, _)| n == name) {
                Some(e) => e.1 = e.1.or(ty),
                None => out.push((name.clone(), ty)),
            }
        }
    }
    out
}

/// Before a batch: for each row projection under `new-columns = "add"`, the unmapped members of the batch's
/// changes are added to its table (those not in the catalog yet; see the module doc) and its statements are
/// prepared again for the table's columns. Logs each column added.
///
/// # Errors
/// [`ApplyError::Transient`] for a lock not granted within `lock_timeout` (the batch is retried);
/// [`ApplyError::Fatal`] when the DDL or a statement is refused.
pub async fn add_columns(
    client: &Client,
    p: &Pipeline,
    rows: &mut [Prepared],
    batch: &Batch,
) -> std::result::Result<(), ApplyError> {
    for rp in rows.iter_mut() {
        let proj = &p.projections[rp.shape.index];
        let plan = proj
            .row
            .as_ref()
            .expect("a row projection's plan holds its RowPlan");
        if plan.new_columns != NewColumns::Add {
            continue;
        }
        let new = unmapped(p, rp, batch);
        if new.is_empty() {
            continue;
        }
        let fatal = |e: Error| ApplyError::Fatal(e);
        let mut shape = resolve(client, p, rp.shape.index).await.map_err(fatal)?;
        let missing: Vec<(String, &str)> = new
            .iter()
            .filter(|(n, _)| !shape.columns.iter().any(|c| c.name.as_str() == n))
            .filter_map(|(n, ty)| Some((n.clone(), (*ty)?)))
            .collect();
        if !missing.is_empty() {
            ddl(client, &plan.table, &missing).await?;
            tracing::info!(
                projection = %proj.name,
                table = %plan.table,
                topic = %batch.topic,
                partition = batch.partition,
                columns = %missing.iter().map(|(n, t)| format!("{n} {t}")).collect::<Vec<_>>().join(", "),
                "new-columns = \"add\": source columns added to the projection's table"
            );
            shape = resolve(client, p, rp.shape.index).await.map_err(fatal)?;
        }
        if shape.columns.len() != rp.shape.columns.len() {
            *rp = prepare(client, p, shape).await.map_err(fatal)?;
        }
    }
    Ok(())
}

/// `ALTER TABLE … ADD COLUMN IF NOT EXISTS` and the [`MARK`] comment for each column, in one transaction.
async fn ddl(
    client: &Client,
    table: &crate::ident::QualifiedName,
    cols: &[(String, &str)],
) -> std::result::Result<(), ApplyError> {
    let mut sql = String::from("BEGIN;");
    for (name, ty) in cols {
        let id = Ident::new(name).expect("checked by `refused`");
        sql.push_str(&format!(
            " ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {id} {ty}; COMMENT ON COLUMN {table}.{id} IS '{MARK}';"
        ));
    }
    sql.push_str(" COMMIT;");
    if let Err(e) = client.batch_execute(&sql).await {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(classify(e, false));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(value: serde_json::Value, schema: Option<serde_json::Value>) -> Cell {
        Cell {
            value,
            schema: schema.map(std::sync::Arc::new),
        }
    }

    /// Connect schema → PostgreSQL type (logical names first), and the schemaless choice from the JSON value.
    #[test]
    fn types_of_new_columns() {
        use serde_json::json;
        let dec = json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"});
        assert_eq!(pg_type(&cell(json!("AA=="), Some(dec))), Some("numeric"));
        let ts = json!({"type": "int64", "name": "io.debezium.time.MicroTimestamp"});
        assert_eq!(pg_type(&cell(json!(1), Some(ts))), Some("timestamp"));
        let i = json!({"type": "int32", "optional": true});
        assert_eq!(pg_type(&cell(json!(null), Some(i))), Some("integer"));
        assert_eq!(pg_type(&cell(json!("gold"), None)), Some("text"));
        assert_eq!(pg_type(&cell(json!(1.5), None)), Some("numeric"));
        assert_eq!(pg_type(&cell(json!({"a": 1}), None)), Some("jsonb"));
        assert_eq!(pg_type(&cell(json!(null), None)), None);
        assert!(refused("_version").is_some() && refused("_extra").is_some());
        assert!(refused("Tier").is_some() && refused("tier").is_none());
    }
}
