//! The row changes a batch brings to a row projection: from a Debezium change or a JSON event, with the outcome
//! each can have.

use super::plan::{RowPlan, VersionPlan};
use super::table::Shape;
use crate::decode::debezium::convert::{to_pg, Pg};
use crate::decode::debezium::{Change, Op};
use crate::decode::{Reason, Rejection};
use crate::ident::QualifiedName;

/// One claimed record as a row projection sees it.
#[derive(Debug, Clone)]
pub struct RowChange {
    /// Kafka offset (the record's identity in the batch).
    pub offset: i64,
    /// Key column texts, in key order.
    pub key: Vec<String>,
    /// The version (compared element-wise).
    pub version: Vec<i64>,
    /// Upsert, delete or truncate.
    pub kind: ChangeKind,
    /// Upserts: one value per column.
    pub values: Vec<Pg>,
    /// The delivery key, as a JSON array text (for the conflicts table and `_delivery`).
    pub delivery: String,
    /// A primary-key change's previous key (key column texts): where unchanged TOASTed values come from.
    pub old_key: Option<Vec<String>>,
    /// A snapshot read (`op = r`).
    pub snapshot: bool,
    /// Debezium: the source position `[commit LSN, change LSN]` (the version too, unless a version column is
    /// used). What orders a change against a state when either has no version of its own.
    pub position: Option<Vec<i64>>,
}

/// Turns an upsert whose new row leaves a row projection's `filter` into a delete of the row at the upsert's
/// version (deletes and truncates are left as they are).
pub fn leave_filter(change: &mut RowChange) {
    if change.kind == ChangeKind::Upsert {
        change.kind = ChangeKind::Delete;
        change.values.clear();
        change.old_key = None;
    }
}

/// What a change does to its entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Insert, update or snapshot read.
    Upsert,
    /// Delete (leaves a tombstone).
    Delete,
    /// Truncate of the whole table.
    Truncate,
}

/// How one claimed record fared in a row projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowResult {
    /// The entity's stored state changed.
    Applied,
    /// A strictly newer version with the row state already stored (another field changed, or the same state
    /// confirmed again): the row takes the new version and delivery; the record is `landed`.
    Unchanged,
    /// The same state was already stored at this version, or a snapshot read (`op = r`) found the state already
    /// stored: a `duplicate`, no side effects.
    Same,
    /// Older than the stored version (or tombstone).
    Stale,
    /// The stored version is equal and the state differs: recorded in `replaysafe_conflicts`.
    Conflict,
}

/// Whether a change belongs to this row projection.
pub fn matches(plan: &RowPlan, table: &QualifiedName, change: &Change) -> bool {
    match &plan.source_table {
        Some(s) => s == &change.table,
        None => change.table.rsplit('.').next() == Some(table.name.as_str()),
    }
}

fn key_from(change: &Change, name: &str) -> Option<crate::decode::debezium::Cell> {
    let find = |r: &Option<crate::decode::debezium::Row>| {
        r.as_ref()
            .and_then(|r| r.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone()))
    };
    find(&change.key)
        .or_else(|| find(&change.after))
        .or_else(|| find(&change.before))
}

/// Builds the row projection's view of one Debezium change.
///
/// # Errors
/// A [`Rejection`] when a value cannot be converted to its column's type or a key/version column is missing.
pub fn from_change(
    shape: &Shape,
    plan: &RowPlan,
    offset: i64,
    change: &Change,
    delivery: String,
    dec: crate::config::DecimalHandling,
) -> std::result::Result<RowChange, Rejection> {
    let bad = |m: String| Rejection {
        reason: Reason::InvalidField,
        detail: m,
    };
    let kind = match change.op {
        Op::Truncate => ChangeKind::Truncate,
        Op::Delete => ChangeKind::Delete,
        _ => ChangeKind::Upsert,
    };
    let mut key = Vec::new();
    if kind != ChangeKind::Truncate {
        for &k in &shape.key {
            let col = &shape.columns[k];
            let cell = key_from(change, col.name.as_str()).ok_or_else(|| {
                bad(format!(
                    "key column `{}` is in neither the Debezium key nor the row",
                    col.name.as_str()
                ))
            })?;
            match to_pg(&cell, col, dec)
                .map_err(|m| bad(format!("key column `{}`: {m}", col.name.as_str())))?
            {
                Pg::Text(t) => key.push(t),
                _ => return Err(bad(format!("key column `{}` is null", col.name.as_str()))),
            }
        }
    }
    let version = match &plan.version {
        VersionPlan::SourcePosition | VersionPlan::Field(_) => change.position.to_vec(),
        // A truncate has no row: with a version column it tombstones every row at its own version.
        VersionPlan::Column(_) if kind == ChangeKind::Truncate => Vec::new(),
        VersionPlan::Column(c) => {
            let img = if kind == ChangeKind::Delete {
                &change.before
            } else {
                &change.after
            };
            let found = img
                .as_ref()
                .and_then(|r| r.iter().find(|(n, _)| n == c.as_str()))
                .map(|(_, cell)| cell.value.clone())
                .filter(|v| !v.is_null());
            let v = found.as_ref().and_then(|value| match value {
                serde_json::Value::Number(n) => n.to_string().parse::<i64>().ok(),
                serde_json::Value::String(s) => s.parse::<i64>().ok(),
                _ => None,
            });
            // A delete under REPLICA IDENTITY DEFAULT carries only the key in `before`: Debezium fills the other
            // columns with null, or with 0 when the column is NOT NULL. Such a delete (version null, 0 or not a
            // number) has no version of its own and is ordered by its source position (in the fold).
            if kind == ChangeKind::Delete && v.is_none_or(|v| v == 0) {
                return Ok(RowChange {
                    offset,
                    key,
                    version: Vec::new(),
                    kind,
                    values: Vec::new(),
                    delivery,
                    old_key: None,
                    snapshot: false,
                    position: Some(change.position.to_vec()),
                });
            }
            let v = v.ok_or_else(|| {
                bad(format!(
                    "version column `{}` is missing or not a whole number",
                    c.as_str()
                ))
            })?;
            vec![v]
        }
    };
    let old_key = match &change.old_key {
        Some(row) if kind == ChangeKind::Upsert => {
            let mut k = Vec::new();
            for &i in &shape.key {
                let col = &shape.columns[i];
                match row
                    .iter()
                    .find(|(n, _)| n == col.name.as_str())
                    .map(|(_, c)| to_pg(c, col, dec))
                {
                    Some(Ok(Pg::Text(t))) => k.push(t),
                    _ => break,
                }
            }
            (k.len() == shape.key.len()).then_some(k)
        }
        _ => None,
    };
    let mut values = Vec::new();
    if kind == ChangeKind::Upsert {
        let after = change.after.as_ref().expect("upserts have after");
        for col in &shape.columns {
            let v = match after.iter().find(|(n, _)| n == col.name.as_str()) {
                Some((_, cell)) => to_pg(cell, col, dec)
                    .map_err(|m| bad(format!("column `{}`: {m}", col.name.as_str())))?,
                None => Pg::Null,
            };
            values.push(v);
        }
    }
    Ok(RowChange {
        offset,
        key,
        version,
        kind,
        values,
        delivery,
        old_key,
        snapshot: change.op == Op::Read,
        position: Some(change.position.to_vec()),
    })
}

/// Where the batch is: for the conflicts table.
pub struct Coordinates<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Consumer group.
    pub group: &'a str,
}
