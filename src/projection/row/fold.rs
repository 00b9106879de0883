//! Folding a batch's row changes per entity against the stored state (read `FOR UPDATE`) and writing each entity
//! once: the row projection's apply.

use std::collections::{HashMap, HashSet};

use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::change::Coordinates;
use super::change::{ChangeKind, RowChange, RowResult};
use super::guard::{judge, judge_redelivered, keep_last, take_winner, Guard};
use super::history::{History, Seen};
use super::plan::{RowPlan, TombstoneMode, TruncatePolicy, VersionPlan};
use super::state::{
    compare, entity, follow, hash, kept_since, place, version_text, State, Unresolved,
};
use super::statements::{lock_entities, pg_err, Params, Prepared};
use super::table::Shape;
use super::write::{write_conflicts, write_dead, write_live, Conflict};
use crate::error::Error;
use crate::model::apply_error::ApplyError;
use crate::projection::row::convert::Pg;
use crate::projection::ProjectionPlan;

/// Applies a row projection's changes (in offset order; truncates split the batch) and returns each change's
/// result by offset.
///
/// # Errors
/// [`ApplyError`] from PostgreSQL, or `Fatal` for a truncate under `truncate = "stop"`.
pub async fn apply(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    proj: &ProjectionPlan,
    mut changes: Vec<RowChange>,
    at: &Coordinates<'_>,
) -> std::result::Result<HashMap<i64, RowResult>, ApplyError> {
    let plan = proj
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let mut results = HashMap::new();
    if changes.is_empty() {
        return Ok(results);
    }
    // One form for every value judged or written: PostgreSQL's output of it as its column's type.
    super::canon::canonicalise(tx, prepared, &mut changes).await?;
    let truncates = plan.truncate == TruncatePolicy::Truncate
        && changes.iter().any(|c| c.kind == ChangeKind::Truncate);
    // New keys waiting for the values a delete of this batch removes are locked with the batch's own entities.
    let waiting = waiting_on(tx, prepared, &changes).await?;
    let exclusive = lock_entities(tx, prepared, &changes, &waiting, truncates).await?;
    let locked = Locked {
        exclusive,
        keys: changes
            .iter()
            .flat_map(|c| std::iter::once(&c.key).chain(c.old_key.as_ref()))
            .chain(&waiting)
            .cloned()
            .collect(),
    };
    let mut segment: Vec<RowChange> = Vec::new();
    for c in changes {
        if c.kind == ChangeKind::Truncate {
            fold_segment(
                tx,
                prepared,
                proj,
                std::mem::take(&mut segment),
                at,
                &locked,
                &mut results,
            )
            .await?;
            match plan.truncate {
                TruncatePolicy::Stop => {
                    return Err(ApplyError::Fatal(Error::Other(format!(
                        "{}/{} offset {}: TRUNCATE of the source table (Debezium op=t) reached row projection `{}`, \
                         whose policy is truncate = \"stop\"; nothing of this batch was committed. Set truncate = \
                         \"truncate\" (tombstone every older row) or \"ignore\" and restart",
                        at.topic, at.partition, c.offset, proj.name
                    ))))
                }
                TruncatePolicy::Ignore => {
                    results.insert(c.offset, RowResult::Applied);
                }
                TruncatePolicy::Truncate => {
                    // Ordered by its source position (also under a version column: a truncate has no version).
                    let at_pos = version_text(c.position.as_deref().unwrap_or(&c.version));
                    tx.execute(
                        &prepared.mark_truncate,
                        &[&proj.name, &at_pos, &at.topic, &at.partition, &c.offset],
                    )
                    .await
                    .map_err(pg_err)?;
                    let n = tx
                        .execute(&prepared.truncate, &[&at_pos, &c.delivery])
                        .await
                        .map_err(pg_err)?;
                    if let Some(st) = &prepared.truncate_tombs {
                        tx.execute(st, &[&at_pos]).await.map_err(pg_err)?;
                    }
                    tracing::info!(projection = %proj.name, topic = at.topic, partition = at.partition, offset = c.offset, rows = n, "truncate applied");
                    results.insert(c.offset, RowResult::Applied);
                }
            }
        } else {
            segment.push(c);
        }
    }
    fold_segment(tx, prepared, proj, segment, at, &locked, &mut results).await?;
    Ok(results)
}

