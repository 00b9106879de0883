//! The fingerprint of a pipeline's definition as far as what it counts is concerned, written into backfill
//! reports and `verify` snapshots so that `verify diff` compares only what one pipeline produced.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::config::fields::field_definition;
use crate::config::Pipeline;

/// SHA-256 (64 hex digits) over what decides which records are claimed and what each adds to a projection:
/// the ledger table, the identity (generation, key fields and the partition-by field, each with its
/// definition: path, type, unit, time zone), the `[[filter]]` rules (name and expression, in order) and every
/// projection's settings (kind, filter, table, group-by, targets, the definition of each field it reads — as
/// recorded in `replaysafe_projection_set`). Batch sizes, timeouts, Kafka and connection settings are not
/// part of it.
pub fn pipeline_fingerprint(p: &Pipeline) -> String {
    let field = |i: usize| {
        let f = &p.fields[i];
        format!("{} {}", f.name.as_str(), field_definition(f))
    };
    let mut d: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    d.insert("ledger", p.ledger.table.to_string().into());
    d.insert(
        "generation",
        p.identity.generation.clone().unwrap_or_default().into(),
    );
    d.insert(
        "key",
        p.identity
            .key
            .iter()
            .map(|&i| field(i))
            .collect::<Vec<_>>()
            .into(),
    );
    d.insert(
        "partition-by",
        p.identity
            .partition_by
            .map(field)
            .unwrap_or_default()
            .into(),
    );
    d.insert(
        "filters",
        p.filters
            .iter()
            .map(|f| format!("{}: {}", f.name, f.expr))
            .collect::<Vec<_>>()
            .into(),
    );
    let projections: BTreeMap<&str, &BTreeMap<String, String>> = p
        .projections
        .iter()
        .map(|x| (x.name.as_str(), &x.settings))
        .collect();
    d.insert(
        "projections",
        serde_json::to_value(projections).unwrap_or_default(),
    );
    let text = serde_json::to_string(&d).unwrap_or_default();
    hex::encode(Sha256::digest(text.as_bytes()))
}
