//! Issue 40 item 1 (case C45): replaysafe behind a real PgBouncer (Debian's 1.18, `scripts/pgbouncer-start`).
//! Session pooling is a direct connection to replaysafe: two workers apply C45's orders exactly and leave no
//! setting in the pool. Transaction and statement pooling would hand replaysafe's session state (prepared
//! statements, `landed`, pinned settings) to other clients: every command refuses them at its first
//! connection, before any setting reaches the pool and before any table is created.

use std::time::Duration;

use crate::common::{
    arg, committed, pg_client, pipeline, produce, replaysafe_with, runtime, stage, unique, Bouncer,
    Db, Rec, HEADER,
};

/// C45's orders as a row projection, two connections per worker, C45's lock timeout.
fn c45_pipeline() -> String {
    format!(
        r#"{HEADER}connections = 2
lock-timeout-ms = 5000
statement-timeout-ms = 60000
idle-in-transaction-timeout-ms = 20000
[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
entity_id = {{ path = "/entity_id", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
day = {{ path = "/occurred_at", type = "date" }}
customer_id = {{ path = "/data/customer_id", type = "text" }}
total = {{ path = "/data/total", type = "numeric" }}
[identity]
key = ["event_id"]
partition-by = "day"
[[projection]]
kind = "row"
table = "orders"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "customer_id", "total", "version"]
"#
    )
}

/// C45's three orders, o-40 and o-42 on partition 0, o-41 on partition 1.
fn c45_records() -> Vec<Rec> {
    [(0, 40), (1, 41), (0, 42)]
        .map(|(partition, n)| {
            let body = serde_json::json!({
                "event_id": format!("c45e0000-0000-4000-8000-0000000000{n}"), "event_type": "OrderPlaced",
                "entity_id": format!("o-{n}"), "version": 1, "occurred_at": format!("2026-11-20T00:00:{n}Z"),
                "data": {"customer_id": "c-4", "total": format!("{n}.00")},
            });
            Rec::json(partition, &format!("o-{n}"), &body.to_string(), 1_795_000_000_000)
        })
        .to_vec()
}

/// What a plain client sees through the pool, from `clients` connections held at once (so every server
/// connection the pool has is looked at): the settings replaysafe pins, as `SHOW` prints them.
fn pool_settings(url: &str, clients: usize) -> Vec<String> {
    let rt = runtime();
    let mut seen = Vec::new();
    let mut held = Vec::new();
    for _ in 0..clients {
        let (c, conn) = rt
            .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
            .expect("a plain client through PgBouncer");
        rt.spawn(conn);
        let mut one = Vec::new();
        for s in [
            "statement_timeout",
            "lock_timeout",
            "search_path",
            "TimeZone",
            "extra_float_digits",
        ] {
            let rows = rt.block_on(c.simple_query(&format!("SHOW {s}"))).unwrap();
            if let Some(tokio_postgres::SimpleQueryMessage::Row(r)) = rows.first() {
                one.push(format!("{s}={}", r.get(0).unwrap_or("")));
            }
        }
        seen.push(one.join(" "));
        held.push(c);
    }
    seen.sort();
    seen.dedup();
    seen
}

/// The server's own defaults for what [`pool_settings`] shows (a direct session that set nothing).
fn server_defaults() -> Vec<String> {
    pool_settings(&crate::common::database_url(), 1)
}

/// Two workers of one group through PgBouncer in session mode (pool of 8 server connections): every order
/// applied once, checkpoints and committed offsets at the end, and no replaysafe setting left in the pool.
#[test]
fn two_workers_through_a_session_pooler_apply_c45_exactly_and_leave_no_setting_in_the_pool() {
    let bouncer = Bouncer::start("session", 8);
    let (db, topic) = stage("c45session", 2);
    let group = unique("g");
    let p = pipeline(&c45_pipeline(), &topic, &group, &db.schema);
    produce(&topic, &c45_records());
    let envs = [("DATABASE_URL", bouncer.url.as_str())];
    let args = ["run", "--config", arg(&p.path), "--until-caught-up"];
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let envs = envs.map(|(k, v)| (k, v.to_string()));
            let args = args.map(String::from);
            std::thread::spawn(move || {
                let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                replaysafe_with(&args, &envs, Duration::from_secs(90))
            })
        })
        .collect();
    let mut consumed = 0;
    for w in workers {
        let out = w.join().unwrap();
        assert_eq!(
            out.code,
            Some(0),
            "{}\n{}\n{}",
            out.stdout,
            out.stderr,
            bouncer.log()
        );
        let t = out.tally();
        assert_eq!(t.quarantined, 0, "{}", out.stdout);
        consumed += t.landed;
    }
    assert_eq!(consumed, 3, "each order landed once over both workers");
    assert_final_state(&db, &group, &topic);
    // The other commands through the same pool: they work, and change nothing here.
    let cfg = arg(&p.path);
    let others: [&[&str]; 5] = [
        &["init", "--config", cfg, "--days", "2"],
        &["check", "--config", cfg, "--database"],
        &["ledger", "prune", "--config", cfg],
        &["dead-letters", "replay", "--config", cfg],
        &[
            "backfill",
            "--config",
            cfg,
            "--from",
            "2026-11-20",
            "--to",
            "2026-11-21",
            "--group-id",
            "c45bf",
        ],
    ];
    for args in others {
        let out = replaysafe_with(args, &envs, Duration::from_secs(60));
        assert_eq!(
            out.code,
            Some(0),
            "{args:?}\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    assert_final_state(&db, &group, &topic);
    assert_eq!(
        pool_settings(&bouncer.url, 8),
        server_defaults(),
        "{}",
        bouncer.log()
    );
}

/// C45's second phase through the session pooler: a test session holds partition 0's checkpoint row; the
/// worker's wait for it ends after `lock_timeout` (the waiting session goes, and comes back: retried), and
/// once the row is released o-43 lands exactly once.
#[test]
fn a_worker_through_a_session_pooler_waits_for_a_held_checkpoint_row_no_longer_than_lock_timeout() {
    let bouncer = Bouncer::start("session", 8);
    let (db, topic) = stage("c45lock", 2);
    let group = unique("g");
    let text = c45_pipeline().replace("lock-timeout-ms = 5000", "lock-timeout-ms = 1000");
    let p = pipeline(&text, &topic, &group, &db.schema);
    produce(&topic, &c45_records());
    let envs = [("DATABASE_URL", bouncer.url.as_str())];
    let args = ["run", "--config", arg(&p.path), "--until-caught-up"];
    let out = replaysafe_with(&args, &envs, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    let rt = runtime();
    let holder = pg_client(&rt);
    rt.block_on(holder.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM \"{}\".replaysafe_checkpoints WHERE topic = '{topic}' AND partition = 0 FOR UPDATE",
        db.schema
    )))
    .unwrap();
    let me: i32 = rt
        .block_on(holder.query_one("SELECT pg_catalog.pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let body = serde_json::json!({
        "event_id": "c45e0000-0000-4000-8000-000000000043", "entity_id": "o-43", "version": 1,
        "occurred_at": "2026-11-20T00:00:43Z", "data": {"customer_id": "c-4", "total": "43.00"},
    });
    produce(
        &topic,
        &[Rec::json(0, "o-43", &body.to_string(), 1_795_000_000_000)],
    );
    let worker = {
        let envs: Vec<(String, String)> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        std::thread::spawn(move || {
            let envs: Vec<(&str, &str)> =
                envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            replaysafe_with(&args, &envs, Duration::from_secs(60))
        })
    };
    // Waiting sessions blocked by the holder: seen, then gone (lock_timeout), then back (the retry).
    let waiting = || -> i64 { rt.block_on(db_count(&holder, me)) };
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let w = waiting() > 0;
        if seen.last() != Some(&w) {
            seen.push(w);
        }
        if seen.starts_with(&[true, false, true]) || seen.starts_with(&[false, true, false, true]) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(holder.batch_execute("COMMIT")).unwrap();
    let out = worker.join().unwrap();
    assert!(
        seen.windows(3).any(|w| w == [true, false, true]),
        "the wait ended and was retried: {seen:?}\n{}",
        out.stderr
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.tally().landed, 1, "{}", out.stdout);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.orders WHERE entity_id = 'o-43' AND version = 1"),
        1
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 4);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    assert_eq!(committed(&group, &topic, 2), vec![Some(3), Some(1)]);
}

