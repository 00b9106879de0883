//! `replaysafe projection build | remove` (docs/replay.md "Change a running pipeline").

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Subcommand;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url, parse_time};
use crate::cmd::signals;

/// `projection`'s subcommands.
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

/// Builds an added projection's history, or records one removed; prints the result.
///
/// # Errors
/// The pipeline file's errors and the build's or removal's refusals.
pub fn run(command: ProjectionCommand) -> anyhow::Result<()> {
    match command {
        ProjectionCommand::Build {
            config,
            projection,
            from,
            brokers: flag,
        } => {
            let p = Arc::new(config::load(&config)?);
            let opts = ops::projection::BuildOptions {
                brokers: brokers(&p, flag)?,
                database_url: database_url(&p)?,
                projection: projection.clone(),
                from_ms: from.as_deref().map(parse_time).transpose()?,
                shutdown: Arc::new(AtomicBool::new(false)),
            };
            signals(opts.shutdown.clone());
            let s = ops::projection::build(p, opts)?;
            if s.already_complete {
                println!("projection `{projection}`: active, nothing to build");
            } else {
                let t = &s.tally;
                println!(
                    "projection `{projection}` built: applied {}, skipped {} (not claimed at that offset before the \
                     hand-over: claimed elsewhere, after it, or never — e.g. a dead letter), filtered {}, quarantined {}, claimed before --from {}",
                    t.landed,
                    t.duplicate,
                    t.filtered.values().sum::<u64>(),
                    t.quarantined.values().sum::<u64>(),
                    s.before_start
                );
            }
            Ok(())
        }
        ProjectionCommand::Remove { config, projection } => {
            let p = config::load(&config)?;
            let table = ops::projection::remove(&p, &database_url(&p)?, &projection)?;
            println!(
                "projection `{projection}` removed: no longer fed; its table {} is left as it is",
                table.as_deref().unwrap_or("(none)")
            );
            Ok(())
        }
    }
}
