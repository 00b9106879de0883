//! Least privilege (issue 16): the owner runs `init` (tables, ledger day partitions ahead), a role with DML only
//! runs the pipeline with `--no-ddl`; `check --database` names what a role lacks without writing; a missing
//! partition under `--no-ddl` stops the batch uncommitted, named, and nothing is lost. And configuration
//! errors (a librdkafka property typo, a missing topic) are refused before anything is created.
//!
//! The local cluster uses trust authentication: a role is used by putting its name in the URL's user.

use chrono::{Days, NaiveDate};

use crate::common::*;
use crate::projection_builds::BASE;

/// One counter per (day, customer); the ledger is partitioned by day and keeps 30 days.
const PIPE: &str = concat!(
    header!(),
    r#"[batch]
max-records = 20
linger-ms = 20

[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/customer_id", type = "text" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = 30

[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "customer_id"]
column = "n"
"#
);

/// A login role created for one test (no privileges beyond PUBLIC's), dropped with everything granted to it.
struct Role {
    name: String,
    db: tokio_postgres::Client,
    rt: tokio::runtime::Runtime,
}

impl Role {
    fn new() -> Role {
        let rt = runtime();
        let db = pg_client(&rt);
        let name = unique("rs_dml").to_lowercase();
        rt.block_on(db.batch_execute(&format!("CREATE ROLE \"{name}\" LOGIN")))
            .unwrap();
        Role { name, db, rt }
    }

    /// `DATABASE_URL` with this role as the user.
    fn url(&self) -> String {
        let url = database_url();
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let rest = match rest.split_once('@') {
            Some((_, host)) => host,
            None => rest,
        };
        format!("{scheme}://{}@{rest}", self.name)
    }

    /// docs/operations.md "Privileges": the grants of a runtime role on the pipeline's schema.
    fn grant_runtime(&self, schema: &str) {
        let r = &self.name;
        self.sql(&format!(
            "GRANT USAGE ON SCHEMA \"{schema}\" TO \"{r}\"; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO \"{r}\"; \
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA \"{schema}\" TO \"{r}\""
        ));
    }

    fn sql(&self, sql: &str) {
        self.rt
            .block_on(self.db.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Objects (tables, partitions, sequences …) owned by the role, other than temporary ones (a session's
    /// `landed` table is dropped as its backend exits, which may be just after the process ended).
    fn owned(&self) -> i64 {
        self.rt
            .block_on(self.db.query_one(
                "SELECT count(*) FROM pg_class WHERE relpersistence <> 't' \
                 AND relowner = (SELECT oid FROM pg_roles WHERE rolname = $1)",
                &[&self.name],
            ))
            .unwrap()
            .get(0)
    }

    /// `replaysafe ARGS` connected as this role.
    fn replaysafe(&self, args: &[&str]) -> Out {
        let url = self.url();
        replaysafe_with(
            args,
            &[("DATABASE_URL", url.as_str())],
            std::time::Duration::from_secs(120),
        )
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let n = &self.name;
        let sql = format!("DROP OWNED BY \"{n}\"; DROP ROLE IF EXISTS \"{n}\"");
        // Bounded: a backend of the role may still be exiting (its temporary tables).
        for _ in 0..50 {
            if self.rt.block_on(self.db.batch_execute(&sql)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not drop role {n}");
    }
}

/// The database's UTC date (the one clock of the ledger).
fn db_today(db: &Db) -> NaiveDate {
    let t = db
        .text("SELECT ((now() AT TIME ZONE 'UTC')::date)::text")
        .unwrap();
    NaiveDate::parse_from_str(&t, "%Y-%m-%d").unwrap()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn event(n: usize, day: NaiveDate, customer: usize) -> String {
    format!(
        r#"{{"event_id":"6f1c1f4e-6a55-4c0b-9a55-{n:012}","occurred_at":"{day}T12:00:00Z","customer_id":"c{customer}"}}"#
    )
}

/// `n` events over the days `today - 2 ..= today` and 4 customers, spread over 3 partitions.
fn events(today: NaiveDate, n: usize) -> Vec<(Rec, NaiveDate, String)> {
    (0..n)
        .map(|i| {
            let day = today.checked_sub_days(Days::new((i % 3) as u64)).unwrap();
            let customer = format!("c{}", i % 4);
            let rec = Rec::json(
                (i % 3) as i32,
                &format!("k{i}"),
                &event(i, day, i % 4),
                now_ms(),
            );
            (rec, day, customer)
        })
        .collect()
}

/// `(day, customer, n)` of the expected counter rows.
fn expected_counts(evs: &[(Rec, NaiveDate, String)]) -> Vec<(String, String, i64)> {
    let mut m = std::collections::BTreeMap::new();
    for (_, d, c) in evs {
        *m.entry((d.to_string(), c.clone())).or_insert(0i64) += 1;
    }
    m.into_iter().map(|((d, c), n)| (d, c, n)).collect()
}

fn counts(db: &Db) -> Vec<(String, String, i64)> {
    db.query(
        "SELECT day::text, customer_id, n FROM {s}.daily_counts ORDER BY 1, 2",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn partitions(db: &Db) -> i64 {
    db.i64("SELECT count(*) FROM pg_inherits WHERE inhparent = '{s}.replaysafe_ledger'::regclass")
}

#[test]
fn a_dml_only_role_runs_the_pipeline_after_init_by_the_owner() {
    let (db, topic) = stage("privs_run", 3);
    let group = unique("g");
    let p = pipeline(PIPE, &topic, &group, &db.schema);
    let today = db_today(&db);
    let mut evs = events(today, 30);
    // A redelivery of event 0 on another partition: one delivery key, landed once.
    let dup = Rec::json(1, "k0", &event(0, evs[0].1, 0), now_ms());
    let mut recs: Vec<Rec> = evs.iter().map(|e| e.0.clone()).collect();
    recs.push(dup);
    produce(&topic, &recs);

    // The owner: tables, 30 days of horizon + today + 3 days ahead.
    let out = replaysafe(&["init", "--config", arg(&p.path), "--days", "3"]);
    out.assert_ok();
    assert_eq!(partitions(&db), 34, "{}", out.stdout);

    // An expired day partition (40 days back, horizon 30) the owner left: a --no-ddl run must not drop it.
    let old = today.checked_sub_days(Days::new(40)).unwrap();
    db.execute(&format!(
        "CREATE TABLE {{s}}.replaysafe_ledger_p{} PARTITION OF {{s}}.replaysafe_ledger \
         (EXCLUDE USING hash ((ROW(generation, event_id, day)::{{s}}.replaysafe_ledger_key) WITH =)) \
         FOR VALUES FROM ('{old}') TO ('{}')",
        old.format("%Y%m%d"),
        old.succ_opt().unwrap()
    ));
    let role = Role::new();
    role.grant_runtime(&db.schema);
    let config = arg(&p.path);

    // Everything it needs, checked without writing.
    let out = role.replaysafe(&["check", "--config", config, "--database"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("MISSING"), "{}", out.stdout);
    assert!(
        out.stdout.contains("SELECT, INSERT, UPDATE, DELETE on"),
        "{}",
        out.stdout
    );
    // Issue 42 item 3: what --database finds is not buried under the four answers (`check` alone prints them).
    assert!(
        !out.stdout.contains("What identifies a change") && out.stdout.contains(": valid"),
        "{}",
        out.stdout
    );

    // Without --no-ddl the role is asked for DDL it may not do: a clear refusal, nothing consumed.
    let out = role.replaysafe(&["run", "--config", config, "--until-caught-up"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("insufficient privilege") && out.stderr.contains("--no-ddl"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints"), 0);

    // With --no-ddl: the whole topic, exactly.
    let out = role.replaysafe(&["run", "--config", config, "--until-caught-up", "--no-ddl"]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (31, 30, 1, 0)
    );
    evs.sort_by_key(|e| e.1);
    assert_eq!(counts(&db), expected_counts(&evs));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 30);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(10));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(11));
    assert_eq!(db.checkpoint(&group, &topic, 2), Some(10));
    assert_eq!(partitions(&db), 35, "no partition created or dropped");
    assert_eq!(role.owned(), 0, "the role created nothing");
    // Pruning is the owner's `init`: it drops the expired day.
    let out = replaysafe(&["init", "--config", config, "--days", "3"]);
    out.assert_ok();
    assert!(
        out.stdout.contains("0 created, 1 expired dropped"),
        "{}",
        out.stdout
    );
    assert_eq!(partitions(&db), 34);
}

#[test]
fn check_database_names_a_missing_privilege_and_missing_partitions_without_writing() {
    let db = Db::fresh("privs_check");
    let p = pipeline(PIPE, "unused", &unique("g"), &db.schema);
    // Before `init`: the tables are named as missing (init creates them), not as a privilege to grant.
    let out = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let want = "not checked: the tables do not exist yet (`replaysafe init` creates them)";
    assert!(out.stdout.contains(want), "{}", out.stdout);
    assert!(out.stderr.contains("item(s) MISSING"), "{}", out.stderr);
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    let role = Role::new();
    // No grant at all: the schema's USAGE is named (the tables cannot even be looked up without it).
    let out = role.replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let want = format!(
        "MISSING USAGE on schema {0}: GRANT USAGE ON SCHEMA {0} TO",
        db.schema
    );
    assert!(out.stdout.contains(&want), "{}", out.stdout);
    role.grant_runtime(&db.schema);
    role.sql(&format!(
        "REVOKE UPDATE ON \"{}\".replaysafe_checkpoints FROM \"{}\"",
        db.schema, role.name
    ));
    let out = role.replaysafe(&[
        "check",
        "--config",
        arg(&p.path),
        "--database",
        "--days",
        "3",
    ]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let want = format!(
        "MISSING UPDATE on \"{}\".\"replaysafe_checkpoints\"",
        db.schema
    );
    assert!(out.stdout.contains(&want), "{}", out.stdout);
    assert!(out.stdout.contains("GRANT UPDATE ON"), "{}", out.stdout);
    // today + 1 exists (init --days 1), today + 2 and + 3 do not: named.
    let today = db_today(&db);
    for (d, missing) in [(1, false), (2, true), (3, true)] {
        let name = format!(
            "replaysafe_ledger_p{}",
            today
                .checked_add_days(Days::new(d))
                .unwrap()
                .format("%Y%m%d")
        );
        assert_eq!(
            out.stdout.contains(&name),
            missing,
            "{name}: {}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains("init --config FILE --days 3`"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("UPDATE on"), "{}", out.stderr);
    assert_eq!(role.owned(), 0);
}

#[test]
fn a_missing_partition_under_no_ddl_is_named_and_nothing_is_lost() {
    let (db, topic) = stage("privs_part", 3);
    let group = unique("g");
    let p = pipeline(PIPE, &topic, &group, &db.schema);
    let today = db_today(&db);
    let later = today.checked_add_days(Days::new(5)).unwrap();
    let mut evs = events(today, 12);
    // On partition 0 between others: an event dated 5 days ahead, beyond `init --days 1`.
    let ahead = (
        Rec::json(0, "ahead", &event(99, later, 1), now_ms()),
        later,
        "c1".to_string(),
    );
    evs.insert(6, ahead);
    let offsets = produce(&topic, &evs.iter().map(|e| e.0.clone()).collect::<Vec<_>>());
    let ahead_offset = offsets[6];

    let role = Role::new();
    let config = arg(&p.path);
    let no_ddl = ["run", "--config", config, "--until-caught-up", "--no-ddl"];
    // Before `init`: the tables are missing, and --no-ddl creates none.
    role.sql(&format!(
        "GRANT USAGE ON SCHEMA \"{}\" TO \"{}\"",
        db.schema, role.name
    ));
    let out = role.replaysafe(&no_ddl);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("replaysafe_ledger\"")
            && out.stderr.contains("missing")
            && out.stderr.contains("replaysafe init"),
        "{}",
        out.stderr
    );
    assert_eq!(created(&db, &db.schema), (1, 0));
    // After `init`, before the table grants: the privilege is named, with where to find the rest.
    replaysafe(&["init", "--config", config, "--days", "1"]).assert_ok();
    let out = role.replaysafe(&no_ddl);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("permission denied for table")
            && out.stderr.contains("check --config FILE --database"),
        "{}",
        out.stderr
    );
    role.grant_runtime(&db.schema);
    let out = role.replaysafe(&["run", "--config", config, "--until-caught-up", "--no-ddl"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let name = format!("replaysafe_ledger_p{}", later.format("%Y%m%d"));
    assert!(
        out.stderr.contains(&name)
            && out.stderr.contains("init --config")
            && out.stderr.contains("--days 5"),
        "{}",
        out.stderr
    );
    // Nothing of that batch committed: no claim of the event, partition 0 checkpointed before it at most.
    let id = "6f1c1f4e-6a55-4c0b-9a55-000000000099";
    assert_eq!(
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_ledger WHERE event_id = '{id}'"
        )),
        0
    );
    assert!(db
        .checkpoint(&group, &topic, 0)
        .is_none_or(|c| c <= ahead_offset));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );

    // The owner creates the days ahead; the role's rerun (`manage-schema = false` in the file this time) lands
    // everything, exactly once.
    replaysafe(&["init", "--config", config, "--days", "5"]).assert_ok();
    let text = PIPE.replace(
        "schema = \"{schema}\"",
        "schema = \"{schema}\"\nmanage-schema = false",
    );
    let p2 = pipeline(&text, &topic, &group, &db.schema);
    role.replaysafe(&["run", "--config", arg(&p2.path), "--until-caught-up"])
        .assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 13);
    evs.sort_by_key(|e| e.1);
    assert_eq!(counts(&db), expected_counts(&evs));
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(5));
    assert_eq!(role.owned(), 0);
}

/// The schemas and tables named like `schema` (information_schema).
fn created(db: &Db, schema: &str) -> (i64, i64) {
    let n = |sql: &str| -> i64 { db.query(sql, &[&schema])[0].get(0) };
    (
        n("SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1"),
        n("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1"),
    )
}

#[test]
fn a_librdkafka_property_typo_exits_2_naming_it_before_anything_is_created() {
    let db = Db::fresh("privs_typo");
    let topic = new_topic("privs_typo", 1);
    let schema = unique("privs_never").to_lowercase();
    let text = format!(
        "{PIPE}\n[kafka.properties]\n\"session.timeout.ms\" = 10000\n\"sesion.timeout.ms\" = 6000\n"
    );
    let p = pipeline(&text, &topic, &unique("g"), &schema);
    let line = text
        .lines()
        .position(|l| l.starts_with("\"sesion"))
        .unwrap()
        + 1;
    let at = format!("{}:{line}:", p.path.display());
    for cmd in ["check", "init", "run"] {
        let out = replaysafe(&[cmd, "--config", arg(&p.path)]);
        assert_eq!(out.code, Some(2), "{cmd}: {}", out.stderr);
        assert!(
            out.stderr.contains("`sesion.timeout.ms`") && out.stderr.contains(&at),
            "{cmd}: {}",
            out.stderr
        );
    }
    assert_eq!(created(&db, &schema), (0, 0));
}

#[test]
fn a_missing_topic_is_named_by_check_connect_and_refused_by_run_before_anything_is_created() {
    let db = Db::fresh("privs_topic");
    let topic = new_topic("privs_topic", 1);
    let schema = unique("privs_never").to_lowercase();
    let missing = unique("privs_no_such_topic");
    let text = PIPE.replace("[\"{topic}\"]", &format!("[\"{{topic}}\", \"{missing}\"]"));
    let p = pipeline(&text, &topic, &unique("g"), &schema);
    let out = replaysafe(&["check", "--config", arg(&p.path), "--connect"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!("MISSING topic {missing}")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("ok      topic {topic}")),
        "{}",
        out.stdout
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("`{missing}`")),
        "{}",
        out.stderr
    );
    assert_eq!(created(&db, &schema), (0, 0));
}

/// `check --connect` against brokers nobody listens on says so as `run` does — the address, where it came from,
/// the cause — within `--connect-timeout` (exit 1), not a bare librdkafka metadata error after 30 s per topic.
#[test]
fn check_connect_names_unreachable_brokers_like_run() {
    let schema = unique("privs_never").to_lowercase();
    let p = pipeline(PIPE, "no_topic_asked", &unique("g"), &schema);
    let out = replaysafe(&[
        "check",
        "--config",
        arg(&p.path),
        "--connect",
        "--brokers",
        "127.0.0.1:1",
        "--connect-timeout",
        "2",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let want = "cannot connect to the Kafka brokers 127.0.0.1:1 (from --brokers): connection refused, gave up";
    assert!(out.stderr.contains(want), "{}", out.stderr);
}

/// Row projections (their tombstone, conflict and truncate tables) and an outbox (a bigserial id): the side
/// tables and sequences a DML-only role needs too.
const ROWS: &str = concat!(
    header!(),
    r#"[batch]
linger-ms = 20
[fields]
event_id = { path = "/event_id", type = "text" }
event_type = { path = "/event_type", type = "text" }
customer_id = { path = "/customer_id", type = "text" }
amount = { path = "/amount", type = "bigint", optional = true }
version = { path = "/version", type = "bigint" }
[identity]
key = ["event_id"]
[[projection]]
kind = "row"
table = "customers"
key = ["customer_id"]
version = "version"
columns = ["customer_id", "amount"]
delete-if = "event_type == 'CustomerClosed'"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "customer_id", "amount"]
"#
);

#[test]
fn row_and_outbox_projections_run_under_a_dml_only_role() {
    let (db, topic) = stage("privs_rows", 3);
    let group = unique("g");
    let p = pipeline(ROWS, &topic, &group, &db.schema);
    let ev = |id: &str, ty: &str, c: &str, amount: i64, v: i64| {
        format!(
            r#"{{"event_id":"{id}","event_type":"{ty}","customer_id":"{c}","amount":{amount},"version":{v}}}"#
        )
    };
    // Each customer on one partition; e1 redelivered on another.
    let recs = [
        (0, ev("e1", "Opened", "c1", 10, 1)),
        (0, ev("e2", "Changed", "c1", 20, 2)),
        (1, ev("e3", "Opened", "c2", 5, 1)),
        (1, ev("e4", "CustomerClosed", "c2", 5, 2)),
        (2, ev("e5", "Opened", "c3", 7, 1)),
        (2, ev("e1", "Opened", "c1", 10, 1)),
    ];
    let recs: Vec<Rec> = recs
        .iter()
        .map(|(part, v)| Rec::json(*part, "k", v, now_ms()))
        .collect();
    produce(&topic, &recs);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let role = Role::new();
    role.grant_runtime(&db.schema);
    let out = role.replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    for t in [
        "customers_tombstones",
        "replaysafe_conflicts",
        "replaysafe_truncates",
        "replaysafe_row_versions",
        "outbox_id_seq",
    ] {
        assert!(out.stdout.contains(t), "{t}: {}", out.stdout);
    }
    let out = role.replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (6, 5, 1, 0)
    );
    let rows: Vec<(String, i64)> = db
        .query(
            "SELECT customer_id, amount FROM {s}.customers ORDER BY 1",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, [("c1".to_string(), 20), ("c3".to_string(), 7)]);
    assert_eq!(
        db.strings("SELECT customer_id FROM {s}.customers_tombstones"),
        ["c2"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 5);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
    assert_eq!(db.checkpoint(&group, &topic, 2), Some(2));
    assert_eq!(role.owned(), 0);
}

/// Makes `role` a superuser whose own schema (`"$user"`, first on the default search_path) holds overloads of
/// `unnest`, `to_json` and `format` that PostgreSQL prefers to `pg_catalog`'s; each call of one adds a row to
/// `"<role>".calls`.
fn plant_overloads(role: &Role) {
    let r = role.name.clone();
    let mut plant = format!(
        "ALTER ROLE \"{r}\" SUPERUSER; SET ROLE \"{r}\"; CREATE SCHEMA \"{r}\"; \
         CREATE TABLE \"{r}\".calls (f text NOT NULL);"
    );
    let overloads = [
        (
            "unnest",
            "a text[]",
            "SETOF text",
            "RETURN QUERY SELECT pg_catalog.unnest(a);",
        ),
        (
            "unnest",
            "a bigint[]",
            "SETOF bigint",
            "RETURN QUERY SELECT pg_catalog.unnest(a);",
        ),
        (
            "unnest",
            "a integer[]",
            "SETOF integer",
            "RETURN QUERY SELECT pg_catalog.unnest(a);",
        ),
        ("to_json", "a text", "json", "RETURN pg_catalog.to_json(a);"),
        (
            "format",
            "a text, b text",
            "text",
            "RETURN pg_catalog.format(a, b);",
        ),
        (
            "format",
            "a text, b text, c text",
            "text",
            "RETURN pg_catalog.format(a, b, c);",
        ),
    ];
    for (f, args, ret, body) in overloads {
        plant += &format!(
            "CREATE FUNCTION \"{r}\".{f}({args}) RETURNS {ret} LANGUAGE plpgsql AS $f$ BEGIN \
             INSERT INTO \"{r}\".calls VALUES ('{f}({args})'); {body} END $f$;"
        );
    }
    // Everything planted is the role's own, so that `DROP OWNED` at the end drops it (a superuser role with
    // objects owned by another one could not be dropped and stayed on the cluster).
    plant += "RESET ROLE;";
    role.sql(&plant);
}

/// Issue 35.1 (CVE-2018-1058's class): a role that may CREATE in a schema on the default `search_path`
/// (`"$user", public`) plants overloads that PostgreSQL prefers to `pg_catalog`'s polymorphic built-ins. Every
/// replaysafe session pins `search_path = pg_catalog, pg_temp`, so none of them runs — not in `init` run by a
/// superuser, not in the batch transactions, not in `verify`'s or `check --database`'s reads.
#[test]
fn overloads_planted_on_the_default_search_path_never_run() {
    let (db, topic) = stage("planted", 3);
    let group = unique("g");
    let p = pipeline(PIPE, &topic, &group, &db.schema);
    let today = db_today(&db);
    let evs = events(today, 30);
    let recs: Vec<Rec> = evs.iter().map(|e| e.0.clone()).collect();
    produce(&topic, &recs);

    // A superuser whose own schema ("$user", first on the default search_path) holds the planted functions.
    let role = Role::new();
    let r = role.name.clone();
    plant_overloads(&role);

    // The trap is live: a session of the role on the default search_path calls the planted unnest.
    let rt = runtime();
    let (victim, conn) = rt
        .block_on(tokio_postgres::connect(&role.url(), tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let n: i64 = rt
        .block_on(victim.query_one("SELECT count(*) FROM unnest(ARRAY['a', 'b']::text[])", &[]))
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    let calls = |c: &tokio_postgres::Client| -> Vec<String> {
        rt.block_on(c.query(&format!("SELECT f FROM \"{r}\".calls ORDER BY f"), &[]))
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    assert_eq!(calls(&victim), vec!["unnest(a text[])".to_string()]);
    rt.block_on(victim.batch_execute(&format!("TRUNCATE \"{r}\".calls")))
        .unwrap();

    // init as that superuser, the pipeline, check --database and verify's snapshot: nothing planted runs.
    let config = arg(&p.path);
    role.replaysafe(&["init", "--config", config, "--days", "1"])
        .assert_ok();
    let out = role.replaysafe(&["run", "--config", config, "--until-caught-up"]);
    out.assert_ok();
    assert!(
        out.stdout
            .contains("consumed 30 = landed 30 + duplicate 0 + filtered 0 + quarantined 0"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let out = role.replaysafe(&["check", "--config", config, "--database"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let snap = p.dir.path().join("snap.json");
    let snap_arg = snap.to_str().unwrap();
    let out = role.replaysafe(&[
        "verify",
        "snapshot",
        "--config",
        config,
        "--table",
        "daily_counts",
        "-o",
        snap_arg,
    ]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        calls(&victim),
        Vec::<String>::new(),
        "planted functions ran"
    );
    assert_eq!(counts(&db), expected_counts(&evs));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 30);
    drop(victim);
}

/// Found by H7 (issue 35.1's class): a `sql` projection's `setup` is the operator's SQL, run in `init`'s session
/// (and `run`'s start-up session when it manages the schema). A `SET search_path` there — a common first line of
/// a DDL script — used to stay in force for the rest of that session, so replaysafe's own statements after it
/// (as a superuser here) could call the overloads planted on the default path. Every pinned session setting is
/// pinned again after each setup statement: nothing planted runs, and the projection's rows are exact.
#[test]
fn a_setup_that_sets_search_path_does_not_unpin_the_session() {
    let (db, topic) = stage("setuppath", 3);
    let group = unique("g");
    let extra = r#"
[[projection]]
name = "seen"
kind = "sql"
setup = '''SET search_path = "$user", public; SET datestyle = 'SQL, DMY';
  CREATE TABLE IF NOT EXISTS {schema}.seen (event_id uuid PRIMARY KEY, day date NOT NULL)'''
sql = '''INSERT INTO {schema}.seen (event_id, day) SELECT event_id, day FROM landed
  ON CONFLICT (event_id) DO NOTHING'''
"#;
    let p = pipeline(&format!("{PIPE}{extra}"), &topic, &group, &db.schema);
    let today = db_today(&db);
    let evs = events(today, 30);
    let recs: Vec<Rec> = evs.iter().map(|e| e.0.clone()).collect();
    produce(&topic, &recs);
    let role = Role::new();
    let r = role.name.clone();
    plant_overloads(&role);
    let config = arg(&p.path);
    role.replaysafe(&["init", "--config", config, "--days", "1"])
        .assert_ok();
    // `run` manages the schema too: its start-up session runs the setup again.
    let out = role.replaysafe(&["run", "--config", config, "--until-caught-up"]);
    out.assert_ok();
    assert!(
        out.stdout
            .contains("consumed 30 = landed 30 + duplicate 0 + filtered 0 + quarantined 0"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let calls = db.query(&format!("SELECT f FROM \"{r}\".calls ORDER BY f"), &[]);
    let calls: Vec<String> = calls.iter().map(|row| row.get(0)).collect();
    assert_eq!(calls, Vec::<String>::new(), "planted functions ran");
    assert_eq!(counts(&db), expected_counts(&evs));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.seen"), 30);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 30);
}

/// Issue 35.5: `check --database` lists a missing SELECT on the projection record table (it used to exit 1 with
/// the raw error) and asks for no USAGE on an identity column's sequence (`replaysafe_sources`; PostgreSQL does
/// not check it); a grant missing at run time (INSERT on a projection table) exits 2 naming the privilege and
/// `check --database`, with nothing of the batch committed.
#[test]
fn privileges_missing_at_check_and_at_run_time_are_named() {
    let (db, topic) = stage("privs_named", 3);
    let group = unique("g");
    let p = pipeline(PIPE, &topic, &group, &db.schema);
    let today = db_today(&db);
    let evs = events(today, 12);
    produce(&topic, &evs.iter().map(|e| e.0.clone()).collect::<Vec<_>>());
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    let role = Role::new();
    let (s, r) = (db.schema.clone(), role.name.clone());
    role.sql(&format!(
        "GRANT USAGE ON SCHEMA \"{s}\" TO \"{r}\"; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{s}\" TO \"{r}\"; \
         GRANT USAGE ON SEQUENCE \"{s}\".replaysafe_dead_letters_id_seq TO \"{r}\"; \
         REVOKE SELECT ON \"{s}\".replaysafe_projection_set FROM \"{r}\""
    ));
    let out = role.replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let want = format!("MISSING SELECT on \"{s}\".\"replaysafe_projection_set\"");
    assert!(out.stdout.contains(&want), "{}", out.stdout);
    assert!(
        out.stdout.contains("projection record not checked"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("MISSING USAGE on sequence")
            && !out.stdout.contains("replaysafe_sources_id_seq"),
        "identity sequences need no grant: {}",
        out.stdout
    );

    // At run time: INSERT on the counter table revoked.
    role.sql(&format!(
        "GRANT SELECT ON \"{s}\".replaysafe_projection_set TO \"{r}\"; \
         REVOKE INSERT ON \"{s}\".daily_counts FROM \"{r}\""
    ));
    let out = role.replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("permission denied")
            && out.stderr.contains("check --config FILE --database"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.daily_counts"), 0);
    for part in 0..3 {
        assert_eq!(db.checkpoint(&group, &topic, part).unwrap_or(0), 0);
    }
    // Granted again, the same run lands everything.
    role.sql(&format!("GRANT INSERT ON \"{s}\".daily_counts TO \"{r}\""));
    let out = role.replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    out.assert_ok();
    assert_eq!(counts(&db), expected_counts(&evs));
}

/// `--no-ddl` with a day partition missing mid-stream, one record per batch: the run stops at the record of the
/// missing day and nothing after it on that partition is committed (a drain must not apply the next records
/// over it); after `init` creates the partition a rerun applies everything exactly once.
#[test]
fn a_missing_day_partition_under_no_ddl_with_small_batches_skips_nothing() {
    let (db, topic) = stage("bknoddl", 1);
    let text = BASE.replace("max-records = 20", "max-records = 1");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let today = db
        .text("SELECT (now() AT TIME ZONE 'UTC')::date::text")
        .unwrap();
    let recs: Vec<Rec> = (0..40)
        .map(|i| {
            let day = if i == 20 {
                "2026-07-01"
            } else {
                today.as_str()
            };
            let v = format!(r#"{{"id":"e{i}","cust":"c{}","day":"{day}"}}"#, i % 3);
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs);
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    let out = replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("replaysafe_ledger_p20260701"),
        "{}",
        out.stderr
    );
    let checkpoint = db.i64("SELECT coalesce(max(next_offset), 0) FROM {s}.replaysafe_checkpoints");
    assert_eq!(checkpoint, 20, "stopped at the record of the missing day");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 20);
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    db.execute(
        "CREATE TABLE {s}.replaysafe_ledger_p20260701 PARTITION OF {s}.replaysafe_ledger \
         (EXCLUDE USING hash ((ROW(generation, id, day)::{s}.replaysafe_ledger_key) WITH =)) \
         FOR VALUES FROM ('2026-07-01') TO ('2026-07-02')",
    );
    let again = replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    again.assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 40);
}
