//! The command line: the commands (clap), each command's arguments in its module of `cmd`.

use clap::{Parser, Subcommand};

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
    Run(crate::cmd::run::RunArgs),
    /// Apply the records of a file in `kcat -C -J` format (one JSON envelope per line) through the same
    /// decode → batch → transaction → checkpoint path as `run`, without consuming from a broker. Checkpoints go
    /// to a group of the load's own (never the pipeline's unless --take-over); the keys it lands are in the
    /// pipeline's ledger, so `run` later counts them `duplicate`. Exit 0 when the whole file is applied, 1 on a
    /// bad line or runtime failure (earlier lines stay applied; a rerun resumes), 2 when the file cannot be
    /// opened, the database does not match, --group-id is the pipeline's group without --take-over, or a
    /// partition's offsets in the file reach the live topic's end (nothing applied).
    Load(crate::cmd::load::LoadArgs),
    /// Validate the pipeline file (librdkafka properties included) and print the four answers; exit 0 when
    /// valid, 2 when not (or when a `--connect` / `--database` check fails).
    Check(crate::cmd::check::CheckArgs),
    /// Create or upgrade the tables the pipeline needs (run does this too unless --no-ddl), then check them;
    /// prune the ledger to its horizon and create its day partitions ahead. Run it as the tables' owner.
    Init(crate::cmd::init::InitArgs),
    /// The outbox relay (docs/reference.md "Outbox relay").
    Outbox {
        #[command(subcommand)]
        command: crate::cmd::outbox::OutboxCommand,
    },
    /// Another group's positions, read without joining it.
    Offsets {
        #[command(subcommand)]
        command: crate::cmd::offsets::OffsetsCommand,
    },
    /// Change the projections of a running pipeline: build an added one from history, remove one.
    Projection {
        #[command(subcommand)]
        command: crate::cmd::projection::ProjectionCommand,
    },
    /// Replay a window of the topic through the same idempotent path as `run`.
    Backfill(crate::cmd::backfill::BackfillArgs),
    /// Zero a window of event days in the aggregates and the ledger, then replay it under a fresh group.
    Rebuild(crate::cmd::rebuild::RebuildArgs),
    /// Check that an aggregate changed by exactly what a backfill reported; compare your own table with a
    /// shadow projection.
    Verify {
        #[command(subcommand)]
        command: crate::cmd::verify::VerifyCommand,
    },
    /// The pipeline's unresolved dead letters (quarantined records): list them, or re-apply them after a fix.
    DeadLetters {
        #[command(subcommand)]
        command: crate::cmd::dead_letters::DeadLettersCommand,
    },
    /// The ledger's lifecycle: its size per day partition, and the prune to its horizon.
    Ledger {
        #[command(subcommand)]
        command: crate::cmd::ledger::LedgerCommand,
    },
    /// Write a pipeline file from another tool's configuration: a Kafka Connect JDBC sink connector's.
    Import {
        #[command(subcommand)]
        command: crate::cmd::import::ImportCommand,
    },
    /// Prove that replay is harmless for your pipeline on a fixture of its records: twelve boundaries (apply
    /// once, apply twice, a crash between every database and Kafka commit, permitted shuffles, a rebuilt topic, a
    /// resnapshot, an expired ledger entry, two workers and two groups at once, an uncertain commit, batch
    /// boundaries, again into a fresh schema, accounting), each on a scratch schema of your database (dropped unless --keep) and a scratch topic on
    /// librdkafka's embedded mock cluster (or --brokers), the final state compared with the first. Exit 0 when
    /// every boundary passes, 6 when one fails (the diff is printed), 2 for bad usage.
    Prove(crate::cmd::prove::ProveArgs),
    /// Self-contained walk-through: first run, full replay under a fresh group, crash between database commit
    /// and offset commit — the counts stay identical.
    Demo(crate::cmd::demo::DemoArgs),
}
