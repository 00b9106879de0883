//! The PostgreSQL side: one transaction per partition batch holding the checkpoint compare-and-set, the ledger
//! claims, every projection (over the rows actually claimed), and the dead letters.

pub mod build;
pub mod checkpoint;
pub mod conninfo;
pub mod dead_letters;
pub mod fault;
pub mod ledger;
pub mod lifecycle;
pub mod marks;
pub mod pooler;
pub mod privileges;
pub mod probe;
pub mod projset;
pub mod projstart;
pub mod schema;
pub mod tls;
pub mod verify;

use std::collections::HashSet;
use std::sync::Arc;

use chrono::NaiveDate;
use tokio_postgres::{Client, Statement};

use crate::config::{Pipeline, Timeouts};
use crate::error::{Error, Result};
use crate::model::{classify, describe, ApplyError, Batch, Outcome};

struct Prepared {
    claim: Statement,
    dead: Statement,
    /// Marks dead letters of landed records resolved.
    resolve: Statement,
    /// The error-tolerance check ([`dead_letters::tolerance_statement`]); `None` under `tolerance = "all"`.
    tolerance: Option<Statement>,
    advance: Statement,
    /// The claim horizon read under a share lock ([`ledger::horizon_statement`]); `None` without `partition-by`.
    horizon: Option<Statement>,
    /// The projection record's version under a share lock ([`projset::version_statement`]).
    version: Statement,
    /// The partition's pruned offset ([`lifecycle::pruned_statement`]); `None` without `partition-by`.
    pruned: Option<Statement>,
    /// Every projection's statements and prepared state ([`crate::projection::apply::Prepared`]).
    projections: crate::projection::apply::Prepared,
}

/// One PostgreSQL connection with the statements a batch needs prepared and a `landed` temp table.
pub struct Sink {
    pipeline: Arc<Pipeline>,
    group: String,
    url: String,
    client: Client,
    prepared: Prepared,
    partitions: HashSet<NaiveDate>,
    /// The oldest claimable day last read from the database (it only moves forward); days before it get no
    /// partition. The claim transaction decides again.
    floor: Option<NaiveDate>,
    /// Re-applying dead letters ([`Sink::replaying`]): no checkpoint, no tolerance check, the dead letters of the
    /// batch settled in its transaction.
    replay: bool,
    /// The projection record's version this sink's pipeline matched when opened; every batch checks it.
    version: i64,
    /// `replaysafe projection build`: the index of the one projection fed (see [`Sink::for_build`]).
    build: Option<usize>,
    /// `replaysafe prove`'s uncertain commits ([`crate::sink::fault`]); `None` in production.
    fault: Option<Arc<crate::sink::fault::Fault>>,
}

/// Session settings every replaysafe connection pins ([`connect`]): values replaysafe renders as text — delivery
/// keys, entity lock ids, row states, outbox keys — must be spelled alike by every process, whatever the
/// server's or the role's defaults (PostgreSQL manual, "Client Connection Defaults": DateStyle, TimeZone,
/// IntervalStyle, extra_float_digits — 1: the shortest text that reads back exactly —, bytea_output). A row
/// projection's values take these output forms before they are judged or stored (`projection::row::canon`).
///
/// `search_path` holds only `pg_catalog` and then `pg_temp` (PostgreSQL manual, "Schemas → Usage Patterns" and
/// "Writing SECURITY DEFINER Functions Safely"; CVE-2018-1058): an unqualified function or operator resolves in
/// `pg_catalog` only, so an overload a role planted in `public` or its own schema (e.g. `unnest(text[])`, preferred
/// to `pg_catalog.unnest(anyarray)`) never runs in replaysafe's sessions; every table is named with its schema,
/// the batch's temporary tables with `pg_temp`.
pub const SESSION_SETTINGS: &str =
    "SET search_path = pg_catalog, pg_temp; SET datestyle = 'ISO, YMD'; \
     SET timezone = 'UTC'; SET intervalstyle = 'postgres'; SET extra_float_digits = 1; SET bytea_output = 'hex'";

