//! The hostile-input cases of issue 11, each produced to a real broker (or written as a kcat dump) and run
//! through the binary; the case's `expected` is the oracle: C35 (U+0000, unpaired surrogates), C39 (numbers
//! beyond f64/i64), C42 (transactional producers: aborted records never reach the ledger; `read_uncommitted`
//! refused), C43 (kcat -J dumps: `payload_error`, null vs empty key, headers, missing `ts`, raw bytes).

use crate::cases::{case_topic, load, ORDERS};
use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// [`ORDERS`] plus the fields and projections C35 and C39 name: `customers` (display_name as text) and
/// `order_facts` (total, external_ref, points as numeric).
fn hostile_pipeline(topic: &str, group: &str, db: &Db) -> Pipeline {
    let fields = r#"notes = { path = "/data/notes", type = "text", optional = true }
display_name = { path = "/data/display_name", type = "text", optional = true }
total = { path = "/data/total", type = "numeric", optional = true }
external_ref = { path = "/data/external_ref", type = "numeric", optional = true }
points = { path = "/data/points", type = "numeric", optional = true }
"#;
    let projections = r#"
[[projection]]
name = "customers"
kind = "sql"
filter = "event_type == 'CustomerRenamed'"
setup = """CREATE TABLE IF NOT EXISTS {schema}.customers (customer_id text PRIMARY KEY, display_name text NOT NULL)"""
sql = """INSERT INTO {schema}.customers SELECT entity_id, display_name FROM landed
ON CONFLICT (customer_id) DO UPDATE SET display_name = EXCLUDED.display_name"""

[[projection]]
name = "order_facts"
kind = "sql"
filter = "event_type == 'OrderPlaced' || event_type == 'LoyaltyAccrued'"
setup = """CREATE TABLE IF NOT EXISTS {schema}.order_facts (order_id text PRIMARY KEY, total numeric,
  external_ref numeric, points numeric)"""
sql = """INSERT INTO {schema}.order_facts SELECT entity_id, max(total), max(external_ref), max(points) FROM landed
GROUP BY entity_id ON CONFLICT (order_id) DO UPDATE SET total = coalesce(EXCLUDED.total, order_facts.total),
  external_ref = coalesce(EXCLUDED.external_ref, order_facts.external_ref),
  points = coalesce(EXCLUDED.points, order_facts.points)"""
"#;
    let text = ORDERS.replace("MAXBYTES", "").replace(
        "notes = { path = \"/data/notes\", type = \"text\", optional = true }\n",
        fields,
    ) + projections;
    let text = text.replace("{schema}.", &format!("\"{}\".", db.schema));
    pipeline(&text, topic, group, &db.schema)
}

/// The dead letters as (offset, reason, detail, value).
fn dead_letters(db: &Db) -> Vec<(i64, String, String, Option<Vec<u8>>)> {
    db.query(
        "SELECT \"offset\", reason, detail, value FROM {s}.replaysafe_dead_letters ORDER BY partition, \"offset\"",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// C35: U+0000 and an unpaired surrogate are quarantined with reasons that name them; the emoji pair is stored
/// intact; the good records of the same batch land once; a replay adds no second dead letter.
#[test]
fn c35_nul_and_unpaired_surrogate_are_quarantined_by_name() {
    let db = Db::fresh("c35");
    let (topic, map) = case_topic("C35", "c35", 1, None);
    let group = unique("g");
    let p = hostile_pipeline(&topic, &group, &db);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (5, 3, 0, 0, 2)
    );
    let customers = db.query(
        "SELECT customer_id, display_name FROM {s}.customers ORDER BY customer_id",
        &[],
    );
    let got: Vec<(String, String)> = customers.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want = [
        ("c-400", "Ana"),
        ("c-402", "Cy \u{1F600}"),
        ("c-404", "Eve"),
    ];
    assert_eq!(
        got,
        want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec(),
        "U+1F600 stored intact"
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 2, "{dl:?}");
    assert_eq!(dl[0].0, map[&(0, 401)]);
    assert_eq!(dl[0].1, "invalid-field");
    assert!(
        dl[0].2.contains("NUL") && dl[0].2.contains("display_name"),
        "{dl:?}"
    );
    let raw_401 = load("C35", None)[1].rec.value.clone();
    assert_eq!(dl[0].3, raw_401, "raw bytes kept");
    assert_eq!(dl[1].0, map[&(0, 403)]);
    assert_eq!(dl[1].1, "invalid-json");
    assert!(
        dl[1].2.contains("unpaired surrogate \\ud800"),
        "the detail names the surrogate, not the parser's hex-escape message: {dl:?}"
    );
    assert_eq!(dl[1].3, load("C35", None)[3].rec.value, "raw bytes kept");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 3);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 3);
    let end = map[&(0, 404)] + 1;
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(end));
    assert_eq!(committed(&group, &topic, 1), vec![Some(end)]);
    // A replay under another group: every good record a duplicate, no second dead letter.
    let again = run_caught_up(&hostile_pipeline(&topic, &unique("g2"), &db).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 3, 2)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        2
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.customers"), 3);
}

