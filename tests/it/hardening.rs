//! Faults found by trying to break the pipeline: each is a test of the whole class, asserting final state.

use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

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

/// A topic recreated under a new stream generation starts from its own positions: checkpoints are kept per
/// generation (it used to resume at the old topic's offset and skip the new records).
#[test]
fn a_new_generation_does_not_reuse_the_old_topics_checkpoints() {
    let (db, topic) = stage("gen", 1);
    let (first, _) = seed_events(100, 1);
    produce(&topic, &first);
    let group = unique("g");
    let g1 = SEED.replace(
        "key = [\"event_id\"]",
        "key = [\"event_id\"]\ngeneration = \"g1\"",
    );
    let p1 = pipeline(&g1, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p1.path).tally().landed, 100);
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let (second, _) = seed_events(150, 1);
    produce(&topic, &second);
    let p2 = pipeline(&g1.replace("\"g1\"", "\"g2\""), &topic, &group, &db.schema);
    let t = run_caught_up(&p2.path).tally();
    assert_eq!(
        (t.consumed, t.landed),
        (150, 150),
        "every record of the new topic is read"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g2'"),
        150
    );
}

/// Outbox rows are unique by an unambiguous encoding of the delivery key (two different keys whose texts
/// joined with `|` coincide used to collide, and one message was lost).
#[test]
fn outbox_delivery_keys_do_not_collide() {
    let (db, topic) = stage("outbox", 1);
    let text = concat!(
        header!(),
        r#"[fields]
a = { path = "/a", type = "text" }
b = { path = "/b", type = "text" }
[identity]
key = ["a", "b"]
[[projection]]
kind = "outbox"
"#
    );
    produce(
        &topic,
        &[
            Rec::json(0, "k", r#"{"a":"x|y","b":"z"}"#, 1_714_003_200_000),
            Rec::json(0, "k", r#"{"a":"x","b":"y|z"}"#, 1_714_003_200_000),
        ],
    );
    let p = pipeline(text, &topic, &unique("g"), &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_outbox"), 2);
}

/// A second pipeline with other projections on the same ledger is refused (it used to find every event
/// already claimed and leave its projections empty).
#[test]
fn a_ledger_is_not_shared_by_pipelines_with_other_projections() {
    let (db, topic) = stage("shared", 1);
    let (recs, _) = seed_events(50, 1);
    produce(&topic, &recs);
    let p1 = pipeline(SEED, &topic, &unique("g"), &db.schema);
    run_caught_up(&p1.path);
    let other = SEED.replace("table = \"daily_counts\"", "table = \"other_counts\"");
    let p2 = pipeline(&other, &topic, &unique("g"), &db.schema);
    let out = try_run(&p2.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("own [ledger] table"), "{}", out.stderr);
    // Its own ledger over the first pipeline's `daily_totals` is refused: that table would count every event
    // twice (issue 16.1); nothing is created.
    let own = other.replace(
        "[identity]",
        "[ledger]\ntable = \"other_ledger\"\n\n[identity]",
    );
    let out = try_run(&pipeline(&own, &topic, &unique("g"), &db.schema).path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("is fed by ledger"), "{}", out.stderr);
    assert_eq!(
        db.text("SELECT to_regclass('{s}.other_ledger')::text"),
        None
    );
    // With its own ledger and tables it counts everything; the first pipeline's tables are unchanged.
    let own = own.replace("\"daily_totals\"", "\"other_totals\"");
    let p3 = pipeline(&own, &topic, &unique("g"), &db.schema);
    assert_eq!(run_caught_up(&p3.path).tally().landed, 50);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.other_counts"), 50);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 50);
}

/// A topic that does not exist is a clear error (exit 2), not a silent wait.
#[test]
fn a_missing_topic_exits_2() {
    let db = Db::fresh("notopic");
    let p = pipeline(SEED, &unique("no_such_topic"), &unique("g"), &db.schema);
    let out = try_run_with(&p.path, &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
}
