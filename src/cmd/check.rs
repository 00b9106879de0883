//! `replaysafe check`: the pipeline file, and optionally the broker and the database.

use std::path::PathBuf;

use replaysafe::error::Error;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url};

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

/// Prints the four answers, warnings and what `--connect` / `--database` found.
///
/// # Errors
/// The pipeline file's errors; [`Error::Usage`] (exit 2) when a topic is missing or the role lacks something.
pub fn run(a: CheckArgs) -> anyhow::Result<()> {
    let p = config::load(&a.config)?;
    // The four answers when the file itself is the question; with --connect / --database what those find is.
    if a.connect || a.database {
        println!(
            "{}: valid (`check` without --connect/--database prints its four answers)",
            a.config.display()
        );
    } else {
        println!("{}: valid\n\n{}", a.config.display(), p.four_answers());
    }
    for w in ops::check::warnings(&p) {
        println!("\nwarning: {w}");
    }
    if let Ok(url) = database_url(&p) {
        // How the database is reached (TLS, where the password comes from), never a secret.
        println!("\n{}", replaysafe::sink::conninfo::summary(&url)?);
    } else if let Some(f) = &p.postgres.connection.password_file {
        // No URL here (DATABASE_URL may come at run time): the password file is still read, so a wrong path or an
        // empty file is named now rather than at the first connection.
        replaysafe::sink::conninfo::check_password_file(f)?;
        println!(
            "\npostgres: no URL yet ([postgres] url or DATABASE_URL at run time); password from password-file {}",
            f.display()
        );
    }
    let mut failed = Vec::new();
    if a.connect {
        let brokers = brokers(&p, a.brokers)?;
        // With the pipeline's [kafka.properties] (SASL/TLS): a refused password or certificate is named here.
        let probe = replaysafe::source::kafka::consumer_config(&p, &brokers, &[]);
        replaysafe::source::kafka::reachable(&probe, &brokers, &p.kafka.topics[0])?;
        let missing = ops::check::missing_topics(&p, &brokers, &[])?;
        let security = replaysafe::source::kafka::security_summary(&p);
        println!(
            "\nbroker {} ({security}):",
            replaysafe::endpoint::mask_urls(&brokers)
        );
        let ids = ops::check::log_ids(&p, &brokers, &missing)?;
        let shown = |v: Option<&str>| v.unwrap_or("(not answered)").to_string();
        println!(
            "cluster id {} (recorded beside each checkpoint)",
            shown(ids.cluster.as_deref())
        );
        for t in &p.kafka.topics {
            let ok = !missing.contains(t);
            let id = if ok {
                format!(" (topic id {})", shown(ids.topic(t)))
            } else {
                String::new()
            };
            println!("{} topic {t}{id}", if ok { "ok     " } else { "MISSING" });
        }
        if !missing.is_empty() {
            failed.push(format!("topic(s) {} do not exist", missing.join(", ")));
        }
    }
    if a.database {
        let findings = ops::check::database(&p, &database_url(&p)?, a.days)?;
        println!("\ndatabase (read only, schema {}):", p.postgres.schema);
        for f in &findings {
            println!("{f}");
        }
        let bad: Vec<String> = findings
            .into_iter()
            .filter(|f| !f.ok)
            .map(|f| f.what)
            .collect();
        if !bad.is_empty() {
            failed.push(missing_summary(&bad));
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!("{}: {}", a.config.display(), failed.join("; "))).into())
}

/// `check --database`'s error line: how many items are missing and the first three, each without its fix (the
/// lines above give the fixes).
fn missing_summary(bad: &[String]) -> String {
    let names: Vec<&str> = bad
        .iter()
        .take(3)
        .map(|w| w.split(": ").next().unwrap_or(w))
        .collect();
    let more = match bad.len() {
        0..=3 => String::new(),
        n => format!(" (and {} more)", n - 3),
    };
    format!(
        "database: {} item(s) MISSING (each listed above with its fix): {}{more}",
        bad.len(),
        names.join("; ")
    )
}
