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
    let again =
        run_caught_up(&orders(&topic, &unique("g2"), &db, &avro_source(&registry_url())).path);
    let a = again.tally();
    assert_eq!((a.landed, a.duplicate, a.quarantined), (0, 1, 2));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        2
    );
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
    let v2 = ORDER_AVRO.replacen(
        r#""name":"OrderEvent","#,
        r#""name":"OrderEvent","doc":"v2","#,
        1,
    );
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
        &[
            "run",
            "--config",
            &config,
            "--until-caught-up",
            "--connect-timeout",
            "60",
        ],
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

const EDGE_COLUMNS: &str =
    "id bigint PRIMARY KEY, ts timestamp(6), tz timestamptz, n numeric, d date, k int";
const EDGE_COMPARED: &str = "id, ts, tz, n, d, k";
const EDGE_SRC: &str = "id, ts, tz, CASE WHEN n = 'NaN' THEN NULL ELSE n END, d, k";

/// The Apicurio AvroConverter settings for keys and values (`scripts/connect-start` with the registry's jars).
fn avro_converters() -> Vec<(String, String)> {
    let v2 = registry_url().replace("/apis/ccompat/v7", "/apis/registry/v2");
    let mut props = Vec::new();
    for side in ["key", "value"] {
        let p = |k: &str, v: &str| (format!("{side}.converter{k}"), v.to_string());
        props.extend([
            p("", "io.apicurio.registry.utils.converter.AvroConverter"),
            p(".apicurio.registry.url", &v2),
            p(".apicurio.registry.auto-register", "true"),
            p(".apicurio.registry.find-latest", "true"),
            p(".apicurio.registry.as-confluent", "true"),
            p(".apicurio.registry.use-id", "contentId"),
            p(".apicurio.registry.headers.enabled", "false"),
        ]);
    }
    props
}

/// Real Debezium → Avro through the registry, values at the edges: timestamps before the epoch and at year 1,
/// `timestamptz` with offsets, `infinity`, numerics of changing scale, NaN, and `k` retyped int → text at the
/// source mid-stream (a new schema id) into a `text` column. Every row equals the source's; a replay lands 0.
#[test]
fn avro_edges_and_a_retype_with_real_debezium() {
    let lib = std::env::var("REGISTRY_CONVERTER_LIB").expect("REGISTRY_CONVERTER_LIB");
    let db = Db::fresh("r14edge");
    let src = unique_name("r14edge");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({EDGE_COLUMNS});
         CREATE TABLE {{s}}.items (id bigint PRIMARY KEY, ts timestamp(6), tz timestamptz, n numeric, d date, k text)"
    ));
    let mut props = avro_converters();
    props.push(("topic.prefix".into(), src.clone()));
    props.push(("table.include.list".into(), format!("{src}.items")));
    let refs: Vec<(&str, &str)> = props
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut connect = Connect::start_with_env(
        &dir.path().join(&src),
        &refs,
        &[("CONNECT_EXTRA_LIB", lib.as_str())],
    );
    let topic = connect.topic(&src, "items");
    for stmt in [
        format!("INSERT INTO {src}.items VALUES (1, '1969-12-31 23:59:59.999999', '1969-12-31 23:59:59.999999+05:30', -0.000001, '1969-12-31', 7)"),
        format!("INSERT INTO {src}.items VALUES (2, '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', 12345678901234567890.12345, '0001-01-01', -1)"),
        format!("INSERT INTO {src}.items VALUES (3, '2024-02-29 12:00:00.5', '2024-03-31 02:30:00-09:30', 1e-20, '2024-02-29', 0)"),
        format!("INSERT INTO {src}.items VALUES (4, 'infinity', '-infinity', 'NaN', 'infinity', NULL)"),
        format!("INSERT INTO {src}.items VALUES (5, '-infinity', 'infinity', 0, '-infinity', 5)"),
        format!("ALTER TABLE {src}.items ALTER COLUMN k TYPE text"),
        format!("UPDATE {src}.items SET k = 'seven', n = 1.50 WHERE id = 1"),
        format!("INSERT INTO {src}.items (id, k) VALUES (900, 'marker')"),
    ] {
        db.execute(&stmt);
    }
    read_values_raw_count(&topic, 7);
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"avro\"\nschema-registry = {{ url = \"{}\" }}\n[batch]\nlinger-ms = 10\n\
         [[projection]]\nkind = \"row\"\ntable = \"items\"\nsource-table = \"{src}.items\"\n",
        registry_url()
    );
    let out = run_caught_up(&pipeline(&text, &topic, &unique("g"), &db.schema).path);
    let dl = dead_letters(&db);
    // Compared as values (numeric 1.50 = 1.5: Debezium's VariableScaleDecimal drops trailing zeros); a NaN
    // numeric arrives as null (decimal.handling.mode=precise cannot carry it), so the source's NaN reads NULL.
    let srcq = format!("SELECT row({}) AS r FROM {src}.items", EDGE_SRC);
    let dstq = format!("SELECT row({EDGE_COMPARED}) AS r FROM {{s}}.items");
    let diff = db.column::<String>(&format!(
        "SELECT 'src ' || r::text FROM ({srcq} EXCEPT {dstq}) a UNION ALL SELECT 'dst ' || r::text FROM ({dstq} EXCEPT {srcq}) b"
    ));
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    assert!(dl.is_empty(), "{dl:?}\n{}", out.stdout);
    assert_eq!(diff, Vec::<String>::new());
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (7, 7, 0));
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 7, 0)
    );
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}

