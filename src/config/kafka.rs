//! `[kafka]`: group id, topics, start policy and librdkafka properties.
#![allow(
    clippy::disallowed_methods,
    reason = "checks librdkafka properties in a configuration that never connects"
)]

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;

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
            toml::Value::String(s) => {
                let secrecy = match shown(key) {
                    true => super::expand::Secrecy::Public,
                    false => super::expand::Secrecy::Secret,
                };
                super::expand::expand_as(src, s, v.span(), secrecy)?
            }
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
            // `metadata.broker.list` is librdkafka's alias of `bootstrap.servers`.
            "group.id" | "bootstrap.servers" | "metadata.broker.list" | "auto.offset.reset" => {
                return Err(src.error(
                    k.span(),
                    format!("set `{key}` through `group-id`, `brokers` or `start` in [kafka], not in [kafka.properties]"),
                ))
            }
            "isolation.level" => {
                check_isolation(&value).map_err(|m| src.error(k.span(), m))?;
                properties.push((key.to_string(), value));
            }
            _ => {
                check_property(key, &value).map_err(|m| src.error(k.span(), m))?;
                properties.push((key.to_string(), value));
            }
        }
    }
    check_rebalance(&properties).map_err(|(i, m)| {
        let span = rk
            .properties
            .keys()
            .find(|k| k.get_ref() == &properties[i].0)
            .map_or(raw.kafka.span(), |k| k.span());
        src.error(span, m)
    })?;
    check_client(&group_id, &properties).map_err(|(i, m)| {
        let span = rk
            .properties
            .keys()
            .find(|k| i.is_some_and(|i| k.get_ref() == &properties[i].0))
            .map_or(raw.kafka.span(), |k| k.span());
        src.error(span, m)
    })?;
    Ok(KafkaPlan {
        brokers: match &rk.brokers {
            Some(b) => Some(super::expand::expand_as(
                src,
                b.get_ref(),
                b.span(),
                super::expand::Secrecy::Url,
            )?),
            None => None,
        },
        group_id,
        topics,
        start,
        properties,
    })
}

/// `isolation.level` in `[kafka.properties]`: only `read_committed` (what every consumer of replaysafe sets anyway,
/// [`crate::source::kafka::consumer_config`]). With `read_uncommitted` the records of aborted producer
/// transactions are delivered (Kafka's consumer configuration, `isolation.level`; librdkafka CONFIGURATION.md): an
/// aborted record would claim its event id in the ledger before the committed retry, which would then count as a
/// duplicate (case C42).
///
/// # Errors
/// The message naming the key, the value and why.
fn check_isolation(value: &str) -> std::result::Result<(), String> {
    if value == "read_committed" {
        return Ok(());
    }
    Err(format!(
        "`isolation.level` = `{value}` is refused: replaysafe reads with `read_committed` only — with \
         `read_uncommitted` the records of aborted producer transactions would reach the ledger and claim their \
         event ids before the committed retry; remove the key (read_committed is always set)"
    ))
}

/// The eager assignors replaysafe supports under the classic group protocol (librdkafka's default
/// `partition.assignment.strategy` is `range,roundrobin`, and replaysafe keeps it).
const EAGER: [&str; 2] = ["range", "roundrobin"];