/// Opens a connection (TLS as the URL and the noted `[postgres]` keys say: [`tls`]) with [`SESSION_SETTINGS`] and the default [`Timeouts`] (tools
/// without a pipeline's `[postgres]` settings); see [`connect_with`].
///
/// # Errors
/// [`Error::Postgres`].
pub async fn connect(url: &str) -> Result<Client> {
    connect_with(url, &Timeouts::default()).await
}

/// Opens a connection with [`SESSION_SETTINGS`] and `timeouts` pinned
/// ([`Timeouts::settings`]: `lock_timeout`, `statement_timeout`, `idle_in_transaction_session_timeout`), so that
/// no wait of this session on PostgreSQL is unbounded. A statement that legitimately needs longer (a rebuild's
/// delete, a prune's DDL lock) overrides them with `SET LOCAL` in its transaction.
///
/// # Errors
/// [`Error::Postgres`]; [`Error::Usage`] for a URL that does not parse or TLS files that cannot be used
/// ([`conninfo::resolve`], [`tls::connector`]). TLS parameters (`sslmode` up to verify-full, `sslrootcert`,
/// `sslcert`, `sslkey`) come from the URL as libpq spells them or from `[postgres]` ([`conninfo`]).
/// A connection that fails names the address (`host:port`, never the password), where the URL came from and
/// the cause ([`crate::endpoint`]); one attempt waits at most `connect_timeout` of the URL, else
/// [`crate::endpoint::ATTEMPT_TIMEOUT`] (bounded by `--connect-timeout`). [`Error::Usage`] behind a connection
/// pooler in transaction or statement mode, found by the process's first connection to `url`
/// ([`pooler::refuse_transaction_pooling`]).
pub async fn connect_with(url: &str, timeouts: &Timeouts) -> Result<Client> {
    let (mut config, security) = conninfo::resolve(url)?;
    if config.get_connect_timeout().is_none() {
        let bound = crate::endpoint::ATTEMPT_TIMEOUT.min(crate::endpoint::connect_timeout());
        config.connect_timeout(bound.max(std::time::Duration::from_secs(1)));
    }
    // Before any setting is pinned: a transaction pooler would hand it to other clients (case C45).
    let raw = || connect_unpinned(&config, &security, url);
    pooler::refuse_transaction_pooling(url, &crate::endpoint::pg_address(&config), raw).await?;
    let client = raw().await?;
    pin(&client, timeouts).await?;
    Ok(client)
}

/// One connection as [`connect_with`] makes it, nothing pinned yet.
async fn connect_unpinned(
    config: &tokio_postgres::Config,
    security: &conninfo::Security,
    url: &str,
) -> Result<Client> {
    match tls::connector(security)? {
        Some(tls) => connect_on(config, url, tls).await,
        None => connect_on(config, url, tokio_postgres::NoTls).await,
    }
}

/// Pins [`SESSION_SETTINGS`] and `timeouts` ([`Timeouts::settings`]) on the session of `c`: when it connects
/// ([`connect_with`]), and again after SQL of the operator's that may have changed them (a `sql` projection's
/// `setup` holding `SET search_path …` would otherwise leave replaysafe's own statements of that session
/// resolving built-ins on the role's default path; [`schema::init`]). Inside a transaction the settings take
/// effect at once and stay after it commits.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn pin(c: &impl tokio_postgres::GenericClient, timeouts: &Timeouts) -> Result<()> {
    c.batch_execute(SESSION_SETTINGS).await?;
    c.batch_execute(&timeouts.settings()).await?;
    Ok(())
}

/// Connects with `tls` and drives the connection in the background.
async fn connect_on<T>(config: &tokio_postgres::Config, url: &str, tls: T) -> Result<Client>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| Error::Connect(crate::endpoint::pg_error(config, url, &e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("postgres connection ended: {e}");
        }
    });
    Ok(client)
}

