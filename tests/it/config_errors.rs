//! Bad pipeline files: exit code 2 with `file:line:column`, nothing consumed.

use crate::common::*;

const GOOD: &str = r#"[kafka]
group-id = "g"
topics = ["t"]

[fields]
event_id = { path = "/event_id", type = "uuid" }

[identity]
key = ["event_id"]
"#;

/// `GOOD` for the test's group (followed by `after_group`, e.g. a start), topic and schema.
fn good_for_the_test(after_group: &str) -> String {
    GOOD.replace(
        "group-id = \"g\"",
        &format!("group-id = \"{{group}}\"{after_group}"),
    )
    .replace("[\"t\"]", "[\"{topic}\"]")
        + "\n[postgres]\nschema = \"{schema}\"\n"
}

fn check(text: &str) -> (Out, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = replaysafe(&["check", "--config", path.to_str().unwrap()]);
    (out, path.display().to_string())
}

#[test]
fn good_file_passes_check_and_prints_the_four_answers() {
    let (out, _) = check(GOOD);
    out.assert_ok();
    for answer in [
        "1. What identifies a change",
        "2. What orders",
        "3. What commits atomically",
        "4. How long",
    ] {
        assert!(out.stdout.contains(answer), "{}", out.stdout);
    }
}

fn assert_error(text: &str, line: usize, needle: &str) {
    let (out, path) = check(text);
    assert_eq!(
        out.code,
        Some(2),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    let loc = format!("{path}:{line}:");
    assert!(
        out.stderr.contains(&loc),
        "expected {loc} in: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains(needle),
        "expected `{needle}` in: {}",
        out.stderr
    );
}

#[test]
fn unknown_key_names_file_and_line() {
    assert_error(
        &GOOD.replace("topics = [\"t\"]", "topics = [\"t\"]\ngroup = \"x\""),
        4,
        "unknown field `group`",
    );
}

#[test]
fn bad_pointer_names_file_and_line() {
    assert_error(
        &GOOD.replace("\"/event_id\"", "\"event_id\""),
        6,
        "JSON pointer",
    );
}

#[test]
fn bad_type_names_file_and_line() {
    assert_error(
        &GOOD.replace("type = \"uuid\"", "type = \"guid\""),
        6,
        "unknown type `guid`",
    );
}

#[test]
fn sql_injection_in_a_table_name_is_refused() {
    let text = format!(
        "{GOOD}\n[[projection]]\nkind = \"counter\"\ntable = 'x\"; DROP TABLE users; --'\ngroup-by = [\"event_id\"]\n"
    );
    assert_error(&text, 13, "not a valid SQL identifier");
}

#[test]
fn unknown_field_in_a_filter_is_refused() {
    let text = format!("{GOOD}\n[[filter]]\nname = \"refunds\"\ndrop-if = \"amount < 0\"\n");
    assert_error(&text, 13, "not a declared field");
}

#[test]
fn run_with_bad_config_exits_2_before_consuming() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, GOOD.replace("[identity]", "[identity]\nbogus = 1")).unwrap();
    let out = try_run(&path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
}

#[test]
fn schema_mismatch_exits_2_before_consuming() {
    // A ledger created with a text key, then a pipeline whose key is a uuid.
    let db = Db::fresh("mismatch");
    db.execute("CREATE TABLE {s}.replaysafe_ledger (generation text NOT NULL DEFAULT '', event_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, consumer_group text NOT NULL, landed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (generation, event_id))");
    let topic = new_topic("mismatch", 1);
    let text = good_for_the_test("\nstart = \"earliest\"");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("event_id") && out.stderr.contains("uuid"),
        "{}",
        out.stderr
    );
}

#[test]
fn new_group_without_start_exits_3_and_consumes_nothing() {
    let (db, topic) = stage("nostart", 1);
    produce(
        &topic,
        &[Rec::json(
            0,
            "k",
            r#"{"event_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301"}"#,
            1_714_003_200_000,
        )],
    );
    let text = good_for_the_test("");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("start = \\\"earliest\\\"")
            || out.stderr.contains("start = \"earliest\""),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
}

