//! The row guard: how one change fares against its entity's state before it — stale, same, conflict,
//! unchanged or applied — as plain functions of plain values ([`Guard`], the change, the state), no statements
//! or connection; the fold ([`super::fold`]) reads the states and writes what the guard decides.

use super::change::{ChangeKind, RowChange, RowResult};
use super::state::{compare, entity, hash, object, version_text, State, Unresolved};
use super::table::Shape;
use super::write::Conflict;
use crate::decode::{Reason, Rejection};
use crate::model::apply_error::ApplyError;

/// What the row guard reads besides a change and its entity's state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Guard<'a> {
    /// The projection's columns and key (the row state hash, the entity text of a conflict).
    pub(super) shape: &'a Shape,
    /// The projection's name, for messages.
    pub(super) projection: &'a str,
    /// The version is a column of the row (`VersionPlan::Column`): a delete carries the version of the row it
    /// deletes.
    pub(super) by_column: bool,
    /// A version column under `truncate = "truncate"`: a change after the stored state in source order is newer
    /// even when its version did not grow ([`compare`]).
    pub(super) reloads: bool,
    /// The source position of the newest truncate the projection applied: a change older than it is stale on
    /// every entity.
    pub(super) watermark: Option<&'a [i64]>,
}

/// Judges one change against the entity's state before it (`cur`, updated when the change applies): stale,
/// same, conflict (recorded in `conflicts`), unchanged, or applied. `incoming`: the row state the change brings
/// and the columns of it waiting for an old key's delete.
///
/// # Errors
/// [`ApplyError::Record`] for a delete that cannot be ordered against the stored state.
pub(super) fn judge(
    guard: &Guard<'_>,
    c: &RowChange,
    cur: &mut Option<State>,
    (incoming_values, waits): (Vec<Option<String>>, Option<Unresolved>),
    key: &[String],
    conflicts: &mut Vec<Conflict>,
) -> std::result::Result<RowResult, ApplyError> {
    use std::cmp::Ordering::{Equal, Less};
    let shape = guard.shape;
    let deleted = c.kind == ChangeKind::Delete;
    let sha = hash(shape, &incoming_values, deleted, waits.as_ref());
    // A delete under a version column carries the version of the row it deletes (inclusive); when `before`
    // does not carry it (REPLICA IDENTITY DEFAULT) it has no version of its own and is ordered by its source
    // position — it never wins over a change it cannot be ordered against.
    let by_column = guard.by_column;
    let inclusive = deleted && by_column;
    let order = cur
        .as_ref()
        .map(|s| compare(&c.version, c.position.as_ref(), s, guard.reloads));
    // An incremental-snapshot read without a position, placed at the stored state (`state::place`): newer
    // than a different stored row (applied at its version), never over a tombstone.
    let placed_newer =
        c.unpositioned && !by_column && cur.as_ref().is_some_and(|s| !s.deleted && s.sha != sha);
    // Older than the newest truncate (by source position): that truncate removed it. A read without a position
    // is not ordered against it (it comes after it in the partition).
    let truncated = !c.unpositioned
        && guard
            .watermark
            .is_some_and(|w| c.position.as_ref().is_some_and(|p| p.as_slice() < w));
    let result = match (&*cur, order) {
        (Some(s), _) if c.unpositioned && s.deleted => return Ok(RowResult::Stale),
        _ if truncated => return Ok(RowResult::Stale),
        (Some(_), Some(None)) => return Err(unorderable(guard, c, key)),
        (Some(_), Some(Some(Less))) => RowResult::Stale,
        // Under a version column a delete carries the version of the row it deletes: a write at the
        // tombstone's version is that deleted state. (A version field or source position gives a delete a
        // version of its own: a write at it is another state at the same version, a conflict below.)
        (Some(s), Some(Some(Equal))) if s.deleted && !deleted && by_column => RowResult::Stale,
        // Equal version (but an inclusive delete of the stored row, which applies).
        (Some(s), Some(Some(Equal))) if (s.deleted || !inclusive) && !placed_newer => {
            if s.sha == sha {
                return Ok(RowResult::Same);
            }
            conflicts.push(conflict(c, s, key, shape, &incoming_values, sha));
            RowResult::Conflict
        }
        // Newer, same row state: the row takes the version (and delivery). A newer business event is
        // landed for the other projections; a snapshot read is observed state, not an event: duplicate.
        (Some(s), _) if s.sha == sha && s.deleted == deleted => {
            *cur = Some(restamped(c, s, incoming_values, waits));
            return Ok(if c.snapshot {
                RowResult::Same
            } else {
                RowResult::Unchanged
            });
        }
        // Newer, never seen (a delete of an unseen entity still leaves its tombstone: a late older insert
        // must not create it), or an inclusive delete of the stored version.
        _ => {
            let last_version = if deleted { removes(cur.as_ref()) } else { None };
            *cur = Some(State {
                version: c.version.clone(),
                deleted,
                sha,
                delivery: Some(c.delivery.clone()),
                values: incoming_values,
                position: c.position.clone(),
                unresolved: waits,
                last_version,
            });
            return Ok(RowResult::Applied);
        }
    };
    keep_last(guard, c, cur, &incoming_values, waits);
    Ok(result)
}