/// The entities a batch locked: its changes' keys, the old keys of primary-key changes and the new keys waiting
/// for one of its deletes (`exclusive`: the table lock covers every entity).
struct Locked {
    exclusive: bool,
    keys: HashSet<Vec<String>>,
}

/// The change LSN of a change with a source position (its last element; a primary-key change's delete of the old
/// key and create of the new key share it).
/// The slot of a fetched row: its `WITH ORDINALITY` number (from 1) less one.
fn ordinal(ord: i64) -> usize {
    usize::try_from(ord - 1).expect("WITH ORDINALITY numbers from 1")
}

fn lsn(c: &RowChange) -> Option<i64> {
    c.position.as_ref().and_then(|p| p.last().copied())
}

/// The keys of the live rows whose `_unresolved` columns wait for a key that `changes` delete (at a source
/// position), read without a lock: they are the entities the batch must lock too, and are read again under the
/// locks ([`fold_segment`]).
async fn waiting_on(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    changes: &[RowChange],
) -> std::result::Result<Vec<Vec<String>>, ApplyError> {
    let deleted: Vec<String> = changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Delete && lsn(c).is_some())
        .map(|c| serde_json::json!(c.key).to_string())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if deleted.is_empty() {
        return Ok(Vec::new());
    }
    let nk = prepared.shape.key.len();
    Ok(tx
        .query(&prepared.fetch_unresolved, &[&deleted])
        .await
        .map_err(pg_err)?
        .iter()
        .map(|r| (0..nk).map(|i| r.get::<_, String>(i)).collect())
        .collect())
}

/// The stored state of each key (live row or tombstone), locked `FOR UPDATE`.
async fn fetch_states(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    keys: &[Vec<String>],
) -> std::result::Result<Vec<Option<State>>, ApplyError> {
    let shape = &prepared.shape;
    let mut state: Vec<Option<State>> = vec![None; keys.len()];
    if keys.is_empty() {
        return Ok(state);
    }
    let key_cols: Vec<Vec<&str>> = (0..shape.key.len())
        .map(|i| keys.iter().map(|k| k[i].as_str()).collect())
        .collect();
    let params: Params = key_cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    for r in tx
        .query(&prepared.fetch_live, &params)
        .await
        .map_err(pg_err)?
    {
        let ord: i64 = r.get(0);
        let values: Vec<Option<String>> = (0..shape.columns.len())
            .map(|i| r.get::<_, Option<String>>(5 + i))
            .collect();
        let deleted: bool = r.get(4);
        let unresolved = r
            .get::<_, Option<String>>(6 + shape.columns.len())
            .and_then(|t| Unresolved::parse(shape, &t));
        let version = r.get::<_, Option<Vec<i64>>>(1).unwrap_or_default();
        let last_version = deleted
            .then(|| kept_since(r.get(7 + shape.columns.len()), &version, &values, shape))
            .flatten();
        state[ordinal(ord)] = Some(State {
            version,
            last_version,
            // Of the values as stored (PostgreSQL's output of each column, the form incoming values take
            // too): a `_sha256` written by an earlier version from another spelling of the same values
            // must not make the same state a conflict.
            sha: hash(shape, &values, deleted, unresolved.as_ref()),
            delivery: r.get(3),
            deleted,
            values,
            position: r.get(5 + shape.columns.len()),
            unresolved,
        });
    }
    if let Some(ft) = &prepared.fetch_tomb {
        for r in tx.query(ft, &params).await.map_err(pg_err)? {
            let ord: i64 = r.get(0);
            let version: Vec<i64> = r.get(1);
            let last: Option<serde_json::Value> = r.get(3);
            let position: Option<Vec<i64>> = r.get(4);
            let stored_since: Option<Vec<i64>> = r.get(5);
            let slot = &mut state[ordinal(ord)];
            // A live row and a tombstone for one key should not coexist; the newer one wins.
            if slot.as_ref().is_none_or(|s| {
                compare(&version, position.as_ref(), s, prepared.reloads)
                    != Some(std::cmp::Ordering::Less)
            }) {
                // The values of the newest write at or before the delete (for a later primary-key change's
                // unchanged values too).
                let values: Vec<Option<String>> = shape
                    .columns
                    .iter()
                    .map(|c| {
                        last.as_ref()
                            .and_then(|l| l.get(c.name.as_str()))
                            .and_then(|v| v.as_str().map(str::to_string))
                    })
                    .collect();
                *slot = Some(State {
                    last_version: kept_since(stored_since, &version, &values, shape),
                    version,
                    position,
                    deleted: true,
                    sha: hash(shape, &[], true, None),
                    unresolved: None,
                    delivery: r.get(2),
                    values,
                });
            }
        }
    }
    Ok(state)
}

