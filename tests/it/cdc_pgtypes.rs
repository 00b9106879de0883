//! Issue 40 items 2–5: PostgreSQL and Debezium as production runs them — typed destination columns (C55),
//! intervals (C54), incremental snapshots (C51) and tables without a primary key (C52). Each case's records are
//! produced to a real broker and run through the binary into real PostgreSQL; the case's `expected` is the
//! oracle (case offsets map to the broker's: a fresh topic starts at 0).

use crate::cases::case_topic;
use crate::common::*;

/// The committed offset of partition 0 of `topic` for `group`.
fn committed0(group: &str, topic: &str) -> Option<i64> {
    committed(group, topic, 1)[0]
}

/// C55's destination: an enum, jsonb, a text array, a domain, a `GENERATED ALWAYS AS IDENTITY` key and a
/// generated column the source carries as an ordinary one.
const PRODUCTS_DDL: &str =
    "CREATE TYPE {s}.product_status AS ENUM ('draft', 'active', 'retired'); \
     CREATE DOMAIN {s}.cents AS integer CHECK (VALUE >= 0); \
     CREATE TABLE {s}.products (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, sku uuid, \
     status {s}.product_status, attrs jsonb, tags text[], qty int, unit_cents {s}.cents, \
     total_cents int GENERATED ALWAYS AS (qty * unit_cents) STORED)";

const PRODUCTS: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "products"
source-table = "public.products"
"#
);

/// C55: enum, jsonb (JSON text arriving as a string is stored as that JSON value; jsonb `null` is not SQL NULL),
/// arrays, a domain, an ALWAYS identity key and a generated column, into an existing table whose types are read
/// from the catalog; a label the enum lacks is dead-lettered naming the column. Batch sizes 1 and 5000; a replay
/// under a new group changes nothing. `check --database` names the columns before the first batch.
#[test]
fn c55_typed_destination_columns_enum_jsonb_arrays_generated() {
    let (topic, map) = case_topic("C55", "c55", 1, None);
    for max in [1, 5000] {
        let db = Db::fresh("c55");
        db.execute(PRODUCTS_DDL);
        let group = unique("g");
        let text = PRODUCTS.replace("MAXREC", &max.to_string());
        let p = pipeline(&text, &topic, &group, &db.schema);
        let check = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
        for want in [
            "column `total_cents` of",
            "is generated: left out of every write",
            "column `id` of",
            "OVERRIDING SYSTEM VALUE",
            "product_status (an enum or domain), written from text",
            "cents (an enum or domain), written from integer",
        ] {
            assert!(check.stdout.contains(want), "{want}: {}", check.stdout);
        }
        let out = run_caught_up(&p.path);
        out.assert_ok();
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.quarantined),
            (6, 5, 1),
            "max-records {max}"
        );
        let rows = db.query(
            "SELECT id, sku::text, status::text, jsonb_typeof(attrs), attrs::text, tags::text, qty, \
             unit_cents::int, total_cents FROM {s}.products ORDER BY id",
            &[],
        );
        type R = (
            i64,
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            i32,
            i32,
            i32,
        );
        let got: Vec<R> = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                    r.get(5),
                    r.get(6),
                    r.get(7),
                    r.get(8),
                )
            })
            .collect();
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            got,
            vec![
                (
                    1,
                    "0b6a7c1e-55aa-4c55-8e55-000000000001".into(),
                    "retired".into(),
                    s("object"),
                    s(r#"{"size": 2, "color": "red"}"#),
                    s("{a,b}"),
                    3,
                    250,
                    750
                ),
                (
                    2,
                    "0b6a7c1e-55aa-4c55-8e55-000000000002".into(),
                    "draft".into(),
                    s("string"),
                    s(r#""plain""#),
                    s("{}"),
                    1,
                    100,
                    100
                ),
                (
                    3,
                    "0b6a7c1e-55aa-4c55-8e55-000000000003".into(),
                    "draft".into(),
                    s("null"),
                    s("null"),
                    s("{x}"),
                    1,
                    100,
                    100
                ),
                (
                    4,
                    "0b6a7c1e-55aa-4c55-8e55-000000000004".into(),
                    "draft".into(),
                    None,
                    None,
                    None,
                    1,
                    100,
                    100
                ),
            ],
            "max-records {max}: total_cents computed by the destination (999 of offset 20 ignored)"
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.products WHERE attrs IS NOT NULL AND attrs->>'color' = 'red' AND attrs->'size' = '2'::jsonb"),
            1
        );
        let dl = db.query(
            "SELECT \"offset\", reason, detail FROM {s}.replaysafe_dead_letters",
            &[],
        );
        assert_eq!(dl.len(), 1);
        assert_eq!(dl[0].get::<_, i64>(0), map[&(0, 25)]);
        assert_eq!(dl[0].get::<_, String>(1), "invalid-field");
        let detail: String = dl[0].get(2);
        assert!(
            detail.contains("column `status`")
                && detail.contains("product_status")
                && detail.contains("archived"),
            "{detail}"
        );
        assert_eq!(committed0(&group, &topic), Some(map[&(0, 25)] + 1));
        assert_eq!(db.checkpoint(&group, &topic, 0), Some(map[&(0, 25)] + 1));
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
        if max == 5000 {
            // A replay under a new group: every claim is a duplicate, the rows stay as they are.
            let again = pipeline(&text, &topic, &unique("g"), &db.schema);
            let t = run_caught_up(&again.path).assert_ok().tally();
            assert_eq!((t.consumed, t.landed, t.duplicate), (6, 0, 5));
            assert_eq!(
                db.strings("SELECT status::text || '/' || coalesce(attrs::text, 'NULL') FROM {s}.products ORDER BY id"),
                vec![
                    r#"retired/{"size": 2, "color": "red"}"#,
                    r#"draft/"plain""#,
                    "draft/null",
                    "draft/NULL"
                ]
            );
        }
    }
}

