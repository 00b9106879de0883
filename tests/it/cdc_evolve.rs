//! Case C44 with real Debezium (3.6.1.Final under Kafka Connect, `scripts/connect-start`, schemaless JSON,
//! `decimal.handling.mode=string`): the source table gets a column added, a column dropped and a column retyped
//! (int → numeric(12,2)) between runs of the pipeline. Absent is not NULL (`absent = "keep"`, the default) unless
//! `absent = "null"`; a new column lands where it is mapped, in `_extra` under `new-columns = "extra"`, nowhere
//! under `"ignore"`; a retype the projection's column holds applies, one it cannot hold is quarantined with a
//! reason naming the column. Tombstones and versions keep working, no conflicts, and a rebuild of the whole topic
//! into a fresh schema gives the rows of the live run.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;
use crate::connect::{drop_slot, read_values, unique_name, Connect};
use crate::registry::dead_letters;
use std::time::Instant;

fn payload(v: &Value) -> &Value {
    match v {
        Value::Object(m) if m.len() == 2 && m.contains_key("payload") => &m["payload"],
        other => other,
    }
}

/// Waits until the topic holds a change of op `op` whose row has `id`.
fn wait_for(topic: &str, id: i64, op: &str) {
    read_values(topic, Duration::from_secs(120), |vs| {
        vs.iter().any(|v| {
            let p = payload(v);
            p["op"] == op && (p["after"]["id"] == id || (op == "d" && p["before"]["id"] == id))
        })
    });
}

const PIPELINE: &str = r#"decimal-handling = "string"
[batch]
linger-ms = 10
[[projection]]
kind = "row"
table = "accounts"
source-table = "SRC.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)", updated_at = "timestamptz", loyalty_points = "numeric(12,2)", tier = "text" }
[[projection]]
kind = "row"
table = "accounts_null"
source-table = "SRC.accounts"
key = ["id"]
absent = "null"
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)" }
[[projection]]
kind = "row"
table = "accounts_extra"
source-table = "SRC.accounts"
key = ["id"]
new-columns = "extra"
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)", updated_at = "timestamptz", loyalty_points = "numeric(12,2)" }
"#;

/// The narrow pipeline: `loyalty_points integer` cannot hold the retyped numeric(12,2) values.
const NARROW: &str = r#"decimal-handling = "string"
[[projection]]
kind = "row"
table = "accounts"
source-table = "SRC.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)", loyalty_points = "integer" }
"#;

fn rows(db: &Db, table: &str, cols: &str) -> Vec<String> {
    db.column(&format!(
        "SELECT concat_ws(' | ', {cols}) FROM {{s}}.{table} ORDER BY id"
    ))
}

const ACCOUNTS: &str =
    "id, coalesce(owner, 'NULL'), balance, coalesce(loyalty_points::text, 'NULL'), coalesce(tier, 'NULL')";
const EXTRA: &str =
    "id, coalesce(owner, 'NULL'), balance, coalesce(loyalty_points::text, 'NULL'), coalesce(_extra::text, 'NULL')";

