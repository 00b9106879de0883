//! `replaysafe dead-letters list|replay`: the unresolved dead letters of the pipeline's generation, and
//! re-applying them after a fix.
//!
//! `replay` reads the stored raw key and value of each selected dead letter back from
//! `replaysafe_dead_letters`, decides it again with the *current* pipeline file ([`crate::engine::decide()`]:
//! decode, filters) and applies it through the engine's batch path ([`crate::engine::apply::apply_batch`]:
//! retries, record-by-record isolation) on a [`Sink::replaying`] connection — one transaction per batch of a
//! partition holding the horizon check, the ledger claims (a record already applied is a `duplicate`, never
//! counted twice), the projections over the rows claimed, and the resolution of its dead letters: landed ones
//! get `resolved_by` = the delivery key, duplicate/stale/filtered ones a `replay: …` note, and records failing
//! again stay unresolved with their new reason and detail. No checkpoint moves and nothing is committed to
//! Kafka. A value above `batch.max-record-bytes` was not kept (only its size and SHA-256): it is left as is and
//! counted `not kept` — replay that window with `backfill` instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::engine::apply::{apply_batch, Applied};
use crate::error::{Error, Result};
use crate::model::{Batch, Item, Tally};
use crate::sink::dead_letters::DEAD_LETTERS;
use crate::sink::Sink;

/// Which dead letters a command works on (always the unresolved ones of the pipeline's generation).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only this reason (`missing-field`, `invalid-field`, …).
    pub reason: Option<String>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only this partition (with `topic`).
    pub partition: Option<i32>,
}

/// One unresolved dead letter, as `list` prints it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The record's timestamp, milliseconds since the Unix epoch (none when the record had none).
    pub timestamp_ms: Option<i64>,
    /// Reason.
    pub reason: String,
    /// Detail.
    pub detail: String,
    /// The record's key as stored (raw bytes; none for a null key).
    pub key: Option<Vec<u8>>,
    /// The record's value as stored (raw bytes; none for a null value or one above `batch.max-record-bytes`).
    pub value: Option<Vec<u8>>,
    /// The value's size in bytes when it was not kept.
    pub value_bytes: Option<i32>,
    /// The value's SHA-256 when it was not kept.
    pub value_sha256: Option<Vec<u8>>,
}

impl Listed {
    /// The text line of `dead-letters list`: topic, partition, offset, reason and detail separated by tabs, each
    /// with its control characters and backslashes escaped ([`crate::printable::escape_controls`]), so one dead
    /// letter is one line and nothing of a record acts on a terminal.
    pub fn text_line(&self) -> String {
        use crate::printable::escape_controls as e;
        format!(
            "{}\t{}\t{}\t{}\t{}",
            e(&self.topic),
            self.partition,
            self.offset,
            e(&self.reason),
            e(&self.detail)
        )
    }

