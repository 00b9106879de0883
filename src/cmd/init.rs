//! `replaysafe init`: create or upgrade the tables, prune the ledger to its horizon, create day partitions ahead.

use std::path::PathBuf;

use replaysafe::error::Error;
use replaysafe::{config, sink};

use crate::cmd::resolve::database_url;

/// `init`'s arguments.
#[derive(clap::Args)]
pub struct InitArgs {
    /// The pipeline file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Create the ledger's day partitions from its horizon through today + this many days (a role
    /// without DDL needs them; schedule `init` daily). 0 to 366.
    #[arg(long, default_value_t = replaysafe::sink::ledger::DEFAULT_DAYS_AHEAD,
          value_parser = clap::value_parser!(u32).range(0..=366))]
    pub days: u32,
}

/// Creates the tables, prunes and creates partitions; prints what it did.
///
/// # Errors
/// The pipeline file's and the database's errors.
pub fn run(InitArgs { config, days }: InitArgs) -> anyhow::Result<()> {
    let p = config::load(&config)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Runtime::new()?;
    let (dropped, (created, covered), record) = rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        sink::schema::init(&mut client, &p).await?;
        let explain = |e| sink::privileges::explain(e, &p);
        let dropped = sink::ledger::drop_expired_partitions(&mut client, &p)
            .await
            .map_err(explain)?;
        let ahead = sink::ledger::create_partitions_ahead(&mut client, &p, days)
            .await
            .map_err(explain)?;
        let record = sink::projset::load(&client, &p).await?;
        Ok::<_, Error>((dropped, ahead, record))
    })?;
    println!(
        "{}: tables ready in schema {}",
        config.display(),
        p.postgres.schema
    );
    if let Some((from, to)) = covered {
        println!(
            "ledger {}: day partitions {from} through {to} ({} created, {} expired dropped)",
            p.ledger.table,
            created.len(),
            dropped.len()
        );
    }
    // A projection added to a live pipeline (by this init or an earlier start) still has history to build.
    let building = record.iter().flat_map(|r| &r.entries);
    for (name, _) in building.filter(|(_, e)| e.state == sink::projset::State::Building) {
        println!(
            "projection `{name}` is building (fed from its hand-over point on): build its history with \
             `replaysafe projection build --config {} --projection {name}`",
            config.display()
        );
    }
    Ok(())
}
