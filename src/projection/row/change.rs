//! The row changes a batch brings to a row projection: from a Debezium change or a JSON event, with the outcome
//! each can have.

use super::plan::{AbsentPolicy, NewColumns, RowPlan, SchemaDrift, VersionPlan};
use super::table::Shape;
use crate::decode::debezium::{Change, Op};
use crate::decode::{Reason, Rejection};
use crate::ident::QualifiedName;
use crate::projection::row::convert::{to_pg, Pg};

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
    /// Debezium's first transaction streamed after a snapshot (`sequence[0]` null,
    /// [`crate::decode::debezium::Change::follows_snapshot`]): its position is completed from the stored state
    /// in the fold ([`super::state::follow`]).
    pub follows_snapshot: bool,
    /// A read of an incremental snapshot ([`crate::decode::debezium::Change::incremental`]): not counted as a
    /// resnapshot.
    pub incremental: bool,
    /// An incremental-snapshot read without a source position
    /// ([`crate::decode::debezium::Change::unpositioned`]): placed at the stored state by the fold
    /// ([`super::state::place`]); `position` is `None` until then.
    pub unpositioned: bool,
    /// A Debezium change whose delivery key was already claimed (a ledger `duplicate`): only compared with a
    /// stored state at its position, never applied ([`super::redelivery`]).
    pub redelivered: bool,
    /// The other projections (not `row`) the record reaches, and what each reads of it: whether a copy of a
    /// state already claimed reaches them ([`super::history`]). Empty for a snapshot read (observed state, never
    /// a copy that reaches anything).
    pub reach: Vec<Reach>,
}

/// A projection other than `row` that a claimed record reaches (passes its filter), and what it reads of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// Its index among the pipeline's projections (0-based).
    pub projection: usize,
    /// 32 hex digits (the first 16 bytes of SHA-256) over its name and the decoded text of the fields it reads
    /// ([`crate::projection::Reads::Fields`]); `None` when it reads the record itself
    /// ([`crate::projection::Reads::Record`]: every copy reaches it).
    pub tag: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// A copy: the same state was already claimed at this version under another delivery key, but it gives the
    /// projections listed (indices) values no earlier copy gave them (or they read the record itself): a
    /// duplicate for the row, `landed` for those projections only.
    Copied(Vec<usize>),
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
                    follows_snapshot: change.follows_snapshot,
                    incremental: false,
                    unpositioned: false,
                    redelivered: false,
                    reach: Vec::new(),
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
    let values = if kind == ChangeKind::Upsert {
        let after = change.after.as_ref().expect("upserts have after");
        if plan.new_columns == NewColumns::Add {
            if let Some(m) = after.iter().find_map(|(n, _)| {
                (!shape.columns.iter().any(|c| c.name.as_str() == n))
                    .then(|| super::evolve::refused(n))
                    .flatten()
            }) {
                return Err(bad(m));
            }
        }
        upsert_values(shape, plan.absent, after, dec).map_err(bad)?
    } else {
        Vec::new()
    };
    Ok(RowChange {
        offset,
        key,
        version,
        kind,
        values,
        delivery,
        old_key,
        snapshot: change.op == Op::Read,
        position: (!change.unpositioned).then(|| change.position.to_vec()),
        follows_snapshot: change.follows_snapshot,
        incremental: change.incremental,
        unpositioned: change.unpositioned,
        redelivered: false,
        reach: Vec::new(),
    })
}

/// The values an upsert's `after` brings, one per column of `shape`: a member converted to its column's type (an
/// error names the column), an absent member [`Pg::Absent`] (`absent = "keep"`) or [`Pg::Null`] (`"null"`), and
/// for the `_extra` column (`new-columns = "extra"`) the members that are none of the columns, as a JSON object
/// (NULL when there are none).
///
/// # Errors
/// `column `name`: …` when a member cannot be converted to (or does not fit) its column's type — a source column
/// retyped to something the projection's column cannot hold.
pub fn upsert_values(
    shape: &Shape,
    absent: AbsentPolicy,
    after: &crate::decode::debezium::Row,
    dec: crate::config::DecimalHandling,
) -> std::result::Result<Vec<Pg>, String> {
    let mut values = Vec::with_capacity(shape.columns.len());
    for (i, col) in shape.columns.iter().enumerate() {
        if shape.extra == Some(i) {
            values.push(extra(shape, after));
            continue;
        }
        let v = match after.iter().find(|(n, _)| n == col.name.as_str()) {
            Some((_, cell)) => {
                to_pg(cell, col, dec).map_err(|m| format!("column `{}`: {m}", col.name.as_str()))?
            }
            None if absent == AbsentPolicy::Keep => Pg::Absent,
            None => Pg::Null,
        };
        values.push(v);
    }
    Ok(values)
}

