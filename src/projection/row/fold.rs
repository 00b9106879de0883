//! Folding a batch's row changes per entity against the stored state (read `FOR UPDATE`) and writing each entity
//! once: the row projection's apply.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::change::Coordinates;
use super::change::{ChangeKind, RowChange, RowResult};
use super::plan::{RowPlan, TombstoneMode, TruncatePolicy, VersionPlan};
use super::state::{compare, entity, follow, hash, object, version_text, State};
use super::statements::{lock_entities, pg_err, Params, Prepared};
use super::table::Shape;
use super::write::{write_conflicts, write_dead, write_live, Conflict};
use crate::decode::debezium::convert::Pg;
use crate::decode::{Reason, Rejection};
use crate::error::Error;
use crate::projection::ProjectionPlan;
use crate::sink::error::ApplyError;

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
    let plan = proj.row.as_ref().expect("row");
    let mut results = HashMap::new();
    if changes.is_empty() {
        return Ok(results);
    }
    // One form for every value judged or written: PostgreSQL's output of it as its column's type.
    super::canon::canonicalise(tx, prepared, &mut changes).await?;
    let truncates = plan.truncate == TruncatePolicy::Truncate
        && changes.iter().any(|c| c.kind == ChangeKind::Truncate);
    lock_entities(tx, prepared, &changes, truncates).await?;
    let mut segment: Vec<RowChange> = Vec::new();
    for c in changes {
        if c.kind == ChangeKind::Truncate {
            fold_segment(
                tx,
                prepared,
                proj,
                std::mem::take(&mut segment),
                at,
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
    fold_segment(tx, prepared, proj, segment, at, &mut results).await?;
    Ok(results)
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
        state[(ord - 1) as usize] = Some(State {
            version: r.get::<_, Option<Vec<i64>>>(1).unwrap_or_default(),
            // Of the values as stored (PostgreSQL's output of each column, the form incoming values take
            // too): a `_sha256` written by an earlier version from another spelling of the same values
            // must not make the same state a conflict.
            sha: hash(shape, &values, deleted),
            delivery: r.get(3),
            deleted,
            values,
            position: r.get(5 + shape.columns.len()),
        });
    }
    if let Some(ft) = &prepared.fetch_tomb {
        for r in tx.query(ft, &params).await.map_err(pg_err)? {
            let ord: i64 = r.get(0);
            let version: Vec<i64> = r.get(1);
            let last: Option<serde_json::Value> = r.get(3);
            let position: Option<Vec<i64>> = r.get(4);
            let slot = &mut state[(ord - 1) as usize];
            // A live row and a tombstone for one key should not coexist; the newer one wins.
            if slot.as_ref().is_none_or(|s| {
                compare(&version, position.as_ref(), s, prepared.reloads)
                    != Some(std::cmp::Ordering::Less)
            }) {
                *slot = Some(State {
                    version,
                    position,
                    deleted: true,
                    sha: hash(shape, &[], true),
                    delivery: r.get(2),
                    // The values the delete removed (for a later primary-key change's unchanged values).
                    values: shape
                        .columns
                        .iter()
                        .map(|c| {
                            last.as_ref()
                                .and_then(|l| l.get(c.name.as_str()))
                                .and_then(|v| v.as_str().map(str::to_string))
                        })
                        .collect(),
                });
            }
        }
    }
    Ok(state)
}

async fn fold_segment(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    proj: &ProjectionPlan,
    changes: Vec<RowChange>,
    at: &Coordinates<'_>,
    results: &mut HashMap<i64, RowResult>,
) -> std::result::Result<(), ApplyError> {
    if changes.is_empty() {
        return Ok(());
    }
    let shape = &prepared.shape;
    let plan = proj.row.as_ref().expect("row");
    // Entities in first-seen order.
    let mut order: Vec<Vec<String>> = Vec::new();
    let mut groups: HashMap<Vec<String>, Vec<RowChange>> = HashMap::new();
    for c in changes {
        if !groups.contains_key(&c.key) {
            order.push(c.key.clone());
        }
        groups.entry(c.key.clone()).or_default().push(c);
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
    // Last known values per key (live values, or the values a delete removed): unchanged TOASTed values of a
    // primary-key change come from the old key's.
    let mut last_values: HashMap<Vec<String>, Vec<Option<String>>> = HashMap::new();
    for (k, s) in old_keys
        .iter()
        .zip(fetch_states(tx, prepared, &old_keys).await?)
        .chain(order.iter().zip(state.iter().cloned()))
    {
        if let Some(s) = s {
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
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut resnapshot = 0u64;
    let mut finals: Vec<(usize, State)> = Vec::new();
    for (ei, key) in order.iter().enumerate() {
        let before = state[ei].clone();
        let mut cur = state[ei].clone();
        for c in groups.get_mut(key).expect("grouped") {
            if c.follows_snapshot {
                follow(c, cur.as_ref());
            }
            let c = &*c;
            if c.snapshot && cur.is_some() && !c.redelivered {
                resnapshot += 1;
            }
            let incoming = incoming_values(c, cur.as_ref(), &last_values, shape, proj, at);
            let result = if c.redelivered {
                judge_redelivered(c, cur.as_ref(), &incoming, key, shape, &mut conflicts)
            } else {
                judge(
                    c,
                    &mut cur,
                    incoming,
                    key,
                    prepared,
                    plan,
                    proj,
                    watermark.as_ref(),
                    &mut conflicts,
                )?
            };
            if result == RowResult::Conflict {
                metrics::counter!("replaysafe_conflicts_total", "projection" => proj.name.clone())
                    .increment(1);
                tracing::warn!(projection = %proj.name, topic = at.topic, partition = at.partition, offset = c.offset, "conflict: equal version, different row state; stored row kept");
            }
            if result == RowResult::Applied {
                if let Some(s) = &cur {
                    last_values.insert(key.clone(), s.values.clone());
                }
            }
            results.insert(c.offset, result);
        }
        if let Some(s) = cur {
            let changed = before
                .as_ref()
                .is_none_or(|b| b.version != s.version || b.deleted != s.deleted || b.sha != s.sha);
            if changed {
                finals.push((ei, s));
            }
        }
    }

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
    if !conflicts.is_empty() {
        write_conflicts(tx, prepared, plan, proj, at, &conflicts).await?;
    }
    Ok(())
}

/// The row state a change brings: a delete's is the state it removes; an unchanged-TOAST placeholder takes the
/// stored (or last real) value, or for the new key of a primary-key change the old key's.
fn incoming_values(
    c: &RowChange,
    cur: Option<&State>,
    last_values: &HashMap<Vec<String>, Vec<Option<String>>>,
    shape: &Shape,
    proj: &ProjectionPlan,
    at: &Coordinates<'_>,
) -> Vec<Option<String>> {
    match c.kind {
        ChangeKind::Delete => cur
            .as_ref()
            .filter(|s| !s.deleted)
            .map(|s| s.values.clone())
            .unwrap_or_else(|| vec![None; shape.columns.len()]),
        _ => c
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Pg::Text(t) => Some(t.clone()),
                Pg::Null => None,
                // Absent from `after` (absent = "keep"): the stored value stays; for the new key of a primary-key
                // change the old key's; a row not stored yet gets NULL.
                Pg::Absent => match cur.filter(|s| !s.deleted) {
                    Some(s) => s.values[i].clone(),
                    None => c
                        .old_key
                        .as_ref()
                        .and_then(|k| last_values.get(k))
                        .and_then(|v| v[i].clone()),
                },
                // Unchanged TOAST value: the stored (or last real) value carries forward; for the new
                // key of a primary-key change, the old key's.
                Pg::Unchanged => match cur.filter(|s| !s.deleted) {
                    Some(s) => s.values[i].clone(),
                    None => {
                        let v = c
                            .old_key
                            .as_ref()
                            .and_then(|k| last_values.get(k))
                            .and_then(|v| v[i].clone());
                        if v.is_none() {
                            tracing::warn!(
                                projection = %proj.name,
                                topic = at.topic,
                                partition = at.partition,
                                offset = c.offset,
                                column = shape.columns[i].name.as_str(),
                                "unchanged-TOAST placeholder for a row with no stored value: written as NULL"
                            );
                        }
                        v
                    }
                },
            })
            .collect(),
    }
}

/// Judges one change against the entity's state before it (`cur`, updated when the change applies): stale,
/// same, conflict (recorded in `conflicts`), unchanged, or applied.
///
/// # Errors
/// [`ApplyError::Record`] for a delete that cannot be ordered against the stored state.
#[allow(clippy::too_many_arguments)]
fn judge(
    c: &RowChange,
    cur: &mut Option<State>,
    incoming_values: Vec<Option<String>>,
    key: &[String],
    prepared: &Prepared,
    plan: &RowPlan,
    proj: &ProjectionPlan,
    watermark: Option<&Vec<i64>>,
    conflicts: &mut Vec<Conflict>,
) -> std::result::Result<RowResult, ApplyError> {
    let shape = &prepared.shape;
    let deleted = c.kind == ChangeKind::Delete;
    let sha = hash(shape, &incoming_values, deleted);
    // A delete under a version column carries the version of the row it deletes (inclusive); when `before`
    // does not carry it (REPLICA IDENTITY DEFAULT) it has no version of its own and is ordered by its source
    // position — it never wins over a change it cannot be ordered against.
    let by_column = matches!(plan.version, VersionPlan::Column(_));
    let inclusive = deleted && by_column;
    let version = &c.version;
    let order = cur
        .as_ref()
        .map(|s| compare(version, c.position.as_ref(), s, prepared.reloads));
    use std::cmp::Ordering::{Equal, Less};
    Ok(match (&*cur, order) {
        // Older than the newest truncate (by source position): that truncate removed it.
        _ if watermark
            .is_some_and(|w| c.position.as_ref().is_some_and(|p| p < w)) =>
        {
            RowResult::Stale
        }
        (Some(_), Some(None)) => {
            return Err(ApplyError::Record {
                offset: c.offset,
                rejection: Rejection {
                    reason: Reason::InvalidField,
                    detail: format!(
                        "row projection `{}`: a delete without a version of its own (`before` holds only the \
                         key: REPLICA IDENTITY DEFAULT) for {} cannot be ordered against the stored state, \
                         which has no source position (written before replaysafe kept them); the row is kept. \
                         Delete it by hand if the source no longer has it; set REPLICA IDENTITY FULL on the \
                         source table so deletes carry the version column",
                        proj.name,
                        entity(shape, key)
                    ),
                },
            })
        }
        (Some(_), Some(Some(Less))) => RowResult::Stale,
        // Under a version column a delete carries the version of the row it deletes: a write at the
        // tombstone's version is that deleted state. (A version field or source position gives a delete a
        // version of its own: a write at it is another state at the same version, a conflict below.)
        (Some(s), Some(Some(Equal))) if s.deleted && !deleted && by_column => RowResult::Stale,
        // Equal version (but an inclusive delete of the stored row, which applies).
        (Some(s), Some(Some(Equal))) if s.deleted || !inclusive => {
            if s.sha == sha {
                RowResult::Same
            } else {
                conflicts.push(conflict(c, s, key, shape, &incoming_values, sha.clone()));
                RowResult::Conflict
            }
        }
        // Newer, same row state: the row takes the version (and delivery). A newer business event is
        // landed for the other projections; a snapshot read is observed state, not an event: duplicate.
        (Some(s), _) if s.sha == sha && s.deleted == deleted => {
            // The judged columns are the same; `_extra` (never judged) takes the incoming members.
            let values = if deleted {
                s.values.clone()
            } else {
                incoming_values
            };
            *cur = Some(State {
                version: version.clone(),
                delivery: Some(c.delivery.clone()),
                position: c.position.clone(),
                values,
                ..s.clone()
            });
            if c.snapshot {
                RowResult::Same
            } else {
                RowResult::Unchanged
            }
        }
        // Newer, never seen (a delete of an unseen entity still leaves its tombstone: a late older insert
        // must not create it), or an inclusive delete of the stored version.
        _ => {
            *cur = Some(State {
                version: version.clone(),
                deleted,
                sha,
                delivery: Some(c.delivery.clone()),
                values: incoming_values,
                position: c.position.clone(),
            });
            RowResult::Applied
        }
    })
}

/// A ledger duplicate ([`RowChange::redelivered`]: its delivery key, the source position with table and key, was
/// already claimed): when the stored state is still at its source position, a different row state is a conflict
/// (recorded in `conflicts`), the same state a duplicate. When the stored state is at another position (it moved
/// on) or there is none, the first record's state is not stored any more: it cannot be judged and stays a
/// duplicate. Never changes the stored state.
fn judge_redelivered(
    c: &RowChange,
    cur: Option<&State>,
    incoming: &[Option<String>],
    key: &[String],
    shape: &Shape,
    conflicts: &mut Vec<Conflict>,
) -> RowResult {
    let Some(s) = cur.filter(|s| s.position.is_some() && s.position == c.position) else {
        return RowResult::Same;
    };
    let deleted = c.kind == ChangeKind::Delete;
    let sha = hash(shape, incoming, deleted);
    if s.sha == sha {
        return RowResult::Same;
    }
    conflicts.push(conflict(c, s, key, shape, incoming, sha));
    RowResult::Conflict
}

/// The conflict record of change `c` against stored state `s` (same version, different row state).
fn conflict(
    c: &RowChange,
    s: &State,
    key: &[String],
    shape: &Shape,
    incoming: &[Option<String>],
    sha: Vec<u8>,
) -> Conflict {
    Conflict {
        entity: entity(shape, key),
        version: version_text(&c.version),
        stored_delivery: s.delivery.clone(),
        incoming_delivery: c.delivery.clone(),
        stored_sha: s.sha.clone(),
        incoming_sha: sha,
        stored: if s.deleted {
            "null".into()
        } else {
            object(shape, &s.values)
        },
        incoming: if c.kind == ChangeKind::Delete {
            "null".into()
        } else {
            object(shape, incoming)
        },
        offset: c.offset,
    }
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
