//! `replaysafe outbox relay` and `run --relay`: publishes the rows of a `kind = "outbox"` table to Kafka with
//! the idempotent producer (docs/reference.md "Outbox relay").
//!
//! One *round* is one PostgreSQL transaction:
//! 1. lock, with `FOR UPDATE SKIP LOCKED`, up to `[outbox] batch-size` rows that are not yet published
//!    (`published_at IS NULL`) and are the oldest unpublished row of their message key (*heads*). Rows are
//!    picked by "not yet published", never by "id above the last one published": a row committed late with a
//!    lower id (two partitions' transactions committing out of id order, case C33) is picked by the next round.
//!    A row of a key whose older row another relay holds is not a head, so two relays never publish one key at
//!    once;
//! 2. lock the following unpublished rows of the same keys (id order, up to the batch size in all);
//! 3. publish: the keys in parallel, each key's rows one after the other, each sent only after the broker
//!    acknowledged the one before (an idempotent producer may still leave a gap when a message times out —
//!    librdkafka INTRODUCTION.md, "Idempotent Producer" — so a key never has two messages in flight); a failed
//!    send ends its key's part of the round;
//! 4. mark the acknowledged rows `published_at = now()` and commit. A crash between 3 and 4 leaves them
//!    unpublished: the next round publishes them again with the same `replaysafe-delivery` header (at least
//!    once; downstream deduplicates on the header).
//!
//! Every wait is bounded: `[outbox] ack-timeout-ms` per message (librdkafka `message.timeout.ms`), the
//! session's `lock_timeout`/`statement_timeout`, and the idle-in-transaction timeout above the ack timeout.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::ident::QualifiedName;
use crate::projection::outbox::tables;

/// The Kafka header holding an outbox row's `delivery_key` (the same for every publication of the row, across
/// replays, rebuilt topics and backfills): what downstream deduplicates on.
pub const DELIVERY_HEADER: &str = "replaysafe-delivery";
/// Counter: outbox rows published (acknowledged by the broker and marked).
pub const PUBLISHED_TOTAL: &str = "replaysafe_outbox_published_total";
/// Gauge: outbox rows not yet published.
pub const PENDING: &str = "replaysafe_outbox_pending";
/// Gauge: seconds since the oldest unpublished row was created (0 when none).
pub const OLDEST_PENDING_SECONDS: &str = "replaysafe_outbox_oldest_pending_seconds";
/// How often the pending gauges are refreshed.
const GAUGE_EVERY: Duration = Duration::from_secs(5);

/// Registers the relay's series at zero (called by `metrics_http::register`).
pub fn register_metrics() {
    metrics::counter!(PUBLISHED_TOTAL).absolute(0);
    metrics::gauge!(PENDING).set(0.0);
    metrics::gauge!(OLDEST_PENDING_SECONDS).set(0.0);
}

/// What a relay publishes and how.
#[derive(Clone)]
pub struct RelayOptions {
    /// `bootstrap.servers`, resolved.
    pub brokers: String,
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// The outbox table (`--outbox`: its name, or `schema.name`); `None`: the pipeline's only outbox.
    pub outbox: Option<String>,
    /// The topic (`--topic`); `None`: `[outbox] topic`.
    pub topic: Option<String>,
    /// Return once no unpublished row is left (a round published nothing and none is pending).
    pub until_empty: bool,
    /// Set to stop: the round in progress finishes (bounded by the ack timeout), then the relay returns.
    pub shutdown: Arc<AtomicBool>,
}

