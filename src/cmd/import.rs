//! `replaysafe import`: a pipeline file written from another tool's configuration.

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;
use replaysafe::error::Error;
use replaysafe::ops;

#[derive(Subcommand)]
pub enum ImportCommand {
    /// Read a Kafka Connect JDBC sink connector's configuration — Debezium's
    /// (io.debezium.connector.jdbc.JdbcSinkConnector) or Confluent's (io.confluent.connect.jdbc.JdbcSinkConnector
    /// with Debezium's ExtractNewRecordState), as JSON for the Connect REST API ({"name": …, "config": {…}} or the
    /// config map) or a connect-standalone properties file — and write the equivalent pipeline file: one row
    /// projection per table the connector writes. Every key not carried over is named, with why, on stderr and
    /// at the end of the file; no secret is copied (passwords are read from the files
    /// ${REPLAYSAFE_DB_PASSWORD_FILE} and ${REPLAYSAFE_REGISTRY_PASSWORD_FILE} name). Exit 0 when written, 2 when a
    /// setting cannot make a pipeline (each named at its file:line:column; nothing written) or the output file
    /// exists.
    Connector(ConnectorArgs),
}

/// `import connector`.
#[derive(clap::Args)]
pub struct ConnectorArgs {
    /// The connector configuration (JSON, or Java properties).
    pub file: PathBuf,
    /// Write the pipeline here (refused when the file exists); default: stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// A topic to read, for a connector that names its topics by `topics.regex` (repeat it; each must match).
    #[arg(long = "topic", value_name = "TOPIC")]
    pub topics: Vec<String>,
    /// `[postgres] schema` of the pipeline: its tables and replaysafe's own, beside the connector's.
    #[arg(long, default_value = "replica")]
    pub schema: String,
}

/// Writes the pipeline (stdout or `--output`) and the notes (stderr).
///
/// # Errors
/// [`Error::ReadConfig`] when the file cannot be read, [`Error::Usage`] (exit 2) for a setting that cannot make
/// a pipeline or an existing output file, the write's I/O error.
pub fn run(command: ImportCommand) -> anyhow::Result<()> {
    match command {
        ImportCommand::Connector(a) => {
            let text = std::fs::read_to_string(&a.file).map_err(|source| Error::ReadConfig {
                path: a.file.clone(),
                source,
            })?;
            let imported = ops::import::connector(
                &a.file.display().to_string(),
                &text,
                &ops::import::Options {
                    topics: a.topics,
                    schema: a.schema,
                },
            )?;
            for n in &imported.notes {
                eprintln!(
                    "note: {}",
                    replaysafe::printable::terminal_safe(&n.to_string())
                );
            }
            match &a.output {
                Some(path) => {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(path)
                        .map_err(|e| match e.kind() {
                            std::io::ErrorKind::AlreadyExists => Error::Usage(format!(
                                "{} exists: remove it or write elsewhere (-o)",
                                path.display()
                            )),
                            _ => Error::Other(format!("cannot create {}: {e}", path.display())),
                        })?;
                    f.write_all(imported.pipeline.as_bytes())?;
                    eprintln!(
                        "wrote {} ({} note{}); next: replaysafe check --config {}",
                        path.display(),
                        imported.notes.len(),
                        if imported.notes.len() == 1 { "" } else { "s" },
                        path.display()
                    );
                }
                None => print!("{}", imported.pipeline),
            }
            Ok(())
        }
    }
}