/// C55, declared columns: `columns` naming a generated column, or an enum column as `text`, is refused by
/// `check --database` (exit 2) naming the column, before any batch; nothing is created or consumed.
#[test]
fn c55_check_database_names_generated_and_enum_mismatch() {
    let db = Db::fresh("c55c");
    db.execute(PRODUCTS_DDL);
    let topic = new_topic("c55c", 1);
    let text = concat!(
        debezium_header!(),
        r#"[[projection]]
kind = "row"
table = "products"
source-table = "public.products"
key = ["id"]
columns = { id = "bigint", status = "text", total_cents = "integer" }
"#
    );
    let p = pipeline(text, &topic, &unique("g"), &db.schema);
    let check = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(check.code, Some(2), "{}\n{}", check.stdout, check.stderr);
    assert!(
        check.stdout.contains("column `total_cents` of")
            && check.stdout.contains("GENERATED ALWAYS AS (…) STORED"),
        "{}",
        check.stdout
    );
    let text = text.replace(", total_cents = \"integer\"", "");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let check = replaysafe(&["check", "--config", arg(&p.path), "--database"]);
    assert_eq!(check.code, Some(2), "{}\n{}", check.stdout, check.stderr);
    assert!(
        check.stdout.contains("column `status` of")
            && check
                .stdout
                .contains("product_status, but `columns` of projection"),
        "{}",
        check.stdout
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.products"), 0);
}

const PLANS: &str = concat!(
    debezium_header!(),
    r#"MODE[[projection]]
kind = "row"
table = "plans"
source-table = "public.plans"
key = ["id"]
columns = { id = "bigint", period = "interval" }
"#
);

/// C54: Debezium's numeric interval keeps its microseconds exactly (never rounded to seconds; negative
/// microseconds too); the string mode's ISO 8601 durations keep months exactly. `check` warns about the numeric
/// mode's months unless `[source] interval-handling = "string"`. Replays give the same rows.
#[test]
fn c54_intervals_keep_microseconds_and_iso_months() {
    for (filter, mode, rows, last) in [
        ("pg.public.plans", "", 3, 32),
        (
            "pgs.public.plans",
            "interval-handling = \"string\"\n",
            2,
            31,
        ),
    ] {
        let db = Db::fresh("c54");
        let (topic, map) = case_topic("C54", "c54", 1, Some(filter));
        let group = unique("g");
        let p = pipeline(&PLANS.replace("MODE", mode), &topic, &group, &db.schema);
        let check = replaysafe(&["check", "--config", arg(&p.path)]);
        check.assert_ok();
        let warned = check
            .stdout
            .contains("warning: row projection `plans`: interval column `period`");
        assert_eq!(warned, mode.is_empty(), "{}", check.stdout);
        if warned {
            assert!(
                check.stdout.contains("30.4375 days")
                    && check.stdout.contains("interval.handling.mode = string"),
                "{}",
                check.stdout
            );
        }
        let out = run_caught_up(&p.path);
        out.assert_ok();
        let t = out.tally();
        assert_eq!((t.consumed, t.landed, t.quarantined), (rows, rows, 0));
        let got = db.strings("SELECT id || '=' || period::text FROM {s}.plans ORDER BY id");
        let want: Vec<&str> = if mode.is_empty() {
            vec!["1=730:30:00", "2=26:03:04.500001", "3=-00:00:00.000001"]
        } else {
            vec!["1=1 mon", "2=1 day 02:03:04.500001"]
        };
        assert_eq!(got, want);
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.plans WHERE id = 2 AND period = interval '1 day 02:03:04.500001'"),
            1
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
            0
        );
        assert_eq!(committed0(&group, &topic), Some(map[&(0, last)] + 1));
        // A replay under a new group: duplicates, the same rows.
        let again = pipeline(
            &PLANS.replace("MODE", mode),
            &topic,
            &unique("g"),
            &db.schema,
        );
        let t = run_caught_up(&again.path).assert_ok().tally();
        assert_eq!((t.landed, t.duplicate), (0, rows));
        assert_eq!(
            db.strings("SELECT id || '=' || period::text FROM {s}.plans ORDER BY id"),
            want
        );
    }
}

