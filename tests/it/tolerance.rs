//! `[errors] tolerance` (issue 16, item 3): a misspelled `[fields]` pointer stops `run`, `backfill` and `load`
//! with the field named and nothing applied; `tolerance = "all"` quarantines everything; a few poison records
//! are quarantined under the default; `dead-letters replay` re-applies dead letters after the fix; a bad CEL
//! expression is a clean error with its position.

use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};
use crate::projection_builds::{ev, BASE, PARTITIONS};

/// The seed pipeline with the `customer_id` pointer misspelled, one batch per partition (the records are
/// produced before the run and all read within the 5 s linger, so each partition's first batch holds all of
/// its records and none is cut short by another partition's flush).
fn typo() -> String {
    SEED.replace("\"/customer_id\"", "\"/custmer_id\"")
        .replace("max-records = 200", "max-records = 5000")
        .replace("linger-ms = 20", "linger-ms = 5000")
}

/// One kcat `-J` line.
fn kcat_line(topic: &str, offset: i64, r: &Rec) -> String {
    let value = String::from_utf8_lossy(r.value.as_ref().unwrap()).to_string();
    format!(
        r#"{{"topic":"{topic}","partition":{},"offset":{offset},"tstype":"create","ts":{},"key":null,"payload":{}}}"#,
        r.partition,
        r.timestamp_ms.unwrap(),
        serde_json::to_string(&value).unwrap()
    )
}

/// Nothing of the pipeline was applied: no ledger row, projection row, dead letter, moved checkpoint or Kafka
/// commit.
fn assert_nothing_applied(db: &Db, group: &str, topic: &str, partitions: i32, what: &str) {
    for table in [
        "replaysafe_ledger",
        "daily_counts",
        "daily_totals",
        "replaysafe_dead_letters",
    ] {
        assert_eq!(
            db.i64(&format!("SELECT count(*) FROM {{s}}.{table}")),
            0,
            "{what}: {table} is empty"
        );
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints WHERE next_offset > 0"),
        0,
        "{what}: no checkpoint moved past its start (offset 0)"
    );
    assert_nothing_committed_past(group, topic, partitions, 0, what);
}

fn assert_stopped(out: &Out, topic: &str, what: &str) {
    assert_eq!(out.code, Some(5), "{what}: exit 5\n{}", out.stderr);
    for needle in [
        "field `customer_id` (/custmer_id) is missing or null",
        "quarantined as `missing-field`",
        "consecutive offsets",
        "tolerance = \"none\"",
        topic,
    ] {
        assert!(
            out.stderr.contains(needle),
            "{what}: stderr names `{needle}`:\n{}",
            out.stderr
        );
    }
}

