//! Boundary 6's records: a Debezium resnapshot of the fixture's final state. Debezium's incremental and
//! blocking snapshots, and a new initial snapshot after a lost replication slot, emit for every row that exists
//! *now* one snapshot read (`op = r`, `source.snapshot = "true"`, `"last"` on the last one) of its current
//! state, at a source position later than every change already streamed, and nothing for deleted rows
//! (Debezium documentation, PostgreSQL connector, "Snapshots" and "Incremental snapshots").

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::scratch::Rec;
use crate::engine::Tp;

/// An entity: its topic and record key.
type Entity = (String, Vec<u8>);
/// An entity's newest change: its source position and, unless it deleted the entity, the change.
type Newest = ((i64, i64), Option<(Rec, Value)>);

/// The snapshot reads of the entities that exist after `records` (in order; an entity is a topic's record
/// key), each on the partition of its entity's last change after that partition's last offset, at one new
/// source position (LSN) above every `source.lsn` / `source.sequence` of `records`; and how many live entities
/// got no read because their newest source position carries two different states (a conflict the replica
/// recorded: which state the source holds is not known, so a resnapshot of it may rightly change the row).
pub fn reads(records: &[Rec]) -> (Vec<Rec>, usize) {
    let mut ends: BTreeMap<Tp, i64> = BTreeMap::new();
    // Per entity: the position of its newest change and, unless that change deleted it, the change.
    let mut current: BTreeMap<Entity, Newest> = BTreeMap::new();
    let (mut lsn, mut tx, mut ts) = (0i64, 0i64, 0i64);
    // Entities whose change at a position was followed by another state at the same position.
    let mut ambiguous: BTreeMap<Entity, (i64, i64)> = BTreeMap::new();
    for r in records {
        let e = ends.entry(r.tp.clone()).or_insert(0);
        *e = (*e).max(r.offset + 1);
        let Some(v) = r
            .value
            .as_deref()
            .and_then(|v| serde_json::from_slice::<Value>(v).ok())
        else {
            continue;
        };
        let Some(env) = envelope(&v) else { continue };
        let mut at = (0, 0);
        if let Some(s) = env.get("source").and_then(Value::as_object) {
            lsn = lsn.max(position(s));
            tx = tx.max(s.get("txId").and_then(int).unwrap_or(0));
            ts = ts.max(s.get("ts_ms").and_then(int).unwrap_or(0));
            at = order(s);
        }
        let entity = (r.tp.0.clone(), r.key.clone().unwrap_or_default());
        // The entity's newest change by source position (fixture order among equal or missing positions).
        let newer = current.get(&entity).is_none_or(|(p, _)| at >= *p);
        if at != (0, 0)
            && current
                .get(&entity)
                .is_some_and(|(p, c)| *p == at && !same_after(c, env))
        {
            ambiguous.insert(entity.clone(), at);
        }
        match env.get("op").and_then(Value::as_str) {
            Some("c" | "u" | "r") if newer => {
                current.insert(entity, (at, Some((r.clone(), v.clone()))));
            }
            Some("d") if newer => {
                current.insert(entity, (at, None));
            }
            // A truncate removes every row of its table (topic).
            Some("t") => current.retain(|(t, _), _| t != &r.tp.0),
            _ => {}
        }
    }
    let before = current.len();
    current.retain(|e, (at, c)| c.is_none() || ambiguous.get(e) != Some(at));
    let skipped = before - current.len();
    let current: Vec<(Rec, Value)> = current.into_values().filter_map(|(_, c)| c).collect();
    let last = current.len();
    let mut out = Vec::with_capacity(last);
    for (i, (r, mut v)) in current.into_iter().enumerate() {
        let flag = if i + 1 == last { "last" } else { "true" };
        as_snapshot_read(&mut v, lsn + 1, tx + 1, ts + 1, flag);
        let o = ends.get_mut(&r.tp).expect("partition seen");
        out.push(Rec {
            offset: *o,
            value: serde_json::to_vec(&v).ok(),
            old_key: None,
            timestamp_ms: r.timestamp_ms.map(|_| ts + 1),
            ..r
        });
        *o += 1;
    }
    (out, skipped)
}

/// Whether the newest change `c` held for an entity brings the same `after` (and op kind: a delete none) as
/// envelope `env`.
fn same_after(c: &Option<(Rec, Value)>, env: &Map<String, Value>) -> bool {
    let deleted = env.get("op").and_then(Value::as_str) == Some("d");
    match c {
        None => deleted,
        Some((_, v)) => !deleted && envelope(v).and_then(|e| e.get("after")) == env.get("after"),
    }
}

