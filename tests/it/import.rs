//! `replaysafe import connector`: the JDBC sink connector configurations Debezium and Confluent document
//! (`tests/fixtures/connectors/`, sources in its README) → pipeline files `check` accepts, with their topics,
//! tables, keys, delete handling and encoding asserted; the ones that cannot make a pipeline refused naming each
//! key; and Debezium change events through an imported pipeline on the real broker and PostgreSQL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/connectors")
        .join(name)
}

/// `replaysafe import connector FILE -o DIR/pipeline.toml EXTRA…`: the output and the file's text (empty when
/// none was written).
fn import(file: &Path, dir: &Path, extra: &[&str]) -> (Out, String) {
    let out_path = dir.join("pipeline.toml");
    let mut args = vec!["import", "connector", arg(file), "-o", arg(&out_path)];
    args.extend_from_slice(extra);
    let out = replaysafe_with(&args, &[], Duration::from_secs(60));
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    (out, text)
}

/// A password file for the imported pipeline's `${REPLAYSAFE_DB_PASSWORD_FILE}` (trust authentication on the
/// test server: its content is not checked, only that check and run read it).
fn password_file(dir: &Path) -> PathBuf {
    let p = dir.join("db-password");
    std::fs::write(&p, "not-the-connectors-password\n").unwrap();
    p
}

/// `replaysafe check --config DIR/pipeline.toml` with the password files set, asserted to pass.
fn check_accepts(dir: &Path, envs: &[(&str, &str)]) -> Out {
    let out = replaysafe_with(
        &["check", "--config", arg(&dir.join("pipeline.toml"))],
        envs,
        Duration::from_secs(60),
    );
    out.assert_ok();
    assert!(out.stdout.contains(": valid"), "{}", out.stdout);
    out
}

/// Every line of `text` that sets a key (comments left out).
fn settings(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(" = "))
        .collect()
}

fn assert_sets(text: &str, want: &[&str]) {
    let got = settings(text);
    for w in want {
        assert!(
            got.contains(w),
            "`{w}` not among the settings:\n{}",
            got.join("\n")
        );
    }
}

#[test]
fn debeziums_documented_jdbc_sink_becomes_a_pipeline_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let (out, text) = import(&fixture("debezium-jdbc-docs.json"), dir.path(), &[]);
    out.assert_ok();
    assert_sets(
        &text,
        &[
            "group-id = \"replaysafe-jdbc-connector\"",
            "topics = [\"orders\"]",
            "start = \"earliest\"",
            "format = \"debezium\"",
            "encoding = \"json\"",
            "url = \"postgresql://pguser@localhost/db\"",
            "password-file = \"${REPLAYSAFE_DB_PASSWORD_FILE}\"",
            "schema = \"replica\"",
            "tolerance = \"none\"",
            "table = \"orders\"",
            "tombstones = \"table\"",
            "truncate = \"ignore\"",
            "new-columns = \"add\"",
        ],
    );
    // primary.key.mode = record_key without fields: the table's primary key, no `key` line.
    assert!(
        !settings(&text).iter().any(|l| l.starts_with("key = ")),
        "{text}"
    );
    assert!(
        !settings(&text)
            .iter()
            .any(|l| l.starts_with("source-table = ")),
        "topic `orders` names no source table"
    );
    let secret = "pgpassword";
    assert!(!text.contains(secret) && !out.stderr.contains(secret) && !out.stdout.contains(secret));
    // Each key not carried over is named on stderr and in the file.
    for key in [
        "`connection.password`",
        "`tasks.max`",
        "`value.converter`",
        "`errors.tolerance`",
    ] {
        assert!(out.stderr.contains(key), "{key} on stderr:\n{}", out.stderr);
        assert!(
            text.contains(&format!("# - {key}")),
            "{key} in the file:\n{text}"
        );
    }
    // Without the password file's variable check refuses, naming it; with it the file is valid.
    let refused = replaysafe_with(
        &["check", "--config", arg(&dir.path().join("pipeline.toml"))],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("REPLAYSAFE_DB_PASSWORD_FILE"),
        "{}",
        refused.stderr
    );
    let pw = password_file(dir.path());
    check_accepts(dir.path(), &[("REPLAYSAFE_DB_PASSWORD_FILE", arg(&pw))]);
}