    /// The JSON object of `dead-letters list --format json` (one per line, JSON Lines): `topic`, `partition`,
    /// `offset`, `timestamp_ms`, `reason`, `detail` (JSON strings, control characters escaped by JSON), `key`
    /// and `value` (the stored bytes in standard base64 with padding, RFC 4648 § 4; `null` for none),
    /// `value_bytes` and `value_sha256` (hex): the size and digest of the value as it arrived, whether or not its
    /// bytes were kept (`null` for a record without a value).
    pub fn json(&self) -> serde_json::Value {
        use base64::Engine;
        let b64 = |b: &Option<Vec<u8>>| {
            b.as_ref()
                .map(|b| base64::engine::general_purpose::STANDARD.encode(b))
        };
        serde_json::json!({
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "reason": self.reason,
            "detail": self.detail,
            "key": b64(&self.key),
            "value": b64(&self.value),
            "value_bytes": self.value_bytes,
            "value_sha256": self.value_sha256.as_ref().map(hex::encode),
        })
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    /// The outcomes of the records applied again (they add up to the dead letters replayed).
    pub tally: Tally,
    /// Dead letters whose value was not kept (above `batch.max-record-bytes`): left unresolved.
    pub not_kept: u64,
    /// Dead letters of the selection still unresolved afterwards.
    pub unresolved: i64,
}

impl Replayed {
    /// `replayed N = landed a + duplicate b + … ; still unresolved U (not kept K)`.
    pub fn line(&self) -> String {
        format!(
            "replayed {}; still unresolved {} (value not kept: {})",
            self.tally.line().trim_start_matches("consumed "),
            self.unresolved,
            self.not_kept
        )
    }
}

/// The selection's `WHERE` (parameters `$1` generation, `$2` reason, `$3` topic, `$4` partition; nulls match
/// everything).
const WHERE: &str =
    "generation = $1 AND resolved_at IS NULL AND ($2::text IS NULL OR reason = $2) \
     AND ($3::text IS NULL OR topic = $3) AND ($4::int IS NULL OR partition = $4)";

fn generation(p: &Pipeline) -> String {
    p.identity.generation.clone().unwrap_or_default()
}

async fn connect(p: &Pipeline, url: &str) -> Result<Client> {
    let mut client = crate::sink::connect_with(url, &p.postgres.timeouts).await?;
    // Creates or checks the tables; with `manage-schema = false` only checks them (no DDL).
    crate::sink::verify::prepare(&mut client, p).await?;
    Ok(client)
}

fn check(sel: &Selection) -> Result<()> {
    if sel.partition.is_some() && sel.topic.is_none() {
        return Err(Error::Usage("--partition needs --topic".into()));
    }
    // A misspelled reason would select nothing and look like "no dead letters".
    let mut names = crate::decode::rejection::Reason::ALL
        .map(|r| r.as_str())
        .to_vec();
    names.push(crate::sink::dead_letters::SUPERSEDED);
    if let Some(r) = sel.reason.as_deref().filter(|r| !names.contains(r)) {
        return Err(Error::Usage(format!(
            "--reason `{r}` is not a quarantine reason; one of: {}",
            names.join(", ")
        )));
    }
    Ok(())
}

/// The unresolved dead letters of the selection, in topic, partition, offset order (at most `limit`).
///
/// # Errors
/// [`Error::Usage`] for `--partition` without `--topic`; a database error.
pub fn list(p: &Pipeline, url: &str, sel: &Selection, limit: i64) -> Result<Vec<Listed>> {
    check(sel)?;
    let rt = runtime()?;
    rt.block_on(async {
        // Read only: no schema work (a missing table is PostgreSQL's error).
        let client = crate::sink::connect_with(url, &p.postgres.timeouts).await?;
        let sql = format!(
            "SELECT topic, partition, \"offset\", reason, detail, key, value, value_bytes, value_sha256, \
             (extract(epoch FROM record_timestamp) * 1000)::bigint FROM {} WHERE {WHERE} \
             ORDER BY topic, partition, \"offset\" LIMIT $5",
            p.table(DEAD_LETTERS)
        );
        let rows = client
            .query(
                &sql,
                &[
                    &generation(p),
                    &sel.reason,
                    &sel.topic,
                    &sel.partition,
                    &limit,
                ],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Listed {
                topic: r.get(0),
                partition: r.get(1),
                offset: r.get(2),
                reason: r.get(3),
                detail: r.get(4),
                key: r.get(5),
                value: r.get(6),
                value_bytes: r.get(7),
                value_sha256: r.get(8),
                timestamp_ms: r.get(9),
            })
            .collect())
    })
}

/// How many unresolved dead letters the selection holds per reason — all of them, whatever `list`'s limit.
///
/// # Errors
/// [`Error::Usage`] for `--partition` without `--topic`; a database error.
pub fn count(p: &Pipeline, url: &str, sel: &Selection) -> Result<BTreeMap<String, i64>> {
    check(sel)?;
    let rt = runtime()?;
    rt.block_on(async {
        let client = crate::sink::connect_with(url, &p.postgres.timeouts).await?;
        let sql = format!(
            "SELECT reason, count(*) FROM {} WHERE {WHERE} GROUP BY reason",
            p.table(DEAD_LETTERS)
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&generation(p), &sel.reason, &sel.topic, &sel.partition];
        let rows = client.query(&sql, &params).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))
}

