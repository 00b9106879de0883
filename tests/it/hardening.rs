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

/// Issue 35.3: event days far in the future are bounded by `[ledger] future-days` (default 7): a record of a
/// later day is quarantined as `future-day` naming the day and the bound, and creates no ledger partition (1,500
/// such records created 1,500 partitions); under `--no-ddl` it no longer stops the run for good.
#[test]
fn event_days_beyond_future_days_are_quarantined_without_a_partition() {
    let (db, topic) = stage("future", 2);
    let today = chrono::Utc::now().date_naive();
    let event = |n: u32, day: chrono::NaiveDate| {
        Rec::json(
            (n % 2) as i32,
            "c",
            &format!(
                r#"{{"event_id":"{}","customer_id":"c","amount":"1","occurred_at":"{day}T10:00:00Z"}}"#,
                uuid::Uuid::from_u128(u128::from(n) + 0xf0f0_0000)
            ),
            chrono::Utc::now().timestamp_millis(),
        )
    };
    let in3 = today + chrono::Days::new(3);
    let far: Vec<Rec> = (0..40)
        .map(|n| event(n, today + chrono::Days::new(400 + u64::from(n))))
        .collect();
    let mut recs = vec![event(100, today), event(101, in3)];
    recs.extend(far);
    recs.push(event(
        102,
        chrono::NaiveDate::from_ymd_opt(2099, 1, 1).unwrap(),
    ));
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (2, 41), "{t:?}");
    let partitions = db.i64(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = '{s}.replaysafe_ledger'::regclass",
    );
    assert_eq!(partitions, 2, "today and today + 3 only");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'future-day'"),
        41
    );
    let detail = db
        .text("SELECT detail FROM {s}.replaysafe_dead_letters WHERE detail LIKE '%2099-01-01%'")
        .unwrap();
    assert!(
        detail.contains("event day 2099-01-01") && detail.contains("future-days = 7"),
        "{detail}"
    );
    assert_eq!(counts(&db).values().sum::<i64>(), 2);

    // Without DDL (init made the partitions): a day of 2099 is quarantined, not a stop.
    let (db2, topic2) = stage("future_noddl", 2);
    produce(
        &topic2,
        &[
            event(200, today),
            event(201, chrono::NaiveDate::from_ymd_opt(2099, 6, 1).unwrap()),
            event(202, today),
        ],
    );
    let p2 = pipeline(SEED, &topic2, &unique("g"), &db2.schema);
    replaysafe(&["init", "--config", arg(&p2.path), "--days", "1"]).assert_ok();
    let out = replaysafe(&[
        "run",
        "--config",
        arg(&p2.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.landed, t.quarantined), (2, 1), "{t:?}");
    assert_eq!(
        db2.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'future-day'"),
        1
    );
}

/// `[ledger] future-days` is checked with `file:line`: out of range, or without `partition-by`.
#[test]
fn future_days_is_checked_in_the_file() {
    let db = Db::fresh("future_cfg");
    let topic = unique("t");
    for (text, want) in [
        (
            SEED.replacen(
                "[[projection]]",
                "[ledger]\nfuture-days = 400\n\n[[projection]]",
                1,
            ),
            "`future-days` must be between 0 and 366",
        ),
        (
            SEED.replace("partition-by = \"day\"\n", "").replacen(
                "[[projection]]",
                "[ledger]\nfuture-days = 3\n\n[[projection]]",
                1,
            ),
            "`future-days` needs `identity.partition-by`",
        ),
    ] {
        let p = pipeline(&text, &topic, "g", &db.schema);
        let out = replaysafe(&["check", "--config", arg(&p.path)]);
        assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
        assert!(out.stderr.contains(want), "{}", out.stderr);
        assert!(out.stderr.contains("pipeline.toml:"), "{}", out.stderr);
    }
}
