//! The library's error type and the process exit codes it maps to.

use std::path::PathBuf;

/// Exit code for success (also after a clean shutdown on SIGINT/SIGTERM).
pub const EXIT_OK: i32 = 0;
/// Exit code for a runtime failure (Kafka fatal error, database gave up, I/O).
pub const EXIT_FAILURE: i32 = 1;
/// Exit code for bad usage, an invalid pipeline file, or a database schema that does not match the pipeline:
/// nothing has been consumed when this is returned. Also a replay reaching offsets a prune dropped from the
/// ledger ([`Error::BelowHorizon`]): nothing of the refused batch or window was committed.
pub const EXIT_CONFIG: i32 = 2;
/// Exit code when a partition has neither a checkpoint nor a committed offset and `kafka.start` is not set
/// (librdkafka's `auto.offset.reset=error` fired). Set `start = "earliest"` or `"latest"` to decide.
pub const EXIT_NO_START_POSITION: i32 = 3;
/// Exit code of `run` when a SIGINT/SIGTERM drain did not finish within `--shutdown-timeout`: what was
/// committed stays committed; the records not applied yet are read again on restart (from the checkpoints).
pub const EXIT_SHUTDOWN_TIMEOUT: i32 = 4;
/// Exit code when the pipeline's declared error tolerance (`[errors]`, default `tolerance = "none"`) stopped it:
/// a partition's records were quarantined for one reason beyond the thresholds. Nothing of the batch that
/// crossed them was committed; fix the pipeline file (or the data) and rerun.
pub const EXIT_TOLERANCE: i32 = 5;
/// Exit code when a partition's checkpoint was written on another log than the one the broker now serves: the
/// topic was deleted and re-created under the same name (another topic id, KIP-516), or the brokers are another
/// cluster (a failover to a MirrorMaker 2 replica): the stored offset means nothing there. Nothing was consumed;
/// the message names the topic, both ids and the stored offset, and the ways forward (docs/guarantees.md "A recreated topic,
/// another cluster").
pub const EXIT_LOG_CHANGED: i32 = 7;

/// Everything that can go wrong in replaysafe.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The pipeline file is invalid; `location` is `file:line:column`.
    #[error("{location}: {message}")]
    Config {
        /// `file:line:column` of the offending key or value.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// A command-line option is refused (e.g. a backfill group id equal to the production group).
    #[error("{0}")]
    Usage(String),
    /// The database schema does not match what the pipeline needs.
    #[error("schema mismatch: {0}")]
    Schema(String),
    /// The connection's role may not do what was asked (create or alter the pipeline's objects); the message
    /// says how to split DDL (`init` by the owner) from the runtime role (docs/operations.md "Privileges").
    #[error("insufficient privilege: {0}")]
    Privilege(String),
    /// A partition has no checkpoint and no committed offset, and `kafka.start` is not set.
    #[error("{0}")]
    NoStartPosition(String),
    /// A PostgreSQL error (the server's message and SQLSTATE when there is one).
    #[error("postgres: {}", pg_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// A Kafka error.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// PostgreSQL or the Kafka brokers could not be reached: names the address (never a password), where the
    /// setting came from and the cause ([`crate::endpoint`]). Exit code 1.
    #[error("{0}")]
    Connect(crate::endpoint::ConnectError),
    /// The declared error tolerance stopped the pipeline (see [`EXIT_TOLERANCE`]).
    #[error("{0}")]
    Tolerance(String),
    /// A replay (backfill, rebuild, a run or load from an earlier position) reaches offsets whose ledger rows a
    /// prune dropped (`replaysafe_pruned`): the ledger can no longer recognise those records as duplicates.
    /// Names the partition and the offset range; nothing of the refused batch is committed. Exit code 2.
    #[error("{0}")]
    BelowHorizon(String),
    /// A checkpoint written on another log (another topic id or cluster id) than the broker's (see
    /// [`EXIT_LOG_CHANGED`]).
    #[error("{0}")]
    LogChanged(String),
    /// Anything else, with context.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The process exit code this error maps to (see the `EXIT_*` constants).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::ReadConfig { .. }
            | Error::Config { .. }
            | Error::Schema(_)
            | Error::Privilege(_)
            | Error::Usage(_)
            | Error::BelowHorizon(_) => EXIT_CONFIG,
            Error::NoStartPosition(_) => EXIT_NO_START_POSITION,
            Error::Tolerance(_) => EXIT_TOLERANCE,
            Error::LogChanged(_) => EXIT_LOG_CHANGED,
            _ => EXIT_FAILURE,
        }
    }
}

fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Shorthand result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
