//! Test harness: the real Kafka broker (`KAFKA_BROKERS`) and PostgreSQL (`DATABASE_URL`) that `scripts/test`
//! starts, a fresh topic, group and schema per test, and the `replaysafe` binary run as a subprocess.

#![allow(dead_code)]

mod cli;
mod envelopes;
mod headers;
mod kafka;
mod pooler;
mod process;
mod scrape;

pub use cli::*;
pub use envelopes::*;
pub use headers::*;
pub use kafka::*;
pub use pooler::*;
pub use process::*;
pub use scrape::*;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres::{NoTls, Row};

/// The Kafka bootstrap servers every test uses (`KAFKA_BROKERS`).
pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").expect(
        "KAFKA_BROKERS is not set: run the tests through scripts/test, which starts a real Kafka broker and PostgreSQL",
    )
}

/// The PostgreSQL URL every test uses (`DATABASE_URL`).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run the tests through scripts/test")
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

/// A test that cannot run against the services given says so: on stderr (shown with `--nocapture`) and, when
/// `scripts/test` sets `REPLAYSAFE_TEST_SKIPS`, as a line of that file, which `scripts/test` prints at the end
/// (a test that returns early passes in cargo's count).
pub fn skipped(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Some(path) = std::env::var_os("REPLAYSAFE_TEST_SKIPS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// A client on `DATABASE_URL` whose connection task runs on `rt`.
pub fn pg_client(rt: &tokio::runtime::Runtime) -> tokio_postgres::Client {
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
            .await
            .expect("connect to DATABASE_URL");
        tokio::spawn(conn);
        client
    })
}

/// A test's own schema on the shared PostgreSQL, with a runtime to drive tokio-postgres synchronously.
pub struct Db {
    pub rt: tokio::runtime::Runtime,
    pub client: tokio_postgres::Client,
    pub schema: String,
    /// Whether this handle made the schema (and drops it at the end of a passing test); `false` for a second
    /// handle on another test's schema.
    pub owns: bool,
}

impl Drop for Db {
    /// A passing test's schema is dropped; a failing (panicking) test's stays for a look. The test cluster is
    /// shared by every run on the machine: left behind, 10,000 schemas made each Debezium snapshot log a line
    /// per table until Connect's log rolled and `scripts/connect-start` missed "Starting streaming". Bounded by
    /// `lock_timeout` (a process still holding the schema's locks leaves it behind), errors ignored.
    fn drop(&mut self) {
        if !self.owns || std::thread::panicking() || tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let sql = format!(
            "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema
        );
        let _ = self.rt.block_on(self.client.batch_execute(&sql));
    }
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
        let client = pg_client(&rt);
        rt.block_on(client.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        )))
        .unwrap();
        Db {
            rt,
            client,
            schema,
            owns: true,
        }
    }

    /// Runs `sql` with `{s}` replaced by the quoted schema; panics naming the statement on error.
    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema));
        self.rt
            .block_on(self.client.query(&sql, params))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs `sql` (several statements allowed) with `{s}` replaced by the quoted schema.
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

/// A pipeline file in a temp dir. `{topic}`, `{group}`, `{schema}` are substituted.
pub struct Pipeline {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// `pipeline(text, …)` run with `run --until-caught-up`, asserted successful.
pub fn run_text(text: &str, topic: &str, group: &str, db: &Db) -> Out {
    run_caught_up(&pipeline(text, topic, group, &db.schema).path)
}

/// Writes `text` as a pipeline file with `{topic}`, `{group}` and `{schema}` filled in.
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
