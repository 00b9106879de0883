//! The command line: clap definitions, and resolving them into options once (the pipeline, brokers, database,
//! one builder for backfill and rebuild).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use replaysafe::config;
use replaysafe::error::Error;
use replaysafe::ops::backfill::{BackfillOptions, StopSpec};
use replaysafe::ops::rebuild::RebuildOptions;

/// Consume Apache Kafka into PostgreSQL so that replaying anything is harmless.
#[derive(Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Seconds start-up waits for PostgreSQL and the Kafka brokers (retrying a refused connection, a DNS
    /// failure, a timeout) before it exits with the error (code 1) naming the address, where it came from and
    /// the cause: `run`, `load`, `backfill`, `rebuild`, `offsets snapshot`, and `check --connect` and
    /// `outbox relay` for the brokers; the other commands try the database once. Also the bound of each schema-registry lookup
    /// (`[source] encoding = "avro" | "json-schema"`): then the run stops with exit 1.
    #[arg(long, global = true, default_value_t = 60, value_name = "SECONDS")]
    pub connect_timeout: u64,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the pipeline: consume, land idempotently, project, checkpoint, commit offsets.
    Run {
        /// The pipeline file (TOML; see reference.toml).
        #[arg(short, long)]
        config: PathBuf,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
        /// Serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 127.0.0.1:9464).
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
        /// Exit 0 once every assigned partition is caught up and applied (for batch jobs and tests).
        #[arg(long)]
        until_caught_up: bool,
        /// Seconds between summary log lines.
        #[arg(long, default_value_t = 10)]
        summary_interval: u64,
        /// Seconds between ledger prunes while running (dropping day partitions older than the horizon; also
        /// done on start).
        #[arg(long, default_value_t = 3600)]
        prune_interval: u64,
        /// Seconds a SIGINT/SIGTERM drain (apply and commit what is buffered, leave the group) may take; past
        /// it `run` exits with code 4 (what was committed stays; the rest is read again on restart).
        #[arg(long, default_value_t = 30)]
        shutdown_timeout: u64,
        /// Issue no DDL (as `[postgres] manage-schema = false`): the tables and the ledger's day partitions must
        /// exist (`init` by their owner); a batch needing a missing partition stops uncommitted, naming it; no
        /// prune (the owner's `init` prunes). docs/operations.md "Privileges".
        #[arg(long)]
        no_ddl: bool,
        /// Also relay the pipeline's outbox to `[outbox] topic` in this process (docs/reference.md "Outbox relay");
        /// with --until-caught-up the rows left are published before the exit (within --shutdown-timeout).
        #[arg(long)]
        relay: bool,
    },
    /// Apply the records of a file in `kcat -C -J` format (one JSON envelope per line) through the same
    /// decode → batch → transaction → checkpoint path as `run`, without consuming from a broker. Checkpoints go
    /// to a group of the load's own (never the pipeline's unless --take-over); the keys it lands are in the
    /// pipeline's ledger, so `run` later counts them `duplicate`. Exit 0 when the whole file is applied, 1 on a
    /// bad line or runtime failure (earlier lines stay applied; a rerun resumes), 2 when the file cannot be
    /// opened, the database does not match, --group-id is the pipeline's group without --take-over, or a
    /// partition's offsets in the file reach the live topic's end (nothing applied).
    Load {
        /// The pipeline file (its fields, projections and database; `[kafka] topics` must name the file's topics).
        #[arg(short, long)]
        config: PathBuf,
        /// Checkpoints and dead-letter rows under this consumer group (default:
        /// `replaysafe-load-<file stem>-<8 hex digits of the SHA-256 of the file's absolute path>`: rerunning the
        /// same file resumes). The pipeline's own `[kafka] group-id` is refused without --take-over.
        #[arg(long)]
        group_id: Option<String>,
        /// Write the pipeline's own group's checkpoints (`[kafka] group-id`), as if its `run` had read the file:
        /// stop that `run` first (it would be fenced; a running one takes its partitions back and this load
        /// fails), and only with a dump of the live topic — the broker must answer and every partition's offsets
        /// must be below its end.
        #[arg(long, conflicts_with = "group_id")]
        take_over: bool,
        /// Kafka bootstrap servers to check the file's offsets against the live topic's end; overrides the file
        /// and KAFKA_BROKERS. Without any, a load under its own group is not checked (warned).
        #[arg(long)]
        brokers: Option<String>,
        /// A line whose bytes are not UTF-8 (kcat copies a binary key or value unescaped) is quarantined as
        /// `undecodable-value` — the dead letter's value is the whole line — instead of stopping the load there.
        #[arg(long)]
        quarantine_invalid_utf8: bool,
        /// The records: `kcat -C -J -e -b BROKERS -t TOPIC -X isolation.level=read_committed > FILE`.
        file: PathBuf,
    },
    /// Validate the pipeline file (librdkafka properties included) and print the four answers; exit 0 when
    /// valid, 2 when not (or when a `--connect` / `--database` check fails).
    Check(CheckArgs),
    /// Create or upgrade the tables the pipeline needs (run does this too unless --no-ddl), then check them;
    /// prune the ledger to its horizon and create its day partitions ahead. Run it as the tables' owner.
    Init {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// Create the ledger's day partitions from its horizon through today + this many days (a role
        /// without DDL needs them; schedule `init` daily). 0 to 366.
        #[arg(long, default_value_t = replaysafe::sink::ledger::DEFAULT_DAYS_AHEAD,
              value_parser = clap::value_parser!(u32).range(0..=366))]
        days: u32,
    },
    /// The outbox relay (docs/reference.md "Outbox relay").
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Another group's positions, read without joining it.
    Offsets {
        #[command(subcommand)]
        command: OffsetsCommand,
    },
    /// Change the projections of a running pipeline: build an added one from history, remove one.
    Projection {
        #[command(subcommand)]
        command: ProjectionCommand,
    },
    /// Replay a window of the topic through the same idempotent path as `run`.
    Backfill(BackfillArgs),
    /// Zero a window of event days in the aggregates and the ledger, then replay it under a fresh group.
    Rebuild(RebuildArgs),
    /// Check that an aggregate changed by exactly what a backfill reported.
    Verify {
        #[command(subcommand)]
        command: VerifyCommand,
    },
    /// The pipeline's unresolved dead letters (quarantined records): list them, or re-apply them after a fix.
    DeadLetters {
        #[command(subcommand)]
        command: DeadLettersCommand,
    },
    /// The ledger's lifecycle: its size per day partition, and the prune to its horizon.
    Ledger {
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// Prove that replay is harmless for your pipeline on a fixture of its records: twelve boundaries (apply
    /// once, apply twice, a crash between every database and Kafka commit, permitted shuffles, a rebuilt topic, a
    /// resnapshot, an expired ledger entry, two workers and two groups at once, an uncertain commit, batch
    /// boundaries, again into a fresh schema, accounting), each on a scratch schema of your database (dropped unless --keep) and a scratch topic on
    /// librdkafka's embedded mock cluster (or --brokers), the final state compared with the first. Exit 0 when
    /// every boundary passes, 6 when one fails (the diff is printed), 2 for bad usage.
    Prove {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// The fixture: a file in `kcat -C -J` format (as `load` reads).
        #[arg(
            long,
            required_unless_present = "from_topic",
            conflicts_with = "from_topic"
        )]
        records: Option<PathBuf>,
        /// Take the fixture from this live topic instead (its first --max records, partitions in turn), on the
        /// pipeline's brokers (`[kafka] brokers` or KAFKA_BROKERS).
        #[arg(long, requires = "max")]
        from_topic: Option<String>,
        /// With --from-topic: records to take.
        #[arg(long)]
        max: Option<usize>,
        /// Run the scratch topics on this Kafka cluster (topics `<topic>.prove-<id>`, deleted at the end unless
        /// --keep) instead of the embedded mock cluster.
        #[arg(long)]
        brokers: Option<String>,
        /// Keep the scratch schemas (`rsprove_<id>_<n>`) and --brokers topics (their names are printed).
        #[arg(long)]
        keep: bool,
        /// Random interleavings of the partitions tried (boundary 4).
        #[arg(long, default_value_t = 20)]
        shuffles: u32,
        /// Seed of the shuffles (default: from the clock; printed, so a failure can be rerun).
        #[arg(long)]
        seed: Option<u64>,
        /// Print the report as JSON on stdout (no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// Self-contained walk-through: first run, full replay under a fresh group, crash between database commit
    /// and offset commit — the counts stay identical.
    Demo {
        /// Use this Kafka cluster instead of librdkafka's in-process mock cluster. The demo (re)creates the
        /// PostgreSQL schema `replaysafe_demo` (DATABASE_URL, or the local default).
        #[arg(long)]
        brokers: Option<String>,
        /// Events to generate.
        #[arg(long, default_value_t = 600)]
        events: usize,
    },
}