/// Re-applies the selected dead letters with the current pipeline (see the module documentation); `group`
/// (default: the pipeline's `group-id`) is the consumer group written in the ledger rows claimed.
///
/// # Errors
/// [`Error::Usage`] for `--partition` without `--topic`; [`Error::Schema`] when the database does not match
/// the pipeline; a database error that retries do not cure, or `shutdown` (what was committed stays: a rerun
/// goes on with what is still unresolved).
pub fn replay(
    pipeline: Arc<Pipeline>,
    url: &str,
    sel: &Selection,
    group: Option<&str>,
    shutdown: Arc<AtomicBool>,
) -> Result<Replayed> {
    check(sel)?;
    let rt = runtime()?;
    rt.block_on(async {
        let client = connect(&pipeline, url).await?;
        let mut sink = Sink::open(pipeline.clone(), url).await?.replaying();
        // After the sink read the record's version: a projection added later fails the first batch instead.
        refuse_while_building(&client, &pipeline).await?;
        refuse_two_logs(&client, &pipeline, sel).await?;
        if let Some(g) = group {
            sink = sink.with_group(g);
        }
        let give_up = move || shutdown.load(Ordering::Relaxed);
        let mut out = Replayed::default();
        let mut after: (String, i32, i64) = (String::new(), -1, -1);
        loop {
            let page = read_page(&client, &pipeline, sel, &after).await?;
            let Some(last) = page.last() else { break };
            after = (last.0.clone(), last.1, last.2.offset);
            for batch in batches(&pipeline, page, &mut out.not_kept) {
                if give_up() {
                    return Err(Error::Other(
                        "interrupted: the batches committed so far stay resolved; rerun to go on"
                            .into(),
                    ));
                }
                match apply_batch(&mut sink, &batch, &give_up).await? {
                    Applied::Committed(outcomes) => outcomes.iter().for_each(|o| out.tally.add(o)),
                    other => {
                        return Err(Error::Other(format!(
                            "{}/{}: unexpected result of a dead-letter replay batch: {other:?}",
                            batch.topic, batch.partition
                        )))
                    }
                }
            }
        }
        let count = format!(
            "SELECT count(*) FROM {} WHERE {WHERE}",
            pipeline.table(DEAD_LETTERS)
        );
        out.unresolved = client
            .query_one(
                &count,
                &[
                    &generation(&pipeline),
                    &sel.reason,
                    &sel.topic,
                    &sel.partition,
                ],
            )
            .await?
            .get(0);
        Ok(out)
    })
}

/// Refuses a replay while a projection of the ledger is `building`: the replay would feed it the records it
/// claims below the projection's hand-over point, and `projection build` would apply them again (it applies
/// every record claimed at its position below the hand-over) — or, once the build passed them, never.
///
/// # Errors
/// [`Error::Usage`] naming the projections to build first.
async fn refuse_while_building(client: &Client, p: &Pipeline) -> Result<()> {
    let Some(record) = crate::sink::projset::load(client, p).await? else {
        return Ok(());
    };
    let building: Vec<&str> = record
        .entries
        .iter()
        .filter(|(_, e)| e.state == crate::sink::projset::State::Building)
        .map(|(n, _)| n.as_str())
        .collect();
    if building.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "projection(s) {} of ledger {} are being built: replaying dead letters now would apply them to the \
         building projection twice (by the replay and by the build) or not at all. Finish the build first \
         (`replaysafe projection build --config FILE --projection NAME`), then replay",
        building.join(", "),
        p.ledger.table
    )))
}

/// A dead letter read back: topic, partition, the record as an item (its value `None` when not kept), and
/// whether the value was kept.
type Stored = (String, i32, Item, bool);

/// Refuses a selection holding dead letters of two logs at one offset (a topic re-created, or another cluster,
/// then `offsets start`: their `log` tags differ, docs/guarantees.md "A recreated topic, another cluster"): a replay settles
/// dead letters by topic, partition and offset and cannot tell the two apart.
///
/// # Errors
/// [`Error::Usage`] naming up to three such offsets; a database error.
async fn refuse_two_logs(client: &Client, p: &Pipeline, sel: &Selection) -> Result<()> {
    let sql = format!(
        "SELECT topic, partition, \"offset\" FROM {} WHERE {WHERE} GROUP BY topic, partition, \"offset\" \
         HAVING count(DISTINCT log) > 1 ORDER BY 1, 2, 3 LIMIT 3",
        p.table(DEAD_LETTERS)
    );
    let rows = client
        .query(
            &sql,
            &[&generation(p), &sel.reason, &sel.topic, &sel.partition],
        )
        .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let at: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}/{}@{}",
                r.get::<_, String>(0),
                r.get::<_, i32>(1),
                r.get::<_, i64>(2)
            )
        })
        .collect();
    Err(Error::Usage(format!(
        "the selection holds unresolved dead letters of two logs at the same offset ({}; their `log` column \
         differs: a re-created topic or another cluster); a replay cannot tell them apart: resolve the old log's \
         rows by hand (UPDATE {} SET resolved_at = now(), resolved_by = '…' WHERE id = …) or narrow the selection; \
         nothing was replayed",
        at.join(", "),
        p.table(DEAD_LETTERS)
    )))
}

