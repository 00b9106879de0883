//! Workers and replays around a prune of the ledger: a production worker that lagged behind a prune resumes
//! where its checkpoint is, a checkpoint moved back below a pruned offset is refused, and `ledger prune` of a
//! pipeline never initialised names `init`.

use crate::common::*;
use chrono::{Days, NaiveDate, Utc};

/// A counter per day; the ledger keeps `{horizon}` days.
const LC: &str = concat!(
    header!(),
    r#"[batch]
max-records = 50
linger-ms = 20

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
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

fn text(horizon: u32) -> String {
    LC.replace("{horizon}", &horizon.to_string())
}

fn days_ago(n: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(n))
        .unwrap()
}

fn ev(n: u32, partition: i32, day: NaiveDate) -> Rec {
    let id = format!("7a1c1f4e-6a55-4c0b-9a55-{n:012}");
    let entity = format!("e-{n}");
    let value =
        format!(r#"{{"event_id":"{id}","entity":"{entity}","occurred_at":"{day}T12:00:00Z"}}"#);
    Rec::json(partition, &entity, &value, Utc::now().timestamp_millis())
}

fn counts(db: &Db) -> Vec<String> {
    db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day")
}

/// A production worker stopped for a while, whose checkpoints lag below offsets another group claimed and a
/// prune then dropped (late events of an old day), resumes from its own checkpoints: that is no replay — the
/// old day's records are quarantined as `beyond-horizon`, the others recognised by the ledger (whose rows of
/// days inside the horizon are all there) — so it is not refused (it used to exit 2, stopping production, with
/// advice to move its checkpoint above the pruned offset, which would skip records nobody applied). A fresh
/// group from the earliest offsets is still refused.
#[test]
fn a_lagging_production_worker_resumes_after_a_prune() {
    let (db, topic) = stage("b13_lag", 2);
    // Production lands two recent days over both partitions, then stops.
    let mut first = Vec::new();
    for n in 0..4u32 {
        first.push(ev(n, (n % 2) as i32, days_ago(1 + u64::from(n % 2) * 2)));
    }
    produce(&topic, &first);
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().consumed, 4);
    // Meanwhile: late events of a day 10 days ago among recent ones, on both partitions; another group of the
    // pipeline (a second deployment) lands them.
    let mut late = Vec::new();
    for n in 10..16u32 {
        let day = if n % 3 == 0 {
            days_ago(10)
        } else {
            days_ago(1)
        };
        late.push(ev(n, (n % 2) as i32, day));
    }
    produce(&topic, &late);
    // Two records nobody applied yet, after them, recent.
    let other = pipeline(&text(30), &topic, &unique("other"), &db.schema);
    let t = run_caught_up(&other.path).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (10, 6, 4));
    produce(&topic, &[ev(20, 0, days_ago(0)), ev(21, 1, days_ago(0))]);
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let pruned = db.i64("SELECT count(*) FROM {s}.replaysafe_pruned WHERE pruned_through >= 2");
    assert_eq!(
        pruned, 2,
        "both partitions pruned above production's checkpoints"
    );
    let before = counts(&db);

    // Production resumes from its checkpoints.
    let out = try_run(&short.path);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let t = out.tally();
    // 6 late (2 of the old day quarantined, 4 duplicates) + 2 new.
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (8, 2, 4, 2),
        "{}",
        out.stdout
    );
    let mut want = before.clone();
    let today = format!("{}=", days_ago(0));
    assert!(!want.iter().any(|c| c.starts_with(&today)));
    want.push(format!("{today}2"));
    assert_eq!(counts(&db), want, "only the two new records counted");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'beyond-horizon'"),
        2
    );

    // A fresh group from the earliest offsets is a replay: refused, nothing counted.
    let fresh = pipeline(&text(5), &topic, &unique("fresh"), &db.schema);
    let out = try_run(&fresh.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("are below the ledger's pruned horizon"),
        "{}",
        out.stderr
    );
    assert_eq!(counts(&db), want);
}

/// The same worker with its checkpoint moved back below what it applied (a reset) is a replay: refused.
#[test]
fn a_checkpoint_moved_back_below_a_pruned_offset_is_refused() {
    let (db, topic) = stage("b13_reset", 2);
    let recs: Vec<Rec> = (0..6u32)
        .map(|n| {
            ev(
                n,
                (n % 2) as i32,
                if n < 2 { days_ago(10) } else { days_ago(1) },
            )
        })
        .collect();
    produce(&topic, &recs);
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().landed, 6);
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let before = counts(&db);
    db.execute("UPDATE {s}.replaysafe_checkpoints SET next_offset = 0");
    let out = try_run(&short.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("offsets 0..=0 are below"),
        "{}",
        out.stderr
    );
    assert_eq!(counts(&db), before);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// `ledger prune` of a pipeline never initialised (its schema does not exist) says to run `init` and exits 2,
/// like `ledger stats` and `--dry-run` (it used to exit 1 with PostgreSQL's "schema does not exist").
#[test]
fn ledger_prune_before_init_names_init() {
    let schema = unique("b13_noinit");
    let p = pipeline(&text(5), "b13-never", &unique("g"), &schema);
    for extra in [&[][..], &["--json"], &["--dry-run"]] {
        let head = ["ledger", "prune", "--config", arg(&p.path)];
        let out = replaysafe(&[&head[..], extra].concat());
        assert_eq!(
            out.code,
            Some(2),
            "{extra:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
        assert!(out.stderr.contains("replaysafe init"), "{}", out.stderr);
    }
}