#[test]
fn debeziums_example_of_confluents_sink_with_extract_new_record_state() {
    let dir = tempfile::tempdir().unwrap();
    let (out, text) = import(
        &fixture("debezium-examples-unwrap-smt-jdbc-sink.json"),
        dir.path(),
        &["--schema", "shadow"],
    );
    out.assert_ok();
    assert_sets(
        &text,
        &[
            "group-id = \"replaysafe-jdbc-sink\"",
            "topics = [\"customers\"]",
            "format = \"debezium\"",
            "encoding = \"json\"",
            "url = \"postgresql://postgresuser@postgres:5432/inventory\"",
            "password-file = \"${REPLAYSAFE_DB_PASSWORD_FILE}\"",
            "schema = \"shadow\"",
            "table = \"customers\"",
            "key = [\"id\"]",
            // drop.tombstones = false: the tombstone after a delete reaches the sink, delete.enabled deletes.
            "tombstones = \"table\"",
            "new-columns = \"ignore\"",
        ],
    );
    assert!(
        text.contains("#   CREATE TABLE shadow.customers (LIKE public.customers INCLUDING ALL);\n"),
        "{text}"
    );
    let secret = "postgrespw";
    assert!(!text.contains(secret) && !out.stderr.contains(secret));
    for key in ["`auto.create`", "`connection.url`", "`tasks.max`"] {
        assert!(out.stderr.contains(key), "{key}:\n{}", out.stderr);
    }
    let pw = password_file(dir.path());
    check_accepts(dir.path(), &[("REPLAYSAFE_DB_PASSWORD_FILE", arg(&pw))]);
}

#[test]
fn the_cdc_benchs_peer_connector_becomes_the_benchs_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let (out, text) = import(&fixture("bench-cdc-peer.json"), dir.path(), &[]);
    out.assert_ok();
    assert_sets(
        &text,
        &[
            "topics = [\"bench.cdc.1796135978.json-schema\"]",
            "start = \"earliest\"",
            "url = \"postgresql://postgres@localhost:5432/postgres\"",
            "table = \"accounts\"",
            "key = [\"id\"]",
            "tombstones = \"table\"",
            "new-columns = \"ignore\"",
            "encoding = \"json\"",
        ],
    );
    // An empty password: no password file.
    assert!(!text.contains("password-file"), "{text}");
    assert!(text.contains("#   CREATE TABLE replica.accounts (LIKE benchcdc_1796135978_peer.accounts INCLUDING ALL);\n"), "{text}");
    assert!(
        out.stderr.contains("`connection.provider`"),
        "{}",
        out.stderr
    );
    check_accepts(dir.path(), &[]);
}

#[test]
fn confluents_quick_start_is_refused_naming_each_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture("confluent-sink-quickstart-sqlite.properties");
    let (out, text) = import(&file, dir.path(), &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        text.is_empty() && !dir.path().join("pipeline.toml").exists(),
        "nothing written"
    );
    let f = arg(&file);
    for want in [
        format!("{f}: `transforms` (not set): no io.debezium.transforms.ExtractNewRecordState"),
        format!("{f}: `pk.mode` (not set): none (the default)"),
        format!("{f}:11:1: `connection.url`: a `jdbc:sqlite:` URL: replaysafe writes to PostgreSQL only"),
    ] {
        assert!(out.stderr.contains(&want), "{want}\nin:\n{}", out.stderr);
    }
    assert!(
        out.stderr
            .contains("3 settings cannot make a replaysafe pipeline"),
        "{}",
        out.stderr
    );
}