/// `schema-drift = "strict"`: what in an upsert's `after` does not match the projection — a mapped column absent
/// (dropped or renamed at the source), or, under `new-columns = "ignore"`, a member no column maps (added at the
/// source). `None` when it matches, or under `lenient`.
pub fn drift(
    shape: &Shape,
    plan: &RowPlan,
    after: &crate::decode::debezium::Row,
) -> Option<String> {
    if plan.schema_drift != SchemaDrift::Strict {
        return None;
    }
    let has = |name: &str| after.iter().any(|(n, _)| n == name);
    let mapped = |name: &str| {
        shape.columns.iter().any(|c| c.name.as_str() == name)
            || shape.generated.iter().any(|g| g == name)
    };
    for (i, c) in shape.columns.iter().enumerate() {
        if shape.extra != Some(i) && !has(c.name.as_str()) {
            return Some(format!(
                "mapped column `{}` is absent from the change's `after` (dropped or renamed at the source)",
                c.name.as_str()
            ));
        }
    }
    if plan.new_columns == NewColumns::Ignore {
        if let Some((n, _)) = after.iter().find(|(n, _)| !mapped(n)) {
            return Some(format!(
                "field `{n}` of the change's `after` is none of the projection's columns (added at the source)"
            ));
        }
    }
    None
}

/// The members of `after` that are none of the shape's columns, as a JSON object text (NULL when none).
fn extra(shape: &Shape, after: &crate::decode::debezium::Row) -> Pg {
    let m: serde_json::Map<String, serde_json::Value> = after
        .iter()
        .filter(|(n, _)| {
            !shape
                .columns
                .iter()
                .enumerate()
                .any(|(i, c)| shape.extra != Some(i) && c.name.as_str() == n)
                && !shape.generated.iter().any(|g| g == n)
        })
        .map(|(n, c)| (n.clone(), c.value.clone()))
        .collect();
    if m.is_empty() {
        Pg::Null
    } else {
        Pg::Text(serde_json::Value::Object(m).to_string())
    }
}

/// `keyless = "refuse"` (the default): a change (not a truncate) without a Kafka key — its source table has no
/// primary key, and Debezium sends a null key (DBZ-916) — stops the partition: exit 2, the error naming the
/// source table, topic/partition/offset and the fixes; nothing of the batch is committed, the checkpoint stays
/// before it. Such rows cannot be told apart (identical rows would merge into one, a delete matched on its
/// `before` image would remove every copy) and a null key spreads one row's changes over partitions. `None` when
/// the change has a key, or the projection has `keyless = "key"` and the change is on partition 0 (a keyless
/// change on another partition means the topic has several: null keys give no per-row order across them, so
/// `keyless = "key"` stops there too).
pub fn keyless_stop(
    plan: &RowPlan,
    projection: &str,
    change: &Change,
    batch: &crate::model::batch::Batch,
    offset: i64,
) -> Option<crate::model::apply_error::ApplyError> {
    if !change.null_key || change.op == Op::Truncate {
        return None;
    }
    if plan.keyless == super::plan::Keyless::Key {
        if batch.partition == 0 {
            return None;
        }
        return Some(crate::model::apply_error::ApplyError::Fatal(
            crate::error::Error::Schema(format!(
                "keyless source table at {}/{} offset {offset}: the change of {} has a null Kafka key on \
                 partition {}: row projection `{projection}` has keyless = \"key\", which needs a topic of \
                 one partition (null keys spread one row's changes over partitions, in no order); nothing of \
                 this batch was committed. Give the table a key on the connector (`message.key.columns = \
                 \"{}:<unique columns>\"`) and replay the topic (docs/cdc.md \"Tables without a primary key\")",
                batch.topic, batch.partition, change.table, batch.partition, change.table
            )),
        ));
    }
    Some(crate::model::apply_error::ApplyError::Fatal(
        crate::error::Error::Schema(format!(
            "keyless source table at {}/{} offset {offset}: the change of {} has a null Kafka key (a table \
             without a primary key), so row projection `{projection}` cannot tell its rows apart — identical \
             rows would merge and a delete would remove every copy; the partition stops here and nothing of \
             this batch was committed. Give the table a key: a primary key at the source, or \
             `message.key.columns = \"{}:<unique columns>\"` on the Debezium connector (then replay the \
             topic); or, when the projection's `key` columns are unique at the source and the topic has one \
             partition, set keyless = \"key\" on the projection and restart (docs/cdc.md \"Tables without a \
             primary key\")",
            batch.topic, batch.partition, change.table, change.table
        )),
    ))
}