const ACCOUNTS: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)" }
"#
);

/// C51: incremental-snapshot reads (`snapshot = "incremental"`, no lsn, txId or sequence) interleaved with
/// streaming are accepted as reads — no parse error, no dead letter, no resnapshot warning — in partition order:
/// a read never lowers a stored version (id 3 keeps 74000100 after the second snapshot's read), inserts a row
/// it is the first to carry (73), never resurrects a deleted row, and nothing is deleted for rows a partial
/// snapshot lacks (id 2). Batch sizes 1 and 5000; replaying the partition under a new group changes nothing.
#[test]
fn c51_incremental_snapshot_reads_between_streamed_changes() {
    let (topic, map) = case_topic("C51", "c51", 1, None);
    for max in [1, 5000] {
        let db = Db::fresh("c51");
        let group = unique("g");
        let text = ACCOUNTS.replace("MAXREC", &max.to_string());
        let p = pipeline(&text, &topic, &group, &db.schema);
        let out = run_caught_up(&p.path);
        out.assert_ok();
        let t = out.tally();
        // 70, 71, 73, 74, 75 apply; 72 and 77 find their state stored (duplicates); 76 is a Kafka tombstone.
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
            (8, 5, 2, 1, 0),
            "max-records {max}: {}",
            out.stdout
        );
        assert!(
            !out.stderr.contains("re-snapshot detected"),
            "incremental reads are not a resnapshot: {}",
            out.stderr
        );
        let rows = db.query(
            "SELECT id, balance::text, _version FROM {s}.accounts ORDER BY id",
            &[],
        );
        let got: Vec<(i64, String, Vec<i64>)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, "25.00".into(), vec![71000036, 71000100]),
                (3, "8.00".into(), vec![74000036, 74000100]),
            ],
            "max-records {max}"
        );
        assert_eq!(
            db.query(
                "SELECT _version FROM {s}.accounts_tombstones WHERE id = 1",
                &[]
            )[0]
            .get::<_, Vec<i64>>(0),
            vec![75000036, 75000100]
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
            0
        );
        // 72, 73 and 77 are three claims (their identity is the read's own emission, not a null position).
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 7);
        assert_eq!(committed0(&group, &topic), Some(map[&(0, 77)] + 1));
        if max == 5000 {
            let again = pipeline(&text, &topic, &unique("g"), &db.schema);
            let t = run_caught_up(&again.path).assert_ok().tally();
            assert_eq!((t.landed, t.duplicate, t.filtered), (0, 7, 1));
            assert_eq!(
                db.strings("SELECT id || '=' || balance::text FROM {s}.accounts ORDER BY id"),
                vec!["2=25.00", "3=8.00"]
            );
        }
    }
}