#[test]
fn c44_schema_evolution_with_real_debezium() {
    let db = Db::fresh("c44");
    let src = unique_name("c44src");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.accounts (id bigint PRIMARY KEY, owner text, \
         balance numeric(12,2), updated_at timestamptz, loyalty_points int);
         INSERT INTO {src}.accounts VALUES (1, 'acct-one', 10.00, '2024-04-25T00:00:00Z', 100)"
    ));
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{src}.accounts");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[
            ("topic.prefix", &src),
            ("table.include.list", &table),
            ("decimal.handling.mode", "string"),
        ],
        false,
    );
    let topic = connect.topic(&src, "accounts");
    let text = format!("{DEBEZIUM_HEADER}{}", PIPELINE.replace("SRC", &src));
    let group = unique("g");
    let run = |db: &Db, text: &str, group: &str| -> Out {
        let p = pipeline(text, &topic, group, &db.schema);
        run_caught_up(&p.path)
    };
    let sql = |stmts: &[String]| {
        for s in stmts {
            db.execute(s);
        }
    };

    // Phase 1: the original shape.
    sql(&[format!(
        "INSERT INTO {src}.accounts VALUES (3, 'acct-three', 1.00, '2024-04-25T00:00:30Z', 7)"
    )]);
    wait_for(&topic, 3, "c");
    run(&db, &text, &group);
    // Phase 2: ADD COLUMN tier; an update that sets it, an insert with tier NULL.
    sql(&[
        format!("ALTER TABLE {src}.accounts ADD COLUMN tier text"),
        format!("UPDATE {src}.accounts SET balance = 20.00, updated_at = '2024-04-25T00:01:00Z', tier = 'gold' WHERE id = 1"),
        format!("INSERT INTO {src}.accounts VALUES (2, 'acct-two', 5.00, '2024-04-25T00:02:00Z', 0, NULL)"),
    ]);
    wait_for(&topic, 2, "c");
    run(&db, &text, &group);
    // Phase 3: DROP COLUMN owner; retype loyalty_points to numeric(12,2); a delete; a marker.
    sql(&[
        format!("ALTER TABLE {src}.accounts DROP COLUMN owner"),
        format!("UPDATE {src}.accounts SET balance = 30.00, updated_at = '2024-04-25T00:03:00Z' WHERE id = 1"),
        format!("ALTER TABLE {src}.accounts ALTER COLUMN loyalty_points TYPE numeric(12,2)"),
        format!("UPDATE {src}.accounts SET loyalty_points = 120.00, updated_at = '2024-04-25T00:04:00Z' WHERE id = 1"),
        format!("DELETE FROM {src}.accounts WHERE id = 3"),
        format!("INSERT INTO {src}.accounts (id, balance) VALUES (900, 0.00)"),
    ]);
    wait_for(&topic, 900, "c");
    let values = read_values(&topic, Duration::from_secs(30), |vs| {
        vs.iter().any(|v| payload(v)["after"]["id"] == 900)
    });
    let out = run(&db, &text, &group);

    let dead: Vec<String> =
        db.column("SELECT \"offset\"::text || ' ' || reason || ': ' || detail FROM {s}.replaysafe_dead_letters");
    assert!(
        dead.is_empty(),
        "no dead letters: {dead:#?}\n{}",
        out.stdout
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
    // The retyped value arrived as a decimal string, the owner of the later updates is absent (not null).
    let after: Vec<&Value> = values.iter().map(|v| &payload(v)["after"]).collect();
    assert!(
        after
            .iter()
            .any(|a| a["id"] == 1 && a["loyalty_points"] == "120.00" && a.get("owner").is_none()),
        "{after:?}"
    );
    let live = rows(&db, "accounts", ACCOUNTS);
    assert_eq!(
        live,
        vec![
            "1 | acct-one | 30.00 | 120.00 | gold",
            "2 | acct-two | 5.00 | 0.00 | NULL",
            "900 | NULL | 0.00 | NULL | NULL",
        ],
        "absent owner kept; tier mapped; the numeric column took 100 and \"120.00\""
    );
    assert_eq!(
        rows(&db, "accounts_null", "id, coalesce(owner, 'NULL'), balance"),
        vec![
            "1 | NULL | 30.00",
            "2 | acct-two | 5.00",
            "900 | NULL | 0.00"
        ],
        "absent = \"null\": the dropped column's value goes"
    );
    let extra = rows(&db, "accounts_extra", EXTRA);
    assert_eq!(
        extra,
        vec![
            r#"1 | acct-one | 30.00 | 120.00 | {"tier": "gold"}"#,
            r#"2 | acct-two | 5.00 | 0.00 | {"tier": null}"#,
            r#"900 | NULL | 0.00 | NULL | {"tier": null}"#,
        ]
    );
    for t in ["accounts", "accounts_null", "accounts_extra"] {
        assert_eq!(
            db.column::<i64>(&format!("SELECT id FROM {{s}}.{t}_tombstones ORDER BY id")),
            vec![3],
            "{t}: the delete left its tombstone"
        );
    }

    // The whole topic again under the same group's ledger: nothing lands, nothing changes.
    let again = run(&db, &text, &unique("g"));
    assert_eq!(again.tally().landed, 0, "{}", again.stdout);
    assert_eq!(rows(&db, "accounts", ACCOUNTS), live);
    assert_eq!(rows(&db, "accounts_extra", EXTRA), extra);

    // A rebuild of the whole topic into a fresh schema gives the same rows.
    let rebuilt = Db::fresh("c44r");
    let out = run(&rebuilt, &text, &unique("g"));
    assert_eq!(out.tally().quarantined, 0, "{}", out.stdout);
    assert_eq!(rows(&rebuilt, "accounts", ACCOUNTS), live);
    assert_eq!(rows(&rebuilt, "accounts_extra", EXTRA), extra);

    // A projection whose column cannot hold the retyped values: that record is quarantined with a reason naming
    // the column; the rest applies.
    let narrow = Db::fresh("c44n");
    let ntext = format!("{DEBEZIUM_HEADER}{}", NARROW.replace("SRC", &src));
    let out = run(&narrow, &ntext, &unique("g"));
    let dead: Vec<String> = narrow.column("SELECT detail FROM {s}.replaysafe_dead_letters");
    assert_eq!(dead.len(), 1, "{dead:#?}\n{}", out.stdout);
    assert!(
        dead[0].contains("column `loyalty_points`") && dead[0].contains("120.00"),
        "{dead:?}"
    );
    assert_eq!(out.tally().quarantined, 1);
    assert_eq!(
        rows(
            &narrow,
            "accounts",
            "id, coalesce(owner, 'NULL'), balance, coalesce(loyalty_points::text, 'NULL')"
        ),
        vec![
            "1 | acct-one | 30.00 | 100",
            "2 | acct-two | 5.00 | 0",
            "900 | NULL | 0.00 | NULL"
        ]
    );

    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}