/// The outbox table and topic a relay works on, resolved from the pipeline and the options.
///
/// # Errors
/// [`Error::Usage`] when the pipeline has no outbox, several without `--outbox`, `--outbox` names none of
/// them, or no topic is given (or it is illegal or consumed by the pipeline).
pub fn target(
    p: &Pipeline,
    outbox: Option<&str>,
    topic: Option<&str>,
) -> Result<(QualifiedName, String)> {
    let all = tables(p);
    let names = || {
        all.iter()
            .map(|(_, t)| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let table = match outbox {
        None if all.len() == 1 => all[0].1.clone(),
        None if all.is_empty() => {
            return Err(Error::Usage(format!(
                "{}: no [[projection]] has kind = \"outbox\": nothing to relay",
                p.source.path
            )))
        }
        None => {
            return Err(Error::Usage(format!(
                "{}: several outbox tables ({}): choose one with --outbox (one relay per outbox)",
                p.source.path,
                names()
            )))
        }
        Some(o) => all
            .iter()
            .find(|(name, t)| {
                o == name
                    || o == t.name.as_str()
                    || o == format!("{}.{}", t.schema.as_str(), t.name.as_str())
            })
            .map(|(_, t)| t.clone())
            .ok_or_else(|| {
                Error::Usage(format!(
                    "--outbox {o}: not an outbox table of {} ({})",
                    p.source.path,
                    names()
                ))
            })?,
    };
    let topic = match (topic, &p.outbox.topic) {
        (Some(t), _) => {
            crate::config::outbox::check_topic(t, &p.kafka.topics)
                .map_err(|why| Error::Usage(format!("--topic: {why}")))?;
            t.to_string()
        }
        (None, Some(t)) => t.clone(),
        (None, None) => {
            return Err(Error::Usage(format!(
                "{}: no topic to relay to: set [outbox] topic or give --topic",
                p.source.path
            )))
        }
    };
    Ok((table, topic))
}

/// Refuses a topic the broker does not have (asked with a consumer's metadata request, which never creates it),
/// after waiting for the brokers to answer for at most `--connect-timeout`
/// ([`crate::source::kafka::reachable`]).
///
/// # Errors
/// [`Error::Usage`] naming the topic; [`Error::Connect`] naming the brokers and the cause when they do not answer
/// within `--connect-timeout`; [`Error::Kafka`] when the metadata request fails after that (10 s bound).
pub fn require_topic(p: &Pipeline, brokers: &str, topic: &str) -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let mut config = crate::source::kafka::consumer_config(p, brokers, &[]);
    config.remove("group.id");
    crate::source::kafka::reachable(&config, brokers, topic)?;
    let consumer: BaseConsumer = config.create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let brokers = crate::endpoint::mask_urls(brokers);
    let found = md
        .topics()
        .iter()
        .any(|x| x.name() == topic && x.error().is_none() && !x.partitions().is_empty());
    match found {
        true => Ok(()),
        false => Err(Error::Usage(format!(
            "the relay's topic `{topic}` does not exist on {brokers}: create it (its partition count decides \
             which partition each message key goes to)"
        ))),
    }
}

/// One outbox row as published.
struct Row {
    id: i64,
    delivery_key: String,
    message_key: Option<String>,
    payload: String,
}

/// A relay over one outbox table.
pub struct Relay {
    p: Arc<Pipeline>,
    table: QualifiedName,
    topic: String,
    producer: FutureProducer,
    brokers: String,
    url: String,
    client: Option<Client>,
    gauges_at: Option<Instant>,
    /// Rounds in a row that locked rows and got none of them acknowledged (the broker refusing or away).
    stalled: u32,
    /// The rate limit of failed-send warnings.
    warnings: SendWarnings,
}

/// `--until-empty` (and `run --relay`'s drain) gives up after this many rounds in a row that locked rows and
/// published none of them (a row the broker always refuses, the topic deleted, the broker away for that many
/// ack timeouts): exit 1 naming what is left, instead of waiting forever.
pub const STALLED_ROUNDS: u32 = 3;

/// The idempotent producer of the relay: the pipeline's `[kafka.properties]` (SASL/TLS) through
/// [`crate::source::kafka::client_config`], then `enable.idempotence = true`, `acks = all` and
/// `message.timeout.ms = [outbox] ack-timeout-ms`, `allow.auto.create.topics = false` forced; `partitioner = murmur2_random` (the Java client's
/// partitioning of keyed messages) unless the properties set one.
///
/// # Errors
/// [`Error::Kafka`] when librdkafka refuses the configuration.
pub fn producer(p: &Pipeline, brokers: &str) -> Result<FutureProducer> {
    let mut c = crate::source::kafka::client_config(p, brokers);
    if !p.kafka.properties.iter().any(|(k, _)| k == "partitioner") {
        c.set("partitioner", "murmur2_random");
    }
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        // A key's next message waits for the previous acknowledgement: 1 ms (debug build, local broker) gave
        // ~2,500 rows/s over 100 keys and ~470/s on one hot key; 0 ms 370/s and 780/s, 5 ms 1,900/s and 120/s.
        .set("linger.ms", "1")
        // Never create the topic by publishing to it (librdkafka's producer asks the broker to by default): a
        // topic deleted under the relay would come back with the broker's default partition count, moving keys.
        .set("allow.auto.create.topics", "false")
        .set(
            "message.timeout.ms",
            p.outbox.ack_timeout.as_millis().to_string(),
        );
    Ok(c.create()?)
}

impl Relay {
    /// A relay of `table` to `topic`; connects to the database and checks that the table has `published_at`.
    ///
    /// # Errors
    /// [`Error::Kafka`] (producer configuration); [`Error::Connect`] / [`Error::Postgres`]; [`Error::Schema`]
    /// when the table is missing or has no `published_at` column (run `replaysafe init`).
    pub async fn new(
        p: Arc<Pipeline>,
        table: QualifiedName,
        topic: String,
        brokers: &str,
        url: &str,
    ) -> Result<Relay> {
        let producer = producer(&p, brokers)?;
        let mut r = Relay {
            p,
            table,
            topic,
            producer,
            brokers: brokers.to_string(),
            url: url.to_string(),
            client: None,
            gauges_at: None,
            stalled: 0,
            warnings: SendWarnings::default(),
        };
        let sql = format!(
            "SELECT id, delivery_key, message_key, payload, published_at FROM {} LIMIT 0",
            r.table
        );
        let (table, path) = (r.table.to_string(), r.p.source.path.clone());
        if let Err(e) = r.connect().await?.query(&sql, &[]).await {
            let why = e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_string());
            return Err(Error::Schema(format!(
                "outbox table {table} cannot be relayed: {why}; `replaysafe init --config {path}` creates it and adds \
                 published_at"
            )));
        }
        Ok(r)
    }

    async fn connect(&mut self) -> Result<&Client> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client =
                Some(crate::sink::connect_with(&self.url, &self.p.postgres.timeouts).await?);
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    /// One round (see the module documentation): returns the rows published (acknowledged and marked).
    ///
    /// # Errors
    /// [`Error::Postgres`] / [`Error::Connect`]: nothing of the round is marked (the rows it may have published
    /// are published again by a later round, with the same delivery header).
    pub async fn round(&mut self) -> Result<u64> {
        let (t, limit) = (self.table.clone(), i64::from(self.p.outbox.batch_size));
        let client = self.connect().await?;
        client.batch_execute("BEGIN").await?;
        let result = lock_rows(client, &t, limit).await;
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        };
        // The transaction is idle while the broker answers: a key's next message is sent only while its answer
        // (at most ack-timeout-ms) still comes before the server's idle-in-transaction timeout (with a margin).
        let (idle, ack) = (
            self.p.postgres.timeouts.idle_in_transaction,
            self.p.outbox.ack_timeout,
        );
        let margin = ((idle - ack) / 2).min(Duration::from_millis(500));
        let deadline = Instant::now() + (idle - ack - margin);
        let locked = rows.len();
        let sent = publish(&self.producer, &self.topic, rows, deadline).await;
        self.warnings
            .note(&self.table, &self.topic, &self.brokers, &sent.failed);
        let acked = sent.acked;
        self.stalled = if locked > 0 && acked.is_empty() {
            let first = sent.failed.first().map_or_else(
                || "no row acknowledged".to_string(),
                |(row, e)| format!("row {row}: {e}"),
            );
            crate::health::relay_stalled(Some(format!(
                "{} → topic {} on {}: {first}",
                self.table,
                self.topic,
                crate::endpoint::mask_urls(&self.brokers)
            )));
            self.stalled + 1
        } else {
            if !acked.is_empty() {
                crate::health::relay_stalled(None);
            }
            0
        };
        // Tests: a relay that dies after the broker acknowledged and before the mark (`pause`, then SIGKILL; or
        // `return`: the connection is dropped, the round rolled back).
        fail::fail_point!(
            "outbox-after-publish-before-mark",
            !acked.is_empty(),
            |_| {
                self.client = None;
                Ok(0)
            }
        );
        let client = self.client.as_ref().expect("connected above");
        let marked = async {
            if !acked.is_empty() {
                client
                    .execute(
                        &format!("UPDATE {t} SET published_at = now() WHERE id = ANY($1)"),
                        &[&acked],
                    )
                    .await?;
            }
            client.batch_execute("COMMIT").await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = marked {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
        metrics::counter!(PUBLISHED_TOTAL).increment(acked.len() as u64);
        Ok(acked.len() as u64)
    }

    /// The unpublished rows and the age (seconds) of the oldest, also set as the pending gauges.
    ///
    /// # Errors
    /// [`Error::Postgres`].
    pub async fn pending(&mut self) -> Result<(i64, f64)> {
        let t = self.table.clone();
        let r = self
            .connect()
            .await?
            .query_one(
                &format!(
                    "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM {t} \
                     WHERE published_at IS NULL"
                ),
                &[],
            )
            .await?;
        let (n, age): (i64, f64) = (r.get(0), r.get(1));
        metrics::gauge!(PENDING).set(n as f64);
        metrics::gauge!(OLDEST_PENDING_SECONDS).set(age.max(0.0));
        self.gauges_at = Some(Instant::now());
        Ok((n, age))
    }

    /// Rounds until `shutdown` is set (or, with `until_empty`, until nothing is left to publish). A failed
    /// round is logged and retried after a pause (1 s, doubling to 30 s); a round that found nothing waits
    /// `[outbox] poll-interval-ms`. Returns the rows published.
    ///
    /// # Errors
    /// None so far: every failure is retried; the `Result` is for the caller's symmetry.
    pub async fn run(&mut self, until_empty: bool, shutdown: &AtomicBool) -> Result<u64> {
        let (mut total, mut backoff) = (0u64, Duration::from_secs(1));
        while !shutdown.load(Ordering::Relaxed) {
            crate::health::relay_turned();
            let step = async {
                let n = self.round().await?;
                let due = self.gauges_at.is_none_or(|at| at.elapsed() >= GAUGE_EVERY);
                let pending = if n == 0 || due || until_empty {
                    Some(self.pending().await?.0)
                } else {
                    None
                };
                Ok::<_, Error>((n, pending))
            };
            let stepped = step.await;
            self.renew_after_fatal_error()?;
            match stepped {
                Ok((n, pending)) => {
                    backoff = Duration::from_secs(1);
                    total += n;
                    if n > 0 {
                        tracing::debug!(published = n, table = %self.table, "outbox round");
                        continue;
                    }
                    if until_empty && pending == Some(0) {
                        break;
                    }
                    if until_empty && self.stalled >= STALLED_ROUNDS {
                        return Err(Error::Other(format!(
                            "outbox {} → topic {}: {} rounds in a row published none of the rows they locked (the \
                             broker refused them or did not answer: see the warnings above); {} rows left \
                             unpublished, published {total} — fix the topic or the rows, then relay again",
                            self.table,
                            self.topic,
                            self.stalled,
                            pending.unwrap_or(0)
                        )));
                    }
                    tokio::time::sleep(self.p.outbox.poll_interval).await;
                }
                Err(e) => {
                    tracing::warn!(table = %self.table, "outbox relay round failed (retried in {backoff:?}; nothing \
                                   of it marked published): {e}");
                    self.client = None;
                    crate::health::relay_turned(); // a bounded database retry, as the engine's (health.rs)
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        Ok(total)
    }
}

impl Relay {
    /// After a fatal error of the idempotent producer (librdkafka: e.g. a sequence the broker cannot accept)
    /// every later send would fail: a new producer (a new idempotence session) takes over; the rows the old
    /// one did not get acknowledged are unpublished and go again.
    ///
    /// # Errors
    /// [`Error::Kafka`] when the new producer cannot be created.
    fn renew_after_fatal_error(&mut self) -> Result<()> {
        use rdkafka::producer::Producer;
        if let Some((code, why)) = self.producer.client().fatal_error() {
            tracing::error!(table = %self.table, "outbox relay: fatal producer error {code:?}: {why}; a new producer \
                            takes over (unacknowledged rows are published again)");
            self.producer = producer(&self.p, &self.brokers)?;
        }
        Ok(())
    }
}

/// The columns a round reads of a row, as [`Row`] takes them.
const ROW_COLUMNS: &str = "o.id, o.delivery_key, o.message_key, o.payload::text";

/// Steps 1 and 2 of a round, in its transaction: locks (`FOR UPDATE SKIP LOCKED`) up to `limit` unpublished
/// rows that are the oldest unpublished row of their message key (heads), then (`FOR UPDATE`, waits bounded by
/// `lock_timeout`) the following unpublished rows of the same keys up to `limit` rows in all — nobody else
/// locks those: they are no key's head while this transaction holds the head. Returns them in id order.
///
/// # Errors
/// [`Error::Postgres`].
async fn lock_rows(client: &Client, t: &QualifiedName, limit: i64) -> Result<Vec<Row>> {
    let row = |r: &tokio_postgres::Row| Row {
        id: r.get(0),
        delivery_key: r.get(1),
        message_key: r.get(2),
        payload: r.get(3),
    };
    let heads: Vec<Row> = client
        .query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM {t} o WHERE o.published_at IS NULL AND NOT EXISTS (SELECT 1 FROM {t} e \
                 WHERE e.published_at IS NULL AND e.message_key = o.message_key AND e.id < o.id) \
                 ORDER BY o.id LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            &[&limit],
        )
        .await?
        .iter()
        .map(row)
        .collect();
    let ids: Vec<i64> = heads.iter().map(|r| r.id).collect();
    let more = limit - crate::units::bigint_len(heads.len());
    if heads.is_empty() || more == 0 {
        return Ok(heads);
    }
    let followers = client
        .query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM {t} o JOIN {t} h ON h.id = ANY($1) AND h.message_key = o.message_key \
                 AND o.id > h.id WHERE o.published_at IS NULL ORDER BY o.id LIMIT $2 FOR UPDATE OF o"
            ),
            &[&ids, &more],
        )
        .await?;
    let mut rows: Vec<Row> = heads.into_iter().chain(followers.iter().map(row)).collect();
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// Publishes `rows` (id order): keys in parallel, each key's rows in order, the next sent after the previous
/// one's acknowledgement and only before `deadline` (a key's first row is always sent); returns the ids
/// acknowledged. A row without a message key is a key of its own.
/// What a round's sends got: the rows acknowledged, and per key whose send failed the row and librdkafka's
/// error (the rest of that key waits for the next round).
struct Published {
    acked: Vec<i64>,
    failed: Vec<(i64, String)>,
}

async fn publish(
    producer: &FutureProducer,
    topic: &str,
    rows: Vec<Row>,
    deadline: Instant,
) -> Published {
    let mut by_key: BTreeMap<Option<String>, Vec<Row>> = BTreeMap::new();
    let mut lone = Vec::new();
    for r in rows {
        match &r.message_key {
            Some(k) => by_key.entry(Some(k.clone())).or_default().push(r),
            None => lone.push(vec![r]),
        }
    }
    let chains = by_key.into_values().chain(lone).map(|chain| async move {
        let (mut acked, mut failed) = (Vec::new(), None);
        for (i, r) in chain.into_iter().enumerate() {
            if i > 0 && Instant::now() >= deadline {
                break; // the rest of the key waits for the next round
            }
            let headers = OwnedHeaders::new().insert(Header {
                key: DELIVERY_HEADER,
                value: Some(&r.delivery_key),
            });
            let mut rec = FutureRecord::to(topic).payload(&r.payload).headers(headers);
            if let Some(k) = &r.message_key {
                rec = rec.key(k);
            }
            match producer.send(rec, Duration::from_secs(5)).await {
                Ok(_) => acked.push(r.id),
                Err((e, _)) => {
                    failed = Some((r.id, e.to_string()));
                    break;
                }
            }
        }
        (acked, failed)
    });
    let mut out = Published {
        acked: Vec::new(),
        failed: Vec::new(),
    };
    for (acked, failed) in futures::future::join_all(chains).await {
        out.acked.extend(acked);
        out.failed.extend(failed);
    }
    out
}

/// Failed sends are warned about at most once per this interval (a summary: rows, rounds, the first error), so
/// a broker outage logs a bounded number of lines; `/readyz` says the relay publishes nothing meanwhile.
pub const FAILED_SEND_WARN_EVERY: Duration = Duration::from_secs(30);

/// The rate limit of the failed-send warnings: when the last was logged, and what failed since.
#[derive(Default)]
struct SendWarnings {
    last: Option<Instant>,
    rows: u64,
    rounds: u64,
}

impl SendWarnings {
    /// Counts a round's failed sends; logs one summary line when the interval has passed (or on the first).
    fn note(
        &mut self,
        table: &QualifiedName,
        topic: &str,
        brokers: &str,
        failed: &[(i64, String)],
    ) {
        let Some((row, first)) = failed.first() else {
            return;
        };
        self.rows += failed.len() as u64;
        self.rounds += 1;
        if self
            .last
            .is_some_and(|at| at.elapsed() < FAILED_SEND_WARN_EVERY)
        {
            return;
        }
        tracing::warn!(
            "outbox {table} → topic {topic} on {}: {} row(s) not acknowledged in {} round(s) since the last warning \
             (first: row {row}: {first}); they stay unpublished and are retried (next summary in at most {} s)",
            crate::endpoint::mask_urls(brokers),
            self.rows,
            self.rounds,
            FAILED_SEND_WARN_EVERY.as_secs()
        );
        (self.last, self.rows, self.rounds) = (Some(Instant::now()), 0, 0);
    }
}

/// `replaysafe outbox relay`: resolves the target, then relays on its own runtime until shutdown (or empty).
/// Returns the outbox table, the topic and the rows published.
///
/// # Errors
/// As [`target`] and [`Relay::new`].
pub fn relay(p: Arc<Pipeline>, opts: &RelayOptions) -> Result<(QualifiedName, String, u64)> {
    let (table, topic) = target(&p, opts.outbox.as_deref(), opts.topic.as_deref())?;
    require_topic(&p, &opts.brokers, &topic)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    let n = rt.block_on(async {
        let mut r = Relay::new(
            p,
            table.clone(),
            topic.clone(),
            &opts.brokers,
            &opts.database_url,
        )
        .await?;
        tracing::info!(table = %table, topic = %topic, "outbox relay started");
        r.run(opts.until_empty, &opts.shutdown).await
    })?;
    Ok((table, topic, n))
}

/// `run --relay`: a relay task beside the consumer, on `run`'s runtime.
pub struct Beside {
    stop: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<u64>>,
}

impl Beside {
    /// Resolves the target and checks the producer's configuration (so that a missing topic exits before
    /// consuming), then spawns the relay on `rt`: it connects once `run` has created the outbox table, and stops
    /// when `shutdown` is set or [`Beside::finish`] is called.
    ///
    /// # Errors
    /// As [`target`]; [`Error::Kafka`] for a configuration librdkafka refuses.
    pub fn start(
        rt: &tokio::runtime::Handle,
        p: Arc<Pipeline>,
        opts: &RelayOptions,
    ) -> Result<Beside> {
        let (table, topic) = target(&p, opts.outbox.as_deref(), opts.topic.as_deref())?;
        require_topic(&p, &opts.brokers, &topic)?;
        let _probe = producer(&p, &opts.brokers)?; // librdkafka's own check, before consuming
        let (stop, drain, shutdown) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            opts.shutdown.clone(),
        );
        let (s, d) = (stop.clone(), drain.clone());
        let (brokers, url) = (opts.brokers.clone(), opts.database_url.clone());
        let task = rt.spawn(async move {
            let watcher = {
                let s = s.clone();
                tokio::spawn(async move {
                    while !shutdown.load(Ordering::Relaxed) && !s.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    s.store(true, Ordering::Relaxed);
                })
            };
            // `run` creates the outbox table as it starts: until then (or while the database is away) retry.
            let mut relay = {
                let mut attempt = 0u32;
                loop {
                    match Relay::new(p.clone(), table.clone(), topic.clone(), &brokers, &url).await {
                        Ok(r) => break r,
                        Err(_) if s.load(Ordering::Relaxed) && !d.load(Ordering::Relaxed) => return Ok(0),
                        Err(e) => {
                            attempt += 1;
                            // Quiet while `run` creates the table; said every 30 s when it lasts.
                            if attempt % 30 == 10 {
                                tracing::warn!("outbox relay not started yet (retried every second): {e}");
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            };
            tracing::info!(table = %table, topic = %topic, "outbox relay started beside the consumer");
            let mut n = relay.run(false, &s).await?;
            watcher.abort();
            if d.load(Ordering::Relaxed) {
                // The consumer finished (--until-caught-up): publish what is left, then stop.
                n += relay.run(true, &AtomicBool::new(false)).await?;
            }
            Ok(n)
        });
        Ok(Beside { stop, drain, task })
    }

    /// Stops the relay — after publishing every row left when `drain` (within `limit`) — and returns the rows
    /// it published.
    ///
    /// # Errors
    /// [`Error::Other`] when the relay did not stop within `limit` (what it published stays published; the rest
    /// is published by the next relay).
    pub fn finish(self, rt: &tokio::runtime::Handle, drain: bool, limit: Duration) -> Result<u64> {
        self.drain.store(drain, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        match rt.block_on(async move { tokio::time::timeout(limit, self.task).await }) {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Other(format!("outbox relay task: {e}"))),
            Err(_) => Err(Error::Other(format!(
                "the outbox relay did not finish within {limit:?}: unpublished rows are published by the next relay"
            ))),
        }
    }
}
