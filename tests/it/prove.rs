//! `replaysafe prove` (issue 12): it passes on every example pipeline (JSON counters, CDC row projection,
//! outbox) and fails — naming the boundary and showing the differing rows — on three deliberately unsafe
//! pipelines: a `sql` projection keeping the last writer per entity without a version, one writing `now()`
//! into a business column, and an identity of its own built from `_partition`/`_offset`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use replaysafe::ops::prove::{self, Boundary, Fixture, ProveOptions, Report};

use crate::common::{database_url, replaysafe_with, unique};

fn options(records: &Path, shuffles: u32) -> ProveOptions {
    ProveOptions {
        fixture: Fixture::File(records.to_path_buf()),
        database_url: database_url(),
        brokers: None,
        keep: false,
        shuffles,
        seed: 42,
        progress: false,
    }
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/prove")
        .join(name)
}

fn boundary(r: &Report, n: u8) -> &Boundary {
    r.boundaries
        .iter()
        .find(|b| b.number == n)
        .expect("boundary")
}

/// Every boundary passes except those named `n/a`, which must be exactly `na`; no scratch schema is left.
fn assert_passes(r: &Report, na: &[u8]) {
    assert_eq!(r.boundaries.len(), 10, "{}", r.text());
    for b in &r.boundaries {
        let want = if na.contains(&b.number) {
            "n/a"
        } else {
            "pass"
        };
        assert_eq!(
            b.result,
            want,
            "boundary {} {}: {}\n{}",
            b.number,
            b.name,
            b.note,
            r.text()
        );
        assert!(b.diff.is_empty());
    }
    assert!(r.passed && r.kept.is_empty(), "{}", r.text());
    let db = crate::common::Db::fresh("prove_left");
    let left = db.i64(&format!(
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rsprove\\_{}\\_%'",
        r.run_id
    ));
    assert_eq!(left, 0, "scratch schemas left behind");
}

#[test]
fn prove_passes_on_the_counters_example() {
    let r = prove::prove(
        &example("counters.toml"),
        options(&example("counters.jsonl"), 4),
    )
    .unwrap();
    assert_passes(&r, &[6]);
    assert_eq!(r.records, 252);
    // The reference is what the fixture says: 240 distinct events, 11 redeliveries, 1 malformed record.
    assert!(
        boundary(&r, 1)
            .note
            .starts_with("consumed 252 = landed 240 + duplicate 11"),
        "{}",
        r.text()
    );
    assert!(
        boundary(&r, 7)
            .note
            .contains("quarantined all 251 claimed records as beyond-horizon"),
        "{}",
        r.text()
    );
    assert!(
        boundary(&r, 9).note.contains("COMMITs applied and"),
        "{}",
        r.text()
    );
    assert!(r.answers.contains("What identifies a change"));
}

#[test]
fn prove_passes_on_the_cdc_example() {
    let r = prove::prove(&example("cdc.toml"), options(&example("cdc.jsonl"), 4)).unwrap();
    assert_passes(&r, &[7]);
    assert!(
        boundary(&r, 6).note.contains("snapshot reads"),
        "{}",
        r.text()
    );
}

#[test]
fn prove_passes_on_the_outbox_example() {
    let r = prove::prove(
        &example("outbox.toml"),
        options(&example("counters.jsonl"), 4),
    )
    .unwrap();
    assert_passes(&r, &[6, 7]);
    assert!(
        boundary(&r, 5).note.contains("under generation"),
        "{}",
        r.text()
    );
}

