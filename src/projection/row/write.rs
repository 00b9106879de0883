//! Writing what a fold ends with: live rows (one upsert), table-mode tombstones, and conflicts.

use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::change::Coordinates;
use super::plan::RowPlan;
use super::state::{object, version_text, State};
use super::statements::{pg_err, Params, Prepared};
use crate::model::apply_error::ApplyError;
use crate::projection::ProjectionPlan;

/// An equal version with a different row state, as recorded in the conflicts table.
pub(super) struct Conflict {
    pub(super) entity: String,
    pub(super) version: String,
    pub(super) stored_delivery: Option<String>,
    pub(super) incoming_delivery: String,
    pub(super) stored_sha: Vec<u8>,
    pub(super) incoming_sha: Vec<u8>,
    pub(super) stored: String,
    pub(super) incoming: String,
    pub(super) offset: i64,
    /// The topic and partition of the record that brought `incoming`; `None`: the batch's.
    pub(super) source: Option<(String, i32)>,
}

/// The live rows (and column-mode tombstones) the fold ends with, in one upsert; table-mode tombstones of
/// those keys are removed.
pub(super) async fn write_live(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    order: &[Vec<String>],
    live: &[&(usize, State)],
    column_mode: bool,
) -> std::result::Result<(), ApplyError> {
    let shape = &prepared.shape;
    let nk = shape.key.len();
    let mut cols: Vec<Vec<Option<&str>>> =
        vec![Vec::with_capacity(live.len()); shape.columns.len()];
    let mut versions = Vec::new();
    let mut shas = Vec::new();
    let mut deliveries = Vec::new();
    let mut dels = Vec::new();
    let mut positions: Vec<Option<String>> = Vec::new();
    let mut unresolved: Vec<Option<String>> = Vec::new();
    let mut last_versions: Vec<Option<String>> = Vec::new();
    for (ei, s) in live {
        for (i, c) in cols.iter_mut().enumerate() {
            // Key columns always come from the key (a column-mode delete of an unseen entity has no values).
            let v = match shape.key.iter().position(|&k| k == i) {
                Some(kp) => Some(order[*ei][kp].as_str()),
                None => s.values[i].as_deref(),
            };
            c.push(v);
        }
        versions.push(version_text(&s.version));
        shas.push(s.sha.clone());
        deliveries.push(s.delivery.clone());
        dels.push(s.deleted);
        positions.push(s.position.as_deref().map(version_text));
        unresolved.push(s.unresolved.as_ref().map(|u| u.text(shape)));
        last_versions.push(s.last_version.as_deref().map(version_text));
    }
    let mut params: Params = cols.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    params.push(&versions);
    params.push(&shas);
    params.push(&deliveries);
    if column_mode {
        params.push(&dels);
    }
    params.push(&positions);
    params.push(&unresolved);
    if column_mode {
        params.push(&last_versions);
    }
    tx.execute(&prepared.upsert, &params)
        .await
        .map_err(pg_err)?;
    if let Some(dt) = &prepared.delete_tomb {
        let keys: Vec<Vec<&str>> = (0..nk)
            .map(|i| live.iter().map(|(ei, _)| order[*ei][i].as_str()).collect())
            .collect();
        let mut p: Params = keys.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        p.push(&versions);
        tx.execute(dt, &p).await.map_err(pg_err)?;
    }
    Ok(())
}

/// Table-mode tombstones the fold ends with: the live rows are deleted, the tombstones upserted.
pub(super) async fn write_dead(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    order: &[Vec<String>],
    dead: &[&(usize, State)],
) -> std::result::Result<(), ApplyError> {
    let shape = &prepared.shape;
    let nk = shape.key.len();
    let keys: Vec<Vec<&str>> = (0..nk)
        .map(|i| dead.iter().map(|(ei, _)| order[*ei][i].as_str()).collect())
        .collect();
    let versions: Vec<String> = dead.iter().map(|(_, s)| version_text(&s.version)).collect();
    let deliveries: Vec<Option<String>> = dead.iter().map(|(_, s)| s.delivery.clone()).collect();
    let lasts: Vec<String> = dead.iter().map(|(_, s)| object(shape, &s.values)).collect();
    let positions: Vec<Option<String>> = dead
        .iter()
        .map(|(_, s)| s.position.as_deref().map(version_text))
        .collect();
    let last_versions: Vec<Option<String>> = dead
        .iter()
        .map(|(_, s)| s.last_version.as_deref().map(version_text))
        .collect();
    let mut p: Params = keys.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    p.push(&versions);
    tx.execute(prepared.delete_live.as_ref().expect("table mode"), &p)
        .await
        .map_err(pg_err)?;
    p.push(&deliveries);
    p.push(&lasts);
    p.push(&positions);
    p.push(&last_versions);
    tx.execute(prepared.upsert_tomb.as_ref().expect("table mode"), &p)
        .await
        .map_err(pg_err)?;
    Ok(())
}

/// Records the conflicts of the fold in the conflicts table.
pub(super) async fn write_conflicts(
    tx: &Transaction<'_>,
    prepared: &Prepared,
    plan: &RowPlan,
    proj: &ProjectionPlan,
    at: &Coordinates<'_>,
    conflicts: &[Conflict],
) -> std::result::Result<(), ApplyError> {
    let e: Vec<&str> = conflicts.iter().map(|c| c.entity.as_str()).collect();
    let v: Vec<&str> = conflicts.iter().map(|c| c.version.as_str()).collect();
    let sd: Vec<Option<&str>> = conflicts
        .iter()
        .map(|c| c.stored_delivery.as_deref())
        .collect();
    let id: Vec<&str> = conflicts
        .iter()
        .map(|c| c.incoming_delivery.as_str())
        .collect();
    let sh: Vec<&[u8]> = conflicts.iter().map(|c| c.stored_sha.as_slice()).collect();
    let ih: Vec<&[u8]> = conflicts
        .iter()
        .map(|c| c.incoming_sha.as_slice())
        .collect();
    let s: Vec<&str> = conflicts.iter().map(|c| c.stored.as_str()).collect();
    let i: Vec<&str> = conflicts.iter().map(|c| c.incoming.as_str()).collect();
    let o: Vec<i64> = conflicts.iter().map(|c| c.offset).collect();
    let tp: Vec<&str> = conflicts
        .iter()
        .map(|c| c.source.as_ref().map_or(at.topic, |(t, _)| t.as_str()))
        .collect();
    let pt: Vec<i32> = conflicts
        .iter()
        .map(|c| c.source.as_ref().map_or(at.partition, |(_, p)| *p))
        .collect();
    let table = plan.table.to_string();
    tx.execute(
        &prepared.conflict,
        &[
            &proj.name, &table, &tp, &pt, &at.group, &e, &v, &sd, &id, &sh, &ih, &s, &i, &o,
        ],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}
