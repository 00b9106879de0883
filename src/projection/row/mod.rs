//! `[[projection]] kind = "row"`: a version-guarded row-state table. In the batch transaction: the changes a batch newly claimed are grouped per entity, ordered
//! by version, folded against the stored state (read `FOR UPDATE`), and written once per entity.
//!
//! Rules (docs/cdc.md "Debezium CDC to a table"):
//! - an upsert applies only when its version is strictly newer than the stored one (live row or tombstone);
//! - a delete leaves a tombstone `(key, _version, _deleted_at)` so an older write can never resurrect the row;
//! - an equal version with the same row state is a duplicate; with a different state it is a conflict, recorded in
//!   `replaysafe_conflicts`, the row holding the version's one winner — judged by what the projection claimed at
//!   that version (`history`), stored now or not, so the outcome does not depend on arrival order;
//! - a strictly newer version with the same row state only moves the stored version: the record is landed (a
//!   snapshot read of an unchanged row is a duplicate);
//! - each batch first locks its entities (transaction-scoped advisory locks, in one global order), so concurrent
//!   batches of other partitions apply one entity's changes one transaction at a time;
//! - Debezium's unchanged-TOAST placeholder keeps the stored value (or the last real value earlier in the batch).
//!   For a primary-key change's new key it takes the values the old key's delete at the same LSN removed; until
//!   that delete is applied the column waits (NULL, marked in `_unresolved`), whichever partition comes first.

mod canon;
pub mod change;
pub mod convert;
pub mod evolve;
pub mod fold;
mod guard;
pub mod history;
pub mod plan;
mod redelivery;
pub mod state;
pub mod statements;
pub mod superseded;
pub mod table;
pub mod types;
pub mod write;

pub use change::{
    from_change, leave_filter, matches, ChangeKind, Coordinates, Reach, RowChange, RowResult,
};
pub use fold::apply;
pub use plan::{Keyless, RowPlan, TombstoneMode, TruncatePolicy, VersionPlan};
pub use statements::{prepare, Prepared, MAX_ENTITY_LOCKS};
pub use table::{conflicts_table, create_conflicts, resolve, setup, Shape, CONFLICTS, TRUNCATES};
pub use types::{ColumnSpec, Kind, SqlType, Unit};

use std::collections::{BTreeSet, HashMap, HashSet};

use tokio_postgres::Transaction;

use crate::config::Pipeline;
use crate::decode::json::Fields;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Outcome, Pending};
use crate::projection::row::convert::Pg;
use crate::projection::Reads;

