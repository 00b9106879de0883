//! An entity's stored state as the fold sees it, how a change compares with it, and its text forms (version,
//! row object, entity key) as the tables and conflicts record them.

use sha2::{Digest, Sha256};

use super::change::RowChange;
use super::table::Shape;

#[derive(Debug, Clone)]
pub(super) struct State {
    /// Empty: no version of its own (a tombstone of a key-only delete or of a truncate under a version column).
    pub(super) version: Vec<i64>,
    pub(super) deleted: bool,
    pub(super) sha: Vec<u8>,
    pub(super) delivery: Option<String>,
    pub(super) values: Vec<Option<String>>,
    /// The source position of the change that wrote it (`None`: JSON events, or written before it was kept).
    pub(super) position: Option<Vec<i64>>,
    /// Columns whose value waits for the old key's row (`_unresolved`); stored as NULL meanwhile.
    pub(super) unresolved: Option<Unresolved>,
    /// A tombstone: the version of the write whose values it keeps in `values` (`_last`, or the row's columns
    /// under `tombstones = "column"`), stored as `_last_version` ([`kept_since`]); `None`: no write known (the
    /// values are NULL). `None` for a live state (its values are at `version`).
    pub(super) last_version: Option<Vec<i64>>,
}

/// The version a stored tombstone's kept values are ordered at: its `_last_version` (`stored`), or, for a
/// tombstone written before that column existed, its own version (`version`) when it keeps any value besides
/// the key (`values`) — it then keeps them against every older write — and none when it keeps nothing.
pub(super) fn kept_since(
    stored: Option<Vec<i64>>,
    version: &[i64],
    values: &[Option<String>],
    shape: &Shape,
) -> Option<Vec<i64>> {
    stored.or_else(|| {
        values
            .iter()
            .enumerate()
            .any(|(i, v)| v.is_some() && !shape.key.contains(&i))
            .then(|| version.to_vec())
    })
}

/// The new-key columns of a Debezium primary-key change (delete of the old key, create of the new one, both at
/// one LSN) that carried unchanged-TOAST placeholders (or were absent) when the old key's delete was not applied
/// yet: their values are the ones that delete removes. Stored in `_unresolved` as `{"key": [old key texts],
/// "lsn": LSN, "columns": [names]}` (the columns NULL meanwhile) until that delete applies.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unresolved {
    /// The old key (its columns' texts, canonical).
    pub(super) old_key: Vec<String>,
    /// The change LSN (the last element of the source position) the old key's delete has too.
    pub(super) lsn: i64,
    /// Indices into the shape's columns, ascending.
    pub(super) columns: Vec<usize>,
}

impl Unresolved {
    /// The `_unresolved` JSON text.
    pub(super) fn text(&self, shape: &Shape) -> String {
        serde_json::json!({
            "key": self.old_key,
            "lsn": self.lsn,
            "columns": self.columns.iter().map(|&i| shape.columns[i].name.as_str()).collect::<Vec<_>>(),
        })
        .to_string()
    }

    /// Parses an `_unresolved` JSON text (columns the shape no longer has are left out).
    pub(super) fn parse(shape: &Shape, text: &str) -> Option<Unresolved> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let old_key = v
            .get("key")?
            .as_array()?
            .iter()
            .map(|k| k.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()?;
        let lsn = v.get("lsn")?.as_i64()?;
        let mut columns: Vec<usize> = v
            .get("columns")?
            .as_array()?
            .iter()
            .filter_map(|c| {
                let c = c.as_str()?;
                shape.columns.iter().position(|s| s.name.as_str() == c)
            })
            .collect();
        columns.sort_unstable();
        (!columns.is_empty()).then_some(Unresolved {
            old_key,
            lsn,
            columns,
        })
    }
}

