//! The ledger's delivery keys are kept by an exclusion constraint over a hash index on each day partition
//! (issue 15: ledger ≤ 100 bytes/event), not by a primary key: PostgreSQL itself refuses a second row of a key —
//! from any writer, replaysafe or not —, a replay claims nothing twice, and a day partition made by hand without
//! the constraint is refused before anything is claimed into it.

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// Replays the whole topic under a fresh group in batches of `max_records`: every one of the `records` is a
/// duplicate, and the counts stay `truth`.
fn replay_lands_nothing(
    db: &Db,
    topic: &str,
    max_records: usize,
    records: u64,
    truth: &std::collections::BTreeMap<(String, String), i64>,
) {
    let text = SEED.replace("max-records = 200", &format!("max-records = {max_records}"));
    let replay = run_text(&text, topic, &unique("g"), db);
    let t = replay.tally();
    assert_eq!((t.landed, t.duplicate), (0, records), "{}", replay.stdout);
    assert_eq!(&counts(db), truth);
}

#[test]
fn postgres_refuses_a_second_row_of_a_delivery_key_and_a_replay_claims_nothing_twice() {
    let (db, topic) = stage("hashkey", 3);
    let (mut recs, truth) = seed_events(600, 3);
    // Redeliveries of 20 events on another partition (a producer retry after a failover).
    let again: Vec<Rec> = recs[..20]
        .iter()
        .map(|r| {
            Rec::json(
                (r.partition + 1) % 3,
                "k",
                std::str::from_utf8(r.value.as_ref().unwrap()).unwrap(),
                1_714_003_200_000,
            )
        })
        .collect();
    recs.extend(again);
    produce(&topic, &recs);
    let first = run_text(
        &SEED.replace("max-records = 200", "max-records = 1"),
        &topic,
        &unique("g"),
        &db,
    );
    assert_eq!(counts(&db), truth);
    let t = first.tally();
    assert_eq!((t.landed, t.duplicate), (600, 20), "{}", first.stdout);
    // A replay of everything by a fresh group, in batches of 5,000: all duplicates, nothing counted again.
    replay_lands_nothing(&db, &topic, 5000, 620, &truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);

    // The layout: no primary key; every day partition holds the exclusion constraint on the key type.
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM pg_index WHERE indrelid = '{s}.replaysafe_ledger'::regclass AND indisprimary"
        ),
        0
    );
    let unguarded = db.i64(
        "SELECT count(*) FROM pg_inherits i WHERE i.inhparent = '{s}.replaysafe_ledger'::regclass AND NOT EXISTS \
         (SELECT 1 FROM pg_constraint x JOIN pg_index ix ON ix.indexrelid = x.conindid JOIN pg_am a \
          ON a.oid = (SELECT relam FROM pg_class WHERE oid = ix.indexrelid) \
          WHERE x.conrelid = i.inhrelid AND x.contype = 'x' AND a.amname = 'hash')",
    );
    assert_eq!(unguarded, 0);
    assert!(
        db.i64(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = '{s}.replaysafe_ledger'::regclass"
        ) >= 6
    );

    // Another writer (by hand, not replaysafe): the same key is refused by PostgreSQL (23P01), the same
    // event id of another stream generation is another key.
    let (id, day): (String, String) = {
        let r = &db.query(
            "SELECT event_id::text, day::text FROM {s}.replaysafe_ledger LIMIT 1",
            &[],
        )[0];
        (r.get(0), r.get(1))
    };
    let insert = |generation: &str| {
        format!(
            "INSERT INTO {{s}}.replaysafe_ledger (\"offset\", day, _source_id, generation, event_id) \
             VALUES (0, '{day}', 1, '{generation}', '{id}')"
        )
    };
    let sql = insert("").replace("{s}", &format!("\"{}\"", db.schema));
    let err = db
        .rt
        .block_on(db.client.batch_execute(&sql))
        .expect_err("a second row of a key");
    assert_eq!(err.code().map(|c| c.code()), Some("23P01"), "{err:?}");
    db.execute(&insert("g2"));
    assert_eq!(
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_ledger WHERE event_id = '{id}'"
        )),
        2
    );
}

