//! One form for every value a row projection stores or compares: each value a change brings (key, old key,
//! columns, `_extra`) is cast to its column's type and printed back by PostgreSQL (`value::type::text`, the
//! type's own output function under the session's pinned `DateStyle`, `TimeZone`, `IntervalStyle`,
//! `extra_float_digits` and `bytea_output`, [`crate::sink::SESSION_SETTINGS`]) before it is judged or written.
//! A stored value is read back through the same output function (`column::text`), so an incoming value and a
//! stored one are spelled alike whatever their encoding or the batch they came in: `2026-12-02T01:05:36Z` and
//! `2026-12-02 01:05:36+00`, `1.0` and `1.00` in a `numeric(p,2)` column, jsonb keys in any order, `{1,2}` and
//! `{ 1 , 2 }` are one value each — in the row columns, `_last`, `_extra`, the row state hash and conflicts.
//!
//! A value the column's type refuses (SQLSTATE class 22) quarantines its record as `invalid-field`, the
//! reason naming the projection, the column, its type and the value; the rest of the batch applies.

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::change::RowChange;
use super::statements::{pg_err, Params, Prepared};
use super::table::Shape;
use crate::decode::{Reason, Rejection};
use crate::model::apply_error::ApplyError;
use crate::projection::row::convert::Pg;

/// The statement that canonicalises a batch's values: parameters one `text[]` per column, then one per key
/// column (the change's key) and one per key column (a primary-key change's old key); one row per change, in
/// parameter order, each value `$i[n]::type::text` (NULL stays NULL).
pub(super) fn canon_sql(shape: &Shape) -> String {
    let n = shape.columns.len();
    let k = shape.key.len();
    let mut params = Vec::with_capacity(n + 2 * k);
    let mut alias = Vec::with_capacity(n + 2 * k);
    let mut select = Vec::with_capacity(n + 2 * k);
    for (i, c) in shape.columns.iter().enumerate() {
        params.push(format!("${}::text[]", i + 1));
        alias.push(format!("c{i}"));
        select.push(format!("u.c{i}::{}::text", c.ty.sql));
    }
    for (prefix, first) in [("k", n + 1), ("o", n + k + 1)] {
        for (j, &col) in shape.key.iter().enumerate() {
            params.push(format!("${}::text[]", first + j));
            alias.push(format!("{prefix}{j}"));
            select.push(format!(
                "u.{prefix}{j}::{}::text",
                shape.columns[col].ty.sql
            ));
        }
    }
    format!(
        "SELECT {} FROM unnest({}) WITH ORDINALITY AS u({}, ord) ORDER BY u.ord",
        select.join(", "),
        params.join(", "),
        alias.join(", ")
    )
}

/// The canonicalisation's parameters for `changes`: per column, per key column, per old-key column, one text (or
/// NULL) per change.
fn arrays(shape: &Shape, changes: &[RowChange]) -> Vec<Vec<Option<String>>> {
    let n = shape.columns.len();
    let k = shape.key.len();
    let mut out: Vec<Vec<Option<String>>> = vec![Vec::with_capacity(changes.len()); n + 2 * k];
    for c in changes {
        for (i, col) in out.iter_mut().take(n).enumerate() {
            col.push(match c.values.get(i) {
                Some(Pg::Text(t)) => Some(t.clone()),
                _ => None,
            });
        }
        for j in 0..k {
            out[n + j].push(c.key.get(j).cloned());
            out[n + k + j].push(c.old_key.as_ref().and_then(|o| o.get(j).cloned()));
        }
    }
    out
}

/// Runs the canonicalisation of `changes` in a savepoint (released on success, rolled back on a refused value,
/// leaving the batch transaction usable). `Ok(Err(message))`: a value was refused (SQLSTATE class 22).
async fn attempt(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &[RowChange],
) -> std::result::Result<std::result::Result<Vec<tokio_postgres::Row>, String>, ApplyError> {
    let data = arrays(&prepared.shape, changes);
    let params: Params = data.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    in_savepoint(tx, &prepared.canon, &params).await
}

/// Runs `sql` in a savepoint: released on success, rolled back on a refused value (leaving the batch
/// transaction usable). `Ok(Err(message))`: PostgreSQL refused a value ([`refused`]).
async fn in_savepoint<T: ?Sized + tokio_postgres::ToStatement + Sync>(
    tx: &Transaction<'_>,
    sql: &T,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<std::result::Result<Vec<tokio_postgres::Row>, String>, ApplyError> {
    tx.batch_execute("SAVEPOINT replaysafe_canon")
        .await
        .map_err(pg_err)?;
    match tx.query(sql, params).await {
        Ok(rows) => {
            tx.batch_execute("RELEASE SAVEPOINT replaysafe_canon")
                .await
                .map_err(pg_err)?;
            Ok(Ok(rows))
        }
        Err(e) if refused(&e) => {
            tx.batch_execute(
                "ROLLBACK TO SAVEPOINT replaysafe_canon; RELEASE SAVEPOINT replaysafe_canon",
            )
            .await
            .map_err(pg_err)?;
            let msg = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string());
            Ok(Err(msg))
        }
        Err(e) => Err(pg_err(e)),
    }
}