/// Waits (bounded) until `topic` partition 0 holds at least `n` records.
fn read_values_raw_count(topic: &str, n: i64) {
    use rdkafka::consumer::Consumer;
    let c = consumer(&[("group.id", &unique_name("wc"))]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((lo, hi)) = c.fetch_watermarks(topic, 0, Duration::from_secs(5)) {
            if hi - lo >= n {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{topic}: fewer than {n} records");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A newcomer's wrong registry URL (Apicurio's native `/apis/registry/v2`, the one the Connect converters take)
/// answers 404 for every id: that is the configuration's fault, not the records' — the run stops (exit 1)
/// naming the URL, no dead letter, the checkpoint before the record; with the right URL the rerun lands it.
#[test]
fn a_registry_url_that_is_not_the_confluent_api_stops_instead_of_dead_lettering() {
    let db = Db::fresh("r14url");
    let topic = new_topic("r14url", 1);
    let id = register(&format!("{topic}-value"), "AVRO", ORDER_AVRO);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    produce(
        &topic,
        &[Rec {
            partition: 0,
            key: Some(b"o-1".to_vec()),
            value: Some(frame(id, &placed)),
            timestamp_ms: None,
        }],
    );
    let group = unique("g");
    let wrong = registry_url().replace("/apis/ccompat/v7", "/apis/registry/v2");
    let out = try_run(&orders(&topic, &group, &db, &avro_source(&wrong)).path);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("does not serve the Confluent-compatible API")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert!(db.checkpoint(&group, &topic, 0).unwrap_or(0) == 0);
    let t = run_caught_up(&orders(&topic, &group, &db, &avro_source(&registry_url())).path).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (1, 1, 0));
    assert_eq!(
        db.text("SELECT status FROM {s}.orders WHERE order_id = 'o-1'"),
        Some("PLACED".to_string())
    );
}

/// A server that answers every request with HTTP 200 and an HTML page (a proxy's login page, a UI).
fn html_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            read_head(&mut c);
            let body = "<html><body>Sign in</body></html>";
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    format!("http://127.0.0.1:{port}/apis/ccompat/v7")
}

/// A registry URL that answers 200 with something other than the registry's JSON (an HTML page) is the
/// configuration's fault: the run stops (exit 1) naming it, no dead letter, the checkpoint before the record.
#[test]
fn a_registry_url_answering_html_stops_instead_of_dead_lettering() {
    let db = Db::fresh("r14html");
    let topic = new_topic("r14html", 1);
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO).unwrap();
    let placed = order_avro(&schema, 1, "OrderPlaced", "o-1", 1, Some("c-1"), None);
    produce(
        &topic,
        &[Rec {
            partition: 0,
            key: Some(b"o-1".to_vec()),
            value: Some(frame(1, &placed)),
            timestamp_ms: None,
        }],
    );
    let group = unique("g");
    let out = try_run(&orders(&topic, &group, &db, &avro_source(&html_server())).path);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("is not the Confluent-compatible API's (answer is not JSON")
            && out.stderr.contains("offset 0"),
        "{}",
        out.stderr
    );
    assert!(dead_letters(&db).is_empty(), "{:?}", dead_letters(&db));
    assert!(db.checkpoint(&group, &topic, 0).unwrap_or(0) == 0);
}