/// The consumer group protocols and assignors replaysafe supports (docs/operations.md "Rebalance strategies"):
/// `group.protocol` `classic` (the default) with `partition.assignment.strategy` made of the eager `range` /
/// `roundrobin` or of `cooperative-sticky` alone (incremental rebalancing: only the partitions that move are
/// revoked), or `consumer` (KIP-848, Kafka 4.0+ brokers, librdkafka 2.12+; always incremental; the broker's
/// assignor, `group.remote.assignor` to choose one, and the broker's `group.consumer.session.timeout.ms` /
/// `group.consumer.heartbeat.interval.ms`). A list mixing eager and cooperative assignors is refused (a group
/// cannot rebalance with both; librdkafka refuses it as well), and so are the classic protocol's keys under
/// `consumer` (librdkafka refuses them when the consumer is created).
///
/// # Errors
/// The index in `properties` of the key at fault and the message naming it, its value and what to set.
fn check_rebalance(properties: &[(String, String)]) -> std::result::Result<(), (usize, String)> {
    let last = |key: &str| properties.iter().rposition(|(k, _)| k == key);
    let protocol = last("group.protocol");
    let consumer = match protocol.map(|i| properties[i].1.trim().to_ascii_lowercase()) {
        None => false,
        Some(p) if p == "classic" => false,
        Some(p) if p == "consumer" => true,
        Some(other) => {
            return Err((
                protocol.unwrap_or_default(),
                format!(
                    "`group.protocol` = `{other}` is not supported: `classic` (the default) or `consumer` (KIP-848, \
                     Kafka 4.0+ brokers)"
                ),
            ))
        }
    };
    if consumer {
        for key in [
            "partition.assignment.strategy",
            "session.timeout.ms",
            "heartbeat.interval.ms",
        ] {
            if let Some(i) = last(key) {
                let instead = match key {
                    "partition.assignment.strategy" => "the broker assigns partitions; choose its assignor with \
                                                        `group.remote.assignor` (`uniform` or `range`)",
                    "session.timeout.ms" => "the broker's `group.consumer.session.timeout.ms` applies",
                    _ => "the broker's `group.consumer.heartbeat.interval.ms` applies",
                };
                return Err((
                    i,
                    format!("`{key}` is not used with `group.protocol` = `consumer` (KIP-848): {instead}; remove it"),
                ));
            }
        }
        return Ok(());
    }
    let Some(i) = last("partition.assignment.strategy") else {
        return Ok(());
    };
    let value = &properties[i].1;
    let names: Vec<String> = value
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    let unknown = names
        .iter()
        .find(|n| !EAGER.contains(&n.as_str()) && n.as_str() != "cooperative-sticky");
    let cooperative = names.iter().any(|n| n == "cooperative-sticky");
    let eager = names.iter().any(|n| EAGER.contains(&n.as_str()));
    let why = match (unknown, cooperative && eager, names.is_empty()) {
        (Some(n), _, _) => format!("`{n}` is not an assignor replaysafe supports"),
        (None, true, _) => {
            "eager and cooperative assignors cannot be mixed in one group".to_string()
        }
        (None, false, true) => "it names no assignor".to_string(),
        (None, false, false) => return Ok(()),
    };
    Err((
        i,
        format!(
            "`partition.assignment.strategy` = `{value}` is refused: {why}; use `range`, `roundrobin` or both \
             (eager, the default `range,roundrobin`), or `cooperative-sticky` alone (incremental), or \
             `group.protocol` = `consumer` (docs/operations.md \"Rebalance strategies\")"
        ),
    ))
}

/// Checks one librdkafka property as librdkafka itself does when it is set (`rd_kafka_conf_set`: the name must be
/// a known property, the value valid for it), without creating a client or connecting.
///
/// # Errors
/// The message naming the property and librdkafka's reason.
fn check_property(key: &str, value: &str) -> std::result::Result<(), String> {
    let mut c = ClientConfig::new();
    c.set(key, value);
    let secret = !shown(key) && !value.is_empty();
    let shown = if secret { "(not shown)" } else { value };
    let hide = |m: String| {
        if secret {
            m.replace(value, "(not shown)")
        } else {
            m
        }
    };
    match c.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, desc, _, _)) => Err(hide(format!(
            "librdkafka property `{key}` = `{shown}` is refused: {desc} (librdkafka CONFIGURATION.md lists the \
             properties)"
        ))),
        Err(e) => Err(hide(format!("librdkafka property `{key}`: {e}"))),
    }
}

/// Whether a librdkafka property holds a secret whose value is never shown in a message: passwords
/// (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`), passphrases, client secrets and credentials,
/// private keys (`ssl.key.pem`, `sasl.oauthbearer.assertion.private.key.pem`), the JAAS and OAUTHBEARER
/// configurations, and the Java clients' `basic.auth.user.info`.
pub(crate) fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "passphrase",
        "secret",
        "credential",
        "private",
        "ssl.key.pem",
        "jaas",
        "oauthbearer.config",
        "token",
        "user.info",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Whether librdkafka knows the property `key` (a misspelled or Java-only key is unknown).
fn known(key: &str) -> bool {
    let mut c = ClientConfig::new();
    c.set(key, "");
    !matches!(
        c.create_native_config(),
        Err(KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            ..
        ))
    )
}

/// Whether a message may show the value of property `key`: only a property librdkafka knows that is no
/// secret ([`is_secret`]) — a misspelled secret key (`sasl.pasword`) is unknown, its value never shown.
pub(crate) fn shown(key: &str) -> bool {
    known(key) && !is_secret(key)
}

