//! `verify diff`'s accounting: per day, the projection's change against the backfill's report and the other
//! consumer groups' claims in the ledger between the two snapshots, then every row ([`super::rows`]); the printed
//! table.

use std::collections::{BTreeMap, BTreeSet};

use bigdecimal::{BigDecimal, Zero};

use super::{num, Claims, Snapshot};
use crate::ops::backfill::Report;

/// One day whose change is not explained by the backfill's report and the other groups' claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The day.
    pub day: String,
    /// The change of the column over the day's rows (decimal text).
    pub changed_by: String,
    /// What the backfill and the other groups explain (decimal text; empty when it cannot be known).
    pub explained: String,
    /// Why it is a mismatch.
    pub reason: String,
}

/// What `verify diff` found: the days and the rows their claims do not explain, and the printed table.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Days not explained (a day with a row that differs is one, even when its rows net out).
    pub days: Vec<Mismatch>,
    /// Rows not explained.
    pub rows: Vec<super::RowMismatch>,
    /// The per-day summary table, then the rows that differ.
    pub table: String,
    /// Whether each row was accounted against the claims of its own key (the ledger holds every group-by
    /// field); false: only within its day's claims.
    pub rows_exact: bool,
}

/// One day of the table: the change, the backfill's part, each other group's part.
#[derive(Debug, Clone)]
pub struct Day {
    /// The day.
    pub day: String,
    /// The column's change over the day's rows.
    pub changed: BigDecimal,
    /// What the backfill's report says it added (counter: landed + stale — a row projection's stale verdict does
    /// not keep a record from the counter; sum: its `sums`).
    pub backfill: BigDecimal,
    /// Per other group: its new claims' part (`None`: a sum whose field the ledger does not hold), and rows.
    pub others: BTreeMap<String, (Option<BigDecimal>, i64)>,
}

/// Per day and group: the ledger claims in `after` minus those in `before` (rows, and the sum when held).
fn deltas(before: &Snapshot, after: &Snapshot) -> BTreeMap<String, BTreeMap<String, Claims>> {
    let mut out: BTreeMap<String, BTreeMap<String, Claims>> = BTreeMap::new();
    let empty = BTreeMap::new();
    let days: BTreeSet<&String> = before.ledger.keys().chain(after.ledger.keys()).collect();
    for d in days {
        let (b, a) = (
            before.ledger.get(d).unwrap_or(&empty),
            after.ledger.get(d).unwrap_or(&empty),
        );
        let groups: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
        for g in groups {
            let (cb, ca) = (
                b.get(g).cloned().unwrap_or_default(),
                a.get(g).cloned().unwrap_or_default(),
            );
            let rows = ca.rows - cb.rows;
            if rows == 0 && ca.sum == cb.sum {
                continue;
            }
            let sum = match (&ca.sum, &cb.sum) {
                (None, None) => None,
                (x, y) => Some(
                    (num(x.as_deref().unwrap_or("0")) - num(y.as_deref().unwrap_or("0")))
                        .normalized()
                        .to_plain_string(),
                ),
            };
            out.entry(d.clone()).or_default().insert(
                g.clone(),
                Claims {
                    rows,
                    sum,
                    generations: Vec::new(),
                },
            );
        }
    }
    out
}

/// Per day: the column's change over the rows of `after` and `before`.
fn changes(before: &Snapshot, after: &Snapshot) -> BTreeMap<String, BigDecimal> {
    let mut changed: BTreeMap<String, BigDecimal> = BTreeMap::new();
    for (k, v) in &after.rows {
        let d = after.days.get(k).cloned().unwrap_or_default();
        let was = before.rows.get(k).map_or_else(BigDecimal::zero, |b| num(b));
        *changed.entry(d).or_default() += num(v) - was;
    }
    for (k, v) in &before.rows {
        if !after.rows.contains_key(k) {
            let d = before.days.get(k).cloned().unwrap_or_default();
            *changed.entry(d).or_default() -= num(v);
        }
    }
    changed
}