/// The change event's envelope: `payload` when it is an object (JSON converter with schemas), else the root.
fn envelope(v: &Value) -> Option<&Map<String, Value>> {
    match v.get("payload") {
        Some(Value::Object(m)) => Some(m),
        _ => v.as_object(),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The highest LSN a `source` block names (`lsn`, both elements of `sequence`).
fn position(s: &Map<String, Value>) -> i64 {
    let seq: Vec<Value> = s
        .get("sequence")
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    seq.iter()
        .chain(s.get("lsn"))
        .filter_map(int)
        .max()
        .unwrap_or(0)
}

/// A change's source position as the decoder orders it: (`sequence[0]`, else the change LSN; `sequence[1]`,
/// else `lsn`); `(0, 0)` without either.
fn order(s: &Map<String, Value>) -> (i64, i64) {
    let seq: Vec<Value> = s
        .get("sequence")
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let change = seq
        .get(1)
        .and_then(int)
        .or_else(|| s.get("lsn").and_then(int))
        .unwrap_or(0);
    (seq.first().and_then(int).unwrap_or(change), change)
}

/// Rewrites a change event into the snapshot read of its `after` state at `lsn`: `op = r`, no `before`,
/// `source.snapshot = flag`, `source.lsn = lsn`, `source.sequence = [null, "lsn"]` (a snapshot has no commit
/// LSN), `txId` and `ts_ms` of the snapshot's transaction.
fn as_snapshot_read(v: &mut Value, lsn: i64, tx: i64, ts: i64, flag: &str) {
    let env = match v.get("payload") {
        Some(Value::Object(_)) => v.get_mut("payload"),
        _ => Some(&mut *v),
    };
    let Some(env) = env.and_then(Value::as_object_mut) else {
        return;
    };
    env.insert("op".into(), Value::from("r"));
    env.insert("before".into(), Value::Null);
    if env.contains_key("ts_ms") {
        env.insert("ts_ms".into(), Value::from(ts));
    }
    if let Some(s) = env.get_mut("source").and_then(Value::as_object_mut) {
        s.insert("snapshot".into(), Value::from(flag));
        s.insert("lsn".into(), Value::from(lsn));
        s.insert("sequence".into(), Value::from(format!("[null,\"{lsn}\"]")));
        s.insert("txId".into(), Value::from(tx));
        s.insert("ts_ms".into(), Value::from(ts));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(p: i32, offset: i64, key: &str, op: &str, lsn: i64, after: Value) -> Rec {
        let v = serde_json::json!({
            "before": null, "after": after, "op": op, "ts_ms": lsn,
            "source": {"table": "t", "snapshot": "false", "lsn": lsn, "txId": lsn,
                       "ts_ms": lsn, "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 1)},
        });
        Rec {
            tp: ("db.public.t".into(), p),
            offset,
            timestamp_ms: Some(lsn),
            key: Some(key.as_bytes().to_vec()),
            value: Some(serde_json::to_vec(&v).unwrap()),
            old_key: None,
        }
    }

    #[test]
    fn reads_are_the_current_state_of_live_entities_at_a_new_position() {
        let recs = vec![
            rec(0, 0, "1", "c", 10, serde_json::json!({"id": 1, "x": "a"})),
            rec(1, 0, "2", "c", 11, serde_json::json!({"id": 2, "x": "b"})),
            rec(0, 1, "1", "u", 12, serde_json::json!({"id": 1, "x": "c"})),
            rec(1, 1, "2", "d", 13, Value::Null),
        ];
        let (out, _) = reads(&recs);
        assert_eq!(out.len(), 1, "a deleted entity has no snapshot read");
        let r = &out[0];
        assert_eq!((r.tp.1, r.offset), (0, 2));
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(v["op"], "r");
        assert_eq!(v["after"], serde_json::json!({"id": 1, "x": "c"}));
        assert_eq!(v["source"]["lsn"], 14);
        assert_eq!(v["source"]["sequence"], "[null,\"14\"]");
        assert_eq!(v["source"]["snapshot"], "last");
    }

    #[test]
    fn an_entitys_current_state_is_its_newest_change_by_position_not_by_file_order() {
        let recs = vec![
            rec(0, 0, "1", "u", 20, serde_json::json!({"id": 1, "x": "new"})),
            // An older change of the same entity later in the file (another partition).
            rec(1, 0, "1", "c", 10, serde_json::json!({"id": 1, "x": "old"})),
            rec(1, 1, "2", "d", 30, Value::Null),
            rec(
                0,
                1,
                "2",
                "c",
                25,
                serde_json::json!({"id": 2, "x": "gone"}),
            ),
        ];
        let (out, _) = reads(&recs);
        assert_eq!(
            out.len(),
            1,
            "entity 2 was deleted after its create: {out:?}"
        );
        let v: Value = serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(v["after"]["x"], "new");
        assert_eq!(v["source"]["lsn"], 31);
    }

    #[test]
    fn an_entity_with_two_states_at_its_newest_position_gets_no_read() {
        let recs = vec![
            rec(0, 0, "1", "c", 10, serde_json::json!({"id": 1, "x": "a"})),
            // The same position again with another state (a recorded conflict), and once more with the first.
            rec(1, 0, "1", "c", 10, serde_json::json!({"id": 1, "x": "b"})),
            rec(0, 1, "2", "c", 11, serde_json::json!({"id": 2, "x": "c"})),
            rec(1, 1, "2", "c", 11, serde_json::json!({"id": 2, "x": "c"})),
        ];
        let (out, skipped) = reads(&recs);
        assert_eq!(skipped, 1);
        assert_eq!(out.len(), 1, "{out:?}");
        let v: Value = serde_json::from_slice(out[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(
            v["after"]["x"], "c",
            "a redelivery of the same state is no conflict"
        );
    }
}
