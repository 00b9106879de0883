//! Which ledger feeds a projection table: a line `replaysafe: fed by ledger <schema.table>` in the table's
//! comment (a comment of yours stays above it). Two ledgers feeding one table would project every record both
//! claim twice, so a start refuses a table another ledger's mark is on — checked before anything is created.

use tokio_postgres::GenericClient;

use crate::config::Pipeline;
use crate::error::{Error, Result};

/// The mark's line, followed by the ledger's qualified name.
const MARK: &str = "replaysafe: fed by ledger ";

/// `(projection name, table)` of every projection with a table of its own (all kinds but `sql`).
fn tables(p: &Pipeline) -> Vec<(&str, &str)> {
    p.projections
        .iter()
        .filter_map(|x| Some((x.name.as_str(), x.settings.get("table")?.as_str())))
        .filter(|(_, t)| !t.is_empty())
        .collect()
}

/// The ledger named by the mark in `comment`, if any.
fn marked_by(comment: &str) -> Option<&str> {
    comment.lines().find_map(|l| l.strip_prefix(MARK))
}

/// A table's comment and whether it holds rows; `None` when it does not exist.
async fn table_state(
    c: &impl GenericClient,
    table: &str,
) -> Result<Option<(Option<String>, bool)>> {
    let row = c
        .query_one(
            "SELECT to_regclass($1)::text, obj_description(to_regclass($1), 'pg_class')",
            &[&table],
        )
        .await?;
    let Some(name) = row.get::<_, Option<String>>(0) else {
        return Ok(None);
    };
    let rows: bool = c
        .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {name})"), &[])
        .await?
        .get(0);
    Ok(Some((row.get(1), rows)))
}

/// Refuses, before anything is created: a projection table marked as fed by another ledger; a table of a
/// projection being `added` to a ledger that already holds claims when it holds rows (its history is to be built
/// into it); an unmarked table holding rows when the ledger holds no claims (a new ledger would project the
/// topic into it again).
///
/// # Errors
/// [`Error::Schema`] naming the projection, the table and what to do; [`Error::Postgres`].
pub async fn check(
    c: &impl GenericClient,
    p: &Pipeline,
    added: &[String],
    ledger_has_rows: bool,
) -> Result<()> {
    let ours = p.ledger.table.to_string();
    for (name, table) in tables(p) {
        let Some((comment, rows)) = table_state(c, table).await? else {
            continue;
        };
        let mark = comment.as_deref().and_then(marked_by);
        if let Some(other) = mark.filter(|m| *m != ours) {
            return Err(Error::Schema(format!(
                "projection `{name}`: table {table} is fed by ledger {other} (its table comment says so), and this \
                 pipeline's ledger is {ours}: a table fed by two ledgers counts every record both claim twice. Give \
                 this projection a table of its own (a new name in `table`); to add it to the running pipeline of \
                 ledger {other}, see docs/replay.md \"Change a running pipeline\""
            )));
        }
        if rows && ledger_has_rows && added.iter().any(|a| a == name) {
            return Err(Error::Schema(format!(
                "projection `{name}` is new to ledger {ours}, but its table {table} already holds rows: its history \
                 is built into it from the topic (`replaysafe projection build`), which would add to them. Give it \
                 a new table (or empty this one first)"
            )));
        }
        if rows && mark.is_none() && !ledger_has_rows {
            return Err(Error::Schema(format!(
                "projection `{name}`: table {table} holds rows, but no ledger is recorded as feeding it and ledger \
                 {ours} holds no delivery keys: if a replaysafe ledger fed it (a pipeline of an earlier version), \
                 consuming would project the topic's records into it again. Run the pipeline with that ledger, or \
                 give the projection a new table. Only if no replaysafe ledger ever fed it (its rows come from \
                 another writer), record this ledger as its feeder: COMMENT ON TABLE {table} IS '{MARK}{ours}'"
            )));
        }
    }
    Ok(())
}

/// Puts the mark of the pipeline's ledger on every projection table that lacks it (after [`check`]).
///
/// # Errors
/// [`Error::Postgres`].
pub async fn write(c: &impl GenericClient, p: &Pipeline) -> Result<()> {
    let ours = p.ledger.table.to_string();
    for (_, table) in tables(p) {
        let Some((comment, _)) = table_state(c, table).await? else {
            continue;
        };
        if comment.as_deref().and_then(marked_by).is_some() {
            continue;
        }
        let text = match comment.as_deref() {
            Some(c) if !c.is_empty() => format!("{c}\n{MARK}{ours}"),
            _ => format!("{MARK}{ours}"),
        };
        let stmt: String = c
            .query_one(
                "SELECT format('COMMENT ON TABLE %s IS %L', to_regclass($1)::text, $2::text)",
                &[&table, &text],
            )
            .await?
            .get(0);
        c.batch_execute(&stmt).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_found_below_a_comment_of_the_user() {
        assert_eq!(
            marked_by("counts per day\nreplaysafe: fed by ledger public.l"),
            Some("public.l")
        );
        assert_eq!(marked_by("counts per day"), None);
    }
}
