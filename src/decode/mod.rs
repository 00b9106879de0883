//! Decoding a record into the pipeline's typed fields: [`json`] events, or [`debezium`] change events whose
//! flat document the same `[fields]` read. A record that cannot be decoded becomes a [`Rejection`] (quarantined).

pub mod avro;
pub mod day;
pub mod debezium;
pub mod framed;
#[cfg(test)]
mod fuzz;
pub mod json;
pub mod protobuf;
pub mod registry;
pub mod rejection;

use chrono::NaiveDate;

use crate::config::Pipeline;

pub use json::{decode, CelValue, FieldValue, Fields};
pub use rejection::{Reason, Rejection};

/// A decoded record.
#[derive(Debug)]
pub enum Decoded {
    /// The record's fields, and for Debezium pipelines its change.
    Fields {
        /// The typed fields.
        fields: Fields,
        /// The row change (Debezium pipelines).
        change: Option<std::sync::Arc<debezium::Change>>,
    },
    /// Not a row change (heartbeat, transaction metadata, logical message, Kafka tombstone on a CDC topic):
    /// counted as filtered under this built-in rule name.
    Skip(&'static str),
}

/// Decodes a record of either format (see [`crate::config::Format`]).
///
/// # Errors
/// A [`Rejection`] saying why the record must be quarantined.
pub fn record(
    pipeline: &Pipeline,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
) -> Result<Decoded, Rejection> {
    if let Some(v) = value {
        json::check_size(pipeline, v)?;
    }
    let value = framed::unframe(pipeline, value, "value")?;
    let value = value.as_deref();
    if pipeline.format == crate::config::Format::Json {
        return decode(pipeline, value).map(|fields| Decoded::Fields {
            fields,
            change: None,
        });
    }
    let key = framed::unframe(pipeline, key, "key")?;
    let doc = if pipeline.built_in_fields_only {
        debezium::envelope::Doc::BuiltIns
    } else {
        debezium::envelope::Doc::Full
    };
    match debezium::envelope::decode_with(key.as_deref(), value, old_key, doc)? {
        debezium::Record::Skip(rule) => Ok(Decoded::Skip(rule)),
        debezium::Record::Change(change, doc) => {
            let fields = pipeline
                .fields
                .iter()
                .map(|f| json::field(f, &doc))
                .collect::<Result<Fields, Rejection>>()?;
            Ok(Decoded::Fields {
                fields,
                change: Some(change),
            })
        }
    }
}

/// The partition-by day of a decoded record, when the pipeline has one.
pub fn partition_day(pipeline: &Pipeline, fields: &Fields) -> Option<NaiveDate> {
    let i = pipeline.identity.partition_by?;
    fields[i].as_ref().and_then(|v| day::parse(&v.text))
}

/// The delivery key of a decoded record, as the ledger's primary key holds it: the generation (`""` for
/// none), the `[identity] key` fields' normalised text (UUIDs hyphenated lower case), then the `partition-by`
/// day when it is not already a key field. `None` when a key field is absent (an optional field left out).
pub fn delivery_key<'a>(pipeline: &'a Pipeline, fields: &'a Fields) -> Option<Vec<&'a str>> {
    let mut key = Vec::with_capacity(pipeline.identity.key.len() + 2);
    key.push(pipeline.identity.generation.as_deref().unwrap_or(""));
    for &i in &pipeline.identity.key {
        key.push(fields[i].as_ref()?.text.as_str());
    }
    if let Some(pb) = pipeline.identity.partition_by {
        if !pipeline.identity.key.contains(&pb) {
            key.push(fields[pb].as_ref()?.text.as_str());
        }
    }
    Some(key)
}
