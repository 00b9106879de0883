//! `replaysafe demo`: the seed scenario end to end, printed.
//!
//! Six days of purchase and refund events for a few customers (plus one malformed record) on
//! `shop.purchases`; the pipeline of `examples/demo.toml`; then
//! 1. a first run under group `daily-counts`;
//! 2. the whole topic replayed under a fresh group id;
//! 3. more events, and a crash between the database commit and the Kafka offset commit; a restart resumes
//!    from the checkpoint; then, to show the ledger as well, the checkpoint is deleted and the group restarts
//!    from Kafka's older committed offset, re-reading records that already landed.
//!
//! After each phase `daily_counts` is compared with counts computed from the generated events.
#![allow(
    clippy::disallowed_methods,
    reason = "the demo's clients of its own mock cluster (or --brokers), not of a pipeline"
)]

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Days, NaiveDate, Utc};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::{self, Pipeline};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::ops::run::{self, RunOptions};
use crate::sink::{self};

/// PostgreSQL used when `DATABASE_URL` is unset (what `scripts/pg-setup` prepares).
pub const DEFAULT_DATABASE_URL: &str =
    "postgresql://postgres@localhost:5432/postgres?sslmode=disable";
/// The demo pipeline file (also in `examples/demo.toml`).
pub const DEMO_PIPELINE: &str = include_str!("../examples/demo.toml");

const TOPIC: &str = "shop.purchases";
const PARTITIONS: i32 = 3;
const CUSTOMERS: [&str; 4] = ["c-ada", "c-bob", "c-cyd", "c-dee"];

/// One generated event.
struct Event {
    day: NaiveDate,
    customer: &'static str,
    json: String,
    ts_ms: i64,
}

fn events(n: usize, first_day: NaiveDate, days: usize, seed: u64) -> Vec<Event> {
    // A small deterministic generator (xorshift) so reruns print the same table.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let day = first_day.checked_add_days(Days::new((i * days / n.max(1)) as u64)).expect("a date within chrono's range");
            let customer = CUSTOMERS[crate::units::len(next() % CUSTOMERS.len() as u64)];
            let refund = next() % 10 == 0;
            let cents = crate::units::bigint(next() % 9_000 + 100);
            let amount = if refund { -cents } else { cents };
            let secs = crate::units::bigint(next() % 86_000);
            let ts = day.and_hms_opt(0, 0, 0).expect("00:00:00 is a time of every day").and_utc().timestamp() + secs;
            let occurred = chrono::DateTime::from_timestamp(ts, 0).expect("a timestamp within chrono's range").to_rfc3339();
            let id = uuid::Uuid::from_u64_pair(seed, i as u64);
            let json = format!(
                r#"{{"event_id":"{id}","event_type":"{}","customer_id":"{customer}","amount":"{}.{:02}","occurred_at":"{occurred}"}}"#,
                if refund { "refund" } else { "purchase" },
                amount / 100,
                (amount % 100).abs()
            );
            Event { day, customer, json, ts_ms: ts * 1000 }
        })
        .collect()
}

/// Counts failed deliveries (BaseProducer reports them only through this callback).
#[derive(Default)]
struct Deliveries {
    failed: std::sync::Mutex<Option<String>>,
}

impl rdkafka::ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .lock()
                .expect("lock: a thread panicked holding this lock")
                .get_or_insert_with(|| e.to_string());
        }
    }
}

fn produce(brokers: &str, topic: &str, events: &[Event], malformed: bool) -> Result<()> {
    let producer: BaseProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(Deliveries::default())?;
    for e in events {
        send(
            &producer,
            BaseRecord::to(topic)
                .key(e.customer)
                .payload(e.json.as_str())
                .timestamp(e.ts_ms),
        )?;
    }
    if malformed {
        let now = Utc::now().timestamp_millis();
        send(
            &producer,
            BaseRecord::to(topic)
                .key("c-ada")
                .payload("{\"event_id\": \"truncated")
                .timestamp(now),
        )?;
    }
    producer.flush(Duration::from_secs(30))?;
    if let Some(e) = producer
        .context()
        .failed
        .lock()
        .expect("lock: a thread panicked holding this lock")
        .take()
    {
        return Err(Error::Other(format!(
            "producing demo events to {topic}: {e}"
        )));
    }
    Ok(())
}

fn send<'a>(
    producer: &BaseProducer<Deliveries>,
    mut record: BaseRecord<'a, str, str>,
) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                producer.poll(Duration::from_millis(50));
                record = r;
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

