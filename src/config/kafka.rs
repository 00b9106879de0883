//! `[kafka]`: group id, topics, start policy and librdkafka properties.

use super::raw::RawPipeline;
use super::source::Source;
use crate::error::Result;

/// Where a group with no checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPolicy {
    /// The oldest offset the broker still has.
    Earliest,
    /// The end of the partition (only records produced from now on).
    Latest,
}

/// `[kafka]`, validated.
#[derive(Debug, Clone)]
pub struct KafkaPlan {
    /// `bootstrap.servers`; `None` means "take `KAFKA_BROKERS` or `--brokers`".
    pub brokers: Option<String>,
    /// The consumer group (also the checkpoint's owner).
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// `None`: a partition with neither checkpoint nor committed offset is an error (exit 3).
    pub start: Option<StartPolicy>,
    /// Passed to librdkafka as is (after the forced settings are checked).
    pub properties: Vec<(String, String)>,
}

/// `[kafka]`: group id, topics (legal Kafka names), `start`, and the librdkafka properties replaysafe does not
/// own.
pub(crate) fn kafka(src: &Source, raw: &RawPipeline) -> Result<KafkaPlan> {
    let rk = raw.kafka.get_ref();
    let group_id = rk.group_id.get_ref().trim().to_string();
    if group_id.is_empty() {
        return Err(src.error(rk.group_id.span(), "`group-id` must not be empty"));
    }
    if rk.topics.get_ref().is_empty() {
        return Err(src.error(rk.topics.span(), "`topics` must name at least one topic"));
    }
    let mut topics = Vec::new();
    for t in rk.topics.get_ref() {
        let name = t.get_ref();
        let legal = !name.is_empty()
            && name.len() <= 249
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !legal || name == "." || name == ".." {
            return Err(src.error(
                t.span(),
                format!("`{name}` is not a legal Kafka topic name (ASCII letters, digits, `.`, `_`, `-`, at most 249)"),
            ));
        }
        topics.push(name.clone());
    }
    let start = match &rk.start {
        None => None,
        Some(s) => Some(match s.get_ref().as_str() {
            "earliest" => StartPolicy::Earliest,
            "latest" => StartPolicy::Latest,
            other => {
                return Err(src.error(
                    s.span(),
                    format!("`start` must be \"earliest\" or \"latest\", not `{other}`"),
                ))
            }
        }),
    };
    let mut properties = Vec::new();
    for (k, v) in &rk.properties {
        let key = k.get_ref().as_str();
        let value = match v.get_ref() {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => {
                return Err(src.error(
                    v.span(),
                    format!("librdkafka property `{key}` must be a string, integer or boolean"),
                ))
            }
        };
        match key {
            "enable.auto.commit" | "enable.auto.offset.store" if value != "false" => {
                return Err(src.error(
                    k.span(),
                    format!("`{key}` is forced to false: offsets are committed only after the database transaction"),
                ))
            }
            "group.id" | "bootstrap.servers" | "auto.offset.reset" => {
                return Err(src.error(
                    k.span(),
                    format!("set `{key}` through `group-id`, `brokers` or `start` in [kafka], not in [kafka.properties]"),
                ))
            }
            _ => properties.push((key.to_string(), value)),
        }
    }
    Ok(KafkaPlan {
        brokers: rk.brokers.as_ref().map(|b| b.get_ref().clone()),
        group_id,
        topics,
        start,
        properties,
    })
}
