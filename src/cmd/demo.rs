//! `replaysafe demo`: a self-contained walk-through of replays that change nothing.

/// `demo`'s arguments.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Use this Kafka cluster instead of librdkafka's in-process mock cluster. The demo (re)creates the
    /// PostgreSQL schema `replaysafe_demo` (DATABASE_URL, or the local default).
    #[arg(long)]
    pub brokers: Option<String>,
    /// Events to generate.
    #[arg(long, default_value_t = 600)]
    pub events: usize,
}

/// Runs the walk-through on librdkafka's mock cluster (or --brokers) and the database of `DATABASE_URL`.
///
/// # Errors
/// What stopped the demo.
pub fn run(DemoArgs { brokers, events }: DemoArgs) -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| replaysafe::demo::DEFAULT_DATABASE_URL.to_string());
    replaysafe::demo::demo(brokers, &url, events)?;
    Ok(())
}