/// Step 3a of the batch transaction: row projections first. Staleness is a row projection's judgement about its
/// own table, not a verdict on the event: a claimed change older than the stored state (stale) or at its version
/// with another state (conflict) keeps that outcome in the tally, but stays in `landed`, so every other
/// projection (counter, sum, outbox, sql) sees it exactly once whatever its version and arrival order (docs/reference.md
/// "Accounting"). A redelivery that every row projection it reached already holds (the same state at its
/// version, "holds" being what the projection claimed at that version, [`history`], whatever it stores now; or a
/// snapshot read of the stored state) is a *copy*: it reaches only the other projections it gives values no
/// earlier claim of the state gave them ([`RowResult::Copied`]: `_skip` in `pg_temp.landed` names the others),
/// and one that reaches none ([`RowResult::Same`]) is a duplicate, taken out of `landed` (and
/// `pg_temp.landed`). With several row projections, a projection is left out when any row projection the record
/// reached remembers giving it those values ([`remembered`]). A Debezium change whose delivery key was already claimed is judged the
/// same way (module `redelivery`): a different state makes it a conflict (it never reaches the other projections:
/// its key was claimed once). Returns the outcomes that differ from `landed`.
///
/// # Errors
/// As [`classify`]; [`ApplyError::Record`] for a value a row projection cannot convert.
pub async fn apply_rows(
    tx: &Transaction<'_>,
    rows: &[Prepared],
    p: &Pipeline,
    group: &str,
    batch: &Batch,
    landed: &mut HashSet<i64>,
) -> std::result::Result<HashMap<i64, Outcome>, ApplyError> {
    let mut overrides: HashMap<i64, Outcome> = HashMap::new();
    if !rows.is_empty() && (!landed.is_empty() || redelivery::any(batch, landed)) {
        let mut best: HashMap<i64, RowResult> = HashMap::new();
        let mut skips: HashMap<i64, BTreeSet<usize>> = HashMap::new();
        let days = event_days(p, batch);
        let at = Coordinates {
            topic: &batch.topic,
            partition: batch.partition,
            group,
            days: &days,
        };
        if let Some(stop) = unread_table(p, batch, landed) {
            return Err(stop);
        }
        warn_unmatched_tables(p, batch);
        for rp in rows {
            let proj = &p.projections[rp.shape.index];
            let changes = row_changes(p, rp, batch, landed)?;
            let changes = redelivery::with_redeliveries(p, rp, batch, landed, changes)?;
            let mut results = apply(tx, rp, proj, changes, &at).await?;
            redelivery::settle(&mut results, landed, &mut overrides);
            for (o, r) in results {
                skips.entry(o).or_default().extend(remembered(p, &r));
                let merged = match best.remove(&o) {
                    Some(e) => strongest(e, r),
                    None => r,
                };
                best.insert(o, merged);
            }
        }
        // A projection does not get a record when some row projection it reached remembers giving it those values
        // for that change; a record that no row projection changed and that is left with no projection is a
        // duplicate.
        let mut copies: (Vec<i64>, Vec<String>) = (Vec::new(), Vec::new());
        let mut gone: Vec<i64> = Vec::new();
        let passes = claim_passes(batch, &best);
        for (o, r) in &best {
            let skip = skips.remove(o).unwrap_or_default();
            let copy = matches!(r, RowResult::Same | RowResult::Copied(_));
            if copy && reached(p, &passes, *o).iter().all(|i| skip.contains(i)) {
                overrides.insert(*o, Outcome::Duplicate);
                gone.push(*o);
                continue;
            }
            match r {
                RowResult::Stale => {
                    overrides.insert(*o, Outcome::Stale { conflict: false });
                }
                RowResult::Conflict => {
                    overrides.insert(*o, Outcome::Stale { conflict: true });
                }
                _ => {}
            }
            if !skip.is_empty() {
                copies.0.push(*o);
                let ids: Vec<String> = skip.iter().map(usize::to_string).collect();
                copies.1.push(format!("{{{}}}", ids.join(",")));
            }
        }
        if !gone.is_empty() {
            tx.execute(
                "DELETE FROM pg_temp.landed WHERE _offset = ANY($1)",
                &[&gone],
            )
            .await
            .map_err(|e| classify(e, false))?;
            for o in gone {
                landed.remove(&o);
            }
        }
        if !copies.0.is_empty() {
            tx.execute(
                "UPDATE pg_temp.landed l SET _skip = u.s::pg_catalog.int4[] \
                 FROM unnest($1::pg_catalog.int8[], $2::pg_catalog.text[]) AS u(o, s) \
                 WHERE l._offset = u.o",
                &[&copies.0, &copies.1],
            )
            .await
            .map_err(|e| classify(e, false))?;
        }
    }
    Ok(overrides)
}

/// The event day (`partition-by`) of each claim of `batch`, by offset: what the row projections' history keeps
/// for the prune ([`history`]).
fn event_days(p: &Pipeline, batch: &Batch) -> HashMap<i64, chrono::NaiveDate> {
    if p.identity.partition_by.is_none() {
        return HashMap::new();
    }
    batch
        .items
        .iter()
        .filter_map(|it| match &it.pending {
            Pending::Claim { fields, .. } => {
                crate::decode::partition_day(p, fields).map(|d| (it.offset, d))
            }
            _ => None,
        })
        .collect()
}

/// Of two row-projection results for one record, the one that decides its outcome: `Same` only when both are
/// (a record is a duplicate only when every row projection it reached already holds it); two copies' reaches are
/// merged (which projections it is left out of is [`remembered`]'s).
fn strongest(a: RowResult, b: RowResult) -> RowResult {
    use RowResult::*;
    let rank = |r: &RowResult| match r {
        Applied => 4,
        Unchanged => 3,
        Conflict => 2,
        Stale => 1,
        Copied(_) => 0,
        Same => -1,
    };
    match (a, b) {
        (Copied(mut x), Copied(y)) => {
            x.extend(y);
            x.sort_unstable();
            x.dedup();
            Copied(x)
        }
        (a, b) if rank(&a) >= rank(&b) => a,
        (_, b) => b,
    }
}