impl Sink {
    /// Connects and prepares. The tables must exist ([`schema::init`]).
    ///
    /// # Errors
    /// [`Error::Postgres`], or [`Error::Schema`] when a statement does not compile.
    pub async fn open(pipeline: Arc<Pipeline>, url: &str) -> Result<Sink> {
        let client = connect_with(url, &pipeline.postgres.timeouts).await?;
        client
            .batch_execute(&ledger::create_landed(&pipeline))
            .await?;
        let prep = |s: String| {
            let client = &client;
            async move {
                client
                    .prepare(&s)
                    .await
                    .map_err(|e| Error::Schema(format!("{e}: {s}")))
            }
        };
        let prepared = Prepared {
            claim: prep(ledger::claim(&pipeline)).await?,
            dead: prep(dead_letters::insert_dead_letters(&pipeline)).await?,
            resolve: prep(dead_letters::resolve_statement(&pipeline)).await?,
            tolerance: match pipeline.errors.stops() {
                true => Some(prep(dead_letters::tolerance_statement(&pipeline)).await?),
                false => None,
            },
            advance: prep(checkpoint::advance_checkpoint(&pipeline)).await?,
            version: prep(projset::version_statement(&pipeline)).await?,
            horizon: match pipeline.identity.partition_by {
                Some(_) => Some(prep(ledger::horizon_statement(&pipeline)).await?),
                None => None,
            },
            pruned: match pipeline.identity.partition_by {
                Some(_) => Some(prep(lifecycle::pruned_statement(&pipeline)).await?),
                None => None,
            },
            projections: crate::projection::apply::Prepared::new(&client, &pipeline).await?,
        };
        let partitions = ledger::existing_partitions(&client, &pipeline).await?;
        let version = projset::current_version(&client, &pipeline).await?;
        Ok(Sink {
            group: pipeline.kafka.group_id.clone(),
            pipeline,
            url: url.to_string(),
            client,
            prepared,
            partitions,
            floor: None,
            replay: false,
            version,
            build: None,
            fault: None,
        })
    }

    /// This connection re-applies dead letters (`replaysafe dead-letters replay`): its batches are records read
    /// back from `replaysafe_dead_letters`, applied through the same transaction — horizon, ledger claims,
    /// projections over the rows claimed, resolution of the dead letters that land — without the checkpoint step
    /// (no partition is owned) and without the tolerance check; in the same transaction every dead letter of the
    /// batch that did not land is settled (`dead_letters::settle_replayed`).
    pub fn replaying(mut self) -> Sink {
        self.replay = true;
        self
    }

    /// Turns this sink into one of `replaysafe projection build` for projection number `index`: instead of
    /// claiming, a batch matches its records with the ledger rows claimed at their (topic, partition, offset)
    /// before the projection's hand-over point (its group's hand-over rows, [`build::match_statement`]) and feeds
    /// only that projection with them; no dead letters are written (production wrote them), no ledger partition
    /// is created, and a record older than the ledger's horizon stops the build.
    ///
    /// # Errors
    /// [`Error::Schema`] when the statement does not compile.
    pub async fn for_build(mut self, index: usize) -> Result<Sink> {
        let p = self.pipeline.clone();
        let hashed = ledger::key_is_hashed(&self.client, &p).await?;
        let stmt = build::match_statement(&p, hashed);
        self.prepared.claim = self
            .client
            .prepare(&stmt)
            .await
            .map_err(|e| Error::Schema(format!("{e}: {stmt}")))?;
        self.prepared.projections.keep_only(index);
        self.build = Some(index);
        Ok(self)
    }

    /// Sets `replaysafe prove`'s uncertain-commit hook ([`crate::sink::fault::Fault`]; `None`: none).
    pub fn with_fault(mut self, fault: Option<Arc<crate::sink::fault::Fault>>) -> Sink {
        self.fault = fault;
        self
    }

    /// Uses `group` (e.g. a backfill's own group id) for checkpoints, ledger and dead-letter rows instead of the
    /// pipeline's group.
    pub fn with_group(mut self, group: &str) -> Sink {
        self.group = group.to_string();
        self
    }