/// C39: numbers beyond f64 and i64 keep the producer's digits (NUMERIC), 0.1 + 0.2 is 0.3, and a version above
/// i64::MAX is quarantined — never wrapped, saturated or rounded.
#[test]
fn c39_numbers_beyond_f64_and_i64_keep_their_digits() {
    let db = Db::fresh("c39");
    let (topic, map) = case_topic("C39", "c39", 1, None);
    let group = unique("g");
    let p = hostile_pipeline(&topic, &group, &db);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (5, 4, 1));
    let facts = db.query(
        "SELECT total::text, external_ref::text, points::text FROM {s}.order_facts WHERE order_id = 'o-500'",
        &[],
    );
    assert_eq!(
        (
            facts[0].get::<_, String>(0),
            facts[0].get::<_, String>(1),
            facts[0].get::<_, String>(2)
        ),
        (
            "12345678901234567.89".to_string(),
            "9007199254740993".to_string(),
            "327267367867168100000".to_string()
        )
    );
    assert_eq!(
        db.text("SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-50'")
            .as_deref(),
        Some("0.3"),
        "0.1 + 0.2 summed as NUMERIC"
    );
    let order = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = 'o-500'",
        &[],
    );
    // The case's "version stays 4": LoyaltyAccrued (v4) does not touch `orders` in this pipeline, so 3 (PAID);
    // 504 (OrderNoted, version 2^63) would have moved it.
    assert_eq!(
        (order[0].get::<_, String>(0), order[0].get::<_, i64>(1)),
        ("PAID".to_string(), 3)
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].0, map[&(0, 504)]);
    assert_eq!(dl[0].1, "invalid-field");
    assert!(
        dl[0].2.contains("version") && dl[0].2.contains("9223372036854775808"),
        "{dl:?}"
    );
    assert_eq!(dl[0].3, load("C39", None)[4].rec.value, "raw bytes kept");
    let end = map[&(0, 504)] + 1;
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(end));
    // Replaying gives identical values.
    run_caught_up(&hostile_pipeline(&topic, &unique("g2"), &db).path);
    assert_eq!(
        db.text("SELECT total::text || '/' || points::text FROM {s}.order_facts")
            .as_deref(),
        Some("12345678901234567.89/327267367867168100000")
    );
    assert_eq!(
        db.text("SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-50'")
            .as_deref(),
        Some("0.3")
    );
}

/// A value with a NUL character inside a uuid/date/numeric string is quarantined (its detail escaped), and
/// the partition moves on — it used to make the dead-letter insert itself fail on every restart.
#[test]
fn nul_characters_in_typed_fields_are_quarantined() {
    let (db, topic) = stage("nul", 1);
    let good = r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301","customer_id":"c","amount":"1","occurred_at":"2024-04-25T00:00:00Z"}"#;
    let recs: Vec<Rec> = [
        r#"{"event_id":"\u0000","customer_id":"c","amount":"1","occurred_at":"2024-04-25"}"#,
        r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3302","customer_id":"c","amount":"1","occurred_at":"2024-04-25\u0000"}"#,
        r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3303","customer_id":"c","amount":"12\u00005","occurred_at":"2024-04-25"}"#,
        r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3304","customer_id":"c\u0000","amount":"1","occurred_at":"2024-04-25"}"#,
        r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3305","customer_id":"c","amount":"1_000","occurred_at":"2024-04-25"}"#,
        good,
    ]
    .iter()
    .map(|v| Rec::json(0, "k", v, 1_714_003_200_000))
    .collect();
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (1, 5), "{t:?}");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'invalid-field'"),
        5
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE detail LIKE '%\\u0000%'"),
        3
    );
    assert_eq!(counts(&db).values().sum::<i64>(), 1);
}

/// Issue 35.3: a record whose group-by text is longer than a B-tree index row may be (~2.7 kB; SQLSTATE 54000)
/// used to stop `run` at its offset on every restart, the valid records behind it waiting for good. A value
/// PostgreSQL rejects for any record-specific reason is quarantined as `rejected-by-database` and the partition
/// goes on (batch sizes 1 and 200).
#[test]
fn a_group_by_text_too_long_for_an_index_is_quarantined_and_the_rest_applies() {
    for max in [1, 200] {
        let (db, topic) = stage("longkey", 2);
        let (mut recs, mut truth) = seed_events(40, 2);
        // 3,000 characters that do not compress (PostgreSQL compresses index tuples before it checks the size).
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        let long: String = (0..375)
            .map(|_| {
                h ^= h << 13;
                h ^= h >> 7;
                h ^= h << 17;
                format!("{:08x}", h as u32)
            })
            .collect();
        let bad = format!(
            r#"{{"event_id":"{}","customer_id":"{long}","amount":"1","occurred_at":"2024-04-25T10:00:00Z"}}"#,
            uuid::Uuid::new_v4()
        );
        recs.insert(5, Rec::json(1, "long", &bad, 1_714_039_200_000));
        let (after, more) = seed_events(10, 2);
        recs.extend(after);
        for (k, n) in more {
            *truth.entry(k).or_insert(0) += n;
        }
        produce(&topic, &recs);
        let text = SEED.replace("max-records = 200", &format!("max-records = {max}"));
        let group = unique("g");
        let p = pipeline(&text, &topic, &group, &db.schema);
        let t = run_caught_up(&p.path).tally();
        assert_eq!(
            (t.landed, t.quarantined),
            (50, 1),
            "max-records {max}: {t:?}"
        );
        assert_eq!(counts(&db), truth, "max-records {max}");
        let dead = db.query(
            "SELECT reason, detail, length(value) FROM {s}.replaysafe_dead_letters",
            &[],
        );
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].get::<_, &str>(0), "rejected-by-database");
        assert!(
            dead[0].get::<_, &str>(1).contains("index row"),
            "{}",
            dead[0].get::<_, &str>(1)
        );
        assert_eq!(dead[0].get::<_, i32>(2) as usize, bad.len());
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 50);
        let per_partition: i64 = (0..2)
            .map(|i| db.checkpoint(&group, &topic, i).unwrap())
            .sum();
        assert_eq!(
            per_partition, 51,
            "max-records {max}: checkpoints at the ends"
        );
    }
}