/// The version of the write whose values a delete applied over `before` keeps: the live row's (its `values` are
/// the ones the delete removes), a tombstone's own, none for nothing stored.
fn removes(before: Option<&State>) -> Option<Vec<i64>> {
    before.and_then(|b| {
        if b.deleted {
            b.last_version.clone()
        } else {
            Some(b.version.clone())
        }
    })
}

/// A tombstone keeps the values of the newest write claimed for its entity at or before its version (at its
/// version: the write its delete beat; among writes at one version their winner, the smaller state hash) —
/// whatever the arrival order, so a write that arrives after the delete that removed it still becomes the
/// tombstone's values. Called for a write `c` (its state `incoming`, `waits`) that did not apply against the
/// state `cur`: stale, or a conflict at its version. When `cur` is a tombstone ordered at or after `c` and its
/// values came from an older write (or none), they become `c`'s; its version, delivery and position stay. A
/// write older than the truncate watermark or an unpositioned read (no claim of a version) never does.
pub(super) fn keep_last(
    guard: &Guard<'_>,
    c: &RowChange,
    cur: &mut Option<State>,
    incoming: &[Option<String>],
    waits: Option<Unresolved>,
) {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let Some(s) = cur.as_mut().filter(|s| s.deleted) else {
        return;
    };
    if c.kind != ChangeKind::Upsert || c.unpositioned || c.redelivered {
        return;
    }
    let truncated = guard
        .watermark
        .is_some_and(|w| c.position.as_ref().is_some_and(|p| p.as_slice() < w));
    let at_or_before = matches!(
        compare(&c.version, c.position.as_ref(), s, guard.reloads),
        Some(Less | Equal)
    );
    if truncated || !at_or_before {
        return;
    }
    let newer = match &s.last_version {
        None => true,
        Some(lv) => match c.version.cmp(lv) {
            Greater => true,
            Equal => {
                hash(guard.shape, incoming, false, waits.as_ref())
                    < hash(guard.shape, &s.values, false, s.unresolved.as_ref())
            }
            Less => false,
        },
    };
    if newer {
        s.values = incoming.to_vec();
        s.unresolved = waits;
        s.last_version = Some(c.version.clone());
    }
}

/// The stored state `s` taking a newer change `c` with the same row state: its version, delivery and position.
/// The judged columns are the same; `_extra` (never judged) takes the incoming members (a delete keeps the
/// values it removed).
fn restamped(
    c: &RowChange,
    s: &State,
    incoming_values: Vec<Option<String>>,
    waits: Option<Unresolved>,
) -> State {
    let (values, unresolved) = if c.kind == ChangeKind::Delete {
        (s.values.clone(), s.unresolved.clone())
    } else {
        (incoming_values, waits)
    };
    State {
        version: c.version.clone(),
        delivery: Some(c.delivery.clone()),
        position: c.position.clone(),
        values,
        unresolved,
        ..s.clone()
    }
}