/// Accounts every day of the two snapshots and the report: the column's change must equal what the backfill's
/// report says it added plus what the other groups' new ledger claims of that day add (counter: one per row;
/// sum: the field summed, when the ledger holds it); and the backfill group's new claims must be the report's
/// landed + stale (both reached the counter or sum); and every row must be explained by its claims
/// ([`super::rows`]: a day whose rows net out but differ is a mismatch too).
pub fn account(before: &Snapshot, after: &Snapshot, report: &Report) -> Outcome {
    let changed = changes(before, after);
    let deltas = deltas(before, after);
    let row_mismatches = super::rows::check(before, after, &deltas);
    let bf = &report.group_id;
    let mut days: BTreeSet<String> = changed.keys().cloned().collect();
    days.extend(
        report
            .per_day
            .iter()
            .filter(|(d, c)| c.landed + c.stale > 0 && *d != "unknown")
            .map(|(d, _)| d.clone()),
    );
    days.extend(deltas.keys().cloned());
    let groups: BTreeSet<String> = deltas
        .values()
        .flat_map(|g| g.keys())
        .filter(|g| *g != bf)
        .cloned()
        .collect();
    let sum_key = format!("{}.{}", before.qualified, before.column);
    let is_sum = before.kind == "sum";
    let mut rows = Vec::new();
    let mut mismatches = Vec::new();
    for d in days {
        let counts = report.per_day.get(&d).cloned().unwrap_or_default();
        let backfill = if is_sum {
            num(counts.sums.get(&sum_key).map_or("0", String::as_str))
        } else {
            BigDecimal::from(counts.landed + counts.stale)
        };
        let empty = BTreeMap::new();
        let day_deltas = deltas.get(&d).unwrap_or(&empty);
        let others = groups
            .iter()
            .filter_map(|g| {
                let c = day_deltas.get(g)?;
                let part = if is_sum {
                    c.sum.as_deref().map(num)
                } else {
                    Some(BigDecimal::from(c.rows))
                };
                Some((g.clone(), (part, c.rows)))
            })
            .collect();
        let day = Day {
            day: d.clone(),
            changed: changed.get(&d).cloned().unwrap_or_default(),
            backfill,
            others,
        };
        let claimed = day_deltas.get(bf).map_or(0, |c| c.rows);
        let reason = other_generation(after, &d, bf)
            .or_else(|| judge(&day, before, after, claimed, &counts))
            .or_else(|| rows_differ(&row_mismatches, &d));
        if let Some(reason) = &reason {
            mismatches.push(Mismatch {
                day: d,
                changed_by: day.changed.normalized().to_plain_string(),
                explained: explained(&day)
                    .map(|e| e.normalized().to_plain_string())
                    .unwrap_or_default(),
                reason: reason.clone(),
            });
        }
        rows.push((day, reason));
    }
    let mut table = table(before, after, report, &groups, &rows);
    table += &super::rows::table(before, after, &row_mismatches);
    Outcome {
        days: mismatches,
        rows: row_mismatches,
        table,
        rows_exact: before.ledger_lacks.is_empty(),
    }
}

/// `Some(reason)` when rows of `day` differ although the day's total is explained: they net out.
fn rows_differ(rows: &[super::RowMismatch], day: &str) -> Option<String> {
    let n = rows.iter().filter(|r| r.day == day).count();
    (n > 0).then(|| format!("MISMATCH: {n} row(s) of this day differ, netting out (listed below)"))
}