/// Folds one segment of a batch (no truncate inside) and writes what it ends with.
async fn fold_segment(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    proj: &ProjectionPlan,
    changes: Vec<RowChange>,
    at: &Coordinates<'_>,
    locked: &Locked,
    results: &mut HashMap<i64, RowResult>,
) -> std::result::Result<(), ApplyError> {
    if changes.is_empty() {
        return Ok(());
    }
    let shape = &prepared.shape;
    let plan = proj
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    // Under the locks: a new key that started waiting for one of our deletes after `waiting_on` looked (its
    // batch held the old key's lock, now ours) is not locked; taking its lock now would break the one lock order
    // (case C36): the batch is redone, and then locks it up front.
    let waiting = waiting_on(tx, prepared, &changes).await?;
    if !locked.exclusive && waiting.iter().any(|k| !locked.keys.contains(k)) {
        tx.batch_execute(
            "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = \
             'replaysafe: a primary-key change began waiting for a key this batch deletes while it took its \
             locks; the batch is redone'; END $$",
        )
        .await
        .map_err(pg_err)?;
    }
    // Entities in first-seen order.
    let mut order: Vec<Vec<String>> = Vec::new();
    let mut groups: HashMap<Vec<String>, Vec<RowChange>> = HashMap::new();
    for c in changes {
        if !groups.contains_key(&c.key) {
            order.push(c.key.clone());
        }
        groups.entry(c.key.clone()).or_default().push(c);
    }
    for k in waiting {
        if let std::collections::hash_map::Entry::Vacant(e) = groups.entry(k) {
            order.push(e.key().clone());
            e.insert(Vec::new());
        }
    }
    // Each entity's changes stay in offset order and each is judged against the state before it, exactly as if
    // the batch held one record: outcomes never depend on batch boundaries (a late older change is stale even
    // when the newer one is in the same batch).
    // Stored state, locked; plus the state of old keys of primary-key changes that need unchanged values.
    let mut old_keys: Vec<Vec<String>> = Vec::new();
    for g in groups.values() {
        for c in g {
            if let Some(k) = &c.old_key {
                if (c.values.contains(&Pg::Unchanged) || c.values.contains(&Pg::Absent))
                    && !groups.contains_key(k)
                    && !old_keys.contains(k)
                {
                    old_keys.push(k.clone());
                }
            }
        }
    }
    let state = fetch_states(tx, prepared, &order).await?;
    // What this projection claimed at the batch's (entity, version) slots, under the same locks.
    let by_column = matches!(plan.version, VersionPlan::Column(_));
    let all: Vec<&RowChange> = groups.values().flatten().collect();
    let mut history = History::fetch(tx, prepared, &proj.name, by_column, &all).await?;
    // Last known values per key (live values, or the values a delete removed): unchanged TOASTed values of a
    // primary-key change without a source position come from the old key's. With one, from the values the old
    // key's delete at the change's LSN removed (`removed`, by key and LSN): that delete is the primary-key change.
    let mut last_values: HashMap<Vec<String>, Vec<Option<String>>> = HashMap::new();
    let mut removed: Removed = HashMap::new();
    for (k, s) in old_keys
        .iter()
        .zip(fetch_states(tx, prepared, &old_keys).await?)
        .chain(order.iter().zip(state.iter().cloned()))
    {
        if let Some(s) = s {
            if let Some(&l) = s
                .position
                .as_ref()
                .and_then(|p| p.last())
                .filter(|_| s.deleted)
            {
                removed.insert((k.clone(), l), s.values.clone());
            }
            last_values.insert(k.clone(), s.values);
        }
    }

    // Fold.
    // The newest truncate this projection applied: older source positions are stale on every entity.
    let watermark: Option<Vec<i64>> = match &prepared.watermark {
        Some(st) => tx
            .query_one(st, &[&proj.name])
            .await
            .map_err(pg_err)?
            .get(0),
        None => None,
    };
    let guard = Guard {
        shape,
        projection: &proj.name,
        by_column,
        reloads: prepared.reloads,
        watermark: watermark.as_deref(),
    };
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut resnapshot = 0u64;
    let mut ends: Vec<(Option<State>, Option<State>)> = Vec::new();
    for (ei, key) in order.iter().enumerate() {
        let before = state[ei].clone();
        let mut cur = state[ei].clone();
        for c in groups
            .get_mut(key)
            .expect("every key was grouped just above")
        {
            if c.follows_snapshot {
                follow(c, cur.as_ref());
            }
            if c.unpositioned && !c.redelivered {
                let by_position = !matches!(plan.version, VersionPlan::Column(_));
                place(c, cur.as_ref(), by_position);
            }
            let c = &*c;
            if c.snapshot && cur.is_some() && !c.redelivered && !c.incremental {
                resnapshot += 1;
            }
            let (incoming, waits) =
                incoming_values(c, cur.as_ref(), &removed, &last_values, shape, proj, at);
            // An incremental-snapshot read has no version of its own (placed at the stored one above): it is no
            // claim at that version, so the history neither judges nor keeps it.
            let seen = if c.unpositioned {
                Seen::Fresh
            } else {
                history.judge(c, key, &incoming, waits.as_ref(), shape, at)
            };
            let result = match seen {
                Seen::Same => {
                    keep_least_delivery(c, &mut cur, &incoming, waits.as_ref(), shape);
                    RowResult::Same
                }
                Seen::Copy(reaches) => {
                    keep_least_delivery(c, &mut cur, &incoming, waits.as_ref(), shape);
                    RowResult::Copied(reaches)
                }
                Seen::Conflict { wins } => {
                    if wins {
                        take_winner(c, &mut cur, &incoming, waits.clone(), shape, by_column);
                    }
                    // A write at a tombstone's version (or at an older one) is still a claimed write.
                    keep_last(&guard, c, &mut cur, &incoming, waits);
                    RowResult::Conflict
                }
                Seen::Fresh if c.redelivered => judge_redelivered(
                    c,
                    cur.as_ref(),
                    (&incoming, waits.as_ref()),
                    key,
                    shape,
                    &mut conflicts,
                ),
                Seen::Fresh => judge(&guard, c, &mut cur, (incoming, waits), key, &mut conflicts)?,
            };
            if result == RowResult::Conflict {
                metrics::counter!("replaysafe_conflicts_total", "projection" => proj.name.clone())
                    .increment(1);
                tracing::warn!(projection = %proj.name, topic = at.topic, partition = at.partition, offset = c.offset, "conflict: equal version, different row state (recorded in replaysafe_conflicts; the version's winner is the same in every order)");
            }
            if result == RowResult::Applied {
                if let Some(s) = &cur {
                    last_values.insert(key.clone(), s.values.clone());
                    if let Some(l) = lsn(c).filter(|_| c.kind == ChangeKind::Delete) {
                        removed.insert((key.clone(), l), s.values.clone());
                    }
                }
            }
            results.insert(c.offset, result);
        }
        ends.push((before, cur));
    }
    let finals = resolve_waiting(ends, &order, &removed, plan, proj, at, shape);

    if resnapshot > 0 {
        warn_resnapshot(proj, at, resnapshot);
    }

    // Writes.
    let column_mode = plan.tombstones == TombstoneMode::Column;
    type Final<'a> = Vec<&'a (usize, State)>;
    let (live, dead): (Final, Final) = finals.iter().partition(|(_, s)| !s.deleted || column_mode);
    if !live.is_empty() {
        write_live(tx, prepared, &order, &live, column_mode).await?;
    }
    if !dead.is_empty() {
        write_dead(tx, prepared, &order, &dead).await?;
    }
    history.write(tx, prepared, &proj.name).await?;
    conflicts.extend(history.conflicts());
    if !conflicts.is_empty() {
        write_conflicts(tx, prepared, plan, proj, at, &conflicts).await?;
    }
    Ok(())
}