/// The refusal of a delete without a version of its own against a stored state without a source position.
fn unorderable(guard: &Guard<'_>, c: &RowChange, key: &[String]) -> ApplyError {
    ApplyError::Record {
        offset: c.offset,
        rejection: Rejection {
            reason: Reason::InvalidField,
            detail: format!(
                "row projection `{}`: a delete without a version of its own (`before` holds only the \
                 key: REPLICA IDENTITY DEFAULT) for {} cannot be ordered against the stored state, \
                 which has no source position (written before replaysafe kept them); the row is kept. \
                 Delete it by hand if the source no longer has it; set REPLICA IDENTITY FULL on the \
                 source table so deletes carry the version column",
                guard.projection,
                entity(guard.shape, key)
            ),
        },
    }
}

/// A change whose state is its version's winner (module `history`): when the entity's state is at that version
/// (under a version column: and is a delete as it is, or a write as it is), the state becomes the change's.
pub(super) fn take_winner(
    c: &RowChange,
    cur: &mut Option<State>,
    incoming: &[Option<String>],
    waits: Option<Unresolved>,
    shape: &Shape,
    by_column: bool,
) {
    let deleted = c.kind == ChangeKind::Delete;
    let Some(s) = cur.as_ref() else { return };
    if s.version != c.version || (by_column && s.deleted != deleted) {
        return;
    }
    let last_version = if deleted { removes(Some(s)) } else { None };
    *cur = Some(State {
        version: c.version.clone(),
        deleted,
        sha: hash(shape, incoming, deleted, waits.as_ref()),
        delivery: Some(c.delivery.clone()),
        values: incoming.to_vec(),
        position: c.position.clone(),
        unresolved: waits,
        last_version,
    });
}

