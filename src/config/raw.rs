//! Stage one: the pipeline file exactly as written (kebab-case keys, unknown keys rejected with file:line).
//! `reference.toml` at the repository root documents every key.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole pipeline file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawPipeline {
    pub kafka: Spanned<RawKafka>,
    #[serde(default)]
    pub postgres: RawPostgres,
    #[serde(default)]
    pub batch: RawBatch,
    #[serde(default)]
    pub source: Option<Spanned<RawSource>>,
    pub fields: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawField>>>>,
    pub identity: Option<Spanned<RawIdentity>>,
    #[serde(default)]
    pub ledger: RawLedger,
    #[serde(default)]
    pub filter: Vec<Spanned<RawFilter>>,
    #[serde(default)]
    pub projection: Vec<Spanned<RawProjection>>,
    pub errors: Option<super::errors::RawErrors>,
    pub outbox: Option<Spanned<super::outbox::RawOutbox>>,
}

/// `[source]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawSource {
    pub format: Spanned<String>,
    pub decimal_handling: Option<Spanned<String>>,
    pub interval_handling: Option<Spanned<String>>,
    pub encoding: Option<Spanned<String>>,
    pub schema_registry: Option<Spanned<super::registry::RawRegistry>>,
    pub transactions: Option<Spanned<String>>,
    pub transaction_timeout_ms: Option<Spanned<i64>>,
    pub transaction_buffer_bytes: Option<Spanned<i64>>,
}

/// `[kafka]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawKafka {
    pub brokers: Option<Spanned<String>>,
    pub group_id: Spanned<String>,
    pub topics: Spanned<Vec<Spanned<String>>>,
    pub start: Option<Spanned<String>>,
    #[serde(default)]
    pub properties: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
}

/// `[postgres]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawPostgres {
    pub url: Option<Spanned<String>>,
    pub schema: Option<Spanned<String>>,
    pub connections: Option<Spanned<i64>>,
    pub lock_timeout_ms: Option<Spanned<i64>>,
    pub statement_timeout_ms: Option<Spanned<i64>>,
    pub idle_in_transaction_timeout_ms: Option<Spanned<i64>>,
    pub manage_schema: Option<Spanned<bool>>,
    pub sslmode: Option<Spanned<String>>,
    pub sslrootcert: Option<Spanned<String>>,
    pub sslcert: Option<Spanned<String>>,
    pub sslkey: Option<Spanned<String>>,
    pub password_file: Option<Spanned<String>>,
}

/// `[batch]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawBatch {
    pub max_records: Option<Spanned<i64>>,
    pub max_bytes: Option<Spanned<i64>>,
    pub linger_ms: Option<Spanned<i64>>,
    pub max_record_bytes: Option<Spanned<i64>>,
}

/// One entry of `[fields]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawField {
    pub path: Spanned<String>,
    #[serde(rename = "type")]
    pub ty: Spanned<String>,
    pub time_zone: Option<Spanned<String>>,
    pub unit: Option<Spanned<String>>,
    pub plausible_range: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub optional: bool,
}

/// `[identity]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawIdentity {
    pub key: Option<Spanned<Vec<Spanned<String>>>>,
    pub generation: Option<Spanned<String>>,
    pub partition_by: Option<Spanned<String>>,
}

/// `[ledger]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLedger {
    pub table: Option<Spanned<String>>,
    pub horizon_days: Option<Spanned<i64>>,
    pub future_days: Option<Spanned<i64>>,
    #[serde(default)]
    pub columns: Vec<Spanned<String>>,
}

/// One `[[filter]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawFilter {
    pub name: Spanned<String>,
    pub drop_if: Spanned<String>,
}

/// One `[[projection]]`; which keys apply depends on `kind`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawProjection {
    pub name: Option<Spanned<String>>,
    pub kind: Spanned<String>,
    pub table: Option<Spanned<String>>,
    pub group_by: Option<Spanned<Vec<Spanned<String>>>>,
    pub column: Option<Spanned<String>>,
    pub add: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    pub sql: Option<Spanned<String>>,
    pub setup: Option<Spanned<String>>,
    pub filter: Option<Spanned<String>>,
    pub payload: Option<Spanned<Vec<Spanned<String>>>>,
    pub key: Option<Spanned<Vec<Spanned<String>>>>,
    pub columns: Option<Spanned<toml::Value>>,
    pub version: Option<Spanned<String>>,
    pub delete_if: Option<Spanned<String>>,
    pub tombstones: Option<Spanned<String>>,
    pub truncate: Option<Spanned<String>>,
    pub source_table: Option<Spanned<String>>,
    pub snapshots: Option<Spanned<String>>,
    pub absent: Option<Spanned<String>>,
    pub new_columns: Option<Spanned<String>>,
    pub schema_drift: Option<Spanned<String>>,
    pub keyless: Option<Spanned<String>>,
}