/// The values deletes removed, by key and change LSN (stored tombstones and deletes the fold applied).
type Removed = HashMap<(Vec<String>, i64), Vec<Option<String>>>;

/// The states the fold ends with that are written (`ends`: each entity's state before and after, in `order`),
/// once the columns waiting for an old key's delete ([`Unresolved`]) took the values it removed (`removed`).
/// Columns still waiting are logged; in a table-mode tombstone (whose `_last` has no marker) they stay NULL.
fn resolve_waiting(
    ends: Vec<(Option<State>, Option<State>)>,
    order: &[Vec<String>],
    removed: &Removed,
    plan: &RowPlan,
    proj: &ProjectionPlan,
    at: &Coordinates<'_>,
    shape: &Shape,
) -> Vec<(usize, State)> {
    let mut finals = Vec::new();
    for (ei, (before, cur)) in ends.into_iter().enumerate() {
        let Some(mut s) = cur else { continue };
        let mut resolved = false;
        if let Some(u) = s.unresolved.take() {
            match removed.get(&(u.old_key.clone(), u.lsn)) {
                Some(values) => {
                    for &i in &u.columns {
                        s.values[i] = values[i].clone();
                    }
                    if !s.deleted {
                        s.sha = hash(shape, &s.values, false, None);
                    }
                    resolved = true;
                }
                None => {
                    let lost = s.deleted && plan.tombstones == TombstoneMode::Table;
                    tracing::warn!(
                        projection = %proj.name,
                        topic = at.topic,
                        partition = at.partition,
                        entity = entity(shape, &order[ei]),
                        old_key = serde_json::json!(u.old_key).to_string(),
                        lsn = u.lsn,
                        columns = %u.columns.iter().map(|&i| shape.columns[i].name.as_str()).collect::<Vec<_>>().join(", "),
                        "{}",
                        if lost {
                            "unchanged-TOAST columns of a primary-key change deleted before the old key's delete \
                             was applied: its tombstone's `_last` holds NULL for them"
                        } else {
                            "unchanged-TOAST columns of a primary-key change wait for the old key's delete (not \
                             applied yet): NULL, marked in `_unresolved`, until it is"
                        }
                    );
                    if !lost {
                        s.unresolved = Some(u);
                    }
                }
            }
        }
        // A tombstone also changes when it keeps the values of a newer write ([`super::guard::keep_last`]).
        let changed = resolved
            || before.as_ref().is_none_or(|b| {
                b.version != s.version
                    || b.deleted != s.deleted
                    || b.sha != s.sha
                    || b.delivery != s.delivery
                    || b.values != s.values
                    || b.last_version != s.last_version
            });
        if changed {
            finals.push((ei, s));
        }
    }
    finals
}