/// `Some(reason)` when the backfill's claims of `day` are under a stream generation that none of the day's
/// other claims (production's) are under: the ledger could not recognise those events as already counted — the
/// delivery key includes the generation — so a backfill under another generation counts them again.
fn other_generation(after: &Snapshot, day: &str, bf: &str) -> Option<String> {
    let groups = after.ledger.get(day)?;
    let ours = &groups.get(bf)?.generations;
    let theirs: BTreeSet<&String> = groups
        .iter()
        .filter(|(g, _)| *g != bf)
        .flat_map(|(_, c)| &c.generations)
        .collect();
    let foreign: Vec<&String> = ours.iter().filter(|g| !theirs.contains(g)).collect();
    if theirs.is_empty() || foreign.is_empty() {
        return None;
    }
    let names = |v: Vec<&String>| {
        v.iter()
            .map(|g| format!("'{g}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "MISMATCH: the backfill claimed under generation {} while the day's other claims are under {}: the ledger \
         cannot recognise their events as already counted (the generation is part of the delivery key) — run the \
         backfill with the production's [identity] generation",
        names(foreign),
        names(theirs.into_iter().collect())
    ))
}

/// What the backfill and the other groups explain (`None` when a group's part cannot be known).
fn explained(day: &Day) -> Option<BigDecimal> {
    let mut e = day.backfill.clone();
    for (part, _) in day.others.values() {
        e += part.clone()?;
    }
    Some(e)
}

/// `Some(reason)` when the day is not explained.
fn judge(
    day: &Day,
    before: &Snapshot,
    after: &Snapshot,
    claimed: i64,
    counts: &crate::ops::backfill::DayCounts,
) -> Option<String> {
    let in_report = crate::units::bigint(counts.landed + counts.stale);
    let seen =
        |s: &Snapshot| s.days.values().any(|x| *x == day.day) || s.ledger.contains_key(&day.day);
    if !seen(before) && !seen(after) {
        // Neither the rows nor the ledger claims of the day pass the snapshot's --where.
        return Some(
            "MISMATCH (no row of this day in either snapshot: does --where cover every day the backfill can land \
             on?)"
                .to_string(),
        );
    }
    if claimed != in_report {
        let why = if claimed < in_report {
            "was the snapshot taken after the backfill, or is the report of another run?"
        } else {
            "a resumed backfill's report covers its last session only: take the snapshot after the earlier \
             session; or the group claimed again after the report"
        };
        return Some(format!(
            "MISMATCH: the backfill's ledger claims of this day since the snapshot are {claimed}, its report says {} \
             landed + {} stale ({why})",
            counts.landed, counts.stale
        ));
    }
    let unknown: i64 = day
        .others
        .values()
        .filter(|(p, _)| p.is_none())
        .map(|(_, r)| r)
        .sum();
    let rows: i64 = day.others.values().map(|(_, r)| r).sum();
    if unknown != 0 {
        return Some(format!(
            "UNACCOUNTED: other groups claimed {unknown} row(s) of this day since the snapshot and the ledger does \
             not hold the summed field (add it to [ledger] columns to account for them)"
        ));
    }
    let e = explained(day)?;
    if !before.exact && rows != 0 && before.kind == "sum" {
        // Which of a group's claims add is the projection's to decide, and their values differ in sign: the
        // group's total bounds nothing.
        return Some(format!(
            "UNACCOUNTED: other groups claimed {rows} row(s) of this day since the snapshot, and the projection's \
             filter (or a row projection finding one a redelivery of the state it holds) decides which of them add \
             to a sum"
        ));
    }
    if !before.exact && rows != 0 {
        // The projection's filter (or a row projection finding a claim a redelivery of the state it holds: a
        // duplicate) decides whether a claim adds: each other claim adds between nothing and its part.
        let rest = &day.changed - &day.backfill;
        let lo = day
            .others
            .values()
            .filter_map(|(p, _)| p.clone())
            .filter(|p| *p < BigDecimal::zero());
        let hi = day
            .others
            .values()
            .filter_map(|(p, _)| p.clone())
            .filter(|p| *p > BigDecimal::zero());
        let (lo, hi): (BigDecimal, BigDecimal) = (lo.sum(), hi.sum());
        return (rest < lo || rest > hi).then(|| {
            format!(
                "MISMATCH: {} beyond what the other groups' claims can add",
                rest.normalized()
            )
        });
    }
    (day.changed != e).then(|| format!("MISMATCH: {} unexplained", (&day.changed - e).normalized()))
}

/// The printed table: a header line, then per day the change, the backfill's part, each other group's part,
/// what is unexplained and the verdict.
fn table(
    before: &Snapshot,
    after: &Snapshot,
    report: &Report,
    groups: &BTreeSet<String>,
    rows: &[(Day, Option<String>)],
) -> String {
    let mut out = format!(
        "{} {}.{} ({}), --where {}; snapshot at {}, diff at {} (database clock); backfill `{}` from its report, \
         other groups from their ledger claims between the two\n",
        before.kind,
        before.table,
        before.column,
        super::short(&before.pipeline),
        crate::printable::escape_controls(before.filter.as_deref().unwrap_or("(none)")),
        before.taken_at,
        after.taken_at,
        report.group_id
    );
    let width = |s: &str| s.len().max(12);
    let mut head = format!("{:<12} {:>12} {:>12}", "day", "changed by", "backfill");
    // Group names come from the ledger's rows: escaped, one line per day whatever they hold.
    for g in groups {
        let g = crate::printable::escape_controls(g);
        head += &format!(" {:>w$}", g, w = width(&g));
    }
    out += &format!("{head} {:>12}\n", "unexplained");
    let text = |d: &BigDecimal| d.normalized().to_plain_string();
    for (day, reason) in rows {
        let mut line = format!(
            "{:<12} {:>12} {:>12}",
            day.day,
            text(&day.changed),
            text(&day.backfill)
        );
        for g in groups {
            let cell = match day.others.get(g) {
                None => "0".to_string(),
                Some((Some(p), _)) => text(p),
                Some((None, r)) => format!("? ({r} rows)"),
            };
            line += &format!(
                " {:>w$}",
                cell,
                w = width(&crate::printable::escape_controls(g))
            );
        }
        let unexplained =
            explained(day).map_or_else(|| "?".to_string(), |e| text(&(&day.changed - e)));
        line += &format!(" {unexplained:>12}");
        if let Some(r) = reason {
            line += &format!("   {r}");
        }
        out += &line;
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(
        kind: &str,
        exact: bool,
        rows: &[(&str, &str, &str)],
        ledger: &[(&str, &str, i64, Option<&str>)],
    ) -> Snapshot {
        let mut s: Snapshot = serde_json::from_value(serde_json::json!({
            "config": "p.toml", "pipeline": "f", "table": "t", "qualified": "s.t", "column": "n", "kind": kind,
            "filter": null, "taken_at": "", "rows": {}, "days": {}, "exact": exact, "ledger": {},
            "ledger_lacks": ["customer_id"]
        }))
        .unwrap();
        for (k, d, v) in rows {
            s.rows.insert(k.to_string(), v.to_string());
            s.days.insert(k.to_string(), d.to_string());
        }
        for (d, g, n, sum) in ledger {
            // A group named `g@gen` claimed under generation `gen`.
            let (g, generation) = g.split_once('@').unwrap_or((g, ""));
            let c = Claims {
                rows: *n,
                sum: sum.map(str::to_string),
                generations: vec![generation.to_string()],
            };
            s.ledger
                .entry(d.to_string())
                .or_default()
                .insert(g.to_string(), c);
        }
        s
    }

    fn report(landed: u64, sum: &str) -> Report {
        serde_json::from_value(serde_json::json!({
            "group_id": "bf", "pipeline_group": "prod", "from": "", "stop": "", "filter": null, "partitions": [],
            "retention": [], "accounting": "", "dry_run": false, "pipeline": "f",
            "per_day": {"2024-04-25": {"landed": landed, "duplicate": 0, "filtered": 0, "quarantined": 0,
                                       "sums": {"s.t.n": sum}}}
        }))
        .unwrap()
    }

    const D: &str = "2024-04-25";

    #[test]
    fn production_claims_explain_the_rest_of_a_counter_and_nothing_more() {
        let before = snap("counter", true, &[("a", D, "10")], &[(D, "prod", 10, None)]);
        let after = snap(
            "counter",
            true,
            &[("a", D, "15")],
            &[(D, "prod", 12, None), (D, "bf", 3, None)],
        );
        let Outcome { days: m, table, .. } = account(&before, &after, &report(3, "0"));
        assert!(m.is_empty(), "{table}");
        assert!(table.contains("prod"), "{table}");
        // One increment more than the claims explain.
        let after = snap(
            "counter",
            true,
            &[("a", D, "16")],
            &[(D, "prod", 12, None), (D, "bf", 3, None)],
        );
        let Outcome { days: m, .. } = account(&before, &after, &report(3, "0"));
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].changed_by.as_str(), m[0].explained.as_str()),
            ("6", "5")
        );
    }

    #[test]
    fn a_filtered_sum_cannot_account_other_groups() {
        let before = snap(
            "sum",
            false,
            &[("a", D, "1.5")],
            &[(D, "prod", 1, Some("1.5"))],
        );
        let after = snap(
            "sum",
            false,
            &[("a", D, "-3.75")],
            &[(D, "prod", 2, Some("3.0")), (D, "bf", 1, Some("-5.25"))],
        );
        let Outcome { days: m, table, .. } = account(&before, &after, &report(1, "-5.25"));
        assert!(m[0].reason.starts_with("UNACCOUNTED"), "{table}");
        // Without other groups' claims it is exact again.
        let before = snap("sum", false, &[("a", D, "1.5")], &[(D, "prod", 1, None)]);
        let after = snap(
            "sum",
            false,
            &[("a", D, "-3.75")],
            &[(D, "prod", 1, None), (D, "bf", 1, None)],
        );
        assert!(account(&before, &after, &report(1, "-5.25"))
            .days
            .is_empty());
    }

    #[test]
    fn a_filtered_counter_bounds_other_groups_by_their_claims() {
        let before = snap("counter", false, &[("a", D, "10")], &[]);
        let ok = snap(
            "counter",
            false,
            &[("a", D, "14")],
            &[(D, "prod", 2, None), (D, "bf", 3, None)],
        );
        assert!(account(&before, &ok, &report(3, "0")).days.is_empty());
        let over = snap(
            "counter",
            false,
            &[("a", D, "16")],
            &[(D, "prod", 2, None), (D, "bf", 3, None)],
        );
        assert_eq!(account(&before, &over, &report(3, "0")).days.len(), 1);
    }

    #[test]
    fn a_sum_needs_the_field_in_the_ledger_for_other_groups() {
        let before = snap(
            "sum",
            true,
            &[("a", D, "1.5")],
            &[(D, "prod", 1, Some("1.5"))],
        );
        let after = snap(
            "sum",
            true,
            &[("a", D, "-2.25")],
            &[(D, "prod", 2, Some("3.0")), (D, "bf", 1, Some("-5.25"))],
        );
        assert!(account(&before, &after, &report(1, "-5.25"))
            .days
            .is_empty());
        let before = snap("sum", true, &[("a", D, "1.5")], &[(D, "prod", 1, None)]);
        let after = snap(
            "sum",
            true,
            &[("a", D, "-2.25")],
            &[(D, "prod", 2, None), (D, "bf", 1, None)],
        );
        let Outcome { days: m, table, .. } = account(&before, &after, &report(1, "-5.25"));
        assert!(m[0].reason.starts_with("UNACCOUNTED"), "{table}");
        assert!(table.contains("? (1 rows)"), "{table}");
    }

    #[test]
    fn backfill_claims_must_be_its_report() {
        let before = snap("counter", true, &[("a", D, "13")], &[(D, "bf", 3, None)]);
        let after = before.clone();
        let Outcome { days: m, .. } = account(&before, &after, &report(3, "0"));
        assert!(
            m[0].reason.contains("snapshot taken after the backfill"),
            "{m:?}"
        );
        // More claims than the report: a resumed backfill's report against a snapshot before its first session.
        let before = snap("counter", true, &[("a", D, "10")], &[]);
        let after = snap("counter", true, &[("a", D, "15")], &[(D, "bf", 5, None)]);
        let Outcome { days: m, .. } = account(&before, &after, &report(3, "0"));
        assert!(m[0].reason.contains("resumed backfill"), "{m:?}");
    }

    #[test]
    fn a_backfill_under_another_generation_than_production_is_a_mismatch() {
        let before = snap(
            "counter",
            true,
            &[("a", D, "10")],
            &[(D, "prod@a", 10, None)],
        );
        let after = snap(
            "counter",
            true,
            &[("a", D, "13")],
            &[(D, "prod@a", 10, None), (D, "bf@b", 3, None)],
        );
        let Outcome { days: m, table, .. } = account(&before, &after, &report(3, "0"));
        assert!(m[0].reason.contains("generation 'b'"), "{table}");
        let after = snap(
            "counter",
            true,
            &[("a", D, "13")],
            &[(D, "prod@a", 10, None), (D, "bf@a", 3, None)],
        );
        assert!(account(&before, &after, &report(3, "0")).days.is_empty());
    }
}