fn create_topic(brokers: &str, topic: &str, rt: &tokio::runtime::Runtime) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topic = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
    let res = rt.block_on(admin.create_topics([&topic], &AdminOptions::new()))?;
    for r in res {
        if let Err((t, code)) = r {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                return Err(Error::Other(format!("creating topic {t}: {code}")));
            }
        }
    }
    Ok(())
}

fn expected(all: &[Event]) -> BTreeMap<(NaiveDate, String), i64> {
    let mut m = BTreeMap::new();
    for e in all {
        *m.entry((e.day, e.customer.to_string())).or_insert(0) += 1;
    }
    m
}

async fn counts(
    client: &tokio_postgres::Client,
    p: &Pipeline,
) -> Result<BTreeMap<(NaiveDate, String), i64>> {
    let rows = client
        .query(
            &format!(
                "SELECT day, customer_id, n FROM {}.daily_counts",
                p.postgres.schema
            ),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect())
}

fn committed(brokers: &str, topic: &str, group: &str) -> Result<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(got
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum())
}

/// Where `replaysafe demo` writes its log (the system's temporary directory, `replaysafe-demo-<pid>.log`: one
/// per run), so that the narrative on stdout is not interleaved with log lines.
pub fn log_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("replaysafe-demo-{}.log", std::process::id()))
}

/// The session-level advisory lock a demo holds on its database for its whole run (released when its connection
/// closes): a second demo on the same database would drop the first one's schema under it.
pub const LOCK_SQL: &str =
    "SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('replaysafe demo: ' || $1)::bigint)";

