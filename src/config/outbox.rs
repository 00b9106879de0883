//! `[outbox]`: the outbox relay's settings (`replaysafe outbox relay`, `run --relay`; docs/reference.md "Outbox
//! relay"): the topic it publishes to, how many rows one round takes, how long it waits for the broker's
//! acknowledgement, how often it looks for new rows, and how long published rows are kept (`ledger prune`).

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::source::Source;
use crate::error::Result;

/// Default `outbox.keep-days`: published rows are kept this many days after their `published_at`.
pub const DEFAULT_KEEP_DAYS: u32 = 7;
/// Default `outbox.batch-size`: rows one relay round locks and publishes at most.
pub const DEFAULT_BATCH_SIZE: u32 = 500;
/// Default `outbox.ack-timeout-ms`: how long a round waits for the broker to acknowledge a message
/// (librdkafka's `message.timeout.ms`).
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 10_000;
/// Default `outbox.poll-interval-ms`: the pause after a round that found nothing to publish.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 200;

/// `[outbox]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawOutbox {
    pub topic: Option<Spanned<String>>,
    pub keep_days: Option<Spanned<i64>>,
    pub batch_size: Option<Spanned<i64>>,
    pub ack_timeout_ms: Option<Spanned<i64>>,
    pub poll_interval_ms: Option<Spanned<i64>>,
}

/// `[outbox]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxPlan {
    /// The topic the relay publishes to (`--topic` wins); `None`: `--topic` is required.
    pub topic: Option<String>,
    /// Published rows older than this many days (by `published_at`) are deleted by `ledger prune`
    /// ([`crate::projection::outbox::purge_published`]); 0 to 36500.
    pub keep_days: u32,
    /// Rows one round locks and publishes at most (1 to 100000).
    pub batch_size: u32,
    /// The broker acknowledgement bound (librdkafka `message.timeout.ms`); below
    /// `[postgres] idle-in-transaction-timeout-ms`, since the round's transaction stays open meanwhile.
    pub ack_timeout: Duration,
    /// The pause after a round that found nothing to publish (10 ms to 60 s).
    pub poll_interval: Duration,
}

impl Default for OutboxPlan {
    fn default() -> OutboxPlan {
        OutboxPlan {
            topic: None,
            keep_days: DEFAULT_KEEP_DAYS,
            batch_size: DEFAULT_BATCH_SIZE,
            ack_timeout: Duration::from_millis(DEFAULT_ACK_TIMEOUT_MS),
            poll_interval: Duration::from_millis(DEFAULT_POLL_INTERVAL_MS),
        }
    }
}

fn within(
    src: &Source,
    v: &Option<Spanned<i64>>,
    key: &str,
    range: (i64, i64),
    default: i64,
) -> Result<i64> {
    match v {
        None => Ok(default),
        Some(s) if (range.0..=range.1).contains(s.get_ref()) => Ok(*s.get_ref()),
        Some(s) => Err(src.error(
            s.span(),
            format!(
                "`outbox.{key}` must be a whole number between {} and {}",
                range.0, range.1
            ),
        )),
    }
}

/// Validates `[outbox]` (absent: the defaults). `topics` are the pipeline's `[kafka] topics` (the relay must not
/// publish into what the pipeline consumes), `idle_ms` its `idle-in-transaction-timeout-ms`, `has_outbox`
/// whether a projection has `kind = "outbox"`.
///
/// # Errors
/// [`crate::error::Error::Config`] (`file:line:column`) for an illegal or consumed topic, a number out of
/// range, an `ack-timeout-ms` not below the idle-in-transaction timeout, or `[outbox]` without an outbox
/// projection.
pub fn outbox(
    src: &Source,
    raw: Option<&Spanned<RawOutbox>>,
    topics: &[String],
    idle_ms: u64,
    has_outbox: bool,
) -> Result<OutboxPlan> {
    let Some(spanned) = raw else {
        return Ok(OutboxPlan::default());
    };
    if !has_outbox {
        return Err(src.error(
            spanned.span(),
            "[outbox] configures the outbox relay, but no [[projection]] has kind = \"outbox\"",
        ));
    }
    let raw = spanned.get_ref();
    let topic = match &raw.topic {
        None => None,
        Some(t) => Some(topic(src, t, topics)?),
    };
    let ack = within(
        src,
        &raw.ack_timeout_ms,
        "ack-timeout-ms",
        (1, i64::from(i32::MAX)),
        crate::units::bigint(DEFAULT_ACK_TIMEOUT_MS),
    )?;
    let ack = u64::try_from(ack).expect("at least 1, checked by within");
    if ack >= idle_ms {
        let span = raw
            .ack_timeout_ms
            .as_ref()
            .map_or(spanned.span(), |s| s.span());
        return Err(src.error(
            span,
            format!(
                "`outbox.ack-timeout-ms` ({ack}) must be below `postgres.idle-in-transaction-timeout-ms` ({idle_ms}): \
                 a relay round keeps its transaction open while it waits for the broker"
            ),
        ));
    }
    Ok(OutboxPlan {
        topic,
        keep_days: within(
            src,
            &raw.keep_days,
            "keep-days",
            (0, 36_500),
            i64::from(DEFAULT_KEEP_DAYS),
        )
        .map(|d| u32::try_from(d).expect("0..=36500, checked by within"))?,
        batch_size: within(
            src,
            &raw.batch_size,
            "batch-size",
            (1, 100_000),
            i64::from(DEFAULT_BATCH_SIZE),
        )
        .map(|n| u32::try_from(n).expect("1..=100000, checked by within"))?,
        ack_timeout: Duration::from_millis(ack),
        poll_interval: Duration::from_millis(
            within(
                src,
                &raw.poll_interval_ms,
                "poll-interval-ms",
                (10, 60_000),
                crate::units::bigint(DEFAULT_POLL_INTERVAL_MS),
            )
            .map(crate::units::count)?,
        ),
    })
}