/// `check`: the pipeline file, and optionally the broker and the database.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Also ask the broker whether every topic exists (waiting for unreachable brokers up to --connect-timeout,
    /// then exit 1 naming them).
    #[arg(long)]
    pub connect: bool,
    /// Kafka bootstrap servers for --connect; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Also check, without writing, what the connection's role needs: USAGE on the schema, SELECT, INSERT,
    /// UPDATE, DELETE on every table, sequences, TEMPORARY, the ledger's day partitions.
    #[arg(long)]
    pub database: bool,
    /// With --database: the ledger's day partitions must exist through today + this many days (0 to 366).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=366))]
    pub days: u32,
}

#[derive(Subcommand)]
pub enum OutboxCommand {
    /// Publish the outbox's unpublished rows to Kafka (idempotent producer; key = message_key, header
    /// `replaysafe-delivery` = delivery_key, value = payload), each marked published after the broker's
    /// acknowledgement. Runs until SIGINT/SIGTERM; several relays may run at once.
    Relay {
        /// The pipeline file (its database, `[kafka.properties]`, `[outbox]`).
        #[arg(short, long)]
        config: PathBuf,
        /// The outbox table (its name, `schema.name`, or the projection's name) when the pipeline has several.
        #[arg(long)]
        outbox: Option<String>,
        /// The topic to publish to; overrides `[outbox] topic`.
        #[arg(long)]
        topic: Option<String>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
        /// Exit 0 once no unpublished row is left (batch jobs, tests).
        #[arg(long)]
        until_empty: bool,
        /// Serve /metrics (Prometheus) on this address.
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
    },
}

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Rows and bytes (heap + indexes, as `pg_total_relation_size`) per day partition, bytes per event,
    /// oldest/newest day, the horizon, tombstone and conflict counts, the projected size over the horizon at
    /// the current daily rate, and the pruned offsets. Read-only (counts every row).
    Stats {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Drop the day partitions wholly older than the horizon, purge tombstones and conflicts older than it, and
    /// record per topic/partition the highest offset whose ledger row went (replays reaching it are refused
    /// with exit 2). Safe while `run` runs: lock waits are bounded (--lock-timeout; exit 1 past it).
    Prune {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// Report what would be pruned; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Seconds each lock wait may take (the horizon row, which running batches hold for a moment; the
        /// partitions to drop, which a long reader may hold); past it the prune changes nothing and exits 1.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
        lock_timeout: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum OffsetsCommand {
    /// Write the group's positions per partition as JSON (checkpoints in PostgreSQL win over Kafka's).
    Snapshot {
        /// The pipeline file (its topics and database).
        #[arg(short, long)]
        config: PathBuf,
        /// The group to read.
        #[arg(long)]
        group: String,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
    /// Start the group's partitions explicitly on the log the brokers serve now (after a topic was re-created,
    /// or a failover to another cluster: `run` exits 7): each checkpoint is replaced (the old one kept in
    /// replaysafe_checkpoints_retired) with the chosen offset and the broker's topic id and cluster id.
    Start {
        /// The pipeline file (its topics, group and database).
        #[arg(short, long)]
        config: PathBuf,
        /// Only this topic (default: every topic of the pipeline).
        #[arg(long)]
        topic: Option<String>,
        /// Only this partition (with --topic).
        #[arg(long)]
        partition: Option<i32>,
        #[command(flatten)]
        from: StartFrom,
        /// The group whose checkpoints move (default: the pipeline's group-id).
        #[arg(long)]
        group: Option<String>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
}

/// `offsets start`'s choice of position (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct StartFrom {
    /// From each partition's log start.
    #[arg(long)]
    pub from_earliest: bool,
    /// From the first record at or after this time (RFC 3339 or YYYY-MM-DD), by Kafka's timestamp index.
    #[arg(long)]
    pub from_time: Option<String>,
    /// From this offset (one partition: with --topic and --partition).
    #[arg(long)]
    pub from_offset: Option<i64>,
    /// From MirrorMaker 2's translated offsets of the group, read from `<ALIAS>.checkpoints.internal` on these
    /// brokers (ALIAS: the source cluster's alias in the MirrorMaker 2 configuration).
    #[arg(long, value_name = "ALIAS")]
    pub from_mm2: Option<String>,
}

#[derive(Subcommand)]
pub enum DeadLettersCommand {
    /// Print the unresolved dead letters of the selection (topic, partition, offset, reason, detail; tab
    /// separated, control characters escaped), then a count per reason on stderr.
    List {
        #[command(flatten)]
        select: DeadLetterSelect,
        /// At most this many rows.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
        /// `text`: one tab-separated line per dead letter, control characters and backslashes escaped (`\n`,
        /// `\t`, `\\`, `\u{1b}`); `json`: one JSON object per line (JSON Lines) with the stored key and value in
        /// base64.
        #[arg(long, value_enum, default_value_t = ListFormat::Text)]
        format: ListFormat,
    },
    /// Re-decode the stored records with the current pipeline file and apply them through the batch
    /// transaction (ledger claims, projections); the ones that land (or are duplicates, stale, filtered) are
    /// marked resolved in the same transaction, the others stay unresolved with their new reason. Prints the
    /// accounting line; exit 0 even when some stay unresolved (the line says how many).
    Replay {
        #[command(flatten)]
        select: DeadLetterSelect,
        /// The consumer group written in the ledger rows claimed (default: the pipeline's group-id).
        #[arg(long)]
        group_id: Option<String>,
    },
}

/// The output of `dead-letters list`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ListFormat {
    /// Tab-separated lines, control characters escaped (for people).
    Text,
    /// One JSON object per line, key and value in base64 (for scripts).
    Json,
}

/// Which unresolved dead letters of the pipeline's generation a `dead-letters` command works on.
#[derive(clap::Args)]
pub struct DeadLetterSelect {
    /// The pipeline file (its database, generation and — for replay — fields, filters and projections).
    #[arg(short, long)]
    pub config: PathBuf,
    /// Only this reason (e.g. missing-field, invalid-field, invalid-json, filter-error).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition (needs --topic).
    #[arg(long)]
    pub partition: Option<i32>,
}

impl DeadLetterSelect {
    /// The pipeline, its database and the selection.
    ///
    /// # Errors
    /// The pipeline file's errors; no database.
    pub fn resolve(
        self,
    ) -> anyhow::Result<(
        Arc<config::Pipeline>,
        String,
        replaysafe::ops::dead_letters::Selection,
    )> {
        let p = Arc::new(config::load(&self.config)?);
        let url = database_url(&p)?;
        let sel = replaysafe::ops::dead_letters::Selection {
            reason: self.reason,
            topic: self.topic,
            partition: self.partition,
        };
        Ok((p, url, sel))
    }
}

/// `replaysafe projection …` (docs/replay.md "Change a running pipeline").
#[derive(Subcommand)]
pub enum ProjectionCommand {
    /// Apply the records the ledger claimed before an added projection's hand-over point to that projection
    /// only, then record it active; resumes after an interruption. Production keeps running.
    Build {
        /// The pipeline file with the added projection (the one production runs).
        #[arg(short, long)]
        config: PathBuf,
        /// The projection's `name` (default name: its table's).
        #[arg(long)]
        projection: String,
        /// Read each partition from its first record at or after this time (RFC 3339) instead of its
        /// beginning: the records claimed before it are left out of the projection (counted).
        #[arg(long)]
        from: Option<String>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
    /// Record a projection deleted from the pipeline file as removed: no longer fed; its table is left as is.
    Remove {
        /// The pipeline file without the projection.
        #[arg(short, long)]
        config: PathBuf,
        /// The removed projection's `name`.
        #[arg(long)]
        projection: String,
    },
}

#[derive(clap::Args)]
pub struct BackfillArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Window start: RFC 3339 time or YYYY-MM-DD (UTC midnight), compared with record timestamps.
    #[arg(long)]
    pub from: String,
    /// Stop at the offsets in this snapshot file (`offsets snapshot`).
    #[arg(long, group = "stop")]
    pub to_offsets: Option<PathBuf>,
    /// Stop at this group's current positions.
    #[arg(long, group = "stop")]
    pub to_group: Option<String>,
    /// Stop at the first record at or after this time.
    #[arg(long, group = "stop")]
    pub to: Option<String>,
    /// Keep only records for which this CEL expression over the fields is true.
    #[arg(long)]
    pub filter: Option<String>,
    /// The backfill's own consumer group id (never the production group).
    #[arg(long)]
    pub group_id: String,
    /// Raise the topic's retention.ms when the window could expire during the run.
    #[arg(long)]
    pub ensure_retention: bool,
    /// Print the plan (start/stop offsets, retention check) and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// A partition without a stop position: stop at its current end, skip it, or refuse.
    #[arg(long, value_enum, default_value = "error")]
    pub missing_stop: replaysafe::ops::backfill::MissingStop,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Also commit the backfill group's offsets to Kafka (by default none are: the group never appears in
    /// Kafka; the checkpoints in PostgreSQL are what a rerun resumes from).
    #[arg(long)]
    pub keep_group: bool,
}

#[derive(clap::Args)]
pub struct RebuildArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// First event day (YYYY-MM-DD).
    #[arg(long)]
    pub from: chrono::NaiveDate,
    /// Last event day (YYYY-MM-DD, inclusive).
    #[arg(long)]
    pub to: chrono::NaiveDate,
    /// A fresh group id for the replay.
    #[arg(long)]
    pub group_id: String,
    /// Confirms that every other writer of the projection tables is paused.
    #[arg(long)]
    pub i_paused_other_writers: bool,
    /// Hours of record time read before --from and after --to, to reach events never landed; landed events
    /// are re-read from the offsets the ledger holds for them, however late they arrived.
    #[arg(long, default_value_t = 24)]
    pub slack_hours: i64,
    /// Write the report (JSON) here (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
}

#[derive(Subcommand)]
pub enum VerifyCommand {
    /// Save a counter or sum projection's rows and the ledger's claims per day and consumer group.
    Snapshot {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// The counter or sum projection's table.
        #[arg(long)]
        table: String,
        /// The value column to compare (needed when a sum projection has several).
        #[arg(long)]
        column: Option<String>,
        /// Only rows matching this SQL condition (run read-only), e.g. "day between '2026-07-01' and '2026-07-06'".
        #[arg(long = "where")]
        filter: Option<String>,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare the table now with a snapshot: per day, the change must equal what the backfill landed plus what
    /// other consumer groups claimed in the ledger since the snapshot.
    Diff {
        /// The snapshot taken before the backfill.
        #[arg(long)]
        before: PathBuf,
        /// The backfill report.
        #[arg(long)]
        expect: PathBuf,
    },
}

pub fn parse_time(s: &str) -> anyhow::Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp_millis());
    }
    Err(Error::Usage(format!(
        "`{s}` is neither an RFC 3339 time nor a date (YYYY-MM-DD)"
    ))
    .into())
}