/// The next page of the selection after `after` (topic, partition, offset), in that order.
async fn read_page(
    client: &Client,
    p: &Pipeline,
    sel: &Selection,
    after: &(String, i32, i64),
) -> Result<Vec<Stored>> {
    let sql = format!(
        "SELECT topic, partition, \"offset\", (extract(epoch FROM record_timestamp) * 1000)::bigint, key, value, \
         value IS NOT NULL OR value_bytes IS NULL FROM {} WHERE {WHERE} AND (topic, partition, \"offset\") > ($5, $6, $7) \
         ORDER BY topic, partition, \"offset\" LIMIT $8",
        p.table(DEAD_LETTERS)
    );
    let limit = crate::units::bigint_len(p.max_records);
    let rows = client
        .query(
            &sql,
            &[
                &generation(p),
                &sel.reason,
                &sel.topic,
                &sel.partition,
                &after.0,
                &after.1,
                &after.2,
                &limit,
            ],
        )
        .await?;
    let page: Vec<Stored> = rows
        .iter()
        .map(|r| {
            let key: Option<Vec<u8>> = r.get(4);
            let value: Option<Vec<u8>> = r.get(5);
            let pending = crate::engine::decide(p, key.as_deref(), value.as_deref(), None);
            let item = Item {
                offset: r.get(2),
                timestamp_ms: r.get(3),
                key,
                value,
                pending,
            };
            (r.get(0), r.get(1), item, r.get(6))
        })
        .collect();
    // A schema registry that does not answer is not the record's fault: stop, nothing replayed.
    for (_, _, item, _) in &page {
        if let crate::model::Pending::Quarantine(r) = &item.pending {
            if r.reason == crate::decode::Reason::RegistryUnavailable {
                return Err(crate::error::Error::Other(r.detail.clone()));
            }
        }
    }
    Ok(page)
}

/// Groups a page into one batch per partition (offsets ascending); dead letters whose value was not kept are
/// counted in `not_kept` and left out.
fn batches(p: &Pipeline, page: Vec<Stored>, not_kept: &mut u64) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    for (topic, partition, item, kept) in page {
        if !kept {
            *not_kept += 1;
            continue;
        }
        let end = item.offset + 1;
        match out.last_mut() {
            Some(b)
                if b.topic == topic
                    && b.partition == partition
                    && b.items.len() < p.max_records =>
            {
                b.end = end;
                b.items.push(item);
            }
            _ => out.push(Batch {
                topic,
                partition,
                fence: 0,
                expected: None,
                end,
                items: vec![item],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Listed;

    fn hostile() -> Listed {
        Listed {
            topic: "t".into(),
            partition: 0,
            offset: 7,
            timestamp_ms: Some(1),
            reason: "invalid-json".into(),
            detail: "bad \u{1b}[2J\nforged\tline\\n".into(),
            key: Some(b"k\x1b]0;x\x07\n".to_vec()),
            value: Some(vec![0, 0x1b, b'\n', 0xff]),
            value_bytes: None,
            value_sha256: None,
        }
    }

    #[test]
    fn the_text_line_is_one_line_without_control_characters() {
        let line = hostile().text_line();
        assert_eq!(
            line,
            "t\t0\t7\tinvalid-json\tbad \\u{1b}[2J\\nforged\\tline\\\\n"
        );
        assert_eq!(line.matches('\t').count(), 4);
        assert!(!line.chars().any(|c| c.is_control() && c != '\t'));
    }

    #[test]
    fn the_json_line_round_trips_the_bytes() {
        use base64::Engine;
        let l = hostile();
        let text = l.json().to_string();
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let bytes = |k: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(v[k].as_str().unwrap())
                .unwrap()
        };
        assert_eq!(Some(bytes("key")), l.key);
        assert_eq!(Some(bytes("value")), l.value);
        assert_eq!(v["detail"].as_str(), Some(l.detail.as_str()));
        assert!(v["value_bytes"].is_null());
    }
}