/// Builds the consumer the pipeline's properties configure — the same forced settings as `run`, but no
/// `bootstrap.servers`, so nothing connects — and drops it: librdkafka checks the properties together when a
/// client is created (e.g. `max.poll.interval.ms` must be at least `session.timeout.ms`). Done when the pipeline
/// file is loaded, before any command touches the database.
///
/// # Errors
/// The index of the first property the message names (if any) and the message.
fn check_client(
    group_id: &str,
    properties: &[(String, String)],
) -> std::result::Result<(), (Option<usize>, String)> {
    let mut c = ClientConfig::new();
    c.set("group.id", group_id);
    for (k, v) in properties {
        c.set(k, v);
    }
    c.set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set_log_level(RDKafkaLogLevel::Emerg);
    match c.create::<BaseConsumer>() {
        Ok(consumer) => {
            drop(consumer);
            Ok(())
        }
        Err(e) => {
            let mut msg = match &e {
                KafkaError::ClientCreation(m) => m.clone(),
                other => other.to_string(),
            };
            // librdkafka may quote a value: none that may be a secret is shown.
            for (k, v) in properties {
                if !v.is_empty() && !shown(k) {
                    msg = msg.replace(v.as_str(), "(not shown)");
                }
            }
            // librdkafka names the SASL mechanism's value, not the key (`No provider for SASL mechanism GSSAPI`).
            let named = properties
                .iter()
                .position(|(k, _)| msg.contains(k.as_str()))
                .or_else(|| {
                    let sasl = msg.contains("SASL mechanism");
                    properties
                        .iter()
                        .position(|(k, _)| sasl && k == "sasl.mechanism")
                });
            Err((
                named,
                format!(
                    "[kafka.properties] refused by librdkafka when building the consumer: {msg}"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_invalid_properties_are_named() {
        let e = check_property("sesion.timeout.ms", "6000").unwrap_err();
        assert!(
            e.contains("`sesion.timeout.ms`") && e.contains("No such configuration property"),
            "{e}"
        );
        let e = check_property("session.timeout.ms", "soon").unwrap_err();
        assert!(
            e.contains("`session.timeout.ms`") && e.contains("Invalid value"),
            "{e}"
        );
        check_property("session.timeout.ms", "6000").unwrap();
    }

    #[test]
    fn the_brokers_alias_is_refused_like_bootstrap_servers() {
        let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[kafka.properties]\n\"metadata.broker.list\" = \"h:9092\"\n\
                    [fields]\nevent_id = { path = \"/event_id\", type = \"uuid\" }\n[identity]\nkey = [\"event_id\"]\n";
        let e = crate::config::parse("p.toml", text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:5:") && e.contains("metadata.broker.list"),
            "{e}"
        );
        let typo = text.replace(
            "metadata.broker.list\" = \"h:9092",
            "sesion.timeout.ms\" = \"6000",
        );
        let e = crate::config::parse("p.toml", &typo)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:5:") && e.contains("`sesion.timeout.ms`"),
            "{e}"
        );
    }

    /// SASL/SCRAM needs librdkafka built with OpenSSL (rdkafka's `ssl` feature, Cargo.toml); GSSAPI (Kerberos)
    /// would need the `gssapi` feature and Cyrus SASL, which replaysafe does not build: it is refused when the
    /// pipeline file is loaded, naming the property.
    #[test]
    fn librdkafka_has_tls_and_scram_but_no_gssapi() {
        let native = ClientConfig::new().create_native_config().unwrap();
        let features = native.get("builtin.features").unwrap();
        for needed in ["ssl", "sasl_scram", "sasl_plain"] {
            assert!(
                features.split(',').any(|f| f == needed),
                "{needed} not in {features}"
            );
        }
        let props = [
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.mechanism".to_string(), "GSSAPI".to_string()),
        ];
        let (i, m) = check_client("g", &props).unwrap_err();
        assert!(m.contains("GSSAPI"), "{m}");
        assert_eq!(i, Some(1), "the message points at sasl.mechanism: {m}");
        let ok = [
            ("security.protocol".to_string(), "SASL_SSL".to_string()),
            ("sasl.mechanism".to_string(), "SCRAM-SHA-512".to_string()),
            ("sasl.username".to_string(), "u".to_string()),
            ("sasl.password".to_string(), "p".to_string()),
        ];
        check_client("g", &ok).unwrap();
    }

    /// A misspelled or Java-style secret key is unknown to librdkafka: its value is never shown, neither is an
    /// invalid value of a secret property.
    #[test]
    fn values_of_unknown_and_secret_properties_are_not_shown() {
        for (k, v) in [
            ("sasl.pasword", "hunter2-a"),
            ("basic.auth.user.info", "u:hunter2-b"),
            ("sasl.oauthbearer.client.secrett", "hunter2-c"),
        ] {
            let e = check_property(k, v).unwrap_err();
            assert!(e.contains(k) && !e.contains(v), "{e}");
        }
        let e = check_property("session.timeout.ms", "soon").unwrap_err();
        assert!(e.contains("`soon`"), "a known, public value is shown: {e}");
        assert!(shown("sasl.username") && !shown("sasl.password") && !shown("sasl.pasword"));
    }

    #[test]
    fn secret_properties_are_known() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "sasl.jaas.config",
        ] {
            assert!(is_secret(k), "{k}");
        }
        for k in [
            "sasl.username",
            "sasl.mechanism",
            "ssl.ca.location",
            "security.protocol",
        ] {
            assert!(!is_secret(k), "{k}");
        }
    }

    #[test]
    fn read_uncommitted_is_refused_naming_the_key_and_line() {
        let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[kafka.properties]\n\"isolation.level\" = \"read_uncommitted\"\n\
                    [fields]\nevent_id = { path = \"/event_id\", type = \"uuid\" }\n[identity]\nkey = [\"event_id\"]\n";
        let e = crate::config::parse("p.toml", text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:5:")
                && e.contains("`isolation.level`")
                && e.contains("read_uncommitted"),
            "{e}"
        );
        let ok = text.replace("read_uncommitted", "read_committed");
        crate::config::parse("p.toml", &ok).unwrap();
    }

    /// The supported protocols and assignors pass (and librdkafka builds a consumer with them); the others are
    /// refused naming the key, the value and what to use instead.
    #[test]
    fn rebalance_strategies_supported_and_refused() {
        let props = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for ok in [
            props(&[]),
            props(&[("partition.assignment.strategy", "range")]),
            props(&[("partition.assignment.strategy", "roundrobin")]),
            props(&[("partition.assignment.strategy", "range,roundrobin")]),
            props(&[("partition.assignment.strategy", "cooperative-sticky")]),
            props(&[
                ("group.protocol", "classic"),
                ("partition.assignment.strategy", "cooperative-sticky"),
            ]),
            props(&[("group.protocol", "consumer")]),
            props(&[
                ("group.protocol", "consumer"),
                ("group.remote.assignor", "range"),
            ]),
        ] {
            check_rebalance(&ok).unwrap();
            check_client("g", &ok).unwrap_or_else(|(_, m)| panic!("{ok:?}: {m}"));
        }
        let refused = [
            (
                props(&[("partition.assignment.strategy", "range,cooperative-sticky")]),
                0,
                "cannot be mixed",
            ),
            (
                props(&[("partition.assignment.strategy", "sticky")]),
                0,
                "`sticky` is not an assignor",
            ),
            (
                props(&[("partition.assignment.strategy", " , ")]),
                0,
                "names no assignor",
            ),
            (
                props(&[("group.protocol", "next")]),
                0,
                "`group.protocol` = `next` is not supported",
            ),
            (
                props(&[
                    ("group.protocol", "consumer"),
                    ("partition.assignment.strategy", "cooperative-sticky"),
                ]),
                1,
                "`group.remote.assignor`",
            ),
            (
                props(&[
                    ("session.timeout.ms", "6000"),
                    ("group.protocol", "consumer"),
                ]),
                0,
                "`group.consumer.session.timeout.ms`",
            ),
            (
                props(&[
                    ("group.protocol", "consumer"),
                    ("heartbeat.interval.ms", "1000"),
                ]),
                1,
                "`group.consumer.heartbeat.interval.ms`",
            ),
        ];
        for (p, at, says) in refused {
            let (i, m) = check_rebalance(&p).unwrap_err();
            assert_eq!(i, at, "{m}");
            assert!(m.contains(says), "{m}");
        }
        // In a pipeline file: exit 2 naming file:line of the key.
        let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[kafka.properties]\n\"group.protocol\" = \"consumer\"\n\
                    \"partition.assignment.strategy\" = \"range\"\n\
                    [fields]\nevent_id = { path = \"/event_id\", type = \"uuid\" }\n[identity]\nkey = [\"event_id\"]\n";
        let e = crate::config::parse("p.toml", text).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_CONFIG);
        let e = e.to_string();
        assert!(
            e.starts_with("p.toml:6:") && e.contains("`partition.assignment.strategy` is not used"),
            "{e}"
        );
    }

    #[test]
    fn properties_are_checked_together_without_connecting() {
        check_client("g", &[("session.timeout.ms".into(), "6000".into())]).unwrap();
        let props = [
            ("session.timeout.ms".to_string(), "60000".to_string()),
            ("max.poll.interval.ms".to_string(), "10000".to_string()),
        ];
        let (i, m) = check_client("g", &props).unwrap_err();
        assert!(i.is_some(), "{m}");
        assert!(m.contains("max.poll.interval.ms"), "{m}");
    }
}