/// How a change compares with a stored state: by version when both have one of their own, else by source
/// position. A state replaysafe never versioned (an existing table's row) is older than any change. `None`: the
/// two cannot be ordered (a state written before positions were kept, against a change without a version).
///
/// `reloads` (a version column under `truncate = "truncate"`): a change that comes after the stored state in
/// source order is newer even when its version did not grow. A version column grows with every change of a row
/// except across a truncate, and a truncate has no key: it lands on any partition, so the rows reloaded after it
/// can be applied before it is — they must not be judged against the rows it will remove (stale, or a conflict),
/// or the truncate then removes them too. A change newer by version applies as before (positions of another
/// database after a move are not comparable).
pub(super) fn compare(
    version: &[i64],
    position: Option<&Vec<i64>>,
    s: &State,
    reloads: bool,
) -> Option<std::cmp::Ordering> {
    if !version.is_empty() && !s.version.is_empty() {
        let by_version = version.cmp(&s.version);
        if reloads && by_version != std::cmp::Ordering::Greater {
            if let (Some(a), Some(b)) = (position, &s.position) {
                if a > b {
                    return Some(std::cmp::Ordering::Greater);
                }
            }
        }
        return Some(by_version);
    }
    match (position, &s.position) {
        (Some(a), Some(b)) => Some(a.cmp(b)),
        _ if s.version.is_empty() => Some(std::cmp::Ordering::Greater),
        _ => None,
    }
}

/// Completes the position of Debezium's first transaction streamed after a snapshot
/// ([`RowChange::follows_snapshot`]: `sequence[0]` null, so its position is `[L, L]` with its change LSN L, which
/// can lie below the snapshot's point S when the transaction began before the snapshot and committed after it)
/// from the entity's stored state `stored` (position `p`): it becomes `[max(p[0], L), L]`, newer than `stored`.
///
/// Why that is its place: Debezium streams after a snapshot only transactions that commit after its point S,
/// and one key's records stay in one Kafka partition in the order produced (the key decides the partition), so
/// whatever is stored for the entity when the change is judged was produced before it: a read of the snapshot it
/// follows (`[S, 0]`, the decoder's form of a read with a null `sequence[0]`; it becomes `[S, L]`), an earlier
/// change of its own transaction (`[S, L1]`, L1 < L), or a change committed before that snapshot (which held the
/// row's lock before this transaction could write it, so its LSNs are below L: `[L, L]` is already newer). A
/// change whose version is its position (no version column) gets the same version. Nothing stored, or a state
/// without a position: unchanged.
pub(super) fn follow(c: &mut RowChange, stored: Option<&State>) {
    let (Some(pos), Some(p)) = (
        c.position.as_mut(),
        stored.and_then(|s| s.position.as_ref()),
    ) else {
        return;
    };
    let (Some(&lsn), Some(&point)) = (pos.last(), p.first()) else {
        return;
    };
    let was = pos.clone();
    *pos = vec![point.max(lsn), lsn];
    if c.version == was {
        c.version = pos.clone();
    }
}

/// Places an incremental-snapshot read that carries no source position ([`RowChange::unpositioned`]) against
/// the entity's stored state `stored`: at the stored position (and, when the version is the source position —
/// `by_position` —, the stored version), so it never lowers them; with nothing stored at `[0, 0]`, below every
/// streamed change. The fold then applies it when its row state differs (it is newer: Debezium's chunk window
/// drops every key changed while the chunk was read, DBLog's watermark algorithm, so a read is at least as new as
/// every earlier record of its key in the partition), keeps the stored row when it is the same, and never applies
/// it over a tombstone (the delete was produced before the read's chunk window closed and wins).
pub(super) fn place(c: &mut RowChange, stored: Option<&State>, by_position: bool) {
    match stored {
        Some(s) => {
            c.position = s.position.clone();
            if by_position {
                c.version = s.version.clone();
            }
        }
        None => {
            c.position = Some(vec![0, 0]);
            if by_position {
                c.version = vec![0, 0];
            }
        }
    }
}