/// A schemaless Debezium change of `public.accounts`, as a JSON Schema converter writes it (the payload alone).
fn dbz_change(op: &str, before: serde_json::Value, after: serde_json::Value, lsn: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_760_000_000_000i64 + lsn,
        "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "accounts",
            "snapshot": "false", "txId": lsn / 10, "lsn": lsn, "ts_ms": 1_760_000_000_000i64 + lsn,
            "sequence": format!("[\"{}\",\"{lsn}\"]", lsn - 5)},
    }))
    .unwrap()
}

/// JSON Schema framed Debezium keys and values with nulls, over two partitions: an explicit null is a NULL, an
/// absent member keeps the stored value, a delete leaves a tombstone, the Kafka tombstone (null value) is
/// filtered; a key that is not framed is quarantined naming it; a replay under another group lands nothing.
#[test]
fn json_schema_debezium_values_with_nulls() {
    use serde_json::json;
    let db = Db::fresh("r14js");
    let topic = new_topic("r14js", 2);
    let id = register(
        &format!("{topic}-value"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
    );
    let kid = register(
        &format!("{topic}-key"),
        "JSON",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"id":{"type":"integer"}}}"#,
    );
    let rec = |partition: i32, key: i64, value: Option<Vec<u8>>| Rec {
        partition,
        key: Some(frame(kid, format!("{{\"id\":{key}}}").as_bytes())),
        value: value.map(|v| frame(id, &v)),
        timestamp_ms: None,
    };
    let null = serde_json::Value::Null;
    let mut plain_key = rec(
        1,
        9,
        Some(dbz_change(
            "c",
            null.clone(),
            json!({"id": 9, "owner": "n"}),
            400,
        )),
    );
    plain_key.key = Some(br#"{"id":9}"#.to_vec());
    produce(
        &topic,
        &[
            rec(
                0,
                1,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 1, "owner": null, "balance": "1.50"}),
                    100,
                )),
            ),
            rec(
                1,
                2,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 2, "owner": "two", "balance": null}),
                    110,
                )),
            ),
            rec(
                0,
                1,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 1, "owner": "one", "balance": "2.00"}),
                    200,
                )),
            ),
            rec(
                1,
                2,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 2, "owner": null, "balance": "3.00"}),
                    210,
                )),
            ),
            rec(
                0,
                1,
                Some(dbz_change(
                    "u",
                    null.clone(),
                    json!({"id": 1, "balance": null}),
                    300,
                )),
            ),
            rec(
                1,
                3,
                Some(dbz_change(
                    "c",
                    null.clone(),
                    json!({"id": 3, "owner": "three", "balance": "0.00"}),
                    310,
                )),
            ),
            rec(
                1,
                3,
                Some(dbz_change(
                    "d",
                    json!({"id": 3, "owner": null, "balance": null}),
                    null.clone(),
                    320,
                )),
            ),
            rec(1, 3, None),
            plain_key,
        ],
    );
    let text = format!(
        "{DEBEZIUM_HEADER}encoding = \"json-schema\"\nschema-registry = {{ url = \"{}\" }}\ndecimal-handling = \"string\"\n\
         [[projection]]\nkind = \"row\"\ntable = \"accounts\"\nsource-table = \"public.accounts\"\nkey = [\"id\"]\n\
         columns = {{ id = \"bigint\", owner = \"text\", balance = \"numeric(12,2)\" }}\n",
        registry_url()
    );
    let group = unique("g");
    let out = run_caught_up(&pipeline(&text, &topic, &group, &db.schema).path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (9, 7, 0, 1, 1),
        "{}",
        out.stdout
    );
    assert_eq!(
        db.column::<String>(
            "SELECT concat_ws(' | ', id, coalesce(owner, 'NULL'), coalesce(balance::text, 'NULL')) FROM {s}.accounts ORDER BY id"
        ),
        vec!["1 | one | NULL", "2 | NULL | 3.00"]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.accounts_tombstones WHERE id = 3"),
        1
    );
    let dl = dead_letters(&db);
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].1, "schema-registry");
    assert!(
        dl[0].2.contains("the key is not schema-registry framed"),
        "{dl:?}"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(6));
    let again = run_caught_up(&pipeline(&text, &topic, &unique("g2"), &db.schema).path).tally();
    assert_eq!(
        (again.landed, again.duplicate, again.quarantined),
        (0, 7, 1)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        1
    );
}