/// C51, the row the read is the first to carry differs from nothing stored, and a read whose state differs
/// from the stored row (the stored row lagging) applies at the stored version; a read after the delete of its
/// row is stale (the tombstone wins).
#[test]
fn c51_incremental_read_never_resurrects_and_never_lowers() {
    let db = Db::fresh("c51b");
    let topic = new_topic("c51b", 1);
    let read = |id: i64, balance: &str, ts: i64| {
        raw(
            0,
            Some(serde_json::json!({ "id": id })),
            serde_json::json!({
                "before": null,
                "after": { "id": id, "owner": "o", "balance": balance },
                "source": { "version": "2.5.4.Final", "connector": "postgresql", "name": "pg", "ts_ms": ts,
                            "snapshot": "incremental", "db": "app", "sequence": null, "schema": "public",
                            "table": "accounts", "txId": null, "lsn": null, "xmin": null },
                "op": "r", "ts_ms": ts + 10, "transaction": null
            }),
        )
    };
    let cdc = Table("accounts");
    let recs = vec![
        cdc.create(
            0,
            1,
            serde_json::json!({"id": 1, "owner": "o", "balance": "1.00"}),
            100,
        ),
        // The stored row lags (e.g. written by an earlier pipeline): the read is newer.
        read(1, "2.00", 1_714_003_300_000),
        cdc.delete(
            0,
            1,
            serde_json::json!({"id": 1, "owner": null, "balance": null}),
            200,
        ),
        read(1, "2.00", 1_714_003_400_000),
    ];
    produce(&topic, &recs);
    let group = unique("g");
    let p = pipeline(
        &ACCOUNTS.replace("MAXREC", "5000"),
        &topic,
        &group,
        &db.schema,
    );
    let out = run_caught_up(&p.path);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, out.stale()),
        (4, 3, 1),
        "{}",
        out.stdout
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts"), 0);
    assert_eq!(
        db.strings("SELECT _last->>'balance' FROM {s}.accounts_tombstones WHERE id = 1"),
        vec!["2.00"],
        "the delete removed the read's state"
    );
    assert_eq!(committed0(&group, &topic), Some(4));
}

const AUDIT: &str = concat!(
    debezium_header!(),
    r#"[[projection]]
kind = "row"
table = "audit_events"
source-table = "public.audit_events"
key = ["user_id"]
columns = { user_id = "integer", action = "text", at = "timestamptz" }
KEYLESS"#
);

