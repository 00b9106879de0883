//! The claim statement (`INSERT … ON CONFLICT DO NOTHING RETURNING`) and step 2 of the batch transaction.

use std::collections::HashSet;

use chrono::NaiveDate;
use tokio_postgres::{Statement, Transaction};

use crate::config::{FieldType, Pipeline};
use crate::error::{Error, Result};
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Item, Pending};

use super::{ensure_source, ledger_field_columns, ledger_pk, SOURCES};

/// The claim statement. Parameters: `$1` generation (text, '' for none), `$2` topic, `$3` partition (int4),
/// `$4` consumer group (the batch's source, which [`ensure_source`] inserted first; a missing one fails the
/// claim on `_source_id`'s NOT NULL rather than claim without provenance), `$5` offsets (int8[]), `$6` record timestamps in ms (int8[], null elements allowed),
/// then one array per field (typed as [`param_type`]: `uuid[]`, `date[]`, `bigint[]` sent in binary, others
/// `text[]` cast in SQL), then one `bool[]` per projection pass column. Returns the offsets of the rows it
/// newly claimed (and copied into `landed`); copies of one key inside the batch count once (the lowest offset).
///
/// Lock order (case C36): the claims are inserted in ascending ledger-key order (`ORDER BY` the delivery key's
/// fields, [`ledger_pk`] without the generation, which is one value per batch). An insert that meets another
/// transaction's uncommitted claim of the same key waits for that transaction, so two batches with overlapping
/// delivery keys (a redelivery on another partition, a second consumer group) in opposite orders would deadlock
/// (40P01); in one order the later one just waits. The executor inserts the rows of `INSERT … SELECT` in the order the SELECT yields them
/// (PostgreSQL manual, "Explicit Locking" → "Deadlocks": lock in a consistent order; latitude-dev/latitude-llm#3463
/// sorted its `ON CONFLICT DO NOTHING` batch by the conflict key for the same reason). The order is taken in SQL,
/// after the casts: the `unnest` arrays arrive in offset order as raw text, and only the typed values (a uuid
/// in any spelling, a date) are ordered alike by every session.
pub fn claim(p: &Pipeline) -> String {
    let n = p.fields.len();
    let passes = p.pass_columns();
    let mut params = vec!["$5::bigint[]".to_string(), "$6::bigint[]".to_string()];
    let mut names = vec!["_offset".to_string(), "_ts".to_string()];
    for (i, f) in p.fields.iter().enumerate() {
        params.push(format!("${}::{}[]", 7 + i, param_type(f.ty)));
        names.push(format!("f{i}"));
    }
    for j in 0..passes {
        params.push(format!("${}::boolean[]", 7 + n + j));
        names.push(format!("p{j}"));
    }
    let mut select = vec![
        "u._offset".to_string(),
        "CASE WHEN u._ts IS NULL THEN NULL ELSE to_timestamp(u._ts / 1000.0) END AS _timestamp"
            .to_string(),
    ];
    for (i, f) in p.fields.iter().enumerate() {
        select.push(format!("u.f{i}::{} AS {}", f.ty.sql(), f.name));
    }
    for j in 0..passes {
        select.push(format!("u.p{j} AS \"_pass_{j}\""));
    }
    let pk_fields: Vec<String> = ledger_pk(p).into_iter().skip(1).collect();
    let lcols: Vec<String> = ledger_field_columns(p)
        .iter()
        .map(|&i| p.fields[i].name.to_string())
        .collect();
    let mut landed_cols = vec![
        "_generation".to_string(),
        "_topic".to_string(),
        "_partition".to_string(),
        "_offset".to_string(),
        "_timestamp".to_string(),
    ];
    landed_cols.extend(p.fields.iter().map(|f| f.name.to_string()));
    landed_cols.extend((0..passes).map(|j| format!("\"_pass_{j}\"")));
    let mut landed_vals = vec![
        "$1".to_string(),
        "$2".into(),
        "$3".into(),
        "d._offset".into(),
        "d._timestamp".into(),
    ];
    landed_vals.extend(p.fields.iter().map(|f| format!("d.{}", f.name)));
    landed_vals.extend((0..passes).map(|j| format!("d.\"_pass_{j}\"")));
    format!(
        "WITH input AS (SELECT {select} FROM unnest({params}) AS u({names})), \
         dedup AS (SELECT DISTINCT ON ({pk}) * FROM input ORDER BY {pk}, _offset), \
         src AS (SELECT id FROM {sources} WHERE topic = $2 AND partition = $3 AND consumer_group = $4), \
         claimed AS (INSERT INTO {ledger} (generation, {lcols}, _source_id, \"offset\") \
           SELECT $1, {lcols}, (SELECT id FROM src) AS _source_id, _offset FROM dedup ORDER BY {pk} \
           ON CONFLICT DO NOTHING RETURNING \"offset\") \
         INSERT INTO pg_temp.landed ({landed_cols}) SELECT {landed_vals} FROM dedup d \
           JOIN claimed c ON c.\"offset\" = d._offset RETURNING _offset",
        select = select.join(", "),
        params = params.join(", "),
        names = names.join(", "),
        pk = pk_fields.join(", "),
        ledger = p.ledger.table,
        sources = p.table(SOURCES),
        lcols = lcols.join(", "),
        landed_cols = landed_cols.join(", "),
        landed_vals = landed_vals.join(", "),
    )
}