/// A misspelled pointer quarantines every record: `run` (twice: a restart reads the same records and stops
/// again), `backfill` and `load` each stop with exit 5 naming the field, its pointer, the reason and the
/// partition, and nothing is applied. With the pointer fixed, `run` applies every record exactly.
#[test]
fn a_typod_pointer_stops_run_backfill_and_load_with_nothing_applied() {
    let (db, topic) = stage("tol_typo", 3);
    let (recs, truth) = seed_events(900, 3);
    let offsets = produce(&topic, &recs);
    let group = unique("g");
    let p = pipeline(&typo(), &topic, &group, &db.schema);

    for attempt in ["run", "run again"] {
        assert_stopped(&try_run(&p.path), &topic, attempt);
        assert_nothing_applied(&db, &group, &topic, 3, attempt);
    }

    let bf_group = unique("bf");
    let bf = backfill(&p, "2024-04-25", ("--to", "2024-05-01"), &bf_group, &[]);
    assert_stopped(&bf, &topic, "backfill");
    assert_nothing_applied(&db, &group, &topic, 3, "backfill");

    let file = p.dir.path().join("records.jsonl");
    let lines: Vec<String> = recs
        .iter()
        .zip(&offsets)
        .map(|(r, o)| kcat_line(&topic, *o, r))
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let load = replaysafe(&["load", "--config", arg(&p.path), arg(&file)]);
    assert_stopped(&load, &topic, "load");
    assert_nothing_applied(&db, &group, &topic, 3, "load");

    let fixed = pipeline(
        &typo().replace("/custmer_id", "/customer_id"),
        &topic,
        &group,
        &db.schema,
    );
    let t = run_caught_up(&fixed.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (900, 900, 0),
        "{t:?}"
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// A few poison records spread over the partitions are quarantined under the default tolerance and the rest
/// applied: exact totals, dead letters, checkpoints at the end.
#[test]
fn a_few_poison_records_are_quarantined_under_the_default() {
    let (db, topic) = stage("tol_poison", 3);
    let (mut recs, truth) = seed_events(900, 3);
    let poison = [
        (0, "not json"),
        (
            1,
            r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301","amount":"1","occurred_at":"2024-04-25"}"#,
        ),
        (
            2,
            r#"{"event_id":"nope","customer_id":"c","amount":"1","occurred_at":"2024-04-25"}"#,
        ),
        (
            0,
            r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3302","customer_id":"c","amount":"x","occurred_at":"2024-04-25"}"#,
        ),
        (1, "[]"),
    ];
    for (i, (p, v)) in poison.iter().enumerate() {
        recs.insert(100 + i * 150, Rec::json(*p, "k", v, 1_714_003_200_000));
    }
    produce(&topic, &recs);
    let group = unique("g");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (905, 900, 5),
        "{t:?}"
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(
        db.strings(
            "SELECT reason || ':' || partition FROM {s}.replaysafe_dead_letters ORDER BY reason, partition"
        ),
        vec![
            "invalid-field:0",
            "invalid-field:2",
            "invalid-json:0",
            "invalid-json:1",
            "missing-field:1"
        ]
    );
    for part in 0..3 {
        let n = recs.iter().filter(|r| r.partition == part).count() as i64;
        assert_eq!(
            db.checkpoint(&group, &topic, part),
            Some(n),
            "partition {part}"
        );
    }
}

/// `tolerance = "all"` quarantines every record of a misspelled pointer and exits 0 (today's behaviour). After
/// the fix, `dead-letters replay` applies them through the ledger and marks them resolved in the same
/// transaction; records that still fail stay unresolved under their new reason; a second replay changes
/// nothing; a resolved dead letter replayed again is a duplicate.
#[test]
fn tolerance_all_then_dead_letters_replay_after_the_fix() {
    let (db, topic) = stage("tol_replay", 3);
    let (mut recs, truth) = seed_events(600, 3);
    // Valid pointers but a bad event id: `missing-field` under the typo, `invalid-field` after the fix.
    for i in 0..3 {
        let v = r#"{"event_id":"bad","customer_id":"c-1","amount":"1","occurred_at":"2024-04-26T10:00:00Z"}"#;
        recs.push(Rec::json(i, "k", v, 1_714_003_200_000));
    }
    produce(&topic, &recs);
    let group = unique("g");
    let all = typo().replace("[identity]", "[errors]\ntolerance = \"all\"\n\n[identity]");
    let p = pipeline(&all, &topic, &group, &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (603, 0, 603),
        "{t:?}"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    let checkpoints: Vec<Option<i64>> = (0..3).map(|i| db.checkpoint(&group, &topic, i)).collect();
    assert_eq!(checkpoints, vec![Some(201); 3]);

    let listed = replaysafe(&[
        "dead-letters",
        "list",
        "--config",
        arg(&p.path),
        "--topic",
        &topic,
        "--partition",
        "1",
    ]);
    listed.assert_ok();
    assert_eq!(listed.stdout.lines().count(), 201, "{}", listed.stdout);
    assert!(listed
        .stdout
        .contains("missing-field\tfield `customer_id` (/custmer_id)"));
    // With --limit the count on stderr still says how many are unresolved, not only how many were listed.
    let first = replaysafe(&[
        "dead-letters",
        "list",
        "--config",
        arg(&p.path),
        "--limit",
        "5",
    ]);
    first.assert_ok();
    assert_eq!(first.stdout.lines().count(), 5, "{}", first.stdout);
    assert!(
        first.stderr.contains(
            "603 unresolved dead letter(s), the first 5 listed (--limit 5): {\"missing-field\": 603}"
        ),
        "{}",
        first.stderr
    );
    // A misspelled --reason is refused (it would list nothing, as if there were no dead letters).
    let misspelled = replaysafe(&[
        "dead-letters",
        "list",
        "--config",
        arg(&p.path),
        "--reason",
        "missing_field",
    ]);
    assert_eq!(misspelled.code, Some(2), "{}", misspelled.stderr);
    assert!(
        misspelled
            .stderr
            .contains("--reason `missing_field` is not a quarantine reason; one of:")
            && misspelled.stderr.contains("missing-field"),
        "{}",
        misspelled.stderr
    );

    let fixed = pipeline(
        &typo().replace("/custmer_id", "/customer_id"),
        &topic,
        &group,
        &db.schema,
    );
    let replay = |extra: &[&str]| {
        let head = ["dead-letters", "replay", "--config", arg(&fixed.path)];
        let out = replaysafe(&[&head[..], extra].concat());
        out.assert_ok();
        out.stdout.lines().last().unwrap_or("").to_string()
    };
    assert_eq!(
        replay(&[]),
        "replayed 603 = landed 600 + duplicate 0 + filtered 0 + quarantined 3 [quarantined invalid-field: 3]; \
         still unresolved 3 (value not kept: 0)"
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_dead_letters d JOIN ({s}.replaysafe_ledger l0 JOIN {s}.replaysafe_sources src ON src.id = l0._source_id) l \
             ON l.topic = d.topic AND l.partition = d.partition AND l.\"offset\" = d.\"offset\" \
             WHERE d.resolved_at IS NOT NULL AND d.resolved_by LIKE '%' || l.event_id::text || '%'"
        ),
        600,
        "each landed dead letter is resolved by its delivery key"
    );
    assert_eq!(
        db.strings(
            "SELECT reason || ':' || (detail LIKE 'field `event_id` (/event_id)%')::text FROM \
             {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"
        ),
        vec!["invalid-field:true"; 3]
    );
    let after: Vec<Option<i64>> = (0..3).map(|i| db.checkpoint(&group, &topic, i)).collect();
    assert_eq!(after, checkpoints, "a replay moves no checkpoint");

    // A second replay changes nothing.
    assert_eq!(
        replay(&[]),
        "replayed 3 = landed 0 + duplicate 0 + filtered 0 + quarantined 3 [quarantined invalid-field: 3]; \
         still unresolved 3 (value not kept: 0)"
    );
    assert_eq!(
        replay(&["--reason", "missing-field"])
            .split(';')
            .next()
            .unwrap(),
        "replayed 0 = landed 0 + duplicate 0 + filtered 0 + quarantined 0"
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);

    // A resolved dead letter made unresolved again is a duplicate: the ledger holds its key.
    db.execute(
        "UPDATE {s}.replaysafe_dead_letters SET resolved_at = NULL, resolved_by = NULL \
         WHERE partition = 2 AND \"offset\" = 7",
    );
    assert_eq!(
        replay(&["--topic", &topic, "--partition", "2"]),
        "replayed 2 = landed 0 + duplicate 1 + filtered 0 + quarantined 1 [quarantined invalid-field: 1]; \
         still unresolved 1 (value not kept: 0)"
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(
        db.text(
            "SELECT resolved_by FROM {s}.replaysafe_dead_letters WHERE partition = 2 AND \"offset\" = 7"
        ),
        Some("replay: duplicate".to_string())
    );
}

/// A CEL expression the parser panics on (a trailing operator, an unterminated string; in a `[[filter]]` and a
/// projection's `filter`) is a configuration error naming the file, the line of the key, the expression and the
/// column — no panic text or backtrace, even with `RUST_BACKTRACE=1`; `run` refuses it before touching the
/// database.
#[test]
fn a_bad_cel_expression_is_a_clean_error_with_its_position() {
    let db = Db::fresh("tol_cel");
    let topic = unique("tol_cel");
    for (key, expr, col) in [
        (
            "drop-if",
            "amount > 5.0 &&",
            "at column 14: the expression ends after `&&`",
        ),
        (
            "drop-if",
            "customer_id == \"c-1",
            "at column 16: this string is never closed",
        ),
        ("drop-if", "(amount > 1.0", "at column 14"),
        ("filter", "customer_id in", "at column 13"),
    ] {
        let text = if key == "filter" {
            // A projection's filter.
            SEED.replace(
                "column = \"n\"",
                &format!("column = \"n\"\n{key} = '{expr}'"),
            )
        } else {
            SEED.replace(
                "[identity]",
                &format!("[[filter]]\nname = \"f\"\n{key} = '{expr}'\n\n[identity]"),
            )
        };
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        let line = text.lines().position(|l| l.starts_with(key)).unwrap() + 1;
        for cmd in ["check", "run"] {
            let out = replaysafe_with(
                &[cmd, "--config", arg(&p.path)],
                &[("RUST_BACKTRACE", "1")],
                Duration::from_secs(60),
            );
            assert_eq!(out.code, Some(2), "{cmd} {expr}: {}", out.stderr);
            let want = format!("pipeline.toml:{line}:");
            assert!(out.stderr.contains(&want), "{want}: {}", out.stderr);
            assert!(
                out.stderr
                    .contains(&format!("`{expr}` does not compile: {col}")),
                "{}",
                out.stderr
            );
            for bad in ["panicked", "unreachable", "backtrace", "RUST_BACKTRACE"] {
                assert!(
                    !out.stderr.contains(bad),
                    "{cmd} {expr}: `{bad}` in\n{}",
                    out.stderr
                );
            }
        }
    }
    let tables = format!(
        "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
        db.schema
    );
    assert_eq!(db.i64(&tables), 0, "run refused before creating anything");
}

/// The window rule: two records in three undecodable on each partition never make `max-consecutive`, but
/// cross `max-percent` of `window` at a fixed offset (the 16th of the 30-offset window ending at offset 23):
/// exit 5 naming it, nothing applied.
#[test]
fn a_high_share_of_one_reason_stops_by_the_window_rule() {
    let (db, topic) = stage("tol_window", 2);
    let (good, _) = seed_events(40, 2);
    let mut good = good.into_iter();
    let mut recs = Vec::new();
    for part in 0..2 {
        for i in 0..60 {
            recs.push(match i % 3 {
                0 => Rec {
                    partition: part,
                    ..good.next().unwrap()
                },
                _ => Rec::json(part, "k", "not json", 1_714_003_200_000),
            });
        }
    }
    produce(&topic, &recs);
    let group = unique("g");
    let text = typo().replace("/custmer_id", "/customer_id").replace(
        "[identity]",
        "[errors]\nwindow = 30\nmax-percent = 50\n\n[identity]",
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "offsets 0–23: 16 of 30 offsets quarantined as `invalid-json`, more than errors.max-percent = 50 %"
        ),
        "{}",
        out.stderr
    );
    assert_nothing_applied(&db, &group, &topic, 2, "window rule");
}

/// The tolerance's stop point depends on the records only: the same partition read with batches of 1, 7 and
/// 5,000 records stops at the same offset with the same message (the window rule: two of every three records
/// missing a field), nothing at or past that offset is committed, and a rerun stops there again.
#[test]
fn the_tolerance_stops_at_the_same_record_whatever_the_batch_size() {
    let topic = new_topic("bktol", 1);
    let recs: Vec<Rec> = (0..1500)
        .map(|i| {
            let v = if i >= 50 && i % 3 != 0 {
                format!(r#"{{"id":"e{i}","day":"2026-07-01"}}"#)
            } else {
                format!(r#"{{"id":"e{i}","cust":"c{}","day":"2026-07-01"}}"#, i % 4)
            };
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs);
    let mut stops = Vec::new();
    for size in [1, 7, 5000] {
        let db = Db::fresh("bktol");
        let text = BASE.replace("max-records = 20", &format!("max-records = {size}"));
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        let limit = Duration::from_secs(300);
        let out = try_run_with(&p.path, &[], limit);
        assert_eq!(out.code, Some(5), "{size}: {}", out.stderr);
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("caused by:") && l.contains("quarantined as"))
            .unwrap_or_default()
            .to_string();
        let at = line
            .split("offsets ")
            .nth(1)
            .and_then(|s| s.split(':').next())
            .unwrap_or_default()
            .to_string();
        let checkpoint =
            db.i64("SELECT coalesce(max(next_offset), 0) FROM {s}.replaysafe_checkpoints");
        let past = db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_dead_letters WHERE \"offset\" >= {checkpoint}"
        ));
        let landed_past = db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_ledger WHERE \"offset\" >= {checkpoint}"
        ));
        assert_eq!(
            (past, landed_past),
            (0, 0),
            "{size}: committed past the checkpoint"
        );
        // Every offset below the checkpoint is landed or quarantined: nothing skipped over.
        let accounted = db.i64(
            "SELECT (SELECT count(*) FROM {s}.replaysafe_ledger) \
             + (SELECT count(*) FROM {s}.replaysafe_dead_letters)",
        );
        assert_eq!(
            accounted, checkpoint,
            "{size}: records below the checkpoint never applied"
        );
        assert!(
            line.contains(&format!("stays at offset {checkpoint}")),
            "{size}: {line}"
        );
        eprintln!("size {size}: checkpoint {checkpoint}, first stop: {line}");
        let again = try_run_with(&p.path, &[], limit);
        for l in again
            .stderr
            .lines()
            .filter(|l| l.contains("assigned") || l.contains("caused by"))
        {
            eprintln!("  rerun: {l}");
        }
        assert_eq!(again.code, Some(5), "{size} rerun: {}", again.stderr);
        assert!(again.stderr.contains(&at), "{size} rerun: {}", again.stderr);
        stops.push((size, at, line.len()));
    }
    eprintln!("{stops:?}");
    assert!(
        stops.iter().all(|s| s.1 == stops[0].1 && !s.1.is_empty()),
        "{stops:?}"
    );
}

