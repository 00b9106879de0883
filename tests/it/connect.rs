//! A real Debezium source for tests: one Kafka Connect standalone worker with the Debezium 3.6.1.Final
//! PostgreSQL connector, started by `scripts/connect-start` and stopped by `scripts/connect-stop`.
//!
//! The worker writes to `KAFKA_BROKERS` and reads the database of `DATABASE_URL` (both passed through from the
//! environment, as `scripts/test` sets them). Its topics are `<topic.prefix>.<schema>.<table>`,
//! `<topic.prefix>.message` and `__debezium-heartbeat.<topic.prefix>`; it creates them itself.
//! Everything about a worker lives in its instance directory: `connector.properties`, `worker.properties`,
//! `offsets.dat` (delete it while stopped to re-snapshot), `logs/connect.log`.
//!
//! The replication slot and the publication outlive the worker (a restart resumes from them): drop them at
//! the end of a test with [`drop_slot`] (it waits for the slot to go inactive).
//!
//! ```ignore
//! let dir = tempfile::tempdir().unwrap();
//! let name = connect::unique_name("dbz");
//! let mut c = connect::Connect::start(&dir.path().join(&name), &[
//!     ("topic.prefix", &name),
//!     ("table.include.list", "myschema.items"),
//! ], false);
//! // ... DML, then consume `{name}.myschema.items` ...
//! c.stop();
//! connect::drop_slot(&c.slot, &c.publication);
//! ```

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{consumer, pg_client, runtime, unique};

