//! `kind = "sql"`: the user's statement over `landed`, run once per batch when something landed. With a
//! `filter`, `landed` is shadowed by a CTE holding only the rows that pass it.
//!
//! Lock order is the user's part (case C36): a statement that writes rows other partitions' batches also write
//! must take them in one order, e.g. `INSERT … SELECT … FROM landed GROUP BY k ORDER BY k ON CONFLICT (k) DO
//! UPDATE …` (one row per key, ascending), or `UPDATE t … FROM (SELECT … FROM t JOIN landed … ORDER BY k FOR
//! UPDATE OF t) …` — otherwise PostgreSQL may abort one batch with a deadlock (40P01), which is retried as a new
//! transaction but costs the wait of `deadlock_timeout` and a redo.

use std::collections::HashSet;

use super::kind::{Compiled, Ctx, Settings};
use crate::error::Result;

/// The keys a `sql` projection takes.
pub(crate) const KEYS: &[&str] = &["sql", "setup", "snapshots"];

/// Checks `sql` (not empty; no `WITH RECURSIVE` together with a filter) and builds the statement.
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
pub(crate) fn compile(ctx: &Ctx<'_>) -> Result<Compiled> {
    let (src, rp) = (ctx.src, ctx.raw());
    let sql = ctx.need(rp.sql.as_ref(), "sql")?;
    let body = sql
        .get_ref()
        .trim()
        .trim_end_matches(';')
        .trim()
        .to_string();
    if body.is_empty() {
        return Err(src.error(sql.span(), "`sql` is empty"));
    }
    let lower = body.to_ascii_lowercase();
    let recursive = lower.starts_with("with recursive");
    if recursive && ctx.pass.is_some() {
        return Err(src.error(
            sql.span(),
            "`filter` cannot be combined with a WITH RECURSIVE statement",
        ));
    }
    // `landed` is shadowed by the rows that reach it: those passing its filter and not marked as a copy it has
    // seen. A WITH RECURSIVE statement cannot be shadowed: every copy reaches it.
    let cond = [ctx.pass.as_deref(), ctx.reach.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" AND ");
    let statement = if recursive || cond.is_empty() {
        body.clone()
    } else {
        let shadow = format!("landed AS (SELECT * FROM pg_temp.landed WHERE {cond})");
        if lower.starts_with("with") && body[4..].starts_with(char::is_whitespace) {
            format!("WITH {shadow},{}", &body[4..])
        } else {
            format!("WITH {shadow} {body}")
        }
    };
    let words = words(&body);
    let reads_record = recursive || COORDINATES.iter().any(|c| words.contains(c));
    let setup = rp
        .setup
        .as_ref()
        .map(|s| vec![s.get_ref().clone()])
        .unwrap_or_default();
    Ok(Compiled {
        name: format!("projection-{}", ctx.n + 1),
        statement,
        setup,
        aggregate: None,
        reads_record,
    })
}

/// The columns of `landed` that are a record's coordinates, not fields: a statement naming one reads the record
/// itself ([`super::Reads::Record`]).
const COORDINATES: &[&str] = &[
    "_generation",
    "_topic",
    "_partition",
    "_offset",
    "_timestamp",
];

/// The words (identifier-like runs) of a statement.
fn words(sql: &str) -> HashSet<&str> {
    sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect()
}

/// Records the statement; the fields it reads are every declared field named as a word in it.
pub(crate) fn settings(s: &mut Settings<'_>) {
    let sql = Settings::text(&s.rp.sql).unwrap_or_default();
    let sql = sql.trim().trim_end_matches(';').trim().to_string();
    let words = words(&sql);
    let used: Vec<String> = s
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| words.contains(n))
        .map(str::to_string)
        .collect();
    s.used.extend(used);
    s.put("sql", sql);
}