/// A ledger duplicate ([`RowChange::redelivered`]: its delivery key, the source position with table and key, was
/// already claimed): when the stored state is still at its source position, a different row state is a conflict
/// (recorded in `conflicts`), the same state a duplicate. When the stored state is at another position (it moved
/// on) or there is none, the first record's state is not stored any more: it cannot be judged and stays a
/// duplicate. Never changes the stored state.
pub(super) fn judge_redelivered(
    c: &RowChange,
    cur: Option<&State>,
    (incoming, waits): (&[Option<String>], Option<&Unresolved>),
    key: &[String],
    shape: &Shape,
    conflicts: &mut Vec<Conflict>,
) -> RowResult {
    let Some(s) = cur.filter(|s| s.position.is_some() && s.position == c.position) else {
        return RowResult::Same;
    };
    let deleted = c.kind == ChangeKind::Delete;
    let sha = hash(shape, incoming, deleted, waits);
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
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape::of_text(&["id", "name"])
    }

    fn values(name: &str) -> Vec<Option<String>> {
        vec![Some("1".into()), Some(name.into())]
    }

    /// A stored state at `version` (its source position too, unless `position` says otherwise); `name: None` is
    /// a tombstone.
    fn stored(version: &[i64], position: Option<&[i64]>, name: Option<&str>) -> State {
        let deleted = name.is_none();
        let values = name.map_or(vec![None, None], values);
        State {
            version: version.to_vec(),
            deleted,
            sha: hash(&shape(), &values, deleted, None),
            delivery: Some("[\"stored\"]".into()),
            values,
            position: position.map(<[i64]>::to_vec),
            unresolved: None,
            last_version: None,
        }
    }

    /// An upsert (`name`) or a delete (`None`) at `version`, at source position `position`.
    fn change(version: &[i64], position: Option<&[i64]>, name: Option<&str>) -> RowChange {
        RowChange {
            offset: 42,
            key: vec!["1".into()],
            version: version.to_vec(),
            kind: if name.is_some() {
                ChangeKind::Upsert
            } else {
                ChangeKind::Delete
            },
            values: Vec::new(),
            delivery: "[\"incoming\"]".into(),
            old_key: None,
            snapshot: false,
            position: position.map(<[i64]>::to_vec),
            follows_snapshot: false,
            incremental: false,
            unpositioned: false,
            redelivered: false,
            reach: Vec::new(),
        }
    }

    /// One row of the decision table: the guard's settings, the stored state, the change and what it brings.
    struct Case {
        what: &'static str,
        by_column: bool,
        reloads: bool,
        watermark: Option<&'static [i64]>,
        stored: Option<State>,
        change: RowChange,
        incoming: Option<&'static str>,
        /// The result, or `None` for the refusal of a delete that cannot be ordered.
        expect: Option<RowResult>,
        /// The entity's state after: its version and whether it is a tombstone (`None`: no state).
        then: Option<(Vec<i64>, bool)>,
        /// A tombstone after: the version of the write whose values it keeps and that write's `name` (`None`
        /// for either: none); not checked when `None`.
        keeps: Option<(Option<Vec<i64>>, Option<&'static str>)>,
    }

    fn case(what: &'static str, stored: Option<State>, change: RowChange) -> Case {
        let incoming = (change.kind == ChangeKind::Upsert).then_some("b");
        Case {
            what,
            by_column: false,
            reloads: false,
            watermark: None,
            stored,
            change,
            incoming,
            expect: None,
            then: None,
            keeps: None,
        }
    }

    impl Case {
        fn brings(mut self, name: &'static str) -> Case {
            self.incoming = Some(name);
            self
        }
        fn by_column(mut self, reloads: bool) -> Case {
            (self.by_column, self.reloads) = (true, reloads);
            self
        }
        fn watermark(mut self, w: &'static [i64]) -> Case {
            self.watermark = Some(w);
            self
        }
        fn expect(mut self, r: RowResult, version: &[i64], deleted: bool) -> Case {
            self.expect = Some(r);
            self.then = Some((version.to_vec(), deleted));
            self
        }
        /// The change finds no state and leaves none.
        fn expect_none(mut self, r: RowResult) -> Case {
            self.expect = Some(r);
            self
        }
        /// The tombstone after keeps the values `name` of the write at `version` (`None`: keeps none).
        fn keeps(mut self, version: Option<&[i64]>, name: Option<&'static str>) -> Case {
            self.keeps = Some((version.map(<[i64]>::to_vec), name));
            self
        }
        fn refused(mut self) -> Case {
            self.then = self.stored.as_ref().map(|s| (s.version.clone(), s.deleted));
            self
        }
    }

    fn table() -> Vec<Case> {
        use RowResult::*;
        let p = |v: &'static [i64]| Some(v);
        let live = |v: &'static [i64], name| Some(stored(v, Some(v), Some(name)));
        let tomb = |v: &'static [i64]| Some(stored(v, Some(v), None));
        let mut read = change(&[5], p(&[5]), Some("b"));
        (read.snapshot, read.unpositioned) = (false, true);
        let unpositioned_read = read;
        let mut snap = change(&[6], p(&[6]), Some("a"));
        snap.snapshot = true;
        vec![
            case("newer", live(&[5], "a"), change(&[6], p(&[6]), Some("b"))).expect(
                Applied,
                &[6],
                false,
            ),
            case("never seen", None, change(&[1], p(&[1]), Some("b"))).expect(Applied, &[1], false),
            case("older", live(&[5], "a"), change(&[4], p(&[4]), Some("b"))).expect(
                Stale,
                &[5],
                false,
            ),
            case(
                "equal, same state",
                live(&[5], "a"),
                change(&[5], p(&[5]), Some("a")),
            )
            .brings("a")
            .expect(Same, &[5], false),
            case(
                "equal, different state",
                live(&[5], "a"),
                change(&[5], p(&[5]), Some("b")),
            )
            .expect(Conflict, &[5], false),
            case(
                "newer, same state",
                live(&[5], "a"),
                change(&[6], p(&[6]), Some("a")),
            )
            .brings("a")
            .expect(Unchanged, &[6], false),
            case("newer, same state, a snapshot read", live(&[5], "a"), snap)
                .brings("a")
                .expect(Same, &[6], false),
            case(
                "delete of an unseen entity",
                None,
                change(&[3], p(&[3]), None),
            )
            .expect(Applied, &[3], true),
            case("newer delete", live(&[5], "a"), change(&[6], p(&[6]), None)).expect(
                Applied,
                &[6],
                true,
            ),
            case(
                "tombstone newer",
                tomb(&[7]),
                change(&[6], p(&[6]), Some("b")),
            )
            .expect(Stale, &[7], true),
            case(
                "tombstone older",
                tomb(&[5]),
                change(&[6], p(&[6]), Some("b")),
            )
            .expect(Applied, &[6], false),
            case(
                "tombstone equal, a version field",
                tomb(&[5]),
                change(&[5], p(&[5]), Some("b")),
            )
            .expect(Conflict, &[5], true),
            case(
                "tombstone equal, a version column",
                tomb(&[5]),
                change(&[5], p(&[5]), Some("b")),
            )
            .by_column(false)
            .expect(Stale, &[5], true),
            case(
                "inclusive delete under a version column",
                live(&[5], "a"),
                change(&[5], p(&[9]), None),
            )
            .by_column(false)
            .expect(Applied, &[5], true),
            case(
                "older than the truncate watermark",
                None,
                change(&[9, 9], p(&[9, 9]), Some("b")),
            )
            .watermark(&[10, 10])
            .expect_none(Stale),
            case(
                "newer than the truncate watermark",
                None,
                change(&[11, 1], p(&[11, 1]), Some("b")),
            )
            .watermark(&[10, 10])
            .expect(Applied, &[11, 1], false),
            case(
                "reload after a truncate: same version, later position",
                Some(stored(&[5], p(&[100]), Some("a"))),
                change(&[5], p(&[200]), Some("b")),
            )
            .by_column(true)
            .expect(Applied, &[5], false),
            case(
                "no reload: same version, later position",
                Some(stored(&[5], p(&[100]), Some("a"))),
                change(&[5], p(&[200]), Some("b")),
            )
            .by_column(false)
            .expect(Conflict, &[5], false),
            case(
                "reload: same version, earlier position",
                Some(stored(&[5], p(&[200]), Some("a"))),
                change(&[5], p(&[100]), Some("b")),
            )
            .by_column(true)
            .expect(Conflict, &[5], false),
            case(
                "a delete without a version against a state without a position",
                Some(stored(&[5], None, Some("a"))),
                change(&[], p(&[50]), None),
            )
            .by_column(false)
            .refused(),
            case(
                "unpositioned read over a tombstone",
                tomb(&[5]),
                unpositioned_read.clone(),
            )
            .expect(Stale, &[5], true),
            case(
                "unpositioned read placed at a different row",
                live(&[5], "a"),
                unpositioned_read,
            )
            .expect(Applied, &[5], false),
        ]
        .into_iter()
        .chain(kept_cases())
        .collect()
    }

    /// A tombstone at `version` keeping the values `name` of the write at `since`.
    fn kept(version: &'static [i64], since: Option<&[i64]>, name: Option<&str>) -> Option<State> {
        let mut s = stored(version, Some(version), None);
        s.values = name.map_or(vec![Some("1".into()), None], values);
        s.last_version = since.map(<[i64]>::to_vec);
        Some(s)
    }

    /// What a tombstone keeps: the values of the newest write claimed at or before it, in every order.
    fn kept_cases() -> Vec<Case> {
        use RowResult::*;
        let p = |v: &'static [i64]| Some(v);
        let live = |v: &'static [i64], name| Some(stored(v, Some(v), Some(name)));
        // At one version the write with the smaller state hash wins.
        let (small, large) = if hash(&shape(), &values("a"), false, None)
            < hash(&shape(), &values("b"), false, None)
        {
            ("a", "b")
        } else {
            ("b", "a")
        };
        vec![
            // A delete brings the values of the live row it removes (`fold::incoming_values`).
            case(
                "newer delete of a live row",
                live(&[5], "a"),
                change(&[6], p(&[6]), None),
            )
            .brings("a")
            .expect(Applied, &[6], true)
            .keeps(p(&[5]), Some("a")),
            case(
                "delete of an unseen entity keeps nothing",
                None,
                change(&[3], p(&[3]), None),
            )
            .expect(Applied, &[3], true)
            .keeps(None, None),
            case(
                "newer delete of a tombstone",
                kept(&[5], p(&[4]), Some("a")),
                change(&[6], p(&[6]), None),
            )
            .expect(Unchanged, &[6], true)
            .keeps(p(&[4]), Some("a")),
            case(
                "an older write after the delete, nothing kept",
                kept(&[7], None, None),
                change(&[6], p(&[6]), Some("b")),
            )
            .expect(Stale, &[7], true)
            .keeps(p(&[6]), Some("b")),
            case(
                "an older write newer than the kept one",
                kept(&[7], p(&[4]), Some("a")),
                change(&[6], p(&[6]), Some("b")),
            )
            .expect(Stale, &[7], true)
            .keeps(p(&[6]), Some("b")),
            case(
                "an older write older than the kept one",
                kept(&[7], p(&[6]), Some("a")),
                change(&[5], p(&[5]), Some("b")),
            )
            .expect(Stale, &[7], true)
            .keeps(p(&[6]), Some("a")),
            case(
                "a write at the kept version, smaller hash",
                kept(&[7], p(&[6]), Some(large)),
                change(&[6], p(&[6]), Some(small)),
            )
            .brings(small)
            .expect(Stale, &[7], true)
            .keeps(p(&[6]), Some(small)),
            case(
                "a write at the kept version, larger hash",
                kept(&[7], p(&[6]), Some(small)),
                change(&[6], p(&[6]), Some(large)),
            )
            .brings(large)
            .expect(Stale, &[7], true)
            .keeps(p(&[6]), Some(small)),
            case(
                "a write at the tombstone's version, a version field",
                kept(&[5], p(&[4]), Some("a")),
                change(&[5], p(&[5]), Some("b")),
            )
            .expect(Conflict, &[5], true)
            .keeps(p(&[5]), Some("b")),
            case(
                "a write at the tombstone's version, a version column",
                kept(&[5], None, None),
                change(&[5], p(&[5]), Some("b")),
            )
            .by_column(false)
            .expect(Stale, &[5], true)
            .keeps(p(&[5]), Some("b")),
            case(
                "a write older than the truncate watermark",
                kept(&[20, 1], None, None),
                change(&[9, 9], p(&[9, 9]), Some("b")),
            )
            .watermark(&[10, 10])
            .expect(Stale, &[20, 1], true)
            .keeps(None, None),
        ]
    }

    /// What went otherwise than the table says for one case (`None`: as it says).
    fn check(t: &Case, shape: &Shape) -> Option<String> {
        let guard = Guard {
            shape,
            projection: "accounts",
            by_column: t.by_column,
            reloads: t.reloads,
            watermark: t.watermark,
        };
        let incoming = t.incoming.map_or(vec![None, None], values);
        let mut cur = t.stored.clone();
        let mut conflicts = Vec::new();
        let got = judge(
            &guard,
            &t.change,
            &mut cur,
            (incoming, None),
            &t.change.key,
            &mut conflicts,
        );
        let result_ok = match (&got, &t.expect) {
            (Ok(r), Some(e)) => r == e,
            (Err(ApplyError::Record { offset, rejection }), None) => {
                *offset == 42
                    && rejection.reason == Reason::InvalidField
                    && rejection.detail.contains("row projection `accounts`")
            }
            _ => false,
        };
        let then = cur.as_ref().map(|s| (s.version.clone(), s.deleted));
        let kept = cur
            .as_ref()
            .map(|s| (s.last_version.clone(), s.values.get(1).cloned().flatten()));
        let keeps_ok = t
            .keeps
            .as_ref()
            .is_none_or(|(v, name)| kept.as_ref() == Some(&(v.clone(), name.map(str::to_string))));
        let conflict = matches!(got, Ok(RowResult::Conflict));
        let recorded = conflicts
            .iter()
            .all(|c| (c.offset, Some(&c.stored_sha)) == (42, t.stored.as_ref().map(|s| &s.sha)));
        let wrong = !result_ok
            || then != t.then
            || conflicts.len() != usize::from(conflict)
            || !recorded
            || !keeps_ok;
        wrong.then(|| {
            format!(
                "{}: got {got:?}, state after {then:?} keeping {kept:?}, {} conflicts; expected {:?}, {:?} \
                 keeping {:?}",
                t.what,
                conflicts.len(),
                t.expect,
                t.then,
                t.keeps
            )
        })
    }

    #[test]
    fn every_arm_of_the_row_guard() {
        let shape = shape();
        let wrong: Vec<String> = table().iter().filter_map(|t| check(t, &shape)).collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
