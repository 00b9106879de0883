//! The final state `prove` compares: every table of a scratch schema — projection tables, tombstones, conflicts,
//! ledger, outbox, dead letters — with bookkeeping columns left out, and the first differing rows per table.
//!
//! Left out, because they legitimately differ between two correct runs: `consumer_group`, `_source_id`, `landed_at`,
//! `_updated_at`, `created_at`, `updated_at`, `applied_at` (which process, when); in the ledger and the dead
//! letters `topic`, `partition`, `offset` and in the outbox `source_topic`, `source_partition`, `source_offset`
//! (where a record was read: a rebuilt topic has new offsets); serial and identity columns (`id`: the order of
//! inserts, not their content). Any other `…_at` column
//! (`published_at`, `resolved_at`, `_deleted_at`) is compared as set or unset. Dead letters are compared as a set
//! (a record quarantined again at a new offset is the same dead letter). The scratch schema's name inside a value
//! (a conflict's `table_name`) reads `<schema>` in every run. Replaysafe's own bookkeeping tables
//! (checkpoints, sources, horizon, pruned offsets, projection record, hand-over, truncates, group starts, the row
//! projections' claimed versions — which copy of a same-state duplicate came first is where, not what) are not
//! compared.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use crate::error::Result;

/// Tables never compared: where and when, not what.
const BOOKKEEPING: [&str; 9] = [
    "replaysafe_checkpoints",
    "replaysafe_sources",
    "replaysafe_horizon",
    "replaysafe_pruned",
    "replaysafe_group_starts",
    "replaysafe_projection_handover",
    "replaysafe_projection_set",
    "replaysafe_truncates",
    "replaysafe_row_versions",
];

/// Columns never compared.
const DROPPED: [&str; 7] = [
    "consumer_group",
    "_source_id",
    "landed_at",
    "_updated_at",
    "created_at",
    "updated_at",
    "applied_at",
];

/// One table's compared columns and rows (each value as PostgreSQL's text, `None` for NULL), sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Column names, in table order.
    pub columns: Vec<String>,
    /// Rows, sorted.
    pub rows: Vec<Vec<Option<String>>>,
}

/// Every compared table of a schema, by name.
pub type Snapshot = BTreeMap<String, Table>;

/// How a snapshot is normalised: `generation` (old, new) — a run under another generation has its columns
/// `generation` left out and the new generation's text spelled as the old one in delivery keys.
#[derive(Default, Clone)]
pub struct Norm {
    /// (reference generation, this run's generation).
    pub generation: Option<(String, String)>,
}

/// Reads the compared state of `schema`; `ledger` and `dead_letters` name those tables.
///
/// # Errors
/// A database error.
pub async fn snapshot(
    client: &Client,
    schema: &str,
    ledger: &str,
    norm: &Norm,
) -> Result<Snapshot> {
    let tables = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1",
            &[&schema],
        )
        .await?;
    let mut out = Snapshot::new();
    for t in tables {
        let name: String = t.get(0);
        if BOOKKEEPING.contains(&name.as_str()) {
            continue;
        }
        out.insert(
            name.clone(),
            read_table(client, schema, &name, ledger, norm).await?,
        );
    }
    Ok(out)
}

async fn read_table(
    client: &Client,
    schema: &str,
    table: &str,
    ledger: &str,
    norm: &Norm,
) -> Result<Table> {
    let cols: Vec<(String, bool)> = client
        .query(
            "SELECT column_name::text, coalesce(column_default LIKE 'nextval(%', false) OR is_identity = 'YES' \
             FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
            &[&schema, &table],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
    let dead = table == "replaysafe_dead_letters";
    let outbox = names.contains(&"delivery_key") && names.contains(&"source_offset");
    let mut columns = Vec::new();
    let mut exprs = Vec::new();
    for (name, serial) in &cols {
        let n = name.as_str();
        let located = (table == ledger || dead) && matches!(n, "topic" | "partition" | "offset");
        let outboxed = outbox
            && matches!(
                n,
                "id" | "source_topic" | "source_partition" | "source_offset"
            );
        let generation = norm.generation.is_some() && n == "generation";
        if DROPPED.contains(&n) || located || outboxed || generation || *serial {
            continue;
        }
        let q = format!("\"{}\"", n.replace('"', "\"\""));
        exprs.push(if n.ends_with("_at") {
            format!("({q} IS NOT NULL)::text")
        } else {
            format!("{q}::text")
        });
        columns.push(if n.ends_with("_at") {
            format!("{n} is set")
        } else {
            n.to_string()
        });
    }
    let sql = format!(
        "SELECT {}{} FROM \"{}\".\"{}\"",
        if dead { "DISTINCT " } else { "" },
        if exprs.is_empty() {
            "1::text".to_string()
        } else {
            exprs.join(", ")
        },
        schema.replace('"', "\"\""),
        table.replace('"', "\"\"")
    );
    let mut rows: Vec<Vec<Option<String>>> = client
        .query(&sql, &[])
        .await?
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    // The scratch schema's own name (a conflict's `table_name`) is spelled alike in every run.
                    let v: Option<String> = r
                        .get::<_, Option<String>>(i)
                        .map(|v| v.replace(schema, "<schema>"));
                    match (&norm.generation, v) {
                        (Some((old, new)), Some(v)) => Some(v.replace(new.as_str(), old.as_str())),
                        (_, v) => v,
                    }
                })
                .collect()
        })
        .collect();
    rows.sort();
    Ok(Table { columns, rows })
}