/// Whether PostgreSQL refused a value for its type: SQLSTATE class 22 (data exception: invalid input syntax,
/// out of range, an enum label the type lacks, …), or — a domain column — 23514 (the domain's `CHECK`) or
/// 23502 (its `NOT NULL`): the cast is a plain `SELECT`, so these come from the domain alone.
fn refused(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c: &SqlState| {
        c.code().starts_with("22")
            || *c == SqlState::CHECK_VIOLATION
            || *c == SqlState::NOT_NULL_VIOLATION
    })
}

/// Replaces every value `changes` bring (keys, old keys, column texts) by PostgreSQL's output of it as its
/// column's type (see the module doc). Placeholders (absent, unchanged TOAST) and NULLs stay as they are.
///
/// # Errors
/// [`ApplyError::Record`] for the first change (in offset order) holding a value its column's type refuses,
/// naming the projection, column, type and value; [`ApplyError`] from PostgreSQL otherwise.
pub(super) async fn canonicalise(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &mut [RowChange],
) -> std::result::Result<(), ApplyError> {
    if changes.is_empty() {
        return Ok(());
    }
    let rows = match attempt(tx, prepared, changes).await? {
        Ok(rows) => rows,
        Err(_) => return Err(culprit(tx, prepared, changes).await?),
    };
    let shape = &prepared.shape;
    let n = shape.columns.len();
    let k = shape.key.len();
    for (c, r) in changes.iter_mut().zip(rows) {
        for (i, v) in c.values.iter_mut().enumerate().take(n) {
            if let (Pg::Text(t), Some(canon)) = (&*v, r.get::<_, Option<String>>(i)) {
                if *t != canon {
                    *v = Pg::Text(canon);
                }
            }
        }
        for j in 0..k.min(c.key.len()) {
            if let Some(canon) = r.get::<_, Option<String>>(n + j) {
                c.key[j] = canon;
            }
        }
        if let Some(old) = c.old_key.as_mut() {
            for (j, o) in old.iter_mut().enumerate().take(k) {
                if let Some(canon) = r.get::<_, Option<String>>(n + k + j) {
                    *o = canon;
                }
            }
        }
    }
    Ok(())
}

/// The first change of `changes` with a value its column's type refuses (bisected over prefixes, each tried in a
/// savepoint), as the [`ApplyError::Record`] that quarantines it.
///
/// # Errors
/// [`ApplyError`] from PostgreSQL.
async fn culprit(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &[RowChange],
) -> std::result::Result<ApplyError, ApplyError> {
    // Invariant: changes[..lo] canonicalise, changes[..hi] do not.
    let (mut lo, mut hi) = (0usize, changes.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match attempt(tx, prepared, &changes[..mid]).await? {
            Ok(_) => lo = mid,
            Err(_) => hi = mid,
        }
    }
    let c = &changes[hi - 1];
    let shape = &prepared.shape;
    let mut slots: Vec<(usize, &str, &'static str)> = Vec::new();
    for (j, &col) in shape.key.iter().enumerate() {
        if let Some(t) = c.key.get(j) {
            slots.push((col, t, "key column"));
        }
        if let Some(t) = c.old_key.as_ref().and_then(|o| o.get(j)) {
            slots.push((col, t, "old key column"));
        }
    }
    for (i, v) in c.values.iter().enumerate() {
        if let Pg::Text(t) = v {
            slots.push((i, t, "column"));
        }
    }
    for (i, text, what) in slots {
        let ty = &shape.columns[i].ty.sql;
        let single = format!("SELECT $1::text::{ty}::text");
        let param: [&(dyn ToSql + Sync); 1] = [&text];
        if let Err(msg) = in_savepoint(tx, single.as_str(), &param).await? {
            return Ok(ApplyError::Record {
                offset: c.offset,
                rejection: Rejection {
                    reason: Reason::InvalidField,
                    detail: format!(
                        "row projection `{}`: {what} `{}` ({ty}): the value `{}` cannot be stored: {msg}",
                        shape.name,
                        shape.columns[i].name.as_str(),
                        short(text)
                    ),
                },
            });
        }
    }
    // Refused as a whole but no single value alone: report the change rather than loop.
    Ok(ApplyError::Record {
        offset: c.offset,
        rejection: Rejection {
            reason: Reason::InvalidField,
            detail: format!(
                "row projection `{}`: a value of this change cannot be stored in its column",
                shape.name
            ),
        },
    })
}

fn short(s: &str) -> String {
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::Ident;
    use crate::projection::row::types::{ColumnSpec, SqlType};

    #[test]
    fn one_cast_per_value_in_parameter_order() {
        let col = |n: &str, t: &str| ColumnSpec {
            name: Ident::new(n).unwrap(),
            ty: SqlType::parse(t).unwrap(),
            unit: None,
            field: None,
        };
        let shape = Shape {
            index: 0,
            name: "p".into(),
            columns: vec![col("id", "bigint"), col("at", "timestamptz")],
            key: vec![0],
            extra: None,
            added: 0,
            generated: Vec::new(),
            identity: Vec::new(),
        };
        assert_eq!(
            canon_sql(&shape),
            "SELECT u.c0::bigint::text, u.c1::timestamptz::text, u.k0::bigint::text, u.o0::bigint::text FROM \
             unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(c0, c1, k0, o0, ord) \
             ORDER BY u.ord"
        );
    }
}
