//! Schema-registry framed records (issue 14 part 1): case C41 on a plain-JSON pipeline (no registry), and
//! Avro / JSON Schema values and keys through the real registry started by `scripts/registry-start`
//! (`tests/it/registry.rs` helpers).

use crate::cases::{case_topic, load, ORDERS};
use crate::common::*;

/// The dead letters as (offset, reason, detail, value).
pub fn dead_letters(db: &Db) -> Vec<(i64, String, String, Option<Vec<u8>>)> {
    db.query(
        "SELECT \"offset\", reason, detail, value FROM {s}.replaysafe_dead_letters ORDER BY partition, \"offset\"",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// The ORDERS pipeline of the cases, with `extra` appended to its `[source]`-less text.
pub fn orders(topic: &str, group: &str, db: &Db, extra: &str) -> Pipeline {
    let text = ORDERS.replace("MAXBYTES", "") + extra;
    let text = text.replace("{schema}.", &format!("\"{}\".", db.schema));
    pipeline(&text, topic, group, &db.schema)
}

/// C41: on a pipeline that reads plain JSON, a JSON Schema frame, an Avro frame and a truncated frame are each
/// quarantined as `schema-registry` with a reason that names the frame (not the parser's "line 1 column 1"),
/// their raw bytes kept (bytea); the partition never stalls; a replay adds no second dead letter.
#[test]
fn c41_framed_values_on_a_json_pipeline_are_quarantined_by_name() {
    let db = Db::fresh("c41");
    let (topic, map) = case_topic("C41", "c41", 1, None);
    let group = unique("g");
    let p = orders(&topic, &group, &db, "");
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (5, 2, 0, 0, 3)
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 3, "{dl:?}");
    let recs = load("C41", None);
    for (i, (case_offset, want)) in [
        (601, "schema-registry framed payload (magic 0, schema id 7)"),
        (602, "unsupported encoding: schema-registry Avro"),
        (603, "truncated schema-registry frame"),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(dl[i].0, map[&(0, case_offset)]);
        assert_eq!(dl[i].1, "schema-registry", "{dl:?}");
        assert!(dl[i].2.starts_with(want), "{case_offset}: {dl:?}");
        assert_eq!(dl[i].3, recs[i + 1].rec.value, "raw bytes kept");
    }
    assert!(dl[1].2.contains("schema id 8"), "{dl:?}");
    let order = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = 'o-600'",
        &[],
    );
    assert_eq!(order.len(), 1);
    assert_eq!(
        (order[0].get::<_, String>(0), order[0].get::<_, i64>(1)),
        ("SHIPPED".to_string(), 3)
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 2);
    let end = map[&(0, 604)] + 1;
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(end));
    assert_eq!(committed(&group, &topic, 1), vec![Some(end)]);
    let again = run_caught_up(&orders(&topic, &unique("g2"), &db, "").path).tally();
    assert_eq!((again.landed, again.duplicate, again.quarantined), (0, 2, 3));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"), 3);
}

/// `[source]` for JSON events read as schema-registry Avro from `url`.
pub fn avro_source(url: &str) -> String {
    format!("\n[source]\nformat = \"json\"\nencoding = \"avro\"\nschema-registry = {{ url = \"{url}\" }}\n")
}

/// A registry that does not answer is not the record's fault: the run retries for `--connect-timeout`, then
/// stops with exit 1 naming the registry — no dead letter, no checkpoint past the record.
#[test]
fn registry_down_stops_the_run_without_dead_letters() {
    let db = Db::fresh("regdown");
    let topic = new_topic("regdown", 1);
    let frame = [0u8, 0, 0, 0, 1, 2, b'a'].to_vec();
    let rec = Rec {
        partition: 0,
        key: Some(b"k".to_vec()),
        value: Some(frame),
        timestamp_ms: None,
    };
    produce(&topic, &[rec]);
    let group = unique("g");
    let p = orders(&topic, &group, &db, &avro_source("http://127.0.0.1:1/apis/ccompat/v7"));
    let config = p.path.to_str().expect("utf-8 path").to_string();
    let out = replaysafe_with(
        &["run", "--config", &config, "--until-caught-up", "--connect-timeout", "2"],
        &[],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("schema registry http://127.0.0.1:1/apis/ccompat/v7: gave up after")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"), 0);
    let cp = db.checkpoint(&group, &topic, 0);
    assert!(cp.unwrap_or(0) == 0, "checkpoint {cp:?} moved past the record");
    assert!(committed(&group, &topic, 1)[0].unwrap_or(0) == 0);
}
