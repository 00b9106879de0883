//! `verify diff`'s per-row accounting (issue 41 item 5): a day's net change can hide moves between its rows
//! (+1 on one customer, −1 on another), so every projection row (every group-by key of either snapshot) is
//! accounted too. When the ledger holds every group-by field, each row's change must be what the ledger claims
//! of its own key added since the first snapshot (every group, the backfill's included); otherwise each row is
//! held within what its day's claims allow: no change on a day without new claims, and for a counter no more
//! than the day's claims added or removed.

use std::collections::{BTreeMap, BTreeSet};

use bigdecimal::{BigDecimal, Zero};

use super::{num, Claims, Snapshot};

/// One projection row whose change its ledger claims do not explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMismatch {
    /// The group-by values joined with `|` (as in [`Snapshot::rows`]).
    pub key: String,
    /// Its day (`?` when neither snapshot has the row).
    pub day: String,
    /// The column's change (decimal text).
    pub changed_by: String,
    /// What its claims explain (decimal text, or a range `lo..hi`).
    pub explained: String,
    /// Why it is a mismatch.
    pub reason: String,
}

/// The rows of `before` and `after` that their claims do not explain. `day_deltas`: per day and group, the
/// ledger claims added since `before` (the backfill's group included).
pub(super) fn check(
    before: &Snapshot,
    after: &Snapshot,
    day_deltas: &BTreeMap<String, BTreeMap<String, Claims>>,
) -> Vec<RowMismatch> {
    let keys: BTreeSet<&String> = before.rows.keys().chain(after.rows.keys()).collect();
    let mut out = Vec::new();
    let claims = before.row_claims.as_ref().zip(after.row_claims.as_ref());
    let mut keys: Vec<&String> = keys.into_iter().collect();
    if let Some((b, a)) = claims {
        // A key claimed (or no longer claimed) without a row: an exact projection lost it.
        let extra: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
        keys.extend(extra.into_iter().filter(|k| {
            !before.rows.contains_key(*k) && !after.rows.contains_key(*k) && a.get(*k) != b.get(*k)
        }));
    }
    for k in keys {
        let day = after
            .days
            .get(k)
            .or_else(|| before.days.get(k))
            .cloned()
            .unwrap_or_else(|| "?".to_string());
        let value = |s: &Snapshot| s.rows.get(k).map_or_else(BigDecimal::zero, |v| num(v));
        let change = value(after) - value(before);
        let verdict = match claims {
            Some((b, a)) => by_own_claims(before, b.get(k), a.get(k), &change),
            None => by_day(before, day_deltas.get(&day), &change),
        };
        if let Some((explained, reason)) = verdict {
            out.push(RowMismatch {
                key: k.clone(),
                day,
                changed_by: change.normalized().to_plain_string(),
                explained,
                reason,
            });
        }
    }
    out
}

/// Per group: the claims added since the first snapshot (rows, and the sum when the ledger holds the field).
fn added(
    b: Option<&BTreeMap<String, Claims>>,
    a: Option<&BTreeMap<String, Claims>>,
) -> Vec<(i64, Option<BigDecimal>)> {
    let empty = BTreeMap::new();
    let (b, a) = (b.unwrap_or(&empty), a.unwrap_or(&empty));
    let groups: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    groups
        .into_iter()
        .map(|g| {
            let (cb, ca) = (b.get(g), a.get(g));
            let rows = ca.map_or(0, |c| c.rows) - cb.map_or(0, |c| c.rows);
            let sum = |c: Option<&Claims>| c.and_then(|c| c.sum.as_deref()).map(num);
            let held = ca.or(cb).is_some_and(|c| c.sum.is_some());
            let part = held.then(|| sum(ca).unwrap_or_default() - sum(cb).unwrap_or_default());
            (rows, part)
        })
        .filter(|(rows, part)| *rows != 0 || part.as_ref().is_some_and(|p| !p.is_zero()))
        .collect()
}

/// A row against the claims of its own key: `Some((explained, reason))` when they do not explain its change.
fn by_own_claims(
    before: &Snapshot,
    b: Option<&BTreeMap<String, Claims>>,
    a: Option<&BTreeMap<String, Claims>>,
    change: &BigDecimal,
) -> Option<(String, String)> {
    let parts: Vec<Option<BigDecimal>> = added(b, a)
        .into_iter()
        .map(|(rows, sum)| match before.kind.as_str() {
            "sum" => sum,
            _ => Some(BigDecimal::from(rows)),
        })
        .collect();
    if parts.is_empty() {
        return (!change.is_zero()).then(|| {
            (
                "0".to_string(),
                "MISMATCH: changed, and no ledger claim of this row since the snapshot".to_string(),
            )
        });
    }
    // The day's line already says UNACCOUNTED when a sum's field is not in the ledger.
    let parts: Vec<BigDecimal> = parts.into_iter().collect::<Option<_>>()?;
    if before.exact {
        let e: BigDecimal = parts.iter().sum();
        return (*change != e).then(|| {
            (
                e.normalized().to_plain_string(),
                format!(
                    "MISMATCH: {} unexplained by this row's ledger claims",
                    (change - &e).normalized()
                ),
            )
        });
    }
    if before.kind == "sum" {
        return None; // UNACCOUNTED on the day's line: the projection decides which claims add.
    }
    bounded(&parts, change)
}

