//! The pipeline file: parsed in two stages, [`raw`] (TOML as written) and [`plan`] (validated, typed).
//!
//! Every error names `file:line:column`. See `reference.toml` for every key, its default and unit.

pub mod connection;
pub mod errors;
pub mod expand;
pub mod fields;
pub mod kafka;
pub mod outbox;
pub mod plan;
pub mod raw;
pub mod registry;
pub mod source;
pub mod timeouts;
pub mod txn;

pub use connection::{ConnectionPlan, SslMode};
pub use errors::{ErrorsPlan, Tolerance};
pub use fields::{DecimalHandling, EpochUnit, FieldPlan, FieldType, Format, IntervalHandling};
pub use kafka::{KafkaPlan, StartPolicy};
pub use outbox::OutboxPlan;
pub use plan::{
    FilterPlan, IdentityPlan, LedgerPlan, Pipeline, PostgresPlan, DEFAULT_FUTURE_DAYS,
    MAX_FUTURE_DAYS,
};
pub use registry::{Encoding, RegistryPlan};
pub use source::Source;
pub use timeouts::Timeouts;

use std::path::Path;

use crate::error::{Error, Result};

/// Reads, parses and validates a pipeline file. Environment: `DATABASE_URL` when `postgres.url` is absent,
/// `KAFKA_BROKERS` when `kafka.brokers` is absent.
///
/// # Errors
/// [`Error::ReadConfig`] when the file cannot be read, [`Error::Config`] (with `file:line:column`) for any
/// syntax error, unknown key, bad type, bad JSON pointer, unknown field reference, invalid SQL identifier or
/// CEL expression that does not compile.
pub fn load(path: &Path) -> Result<Pipeline> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&path.display().to_string(), &text)
}

/// Parses and validates pipeline text; `name` is used in error locations.
///
/// # Errors
/// As [`load`], without the I/O error.
pub fn parse(name: &str, text: &str) -> Result<Pipeline> {
    let src = Source {
        path: name.to_string(),
        text: text.to_string(),
    };
    let raw: raw::RawPipeline = toml::from_str(text).map_err(|e| {
        let location = match e.span() {
            Some(span) => src.locate(span.start),
            None => format!("{name}:1:1"),
        };
        Error::Config {
            location,
            message: without_value(e.message().trim()),
        }
    })?;
    plan::validate(&src, raw)
}

