//! What `counter` and `sum` share: a table keyed by the `group-by` fields whose value columns are incremented
//! by each batch (`INSERT … SELECT … GROUP BY key ORDER BY key ON CONFLICT DO UPDATE SET v = v + EXCLUDED.v`:
//! one row per key, locked in ascending key order — see [`compile`]).

use super::kind::{Aggregate, Compiled, Ctx, Settings};
use crate::error::Result;
use crate::ident::Ident;

/// The `fillfactor` (percent of each heap page filled by inserts) of the counter and sum tables replaysafe
/// creates, so that their per-batch increments are HOT updates (see `compile`).
pub const AGGREGATE_FILLFACTOR: u8 = 50;

/// One value column: `(target column, select expression over landed, column type)`.
pub(crate) type Target = (Ident, String, &'static str);

/// Value columns and, per column, the field it adds.
pub(crate) type Targets = (Vec<Target>, Vec<Option<usize>>);

/// Checks the `table` and `group-by` keys, then the kind's own (`targets`, called after them), and builds the
/// statement and DDL incrementing the targets.
///
/// # Errors
/// [`crate::Error::Config`]: a missing key, an unknown or optional group-by field, a bad table name, or the
/// error of `targets`.
pub(crate) fn compile(
    ctx: &Ctx<'_>,
    targets: impl FnOnce() -> Result<Targets>,
) -> Result<Compiled> {
    let (src, fields, rp) = (ctx.src, ctx.fields, ctx.raw());
    let table_s = ctx.need(rp.table.as_ref(), "table")?;
    let table = crate::config::fields::table_name(src, ctx.schema, &table_s)?;
    let group_by_raw = rp.group_by.as_ref().ok_or_else(|| {
        src.error(
            ctx.p.span(),
            format!("a `{}` projection needs `group-by`", rp.kind.get_ref()),
        )
    })?;
    let group_by = fields.list(group_by_raw, "group-by")?;
    for (&i, s) in group_by.iter().zip(group_by_raw.get_ref()) {
        if fields.plans[i].optional {
            return Err(src.error(
                s.span(),
                format!("group-by field `{}` must not be optional", s.get_ref()),
            ));
        }
    }
    let gcols: Vec<String> = group_by
        .iter()
        .map(|&i| fields.plans[i].name.to_string())
        .collect();
    let gdefs: Vec<String> = group_by
        .iter()
        .map(|&i| {
            format!(
                "{} {} NOT NULL",
                fields.plans[i].name,
                fields.plans[i].ty.sql()
            )
        })
        .collect();
    let g = gcols.join(", ");
    let (targets, value_fields) = targets()?;
    let tcols = targets
        .iter()
        .map(|(t, _, _)| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let texprs = targets
        .iter()
        .map(|(_, e, _)| e.clone())
        .collect::<Vec<_>>()
        .join(", ");
    let updates = targets
        .iter()
        .map(|(t, _, _)| format!("{t} = {table}.{t} + EXCLUDED.{t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let where_pass = &ctx.where_pass;
    // Lock order (case C36): `GROUP BY` makes one row per key, so the statement touches each aggregate row once
    // (ON CONFLICT DO UPDATE must not affect a row twice), and `ORDER BY` the primary key makes every batch
    // transaction lock the rows it increments — existing rows and the speculative inserts of new keys — in one
    // ascending key order. The executor inserts the rows of `INSERT … SELECT` one at a time in the order the
    // SELECT yields them, so two partitions' batches over the same keys wait for each other instead of locking
    // c-2 then c-1 against c-1 then c-2 and deadlocking (40P01). PostgreSQL manual, "Explicit Locking" →
    // "Deadlocks": acquire locks on multiple objects in a consistent order; the same fix as
    // openobserve/openobserve#13480 and latitude-dev/latitude-llm#3463. The order is the key columns' types and
    // collation in `landed`, the same in every session of the database.
    let statement = format!(
        "INSERT INTO {table} ({g}, {tcols}) SELECT {g}, {texprs} FROM landed{where_pass} GROUP BY {g} \
         ORDER BY {g} ON CONFLICT ({g}) DO UPDATE SET {updates}"
    );
    let tdefs = targets
        .iter()
        .map(|(t, _, ty)| format!("{t} {ty} NOT NULL DEFAULT 0"))
        .collect::<Vec<_>>();
    // fillfactor: every batch updates most of its groups' rows again; with room left on each page the new row
    // version stays on its page and no index entry is added (a HOT update — PostgreSQL manual, "Heap-Only
    // Tuples (HOT)" and CREATE TABLE's `fillfactor`). At the default 100 only ~20% of the bench's updates were
    // HOT; the others inserted into the primary key and triggered its bottom-up deletion (issue 15 profile).
    let setup = vec![format!(
        "CREATE TABLE IF NOT EXISTS {table} ({}, {}, PRIMARY KEY ({g})) WITH (fillfactor = {AGGREGATE_FILLFACTOR})",
        gdefs.join(", "),
        tdefs.join(", ")
    )];
    let aggregate = Some(Aggregate {
        table: table.clone(),
        group_by: group_by.clone(),
        values: targets.iter().map(|(t, _, _)| t.clone()).collect(),
        value_fields,
    });
    Ok(Compiled {
        name: table.name.as_str().to_string(),
        statement,
        setup,
        aggregate,
        reads_record: false,
    })
}

/// Records `table` and `group-by` (and marks the group-by fields read).
pub(crate) fn settings(s: &mut Settings<'_>) {
    let group_by = Settings::list(&s.rp.group_by);
    let table = s.table("");
    s.put("table", table);
    s.put("group-by", group_by.join(", "));
    s.used.extend(group_by);
}
