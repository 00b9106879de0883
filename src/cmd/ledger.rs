//! `replaysafe ledger stats | prune`: the ledger's size per day partition, and the prune to its horizon.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use replaysafe::error::Error;
use replaysafe::{config, ops, sink};

use crate::cmd::resolve::database_url;

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

/// `ledger stats` / `ledger prune` (docs/replay.md "The ledger's lifecycle"): prints the statistics or what
/// the prune did.
///
/// # Errors
/// The pipeline file's and the database's errors; a lock wait past --lock-timeout.
pub fn run(command: LedgerCommand) -> anyhow::Result<()> {
    let (config, json) = match &command {
        LedgerCommand::Stats { config, json } | LedgerCommand::Prune { config, json, .. } => {
            (config.clone(), *json)
        }
    };
    let p = config::load(&config)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Runtime::new()?;
    let out = rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        Ok::<_, Error>(match command {
            LedgerCommand::Stats { .. } => {
                let s = ops::ledger::stats(&client, &p).await?;
                match json {
                    true => format!("{:#}\n", ops::ledger::stats_json(&s)),
                    false => ops::ledger::stats_text(&s),
                }
            }
            LedgerCommand::Prune {
                dry_run,
                lock_timeout,
                ..
            } => {
                let wait = Duration::from_secs(lock_timeout);
                let r = ops::ledger::prune(&mut client, &p, dry_run, wait)
                    .await
                    .map_err(|e| sink::privileges::explain(e, &p))?;
                match json {
                    true => format!("{:#}\n", ops::ledger::prune_json(&r)),
                    false => ops::ledger::prune_text(&p, &r),
                }
            }
        })
    })?;
    print!("{out}");
    Ok(())
}