/// A TOML/serde message without the value it quotes (`invalid type: integer `123`, expected a string` →
/// `invalid type: integer, expected a string`): the value may be a secret (a password written as a number).
/// The location still points at it.
fn without_value(message: &str) -> String {
    let quoted = message.starts_with("invalid type: ") || message.starts_with("invalid value: ");
    let (head, tail) = message.split_at(message.find(", expected").unwrap_or(message.len()));
    match head.find(['`', '"']).filter(|_| quoted) {
        Some(i) => format!("{}{tail}", head[..i].trim_end()),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = include_str!("../../reference.toml");

    #[test]
    fn type_errors_do_not_quote_the_value() {
        assert_eq!(
            without_value("invalid type: integer `987654321`, expected a string"),
            "invalid type: integer, expected a string"
        );
        assert_eq!(
            without_value("invalid type: string \"s3cr3t\", expected u32"),
            "invalid type: string, expected u32"
        );
        let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[source]\nformat = \"json\"\nencoding = \"avro\"\n\
                    schema-registry = { url = \"http://x\", username = \"u\", password = 987654321 }\n";
        let e = parse("p.toml", text).unwrap_err().to_string();
        assert!(
            e.contains("invalid type: integer, expected a string") && !e.contains("987654321"),
            "{e}"
        );
    }

    /// A Debezium pipeline with only the built-in fields needs no envelope in its document; a field of its own
    /// (or a JSON pipeline) does.
    #[test]
    fn built_in_fields_only_is_decided_once() {
        let cdc = |fields: &str| {
            format!(
                "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[source]\nformat = \"debezium\"\n{fields}\n\
                 [[projection]]\nkind = \"row\"\ntable = \"a\"\nkey = [\"id\"]\ncolumns = {{ id = \"bigint\" }}\n"
            )
        };
        assert!(parse("a.toml", &cdc("")).unwrap().built_in_fields_only);
        let own =
            cdc("[fields]\nowner = { path = \"/after/owner\", type = \"text\", optional = true }");
        assert!(!parse("b.toml", &own).unwrap().built_in_fields_only);
        assert!(
            !parse("reference.toml", REFERENCE)
                .unwrap()
                .built_in_fields_only
        );
    }

    #[test]
    fn reference_toml_is_a_valid_pipeline() {
        let p = parse("reference.toml", REFERENCE).expect("reference.toml parses");
        assert_eq!(p.projections.len(), 5);
        assert_eq!(p.filters.len(), 1);
    }

    const REFERENCE_DEBEZIUM: &str = include_str!("../../reference-debezium.toml");

    #[test]
    fn reference_debezium_toml_is_a_valid_pipeline_and_sets_every_cdc_key() {
        let p = parse("reference-debezium.toml", REFERENCE_DEBEZIUM).expect("parses");
        assert_eq!(p.format, Format::Debezium);
        assert_eq!(p.projections.iter().filter(|x| x.row.is_some()).count(), 2);
        for k in [
            "format",
            "source-table",
            "columns",
            "unit",
            "version",
            "tombstones",
            "truncate",
            "snapshots",
            "partition-by",
            "absent",
            "new-columns",
            "schema-drift",
            "keyless",
            "interval-handling",
            "transactions",
            "transaction-timeout-ms",
            "transaction-buffer-bytes",
        ] {
            assert!(
                REFERENCE_DEBEZIUM
                    .lines()
                    .any(|l| !l.trim_start().starts_with('#') && l.contains(k)),
                "reference-debezium.toml does not set `{k}`"
            );
        }
        // Snapshot reads skip the outbox by default, reach the counter that includes them.
        let outbox = p
            .projections
            .iter()
            .find(|x| x.name == "account_events")
            .unwrap();
        assert!(outbox.filter.as_ref().unwrap().0.contains("!_snapshot"));
        let counter = p
            .projections
            .iter()
            .find(|x| x.name == "changes_per_day")
            .unwrap();
        assert!(counter.filter.is_none());
    }

    #[test]
    fn reference_toml_documents_every_key() {
        let keys = [
            "brokers",
            "group-id",
            "topics",
            "start",
            "[kafka.properties]",
            "url",
            "schema",
            "connections",
            "lock-timeout-ms",
            "statement-timeout-ms",
            "idle-in-transaction-timeout-ms",
            "sslmode",
            "max-records",
            "max-bytes",
            "linger-ms",
            "max-record-bytes",
            "path",
            "type",
            "time-zone",
            "unit",
            "plausible-range",
            "optional",
            "key",
            "generation",
            "partition-by",
            "table",
            "horizon-days",
            "future-days",
            "columns",
            "name",
            "drop-if",
            "kind",
            "group-by",
            "column",
            "add",
            "filter",
            "sql",
            "setup",
            "payload",
            "version",
            "delete-if",
            "tombstones",
            "[outbox]",
            "keep-days",
            "batch-size",
            "ack-timeout-ms",
            "poll-interval-ms",
        ];
        for k in keys {
            assert!(
                REFERENCE
                    .lines()
                    .any(|l| !l.trim_start().starts_with('#') && l.contains(k)),
                "reference.toml does not set `{k}`"
            );
        }
    }

    /// `batch.max-bytes`: read, defaulted, and a value that is not positive named with its location.
    #[test]
    fn max_bytes_is_read_defaulted_and_validated() {
        let p = parse("reference.toml", REFERENCE).unwrap();
        assert_eq!(p.max_bytes, 8_388_608);
        let set = |v: &str| REFERENCE.replace("max-bytes = 8388608", &format!("max-bytes = {v}"));
        assert_eq!(parse("p.toml", &set("65536")).unwrap().max_bytes, 65536);
        let unset = REFERENCE.replace("max-bytes = 8388608\n", "");
        assert_eq!(
            parse("p.toml", &unset).unwrap().max_bytes,
            plan::DEFAULT_MAX_BYTES
        );
        let e = parse("p.toml", &set("0")).unwrap_err().to_string();
        let line = 1 + REFERENCE
            .lines()
            .position(|l| l.starts_with("max-bytes"))
            .unwrap();
        assert!(e.contains(&format!("p.toml:{line}:")), "{e}");
        assert!(
            e.contains("`max-bytes` must be a positive whole number"),
            "{e}"
        );
    }

    #[test]
    fn examples_parse() {
        parse(
            "examples/demo.toml",
            include_str!("../../examples/demo.toml"),
        )
        .expect("demo pipeline parses");
    }
}