/// The projections other than `row` that row-projection result `r` says already got the record's values for
/// its change: all of them for [`RowResult::Same`], those a [`RowResult::Copied`] does not reach; none otherwise.
fn remembered(p: &Pipeline, r: &RowResult) -> Vec<usize> {
    let others = p
        .projections
        .iter()
        .enumerate()
        .filter(|(_, x)| x.reads.is_some())
        .map(|(i, _)| i);
    match r {
        RowResult::Same => others.collect(),
        RowResult::Copied(reaches) => others.filter(|i| !reaches.contains(i)).collect(),
        _ => Vec::new(),
    }
}

/// The filter results of `batch`'s claims by offset, when `best` holds a copy ([`reached`] reads them).
fn claim_passes<'a>(batch: &'a Batch, best: &HashMap<i64, RowResult>) -> HashMap<i64, &'a [bool]> {
    if !best
        .values()
        .any(|r| matches!(r, RowResult::Same | RowResult::Copied(_)))
    {
        return HashMap::new();
    }
    batch
        .items
        .iter()
        .filter_map(|it| match &it.pending {
            Pending::Claim { passes, .. } => Some((it.offset, passes.as_slice())),
            _ => None,
        })
        .collect()
}

/// The projections other than `row` the claim at `offset` reaches (passes their filter); `passes` from
/// [`claim_passes`].
fn reached(p: &Pipeline, passes: &HashMap<i64, &[bool]>, offset: i64) -> Vec<usize> {
    passes
        .get(&offset)
        .map(|ps| passing(p, ps).map(|(i, _)| i).collect())
        .unwrap_or_default()
}