/// A running (or stopped) Connect worker with its one Debezium connector.
pub struct Connect {
    /// The instance directory (config, offsets, logs).
    pub instance: PathBuf,
    /// The worker's process id, while running.
    pub pid: Option<u32>,
    /// REST base URL, `http://127.0.0.1:PORT` (a new port on each start).
    pub url: String,
    /// The effective connector configuration values (last value of each key wins, as in Java).
    pub name: String,
    pub slot: String,
    pub publication: String,
    pub topic_prefix: String,
    /// The arguments to start it again with [`Connect::restart`].
    props: Vec<(String, String)>,
    env: Vec<(String, String)>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Connect {
    /// Starts a worker for `instance` (created if missing) with the connector options `props` on top of
    /// `scripts/connect-start`'s defaults (pgoutput, filtered publication, snapshot.mode=initial,
    /// decimal.handling.mode=precise, binary.handling.mode=bytes, skipped.operations=none, name, slot and
    /// publication `dbz_<instance dir name>`, topic.prefix `dbzkit`). Returns once the task is RUNNING and
    /// streaming (initial snapshot done). Panics with the script's output when it fails.
    pub fn start(instance: &Path, props: &[(&str, &str)], schemas_enable: bool) -> Connect {
        Connect::start_with_env(
            instance,
            props,
            &[(
                "CONNECT_SCHEMAS_ENABLE",
                if schemas_enable { "true" } else { "false" },
            )],
        )
    }

    /// [`Connect::start`] with any of connect-start's environment variables: `CONNECT_SCHEMAS_ENABLE`,
    /// `CONNECT_DECIMAL_FORMAT` (BASE64|NUMERIC), `CONNECT_WAIT_FOR` (streaming|running),
    /// `CONNECT_START_WAIT`, `CONNECT_OFFSET_FLUSH_MS`, `CONNECT_HEAP_OPTS`.
    pub fn start_with_env(
        instance: &Path,
        props: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Connect {
        let mut c = Connect {
            instance: instance.to_path_buf(),
            pid: None,
            url: String::new(),
            name: String::new(),
            slot: String::new(),
            publication: String::new(),
            topic_prefix: String::new(),
            props: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        c.launch();
        c
    }

    fn launch(&mut self) {
        assert!(
            self.pid.is_none(),
            "worker for {} already running",
            self.instance.display()
        );
        std::fs::create_dir_all(&self.instance).unwrap();
        let mut cmd = Command::new(repo_root().join("scripts/connect-start"));
        cmd.arg(&self.instance);
        for (k, v) in &self.props {
            cmd.arg(format!("{k}={v}"));
        }
        // Bounded, with room for a loaded 2-core CI machine (a snapshot logs one line per table of the whole
        // database; the script's default is 120 s).
        cmd.env("CONNECT_START_WAIT", "300");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let t0 = Instant::now();
        let out = cmd.output().expect("run scripts/connect-start");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            panic!(
                "scripts/connect-start {} failed ({}):\n{stdout}\n{}",
                self.instance.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in stdout.lines() {
            if let Some(p) = line.strip_prefix("CONNECT_PID=") {
                self.pid = Some(p.trim().parse().expect("CONNECT_PID"));
            } else if let Some(u) = line.strip_prefix("CONNECT_URL=") {
                self.url = u.trim().to_string();
            }
        }
        assert!(
            self.pid.is_some() && !self.url.is_empty(),
            "connect-start printed no pid/url:\n{stdout}"
        );
        let props = read_properties(&self.instance.join("connector.properties"));
        let get = |k: &str| {
            props
                .iter()
                .rev()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        self.name = get("name");
        self.slot = get("slot.name");
        self.publication = get("publication.name");
        self.topic_prefix = get("topic.prefix");
        eprintln!(
            "connect: {} started in {:.1}s (pid {}, {}, log {})",
            self.name,
            t0.elapsed().as_secs_f64(),
            self.pid.unwrap(),
            self.url,
            self.log_path().display()
        );
    }

    /// Stops the worker gracefully (offsets flushed, slot released) and waits for it to exit. Idempotent.
    pub fn stop(&mut self) {
        if self.pid.take().is_none() {
            return;
        }
        let out = Command::new(repo_root().join("scripts/connect-stop"))
            .arg(&self.instance)
            .output()
            .expect("run scripts/connect-stop");
        if !out.status.success() {
            panic!(
                "scripts/connect-stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Starts the stopped worker again with the same options (a new REST port). With the offsets file
    /// kept it resumes streaming from its last offset; after [`Connect::reset_offsets`] it re-snapshots.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The source offsets file of the FileOffsetBackingStore.
    pub fn offsets_file(&self) -> PathBuf {
        self.instance.join("offsets.dat")
    }

    /// Deletes the offsets file (the worker must be stopped): the next start takes a new snapshot
    /// (snapshot.mode=initial) and then streams from the existing slot.
    pub fn reset_offsets(&self) {
        assert!(
            self.pid.is_none(),
            "stop the worker before deleting its offsets"
        );
        match std::fs::remove_file(self.offsets_file()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", self.offsets_file().display()),
        }
    }

    /// The worker's log (log4j2).
    pub fn log_path(&self) -> PathBuf {
        self.instance.join("logs/connect.log")
    }

    /// The last `n` lines of the worker's log, for assertion messages.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Row topic of a table: `<topic.prefix>.<schema>.<table>`.
    pub fn topic(&self, schema: &str, table: &str) -> String {
        format!("{}.{schema}.{table}", self.topic_prefix)
    }

    /// `GET /connectors/<name>/status` as JSON, or None when the REST API does not answer.
    pub fn status(&self) -> Option<serde_json::Value> {
        self.pid?;
        let body = http_get(&self.url, &format!("/connectors/{}/status", self.name)).ok()?;
        serde_json::from_str(&body).ok()
    }

    /// The connector's and its tasks' states (`RUNNING`, `FAILED`, `PAUSED`, `UNASSIGNED`...).
    pub fn states(&self) -> Option<(String, Vec<String>)> {
        let s = self.status()?;
        let conn = s["connector"]["state"].as_str()?.to_string();
        let tasks = s["tasks"]
            .as_array()?
            .iter()
            .filter_map(|t| t["state"].as_str().map(str::to_string))
            .collect();
        Some((conn, tasks))
    }

    /// Waits until the connector and all its (>= 1) tasks are RUNNING; panics on FAILED (with the task's
    /// trace and the log's tail) or after `timeout`.
    pub fn wait_running(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(s) = self.status() {
                let conn = s["connector"]["state"].as_str().unwrap_or("?");
                let tasks: Vec<&str> = s["tasks"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|t| t["state"].as_str().unwrap_or("?"))
                            .collect()
                    })
                    .unwrap_or_default();
                if conn == "FAILED" || tasks.contains(&"FAILED") {
                    panic!(
                        "connector {} FAILED: {s}\n--- log ---\n{}",
                        self.name,
                        self.log_tail(60)
                    );
                }
                if conn == "RUNNING" && !tasks.is_empty() && tasks.iter().all(|t| *t == "RUNNING") {
                    return;
                }
                last = Some(s);
            }
            if Instant::now() > deadline {
                panic!(
                    "connector {} not RUNNING after {timeout:?} (last status {last:?})\n--- log ---\n{}",
                    self.name,
                    self.log_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        if self.pid.is_some() {
            let _ = Command::new(repo_root().join("scripts/connect-stop"))
                .arg(&self.instance)
                .output();
            self.pid = None;
        }
    }
}

/// A name usable as a slot, publication, connector name and topic prefix: `prefix_<pid>_<n>_<ms>`,
/// lowercase `[a-z0-9_]`, at most 63 characters (PostgreSQL's NAMEDATALEN - 1).
pub fn unique_name(prefix: &str) -> String {
    let p: String = prefix
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut s = unique(&p);
    s.truncate(63);
    s
}

/// A runtime and a client on DATABASE_URL (the connection task runs on the runtime).
fn db() -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let rt = runtime();
    let client = pg_client(&rt);
    (rt, client)
}

/// Whether the replication slot exists and a walsender is streaming from it: Some(active) / None.
pub fn slot_active(slot: &str) -> Option<bool> {
    let (rt, c) = db();
    rt.block_on(async {
        c.query_opt(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, bool>(0))
    })
}

/// Waits until the slot exists and no walsender holds it (a stopped worker's connection can take a moment
/// to go away); panics after `timeout`.
pub fn wait_slot_inactive(slot: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while slot_active(slot) != Some(false) {
        assert!(
            Instant::now() < deadline,
            "slot {slot} not inactive after {timeout:?}: {:?}",
            slot_active(slot)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Drops the connector's replication slot (waiting up to 15 s for it to become inactive after the worker
/// stopped, then terminating the walsender still holding it) and its publication (`DROP PUBLICATION IF
/// EXISTS`). Missing ones are fine. SQL equivalent: `SELECT pg_drop_replication_slot('<slot>')` once
/// `pg_replication_slots.active` is false; `DROP PUBLICATION <publication>`.
pub fn drop_slot(slot: &str, publication: &str) {
    let (rt, c) = db();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let row = c
                .query_opt(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .unwrap();
            let Some(row) = row else { break };
            match row.get::<_, Option<i32>>(0) {
                None => match c
                    .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                    .await
                {
                    Ok(_) => break,
                    // Became active again (or was dropped) between the two statements: look again.
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("connect: drop slot {slot}: {e}; retrying");
                    }
                    Err(e) => panic!("drop replication slot {slot}: {e}"),
                },
                Some(pid) if Instant::now() > deadline => {
                    c.execute("SELECT pg_terminate_backend($1)", &[&pid])
                        .await
                        .unwrap();
                }
                Some(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !publication.is_empty() {
            c.batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS \"{}\"",
                publication.replace('"', "\"\"")
            ))
            .await
            .unwrap();
        }
    })
}

/// `key=value` lines of a Java properties file (no continuation lines or escapes beyond `\\`), in order.
fn read_properties(path: &Path) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .filter_map(|l| {
            let i = l.find(['=', ':'])?;
            Some((
                l[..i].trim().to_string(),
                l[i + 1..].trim().replace("\\\\", "\\"),
            ))
        })
        .collect()
}

/// A plain HTTP/1.0 GET on the loopback REST API; the body on a 2xx answer.
fn http_get(base: &str, path: &str) -> std::io::Result<String> {
    let hostport = base
        .strip_prefix("http://")
        .unwrap_or(base)
        .trim_end_matches('/');
    let mut s = TcpStream::connect(hostport)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {hostport}\r\nAccept: application/json\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let code = head.split_whitespace().nth(1).unwrap_or("");
    if !code.starts_with('2') {
        return Err(std::io::Error::other(format!("GET {path}: {head}")));
    }
    Ok(body.to_string())
}

/// Reads `topic` (partition 0) from the beginning until `done` holds for the values read so far (JSON
/// values; a tombstone is `Value::Null`) or `timeout` passes; returns them.
pub fn read_values(
    topic: &str,
    timeout: Duration,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let group = unique_name("connect_read");
    let c = consumer(&[("group.id", &group), ("enable.auto.commit", "false")]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while !done(&out) {
        assert!(
            Instant::now() < deadline,
            "{topic}: condition not met after {timeout:?}; read {out:?}"
        );
        match c.poll(Duration::from_millis(500)) {
            // The topic does not exist until the connector's first record: keep polling.
            None | Some(Err(_)) => {}
            Some(Ok(m)) => out.push(match m.payload() {
                None => serde_json::Value::Null,
                Some(b) => serde_json::from_slice(b).unwrap(),
            }),
        }
    }
    out
}

/// The kit end to end: snapshot, a streamed insert, a stop and restart from the offsets, a re-snapshot
/// after deleting them. Starts a real worker (about 15 s a start): run with `--ignored`.
#[test]
#[ignore = "starts a real Kafka Connect worker (scripts/connect-start, needs maven and java 17)"]
fn connect_kit_smoke() {
    let name = unique_name("dbzsmoke");
    let (rt, db) = db();
    rt.block_on(db.batch_execute(&format!(
        "CREATE SCHEMA {name}; CREATE TABLE {name}.items (id bigint PRIMARY KEY, amount numeric(12,2));
         INSERT INTO {name}.items VALUES (1, 1.50)"
    )))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{name}.items");
    let mut c = Connect::start(
        &dir.path().join(&name),
        &[("topic.prefix", &name), ("table.include.list", &table)],
        false,
    );
    assert_eq!(
        (c.slot.as_str(), c.topic_prefix.as_str()),
        (format!("dbz_{name}").as_str(), name.as_str())
    );
    c.wait_running(Duration::from_secs(5));
    assert_eq!(slot_active(&c.slot), Some(true));
    let topic = c.topic(&name, "items");
    let ops = |vs: &[serde_json::Value]| {
        vs.iter()
            .map(|v| v["op"].as_str().unwrap_or("-").to_string())
            .collect::<Vec<_>>()
    };

    rt.block_on(db.batch_execute(&format!("INSERT INTO {name}.items VALUES (2, 2.00)")))
        .unwrap();
    let vs = read_values(&topic, Duration::from_secs(60), |vs| vs.len() >= 2);
    assert_eq!(ops(&vs), ["r", "c"]);
    assert_eq!(vs[1]["after"]["id"], 2);

    // Restart with the offsets: no new snapshot; streaming resumes after the last event.
    c.stop();
    wait_slot_inactive(&c.slot, Duration::from_secs(10));
    rt.block_on(db.batch_execute(&format!("UPDATE {name}.items SET amount = 3 WHERE id = 2")))
        .unwrap();
    c.restart();
    let vs = read_values(&topic, Duration::from_secs(60), |vs| vs.len() >= 3);
    assert_eq!(ops(&vs), ["r", "c", "u"]);

    // Restart without them: a new snapshot of both rows.
    c.stop();
    c.reset_offsets();
    c.restart();
    let vs = read_values(&topic, Duration::from_secs(60), |vs| vs.len() >= 5);
    assert_eq!(ops(&vs), ["r", "c", "u", "r", "r"]);

    c.stop();
    drop_slot(&c.slot, &c.publication);
    assert_eq!(slot_active(&c.slot), None);
    rt.block_on(db.batch_execute(&format!("DROP SCHEMA {name} CASCADE")))
        .unwrap();
}