/// Runs the demo. `brokers`: a real cluster, or `None` for librdkafka's in-process mock cluster.
///
/// # Errors
/// Any error of the run; [`Error::Other`] when a phase's counts differ from the truth.
pub fn demo(brokers: Option<String>, database_url: &str, n: usize) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let run_id = Utc::now().timestamp_millis().unsigned_abs();
    let mock;
    // A real cluster keeps topics between runs: each demo run gets its own topic there.
    let (brokers, topic) = match brokers {
        Some(b) => {
            let topic = format!("{TOPIC}.demo-{run_id}");
            create_topic(&b, &topic, &rt)?;
            (b, topic)
        }
        None => {
            mock = MockCluster::new(1)?;
            mock.create_topic(TOPIC, PARTITIONS, 1)?;
            (mock.bootstrap_servers(), TOPIC.to_string())
        }
    };
    let parse = |group: &str| -> Result<Pipeline> {
        let mut p = config::parse("examples/demo.toml", DEMO_PIPELINE)?;
        p.kafka.group_id = group.to_string();
        p.kafka.topics = vec![topic.clone()];
        Ok(p)
    };
    let mut pipeline = parse("daily-counts")?;
    let base_group = format!("daily-counts-{run_id}");
    pipeline.kafka.group_id = base_group.clone();
    let schema = pipeline.postgres.schema.clone();
    let client = rt.block_on(async {
        let c = sink::connect(database_url).await?;
        let locked: bool = c.query_one(LOCK_SQL, &[&schema.as_str()]).await?.get(0);
        if !locked {
            return Err(Error::Usage(format!(
                "another `replaysafe demo` is running on this database (it holds the demo's lock on schema \
                 {schema}): wait for it to finish, or set DATABASE_URL to another database"
            )));
        }
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await?;
        Ok::<_, Error>(c)
    })?;
    let first_day = Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(6))
        .expect("a date within chrono's range");
    let mut all = events(n, first_day, 6, run_id);
    produce(&brokers, &topic, &all, true)?;
    println!(
        "replaysafe demo — {n} purchase/refund events over 6 days for {} customers (+1 malformed record) on {topic} \
         ({PARTITIONS} partitions, broker {brokers})\nlog: {}\n",
        CUSTOMERS.len(),
        log_path().display()
    );

    let opts = |crash: Option<u64>| RunOptions {
        give_up: None,
        brokers: brokers.clone(),
        database_url: database_url.to_string(),
        until_caught_up: true,
        shutdown: Arc::new(AtomicBool::new(false)),
        summary_interval: Duration::from_secs(3600),
        crash_after_batches: crash,
        extra_properties: vec![("session.timeout.ms".into(), "6000".into())],
        prune_interval: Duration::from_secs(3600),
        state: None,
    };
    let phase = |title: &str, group: &str, crash: Option<u64>, all: &[Event]| -> Result<Tally> {
        let p = parse(group)?;
        let started = Instant::now();
        let (tally, applying) = run::run_timed(rt.handle().clone(), Arc::new(p), opts(crash))?;
        let wall = started.elapsed();
        let got = rt.block_on(counts(&client, &pipeline))?;
        let want = expected(all);
        let ok = got == want;
        println!("── {title} (group {group})");
        println!("   {}", tally.line());
        println!("   {}", timing(tally.total(), applying, wall));
        println!(
            "   daily_counts {} the truth computed from the produced events",
            if ok { "==" } else { "!=" }
        );
        if !ok {
            print_table(&got, &want);
            return Err(Error::Other(format!(
                "{title}: daily_counts differ from the produced events"
            )));
        }
        Ok(tally)
    };

    phase("1. first run", &base_group, None, &all)?;
    print_table(&rt.block_on(counts(&client, &pipeline))?, &expected(&all));
    phase(
        "2. replay of the whole topic under a fresh group id",
        &format!("{base_group}-replay"),
        None,
        &all,
    )?;

    // Phases 3 and 4: new events, a crash after the database commit and before the Kafka commit, a restart.
    let checkpoint_sum = || -> Result<i64> {
        Ok(rt
            .block_on(client.query_one(
                &format!(
                    "SELECT coalesce(sum(next_offset), 0)::bigint FROM {schema}.replaysafe_checkpoints \
                     WHERE consumer_group = $1"
                ),
                &[&base_group],
            ))?
            .get(0))
    };
    for (round, title) in [
        (3, "restart: resumes from the checkpoint in PostgreSQL (nothing re-read)"),
        (4, "restart as a hand-made consumer would, from Kafka's committed offsets (checkpoint deleted): the re-read records are duplicates in the ledger"),
    ] {
        let more = events(n / 8, first_day.checked_add_days(Days::new(5)).expect("a date within chrono's range"), 1, run_id + round);
        produce(&brokers, &topic, &more, false)?;
        let (crash, _) = run::run_timed(rt.handle().clone(), Arc::new(parse(&base_group)?), opts(Some(1)))?;
        let kafka_sum = committed(&brokers, &topic, &base_group)?;
        let db_sum = checkpoint_sum()?;
        println!(
            "── {round}. {} new events; the process \"crashes\" after a database commit, before the Kafka offset commit",
            more.len()
        );
        println!("   {}", crash.line());
        println!(
            "   after the crash: PostgreSQL checkpoints (sum of next offsets) = {db_sum}, Kafka committed offsets = \
             {kafka_sum}: {} records applied but not acknowledged to Kafka",
            db_sum - kafka_sum
        );
        all.extend(more);
        if round == 4 {
            rt.block_on(client.execute(
                &format!("DELETE FROM {schema}.replaysafe_checkpoints WHERE consumer_group = $1"),
                &[&base_group],
            ))?;
        }
        phase(&format!("   {title}"), &base_group, None, &all)?;
    }
    println!("\nEvery phase ends with the same daily_counts as the produced events: replays were harmless.");
    Ok(())
}

/// "applied N records in X ms (R records/s); Y s with joining the consumer group": the rate counts the applying
/// time only (first record polled to last checkpoint commit), not the group join that dominates a small phase.
fn timing(records: u64, applying: Option<Duration>, wall: Duration) -> String {
    match applying {
        Some(d) => format!(
            "applied in {} ms ({:.0} records/s); {:.1} s in all, with joining the consumer group",
            d.as_millis(),
            records as f64 / d.as_secs_f64().max(1e-6),
            wall.as_secs_f64()
        ),
        None => format!(
            "nothing to apply; {:.1} s in all, with joining the consumer group",
            wall.as_secs_f64()
        ),
    }
}

fn print_table(
    got: &BTreeMap<(NaiveDate, String), i64>,
    want: &BTreeMap<(NaiveDate, String), i64>,
) {
    println!(
        "   {:<12} {:<8} {:>6} {:>9}",
        "day", "customer", "n", "expected"
    );
    let keys: std::collections::BTreeSet<_> = got.keys().chain(want.keys()).collect();
    for k in keys {
        println!(
            "   {:<12} {:<8} {:>6} {:>9}",
            k.0.to_string(),
            k.1,
            got.get(k).map_or("-".to_string(), |v| v.to_string()),
            want.get(k).map_or("-".to_string(), |v| v.to_string())
        );
    }
}
