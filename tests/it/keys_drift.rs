//! Issue 21 (and 19.5): outbox message keys, epoch units and leap seconds, a changed field type, a changed
//! projection on a ledger that holds claims, and dead letters resolved by a later backfill. Each asserts the
//! final tables (outbox keys, stored timestamps, counts, dead-letter rows) and exit codes.

use serde_json::json;

use crate::common::*;

const TS: i64 = 1_782_864_000_000; // 2026-07-01T00:00:00Z, the record timestamp of every test record

fn rec(partition: i32, value: serde_json::Value) -> Rec {
    Rec::json(partition, "k", &value.to_string(), TS)
}

fn out_key(db: &Db, table: &str, id: &str) -> Option<String> {
    db.query(
        &format!("SELECT message_key FROM {{s}}.{table} WHERE payload->>'id' = $1"),
        &[&id],
    )
    .first()
    .and_then(|r| r.get(0))
}

const OUTBOX: &str = concat!(
    header!(),
    r#"[batch]
max-records = 5000
[fields]
id = { path = "/id", type = "text" }
region = { path = "/region", type = "text", optional = true }
cust = { path = "/cust", type = "text" }
day = { path = "/at", type = "date", optional = true }
at = { path = "/at", type = "timestamptz", optional = true }
n = { path = "/n", type = "bigint", optional = true }
[identity]
key = ["id"]
[[projection]]
kind = "outbox"
table = "by_region"
payload = ["id"]
key = ["region", "cust"]
[[projection]]
kind = "outbox"
table = "by_cust"
payload = ["id"]
key = ["cust"]
[[projection]]
kind = "outbox"
table = "typed"
payload = ["id"]
key = ["day", "at", "n"]
"#
);