#[test]
fn confluents_postgresql_sink_of_plain_rows_is_refused_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = import(
        &fixture("confluent-playground-postgresql-sink.json"),
        dir.path(),
        &[],
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("`transforms` (not set)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("`pk.mode` (not set)"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("`connection.url`"),
        "a PostgreSQL URL is usable: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("password=postgres"), "{}", out.stderr);
}

#[test]
fn routes_patterns_registry_soft_deletes_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sink.json");
    let config = json!({
        "name": "everything",
        "config": {
            "connector.class": "io.confluent.connect.jdbc.JdbcSinkConnector",
            "topics.regex": "pg\\.sales\\..*",
            "connection.url": "jdbc:postgresql://db1:5432,db2:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem&currentSchema=mirror",
            "connection.user": "writer",
            "connection.password": "${directory:/run/secrets:pg-password}",
            "transforms": "unwrap,route",
            "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
            "transforms.unwrap.delete.tombstone.handling.mode": "rewrite",
            "transforms.unwrap.add.fields": "op,source.ts_ms",
            "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.route.regex": "pg\\.([^.]+)\\.([^.]+)",
            "transforms.route.replacement": "$2",
            "key.converter": "io.confluent.connect.avro.AvroConverter",
            "value.converter": "io.confluent.connect.avro.AvroConverter",
            "key.converter.schema.registry.url": "http://registry:8081",
            "value.converter.schema.registry.url": "http://registry:8081",
            "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": "sr:registry-secret",
            "pk.mode": "record_key",
            "insert.mode": "upsert",
            "delete.enabled": "true",
            "auto.evolve": "true",
            "errors.tolerance": "all",
            "errors.deadletterqueue.topic.name": "dlq-everything",
            "errors.log.enable": "true",
            "db.timezone": "Europe/Paris",
            "batch.size": "3000"
        }
    });
    std::fs::write(&file, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    // topics.regex without --topic: refused, naming the key and what to do.
    let (out, _) = import(&file, dir.path(), &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("`topics.regex`") && out.stderr.contains("--topic"),
        "{}",
        out.stderr
    );
    // A --topic the pattern does not match: refused too.
    let (out, _) = import(&file, dir.path(), &["--topic", "pg.billing.invoices"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("`pg.billing.invoices` does not match"),
        "{}",
        out.stderr
    );
    let (out, text) = import(
        &file,
        dir.path(),
        &["--topic", "pg.sales.orders", "--topic", "pg.sales.lines"],
    );
    out.assert_ok();
    assert_sets(
        &text,
        &[
            "topics = [\"pg.sales.orders\", \"pg.sales.lines\"]",
            "encoding = \"avro\"",
            "schema-registry = { url = \"http://registry:8081\", username = \"sr\", password-file = \"${REPLAYSAFE_REGISTRY_PASSWORD_FILE}\" }",
            "url = \"postgresql://writer@db1:5432,db2:5432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem\"",
            "password-file = \"/run/secrets/pg-password\"",
            "tolerance = \"all\"",
            // The RegexRouter's tables, each from its source table.
            "table = \"orders\"",
            "source-table = \"sales.orders\"",
            "table = \"lines\"",
            "source-table = \"sales.lines\"",
            // rewrite: the row stays, flagged — replaysafe keeps it with _deleted_at.
            "tombstones = \"column\"",
            "new-columns = \"add\"",
        ],
    );
    assert!(
        text.contains("#   CREATE TABLE replica.orders (LIKE mirror.orders INCLUDING ALL); ALTER TABLE replica.orders DROP COLUMN __op, DROP COLUMN __source_ts_ms, DROP COLUMN __deleted;\n"),
        "{text}"
    );
    assert!(!text.contains("registry-secret") && !out.stderr.contains("registry-secret"));
    for key in [
        "`errors.deadletterqueue.topic.name`",
        "`errors.log.enable`",
        "`db.timezone`",
        "`batch.size`",
        "`transforms.unwrap.add.fields`",
        "`topics.regex`",
        "`value.converter.basic.auth.user.info`",
    ] {
        assert!(out.stderr.contains(key), "{key}:\n{}", out.stderr);
    }
    let rpw = dir.path().join("registry-password");
    std::fs::write(&rpw, "x\n").unwrap();
    // `/run/secrets/pg-password` and `/etc/ca.pem` do not exist here (check reads both): ones that do, for check.
    let pipeline = dir.path().join("pipeline.toml");
    let pw = password_file(dir.path());
    std::fs::write(
        &pipeline,
        text.replace("/run/secrets/pg-password", arg(&pw))
            .replace("sslrootcert=%2Fetc%2Fca.pem", "sslrootcert=system"),
    )
    .unwrap();
    check_accepts(
        dir.path(),
        &[("REPLAYSAFE_REGISTRY_PASSWORD_FILE", arg(&rpw))],
    );
    // The output file exists now: refused, left as it is.
    let (again, _) = import(&file, dir.path(), &["--topic", "pg.sales.orders"]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(again.stderr.contains("exists"), "{}", again.stderr);
}

/// `DATABASE_URL` (`postgresql://user[:pw]@host:port/db?…`) as the connector's `connection.url` and user.
fn jdbc_of_database_url() -> (String, String) {
    let url = database_url();
    let rest = url.split_once("://").unwrap().1;
    let (userinfo, hostpart) = rest.rsplit_once('@').unwrap_or(("postgres", rest));
    let user = userinfo.split(':').next().unwrap().to_string();
    (format!("jdbc:postgresql://{hostpart}"), user)
}

#[test]
fn debezium_changes_through_the_imported_pipeline_land_as_the_sink_would_write_them() {
    let db = Db::fresh("import_e2e");
    let name = unique("jdbcsink");
    // Debezium's topic naming (<topic.prefix>.<schema>.<table>): the import reads the source table from it.
    let topic = format!("{name}.public.orders");
    create_topic(&topic, 2, &[]);
    // Debezium's documented connector, pointed at this test's topic and database.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("debezium-jdbc-docs.json")).unwrap())
            .unwrap();
    let (jdbc, user) = jdbc_of_database_url();
    config["name"] = json!(name);
    config["config"]["topics"] = json!(topic);
    config["config"]["connection.url"] = json!(jdbc);
    config["config"]["connection.username"] = json!(user);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let (out, text) = import(&file, dir.path(), &["--schema", db.schema.as_str()]);
    out.assert_ok();
    let table = format!("{}_public_orders", name.replace('.', "_"));
    assert_sets(
        &text,
        &[
            &format!("table = \"{table}\""),
            "source-table = \"public.orders\"",
            "tombstones = \"table\"",
        ],
    );
    // The connector's table, as its auto-create would have made it; the replica's copy of it.
    db.execute(&format!(
        "CREATE TABLE {{s}}.\"{table}\" (id bigint PRIMARY KEY, status text, amount numeric(10,2))"
    ));
    let pw = password_file(dir.path());
    let envs = [("REPLAYSAFE_DB_PASSWORD_FILE", arg(&pw))];
    let o =
        |id: i64, status: &str, amount: &str| json!({"id": id, "status": status, "amount": amount});
    let part = |id: i64| (id % 2) as i32;
    let changes = vec![
        envelope(
            part(1),
            "orders",
            "c",
            Some(1),
            Value::Null,
            o(1, "new", "10.00"),
            100,
        ),
        envelope(
            part(2),
            "orders",
            "c",
            Some(2),
            Value::Null,
            o(2, "new", "20.00"),
            200,
        ),
        envelope(
            part(1),
            "orders",
            "u",
            Some(1),
            Value::Null,
            o(1, "paid", "10.00"),
            300,
        ),
        envelope(
            part(2),
            "orders",
            "d",
            Some(2),
            o(2, "new", "20.00"),
            Value::Null,
            400,
        ),
        // The Kafka tombstone Debezium writes after a delete.
        Rec {
            partition: part(2),
            key: Some(br#"{"id":2}"#.to_vec()),
            value: None,
            timestamp_ms: None,
        },
        envelope(
            part(3),
            "orders",
            "c",
            Some(3),
            Value::Null,
            o(3, "new", "30.00"),
            500,
        ),
        // The update of 1 delivered again (a redelivery after a crash).
        envelope(
            part(1),
            "orders",
            "u",
            Some(1),
            Value::Null,
            o(1, "paid", "10.00"),
            300,
        ),
        // A change of 1 older than the one applied, delivered last: a JDBC sink's upsert (no version predicate)
        // would leave the row `pending`.
        envelope(
            part(1),
            "orders",
            "u",
            Some(1),
            Value::Null,
            o(1, "pending", "10.00"),
            250,
        ),
    ];
    produce(&topic, &changes);
    let p = dir.path().join("pipeline.toml");
    let first = replaysafe_with(
        &["run", "--config", arg(&p), "--until-caught-up"],
        &envs,
        Duration::from_secs(120),
    );
    first.assert_ok();
    let t = first.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered),
        (8, 5, 1, 1),
        "{}",
        first.stdout
    );
    assert_eq!(first.stale(), 1, "the late older change: {}", first.stdout);
    let rows = |db: &Db| {
        db.query(
            &format!("SELECT id, status, amount::text FROM {{s}}.\"{table}\" ORDER BY id"),
            &[],
        )
        .iter()
        .map(|r| {
            (
                r.get::<_, i64>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
            )
        })
        .collect::<Vec<_>>()
    };
    let want = vec![
        (1, "paid".to_string(), "10.00".to_string()),
        (3, "new".to_string(), "30.00".to_string()),
    ];
    assert_eq!(rows(&db), want);
    assert_eq!(
        db.column::<i64>(&format!(
            "SELECT id FROM {{s}}.\"{table}_tombstones\" ORDER BY id"
        )),
        vec![2]
    );
    // The whole topic produced again (a republished topic, a resnapshot's copies): nothing changes.
    produce(&topic, &changes);
    let again = replaysafe_with(
        &["run", "--config", arg(&p), "--until-caught-up"],
        &envs,
        Duration::from_secs(120),
    );
    again.assert_ok();
    let t = again.tally();
    assert_eq!((t.consumed, t.landed), (8, 0), "{}", again.stdout);
    assert_eq!(rows(&db), want);
    assert_eq!(
        db.column::<i64>(&format!(
            "SELECT id FROM {{s}}.\"{table}_tombstones\" ORDER BY id"
        )),
        vec![2]
    );
    assert_eq!(
        db.checkpoint(&format!("replaysafe-{name}"), &topic, 1),
        Some(10),
        "partition 1's next offset"
    );
}