/// The array element type a field travels in to the claim (and the build's match statement): uuid, date and
/// bigint as their own binary type — no text parse per row in SQL (issue 15: the casts cost ≈ 4 µs/row) —,
/// every other type as `text`, cast in SQL to the field's type.
pub fn param_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Uuid => "uuid",
        FieldType::Date => "date",
        FieldType::Bigint => "bigint",
        _ => "text",
    }
}

/// One field's values of a batch, typed as [`param_type`] says.
enum Column<'a> {
    Text(Vec<Option<&'a str>>),
    Uuid(Vec<Option<uuid::Uuid>>),
    Date(Vec<Option<NaiveDate>>),
    Bigint(Vec<Option<i64>>),
}

impl<'a> Column<'a> {
    fn new(ty: FieldType, n: usize) -> Self {
        match param_type(ty) {
            "uuid" => Column::Uuid(Vec::with_capacity(n)),
            "date" => Column::Date(Vec::with_capacity(n)),
            "bigint" => Column::Bigint(Vec::with_capacity(n)),
            _ => Column::Text(Vec::with_capacity(n)),
        }
    }

    /// Appends a decoded field's normalised text; `Err` names what it is not (a decoder bug, never input).
    fn push(&mut self, v: Option<&'a str>) -> std::result::Result<(), &'static str> {
        match self {
            Column::Text(c) => c.push(v),
            Column::Uuid(c) => c.push(
                v.map(uuid::Uuid::parse_str)
                    .transpose()
                    .map_err(|_| "a uuid")?,
            ),
            Column::Date(c) => c.push(
                v.map(|t| crate::decode::day::parse(t).ok_or(()))
                    .transpose()
                    .map_err(|_| "a date (YYYY-MM-DD)")?,
            ),
            Column::Bigint(c) => c.push(
                v.map(str::parse::<i64>)
                    .transpose()
                    .map_err(|_| "a bigint")?,
            ),
        }
        Ok(())
    }

    fn param(&self) -> &(dyn tokio_postgres::types::ToSql + Sync) {
        match self {
            Column::Text(c) => c,
            Column::Uuid(c) => c,
            Column::Date(c) => c,
            Column::Bigint(c) => c,
        }
    }
}

/// Step 2 of the batch transaction: claims the delivery keys of the batch's `Claim` items in the ledger
/// ([`claim`]), copying the newly claimed rows into `landed`.
///
/// Returns the offsets newly claimed.
///
/// # Errors
/// As [`classify`].
pub(in crate::sink) async fn claim_batch(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    group: &str,
    generation: &str,
    batch: &Batch,
) -> Result<HashSet<i64>, ApplyError> {
    let claims: Vec<&Item> = batch
        .items
        .iter()
        .filter(|i| matches!(i.pending, Pending::Claim { .. }))
        .collect();
    let mut landed: HashSet<i64> = HashSet::new();
    if !claims.is_empty() {
        let offsets: Vec<i64> = claims.iter().map(|i| i.offset).collect();
        let ts: Vec<Option<i64>> = claims.iter().map(|i| i.timestamp_ms).collect();
        let mut cols: Vec<Column<'_>> = p
            .fields
            .iter()
            .map(|f| Column::new(f.ty, claims.len()))
            .collect();
        let mut passes: Vec<Vec<bool>> = vec![Vec::with_capacity(claims.len()); p.pass_columns()];
        for it in &claims {
            if let Pending::Claim {
                fields, passes: ps, ..
            } = &it.pending
            {
                for ((c, v), f) in cols.iter_mut().zip(fields).zip(&p.fields) {
                    let text = v.as_ref().map(|v| v.text.as_str());
                    c.push(text).map_err(|what| {
                        ApplyError::Fatal(Error::Other(format!(
                            "{}/{} offset {}: field `{}` holds `{}`, not {what}, after decoding (a decoder bug)",
                            batch.topic,
                            batch.partition,
                            it.offset,
                            f.name,
                            text.unwrap_or_default()
                        )))
                    })?;
                }
                for (c, v) in passes.iter_mut().zip(ps) {
                    c.push(*v);
                }
            }
        }
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &generation,
            &batch.topic,
            &batch.partition,
            &group,
            &offsets,
            &ts,
        ];
        for c in &cols {
            params.push(c.param());
        }
        for c in &passes {
            params.push(c);
        }
        tx.execute(
            ensure_source(p).as_str(),
            &[&batch.topic, &batch.partition, &group],
        )
        .await
        .map_err(|e| classify(e, false))?;
        let rows = tx
            .query(stmt, &params)
            .await
            .map_err(|e| classify(e, false))?;
        landed.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    }
    Ok(landed)
}