/// Where the batch is: for the conflicts table.
pub struct Coordinates<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Consumer group.
    pub group: &'a str,
    /// The event day (`partition-by`) of each record of the batch by offset; empty without `partition-by`.
    pub days: &'a std::collections::HashMap<i64, chrono::NaiveDate>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DecimalHandling;
    use crate::decode::debezium::Cell;
    use crate::ident::Ident;
    use crate::projection::row::types::{ColumnSpec, SqlType};

    fn shape(cols: &[(&str, &str)], extra: bool) -> Shape {
        let mut columns: Vec<ColumnSpec> = cols
            .iter()
            .map(|(n, t)| ColumnSpec {
                name: Ident::new(n).unwrap(),
                ty: SqlType::parse(t).unwrap(),
                unit: None,
                field: None,
            })
            .collect();
        let extra = extra.then(|| {
            columns.push(ColumnSpec {
                name: Ident::new("_extra").unwrap(),
                ty: SqlType::parse("jsonb").unwrap(),
                unit: None,
                field: None,
            });
            columns.len() - 1
        });
        Shape {
            index: 0,
            name: "accounts".into(),
            columns,
            key: vec![0],
            extra,
            added: 0,
            generated: Vec::new(),
            identity: Vec::new(),
        }
    }

    fn after(v: serde_json::Value) -> crate::decode::debezium::Row {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Cell {
                        value: v.clone(),
                        schema: None,
                    },
                )
            })
            .collect()
    }

    const COLS: &[(&str, &str)] = &[
        ("id", "bigint"),
        ("owner", "text"),
        ("loyalty_points", "numeric(12,2)"),
    ];

    /// C44: a member absent from `after` (owner dropped at the source) is not a NULL — it keeps the stored value
    /// unless `absent = "null"`; an explicit null is a NULL either way.
    #[test]
    fn absent_is_not_null() {
        let s = shape(COLS, false);
        let a = after(serde_json::json!({"id": 1, "loyalty_points": 100}));
        let keep = upsert_values(&s, AbsentPolicy::Keep, &a, DecimalHandling::String).unwrap();
        assert_eq!(
            keep,
            vec![Pg::Text("1".into()), Pg::Absent, Pg::Text("100".into())]
        );
        let null = upsert_values(&s, AbsentPolicy::Null, &a, DecimalHandling::String).unwrap();
        assert_eq!(null[1], Pg::Null);
        let explicit = after(serde_json::json!({"id": 1, "owner": null, "loyalty_points": 1}));
        let v = upsert_values(&s, AbsentPolicy::Keep, &explicit, DecimalHandling::String).unwrap();
        assert_eq!(v[1], Pg::Null);
    }

    /// C44: int → numeric(12,2) at the source: the numeric column takes the JSON number and the decimal string;
    /// a value the column cannot hold is an error naming the column (the record is quarantined).
    #[test]
    fn retyped_values_apply_or_name_the_column() {
        let s = shape(COLS, false);
        for (v, want) in [
            (serde_json::json!(100), "100"),
            (serde_json::json!("120.00"), "120.00"),
        ] {
            let a = after(serde_json::json!({"id": 1, "loyalty_points": v}));
            let got = upsert_values(&s, AbsentPolicy::Keep, &a, DecimalHandling::String).unwrap();
            assert_eq!(got[2], Pg::Text(want.into()));
        }
        let narrow = shape(
            &[
                ("id", "bigint"),
                ("points", "integer"),
                ("code", "varchar(3)"),
            ],
            false,
        );
        for (a, col) in [
            (serde_json::json!({"id": 1, "points": "120.00"}), "points"),
            (
                serde_json::json!({"id": 1, "points": 3_000_000_000i64}),
                "points",
            ),
            (serde_json::json!({"id": 1, "code": "abcd"}), "code"),
        ] {
            let e = upsert_values(
                &narrow,
                AbsentPolicy::Keep,
                &after(a.clone()),
                DecimalHandling::String,
            )
            .unwrap_err();
            assert!(e.starts_with(&format!("column `{col}`:")), "{a}: {e}");
        }
        let wide = shape(&[("id", "bigint"), ("p", "numeric(4,2)")], false);
        let e = upsert_values(
            &wide,
            AbsentPolicy::Keep,
            &after(serde_json::json!({"id": 1, "p": "123.45"})),
            DecimalHandling::String,
        )
        .unwrap_err();
        assert!(
            e.contains("column `p`") && e.contains("numeric(4,2)"),
            "{e}"
        );
        // Rounding to the scale first, as PostgreSQL does: 99.994 fits numeric(4,2), 99.995 does not.
        for (v, ok) in [("99.994", true), ("99.995", false), ("-0.5", true)] {
            let a = after(serde_json::json!({"id": 1, "p": v}));
            assert_eq!(
                upsert_values(&wide, AbsentPolicy::Keep, &a, DecimalHandling::String).is_ok(),
                ok,
                "{v}"
            );
        }
    }

    /// `new-columns = "extra"`: the members that are none of the columns, as one JSON object (NULL when none).
    #[test]
    fn new_columns_go_to_extra() {
        let s = shape(COLS, true);
        let a = after(serde_json::json!({"id": 1, "owner": "o", "tier": "gold", "flag": null}));
        let v = upsert_values(&s, AbsentPolicy::Keep, &a, DecimalHandling::String).unwrap();
        assert_eq!(v[2], Pg::Absent);
        let Pg::Text(extra) = &v[3] else {
            panic!("{v:?}")
        };
        let extra: serde_json::Value = serde_json::from_str(extra).unwrap();
        assert_eq!(extra, serde_json::json!({"tier": "gold", "flag": null}));
        let plain = after(serde_json::json!({"id": 1}));
        let v = upsert_values(&s, AbsentPolicy::Keep, &plain, DecimalHandling::String).unwrap();
        assert_eq!(v[3], Pg::Null);
    }
}
