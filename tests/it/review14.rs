//! Issue 14 break-it and newcomer pass on the schema registry and schema evolution: hostile frames (an Avro
//! datum whose declared length would allocate gigabytes), the registry failing mid-run behind a proxy the test
//! controls (retried, never dead-lettered), and `new-columns = "add"` with real Debezium (ALTER TABLE ADD COLUMN
//! while the pipeline runs, a reserved-word column, a dropped column kept, a replay from the start).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::connect::{drop_slot, read_values, unique_name, Connect};
use crate::registry::{
    avro_source, dead_letters, frame, order_avro, orders, register, registry_url, ORDER_AVRO,
};

/// Avro's zig-zag varint of `n` (a long, a length, a block count).
fn varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// A frame of a few bytes whose Avro body declares a map of 500 million entries (or a 400 MB string) must be
/// quarantined as `schema-registry`, never make the process reserve gigabytes (the Avro decoder reserves the
/// declared count before reading an entry: without a bound the worker aborts on the failed allocation). The good
/// record after it lands; the accounting adds up; a replay under another group adds no second dead letter.
#[test]
fn avro_declared_lengths_cannot_allocate_beyond_the_record() {
    let db = Db::fresh("r14bomb");
    let topic = new_topic("r14bomb", 1);
    let bomb_schema = r#"{"type":"record","name":"Bomb","namespace":"r14","fields":[
        {"name":"m","type":{"type":"map","values":"long"}},{"name":"s","type":"string"}]}"#;
    let bomb = register(&format!("{topic}-bomb"), "AVRO", bomb_schema);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    let mut string_bomb = varint(0); // an empty map, then a string of 400 MB that is not there
    string_bomb.extend(varint(400_000_000));
    let rec = |value: Vec<u8>| Rec {
        partition: 0,
        key: Some(b"o-1".to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    produce(
        &topic,
        &[
            rec(frame(bomb, &varint(500_000_000))),
            rec(frame(bomb, &string_bomb)),
            rec(frame(id, &placed)),
        ],
    );
    let group = unique("g");
    let p = orders(&topic, &group, &db, &avro_source(&registry_url()));
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (3, 1, 0, 0, 2)
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 2, "{dl:?}");
    for (i, (offset, reason, detail, _)) in dl.iter().enumerate() {
        assert_eq!((*offset, reason.as_str()), (i as i64, "schema-registry"));
        assert!(
            detail.contains(&format!("schema id {bomb}"))
                && detail.contains("does not match its schema"),
            "{detail}"
        );
    }
    assert_eq!(
        db.text("SELECT status FROM {s}.orders WHERE order_id = 'o-1'"),
        Some("PLACED".to_string())
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    let again = run_caught_up(&orders(&topic, &unique("g2"), &db, &avro_source(&registry_url())).path);
    let a = again.tally();
    assert_eq!((a.landed, a.duplicate, a.quarantined), (0, 1, 2));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"), 2);
}

/// A one-request-per-connection HTTP proxy to the registry that the test controls: the first `ok_first`
/// requests are forwarded, then every request fails (alternately HTTP 503 and a connection closed without an
/// answer) for `down` after the first failure, then requests are forwarded again. Returns its base URL and the
/// count of failed requests.
fn flaky_registry(ok_first: u32, down: Duration) -> (String, Arc<AtomicU32>) {
    let upstream = registry_url();
    let rest = upstream.trim_start_matches("http://");
    let (hostport, path) = rest.split_once('/').expect("registry URL with a path");
    let hostport = hostport.to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let failed = Arc::new(AtomicU32::new(0));
    let f = failed.clone();
    std::thread::spawn(move || {
        let mut served = 0u32;
        let mut down_since: Option<Instant> = None;
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let head = read_head(&mut c);
            let is_down = served >= ok_first && down_since.is_none_or(|t| t.elapsed() < down);
            if is_down {
                down_since.get_or_insert_with(Instant::now);
                let n = f.fetch_add(1, Ordering::SeqCst);
                if n % 2 == 0 {
                    let _ = c.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndown",
                    );
                }
                continue;
            }
            served += 1;
            forward(&hostport, &head, &mut c);
        }
    });
    (format!("http://127.0.0.1:{port}/{path}"), failed)
}

/// The request head (up to the blank line); GETs carry no body.
fn read_head(c: &mut TcpStream) -> String {
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match c.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `head` upstream with `Connection: close` and copies the answer back.
fn forward(hostport: &str, head: &str, c: &mut TcpStream) {
    let Ok(mut up) = TcpStream::connect(hostport) else {
        return;
    };
    let mut lines: Vec<&str> = head
        .lines()
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    let req = format!("{}\r\n\r\n", lines.join("\r\n"));
    if up.write_all(req.as_bytes()).is_ok() {
        up.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        let _ = up.read_to_end(&mut answer);
        let _ = c.write_all(&answer);
    }
}

/// The registry fails mid-run (HTTP 503 and dropped connections for 3 s, after the first schema was fetched):
/// the record whose schema id is new waits on the registry, retried with backoff within `--connect-timeout`, and
/// lands when the registry answers again — no dead letter, every record landed, the checkpoint at the end.
#[test]
fn registry_failing_mid_run_is_retried_not_dead_lettered() {
    let db = Db::fresh("r14flaky");
    let topic = new_topic("r14flaky", 2);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let v2 = ORDER_AVRO.replacen(r#""name":"OrderEvent","#, r#""name":"OrderEvent","doc":"v2","#, 1);
    let id2 = register(&format!("{topic}-value"), "AVRO", &v2);
    assert_ne!(id, id2, "a second schema id");
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let rec = |partition: i32, key: &str, value: Vec<u8>| Rec {
        partition,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value),
        timestamp_ms: None,
    };
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    let shipped = order_avro(&schema, 2, "OrderShipped", "o-1", 2, None, None);
    let other = order_avro(&schema, 3, "OrderPlaced", "o-2", 1, Some("c-2"), None);
    produce(
        &topic,
        &[
            rec(0, "o-1", frame(id, &placed)),
            rec(0, "o-1", frame(id2, &shipped)),
            rec(1, "o-2", frame(id2, &other)),
        ],
    );
    let (url, failed) = flaky_registry(1, Duration::from_secs(3));
    let group = unique("g");
    let p = orders(&topic, &group, &db, &avro_source(&url));
    let config = p.path.to_str().unwrap().to_string();
    let out = replaysafe_with(
        &["run", "--config", &config, "--until-caught-up", "--connect-timeout", "60"],
        &[],
        Duration::from_secs(180),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(failed.load(Ordering::SeqCst) >= 2, "the registry failed");
    assert!(
        out.stderr.contains("schema registry unavailable, retrying"),
        "{}",
        out.stderr
    );
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (3, 3, 0));
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert_eq!(
        db.column::<String>("SELECT order_id || ' ' || status FROM {s}.orders ORDER BY order_id"),
        vec!["o-1 SHIPPED".to_string(), "o-2 PLACED".to_string()]
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(1));
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
    let run = |db: &Db, group: &str| run_caught_up(&pipeline(&text, &topic, group, &db.schema).path);

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
        assert!(Instant::now() < deadline, "the running worker never landed the marker");
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
