//! Ledger duplicates of Debezium changes judged by the row projections.
//!
//! A Debezium delivery key is the change's source position, table and key (docs/cdc.md "Debezium CDC to a table",
//! *Delivery key*), so a second record at the same position and key is a ledger `duplicate` before any row
//! projection sees it. Most are redeliveries of the same change; one with a *different* row state is a conflict
//! (as for an equal version column): recorded in `replaysafe_conflicts` and counted as a conflict
//! ([`Outcome::Stale`] `{ conflict: true }`), the stored row kept. Its delivery key was claimed by the first
//! record, so it never reaches counters, sums, sql projections or the outbox.
//!
//! It is judged first by what the projection claimed at its version (module `history`: the first record's state
//! is there whatever is stored now — the same state is a duplicate, another a conflict with the version's one
//! winner). Only when that history has nothing for the version (pruned with the ledger's day, or claimed before
//! it was kept) is it compared with the stored row (or tombstone) while that is still at its position; when the
//! stored state has moved on or there is none, the record stays a `duplicate`.

use std::collections::{HashMap, HashSet};

use super::change::{ChangeKind, RowChange, RowResult};
use super::statements::Prepared;
use crate::config::Pipeline;
use crate::model::apply_error::ApplyError;
use crate::model::batch::{Batch, Outcome, Pending};

/// `changes` (the newly claimed changes of row projection `rp`, offset order) with the Debezium changes of `batch`
/// whose delivery key was already claimed (not in `landed`), marked [`RowChange::redelivered`], in offset order.
/// Truncates are left out (a truncate redelivered has nothing to compare).
///
/// # Errors
/// As [`super::row_changes`].
pub(super) fn with_redeliveries(
    p: &Pipeline,
    rp: &Prepared,
    batch: &Batch,
    landed: &HashSet<i64>,
    mut changes: Vec<RowChange>,
) -> std::result::Result<Vec<RowChange>, ApplyError> {
    let again: HashSet<i64> = redelivered(batch, landed).collect();
    if again.is_empty() {
        return Ok(changes);
    }
    changes.extend(
        super::row_changes(p, rp, batch, &again)?
            .into_iter()
            .filter(|c| c.kind != ChangeKind::Truncate)
            .map(|c| RowChange {
                redelivered: true,
                ..c
            }),
    );
    changes.sort_by_key(|c| c.offset);
    Ok(changes)
}

/// The offsets of `batch`'s Debezium changes whose delivery key was already claimed (not in `landed`).
fn redelivered<'a>(batch: &'a Batch, landed: &'a HashSet<i64>) -> impl Iterator<Item = i64> + 'a {
    batch
        .items
        .iter()
        .filter(|it| {
            matches!(
                &it.pending,
                Pending::Claim {
                    change: Some(_),
                    ..
                }
            ) && !landed.contains(&it.offset)
        })
        .map(|it| it.offset)
}

/// Whether `batch` holds a Debezium change whose delivery key was already claimed.
pub(super) fn any(batch: &Batch, landed: &HashSet<i64>) -> bool {
    redelivered(batch, landed).next().is_some()
}

/// Takes the results of redelivered changes (offsets not in `landed`) out of `results`; a conflict becomes the
/// record's outcome in `overrides` (a `duplicate` otherwise, as the ledger decided).
pub(super) fn settle(
    results: &mut HashMap<i64, RowResult>,
    landed: &HashSet<i64>,
    overrides: &mut HashMap<i64, Outcome>,
) {
    results.retain(|o, r| {
        if landed.contains(o) {
            return true;
        }
        if *r == RowResult::Conflict {
            overrides.insert(*o, Outcome::Stale { conflict: true });
        }
        false
    });
}
