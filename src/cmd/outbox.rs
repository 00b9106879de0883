//! `replaysafe outbox relay`: the outbox's unpublished rows to Kafka.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Subcommand;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url};
use crate::cmd::signals;

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

/// Relays the outbox until a signal (or empty with --until-empty); prints what it published.
///
/// # Errors
/// The pipeline file's errors and what stopped the relay.
pub fn run(command: OutboxCommand) -> anyhow::Result<()> {
    let OutboxCommand::Relay {
        config,
        outbox,
        topic,
        brokers: flag,
        until_empty,
        metrics_addr,
    } = command;
    let p = Arc::new(config::load(&config)?);
    let opts = ops::outbox::RelayOptions {
        brokers: brokers(&p, flag)?,
        database_url: database_url(&p)?,
        outbox,
        topic,
        until_empty,
        shutdown: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.shutdown.clone());
    let _metrics_rt;
    if let Some(addr) = metrics_addr {
        // Its worker serves /metrics until the relay returns.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        {
            let _guard = rt.enter();
            replaysafe::metrics_http::install(addr, &replaysafe::metrics_http::labels(&p))?;
        }
        replaysafe::metrics_http::register(&p);
        // /healthz and /readyz: the relay's loop is the heartbeat, no partitions to hold, the database probed.
        replaysafe::health::relay_only();
        replaysafe::sink::probe::spawn_probe(rt.handle(), p.clone(), opts.database_url.clone());
        replaysafe::db_gauges::spawn(rt.handle(), p.clone(), opts.database_url.clone());
        _metrics_rt = rt;
    }
    let (table, topic, n) = ops::outbox::relay(p, &opts).context("outbox relay failed")?;
    println!("outbox {table} → topic {topic}: published {n}");
    Ok(())
}
