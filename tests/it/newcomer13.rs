//! Review round, following README as a new user: the refusal of a replay below a pruned offset says how a
//! `run` under a fresh group gets above it, and that path works (README "The ledger's lifecycle").

use chrono::{Days, NaiveDate, Utc};

use crate::common::*;

const P: &str = concat!(
    header!(),
    r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = {horizon}

[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day"]
column = "n"
"#
);

fn day(ago: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(ago))
        .unwrap()
}

fn ev(n: u32, partition: i32, ago: u64) -> Rec {
    let v = format!(
        r#"{{"event_id":"5b0e4c1a-1d2e-4f60-8a7b-{n:012}","occurred_at":"{}"}}"#,
        day(ago)
    );
    Rec::json(
        partition,
        &format!("k{n}"),
        &v,
        Utc::now().timestamp_millis(),
    )
}

/// Events of 10 and 1 days ago on two partitions; a prune to a 5-day horizon drops the old day. A fresh group
/// is refused (exit 2) and its message names what to set: the group's `next_offset` in
/// `replaysafe_checkpoints` (its refused run wrote those rows at offset 0, and they win over Kafka's offsets).
/// Set as the message says, the rerun reads only the kept records: every one a duplicate, no count changes.
#[test]
fn refused_fresh_group_follows_the_message_above_the_pruned_offsets() {
    let (db, topic) = stage("n13_prune", 2);
    let recs: Vec<Rec> = (0..8)
        .map(|n| ev(n, (n % 2) as i32, if n < 4 { 10 } else { 1 }))
        .collect();
    produce(&topic, &recs);
    let text = |h: u32| P.replace("{horizon}", &h.to_string());
    let prod = pipeline(&text(30), &topic, &unique("prod"), &db.schema);
    assert_eq!(run_caught_up(&prod.path).tally().landed, 8);
    let short = pipeline(&text(5), &topic, &unique("prod2"), &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let counts0 = db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day");
    assert_eq!(
        counts0,
        vec![format!("{}=4", day(10)), format!("{}=4", day(1))]
    );
    // Each partition held the old day's records at offsets 0 and 1.
    let pruned = db
        .strings("SELECT partition || ':' || pruned_through FROM {s}.replaysafe_pruned ORDER BY 1");
    assert_eq!(pruned, vec!["0:1", "1:1"]);

    let fresh_group = unique("fresh");
    let fresh = pipeline(&text(5), &topic, &fresh_group, &db.schema);
    let out = try_run(&fresh.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("set its next_offset in replaysafe_checkpoints to at least that"),
        "the refusal says how a run gets above the pruned offsets: {}",
        out.stderr
    );
    // As the message says: the group's checkpoint rows (written by the refused run) set above the pruned offsets.
    db.execute(&format!(
        "UPDATE {{s}}.replaysafe_checkpoints c SET next_offset = p.pruned_through + 1 \
         FROM {{s}}.replaysafe_pruned p WHERE c.consumer_group = '{fresh_group}' \
         AND c.topic = p.topic AND c.partition = p.partition"
    ));
    let t = run_caught_up(&fresh.path).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (4, 0, 4));
    let counts1 = db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day");
    assert_eq!(counts1, counts0, "nothing counted again");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// `outbox relay --metrics-addr` alone (no `run` beside it): `/readyz` answers 200 `ready: outbox relay` once
/// the database probe succeeded — it used to say `no partitions assigned` forever (and `/healthz` failed after
/// 60 s, the engine loop never turning), so a liveness/readiness probe would restart or shun every relay. The
/// rows are published meanwhile and the readiness holds after the relay emptied the outbox.
#[test]
fn a_standalone_relay_is_ready_without_partitions() {
    let (db, topic) = stage("n13_relay", 2);
    let out = new_topic("n13_relay_out", 2);
    let text = concat!(
        header!(),
        r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }

[identity]
key = ["event_id"]

[[projection]]
kind = "outbox"
table = "outbox"
key = ["event_id"]
"#
    );
    let text = format!("{text}\n[outbox]\ntopic = \"{out}\"\n");
    let p = pipeline(&text, &topic, &unique("relay"), &db.schema);
    let recs: Vec<Rec> = (0..6).map(|n| ev(100 + n, (n % 2) as i32, 1)).collect();
    produce(&topic, &recs);
    assert_eq!(run_caught_up(&p.path).tally().landed, 6);
    let addr = crate::health::free_addr();
    let args = [
        "outbox",
        "relay",
        "--config",
        arg(&p.path),
        "--metrics-addr",
        &addr,
    ];
    let mut relay = spawn(&args, &[], p.dir.path(), "relay");
    let body = crate::health::wait_for(&addr, "/readyz", "the relay ready", |c, _| c == 200);
    assert_eq!(body, "ready: outbox relay\n");
    wait_until(
        std::time::Duration::from_secs(60),
        "every row published",
        || db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL") == 0,
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 6);
    assert_eq!(crate::health::get(&addr, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(
        crate::health::get(&addr, "/healthz").map(|r| r.0),
        Some(200)
    );
    assert_eq!(terminate(&mut relay), Some(0));
}
