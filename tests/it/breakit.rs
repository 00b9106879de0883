//! Adversarial checks of the issue-16 work (operator moves around a live pipeline): each test drives the real
//! binary against the real broker and PostgreSQL and asserts the final tables against the truth computed from
//! the produced events.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;

const BASE: &str = concat!(
    header!(),
    r#"[batch]
max-records = 20
linger-ms = 20
[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "text" }
day = { path = "/day", type = "date" }
[identity]
key = ["id"]
partition-by = "day"
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "cust"]
"#
);

const ADDED: &str = r#"[[projection]]
kind = "counter"
table = "by_cust"
group-by = ["cust"]
"#;

const PARTITIONS: i32 = 3;

fn ev(i: usize, cust: &str) -> Rec {
    let v = format!(r#"{{"id":"e{i}","cust":"{cust}","day":"2026-07-0{}"}}"#, 1 + i % 3);
    Rec::json((i % PARTITIONS as usize) as i32, cust, &v, 1_782_864_000_000)
}

fn table(db: &Db, sql: &str) -> BTreeMap<String, i64> {
    db.query(sql, &[])
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect()
}

fn build(p: &Pipeline, projection: &str) -> Out {
    replaysafe(&[
        "projection",
        "build",
        "--config",
        arg(&p.path),
        "--projection",
        projection,
    ])
}

fn replay_dead_letters(p: &Pipeline, extra: &[&str]) -> Out {
    let mut args = vec!["dead-letters", "replay", "--config", arg(&p.path)];
    args.extend_from_slice(extra);
    replaysafe(&args)
}

/// A record PostgreSQL rejected (a CHECK constraint of the operator's on a projection table) is quarantined
/// `rejected-by-database`; a projection is added; the operator drops the constraint and replays the dead
/// letters (with the current file, as README says) before building the new projection. The replayed record
/// must reach the new projection exactly once: either the replay feeds it or the build does, never both.
#[test]
fn a_dead_letter_replayed_while_a_projection_is_building_counts_once() {
    let (db, topic) = stage("bkreplay", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&old.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..30)
        .map(|i| ev(i, if i % 10 == 4 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs);
    run_caught_up(&old.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'rejected-by-database'"),
        3
    );
    // The change, then the fix of the cause and the documented replay — with the current (new) file.
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    let replayed = replay_dead_letters(&new, &[]);
    // Refused while building (nothing replayed: the build would apply the replayed records again); build
    // first, then replay.
    assert_eq!(replayed.code, Some(2), "{}", replayed.stderr);
    assert!(
        replayed.stderr.contains("projection build"),
        "{}",
        replayed.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        3
    );
    build(&new, "by_cust").assert_ok();
    let again = replay_dead_letters(&new, &[]);
    again.assert_ok();
    assert!(again.stdout.contains("landed 3"), "{}", again.stdout);
    let want: BTreeMap<String, i64> = [("bad".to_string(), 3), ("good".to_string(), 27)].into();
    assert_eq!(
        table(&db, "SELECT cust, n FROM {s}.by_cust"),
        want,
        "by_cust"
    );
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts"),
        30
    );
}

/// Dead letters replayed *before* a projection is added (with `--group-id`, or quarantined by a `load` under
/// its own group and replayed under the pipeline's) were claimed before the hand-over: the build must apply them
/// to the new projection like every other record claimed before it.
#[test]
#[ignore = "open: `dead-letters replay --group-id G` claims under G, which has no checkpoint, so the hand-over \
            records no offset for G and `projection build` skips those ledger rows (applied 27, skipped 3): the \
            new projection misses them for ever"]
fn a_dead_letter_replayed_under_another_group_before_the_change_is_built() {
    let (db, topic) = stage("bkreplaygrp", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&old.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..30)
        .map(|i| ev(i, if i % 10 == 4 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs);
    run_caught_up(&old.path);
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    replay_dead_letters(&old, &["--group-id", "fixup"]).assert_ok();
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts"),
        30
    );
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    let out = build(&new, "by_cust");
    out.assert_ok();
    let want: BTreeMap<String, i64> = [("bad".to_string(), 3), ("good".to_string(), 27)].into();
    assert_eq!(
        table(&db, "SELECT cust, n FROM {s}.by_cust"),
        want,
        "by_cust: {}",
        out.stdout
    );
}