/// `|` inside a value, a missing (NULL) field, an empty string and a quote: every key is a JSON array of the
/// fields' texts with `null` for NULL, so no two of these entities share a message key, and a key with one
/// field never equals a two-field key with a NULL.
#[test]
fn outbox_message_keys_are_json_arrays_that_never_collide() {
    let (db, topic) = stage("obkey", 2);
    produce(
        &topic,
        &[
            rec(0, json!({"id": "e1", "cust": "a|b"})),
            rec(1, json!({"id": "e2", "region": "a", "cust": "b"})),
            rec(0, json!({"id": "e3", "region": "", "cust": "a|b"})),
            rec(1, json!({"id": "e4", "region": null, "cust": "x\"y"})),
            rec(
                0,
                json!({"id": "e5", "cust": "c", "at": "2026-07-01T10:00:00.5+02:00", "n": 7}),
            ),
        ],
    );
    let p = pipeline(OUTBOX, &topic, &unique("g"), &db.schema);
    let out = run_caught_up(&p.path);
    assert_eq!(out.tally().landed, 5);
    let k = |id| out_key(&db, "by_region", id).unwrap();
    assert_eq!(k("e1"), r#"[null, "a|b"]"#);
    assert_eq!(k("e2"), r#"["a", "b"]"#);
    assert_eq!(k("e3"), r#"["", "a|b"]"#);
    assert_eq!(k("e4"), r#"[null, "x\"y"]"#);
    assert_eq!(
        db.i64("SELECT count(DISTINCT message_key) FROM {s}.by_region"),
        5
    );
    assert_eq!(out_key(&db, "by_cust", "e1").unwrap(), r#"["a|b"]"#);
    assert_eq!(out_key(&db, "by_cust", "e2").unwrap(), r#"["b"]"#);
    // Typed fields in their canonical text, independent of the session's DateStyle and TimeZone.
    assert_eq!(
        out_key(&db, "typed", "e5").unwrap(),
        r#"["2026-07-01", "2026-07-01T08:00:00.500000Z", "7"]"#
    );
    assert_eq!(
        out_key(&db, "typed", "e1").unwrap(),
        r#"[null, null, null]"#
    );
}

/// The same encoding in a Debezium pipeline: fields of the row image and the built-in `_entity`.
#[test]
fn debezium_outbox_message_keys_are_json_arrays() {
    let (db, topic) = stage("obkeycdc", 1);
    let env = |id: i64, after: serde_json::Value, lsn: i64| {
        let value = json!({
            "before": null, "after": after, "op": "c", "ts_ms": TS,
            "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public",
                "table": "accounts", "snapshot": "false", "txId": lsn / 10, "lsn": lsn, "ts_ms": TS,
                "sequence": format!("[\"{}\",\"{}\"]", lsn - 36, lsn)},
        });
        Rec {
            partition: 0,
            key: Some(json!({ "id": id }).to_string().into_bytes()),
            value: Some(value.to_string().into_bytes()),
            timestamp_ms: Some(TS),
        }
    };
    produce(
        &topic,
        &[
            env(1, json!({"id": 1, "region": null, "cust": "a|b"}), 1000),
            env(2, json!({"id": 2, "region": "a", "cust": "b"}), 2000),
        ],
    );
    let text = concat!(
        debezium_header!(),
        r#"[fields]
region = { path = "/after/region", type = "text", optional = true }
cust = { path = "/after/cust", type = "text" }
[[projection]]
kind = "outbox"
table = "by_region"
payload = ["_entity"]
key = ["region", "cust"]
[[projection]]
kind = "outbox"
table = "by_entity"
payload = ["_entity"]
key = ["_entity"]
"#
    );
    let p = pipeline(text, &topic, &unique("g"), &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    let keys = |table: &str| -> Vec<String> {
        db.column(&format!(
            "SELECT message_key FROM {{s}}.{table} ORDER BY source_offset"
        ))
    };
    assert_eq!(keys("by_region"), [r#"[null, "a|b"]"#, r#"["a", "b"]"#]);
    assert_eq!(
        keys("by_entity"),
        [r#"["{\"id\":1}"]"#, r#"["{\"id\":2}"]"#]
    );
}

const TIMES: &str = concat!(
    header!(),
    r#"[fields]
id = { path = "/id", type = "text" }
at = { path = "/t", type = "timestamptz"UNIT }
day = { path = "/t", type = "date"UNIT }
[identity]
key = ["id"]
[ledger]
columns = ["at", "day"]
[[projection]]
kind = "counter"
table = "per_day"
group-by = ["day"]
"#
);

/// Epoch seconds under `unit = "s"` (number or numeric string) land as 2026-07-01; under the default
/// milliseconds they are quarantined naming the field and the likely unit instead of landing in 1970. A leap
/// second gives the same instant to a `date` and a `timestamptz` field (19.5).
#[test]
fn epoch_units_are_explicit_and_implausible_values_are_quarantined() {
    let topic = new_topic("epoch", 2);
    produce(
        &topic,
        &[
            rec(0, json!({"id": "s-number", "t": 1_782_864_000i64})),
            rec(1, json!({"id": "s-string", "t": "1782864000"})),
            rec(0, json!({"id": "ms-number", "t": 1_782_864_000_123i64})),
            rec(1, json!({"id": "leap", "t": "2016-12-31T23:59:60Z"})),
        ],
    );
    let stored = |db: &Db| -> Vec<(String, i64, String)> {
        db.query(
            "SELECT id, (extract(epoch FROM at) * 1000)::bigint, day::text FROM {s}.replaysafe_ledger ORDER BY id",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };
    let dead = |db: &Db| -> Vec<(i64, String, String)> {
        db.query(
            "SELECT \"offset\", reason, detail FROM {s}.replaysafe_dead_letters ORDER BY partition, \"offset\"",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };

    // unit = "s": seconds land in 2026; the milliseconds value is implausible as seconds.
    let db = Db::fresh("epoch_s");
    let p = pipeline(
        &TIMES.replace("UNIT", ", unit = \"s\""),
        &topic,
        &unique("g"),
        &db.schema,
    );
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (3, 1));
    assert_eq!(
        stored(&db),
        [
            (
                "leap".to_string(),
                1_483_228_800_000,
                "2017-01-01".to_string()
            ),
            ("s-number".into(), TS, "2026-07-01".into()),
            ("s-string".into(), TS, "2026-07-01".into()),
        ]
    );
    let d = dead(&db);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].1, "invalid-field");
    assert!(d[0].2.contains("field `at` (/t)"), "{}", d[0].2);
    assert!(d[0].2.contains("likely unit: milliseconds"), "{}", d[0].2);
    assert_eq!(
        db.i64("SELECT n FROM {s}.per_day WHERE day = '2026-07-01'"),
        2
    );

    // Default (milliseconds): the seconds are quarantined — number and string alike — never stored as 1970.
    let db = Db::fresh("epoch_ms");
    let p = pipeline(&TIMES.replace("UNIT", ""), &topic, &unique("g"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (2, 2));
    assert_eq!(
        stored(&db),
        [
            (
                "leap".to_string(),
                1_483_228_800_000,
                "2017-01-01".to_string()
            ),
            ("ms-number".into(), TS + 123, "2026-07-01".into()),
        ]
    );
    for (_, reason, detail) in dead(&db) {
        assert_eq!(reason, "invalid-field");
        assert!(detail.contains("field `at` (/t)"), "{detail}");
        assert!(detail.contains("1970-01-21"), "{detail}");
        assert!(
            detail.contains("likely unit: seconds (unit = \"s\""),
            "{detail}"
        );
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.per_day WHERE day < '1990-01-01'"),
        0
    );
}

const GROUPS: &str = concat!(
    header!(),
    r#"[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "CUST_TYPE" }
amount = { path = "/amount", type = "numeric" }
v = { path = "/v", type = "bigint" }
[identity]
key = ["id"]
[[projection]]
kind = "counter"
table = "counts"
group-by = ["cust"]
[[projection]]
kind = "sum"
table = "totals"
group-by = ["cust"]
add = { total = "amount" }
"#
);

const ROW: &str = r#"
[[projection]]
kind = "row"
table = "custs"
key = ["cust"]
version = "v"
columns = ["cust", "v"]
"#;

/// A field's type changed under existing projection tables: start-up refuses (exit 2) naming the column, the
/// table's type and the field's type — for counter/sum group-by columns and row projection columns — and
/// nothing is consumed: the tables keep one group.
#[test]
fn a_changed_field_type_is_refused_before_anything_is_consumed() {
    for with_row in [false, true] {
        let (db, topic) = stage("ftype", 1);
        let group = unique("g");
        let text = |ty: &str| {
            let mut t = GROUPS.replace("CUST_TYPE", ty);
            if with_row {
                t = t.replace(
                    "[[projection]]\nkind = \"counter\"",
                    &format!("{ROW}[[projection]]\nkind = \"counter\""),
                );
            }
            t
        };
        produce(
            &topic,
            &[rec(
                0,
                json!({"id": "e1", "cust": "007", "amount": "5", "v": 1}),
            )],
        );
        let p1 = pipeline(&text("text"), &topic, &group, &db.schema);
        assert_eq!(run_caught_up(&p1.path).tally().landed, 1);
        produce(
            &topic,
            &[rec(
                0,
                json!({"id": "e2", "cust": "007", "amount": "5", "v": 2}),
            )],
        );
        let p2 = pipeline(&text("bigint"), &topic, &group, &db.schema);
        let out = try_run(&p2.path);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        let table = if with_row { "custs" } else { "counts" };
        for needle in [
            format!("column `cust` of \"{}\".\"{table}\" is text", db.schema),
            "field `cust` is bigint".to_string(),
        ] {
            assert!(out.stderr.contains(&needle), "`{needle}` in {}", out.stderr);
        }
        assert!(!out.stderr.contains("SELECT u.ord"), "{}", out.stderr);
        let groups: Vec<(String, i64)> = db
            .query("SELECT cust::text, n FROM {s}.counts", &[])
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(groups, [("007".to_string(), 1)]);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
    }
}

/// A sum's `add` target whose column would round the field's values (a hand-made `bigint` column for a
/// `numeric` field, e.g. one created while the field was bigint) is refused at start-up (exit 2) naming the
/// column, its type and the field's: nothing is consumed, no 1.5 becomes 2. A `bigint` target for a `bigint`
/// field is exact and accepted.
#[test]
fn a_sum_target_that_would_round_the_field_is_refused() {
    let (db, topic) = stage("sumtype", 1);
    produce(
        &topic,
        &[rec(
            0,
            json!({"id": "e1", "cust": "c", "amount": "1.5", "v": 1}),
        )],
    );
    db.execute(
        "CREATE TABLE {s}.totals (cust text PRIMARY KEY, total bigint NOT NULL DEFAULT 0); \
         INSERT INTO {s}.totals VALUES ('c', 1); \
         COMMENT ON TABLE {s}.totals IS 'replaysafe: fed by ledger {s}.\"replaysafe_ledger\"'",
    );
    let group = unique("g");
    let p = pipeline(
        &GROUPS.replace("CUST_TYPE", "text"),
        &topic,
        &group,
        &db.schema,
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    for needle in [
        format!("column `total` of \"{}\".\"totals\" is bigint", db.schema),
        "the sum of field `amount` (numeric) is numeric".to_string(),
    ] {
        assert!(out.stderr.contains(&needle), "`{needle}` in {}", out.stderr);
    }
    assert_eq!(db.i64("SELECT total FROM {s}.totals WHERE cust = 'c'"), 1);
    // Refused before anything is created (the check runs before the tables are).
    assert_eq!(
        db.text("SELECT to_regclass('{s}.replaysafe_ledger')::text"),
        None
    );
    assert_eq!(
        db.text("SELECT to_regclass('{s}.replaysafe_checkpoints')::text"),
        None
    );

    // A bigint field into a bigint target is exact: accepted, the sum lands.
    let bigint = GROUPS
        .replace("CUST_TYPE", "text")
        .replace("add = { total = \"amount\" }", "add = { total = \"v\" }");
    let p = pipeline(&bigint, &topic, &group, &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(t.landed, 1);
    assert_eq!(db.i64("SELECT total FROM {s}.totals WHERE cust = 'c'"), 2);
}

const SUMS: &str = concat!(
    header!(),
    r#"[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "text" }
day = { path = "/day", type = "date" }
amount = { path = "/amount", type = "numeric" }
fee = { path = "/fee", type = "numeric", optional = true }
[identity]
key = ["id"]
[[projection]]
kind = "sum"
name = "totals"
table = "totals"
group-by = ["cust"]
add = { total = "amount" }
filter = "amount > 0.0"
[[projection]]
kind = "outbox"
table = "out"
payload = ["id", "amount"]
"#
);

fn init(text: &str, topic: &str, group: &str, db: &Db) -> Out {
    let p = pipeline(text, topic, group, &db.schema);
    replaysafe(&["init", "--config", p.path.to_str().unwrap()])
}

/// A projection changed under the same name on a ledger holding claims is refused (exit 2) saying what changed
/// and what to do: a narrowed or widened filter, another `add` target, another payload field, another group-by,
/// a field the projection reads defined differently. The unchanged pipeline passes. A ledger recorded by an
/// older replaysafe (names and kinds only) is accepted when those match and recorded anew; otherwise refused.
#[test]
fn a_changed_projection_is_refused_by_the_ledger_check() {
    let (db, topic) = stage("projchg", 1);
    produce(
        &topic,
        &[rec(
            0,
            json!({"id": "e1", "cust": "c", "day": "2026-07-01", "amount": "50"}),
        )],
    );
    let group = unique("g");
    let p = pipeline(SUMS, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 1);
    // `replaysafe init` of a pipeline text under the same group, and the record it leaves on the ledger.
    let init = |text: &str| init(text, &topic, &group, &db);
    let ledger_record = || {
        db.text("SELECT projections::text FROM {s}.replaysafe_projection_set")
            .unwrap()
    };
    let stricter = SUMS.replace("amount > 0.0", "amount > 1.0");
    init(SUMS).assert_ok();

    let changes: [(&str, &str, &str); 7] = [
        (
            "filter = \"amount > 0.0\"",
            "",
            "`filter` was `amount > 0.0`, now none",
        ),
        (
            "filter = \"amount > 0.0\"",
            "filter = \"amount > 100.0\"",
            "`filter` was `amount > 0.0`, now `amount > 100.0`",
        ),
        (
            "filter = \"amount > 0.0\"",
            "filter = \"amount > -100.0\"",
            "`filter` was `amount > 0.0`, now `amount > -100.0`",
        ),
        (
            "add = { total = \"amount\" }",
            "add = { total = \"amount\", fees = \"fee\" }",
            "`add` was `total = amount`, now `fees = fee, total = amount`",
        ),
        (
            "payload = [\"id\", \"amount\"]",
            "payload = [\"id\", \"amount\", \"cust\"]",
            "projection `out`: `payload` was `id, amount`, now `id, amount, cust`",
        ),
        (
            "group-by = [\"cust\"]",
            "group-by = [\"cust\", \"day\"]",
            "`group-by` was `cust`, now `cust, day`",
        ),
        (
            "amount = { path = \"/amount\"",
            "amount = { path = \"/gross\"",
            "`field amount` was `path /amount type numeric`, now `path /gross type numeric`",
        ),
    ];
    for (from, to, needle) in changes {
        let out = init(&SUMS.replace(from, to));
        assert_eq!(out.code, Some(2), "{to}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "`{needle}` in {}", out.stderr);
        assert!(
            out.stderr.contains("cannot change in place"),
            "{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("replaysafe projection build"),
            "{}",
            out.stderr
        );
    }
    // Nothing of the refused runs changed the record.
    init(SUMS).assert_ok();

    // Ledgers of earlier versions kept the record in their table comment (no record row). Format 1 (names and
    // kinds): matching → accepted and recorded; another set → refused.
    let v1 = |lines: &[&str]| {
        let joined = lines
            .iter()
            .map(|l| format!("'{l}'"))
            .collect::<Vec<_>>()
            .join(" || chr(10) || ");
        db.text(&format!(
            "SELECT 'replaysafe projections sha256:' || encode(sha256(convert_to({joined}, 'UTF8')), 'hex')"
        ))
        .unwrap()
    };
    let comment = |c: &str| {
        db.execute(&format!(
            "DELETE FROM {{s}}.replaysafe_projection_set; COMMENT ON TABLE {{s}}.replaysafe_ledger IS '{c}'"
        ))
    };
    comment(&v1(&["out:Outbox", "totals:Sum"]));
    init(SUMS).assert_ok();
    let recorded = ledger_record();
    assert!(recorded.contains("\"state\": \"active\""), "{recorded}");
    let out = init(&stricter);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    comment(&v1(&["totals:Sum"]));
    let out = init(SUMS);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("different set of projections"),
        "{}",
        out.stderr
    );

    // A comment replaysafe did not write (a DBA's note on a ledger from before the check) locks nobody out:
    // accepted, replaced by the record, and a later change is caught again.
    comment("purchases ledger, owner: team shop");
    init(SUMS).assert_ok();
    let recorded = ledger_record();
    assert!(recorded.contains("\"state\": \"active\""), "{recorded}");
    let out = init(&stricter);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
}

const NOTES: &str = concat!(
    header!(),
    r#"[batch]
max-records = MAXREC
[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "text" }
note = { path = "/note", type = "text"OPTIONAL }
[identity]
key = ["id"]
[ledger]
columns = ["note"]
[[projection]]
kind = "counter"
table = "counts"
group-by = ["cust"]
"#
);

/// A record quarantined by production (`note` missing) and applied later by a backfill with `note` optional:
/// its dead letter is marked resolved by the backfill's delivery key; the other dead letter stays outstanding.
/// Batches of 1 and of 5000 records.
#[test]
fn a_backfill_resolves_the_dead_letters_of_the_records_it_applies() {
    for max_records in [1, 5000] {
        backfill_resolves_dead_letters(max_records);
    }
}

fn backfill_resolves_dead_letters(max_records: usize) {
    let (db, topic) = stage("dlres", 2);
    produce(
        &topic,
        &[
            rec(0, json!({"id": "e1", "cust": "c", "note": "ok"})),
            rec(0, json!({"id": "e2", "cust": "c"})),
            rec(1, json!({"id": "e3", "cust": "c", "note": "ok"})),
            rec(1, json!({"id": "e4", "cust": "d"})),
            rec(1, json!({"id": "e5", "cust": "d", "note": 5})),
            rec(1, "not json".into()),
        ],
    );
    let group = unique("g");
    let notes = NOTES.replace("MAXREC", &max_records.to_string());
    let p = pipeline(&notes.replace("OPTIONAL", ""), &topic, &group, &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (3, 3));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL AND resolved_by IS NULL"),
        3
    );

    let fixed = pipeline(
        &notes.replace("OPTIONAL", ", optional = true"),
        &topic,
        &group,
        &db.schema,
    );
    let out = backfill(
        &fixed,
        "2026-06-30T00:00:00Z",
        ("--to-group", &group),
        &unique("bf"),
        &[],
    );
    out.assert_ok();
    let dead: Vec<(i32, i64, Option<String>, bool)> = db
        .query(
            "SELECT partition, \"offset\", resolved_by, resolved_at IS NOT NULL FROM {s}.replaysafe_dead_letters \
             ORDER BY partition, \"offset\"",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        dead,
        [
            (0, 1, Some(r#"["", "e2"]"#.to_string()), true),
            (1, 1, Some(r#"["", "e4"]"#.to_string()), true),
            (1, 3, None, false),
        ]
    );
    let counts: Vec<(String, i64)> = db
        .query("SELECT cust, n FROM {s}.counts ORDER BY cust", &[])
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(counts, [("c".to_string(), 3), ("d".to_string(), 2)]);
}

/// A dead-letter table created by an earlier replaysafe (without `resolved_at`/`resolved_by`) gets the columns
/// at start-up; its rows stay outstanding.
#[test]
fn an_existing_dead_letter_table_gets_the_resolution_columns() {
    let db = Db::fresh("dlupg");
    db.execute(
        "CREATE TABLE {s}.replaysafe_dead_letters (id bigserial PRIMARY KEY, generation text NOT NULL DEFAULT '', \
         topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, record_timestamp timestamptz, \
         key bytea, value bytea, value_bytes integer, value_sha256 bytea, reason text NOT NULL, detail text NOT NULL, \
         consumer_group text NOT NULL, quarantined_at timestamptz NOT NULL DEFAULT now(), \
         UNIQUE (generation, topic, partition, \"offset\"));
         INSERT INTO {s}.replaysafe_dead_letters (topic, partition, \"offset\", reason, detail, consumer_group) \
         VALUES ('t', 0, 7, 'invalid-json', 'x', 'g')",
    );
    let topic = unique("dlupg");
    init(
        &NOTES.replace("MAXREC", "10").replace("OPTIONAL", ""),
        &topic,
        "g",
        &db,
    )
    .assert_ok();
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE \"offset\" = 7 AND resolved_at IS NULL \
             AND resolved_by IS NULL"
        ),
        1
    );
}

/// A changed pipeline given its own ledger and tables but the old group-id resumes at the group's checkpoints:
/// the new tables miss the earlier records. That is said (a warning naming the checkpoint and the fix), and a
/// new group-id with `start = "earliest"` builds the new tables from the topic's beginning.
#[test]
fn a_new_ledger_under_an_old_group_is_warned_and_a_new_group_builds_it() {
    let (db, topic) = stage("newledger", 1);
    produce(
        &topic,
        &[
            rec(
                0,
                json!({"id": "e1", "cust": "c", "day": "2026-07-01", "amount": "50"}),
            ),
            rec(
                0,
                json!({"id": "e2", "cust": "c", "day": "2026-07-01", "amount": "150"}),
            ),
        ],
    );
    let group = unique("g");
    let p = pipeline(SUMS, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    let changed = SUMS
        .replace("amount > 0.0", "amount > 100.0")
        .replace("table = \"totals\"", "table = \"totals_b\"")
        .replace("table = \"out\"", "table = \"out_b\"")
        .replace("[identity]", "[ledger]\ntable = \"ledger_b\"\n[identity]");
    let p = pipeline(&changed, &topic, &group, &db.schema);
    let out = run_caught_up(&p.path);
    out.assert_ok();
    assert_eq!(out.tally().consumed, 0);
    assert!(
        out.stderr.contains("the ledger is new, but group")
            && out.stderr.contains("at offset 2")
            && out.stderr.contains("new [kafka] group-id"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.ledger_b"), 0);
    // A new group (start = "earliest") builds the new ledger and tables from the beginning.
    let p = pipeline(&changed, &topic, &unique("g"), &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.ledger_b"), 2);
    assert_eq!(
        db.text("SELECT total::text FROM {s}.totals_b WHERE cust = 'c'"),
        Some("150".to_string())
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.out_b"), 2);
}

/// The outbox's `delivery_key` (and a resolved dead letter's `resolved_by`) spells dates and timestamps the same
/// under any session `DateStyle`/`TimeZone` (a database default, `PGOPTIONS`): two processes, one with
/// `DateStyle = 'SQL, DMY'` and `TimeZone = 'Asia/Kolkata'`, write `2026-07-01`, never `01/07/2026`.
#[test]
fn delivery_keys_do_not_depend_on_session_settings() {
    let (db, topic) = stage("dkstyle", 1);
    let text = concat!(
        header!(),
        r#"[fields]
id = { path = "/id", type = "text" }
at = { path = "/at", type = "timestamptz" }
day = { path = "/at", type = "date" }
[identity]
key = ["id", "at"]
partition-by = "day"
[[projection]]
kind = "outbox"
table = "out"
payload = ["id"]
"#
    );
    let group = unique("g");
    let p = pipeline(text, &topic, &group, &db.schema);
    produce(
        &topic,
        &[rec(0, json!({"id": "e1", "at": "2026-07-01T00:00:10.5Z"}))],
    );
    run_caught_up(&p.path);
    produce(
        &topic,
        &[rec(0, json!({"id": "e2", "at": "2026-07-01T00:00:10Z"}))],
    );
    let sep = if database_url().contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!(
        "{}{sep}options=-c%20DateStyle%3DSQL,DMY%20-c%20TimeZone%3DAsia/Kolkata",
        database_url()
    );
    let out = try_run_with(
        &p.path,
        &[("DATABASE_URL", url.as_str())],
        std::time::Duration::from_secs(120),
    );
    out.assert_ok();
    assert_eq!(out.tally().landed, 1);
    let keys: Vec<String> = db.column("SELECT delivery_key FROM {s}.out ORDER BY source_offset");
    assert_eq!(
        keys,
        [
            r#"["", "e1", "2026-07-01 00:00:10.5+00", "2026-07-01"]"#,
            r#"["", "e2", "2026-07-01 00:00:10+00", "2026-07-01"]"#,
        ]
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