    /// Replaces a broken connection with a new one.
    ///
    /// # Errors
    /// As [`Sink::open`].
    pub async fn reconnect(&mut self) -> Result<()> {
        let group = self.group.clone();
        let (replay, build) = (self.replay, self.build);
        let sink = Sink::open(self.pipeline.clone(), &self.url)
            .await?
            .with_group(&group)
            .with_fault(self.fault.clone());
        *self = match build {
            Some(i) => sink.for_build(i).await?,
            None => sink,
        };
        self.replay = replay;
        Ok(())
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The underlying client (for checkpoint acquisition and maintenance).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Applies one batch in one transaction and returns each record's outcome, in item order. A record whose
    /// event day is older than the ledger's claim horizon (read in the transaction, see [`ledger::Horizon`]) is
    /// quarantined as `beyond-horizon` in that transaction. A ledger partition that vanished under the batch
    /// (dropped by another process) is an infrastructure condition: the partitions are read again and the batch
    /// retried, so the horizon decides (bounded: [`MISSING_PARTITION_RETRIES`]).
    ///
    /// # Errors
    /// See [`ApplyError`].
    pub async fn apply(&mut self, batch: &Batch) -> std::result::Result<Vec<Outcome>, ApplyError> {
        let mut attempt = 0u32;
        loop {
            match self.apply_once(batch).await {
                Err(ApplyError::Data(e)) if self.is_missing_partition(&e) => {
                    attempt += 1;
                    if attempt > MISSING_PARTITION_RETRIES {
                        return Err(ApplyError::Fatal(Error::Other(format!(
                            "ledger {}: a day partition keeps disappearing under {}/{} ({e}); is something other \
                             than replaysafe dropping partitions?",
                            self.pipeline.ledger.table, batch.topic, batch.partition
                        ))));
                    }
                    tracing::warn!(
                        topic = %batch.topic,
                        partition = batch.partition,
                        attempt,
                        "a ledger day partition was dropped by another process; re-reading partitions and the horizon"
                    );
                    self.floor = None;
                    self.partitions = ledger::existing_partitions(&self.client, &self.pipeline)
                        .await
                        .map_err(crate::model::apply_error::from_error)?;
                }
                other => return other,
            }
        }
    }

    /// Whether `e` is PostgreSQL finding no partition of the ledger for a claimed row.
    fn is_missing_partition(&self, e: &tokio_postgres::Error) -> bool {
        let ledger = format!("\"{}\"", self.pipeline.ledger.table.name.as_str());
        e.as_db_error().is_some_and(|d| {
            d.code() == &tokio_postgres::error::SqlState::CHECK_VIOLATION
                && d.message().starts_with("no partition of relation")
                && d.message().contains(&ledger)
        })
    }

    async fn apply_once(&mut self, batch: &Batch) -> std::result::Result<Vec<Outcome>, ApplyError> {
        let mut all = self
            .apply_several(std::slice::from_ref(batch), Mode::Batch)
            .await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// Applies the parts of one source transaction (`[source] transactions = "atomic"`; one batch per partition,
    /// the records of other partitions may share offsets) in ONE transaction, without the checkpoint step: the
    /// engine keeps each partition's checkpoint below the transaction's records until this commits, so a crash
    /// re-reads them and the ledger claims make the re-application harmless. Each part first takes its
    /// partition's checkpoint row under the part's fence ([`checkpoint::hold`]): a part whose partition another
    /// owner took (fence bumped) or whose checkpoint moved past its records makes the whole transaction
    /// [`ApplyError::Fenced`], nothing written. Outcomes per batch, in item order.
    ///
    /// # Errors
    /// As [`Sink::apply`].
    pub async fn apply_transaction(
        &mut self,
        batches: &[Batch],
    ) -> std::result::Result<Vec<Vec<Outcome>>, ApplyError> {
        self.apply_several(batches, Mode::Transaction).await
    }

    /// The pipeline this sink applies.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// Tries a source transaction's parts in a transaction that is rolled back: the outcomes they would have
    /// (a `duplicate` for a change whose delivery key is already claimed), nothing written.
    ///
    /// # Errors
    /// As [`Sink::apply`].
    pub async fn probe_transaction(
        &mut self,
        batches: &[Batch],
    ) -> std::result::Result<Vec<Vec<Outcome>>, ApplyError> {
        self.apply_several(batches, Mode::Probe).await
    }

    /// Tries `batch` (one record of a source transaction PostgreSQL rejected) in a transaction that is rolled
    /// back: `Ok` when it alone applies, the rejection otherwise. Names the record that fails a transaction.
    ///
    /// # Errors
    /// As [`Sink::apply`].
    pub async fn probe(&mut self, batch: &Batch) -> std::result::Result<(), ApplyError> {
        self.apply_several(std::slice::from_ref(batch), Mode::Probe)
            .await
            .map(|_| ())
    }

    async fn apply_several(
        &mut self,
        batches: &[Batch],
        mode: Mode,
    ) -> std::result::Result<Vec<Vec<Outcome>>, ApplyError> {
        let p = self.pipeline.clone();
        if self.build.is_none() {
            for batch in batches {
                ledger::ensure_batch_partitions(
                    &mut self.client,
                    &p,
                    &mut self.partitions,
                    &mut self.floor,
                    batch,
                )
                .await?;
            }
        }
        for batch in batches {
            (self.prepared.projections)
                .evolve(&self.client, &p, batch)
                .await?;
        }
        let generation = p.identity.generation.clone().unwrap_or_default();
        let group = self.group.as_str();
        let tx = self
            .client
            .transaction()
            .await
            .map_err(|e| classify(e, false))?;
        let prepared = &self.prepared;

        let mut all = Vec::with_capacity(batches.len());
        for (i, batch) in batches.iter().enumerate() {
            if i > 0 {
                // A source transaction's next part: the rows the previous part claimed are not this part's.
                tx.batch_execute("TRUNCATE pg_temp.landed")
                    .await
                    .map_err(|e| classify(e, false))?;
            }
            // 1. The checkpoint first: it locks the partition's row, so a new owner's fence bump waits for us.
            let last_sha = batch
                .items
                .last()
                .map(|it| checkpoint::fingerprint(it.key.as_deref(), it.value.as_deref()));
            let mut continues = false;
            if !self.replay && mode == Mode::Transaction && self.build.is_none() {
                checkpoint::hold(&tx, &p, group, &generation, batch).await?;
            }
            if !self.replay && mode == Mode::Batch {
                continues = checkpoint::advance(
                    &tx,
                    &prepared.advance,
                    &p,
                    group,
                    &generation,
                    batch,
                    last_sha,
                )
                .await?;
            }

            // 1a. The projection record's version: a process running an older definition stops here.
            projset::check_version(&tx, &prepared.version, &p, self.version).await?;

            // 1b. The ledger horizon, under a share lock the prune waits for: older records are quarantined here.
            let horizoned =
                ledger::apply_horizon(&tx, prepared.horizon.as_ref(), &p, batch).await?;
            if let (Some(h), Some(_)) = (&horizoned, self.build) {
                let pruned = prepared.pruned.as_ref();
                if build::holds_beyond_horizon(h)
                    && !build::beyond_horizon_never_landed(&tx, pruned, &p, &generation, h).await?
                {
                    return Err(build::beyond_horizon(&p, h));
                }
            }
            let batch = horizoned.as_ref().unwrap_or(batch);

            // 1c. Offsets whose ledger rows a prune dropped (read after 1b's lock): a batch reaching them is refused
            // (a part of a source transaction, which has no checkpoint step, never counts as continuing).
            if !self.replay && self.build.is_none() {
                let pruned = prepared.pruned.as_ref();
                lifecycle::check_pruned(&tx, pruned, &p, &generation, batch, continues).await?;
            }

            // 2. Ledger claims → landed.
            let mut landed =
                ledger::claim_batch(&tx, &prepared.claim, &p, group, &generation, batch).await?;

            // 3. Projections over what was claimed: row projections first — they judge stale and conflicting
            // changes (which stay in `landed`) and take same-state redeliveries (duplicates) out of `landed` —,
            // then the others, only when something landed.
            let overrides = (prepared.projections)
                .apply(&tx, &p, group, batch, &mut landed)
                .await?;

            // 3c. Dead letters of records that landed now (e.g. by a backfill) are resolved.
            if !landed.is_empty() && self.build.is_none() {
                dead_letters::resolve_landed(&tx, &prepared.resolve, batch, group, &generation)
                    .await?;
            }

            // 4. Dead letters (a build writes none: production wrote them).
            if self.build.is_none() {
                dead_letters::insert(&tx, &prepared.dead, &p, group, &generation, batch).await?;
            }

            // 4b. The declared error tolerance: a systematic failure rolls the whole batch back.
            if let (Some(stmt), false) = (&prepared.tolerance, self.replay || self.build.is_some())
            {
                dead_letters::check_tolerance(&tx, stmt, &p, &generation, batch).await?;
            }

            let outcomes = crate::model::batch::outcomes(batch, &landed, &overrides);
            if self.replay {
                dead_letters::settle_replayed(&tx, &p, &generation, batch, &outcomes).await?;
            }
            all.push(outcomes);
        }
        if mode == Mode::Probe {
            tx.rollback().await.map_err(|e| classify(e, false))?;
            return Ok(all);
        }
        #[cfg(feature = "failpoints")]
        if mode == Mode::Transaction && fail::eval("tx-commit-reply-lost", |_| ()).is_some() {
            // Test builds: a source transaction's COMMIT applied, then its reply lost (the connection cut).
            tx.commit().await.map_err(|e| classify(e, true))?;
            return Err(lose_reply(&self.client, all.concat()).await);
        }
        #[cfg(feature = "failpoints")]
        if let Some(Some(release)) = fail::eval("hold-before-db-commit", |path| path) {
            fault::hold_until(std::path::Path::new(&release));
        }
        fail::fail_point!("before-db-commit", |_| Err(ApplyError::Fatal(
            Error::Other("failpoint before-db-commit".into())
        )));
        if let Some(applied) = self.fault.as_ref().and_then(|f| f.at_commit()) {
            let done = if applied {
                tx.commit().await
            } else {
                tx.rollback().await
            };
            if let Err(e) = done {
                return Err(classify(e, true));
            }
            return Err(lose_reply(&self.client, all.concat()).await);
        }
        if let Err(e) = tx.commit().await {
            return Err(match classify(e, true) {
                ApplyError::Transient { error, .. } => ApplyError::Transient {
                    error,
                    commit_sent: true,
                    outcomes: Some(all.concat()),
                },
                other => other,
            });
        }
        Ok(all)
    }
}

/// What [`Sink::apply_several`] runs: a partition batch (checkpoint compare-and-set), a source transaction's
/// parts (fence held, no checkpoint step), or a probe (rolled back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Batch,
    Transaction,
    Probe,
}

/// `prove`'s uncertain commit ([`crate::sink::fault`]), after the COMMIT or ROLLBACK: the connection cut; the
/// engine gets the error as after a COMMIT whose reply was lost.
async fn lose_reply(client: &Client, outcomes: Vec<Outcome>) -> ApplyError {
    match crate::sink::fault::cut(client).await {
        Some(error) => ApplyError::Transient {
            error,
            commit_sent: true,
            outcomes: Some(outcomes),
        },
        None => ApplyError::Fatal(Error::Other(
            "prove: the connection could not be cut".into(),
        )),
    }
}

/// How often [`Sink::apply`] re-reads the partitions and retries a batch whose ledger partition vanished.
pub const MISSING_PARTITION_RETRIES: u32 = 3;