/// The row state hash (`_sha256`): of the column values (all but `_extra` and the columns `new-columns = "add"`
/// added, which are carried, never judged; a column waiting for the old key's value, `unresolved`, is neither
/// NULL nor a value), or of a delete.
pub(super) fn hash(
    shape: &Shape,
    values: &[Option<String>],
    deleted: bool,
    unresolved: Option<&Unresolved>,
) -> Vec<u8> {
    let mut h = Sha256::new();
    if deleted {
        h.update(b"deleted");
    } else {
        for (i, v) in values.iter().enumerate().filter(|(i, _)| shape.judged(*i)) {
            if unresolved.is_some_and(|u| u.columns.contains(&i)) {
                h.update(b"U");
                continue;
            }
            match v {
                None => h.update(b"N"),
                Some(t) => {
                    h.update(b"V");
                    h.update((t.len() as u64).to_be_bytes());
                    h.update(t.as_bytes());
                }
            }
        }
    }
    h.finalize().to_vec()
}

pub(super) fn version_text(v: &[i64]) -> String {
    format!(
        "{{{}}}",
        v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    )
}

pub(super) fn object(shape: &Shape, values: &[Option<String>]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = shape
        .columns
        .iter()
        .zip(values)
        .map(|(c, v)| {
            (
                c.name.as_str().to_string(),
                v.clone()
                    .map(serde_json::Value::String)
                    .unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    serde_json::Value::Object(m).to_string()
}

pub(super) fn entity(shape: &Shape, key: &[String]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = shape
        .key
        .iter()
        .zip(key)
        .map(|(&c, v)| {
            (
                shape.columns[c].name.as_str().to_string(),
                serde_json::Value::String(v.clone()),
            )
        })
        .collect();
    serde_json::Value::Object(m).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::debezium::envelope::{decode, Record};
    use std::cmp::Ordering::Greater;

    fn position(op: &str, snapshot: &str, sequence: &str, lsn: i64) -> Vec<i64> {
        let v = format!(
            r#"{{"before":null,"after":{{"id":1}},"source":{{"db":"app","schema":"public","table":"t","ts_ms":1,
            "snapshot":"{snapshot}","sequence":"{sequence}","lsn":{lsn},"txId":7}},"op":"{op}","ts_ms":1}}"#
        );
        match decode(Some(br#"{"id":1}"#), Some(v.as_bytes()), None).unwrap() {
            Record::Change(c, _) => c.position.to_vec(),
            Record::Skip(r) => panic!("{r}"),
        }
    }

    fn stored(position: Vec<i64>) -> State {
        State {
            version: position.clone(),
            deleted: false,
            sha: Vec::new(),
            delivery: None,
            values: Vec::new(),
            position: Some(position),
            unresolved: None,
            last_version: None,
        }
    }

    /// `_unresolved` round-trips through its JSON text, and a waiting column hashes apart from NULL and from
    /// any value (the same state never looks resolved, nor a resolved one waiting).
    #[test]
    fn unresolved_marker_round_trips_and_hashes_apart_from_null() {
        let shape = Shape::of_text(&["id", "name", "bio"]);
        let u = Unresolved {
            old_key: vec!["1".into()],
            lsn: 400,
            columns: vec![2],
        };
        assert_eq!(
            u.text(&shape),
            r#"{"columns":["bio"],"key":["1"],"lsn":400}"#
        );
        assert_eq!(Unresolved::parse(&shape, &u.text(&shape)), Some(u.clone()));
        let values = vec![Some("2".to_string()), Some("b".to_string()), None];
        let waiting = hash(&shape, &values, false, Some(&u));
        assert_ne!(waiting, hash(&shape, &values, false, None));
        let mut filled = values.clone();
        filled[2] = Some("U".into());
        assert_ne!(waiting, hash(&shape, &filled, false, None));
        assert_eq!(
            hash(&shape, &[], true, Some(&u)),
            hash(&shape, &[], true, None)
        );
    }

    /// A change as the fold judges it: decoded, then (`follows_snapshot`) completed from `stored`.
    fn judged(op: &str, sequence: &str, lsn: i64, stored: Option<&State>) -> Vec<i64> {
        let v = format!(
            r#"{{"before":null,"after":{{"id":1}},"source":{{"db":"app","schema":"public","table":"t","ts_ms":1,
            "snapshot":"false","sequence":"{sequence}","lsn":{lsn},"txId":7}},"op":"{op}","ts_ms":1}}"#
        );
        let Record::Change(ch, _) = decode(Some(br#"{"id":1}"#), Some(v.as_bytes()), None).unwrap()
        else {
            panic!("not a change")
        };
        let pos = ch.position.to_vec();
        let mut c = RowChange {
            offset: 0,
            key: vec!["1".into()],
            version: pos.clone(),
            kind: super::super::change::ChangeKind::Upsert,
            values: Vec::new(),
            delivery: String::new(),
            old_key: None,
            snapshot: false,
            position: Some(pos),
            follows_snapshot: ch.follows_snapshot,
            incremental: false,
            unpositioned: false,
            redelivered: false,
            reach: Vec::new(),
        };
        if c.follows_snapshot {
            follow(&mut c, stored);
        }
        assert_eq!(c.position.as_ref(), Some(&c.version));
        c.version
    }

    /// Issue 34 item 3: a transaction that began before a snapshot's point S and committed after it (real Debezium
    /// 3.6.1 with PostgreSQL, an open transaction across a resnapshot: reads `[null, 26228416]`, then that
    /// transaction's update `[null, 26227336]`, the next transaction `["26228504", "26235056"]`) is newer than the
    /// snapshot read: the read is `[S, 0]` and the change, the first streamed after it, takes the read's point.
    /// Its second change stays after its first; the next transaction after both; a later snapshot after all;
    /// a change committed before the snapshot (streamed before it) stays older than the read.
    #[test]
    fn a_transaction_open_across_a_snapshot_is_newer_than_its_reads() {
        let s = 26_228_416;
        let read = stored(position("r", "last", &format!(r#"[null,\"{s}\"]"#), s));
        assert_eq!(read.position, Some(vec![s, 0]));
        let t = judged("u", r#"[null,\"26227336\"]"#, 26_227_336, Some(&read));
        assert_eq!(t, vec![s, 26_227_336]);
        assert_eq!(compare(&t, Some(&t), &read, false), Some(Greater));
        let t_state = stored(t.clone());
        let t2 = judged("u", r#"[null,\"26227400\"]"#, 26_227_400, Some(&t_state));
        assert_eq!(compare(&t2, Some(&t2), &t_state, false), Some(Greater));
        let next = judged(
            "u",
            r#"[\"26228504\",\"26235056\"]"#,
            26_235_056,
            Some(&t_state),
        );
        assert_eq!(next, vec![26_228_504, 26_235_056]);
        assert_eq!(
            compare(&next, Some(&next), &stored(t2), false),
            Some(Greater)
        );
        let again = stored(position("r", "true", r#"[null,\"26300000\"]"#, 26_300_000));
        assert_eq!(
            compare(
                &again.version,
                again.position.as_ref(),
                &stored(next),
                false
            ),
            Some(Greater)
        );
        // Streamed before the snapshot (its first transaction after an earlier one, nothing stored yet): [L, L],
        // below the read that comes after it.
        let before = judged("u", r#"[null,\"26227072\"]"#, 26_227_072, None);
        assert_eq!(before, vec![26_227_072, 26_227_072]);
        assert_eq!(
            compare(
                &read.version,
                read.position.as_ref(),
                &stored(before),
                false
            ),
            Some(Greater)
        );
        // An incremental snapshot's reads carry both elements: kept; the transaction committed after its window
        // is newer by its `sequence[0]` alone (real output: reads ["28758576","28758576"], then
        // ["28759688","28757760"]).
        let inc = stored(position(
            "r",
            "incremental",
            r#"[\"28758576\",\"28758576\"]"#,
            28_758_576,
        ));
        assert_eq!(inc.position, Some(vec![28_758_576, 28_758_576]));
        let late = judged(
            "u",
            r#"[\"28759688\",\"28757760\"]"#,
            28_757_760,
            Some(&inc),
        );
        assert_eq!(compare(&late, Some(&late), &inc, false), Some(Greater));
    }
}