/// A Debezium change of `public.accounts` row `id` on `partition` at source position `lsn`.
fn change(partition: i32, op: &str, id: i64, before: Value, after: Value, lsn: i64) -> Rec {
    let value = serde_json::json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_760_000_000_000i64 + lsn,
        "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "accounts",
            "snapshot": "false", "txId": lsn / 10, "lsn": lsn, "ts_ms": 1_760_000_000_000i64 + lsn,
            "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 5)},
    });
    raw(partition, Some(serde_json::json!({ "id": id })), value)
}

/// `_extra` is carried, never judged: at an equal version (a `version` column, so two changes at different source
/// positions meet in the fold) a change that differs only in unmapped members is a duplicate, not a conflict; a
/// newer version with the same mapped state lands and updates `_extra`; a change whose mapped columns differ at
/// an equal version is still a conflict. Absent members keep the stored value; deletes leave tombstones.
/// Entities on two partitions.
#[test]
fn extra_members_are_carried_never_judged() {
    use serde_json::json;
    let topic = new_topic("c44x", 2);
    let n = Value::Null;
    produce(
        &topic,
        &[
            change(
                0,
                "c",
                1,
                n.clone(),
                json!({"id": 1, "owner": "o1", "version": 1}),
                100,
            ),
            change(
                0,
                "u",
                1,
                n.clone(),
                json!({"id": 1, "owner": "o1", "version": 1, "tier": "gold"}),
                200,
            ),
            change(
                0,
                "u",
                1,
                n.clone(),
                json!({"id": 1, "owner": "o1", "version": 2, "tier": "silver"}),
                300,
            ),
            change(
                0,
                "u",
                1,
                n.clone(),
                json!({"id": 1, "owner": "x", "version": 2, "tier": "silver"}),
                400,
            ),
            change(
                1,
                "c",
                2,
                n.clone(),
                json!({"id": 2, "owner": "o2", "version": 1, "tier": null}),
                110,
            ),
            change(1, "u", 2, n.clone(), json!({"id": 2, "version": 2}), 210),
            change(
                1,
                "u",
                3,
                n.clone(),
                json!({"id": 3, "version": 1, "tier": "new"}),
                220,
            ),
            change(
                1,
                "d",
                3,
                json!({"id": 3, "owner": null, "version": 1}),
                n.clone(),
                310,
            ),
        ],
    );
    let db = Db::fresh("c44x");
    let text = format!(
        r#"{DEBEZIUM_HEADER}[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
version = "version"
new-columns = "extra"
columns = {{ id = "bigint", owner = "text", version = "bigint" }}
"#
    );
    let out = run_text(&text, &topic, &unique("g"), &db);
    let t = out.tally();
    assert_eq!(
        (
            t.consumed,
            t.landed,
            t.duplicate,
            out.stale(),
            t.quarantined
        ),
        (8, 6, 1, 1, 0),
        "{}",
        out.stdout
    );
    assert_eq!(
        rows(
            &db,
            "accounts",
            "id, coalesce(owner, 'NULL'), version, coalesce(_extra::text, 'NULL'), _version::text"
        ),
        vec![
            r#"1 | o1 | 2 | {"tier": "silver"} | {2}"#,
            r#"2 | o2 | 2 | NULL | {2}"#,
        ],
        "id 2's owner is absent from its update: kept"
    );
    assert_eq!(
        db.column::<String>(
            "SELECT entity::text || ' ' || version::text || ' ' || incoming::text FROM {s}.replaysafe_conflicts"
        ),
        vec![r#"{"id": "1"} {2} {"id": "1", "owner": "x", "_extra": "{\"tier\": \"silver\"}", "version": "2"}"#],
        "only the change of a mapped column at an equal version is a conflict (values in PostgreSQL's form: jsonb)"
    );
    assert_eq!(
        db.column::<i64>("SELECT id FROM {s}.accounts_tombstones"),
        vec![3]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// C44's opt-in strict mode: `schema-drift = "strict"` stops the partition once, with an error naming the field
/// and topic/partition/offset (exit 2), nothing of that batch committed and no dead letter; after the file is
/// fixed (lenient) a restart ends exact. Partition 0 gets a new member (`tier`), partition 1 loses a mapped one
/// (`owner`).
#[test]
fn strict_schema_drift_stops_naming_the_field() {
    use serde_json::json;
    let topic = new_topic("c44s", 2);
    let n = Value::Null;
    produce(
        &topic,
        &[
            change(0, "c", 1, n.clone(), json!({"id": 1, "owner": "o1"}), 100),
            change(1, "c", 2, n.clone(), json!({"id": 2, "owner": "o2"}), 110),
        ],
    );
    let db = Db::fresh("c44s");
    let group = unique("g");
    let body = r#"[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text" }
"#;
    let strict = format!("{DEBEZIUM_HEADER}{body}schema-drift = \"strict\"\n");
    let p = pipeline(&strict, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    produce(
        &topic,
        &[
            change(
                0,
                "u",
                1,
                n.clone(),
                json!({"id": 1, "owner": "o1b", "tier": "gold"}),
                200,
            ),
            change(1, "u", 2, n.clone(), json!({"id": 2}), 210),
        ],
    );
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    let named = [
        format!("schema drift at {topic}/0 offset 1: field `tier`"),
        format!("schema drift at {topic}/1 offset 1: mapped column `owner` is absent"),
    ];
    assert!(
        named.iter().any(|m| out.stderr.contains(m.as_str())),
        "{}",
        out.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    for part in [0, 1] {
        assert!(
            db.checkpoint(&group, &topic, part) == Some(1),
            "partition {part}: the drifting record is not checkpointed"
        );
    }
    // Fixed file: lenient (the default) — absent keeps, the new member is ignored.
    let lenient = format!("{DEBEZIUM_HEADER}{body}schema-drift = \"lenient\"\n");
    let p = pipeline(&lenient, &topic, &group, &db.schema);
    run_caught_up(&p.path);
    assert_eq!(
        rows(&db, "accounts", "id, coalesce(owner, 'NULL')"),
        vec!["1 | o1b", "2 | o2"]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        4,
        "every record claimed once over the stop and the restart"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    for part in [0, 1] {
        assert_eq!(db.checkpoint(&group, &topic, part), Some(2));
    }
}

/// A Debezium change in the JSON converter's `{schema, payload}` form (schemas on): `fields` is the row's Connect
/// schema (the same for `before` and `after`).
fn with_schema(partition: i32, op: &str, id: i64, after: Value, fields: &Value, lsn: i64) -> Rec {
    let mut r = change(partition, op, id, Value::Null, after, lsn);
    let row = serde_json::json!({"type": "struct", "optional": true, "fields": fields});
    let mut before = row.clone();
    before["field"] = "before".into();
    let mut aft = row;
    aft["field"] = "after".into();
    let schema = serde_json::json!({"type": "struct", "name": "pg.public.accounts.Envelope", "fields": [
        before, aft,
        {"field": "source", "type": "struct", "fields": []},
        {"field": "op", "type": "string"},
        {"field": "ts_ms", "type": "int64", "optional": true}]});
    let payload: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
    r.value = Some(
        serde_json::to_vec(&serde_json::json!({"schema": schema, "payload": payload})).unwrap(),
    );
    r
}

/// `new-columns = "add"` with schemas on, over two partitions: columns added at the source mid-stream are added
/// to the table typed from the Connect schema (`tier text`, a `Decimal` → `numeric`) and written from then on,
/// by two workers of one group at once; an added column is carried, never judged (a newer change of `tier` only
/// is landed and stored); a source column named like a bookkeeping column is quarantined naming it; a replay of
/// the whole topic lands 0 and leaves the rows identical.
#[test]
fn new_columns_are_added_from_the_connect_schema() {
    use serde_json::json;
    let topic = new_topic("c44a", 2);
    let v1 = json!([{"field": "id", "type": "int64"}, {"field": "owner", "type": "string", "optional": true}]);
    let mut v2 = v1.clone();
    v2.as_array_mut().unwrap().extend([
        json!({"field": "tier", "type": "string", "optional": true}),
        json!({"field": "points", "type": "bytes", "optional": true, "version": 1,
               "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}),
    ]);
    let mut bad = v1.clone();
    bad.as_array_mut()
        .unwrap()
        .push(json!({"field": "_version", "type": "int64"}));
    produce(
        &topic,
        &[
            with_schema(0, "c", 1, json!({"id": 1, "owner": "o1"}), &v1, 100),
            with_schema(1, "c", 2, json!({"id": 2, "owner": "o2"}), &v1, 110),
        ],
    );
    let db = Db::fresh("c44a");
    let group = unique("g");
    let text = format!(
        r#"{DEBEZIUM_HEADER}[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
new-columns = "add"
columns = {{ id = "bigint", owner = "text" }}
"#
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().landed, 2);
    let sha1 = "SELECT _sha256::text FROM {s}.accounts WHERE id = 1";
    let judged = db.text(sha1);
    produce(
        &topic,
        &[
            with_schema(
                0,
                "u",
                1,
                json!({"id": 1, "owner": "o1", "tier": "gold", "points": "LxI="}),
                &v2,
                200,
            ),
            with_schema(
                1,
                "u",
                2,
                json!({"id": 2, "owner": "o2", "tier": null, "points": null}),
                &v2,
                210,
            ),
            with_schema(
                1,
                "c",
                3,
                json!({"id": 3, "owner": "o3", "tier": "silver", "points": "Arw="}),
                &v2,
                220,
            ),
            with_schema(
                0,
                "u",
                1,
                json!({"id": 1, "owner": "o1", "tier": "platinum", "points": "LxI="}),
                &v2,
                300,
            ),
            with_schema(
                1,
                "c",
                4,
                json!({"id": 4, "owner": "o4", "_version": 9}),
                &bad,
                230,
            ),
        ],
    );
    // Two workers of the group at once.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| try_run(&p.path));
        let b = s.spawn(|| try_run(&p.path));
        (a.join().unwrap(), b.join().unwrap())
    });
    for o in [&a, &b] {
        assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    }
    let (landed, quarantined) = [&a, &b].iter().fold((0, 0), |(l, q), o| {
        let t = o.tally();
        (l + t.landed, q + t.quarantined)
    });
    assert_eq!((landed, quarantined), (4, 1), "{}\n{}", a.stdout, b.stdout);
    assert_eq!(
        db.column::<String>(
            "SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = '{s}.accounts'::regclass AND a.attname IN ('tier', 'points') ORDER BY 1"
        ),
        vec!["points numeric", "tier text"]
    );
    let cols = "id, coalesce(owner, 'NULL'), coalesce(tier, 'NULL'), coalesce(points::text, 'NULL'), _version::text";
    let want = vec![
        "1 | o1 | platinum | 120.50 | {295,300}",
        "2 | o2 | NULL | NULL | {205,210}",
        "3 | o3 | silver | 7.00 | {215,220}",
    ];
    assert_eq!(rows(&db, "accounts", cols), want);
    assert_eq!(
        db.text(sha1),
        judged,
        "added columns are carried, never judged: id 1's declared columns did not change"
    );
    let dead = db.strings("SELECT detail FROM {s}.replaysafe_dead_letters");
    assert!(
        dead.len() == 1 && dead[0].contains("`_version`") && dead[0].contains("bookkeeping"),
        "{dead:?}"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
    for part in [0, 1] {
        assert_eq!(
            db.checkpoint(&group, &topic, part),
            Some(if part == 0 { 3 } else { 4 })
        );
    }
    // A replay of the whole topic (a fresh group): nothing lands, the rows stay as they are.
    let before = rows(
        &db,
        "accounts",
        &format!("{cols}, _sha256::text, _delivery"),
    );
    let replay = run_text(&text, &topic, &unique("g"), &db);
    assert_eq!(replay.tally().landed, 0, "{}", replay.stdout);
    assert_eq!(
        rows(
            &db,
            "accounts",
            &format!("{cols}, _sha256::text, _delivery")
        ),
        before
    );
}

/// `new-columns = "add"` waits boundedly: while another session holds the projection table (a worker's batch
/// transaction), the `ALTER TABLE` gives up after `lock-timeout-ms` (SQLSTATE 55P03) and the batch is retried —
/// nothing of it committed meanwhile — then it ends exact once the lock goes. Schemaless: `tier` (a string)
/// becomes `text`, `score` (a number) `numeric`; a null says nothing yet.
#[test]
fn adding_a_column_waits_boundedly_and_retries() {
    use serde_json::json;
    let topic = new_topic("c44l", 2);
    let n = Value::Null;
    produce(
        &topic,
        &[
            change(0, "c", 1, n.clone(), json!({"id": 1, "owner": "o1"}), 100),
            change(1, "c", 2, n.clone(), json!({"id": 2, "owner": "o2"}), 110),
        ],
    );
    let db = Db::fresh("c44l");
    let group = unique("g");
    let text = format!(
        r#"{HEADER}lock-timeout-ms = 100
[source]
format = "debezium"
[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
new-columns = "add"
columns = {{ id = "bigint", owner = "text" }}
"#
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let mut worker = spawn_run(&p, &[], "worker");
    wait_until(Duration::from_secs(60), "the first changes applied", || {
        db.text("SELECT to_regclass('{s}.replaysafe_checkpoints')::text")
            .is_some()
            && db.checkpoint(&group, &topic, 0) == Some(1)
            && db.checkpoint(&group, &topic, 1) == Some(1)
    });
    let locker = pg_client(&db.rt);
    db.rt
        .block_on(locker.batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{}\".accounts IN ACCESS SHARE MODE",
            db.schema
        )))
        .unwrap();
    produce(
        &topic,
        &[
            change(
                0,
                "u",
                1,
                n.clone(),
                json!({"id": 1, "owner": "o1", "tier": "gold", "score": 7, "note": null}),
                200,
            ),
            change(
                1,
                "u",
                2,
                n.clone(),
                json!({"id": 2, "owner": "o2", "tier": null, "score": 1.5}),
                210,
            ),
        ],
    );
    wait_until(
        Duration::from_secs(60),
        "the ALTER TABLE waiting for the lock",
        || {
            db.i64("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%COMMENT ON COLUMN%'") > 0
        },
    );
    // Longer than lock-timeout-ms: the first attempt has given up (a wait, not an assertion on time).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        db.checkpoint(&group, &topic, 0),
        Some(1),
        "nothing committed while it waits"
    );
    db.rt.block_on(locker.batch_execute("COMMIT")).unwrap();
    wait_until(Duration::from_secs(60), "the new changes applied", || {
        db.checkpoint(&group, &topic, 0) == Some(2) && db.checkpoint(&group, &topic, 1) == Some(2)
    });
    assert_eq!(terminate(&mut worker), Some(0));
    let err = std::fs::read_to_string(p.dir.path().join("worker.err")).unwrap();
    assert!(
        err.contains("retrying the batch") && err.contains("55P03"),
        "{err}"
    );
    assert!(err.contains("source columns added"), "{err}");
    assert_eq!(
        db.column::<String>(
            "SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = '{s}.accounts'::regclass AND a.attname IN ('tier', 'score', 'note') ORDER BY 1"
        ),
        vec!["score numeric", "tier text"]
    );
    assert_eq!(
        rows(&db, "accounts", "id, owner, coalesce(tier, 'NULL'), score"),
        vec!["1 | o1 | gold | 7", "2 | o2 | NULL | 1.5"]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    for part in [0, 1] {
        assert_eq!(db.checkpoint(&group, &topic, part), Some(2));
    }
}

const ADD_PIPELINE: &str = r#"[batch]
linger-ms = 10
[[projection]]
kind = "row"
table = "accounts"
source-table = "SRC.accounts"
key = ["id"]
new-columns = "add"
columns = { id = "bigint", owner = "text" }
"#;

const ADDED: &str = "id, coalesce(owner, 'NULL'), coalesce(tier, 'NULL'), coalesce(\"order\"::text, 'NULL'), \
                     coalesce(amount::text, 'NULL'), coalesce(to_char(seen AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), 'NULL')";

fn added_rows(db: &Db) -> Vec<String> {
    db.column(&format!(
        "SELECT concat_ws(' | ', {ADDED}) FROM {{s}}.accounts ORDER BY id"
    ))
}

fn added_types(db: &Db) -> Vec<String> {
    db.column(
        "SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
         WHERE a.attrelid = '{s}.accounts'::regclass AND a.attnum > 0 AND NOT a.attisdropped \
         AND col_description(a.attrelid, a.attnum) IS NOT NULL ORDER BY a.attnum",
    )
}

/// `new-columns = "add"` with real Debezium (schemas on): while the pipeline runs, the source gets `ALTER TABLE
/// ADD COLUMN` of a text, a reserved-word integer (`"order"`), a numeric(10,2) and a timestamptz column; the
/// projection table gets each column with the Connect schema's type and the later rows carry the values; a
/// DROP COLUMN at the source keeps the stored value (absent is not NULL). A replay of the whole topic under
/// another group lands nothing, and a rebuild from the start into a fresh schema gives the same rows.
#[test]
fn new_columns_add_with_real_debezium() {
    let db = Db::fresh("r14add");
    let src = unique_name("r14src");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.accounts (id bigint PRIMARY KEY, owner text);
         INSERT INTO {src}.accounts VALUES (1, 'one')"
    ));
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{src}.accounts");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[("topic.prefix", &src), ("table.include.list", &table)],
        true,
    );
    let topic = connect.topic(&src, "accounts");
    let text = format!("{DEBEZIUM_HEADER}{}", ADD_PIPELINE.replace("SRC", &src));
    let group = unique("g");
    let wait_marker = |id: i64| {
        read_values(&topic, Duration::from_secs(120), |vs| {
            vs.iter().any(|v| v["payload"]["after"]["id"] == id)
        })
    };
    let run =
        |db: &Db, group: &str| run_caught_up(&pipeline(&text, &topic, group, &db.schema).path);

    db.execute(&format!("INSERT INTO {src}.accounts VALUES (2, 'two')"));
    wait_marker(2);
    run(&db, &group);
    assert_eq!(added_types(&db), Vec::<String>::new());
    // While the pipeline runs: columns added at the source, changes carrying them.
    let live = pipeline(&text, &topic, &group, &db.schema);
    let mut worker = spawn_run(&live, &[], "r14add");
    for stmt in [
        format!(
            "ALTER TABLE {src}.accounts ADD COLUMN tier text, ADD COLUMN \"order\" integer, \
             ADD COLUMN amount numeric(10,2), ADD COLUMN seen timestamptz"
        ),
        format!(
            "UPDATE {src}.accounts SET tier = 'gold', \"order\" = 5, amount = 12.34, \
             seen = '2024-01-02 03:04:05.123456+02' WHERE id = 1"
        ),
        format!("INSERT INTO {src}.accounts VALUES (3, 'three', NULL, -1, -0.50, NULL)"),
        format!("ALTER TABLE {src}.accounts DROP COLUMN tier"),
        format!("UPDATE {src}.accounts SET owner = 'one again' WHERE id = 1"),
        format!("INSERT INTO {src}.accounts (id, owner) VALUES (900, 'marker')"),
    ] {
        db.execute(&stmt);
    }
    wait_marker(900);
    let deadline = Instant::now() + Duration::from_secs(120);
    while db.i64("SELECT count(*) FROM {s}.accounts WHERE id = 900") == 0 {
        assert!(
            Instant::now() < deadline,
            "the running worker never landed the marker"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(terminate(&mut worker), Some(0));
    assert_eq!(
        added_types(&db),
        vec![
            "amount numeric",
            "order integer",
            "seen timestamp with time zone",
            "tier text"
        ],
        "added in the order of the change's members (by name)"
    );
    let want = vec![
        "1 | one again | gold | 5 | 12.34 | 2024-01-02 01:04:05.123456",
        "2 | two | NULL | NULL | NULL | NULL",
        "3 | three | NULL | -1 | -0.50 | NULL",
        "900 | marker | NULL | NULL | NULL | NULL",
    ];
    assert_eq!(added_rows(&db), want);
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    let again = run(&db, &unique("g2")).tally();
    assert_eq!((again.landed, again.quarantined), (0, 0));
    assert_eq!(added_rows(&db), want);
    let fresh = Db::fresh("r14add2");
    let rebuilt = run(&fresh, &unique("g3")).tally();
    assert_eq!(rebuilt.quarantined, 0);
    assert_eq!(added_rows(&fresh), want);
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}