/// A counter row whose claims may each add nothing or their part: the change must lie between the negative and
/// the positive parts.
fn bounded(parts: &[BigDecimal], change: &BigDecimal) -> Option<(String, String)> {
    let lo: BigDecimal = parts.iter().filter(|p| **p < BigDecimal::zero()).sum();
    let hi: BigDecimal = parts.iter().filter(|p| **p > BigDecimal::zero()).sum();
    (*change < lo || *change > hi).then(|| {
        (
            format!("{}..{}", lo.normalized(), hi.normalized()),
            "MISMATCH: beyond what the ledger claims of its day can change".to_string(),
        )
    })
}

/// A row when the ledger does not hold every group-by field: a day without new claims leaves each of its rows
/// unchanged; a counter's row changes by no more than its day's claims added (or removed).
fn by_day(
    before: &Snapshot,
    deltas: Option<&BTreeMap<String, Claims>>,
    change: &BigDecimal,
) -> Option<(String, String)> {
    let rows: Vec<i64> = deltas
        .map(|d| d.values().map(|c| c.rows).filter(|r| *r != 0).collect())
        .unwrap_or_default();
    if rows.is_empty() {
        return (!change.is_zero()).then(|| {
            (
                "0".to_string(),
                "MISMATCH: changed, and no ledger claim of its day since the snapshot".to_string(),
            )
        });
    }
    if before.kind == "sum" {
        return None;
    }
    let parts: Vec<BigDecimal> = rows.into_iter().map(BigDecimal::from).collect();
    bounded(&parts, change)
}

/// The rows part of the printed table: how rows were compared, then each row that differs (the first 100).
pub(super) fn table(before: &Snapshot, after: &Snapshot, rows: &[RowMismatch]) -> String {
    let keys: BTreeSet<&String> = before.rows.keys().chain(after.rows.keys()).collect();
    let how = if before.ledger_lacks.is_empty() {
        "each against the ledger claims of its own key".to_string()
    } else {
        format!(
            "each within its day's ledger claims only — the ledger does not hold {} (a new ledger with it in \
             [ledger] columns accounts every row exactly)",
            before.ledger_lacks.join(", ")
        )
    };
    let mut out = format!(
        "rows: {} compared (every group-by key of either snapshot), {how}; {} differ\n",
        keys.len(),
        rows.len()
    );
    if rows.is_empty() {
        return out;
    }
    let esc = crate::printable::escape_controls;
    let w = rows
        .iter()
        .map(|r| esc(&r.key).len())
        .max()
        .unwrap_or(0)
        .max(12);
    out += &format!("{:<w$} {:>12} {:>12}\n", "row", "changed by", "explained");
    for r in rows.iter().take(100) {
        out += &format!(
            "{:<w$} {:>12} {:>12}   {}\n",
            esc(&r.key),
            r.changed_by,
            r.explained,
            r.reason
        );
    }
    if rows.len() > 100 {
        out += &format!("… and {} more row(s)\n", rows.len() - 100);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(kind: &str, rows: &[(&str, &str)], claims: Option<&[(&str, i64, &str)]>) -> Snapshot {
        let mut s: Snapshot = serde_json::from_value(serde_json::json!({
            "config": "p.toml", "pipeline": "f", "table": "t", "qualified": "s.t", "column": "n", "kind": kind,
            "filter": null, "taken_at": "", "rows": {}, "days": {}, "exact": true, "ledger": {}
        }))
        .unwrap();
        for (k, v) in rows {
            s.rows.insert(k.to_string(), v.to_string());
            s.days.insert(k.to_string(), "2024-04-25".to_string());
        }
        s.row_claims = claims.map(|c| {
            let mut m: BTreeMap<String, BTreeMap<String, Claims>> = BTreeMap::new();
            for (k, n, sum) in c {
                m.entry(k.to_string()).or_default().insert(
                    "prod".to_string(),
                    Claims {
                        rows: *n,
                        sum: Some(sum.to_string()),
                        generations: Vec::new(),
                    },
                );
            }
            m
        });
        if claims.is_none() {
            s.ledger_lacks = vec!["customer_id".into()];
        }
        s
    }

    #[test]
    fn a_move_between_two_rows_of_a_day_is_named_row_by_row() {
        let c = [("d|a", 2, "25"), ("d|b", 2, "25")];
        let before = snap("sum", &[("d|a", "25"), ("d|b", "25")], Some(&c));
        let moved = snap("sum", &[("d|a", "75"), ("d|b", "-25")], Some(&c));
        let m = check(&before, &moved, &BTreeMap::new());
        assert_eq!(
            m.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["d|a", "d|b"]
        );
        assert_eq!(m[0].changed_by, "50");
        // One claim more on d|a explains +12.5 there only.
        let c2 = [("d|a", 3, "37.5"), ("d|b", 2, "25")];
        let ok = snap("sum", &[("d|a", "37.5"), ("d|b", "25")], Some(&c2));
        assert!(check(&before, &ok, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn without_row_claims_a_counter_row_stays_within_its_days_claims() {
        let before = snap("counter", &[("d|a", "5"), ("d|b", "5")], None);
        let moved = snap("counter", &[("d|a", "6"), ("d|b", "4")], None);
        let m = check(&before, &moved, &BTreeMap::new());
        assert_eq!(m.len(), 2, "no claims: both rows named");
        let mut d = BTreeMap::new();
        d.entry("2024-04-25".to_string())
            .or_insert_with(BTreeMap::new)
            .insert(
                "bf".to_string(),
                Claims {
                    rows: 1,
                    sum: None,
                    generations: Vec::new(),
                },
            );
        let m = check(&before, &moved, &d);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(
            (m[0].key.as_str(), m[0].explained.as_str()),
            ("d|b", "0..1")
        );
    }
}
