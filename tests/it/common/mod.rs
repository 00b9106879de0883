//! Test harness: the real Kafka broker (`KAFKA_BROKERS`) and PostgreSQL (`DATABASE_URL`) that `scripts/test`
//! starts, a fresh topic, group and schema per test, and the `replaysafe` binary run as a subprocess.

#![allow(dead_code)]

mod cli;
mod envelopes;
mod headers;

pub use cli::*;
pub use envelopes::*;
pub use headers::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres::{NoTls, Row};

/// The broker and database every test uses.
pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").expect(
        "KAFKA_BROKERS is not set: run the tests through scripts/test, which starts a real Kafka broker and PostgreSQL",
    )
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run the tests through scripts/test")
}

/// A single-threaded tokio runtime for one blocking helper call.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An admin client on the test broker.
pub fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap()
}

/// A consumer on the test broker with the given extra settings (`group.id` …); it joins no group by itself.
pub fn consumer(settings: &[(&str, &str)]) -> BaseConsumer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers());
    for (k, v) in settings {
        c.set(*k, *v);
    }
    c.create().unwrap()
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this test process and call: `prefix_<pid>_<n>_<ms>`.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 100_000_000;
    format!("{prefix}_{}_{n}_{ms}", std::process::id())
}

/// A reproducible pseudo-random sequence from `seed` (a 64-bit LCG): each call `next(m)` gives a number in
/// `0..m`.
pub fn seeded_random(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut s = seed;
    move |m: u64| {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (s >> 33) % m
    }
}

/// A test's own schema on the shared PostgreSQL, with a runtime to drive tokio-postgres synchronously.
pub struct Db {
    pub rt: tokio::runtime::Runtime,
    pub client: tokio_postgres::Client,
    pub schema: String,
}

impl Db {
    /// Creates a fresh schema named after the test.
    pub fn fresh(prefix: &str) -> Db {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let schema = unique(prefix).to_lowercase();
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
                .await
                .expect("connect to DATABASE_URL");
            tokio::spawn(conn);
            client
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
                ))
                .await
                .unwrap();
            client
        });
        Db { rt, client, schema }
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema));
        self.rt
            .block_on(self.client.query(&sql, params))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub fn execute(&self, sql: &str) {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema));
        self.rt
            .block_on(self.client.batch_execute(&sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A single bigint (cast in SQL with `::bigint`).
    pub fn i64(&self, sql: &str) -> i64 {
        self.query(sql, &[])[0].get(0)
    }

    /// A single text (cast in SQL with `::text`), or None.
    pub fn text(&self, sql: &str) -> Option<String> {
        self.query(sql, &[]).first().and_then(|r| r.get(0))
    }

    /// The first column of every row, in the query's order.
    pub fn column<T: FromSqlOwned>(&self, sql: &str) -> Vec<T> {
        self.query(sql, &[]).iter().map(|r| r.get(0)).collect()
    }

    /// The first column of every row as text (cast in SQL with `::text`), in the query's order.
    pub fn strings(&self, sql: &str) -> Vec<String> {
        self.column(sql)
    }

    /// `next_offset` of a checkpoint.
    pub fn checkpoint(&self, group: &str, topic: &str, partition: i32) -> Option<i64> {
        self.query(
            "SELECT next_offset FROM {s}.replaysafe_checkpoints WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
            &[&group, &topic, &partition],
        )
        .first()
        .and_then(|r| r.get(0))
    }
}

/// Creates a topic on the test broker. Retention is off (`retention.ms=-1`) unless `configs` says otherwise:
/// the cases carry 2024 timestamps, which the broker's default 7-day retention would delete at once.
pub fn create_topic(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let rt = runtime();
    let admin = admin();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    if !configs.iter().any(|(k, _)| *k == "retention.ms") {
        topic = topic.set("retention.ms", "-1");
    }
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let res = rt
        .block_on(admin.create_topics([&topic], &AdminOptions::new()))
        .unwrap();
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
}

/// A fresh schema and a fresh topic of `partitions` partitions (no retention), both named after `prefix`.
pub fn stage(prefix: &str, partitions: i32) -> (Db, String) {
    let db = Db::fresh(prefix);
    (db, new_topic(prefix, partitions))
}

/// A fresh topic of `partitions` partitions (no retention) named after `prefix`.
pub fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = unique(prefix);
    create_topic(&topic, partitions, &[]);
    topic
}