/// A copy of the stored state (the same state at the stored version, under another delivery key): the row's
/// `_delivery` is the least of the copies' keys, so which copy arrived first never decides it. A ledger
/// duplicate or a snapshot read is no copy.
fn keep_least_delivery(
    c: &RowChange,
    cur: &mut Option<State>,
    incoming: &[Option<String>],
    waits: Option<&Unresolved>,
    shape: &Shape,
) {
    if c.redelivered || c.snapshot {
        return;
    }
    let deleted = c.kind == ChangeKind::Delete;
    if let Some(s) = cur.as_mut() {
        if s.version == c.version
            && s.deleted == deleted
            && s.sha == hash(shape, incoming, deleted, waits)
            && s.delivery.as_ref().is_some_and(|d| c.delivery < *d)
        {
            s.delivery = Some(c.delivery.clone());
        }
    }
}

/// The row state a change brings, and the columns of it that wait for an old key's delete: a delete's is the
/// state it removes; an unchanged-TOAST placeholder (or an absent column) takes the stored value, or for the new
/// key of a primary-key change the values the old key's delete at the same LSN removed (`removed`) — until that
/// delete is applied the column waits ([`Unresolved`]).
fn incoming_values(
    c: &RowChange,
    cur: Option<&State>,
    removed: &Removed,
    last_values: &HashMap<Vec<String>, Vec<Option<String>>>,
    shape: &Shape,
    proj: &ProjectionPlan,
    at: &Coordinates<'_>,
) -> (Vec<Option<String>>, Option<Unresolved>) {
    let live = cur.filter(|s| !s.deleted);
    if c.kind == ChangeKind::Delete {
        return match live {
            Some(s) => (s.values.clone(), s.unresolved.clone()),
            None => (vec![None; shape.columns.len()], None),
        };
    }
    // The stored value, or (a new key) the old key's.
    let from_old = |i: usize| -> Result<Option<String>, ()> {
        match (&c.old_key, lsn(c)) {
            (Some(k), Some(l)) => removed.get(&(k.clone(), l)).map(|v| v[i].clone()).ok_or(()),
            (Some(k), None) => Ok(last_values.get(k).and_then(|v| v[i].clone())),
            (None, _) => Ok(None),
        }
    };
    let mut waits: Vec<usize> = Vec::new();
    let values = c
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Pg::Text(t) => Some(t.clone()),
            Pg::Null => None,
            // Absent from `after` (absent = "keep") or an unchanged TOAST value: the stored value carries
            // forward (still waiting if it waits); for the new key of a primary-key change the old key's.
            Pg::Absent | Pg::Unchanged => match live {
                Some(s) => {
                    if s.unresolved.as_ref().is_some_and(|u| u.columns.contains(&i)) {
                        waits.push(i);
                    }
                    s.values[i].clone()
                }
                None => match from_old(i) {
                    Ok(value) => {
                        if value.is_none() && *v == Pg::Unchanged {
                            tracing::warn!(
                                projection = %proj.name,
                                topic = at.topic,
                                partition = at.partition,
                                offset = c.offset,
                                column = shape.columns[i].name.as_str(),
                                "unchanged-TOAST placeholder for a row with no stored value: written as NULL"
                            );
                        }
                        value
                    }
                    Err(()) => {
                        waits.push(i);
                        None
                    }
                },
            },
        })
        .collect();
    let waits = (!waits.is_empty()).then(|| {
        let (old_key, lsn) = match live.and_then(|s| s.unresolved.as_ref()) {
            Some(u) => (u.old_key.clone(), u.lsn),
            None => (
                c.old_key.clone().expect("waits for an old key"),
                lsn(c).expect("with a position"),
            ),
        };
        Unresolved {
            old_key,
            lsn,
            columns: waits,
        }
    });
    (values, waits)
}

/// C05: a snapshot read of an entity already stored means the connector snapshotted again (lost offsets, a new
/// slot). Rows deleted while it was down got no delete event and stay.
fn warn_resnapshot(proj: &ProjectionPlan, at: &Coordinates<'_>, resnapshot: u64) {
    metrics::counter!("replaysafe_resnapshot_reads_total", "projection" => proj.name.clone())
        .increment(resnapshot);
    tracing::warn!(
        projection = %proj.name,
        topic = at.topic,
        partition = at.partition,
        reads = resnapshot,
        "re-snapshot detected: snapshot reads of rows already stored (applied under the version guard); rows \
         deleted at the source while the connector was down received no delete event and remain — compare \
         with the source if that matters"
    );
}