#[test]
fn a_day_partition_made_by_hand_without_the_key_constraint_is_refused_before_any_claim() {
    let (db, topic) = stage("hashkeyhand", 1);
    let (recs, truth) = seed_events(60, 1);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    db.execute(
        "CREATE TABLE {s}.replaysafe_ledger_p20240425 PARTITION OF {s}.replaysafe_ledger \
         FOR VALUES FROM ('2024-04-25') TO ('2024-04-26')",
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("replaysafe_ledger_p20240425")
            && out.stderr.contains("no delivery-key constraint")
            && out.stderr.contains("EXCLUDE USING hash"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints"), 0);
    // `check --database` names it too, without running anything.
    let check = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(check.code, Some(2), "{}\n{}", check.stdout, check.stderr);
    assert!(
        check.stdout.lines().any(|l| l.contains("MISSING")
            && l.contains("replaysafe_ledger_p20240425")
            && l.contains("no delivery-key constraint")),
        "{}",
        check.stdout
    );

    // A constraint on the event id alone (not the delivery key: no generation) is no guard either — with no
    // conflict target every unique or exclusion constraint is an arbiter of the claim.
    db.execute(
        "ALTER TABLE {s}.replaysafe_ledger_p20240425 ADD EXCLUDE USING hash (event_id WITH =)",
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("no delivery-key constraint"),
        "{}",
        out.stderr
    );
    // Both: the other one is refused as an arbiter the claim would also take.
    db.execute(
        "ALTER TABLE {s}.replaysafe_ledger_p20240425 ADD \
         EXCLUDE USING hash ((ROW(generation, event_id, day)::{s}.replaysafe_ledger_key) WITH =)",
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("besides the delivery-key constraint")
            && out.stderr.contains("replaysafe_ledger_p20240425"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    // With only the constraint the first error named, the same partition takes the claims.
    let other = db
        .text(
            "SELECT conname::text FROM pg_constraint WHERE conrelid = '{s}.replaysafe_ledger_p20240425'::regclass \
             AND contype = 'x' AND pg_get_constraintdef(oid) NOT LIKE '%ROW(%'",
        )
        .unwrap();
    db.execute(&format!(
        "ALTER TABLE {{s}}.replaysafe_ledger_p20240425 DROP CONSTRAINT \"{other}\""
    ));
    let check = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(check.code, Some(0), "{}\n{}", check.stdout, check.stderr);
    assert!(
        check
            .stdout
            .contains("delivery-key constraint on every table"),
        "{}",
        check.stdout
    );
    run_caught_up(&p.path);
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 60);
}

#[test]
fn a_table_named_like_the_key_type_is_named_in_the_refusal() {
    let (db, topic) = stage("hashkeyname", 1);
    db.execute("CREATE TABLE {s}.replaysafe_ledger_key (id int)");
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    let out = replaysafe(&["init", "--config", arg(&p.path)]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("replaysafe_ledger_key") && out.stderr.contains("delivery-key type"),
        "{}",
        out.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM pg_class WHERE relname = 'replaysafe_ledger' AND relnamespace = '{s}'::regnamespace"),
        0,
        "nothing created"
    );
}

#[test]
fn a_ledger_with_the_earlier_primary_key_keeps_it_and_needs_no_key_type() {
    let (db, topic) = stage("hashkeylegacy", 3);
    let (recs, truth) = seed_events(300, 3);
    produce(&topic, &recs);
    db.execute(
        "CREATE TABLE {s}.replaysafe_ledger (\"offset\" bigint NOT NULL, day date NOT NULL, \
         _source_id smallint NOT NULL, generation text NOT NULL DEFAULT '', event_id uuid NOT NULL, \
         PRIMARY KEY (generation, event_id, day)) PARTITION BY RANGE (day)",
    );
    run_text(SEED, &topic, &unique("g"), &db);
    assert_eq!(counts(&db), truth);
    replay_lands_nothing(&db, &topic, 1, 300, &truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 300);
    assert_eq!(
        db.text("SELECT to_regtype('{s}.replaysafe_ledger_key')::text"),
        None,
        "no key type for a ledger that does not use one"
    );
    // Its day partitions got the primary key from the parent, and no exclusion constraint.
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM pg_inherits i WHERE i.inhparent = '{s}.replaysafe_ledger'::regclass AND NOT EXISTS \
             (SELECT 1 FROM pg_index x WHERE x.indrelid = i.inhrelid AND x.indisprimary)"
        ),
        0
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM pg_constraint x JOIN pg_inherits i ON i.inhrelid = x.conrelid \
             WHERE i.inhparent = '{s}.replaysafe_ledger'::regclass AND x.contype = 'x'"
        ),
        0
    );
}
