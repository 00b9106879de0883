//! `replaysafe check --connect` and `--database`: what a pipeline needs from the broker (its topics) and from
//! the database (privileges, tables, ledger partitions), checked without consuming or writing. `run` uses the
//! topic check before it touches the database.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::sink::privileges::{self, Finding};

/// How long one topic's metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// The pipeline's topics the broker does not know, asked with the pipeline's consumer configuration (its
/// `[kafka.properties]` and `extra`, without the group: nothing joins, nothing is created — consumers do not
/// auto-create topics by default).
///
/// # Errors
/// [`Error::Kafka`] when the broker cannot be asked.
pub fn missing_topics(
    p: &Pipeline,
    brokers: &str,
    extra: &[(String, String)],
) -> Result<Vec<String>> {
    let mut config = crate::source::kafka::consumer_config(p, brokers, extra);
    config.remove("group.id");
    let consumer: BaseConsumer = config.create()?;
    let mut missing = Vec::new();
    for t in &p.kafka.topics {
        let md = consumer.fetch_metadata(Some(t), METADATA_TIMEOUT)?;
        let found = md
            .topics()
            .iter()
            .any(|x| x.name() == t && x.error().is_none() && !x.partitions().is_empty());
        if !found {
            missing.push(t.clone());
        }
    }
    Ok(missing)
}

/// The cluster id and the topic ids (KIP-516) of the pipeline's topics but `missing`, as `run` records them
/// beside each checkpoint ([`crate::source::kafka::log_ids`]), for `check --connect`.
///
/// # Errors
/// [`Error::Kafka`] / [`Error::Other`] when the broker cannot be asked.
pub fn log_ids(
    p: &Pipeline,
    brokers: &str,
    missing: &[String],
) -> Result<crate::source::kafka::LogIds> {
    let mut config = crate::source::kafka::consumer_config(p, brokers, &[]);
    config.remove("group.id");
    let consumer: BaseConsumer = config.create()?;
    let topics: Vec<String> = p
        .kafka
        .topics
        .iter()
        .filter(|t| !missing.contains(t))
        .cloned()
        .collect();
    crate::source::kafka::log_ids(&consumer, &topics)
}

/// Refuses, before anything is created, a pipeline whose topics the broker does not have.
///
/// # Errors
/// [`Error::Usage`] naming every missing topic; [`Error::Kafka`] when the broker cannot be asked.
pub fn require_topics(p: &Pipeline, brokers: &str, extra: &[(String, String)]) -> Result<()> {
    let missing = missing_topics(p, brokers, extra)?;
    if missing.is_empty() {
        return Ok(());
    }
    let names = missing
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let (what, verb) = match missing.len() {
        1 => ("topic", "does"),
        _ => ("topics", "do"),
    };
    Err(Error::Usage(format!(
        "{}: {what} {names} of [kafka] topics {verb} not exist on the broker ({}); nothing was created or \
         consumed",
        p.source.path,
        crate::endpoint::mask_urls(brokers)
    )))
}

/// `check --database`: connects and runs [`privileges::check_database`] (a read-only transaction) and
/// [`crate::sink::schema::destination_findings`] (the projections' destination columns; not checked, and said
/// so, when the role lacks a privilege it needs).
///
/// # Errors
/// [`Error::Postgres`] when it cannot connect or query.
pub fn database(p: &Pipeline, url: &str, days: u32) -> Result<Vec<Finding>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    rt.block_on(async {
        let mut client = crate::sink::connect_with(url, &p.postgres.timeouts).await?;
        let mut out = privileges::check_database(&mut client, p, days).await?;
        // The destination's columns (a privilege the role lacks for it is named above, and again here).
        match crate::sink::schema::destination_findings(&mut client, p).await {
            Ok(found) => out.extend(found),
            Err(Error::Postgres(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                out.push(Finding {
                    ok: false,
                    what: format!(
                        "destination column types not checked: {}",
                        e.as_db_error()
                            .map_or_else(|| e.to_string(), |d| d.message().to_string())
                    ),
                });
            }
            Err(e) => return Err(e),
        }
        Ok(out)
    })
}

/// What `check` warns about from the pipeline file alone: interval columns declared in a row projection's
/// `columns` while `[source] interval-handling` is `numeric` (the default, as Debezium's).
pub fn warnings(p: &Pipeline) -> Vec<String> {
    if p.format != crate::config::Format::Debezium
        || p.interval_handling != crate::config::IntervalHandling::Numeric
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for proj in &p.projections {
        for c in proj.row.iter().flat_map(|r| r.columns.iter().flatten()) {
            if c.ty.kind == crate::projection::row::Kind::Interval {
                out.push(format!(
                    "row projection `{}`: interval column `{}`: {}",
                    proj.name,
                    c.name.as_str(),
                    crate::projection::row::table::NUMERIC_INTERVAL
                ));
            }
        }
    }
    out
}