/// A legal Kafka topic name that the pipeline does not consume.
fn topic(src: &Source, t: &Spanned<String>, consumed: &[String]) -> Result<String> {
    let name = t.get_ref();
    if let Err(why) = check_topic(name, consumed) {
        return Err(src.error(t.span(), format!("`outbox.topic`: {why}")));
    }
    Ok(name.clone())
}

/// Whether `name` may be the relay's topic: a legal Kafka topic name (ASCII letters, digits, `.`, `_`, `-`, at
/// most 249) and not one of the pipeline's `[kafka] topics` (the pipeline would consume its own output).
///
/// # Errors
/// What is wrong with it, as a sentence.
pub fn check_topic(name: &str, consumed: &[String]) -> std::result::Result<(), String> {
    let legal = !name.is_empty()
        && name.len() <= 249
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !legal || name == "." || name == ".." {
        return Err(format!(
            "`{name}` is not a legal Kafka topic name (ASCII letters, digits, `.`, `_`, `-`, at most 249)"
        ));
    }
    if consumed.iter().any(|c| c == name) {
        return Err(format!(
            "`{name}` is one of the pipeline's [kafka] topics: the relay would feed the pipeline its own output"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    fn parse(extra: &str) -> crate::Result<super::OutboxPlan> {
        let text = format!(
            "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nid = {{ path = \"/id\", type = \"text\" }}\n\
             [identity]\nkey = [\"id\"]\n[[projection]]\nkind = \"outbox\"\n{extra}"
        );
        crate::config::parse("p.toml", &text).map(|p| p.outbox)
    }

    #[test]
    fn defaults_values_and_errors() {
        assert_eq!(parse("").unwrap(), super::OutboxPlan::default());
        let p = parse("[outbox]\ntopic = \"out.events\"\nkeep-days = 0\nbatch-size = 3\nack-timeout-ms = 500\n").unwrap();
        assert_eq!(
            (
                p.topic.as_deref(),
                p.keep_days,
                p.batch_size,
                p.ack_timeout.as_millis()
            ),
            (Some("out.events"), 0, 3, 500)
        );
        let e = parse("[outbox]\ntopic = \"t\"\n").unwrap_err().to_string();
        assert!(
            e.starts_with("p.toml:11:9: `outbox.topic`: `t` is one of the pipeline's"),
            "{e}"
        );
        let e = parse("[outbox]\ntopic = \"a b\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a legal Kafka topic name"), "{e}");
        let e = parse("[outbox]\nbatch-size = 0\n").unwrap_err().to_string();
        assert!(
            e.starts_with("p.toml:11:14: `outbox.batch-size` must be a whole number between 1"),
            "{e}"
        );
        let e = parse("[outbox]\nack-timeout-ms = 20000\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:11:18: `outbox.ack-timeout-ms` (20000) must be below"),
            "{e}"
        );
        let e = parse("[outbox]\nkeep-day = 3\n").unwrap_err().to_string();
        assert!(e.contains("p.toml:11:1") && e.contains("keep-day"), "{e}");
        let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nid = { path = \"/id\", type = \"text\" }\n\
                    [identity]\nkey = [\"id\"]\n[outbox]\ntopic = \"o\"\n";
        let e = crate::config::parse("p.toml", text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:8:1: [outbox] configures the outbox relay, but no"),
            "{e}"
        );
    }
}