/// One record to produce.
#[derive(Clone, Debug)]
pub struct Rec {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

impl Rec {
    pub fn json(partition: i32, key: &str, value: &str, ts: i64) -> Rec {
        Rec {
            partition,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            timestamp_ms: Some(ts),
        }
    }
}

/// A producer on the test broker that batches for `linger_ms`.
fn producer(linger_ms: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("message.max.bytes", "4194304")
        .set("linger.ms", linger_ms)
        .create()
        .unwrap()
}

/// The rdkafka record of `r` for `topic`.
fn future_record<'a>(topic: &'a str, r: &'a Rec) -> FutureRecord<'a, [u8], [u8]> {
    let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(r.partition);
    if let Some(k) = &r.key {
        fr = fr.key(k.as_slice());
    }
    if let Some(v) = &r.value {
        fr = fr.payload(v.as_slice());
    }
    if let Some(ts) = r.timestamp_ms {
        fr = fr.timestamp(ts);
    }
    fr
}

/// Produces records in order (each acknowledged before the next) and returns their offsets.
pub fn produce(topic: &str, records: &[Rec]) -> Vec<i64> {
    let rt = runtime();
    let producer = producer("5");
    rt.block_on(async {
        let mut offsets = Vec::new();
        for chunk in records.chunks(2000) {
            let futs = chunk
                .iter()
                .map(|r| producer.send(future_record(topic, r), Duration::from_secs(30)));
            // Sends are queued in order on one producer with idempotence defaults: order within a partition holds.
            for r in futures::future::join_all(futs).await {
                let delivery = r.unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
                offsets.push(delivery.offset);
            }
        }
        offsets
    })
}

/// Produces each record in a record batch of its own (each acknowledged before the next is sent): with a
/// pipeline's small `max.partition.fetch.bytes`, every fetch then brings a few records of *each* partition.
pub fn produce_singly(topic: &str, records: &[Rec]) {
    let rt = runtime();
    let producer = producer("0");
    rt.block_on(async {
        for r in records {
            producer
                .send(future_record(topic, r), Duration::from_secs(30))
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        }
    });
}

/// The consumer group's committed offsets (next offset to read) per partition, without joining the group.
pub fn committed(group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c = consumer(&[("group.id", group)]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(20)).unwrap();
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// A pipeline file in a temp dir. `{topic}`, `{group}`, `{schema}` are substituted.
pub struct Pipeline {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// `pipeline(text, …)` run with `run --until-caught-up`, asserted successful.
pub fn run_text(text: &str, topic: &str, group: &str, db: &Db) -> Out {
    run_caught_up(&pipeline(text, topic, group, &db.schema).path)
}

pub fn pipeline(text: &str, topic: &str, group: &str, schema: &str) -> Pipeline {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipeline.toml");
    let text = text
        .replace("{topic}", topic)
        .replace("{group}", group)
        .replace("{schema}", schema);
    std::fs::write(&path, text).unwrap();
    Pipeline { dir, path }
}

/// Output of a finished `replaysafe` process.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The last `consumed …` line of stdout (the accounting line), if any.
    pub fn tally_line(&self) -> Option<&str> {
        self.stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("consumed "))
    }

    /// The final `consumed N = landed a + duplicate b + filtered c + quarantined d` line.
    pub fn tally(&self) -> Tally {
        let line = self.tally_line().unwrap_or_else(|| {
            panic!(
                "no tally line in stdout:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        });
        let head = line.split(" [").next().unwrap_or(line);
        let num = |label: &str| -> u64 {
            head.replace(" = ", " + ")
                .split(" + ")
                .filter_map(|part| part.trim().strip_prefix(label))
                .filter_map(|rest| rest.trim().parse().ok())
                .next()
                .unwrap_or(0)
        };
        let consumed = head
            .strip_prefix("consumed ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        let t = Tally {
            consumed,
            landed: num("landed "),
            duplicate: num("duplicate "),
            filtered: num("filtered "),
            quarantined: num("quarantined "),
        };
        let stale = num("stale ");
        assert_eq!(
            t.landed + t.duplicate + stale + t.filtered + t.quarantined,
            t.consumed,
            "the tally adds up: {line}"
        );
        t
    }

    /// The `stale N` part of the tally line (0 when absent).
    pub fn stale(&self) -> u64 {
        let line = self.tally_line().unwrap_or("");
        line.split(" + ")
            .filter_map(|p| p.strip_prefix("stale "))
            .filter_map(|n| n.trim().parse().ok())
            .next()
            .unwrap_or(0)
    }

    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "replaysafe failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Tally {
    pub consumed: u64,
    pub landed: u64,
    pub duplicate: u64,
    pub filtered: u64,
    pub quarantined: u64,
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_replaysafe")
}

fn command(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("KAFKA_BROKERS", brokers())
        .env("DATABASE_URL", database_url())
        .env("REPLAYSAFE_LOG", "info");
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

/// Runs `replaysafe` to completion (killed after `limit`).
pub fn replaysafe_with(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Out {
    let mut child = command(args, envs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out_h = read_pipe(child.stdout.take().unwrap());
    let err_h = read_pipe(child.stderr.take().unwrap());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Out {
        code: status.and_then(|s| s.code()),
        stdout: out_h.join().unwrap(),
        stderr: err_h.join().unwrap(),
    };
    if status.is_none() {
        panic!(
            "replaysafe {args:?} did not finish in {limit:?}\nstdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
    }
    out
}

pub fn replaysafe(args: &[&str]) -> Out {
    replaysafe_with(args, &[], Duration::from_secs(120))
}

/// `replaysafe run --config P --until-caught-up`, asserted successful.
pub fn run_caught_up(p: &Path) -> Out {
    let out = try_run(p);
    out.assert_ok();
    out
}

fn read_pipe<R: std::io::Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Starts a long-running `replaysafe` (stdout/stderr to files in `dir`).
pub fn spawn(args: &[&str], envs: &[(&str, &str)], dir: &Path, name: &str) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    command(args, envs).stdout(out).stderr(err).spawn().unwrap()
}

/// Polls `cond` every 100 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends SIGTERM and waits for the exit code.
pub fn terminate(child: &mut Child) -> Option<i32> {
    unsafe_kill(child.id(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(
            Instant::now() < deadline,
            "replaysafe did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends a signal with the `kill` command (no libc dependency in tests).
pub fn unsafe_kill(pid: u32, signal: &str) {
    // The process may already have exited; that is fine for every caller.
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// Advances a partition's log start offset (the admin DeleteRecords call): real retention loss.
pub fn delete_records_before(topic: &str, partition: i32, offset: i64) {
    let rt = runtime();
    let admin = admin();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    rt.block_on(admin.delete_records(&tpl, &AdminOptions::new()))
        .unwrap();
}

/// Deletes a topic and waits until the broker no longer lists it.
pub fn delete_topic(name: &str) {
    let rt = runtime();
    let admin = admin();
    rt.block_on(admin.delete_topics(&[name], &AdminOptions::new()))
        .unwrap();
    let c = consumer(&[]);
    wait_until(Duration::from_secs(60), "topic deletion", || {
        let md = c
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .unwrap();
        md.topics()
            .first()
            .is_none_or(|t| t.error().is_some() || t.partitions().is_empty())
    });
    std::thread::sleep(Duration::from_secs(1));
}

/// Raises a topic's partition count to `total` (the admin CreatePartitions call) and waits until the broker's
/// metadata shows them.
pub fn add_partitions(topic: &str, total: usize) {
    let rt = runtime();
    let admin = admin();
    let res = rt
        .block_on(admin.create_partitions(
            [&rdkafka::admin::NewPartitions::new(topic, total)],
            &AdminOptions::new(),
        ))
        .unwrap();
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("create partitions of {t}: {e}"));
    }
    let c = consumer(&[]);
    wait_until(
        Duration::from_secs(30),
        "new partitions in metadata",
        || {
            let md = c
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .unwrap();
            md.topics()
                .first()
                .is_some_and(|t| t.partitions().len() == total)
        },
    );
}