pub fn write_json<T: serde::Serialize>(value: &T, path: Option<&PathBuf>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    match path {
        Some(p) => {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}

pub fn read_json<T: serde::de::DeserializeOwned>(path: &PathBuf) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{}: {e}", path.display())).into())
}

/// The database URL: `[postgres] url`, else `DATABASE_URL`; its origin is noted for connection errors
/// ([`replaysafe::endpoint::note_origin`]), the pipeline's TLS and password keys for every connection to it
/// ([`replaysafe::sink::conninfo::note`]).
pub fn database_url(p: &config::Pipeline) -> anyhow::Result<String> {
    let (url, origin) = match (&p.postgres.url, std::env::var("DATABASE_URL")) {
        (Some(u), _) => (u.clone(), format!("[postgres] url in {}", p.source.path)),
        (None, Ok(u)) => (u, "DATABASE_URL (environment)".to_string()),
        (None, Err(_)) => {
            return Err(Error::Config {
                location: p.source.locate(0),
                message: "no database: set [postgres] url or DATABASE_URL".into(),
            }
            .into())
        }
    };
    replaysafe::endpoint::note_origin(&url, origin);
    replaysafe::sink::conninfo::note(&url, &p.postgres.connection, &p.source.path);
    Ok(url)
}

/// The brokers: `--brokers`, else `[kafka] brokers`, else `KAFKA_BROKERS`; the origin is noted for connection
/// errors.
pub fn brokers(p: &config::Pipeline, flag: Option<String>) -> anyhow::Result<String> {
    let (brokers, origin) = match (flag, &p.kafka.brokers, std::env::var("KAFKA_BROKERS")) {
        (Some(b), _, _) => (b, "--brokers".to_string()),
        (None, Some(b), _) => (b.clone(), format!("[kafka] brokers in {}", p.source.path)),
        (None, None, Ok(b)) => (b, "KAFKA_BROKERS (environment)".to_string()),
        (None, None, Err(_)) => {
            return Err(Error::Config {
                location: p.source.locate(0),
                message: "no Kafka brokers: set [kafka] brokers, KAFKA_BROKERS or --brokers".into(),
            }
            .into())
        }
    };
    replaysafe::endpoint::note_origin(&brokers, origin);
    Ok(brokers)
}

/// What a backfill and a rebuild both resolve first: the pipeline, its brokers and database, the shutdown flag.
pub struct Replay {
    /// The pipeline.
    pub pipeline: Arc<config::Pipeline>,
    /// Kafka bootstrap servers, resolved.
    pub brokers: String,
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// Set on SIGINT/SIGTERM.
    pub shutdown: Arc<AtomicBool>,
}

impl Replay {
    fn new(config: &std::path::Path, flag: Option<String>) -> anyhow::Result<Replay> {
        let pipeline = Arc::new(config::load(config)?);
        Ok(Replay {
            brokers: brokers(&pipeline, flag)?,
            database_url: database_url(&pipeline)?,
            pipeline,
            shutdown: Arc::new(AtomicBool::new(false)),
        })
    }
}

fn progress() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

impl BackfillArgs {
    /// Resolves the arguments into a [`Replay`] and the backfill's options.
    ///
    /// # Errors
    /// The pipeline file's errors; [`Error::Usage`] for a missing window end or an unreadable time or stop file.
    pub fn options(self) -> anyhow::Result<(Replay, BackfillOptions)> {
        let replay = Replay::new(&self.config, self.brokers)?;
        let stop = match (self.to_offsets, self.to_group, self.to) {
            (Some(f), _, _) => StopSpec::Offsets(read_json(&f)?),
            (_, Some(g), _) => StopSpec::Group(g),
            (_, _, Some(t)) => StopSpec::Time(parse_time(&t)?),
            _ => {
                return Err(Error::Usage(
                    "give the window's end: --to-offsets, --to-group or --to".into(),
                )
                .into())
            }
        };
        let opts = BackfillOptions {
            from_ms: parse_time(&self.from)?,
            stop,
            filter: self.filter,
            day_window: None,
            group_id: self.group_id,
            ensure_retention: self.ensure_retention,
            dry_run: self.dry_run,
            missing_stop: self.missing_stop,
            progress: progress(),
            cover: Default::default(),
            keep_group: self.keep_group,
        };
        Ok((replay, opts))
    }
}

impl RebuildArgs {
    /// Resolves the arguments into a [`Replay`] and the rebuild's options.
    ///
    /// # Errors
    /// The pipeline file's errors.
    pub fn options(self) -> anyhow::Result<(Replay, RebuildOptions)> {
        let replay = Replay::new(&self.config, self.brokers)?;
        let opts = RebuildOptions {
            from: self.from,
            to: self.to,
            group_id: self.group_id,
            slack_hours: self.slack_hours,
            others_paused: self.i_paused_other_writers,
            progress: progress(),
        };
        Ok((replay, opts))
    }
}
