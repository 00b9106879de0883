//! What several commands resolve alike, once: the pipeline's brokers and database (with where each came from,
//! for connection errors), times, JSON files, and the [`Replay`] builder of backfill and rebuild.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use replaysafe::config;
use replaysafe::error::Error;

/// Milliseconds since the epoch of an RFC 3339 time or a date (`YYYY-MM-DD`, UTC midnight).
///
/// # Errors
/// [`Error::Usage`] naming the text when it is neither.
pub fn parse_time(s: &str) -> anyhow::Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .expect("00:00:00 is a time of every day")
            .and_utc()
            .timestamp_millis());
    }
    Err(Error::Usage(format!(
        "`{s}` is neither an RFC 3339 time nor a date (YYYY-MM-DD)"
    ))
    .into())
}

/// Writes `value` as pretty JSON to `path`, or stdout.
///
/// # Errors
/// Writing the file.
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

/// Reads JSON from `path`.
///
/// # Errors
/// Reading the file; [`Error::Usage`] naming the file when it is not the JSON expected.
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
    /// Loads the pipeline and resolves its brokers and database.
    ///
    /// # Errors
    /// The pipeline file's errors; no brokers or no database.
    pub fn new(config: &std::path::Path, flag: Option<String>) -> anyhow::Result<Replay> {
        let pipeline = Arc::new(config::load(config)?);
        Ok(Replay {
            brokers: brokers(&pipeline, flag)?,
            database_url: database_url(&pipeline)?,
            pipeline,
            shutdown: Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Whether progress bars are drawn: stderr is a terminal.
pub fn progress() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}