/// C52: a row projection of a keyless source table (null Kafka keys) is refused by default: `run` stops with
/// exit 2 at the first keyless change, naming the table, topic/partition/offset and the fixes
/// (`message.key.columns`, `keyless = "key"`); nothing is written or committed. With `keyless = "key"` on this
/// one-partition topic the projection's key identifies the rows.
#[test]
fn c52_keyless_source_is_refused_naming_the_table() {
    let db = Db::fresh("c52");
    let (topic, map) = case_topic("C52", "c52", 1, None);
    let group = unique("g");
    let p = pipeline(&AUDIT.replace("KEYLESS", ""), &topic, &group, &db.schema);
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    for want in [
        "keyless source table at",
        &format!("{topic}/0 offset {}", map[&(0, 5)]),
        "public.audit_events",
        "null Kafka key",
        "message.key.columns",
        "keyless = \"key\"",
    ] {
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
    assert_eq!(db.i64("SELECT count(*) FROM {s}.audit_events"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    // The checkpoint stays before the first keyless change.
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(map[&(0, 5)]));
    assert_nothing_committed_past(&group, &topic, 1, map[&(0, 5)], "C52");

    // keyless = "key": the operator vouches that the projection's key is unique at the source (here user 8's
    // insert and update only: offsets 8 and 9 of the case).
    let db = Db::fresh("c52k");
    let topic = new_topic("c52k", 1);
    let records = crate::cases::load("C52", None);
    let tail: Vec<&crate::cases::CaseRecord> = records.iter().filter(|r| r.offset >= 8).collect();
    crate::cases::produce_case(&topic, &tail);
    let group = unique("g");
    let p = pipeline(
        &AUDIT.replace("KEYLESS", "keyless = \"key\"\n"),
        &topic,
        &group,
        &db.schema,
    );
    let out = run_caught_up(&p.path);
    out.assert_ok();
    assert_eq!(
        db.strings("SELECT user_id || '/' || action FROM {s}.audit_events ORDER BY user_id"),
        vec!["8/logoff"]
    );
    assert_eq!(committed0(&group, &topic), Some(2));
}

/// C52, `keyless = "key"` on a topic of several partitions: a keyless change on a partition other than 0 stops
/// the run (exit 2) — null keys give no per-row order across partitions; nothing of that batch is committed.
#[test]
fn c52_keyless_key_mode_refuses_a_second_partition() {
    let db = Db::fresh("c52p");
    let topic = new_topic("c52p", 2);
    let records = crate::cases::load("C52", None);
    let mut one = records[0].rec.clone();
    one.partition = 1;
    produce(&topic, &[one]);
    let group = unique("g");
    let p = pipeline(
        &AUDIT.replace("KEYLESS", "keyless = \"key\"\n"),
        &topic,
        &group,
        &db.schema,
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains(&format!("keyless source table at {topic}/1 offset 0"))
            && out.stderr.contains("needs a topic of one partition"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.audit_events"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(0));
    assert_nothing_committed_past(&group, &topic, 2, 0, "C52, two partitions");
}

/// C55, a domain's `CHECK` refusing a value (SQLSTATE 23514, not class 22) quarantines that record naming the
/// column, like any value its column's type refuses; the rest of the batch applies, nothing is retried.
#[test]
fn c55_domain_check_violation_is_dead_lettered() {
    let db = Db::fresh("c55d");
    db.execute(PRODUCTS_DDL);
    let topic = new_topic("c55d", 1);
    let t = Table("products");
    let row = |id: i64, unit: i64| {
        serde_json::json!({"id": id, "sku": null, "status": "draft", "attrs": null, "tags": null,
                           "qty": 1, "unit_cents": unit, "total_cents": 0})
    };
    produce(
        &topic,
        &[
            t.create(0, 1, row(1, 100), 100),
            t.create(0, 2, row(2, -5), 200),
            t.create(0, 3, row(3, 7), 300),
        ],
    );
    let group = unique("g");
    let p = pipeline(
        &PRODUCTS.replace("MAXREC", "5000"),
        &topic,
        &group,
        &db.schema,
    );
    let out = run_caught_up(&p.path);
    out.assert_ok();
    let tally = out.tally();
    assert_eq!((tally.consumed, tally.landed, tally.quarantined), (3, 2, 1));
    assert_eq!(
        db.strings("SELECT id || '=' || total_cents FROM {s}.products ORDER BY id"),
        vec!["1=100", "3=7"]
    );
    let dl = db.query(
        "SELECT \"offset\", detail FROM {s}.replaysafe_dead_letters",
        &[],
    );
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].get::<_, i64>(0), 1);
    let detail: String = dl[0].get(1);
    assert!(
        detail.contains("column `unit_cents`") && detail.contains("cents"),
        "{detail}"
    );
    assert_eq!(committed0(&group, &topic), Some(3));
}

/// Issue 42 item 3: a `source-table` typo in a pipeline of row projections only: `run` stops (exit 2) at the first
/// change, naming the source table seen, its coordinates and the tables the projections read — nothing claimed,
/// nothing committed. The corrected file then lands every change (no claim of the typo's run hides them as
/// duplicates). With another kind of projection beside it, such changes are claimed for that one.
#[test]
fn a_source_table_typo_stops_the_run_before_anything_is_claimed() {
    let db = Db::fresh("typo");
    let topic = new_topic("typo", 1);
    let t = Table("accounts");
    let row = |id: i64| serde_json::json!({"id": id, "owner": format!("o{id}"), "balance": 5});
    produce(
        &topic,
        &[t.create(0, 1, row(1), 100), t.create(0, 2, row(2), 101)],
    );
    let text = |source: &str| {
        format!(
            "{DEBEZIUM_HEADER}[[projection]]\nkind = \"row\"\ntable = \"accounts\"\nsource-table = \"{source}\"\n\
             key = [\"id\"]\ncolumns = {{ id = \"bigint\", owner = \"text\", balance = \"bigint\" }}\n"
        )
    };
    let group = unique("g");
    let p = pipeline(&text("public.acounts"), &topic, &group, &db.schema);
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let at = format!("{topic}/0 offset 0");
    for want in [
        at.as_str(),
        "a change of source table public.accounts reaches no projection",
        "the row projections read public.acounts",
    ] {
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts"), 0);
    assert_nothing_committed_past(&group, &topic, 1, 0, "the typo");

    let fixed = pipeline(&text("public.accounts"), &topic, &group, &db.schema);
    run_caught_up(&fixed.path).assert_ok();
    assert_eq!(
        db.strings("SELECT id::text || '/' || owner FROM {s}.accounts ORDER BY id"),
        vec!["1/o1", "2/o2"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);

    // Beside a counter of every change, the unread table's changes are claimed for the counter.
    let db = Db::fresh("typoc");
    let counted = format!(
        "{}[[projection]]\nkind = \"counter\"\ntable = \"changes\"\ngroup-by = [\"_day\"]\n",
        text("public.acounts")
    );
    let p = pipeline(&counted, &topic, &unique("g"), &db.schema);
    run_caught_up(&p.path).assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts"), 0);
}