/// `s` without the columns `cols` (in every table; rows sorted again), e.g. the bookkeeping a snapshot read of
/// an unchanged row may advance.
pub fn without_columns(s: &Snapshot, cols: &[&str]) -> Snapshot {
    s.iter()
        .map(|(name, t)| {
            let keep: Vec<usize> = (0..t.columns.len())
                .filter(|&i| !cols.contains(&t.columns[i].as_str()))
                .collect();
            let mut rows: Vec<Vec<Option<String>>> = t
                .rows
                .iter()
                .map(|r| keep.iter().map(|&i| r[i].clone()).collect())
                .collect();
            rows.sort();
            let columns = keep.iter().map(|&i| t.columns[i].clone()).collect();
            (name.clone(), Table { columns, rows })
        })
        .collect()
}

/// The rows of `want`'s `table` missing from `got`'s (a multiset difference), and how many rows `got` has more.
pub fn missing_rows(want: &Snapshot, got: &Snapshot, table: &str) -> (usize, i64) {
    let empty = Vec::new();
    let w = want.get(table).map_or(&empty, |t| &t.rows);
    let g = got.get(table).map_or(&empty, |t| &t.rows);
    (
        minus(w, g).len(),
        crate::units::bigint_len(g.len()) - crate::units::bigint_len(w.len()),
    )
}

/// One table's difference: rows expected but missing, rows there but not expected (at most `limit` each).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableDiff {
    /// The table.
    pub table: String,
    /// Rows of the reference not in this run's state, rendered `column=value, …`.
    pub expected: Vec<String>,
    /// Rows of this run's state not in the reference.
    pub got: Vec<String>,
    /// Row counts (reference, this run).
    pub counts: (usize, usize),
}

/// The tables of `want` and `got` that differ, with their first `limit` differing rows each way.
pub fn diff(want: &Snapshot, got: &Snapshot, limit: usize) -> Vec<TableDiff> {
    let mut out = Vec::new();
    let names: std::collections::BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    let empty = Table {
        columns: Vec::new(),
        rows: Vec::new(),
    };
    for name in names {
        let (w, g) = (
            want.get(name).unwrap_or(&empty),
            got.get(name).unwrap_or(&empty),
        );
        if w == g {
            continue;
        }
        let cols = if w.columns.is_empty() {
            &g.columns
        } else {
            &w.columns
        };
        let render = |r: &Vec<Option<String>>| {
            cols.iter()
                .zip(r)
                .map(|(c, v)| format!("{c}={}", v.as_deref().unwrap_or("NULL")))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(TableDiff {
            table: name.clone(),
            expected: minus(&w.rows, &g.rows)
                .into_iter()
                .take(limit)
                .map(render)
                .collect(),
            got: minus(&g.rows, &w.rows)
                .into_iter()
                .take(limit)
                .map(render)
                .collect(),
            counts: (w.rows.len(), g.rows.len()),
        });
    }
    out
}

/// The rows of sorted `a` not matched in sorted `b` (multiset difference).
fn minus<'a>(
    a: &'a [Vec<Option<String>>],
    b: &[Vec<Option<String>>],
) -> Vec<&'a Vec<Option<String>>> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() {
        if j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < b.len() && b[j] < a[i] {
            j += 1;
        } else {
            out.push(&a[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_is_a_multiset_difference() {
        let r = |s: &str| vec![Some(s.to_string())];
        let a = vec![r("a"), r("b"), r("b"), r("c")];
        let b = vec![r("b"), r("c"), r("d")];
        assert_eq!(minus(&a, &b), vec![&r("a"), &r("b")]);
        assert_eq!(minus(&b, &a), vec![&r("d")]);
    }
}