/// Order status events keyed by event id (an order's changes spread over the 3 partitions): `orders` orders,
/// each with a `placed`, a `paid` and (every other one) a `shipped` event.
fn status_fixture(dir: &Path, orders: usize) -> PathBuf {
    let mut lines = Vec::new();
    let mut offsets = [0i64; 3];
    let mut k = 0usize;
    for step in ["placed", "paid", "shipped"] {
        for o in 0..orders {
            if step == "shipped" && o % 2 == 1 {
                continue;
            }
            let p = (k * 7 + o) % 3;
            k += 1;
            let payload = format!(
                r#"{{"event_id":"{}","order_id":"o-{o}","status":"{step}"}}"#,
                uuid::Uuid::from_u64_pair(9, k as u64)
            );
            lines.push(serde_json::json!({
                "topic": "shop.orders", "partition": p, "offset": offsets[p], "tstype": "create",
                "ts": 1_795_996_800_000i64 + k as i64, "key": null, "payload": payload,
            }).to_string());
            offsets[p] += 1;
        }
    }
    let path = dir.join("orders.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A pipeline over `shop.orders` with one `sql` projection (`SETUP` and `SQL`, `{s}` the schema).
fn sql_pipeline(dir: &Path, schema: &str, generation: bool, setup: &str, sql: &str) -> PathBuf {
    let text = format!(
        r#"
[kafka]
group-id = "orders"
topics = ["shop.orders"]
start = "earliest"

[postgres]
schema = "{schema}"

[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}

[identity]
key = ["event_id"]
{}

[[projection]]
kind = "sql"
setup = "{}"
sql = "{}"
"#,
        if generation {
            "generation = \"g1\""
        } else {
            ""
        },
        setup.replace("{s}", schema),
        sql.replace("{s}", schema)
    );
    let path = dir.join("orders.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn prove_fails_on_a_last_writer_sql_projection_in_the_shuffles() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_lw");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.order_status (order_id text PRIMARY KEY, status text NOT NULL)",
        "INSERT INTO {s}.order_status (order_id, status) SELECT DISTINCT ON (order_id) order_id, status FROM landed \
         ORDER BY order_id, _offset DESC ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status",
    );
    let r = prove::prove(&p, options(&status_fixture(dir.path(), 12), 20)).unwrap();
    assert!(!r.passed, "{}", r.text());
    // Replays of the same order pass; a cross-partition interleaving ends with another last writer.
    assert_eq!(boundary(&r, 2).result, "pass", "{}", r.text());
    let b = boundary(&r, 4);
    assert_eq!(b.result, "fail", "{}", r.text());
    assert!(b.note.starts_with("shuffle "), "{}", b.note);
    let d = b
        .diff
        .iter()
        .find(|d| d.table == "order_status")
        .expect("order_status differs");
    assert!(!d.expected.is_empty() && !d.got.is_empty(), "{d:?}");
    assert!(
        d.expected[0].starts_with("order_id=o-") && d.expected[0].contains("status="),
        "{d:?}"
    );
    let text = r.text();
    assert!(
        text.contains("── 4 permitted shuffles") && text.contains("     expected  order_id=o-"),
        "{text}"
    );
    assert!(
        text.contains("FAILED: ") && text.contains("4 permitted shuffles"),
        "{text}"
    );
}

#[test]
fn prove_fails_on_now_in_a_business_column_exit_6_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_now");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.seen (event_id uuid PRIMARY KEY, first_seen text NOT NULL)",
        "INSERT INTO {s}.seen (event_id, first_seen) SELECT event_id, clock_timestamp()::text FROM landed",
    );
    let fixture = status_fixture(dir.path(), 4);
    let args = [
        "prove",
        "--config",
        p.to_str().unwrap(),
        "--records",
        fixture.to_str().unwrap(),
        "--shuffles",
        "2",
        "--json",
    ];
    let out = replaysafe_with(&args, &[], Duration::from_secs(600));
    assert_eq!(out.code, Some(6), "{}\n{}", out.stdout, out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["passed"], false);
    let b = &json["boundaries"];
    // The replay on top of the reference writes nothing (every record a duplicate); every state built again
    // carries other times.
    assert_eq!(b[1]["result"], "pass", "{}", out.stdout);
    assert_eq!(b[2]["number"], 3);
    assert_eq!(b[2]["result"], "fail", "{}", out.stdout);
    let diff = &b[2]["diff"][0];
    assert_eq!(diff["table"], "seen", "{}", out.stdout);
    assert!(
        diff["expected"][0]
            .as_str()
            .unwrap()
            .contains("first_seen="),
        "{}",
        out.stdout
    );
    assert!(
        diff["got"][0].as_str().unwrap().contains("first_seen="),
        "{}",
        out.stdout
    );
}

#[test]
fn prove_fails_on_an_offset_identity_on_a_rebuilt_topic() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_off");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        true,
        "CREATE TABLE IF NOT EXISTS {s}.events (part int, off bigint, order_id text, status text, PRIMARY KEY (part, off))",
        "INSERT INTO {s}.events SELECT _partition, _offset, order_id, status FROM landed ON CONFLICT DO NOTHING",
    );
    let r = prove::prove(&p, options(&status_fixture(dir.path(), 6), 2)).unwrap();
    assert!(!r.passed, "{}", r.text());
    for n in [2, 3, 4, 8, 9] {
        assert_eq!(boundary(&r, n).result, "pass", "{}", r.text());
    }
    let b = boundary(&r, 5);
    assert_eq!(b.result, "fail", "{}", r.text());
    let d = b
        .diff
        .iter()
        .find(|d| d.table == "events")
        .expect("events differs");
    assert_eq!(d.counts, (15, 15));
    assert!(
        d.got[0].starts_with("part=") && d.got[0].contains("off="),
        "{d:?}"
    );
}