/// Two `dead-letters replay` at once, while `run` runs with new events: every dead letter is resolved once,
/// the projection counts each record once, and the two replay lines add up to at least the dead letters.
#[test]
fn two_concurrent_dead_letter_replays_beside_run_count_once() {
    let (db, topic) = stage("bkreplay2", PARTITIONS);
    let group = unique("g");
    let text = BASE.replace(
        "[[projection]]",
        "[errors]\ntolerance = \"all\"\n[[projection]]",
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..600)
        .map(|i| ev(i, if i % 3 == 0 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs[..300]);
    run_caught_up(&p.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        100
    );
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    let mut w = spawn_run(&p, &[], "w");
    produce(&topic, &recs[300..]);
    let replay = |name: &str| {
        spawn(
            &["dead-letters", "replay", "--config", arg(&p.path)],
            &[],
            p.dir.path(),
            name,
        )
    };
    let mut a = replay("ra");
    let mut b = replay("rb");
    for (c, name) in [(&mut a, "ra"), (&mut b, "rb")] {
        wait_until(Duration::from_secs(120), "a replay to end", || {
            c.try_wait().unwrap().is_some()
        });
        let out = std::fs::read_to_string(p.dir.path().join(format!("{name}.out"))).unwrap();
        eprintln!("{name}: {out}");
    }
    wait_until(Duration::from_secs(120), "run caught up", || {
        db.i64(&format!(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM {{s}}.replaysafe_checkpoints \
             WHERE consumer_group = '{group}'"
        )) == 600
    });
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        0
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_by LIKE 'replay:%'"
        ),
        0,
        "a dead letter landed by one replay was marked a duplicate by the other"
    );
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 600);
    assert_eq!(
        db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts WHERE cust = 'bad'"),
        200
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
}