#[test]
fn epoch_unit_and_plausible_range_are_validated() {
    let with = |field: &str| GOOD.replace("[identity]", &format!("{field}\n\n[identity]"));
    assert_error(
        &with("at = { path = \"/at\", type = \"timestamptz\", unit = \"sec\" }"),
        8,
        "unknown unit `sec`: expected \"s\", \"ms\" or \"us\"",
    );
    assert_error(
        &with("n = { path = \"/n\", type = \"bigint\", unit = \"s\" }"),
        8,
        "`unit` only applies to `date` and `timestamptz` fields",
    );
    assert_error(
        &with("d = { path = \"/d\", type = \"date\", plausible-range = [\"2100-01-01\", \"1990-01-01\"] }"),
        8,
        "`plausible-range` must be two dates, first ≤ last",
    );
    assert_error(
        &with(
            "d = { path = \"/d\", type = \"date\", plausible-range = [\"1990\", \"2100-01-01\"] }",
        ),
        8,
        "`1990` is not a date (YYYY-MM-DD)",
    );
    let (ok, _) = check(&with(
        "at = { path = \"/at\", type = \"timestamptz\", unit = \"s\", plausible-range = [\"2000-01-01\", \"2040-12-31\"] }",
    ));
    ok.assert_ok();
}

/// `replaysafe check … | head`: stdout's reader is gone before anything is printed (the pipe's read end is
/// closed before the process starts). The write fails with EPIPE; that must end the process quietly with exit
/// 0, not a panic with a backtrace hint.
#[test]
fn check_into_a_closed_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.toml");
    std::fs::write(&path, GOOD).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(bin())
        .args(["check", "--config", path.to_str().unwrap()])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// Without a database URL (none in the file, no DATABASE_URL) `check` still reads `[postgres] password-file`: a
/// missing or empty file is named (exit 2), a readable one is reported without its content.
#[test]
fn check_without_a_url_reads_the_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pg-password");
    let path = dir.path().join("p.toml");
    let check = |pw: &std::path::Path| {
        let text = format!("{GOOD}\n[postgres]\npassword-file = \"{}\"\n", pw.display());
        std::fs::write(&path, text).unwrap();
        std::process::Command::new(bin())
            .args(["check", "--config", path.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    };
    let out = check(&pw);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot read [postgres] password-file {}",
            pw.display()
        )),
        "{stderr}"
    );
    std::fs::write(&pw, "\nsecret\n").unwrap();
    let out = check(&pw);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is empty (its first line is the password)"),
        "{stderr}"
    );
    std::fs::write(&pw, "s3cret-value\n").unwrap();
    let out = check(&pw);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("password from password-file {}", pw.display())),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cret-value"), "{stdout}");
}

/// Issue 35.5: a projection table named like one of replaysafe's own (a bookkeeping table, the ledger, a ledger
/// day partition, its key type) is refused by `check` with `file:line`, before anything is created.
#[test]
fn a_projection_table_named_like_replaysafes_own_is_refused() {
    let db = Db::fresh("owntab");
    let base = concat!(
        header!(),
        r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/customer_id", type = "text" }

[identity]
key = ["event_id"]
partition-by = "day"

[[projection]]
kind = "counter"
table = "TABLE"
group-by = ["day", "customer_id"]
column = "n"
"#
    );
    for (table, what) in [
        ("replaysafe_checkpoints", "one of replaysafe's own tables"),
        ("replaysafe_ledger", "the ledger"),
        (
            "replaysafe_ledger_p20240425",
            "a day partition of the ledger",
        ),
        ("replaysafe_ledger_key", "the ledger's key type"),
        (
            "{schema}.replaysafe_dead_letters",
            "one of replaysafe's own tables",
        ),
    ] {
        let p = pipeline(&base.replace("TABLE", table), "t", "g", &db.schema);
        let out = replaysafe(&["check", "--config", arg(&p.path)]);
        assert_eq!(out.code, Some(2), "{table}: {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains(what) && out.stderr.contains("pipeline.toml:"),
            "{table}: {}",
            out.stderr
        );
    }
    // Another schema's table of that name is not replaysafe's.
    let p = pipeline(
        &base.replace("TABLE", "other.replaysafe_checkpoints"),
        "t",
        "g",
        &db.schema,
    );
    let out = replaysafe(&["check", "--config", arg(&p.path)]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let made: i64 = db.query(
        "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1",
        &[&db.schema],
    )[0]
    .get(0);
    assert_eq!(made, 0, "check creates nothing");
}