/// The projections other than `row` whose filter a record with filter results `passes` passes, with what each
/// reads: `(index, reads)`.
fn passing<'a>(
    p: &'a Pipeline,
    passes: &'a [bool],
) -> impl Iterator<Item = (usize, &'a Reads)> + 'a {
    p.projections.iter().enumerate().filter_map(move |(i, x)| {
        let reads = x.reads.as_ref()?;
        x.pass_column
            .is_none_or(|pc| passes.get(pc).copied().unwrap_or(false))
            .then_some((i, reads))
    })
}

/// The tables a row projection writes, qualified SQL text: its table, its tombstone table (`tombstones =
/// "table"`), and the pipeline's conflict, version-history and truncate tables it shares with the other row
/// projections.
pub fn tables(r: &RowPlan, p: &Pipeline) -> Vec<String> {
    let mut out = vec![r.table.to_string()];
    if r.tombstones == TombstoneMode::Table {
        out.push(r.tombstone_table.to_string());
    }
    out.extend([
        p.table(CONFLICTS).to_string(),
        p.table(history::VERSIONS).to_string(),
        p.table(TRUNCATES).to_string(),
    ]);
    out
}

/// A change claimed in this batch whose source table no row projection reads, in a pipeline of row projections
/// only: it would be claimed and reach nothing — a `source-table` typo looks like this (everything lands, the
/// replica stays empty, and the corrected file then finds the claims and skips them as duplicates). Stops the
/// partition (exit 2, nothing of the batch committed, the checkpoint before it) naming the table seen, its
/// coordinates, the tables the projections read and the ways out. With another kind of projection in the
/// pipeline such a change is claimed for it (and logged once, [`warn_unmatched_tables`]).
fn unread_table(p: &Pipeline, batch: &Batch, landed: &HashSet<i64>) -> Option<ApplyError> {
    if p.projections.iter().any(|x| x.row.is_none()) {
        return None;
    }
    let it = batch.items.iter().find(|it| {
        landed.contains(&it.offset)
            && matches!(&it.pending, Pending::Claim { change: Some(ch), .. }
                if !p.projections.iter().any(|x| x.row.as_ref().is_some_and(|r| matches(r, &r.table, ch))))
    })?;
    let Pending::Claim {
        change: Some(ch), ..
    } = &it.pending
    else {
        return None;
    };
    let read: Vec<String> = p
        .projections
        .iter()
        .filter_map(|x| {
            x.row.as_ref().map(|r| {
                r.source_table
                    .clone()
                    .unwrap_or_else(|| format!("*.{}", r.table.name.as_str()))
            })
        })
        .collect();
    Some(ApplyError::Fatal(crate::error::Error::Schema(format!(
        "{}/{} offset {}: a change of source table {} reaches no projection: the row projections read {} \
         (`source-table`, or the table's name). Nothing of this batch was committed. Fix `source-table` if it is \
         misspelled; if changes of {} are not wanted, drop them with a named [[filter]] rule (counted `filtered`) \
         or leave them out of the connector's table.include.list",
        batch.topic,
        batch.partition,
        it.offset,
        ch.table,
        read.join(", "),
        ch.table
    ))))
}

/// Logs once per source table when Debezium changes reach no row projection (a `source-table` typo looks like
/// this: everything lands, the table stays empty).
fn warn_unmatched_tables(p: &Pipeline, batch: &Batch) {
    static WARNED: std::sync::OnceLock<std::sync::Mutex<HashSet<String>>> =
        std::sync::OnceLock::new();
    // Tables already looked at in this batch: the shared set is locked once per table, not per record.
    let mut seen: HashSet<&str> = HashSet::new();
    for it in &batch.items {
        let Pending::Claim {
            change: Some(ch), ..
        } = &it.pending
        else {
            continue;
        };
        if !seen.insert(ch.table.as_str()) {
            continue;
        }
        let matched = p
            .projections
            .iter()
            .any(|proj| proj.row.as_ref().is_some_and(|r| matches(r, &r.table, ch)));
        if !matched {
            let mut w = WARNED
                .get_or_init(Default::default)
                .lock()
                .expect("warned set: a thread panicked holding this lock");
            if w.insert(ch.table.clone()) {
                tracing::warn!(
                    source_table = %ch.table,
                    topic = %batch.topic,
                    partition = batch.partition,
                    offset = it.offset,
                    "changes of this source table reach no row projection (check `source-table`); they are claimed \
                     and reach the other projections only"
                );
            }
        }
    }
}

/// `schema-drift = "strict"`: the partition stops (nothing of the batch committed; the checkpoint stays before
/// it) with an error naming the field, topic/partition/offset and the way out. Exit code 2 (a source schema that
/// does not match the pipeline).
fn drift_stop(batch: &Batch, offset: i64, projection: &str, what: &str) -> ApplyError {
    ApplyError::Fatal(crate::error::Error::Schema(format!(
        "schema drift at {}/{} offset {offset}: {what}; row projection `{projection}` has schema-drift = \"strict\", \
         so the partition stops here and nothing of this batch was committed. Set schema-drift = \"lenient\" \
         (absent and new-columns then decide) and restart, or change the projection (docs/replay.md \"Change a running \
         pipeline\")",
        batch.topic, batch.partition
    )))
}

/// The delivery key of a claimed record as a JSON array text: generation, then the identity key fields.
fn delivery_text(p: &Pipeline, fields: &crate::decode::Fields) -> String {
    let mut v = vec![serde_json::Value::String(
        p.identity.generation.clone().unwrap_or_default(),
    )];
    for &i in &p.identity.key {
        v.push(
            fields[i]
                .as_ref()
                .map(|f| serde_json::Value::String(f.text.clone()))
                .unwrap_or(serde_json::Value::Null),
        );
    }
    serde_json::Value::Array(v).to_string()
}

/// The changes of `batch` that row projection `rp` takes: newly claimed, of its source table (Debezium) — in
/// offset order. Its `filter`: JSON events that fail it do not reach it; a Debezium change whose row fails it
/// becomes a delete of the row (the filter says which rows belong in the table).
pub(super) fn row_changes(
    p: &Pipeline,
    rp: &Prepared,
    batch: &Batch,
    landed: &HashSet<i64>,
) -> std::result::Result<Vec<RowChange>, ApplyError> {
    let proj = &p.projections[rp.shape.index];
    let plan = proj
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let mut out = Vec::new();
    for it in &batch.items {
        let Pending::Claim {
            fields,
            passes,
            change,
            deletes,
        } = &it.pending
        else {
            continue;
        };
        if !landed.contains(&it.offset) {
            continue;
        }
        let in_filter = proj
            .pass_column
            .is_none_or(|pc| passes.get(pc).copied().unwrap_or(false));
        let delivery = delivery_text(p, fields);
        match change {
            Some(ch) => {
                if !matches(plan, &plan.table, ch) {
                    continue;
                }
                if let Some(stop) = change::keyless_stop(plan, &proj.name, ch, batch, it.offset) {
                    return Err(stop);
                }
                if let Some(what) = ch
                    .after
                    .as_ref()
                    .and_then(|a| change::drift(&rp.shape, plan, a))
                {
                    return Err(drift_stop(batch, it.offset, &proj.name, &what));
                }
                let mut rc =
                    from_change(&rp.shape, plan, it.offset, ch, delivery, p.decimal_handling)
                        .map_err(|rejection| ApplyError::Record {
                            offset: it.offset,
                            rejection,
                        })?;
                // A Debezium row projection's `filter` says which rows belong in the table: a change whose row
                // leaves it removes the row (a tombstone at the change's version); deletes and truncates always
                // apply (a delete has no `after` for the filter to pass).
                if !in_filter {
                    leave_filter(&mut rc);
                }
                if !rc.snapshot {
                    rc.reach = reaches(p, fields, passes);
                }
                out.push(rc);
            }
            None if !in_filter => continue,
            None => {
                let text = |i: usize| fields[i].as_ref().map(|f| f.text.clone());
                let key = rp
                    .shape
                    .key
                    .iter()
                    .map(|&k| {
                        text(rp.shape.columns[k].field.expect("json column")).unwrap_or_default()
                    })
                    .collect();
                let version = match plan.version {
                    VersionPlan::Field(i) => {
                        vec![text(i)
                            .and_then(|t| t.parse::<i64>().ok())
                            .unwrap_or(i64::MIN)]
                    }
                    _ => vec![it.offset],
                };
                let delete = deletes.get(rp.shape.index).copied().unwrap_or(false);
                out.push(RowChange {
                    offset: it.offset,
                    key,
                    version,
                    kind: if delete {
                        ChangeKind::Delete
                    } else {
                        ChangeKind::Upsert
                    },
                    values: rp
                        .shape
                        .columns
                        .iter()
                        .map(|c| match c.field.and_then(text) {
                            Some(t) => Pg::Text(t),
                            None => Pg::Null,
                        })
                        .collect(),
                    delivery,
                    old_key: None,
                    snapshot: false,
                    position: None,
                    follows_snapshot: false,
                    incremental: false,
                    unpositioned: false,
                    redelivered: false,
                    reach: reaches(p, fields, passes),
                });
            }
        }
    }
    Ok(out)
}

/// The projections other than `row` a claimed record reaches (passes their filter), each with what it reads of
/// it ([`Reach`]): what decides whether a copy of an already claimed state reaches them.
fn reaches(p: &Pipeline, fields: &Fields, passes: &[bool]) -> Vec<Reach> {
    passing(p, passes)
        .map(|(i, reads)| Reach {
            projection: i,
            tag: match reads {
                Reads::Record => None,
                Reads::Fields(read) => Some(reach_tag(&p.projections[i].name, read, fields)),
            },
        })
        .collect()
}

/// [`Reach::tag`]: the first 16 bytes of SHA-256 over the projection's name and, per field it reads, its
/// decoded text (length-prefixed; a missing field apart), as 32 hex digits.
fn reach_tag(name: &str, read: &[usize], fields: &Fields) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    for &f in read {
        match fields.get(f).and_then(Option::as_ref) {
            Some(v) => {
                h.update([1]);
                h.update(
                    u64::try_from(v.text.len())
                        .unwrap_or(u64::MAX)
                        .to_le_bytes(),
                );
                h.update(v.text.as_bytes());
            }
            None => h.update([0]),
        }
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::{strongest, RowResult};

    #[test]
    fn a_record_is_a_duplicate_only_when_every_row_projection_says_so_and_copies_reach_the_union() {
        use RowResult::*;
        assert_eq!(strongest(Same, Same), Same);
        assert_eq!(strongest(Same, Copied(vec![2])), Copied(vec![2]));
        assert_eq!(
            strongest(Copied(vec![3, 1]), Copied(vec![2, 3])),
            Copied(vec![1, 2, 3])
        );
        assert_eq!(strongest(Copied(vec![2]), Stale), Stale);
        assert_eq!(strongest(Applied, Copied(vec![2])), Applied);
    }
}