/// How many sessions wait for a lock `holder` (backend pid) holds.
async fn db_count(c: &tokio_postgres::Client, holder: i32) -> i64 {
    // A second client: `c` is inside the holding transaction, which may run queries meanwhile.
    c.query_one(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE $1 = ANY(pg_catalog.pg_blocking_pids(pid))",
        &[&holder],
    )
    .await
    .unwrap()
    .get(0)
}

fn assert_final_state(db: &Db, group: &str, topic: &str) {
    assert_eq!(
        db.strings("SELECT entity_id || ' ' || customer_id || ' ' || total || ' v' || version FROM {s}.orders ORDER BY 1"),
        ["o-40 c-4 40.00 v1", "o-41 c-4 41.00 v1", "o-42 c-4 42.00 v1"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(db.checkpoint(group, topic, 0), Some(2));
    assert_eq!(db.checkpoint(group, topic, 1), Some(1));
    assert_eq!(committed(group, topic, 2), vec![Some(2), Some(1)]);
}

/// Through PgBouncer in transaction mode (pool of 2, C45's configuration) and in statement mode, every command
/// that connects refuses with exit 2 naming the pooler and the way out; nothing was created in the schema and
/// no setting reached the pool. The same pipeline then runs directly.
#[test]
fn every_command_refuses_a_transaction_or_statement_pooler_before_anything_reaches_the_pool() {
    let (db, topic) = stage("c45refuse", 2);
    let group = unique("g");
    let p = pipeline(&c45_pipeline(), &topic, &group, &db.schema);
    produce(&topic, &c45_records());
    let cfg = arg(&p.path);
    // rebuild zeroes per day: a counter by day instead of the row projection.
    let counter = c45_pipeline().replace(
        "kind = \"row\"\ntable = \"orders\"\nkey = [\"entity_id\"]\nversion = \"version\"\ncolumns = [\"entity_id\", \"customer_id\", \"total\", \"version\"]",
        "kind = \"counter\"\ntable = \"daily\"\ngroup-by = [\"day\"]\ncolumn = \"n\"",
    );
    assert!(counter.contains("daily"));
    let daily = pipeline(&counter, &topic, &unique("g"), &db.schema);
    let commands: [&[&str]; 7] = [
        &["run", "--config", cfg, "--until-caught-up"],
        &["init", "--config", cfg],
        &["check", "--config", cfg, "--database"],
        &["ledger", "prune", "--config", cfg],
        &["dead-letters", "replay", "--config", cfg],
        &[
            "backfill",
            "--config",
            cfg,
            "--from",
            "2026-11-20",
            "--to",
            "2026-11-21",
            "--group-id",
            "c45bf",
        ],
        &[
            "rebuild",
            "--config",
            arg(&daily.path),
            "--from",
            "2026-11-20",
            "--to",
            "2026-11-21",
            "--group-id",
            "c45rb",
            "--i-paused-other-writers",
        ],
    ];
    for (mode, pool) in [("transaction", 2), ("statement", 2)] {
        let bouncer = Bouncer::start(mode, pool);
        for args in commands {
            let out = replaysafe_with(
                args,
                &[("DATABASE_URL", &bouncer.url)],
                Duration::from_secs(60),
            );
            assert_eq!(
                out.code,
                Some(2),
                "{mode} {args:?}\n{}\n{}",
                out.stdout,
                out.stderr
            );
            assert!(
                out.stderr.contains(
                    "is behind a connection pooler in transaction or statement pooling mode"
                ) && out.stderr.contains("pool_mode = session"),
                "{mode} {args:?}: {}",
                out.stderr
            );
        }
        assert_eq!(
            pool_settings(&bouncer.url, pool as usize),
            server_defaults(),
            "{mode}"
        );
    }
    assert_eq!(
        db.i64(&format!(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = '{}'",
            db.schema
        )),
        0,
        "nothing created"
    );
    // Directly, the same pipeline applies C45 exactly.
    let out = replaysafe_with(commands[0], &[], Duration::from_secs(90));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert_final_state(&db, &group, &topic);
}

/// A Debezium pipeline through the session pooler (pool of 16: two workers of 4 connections and more, entities on both partitions): rows,
/// tombstones, ledger and checkpoints exact, and no setting left in the pool.
#[test]
fn two_debezium_workers_through_a_session_pooler_apply_changes_exactly() {
    use crate::common::{Table, DEBEZIUM_HEADER};
    let bouncer = Bouncer::start("session", 16);
    let (db, topic) = stage("c45dbz", 2);
    let group = unique("g");
    let text = format!(
        r#"{DEBEZIUM_HEADER}[[projection]]
kind = "row"
table = "customers"
key = ["id"]
columns = {{ id = "bigint", name = "text", version = "bigint" }}
version = "version"
"#
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let row =
        |id: i64, name: &str, v: i64| serde_json::json!({"id": id, "name": name, "version": v});
    let t = Table("customers");
    produce(
        &topic,
        &[
            t.create(0, 1, row(1, "a", 1), 100),
            t.create(1, 2, row(2, "b", 1), 110),
            t.update(0, 1, row(1, "a2", 2), 120),
            t.delete(1, 2, row(2, "b", 1), 130),
            t.create(1, 3, row(3, "c", 1), 140),
        ],
    );
    let envs = [("DATABASE_URL", bouncer.url.clone())];
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (envs, cfg) = (envs.clone(), p.path.clone());
            std::thread::spawn(move || {
                let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                replaysafe_with(
                    &["run", "--config", arg(&cfg), "--until-caught-up"],
                    &envs,
                    Duration::from_secs(90),
                )
            })
        })
        .collect();
    let mut landed = 0;
    for w in workers {
        let out = w.join().unwrap();
        assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
        landed += out.tally().landed;
    }
    assert_eq!(landed, 5);
    assert_eq!(
        db.strings("SELECT id || ' ' || name || ' v' || version FROM {s}.customers ORDER BY id"),
        ["1 a2 v2", "3 c v1"]
    );
    assert_eq!(
        db.strings("SELECT id::text FROM {s}.customers_tombstones"),
        ["2"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(3));
    assert_eq!(committed(&group, &topic, 2), vec![Some(2), Some(3)]);
    assert_eq!(
        pool_settings(&bouncer.url, 16),
        server_defaults(),
        "{}",
        bouncer.log()
    );
}
