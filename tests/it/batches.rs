//! `batch.max-bytes` (issue 15): a partition batch — one PostgreSQL transaction — holds at most that many bytes
//! of record keys and values, as well as at most `max-records` records; a record larger than the limit is a batch
//! of its own. Each batch's ledger rows share the transaction's `xmin`, so the batches are read back from the
//! ledger itself.

use std::collections::{BTreeMap, HashMap};

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// Bytes of keys and values per batch, at most.
const MAX_BYTES: usize = 2000;

#[test]
fn batches_are_cut_by_bytes_and_a_larger_record_is_a_batch_of_its_own() {
    let (db, topic) = stage("maxbytes", 3);
    let (mut recs, mut truth) = seed_events(300, 3);
    // One record of ~6 KB (a padding member the pipeline does not read), in the middle of partition 1.
    let big_id = uuid::Uuid::new_v4().to_string();
    let pad = "x".repeat(3 * MAX_BYTES);
    let occurred = "2024-04-27T10:00:00+00:00";
    recs.insert(
        151,
        Rec::json(
            1,
            "c-big",
            &format!(r#"{{"event_id":"{big_id}","customer_id":"c-big","amount":"1.00","occurred_at":"{occurred}","pad":"{pad}"}}"#),
            1_714_212_000_000,
        ),
    );
    truth.insert(("2024-04-27".into(), "c-big".into()), 1);
    let size: HashMap<String, usize> = recs
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
            let n = r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len);
            (v["event_id"].as_str().unwrap().to_string(), n)
        })
        .collect();
    let offsets = produce(&topic, &recs);
    let group = unique("g");
    let text = SEED
        .replace(
            "max-records = 200",
            &format!("max-records = 5000\nmax-bytes = {MAX_BYTES}"),
        )
        .replace("linger-ms = 20", "linger-ms = 500");
    let out = run_text(&text, &topic, &group, &db);
    out.assert_ok();

    // Final state: every event counted once, every partition's checkpoint at its end.
    assert_eq!(counts(&db), truth);
    assert_eq!(out.tally().landed, recs.len() as u64, "{}", out.stdout);
    for p in 0..3 {
        let end = recs
            .iter()
            .zip(&offsets)
            .filter(|(r, _)| r.partition == p)
            .map(|(_, o)| o + 1)
            .max();
        assert_eq!(
            db.checkpoint(&group, &topic, p),
            end,
            "checkpoint of partition {p}"
        );
    }

    // The batches, as the ledger rows of each transaction.
    let rows = db.query(
        "SELECT xmin::text, event_id::text FROM {s}.replaysafe_ledger",
        &[],
    );
    assert_eq!(rows.len(), recs.len());
    let mut batches: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &rows {
        batches.entry(r.get(0)).or_default().push(r.get(1));
    }
    let total: usize = size.values().sum();
    assert!(
        batches.len() >= total / MAX_BYTES,
        "{} batches for {total} bytes of keys and values",
        batches.len()
    );
    for ids in batches.values() {
        let bytes: usize = ids.iter().map(|id| size[id]).sum();
        if ids.contains(&big_id) {
            assert_eq!(
                ids.len(),
                1,
                "the record larger than max-bytes shares its batch: {ids:?}"
            );
        } else {
            assert!(
                bytes <= MAX_BYTES,
                "a batch of {} records holds {bytes} bytes",
                ids.len()
            );
        }
    }
}
