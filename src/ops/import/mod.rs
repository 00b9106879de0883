//! `replaysafe import connector`: a Kafka Connect JDBC sink connector's configuration — Debezium's
//! (`io.debezium.connector.jdbc.JdbcSinkConnector`) or Confluent's (`io.confluent.connect.jdbc.JdbcSinkConnector`)
//! — read and written as the equivalent pipeline file: a Debezium pipeline with one `row` projection per table the
//! connector writes (docs/switching.md "From a Kafka Connect JDBC sink").
//!
//! Every key is accounted for: carried over (each choice commented in the file), or named in a [`Note`] — not
//! carried over and why, behaving differently in replaysafe, or to check — printed in the file and on stderr.
//! Input that cannot make a pipeline (another database, records that are not Debezium change events, rows keyed by
//! nothing or by their Kafka coordinates, a topic pattern without the topics it stands for, …) is refused with
//! every such key named at its `file:line:column`. Secrets are never copied: passwords are read from files the
//! pipeline names through `${…}` ([`jdbc::PASSWORD_FILE_VAR`], [`converters::REGISTRY_PASSWORD_FILE_VAR`]), and
//! no note quotes a value that could be one.

mod converters;
mod input;
mod jdbc;
mod render;
mod transforms;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::ident::Ident;

pub use converters::REGISTRY_PASSWORD_FILE_VAR;
pub use jdbc::PASSWORD_FILE_VAR;

use input::ConnectorConfig;
use transforms::{DeleteEvent, Transforms};

/// Debezium's JDBC sink connector class.
pub const DEBEZIUM_JDBC_SINK: &str = "io.debezium.connector.jdbc.JdbcSinkConnector";
/// Confluent's JDBC sink connector class.
pub const CONFLUENT_JDBC_SINK: &str = "io.confluent.connect.jdbc.JdbcSinkConnector";

/// What the import was asked besides the file.
#[derive(Debug, Clone)]
pub struct Options {
    /// The topics to read when the connector names them by `topics.regex` (each must match it whole).
    pub topics: Vec<String>,
    /// `[postgres] schema` of the pipeline: where its row tables and its own tables live (not the connector's
    /// schema, so that both can run side by side).
    pub schema: String,
}

/// What a [`Note`] says about its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// The setting is not carried over (and why).
    NotCarried,
    /// Carried over, but replaysafe behaves differently (and how).
    Differs,
    /// A guess the connector config could not settle: check it.
    Check,
}

impl NoteKind {
    fn heading(self) -> &'static str {
        match self {
            NoteKind::NotCarried => "not carried over",
            NoteKind::Differs => "different in replaysafe",
            NoteKind::Check => "check",
        }
    }
}

/// One connector key the pipeline does not carry over as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// What kind of note.
    pub kind: NoteKind,
    /// The connector key (`errors.deadletterqueue.topic.name`).
    pub key: String,
    /// Why, or what to check; never a secret's value.
    pub text: String,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: `{}`: {}", self.kind.heading(), self.key, self.text)
    }
}

/// The notes of one import, in the order found.
#[derive(Debug, Default)]
pub struct Notes(Vec<Note>);

impl Notes {
    fn push(&mut self, kind: NoteKind, key: &str, text: &str) {
        self.0.push(Note {
            kind,
            key: key.to_string(),
            text: text.to_string(),
        });
    }

    /// `key` is not carried over: `text` says why.
    pub fn not_carried(&mut self, key: &str, text: &str) {
        self.push(NoteKind::NotCarried, key, text);
    }

    /// `key` holds a secret, not copied: `text` says where the pipeline reads it from.
    pub fn secret(&mut self, key: &str, text: &str) {
        self.push(NoteKind::NotCarried, key, text);
    }

    /// `key` is carried over, but replaysafe behaves differently: `text` says how.
    pub fn differs(&mut self, key: &str, text: &str) {
        self.push(NoteKind::Differs, key, text);
    }

    /// `key` is a guess to check: `text` says what was assumed.
    pub fn check(&mut self, key: &str, text: &str) {
        self.push(NoteKind::Check, key, text);
    }

    fn names(&self, key: &str) -> bool {
        self.0.iter().any(|n| n.key == key)
    }
}

/// The pipeline file and the notes about it.
#[derive(Debug)]
pub struct Imported {
    /// The pipeline file's text (TOML), its notes as comments at the end.
    pub pipeline: String,
    /// The same notes, for stderr.
    pub notes: Vec<Note>,
}

/// Which connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connector {
    Debezium,
    Confluent,
}

/// What a source delete does to the connector's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletes {
    /// The row is deleted.
    Remove,
    /// The row stays as it was.
    Keep,
    /// The row stays, marked `__deleted = 'true'`.
    Flag,
}

/// One row projection of the pipeline.
#[derive(Debug)]
struct Projection {
    table: String,
    /// Where the connector's own table lives (for the `CREATE TABLE … LIKE` hint).
    connector_table: String,
    topics: Vec<String>,
    table_why: String,
    source_table: Option<String>,
    key: Option<Vec<String>>,
    key_why: String,
    tombstones: &'static str,
    tombstones_why: String,
    truncate: &'static str,
    truncate_why: String,
    new_columns: &'static str,
    new_columns_why: String,
    /// Columns of the connector's table replaysafe does not write (`add.fields`, `__deleted`).
    foreign_columns: Vec<String>,
}

/// Everything the file says.
#[derive(Debug)]
struct Plan {
    file: String,
    name: String,
    class: &'static str,
    group: String,
    topics: Vec<String>,
    topics_why: String,
    start: Option<&'static str>,
    start_why: String,
    encoding: converters::Encoding,
    database: Option<jdbc::Database>,
    schema: String,
    tolerance: Option<&'static str>,
    tolerance_why: String,
    projections: Vec<Projection>,
}

/// A fatal problem: the key and what is wrong.
type Problems = Vec<(String, String)>;

/// Reads the connector configuration `text` (JSON or Java properties; `file` names it in messages) and writes the
/// equivalent pipeline.
///
/// # Errors
/// [`Error::Usage`] (exit 2) when the file is not a connector configuration, `--schema` is no SQL identifier, or
/// any key cannot make a pipeline: every such key named at its `file:line:column` with the reason.
pub fn connector(file: &str, text: &str, opts: &Options) -> Result<Imported> {
    let cfg = ConnectorConfig::parse(file, text)?;
    Ident::new(&opts.schema).map_err(|m| Error::Usage(format!("--schema: {m}")))?;
    let mut notes = Notes::default();
    let mut problems: Problems = Vec::new();
    let (connector, class) = match cfg.get("connector.class") {
        Some(DEBEZIUM_JDBC_SINK) => (Connector::Debezium, DEBEZIUM_JDBC_SINK),
        Some(CONFLUENT_JDBC_SINK) => (Connector::Confluent, CONFLUENT_JDBC_SINK),
        Some(other) => {
            return Err(refusal(
                &cfg,
                &[(
                    "connector.class".to_string(),
                    format!("`{other}` is not a JDBC sink this imports ({DEBEZIUM_JDBC_SINK} or {CONFLUENT_JDBC_SINK})"),
                )],
            ))
        }
        None => {
            return Err(refusal(
                &cfg,
                &[("connector.class".to_string(), "missing: which connector is this?".to_string())],
            ))
        }
    };
    let name = cfg.name.clone().unwrap_or_else(|| {
        std::path::Path::new(file).file_stem().map_or_else(
            || "connector".to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    });
    let (topics, topics_why) = topics(&cfg, opts, &mut notes, &mut problems);
    let transforms = transforms::read(&cfg, &mut notes, &mut problems);
    if connector == Connector::Confluent && transforms.unwrap.is_none() {
        problems.push((
            "transforms".to_string(),
            format!(
                "no {} among the transforms: Confluent's sink reads flat rows, so these topics hold rows, not Debezium \
                 change events. replaysafe orders a row's changes by the change event's source position, or by a \
                 version field the connector config does not name; for a topic of plain records write the pipeline \
                 by hand ([fields], a row projection with key and version: README \"Use it on your topic\")",
                transforms::EXTRACT_NEW_RECORD_STATE
            ),
        ));
    }
    let (key, key_why) = key(&cfg, connector, &mut notes, &mut problems);
    insert_mode(&cfg, &mut notes, &mut problems);
    let deletes = deletes(&cfg, connector, &transforms, &mut problems);
    let database = database(&cfg, connector, &mut notes, &mut problems);
    let encoding = converters::read(&cfg, &mut notes, &mut problems);
    let (tolerance, tolerance_why) = errors(&cfg, &mut notes, &mut problems);
    let (start, start_why) = consumer(&cfg, &mut notes);
    let evolution = evolution(&cfg, connector, &mut notes);
    let (truncate, truncate_why) = match connector {
        Connector::Debezium => match cfg.get("truncate.enabled").map(str::to_ascii_lowercase).as_deref() {
            Some("true") => ("truncate", "truncate.enabled = true: a truncate empties the table (older rows become tombstones)".to_string()),
            _ => ("ignore", "truncate.enabled = false (the default): the connector leaves the table alone on a truncate; \"stop\" would stop the run there, \"truncate\" apply it".to_string()),
        },
        Connector::Confluent => ("ignore", "Confluent's sink does not apply truncates; \"stop\" would stop the run at one, \"truncate\" apply it".to_string()),
    };
    misc(&cfg, connector, &mut notes, &mut problems);
    let connector_schema = database
        .as_ref()
        .and_then(|d| d.schema.clone())
        .unwrap_or_else(|| "public".to_string());
    let mut projections = projections(
        &cfg,
        connector,
        &topics,
        &transforms,
        &connector_schema,
        &mut notes,
        &mut problems,
    );
    if !problems.is_empty() {
        return Err(refusal(&cfg, &problems));
    }
    for p in &mut projections {
        p.key.clone_from(&key);
        p.key_why.clone_from(&key_why);
        p.truncate = truncate;
        p.truncate_why.clone_from(&truncate_why);
        (p.new_columns, p.new_columns_why) = (evolution.0, evolution.1.clone());
        let (tomb, why) = match deletes {
            Deletes::Remove => ("table", format!(
                "a source delete removes the row (delete.enabled = true); its tombstone stays in {}_tombstones, so \
                 a late older change cannot bring the row back", p.table)),
            Deletes::Keep => ("column", "the connector leaves a deleted row in its table (deletes not applied): \
                 replaysafe keeps it too, with _deleted_at set (WHERE _deleted_at IS NULL selects the live rows)".to_string()),
            Deletes::Flag => ("column", "the transform writes a delete as the row with __deleted = 'true': \
                 replaysafe keeps the row with _deleted_at set instead (WHERE _deleted_at IS NULL selects the live rows)".to_string()),
        };
        p.tombstones = tomb;
        p.tombstones_why = why;
        if let Some(u) = &transforms.unwrap {
            p.foreign_columns.extend(u.added_columns.iter().cloned());
        }
        if deletes == Deletes::Flag {
            p.foreign_columns.push("__deleted".to_string());
        }
    }
    match deletes {
        Deletes::Keep => notes.differs(
            "delete.enabled",
            "deleted rows stay in the connector's table; replaysafe keeps them too, marked by _deleted_at \
             (tombstones = \"column\"): queries that want live rows add WHERE _deleted_at IS NULL",
        ),
        Deletes::Flag => notes.differs(
            "transforms",
            "a delete marks the row __deleted = 'true' in the connector's table; replaysafe marks it by _deleted_at \
             (tombstones = \"column\"): WHERE __deleted <> 'true' becomes WHERE _deleted_at IS NULL",
        ),
        Deletes::Remove => {}
    }
    for e in cfg.unread() {
        if !notes.names(&e.key) {
            notes.not_carried(
                &e.key,
                "not a setting of this connector the importer knows: not carried over",
            );
        }
    }
    let plan = Plan {
        file: file.to_string(),
        group: format!("replaysafe-{name}"),
        name,
        class,
        topics,
        topics_why,
        start,
        start_why,
        encoding: encoding.expect("no problem, so the converters were read"),
        database,
        schema: opts.schema.clone(),
        tolerance,
        tolerance_why,
        projections,
    };
    let pipeline = render::render(&plan, &notes.0);
    Ok(Imported {
        pipeline,
        notes: notes.0,
    })
}

/// The refusal naming every problem at its place.
fn refusal(cfg: &ConnectorConfig, problems: &[(String, String)]) -> Error {
    let mut m = format!(
        "cannot import {}: {} setting{} cannot make a replaysafe pipeline",
        cfg.file,
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for (key, why) in problems {
        let unset = if cfg.entry(key).is_none() {
            " (not set)"
        } else {
            ""
        };
        m.push_str(&format!("\n  {}: `{key}`{unset}: {why}", cfg.locate(key)));
    }
    Error::Usage(m)
}

/// `topics` / `topics.regex` (with `--topic`).
fn topics(
    cfg: &ConnectorConfig,
    opts: &Options,
    notes: &mut Notes,
    problems: &mut Problems,
) -> (Vec<String>, String) {
    let list = cfg.get("topics").map(str::to_string);
    let regex = cfg.get("topics.regex").map(str::to_string);
    match (list, regex) {
        (Some(_), Some(_)) => {
            problems.push((
                "topics.regex".to_string(),
                "set together with `topics` (Connect refuses both)".to_string(),
            ));
            (Vec::new(), String::new())
        }
        (Some(t), None) => {
            if !opts.topics.is_empty() {
                problems.push((
                    "topics".to_string(),
                    "--topic names the topics of a connector with topics.regex; this one lists them".to_string(),
                ));
            }
            let topics: Vec<String> = t
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            (topics, "topics".to_string())
        }
        (None, Some(r)) => {
            if opts.topics.is_empty() {
                problems.push((
                    "topics.regex".to_string(),
                    format!(
                        "`{r}`: replaysafe reads a fixed list of topics ([kafka] topics takes no pattern) — name the \
                         topics it matches with --topic (repeated)"
                    ),
                ));
                return (Vec::new(), String::new());
            }
            match transforms::java_regex(&r) {
                Err(m) => problems.push(("topics.regex".to_string(), m)),
                Ok(re) => {
                    for t in &opts.topics {
                        if !transforms::full_match(&re, t) {
                            problems.push((
                                "topics.regex".to_string(),
                                format!("--topic `{t}` does not match `{r}`: the connector does not read it"),
                            ));
                        }
                    }
                }
            }
            notes.differs(
                "topics.regex",
                &format!(
                    "`{r}` is replaced by the topics given with --topic: a topic created later that matches is read \
                     once it is added to [kafka] topics"
                ),
            );
            (
                opts.topics.clone(),
                format!("--topic, matching topics.regex `{r}`"),
            )
        }
        (None, None) => {
            problems.push((
                "topics".to_string(),
                "missing (and no topics.regex): which topics does the connector read?".to_string(),
            ));
            (Vec::new(), String::new())
        }
    }
}

/// `primary.key.mode` / `pk.mode` and their fields → the row projection's `key`.
fn key(
    cfg: &ConnectorConfig,
    connector: Connector,
    notes: &mut Notes,
    problems: &mut Problems,
) -> (Option<Vec<String>>, String) {
    let (mode_key, fields_key) = match connector {
        Connector::Debezium => ("primary.key.mode", "primary.key.fields"),
        Connector::Confluent => ("pk.mode", "pk.fields"),
    };
    let mode = cfg.get(mode_key).unwrap_or("none").to_ascii_lowercase();
    let fields: Vec<String> = cfg
        .get(fields_key)
        .map(|f| {
            f.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let fields = (!fields.is_empty()).then_some(fields);
    let set = format!("set {mode_key} = record_key to import it");
    match mode.as_str() {
        "record_key" => {
            let why = match &fields {
                Some(f) => format!("{mode_key} = record_key, {fields_key} = {}", f.join(",")),
                None => format!("{mode_key} = record_key: the record key's fields, the source table's primary key (the table's primary key here)"),
            };
            (fields, why)
        }
        "record_value" => {
            match fields {
                Some(f) => {
                    notes.check(
                    fields_key,
                    "replaysafe identifies a row by the record key (the source table's primary key): these columns \
                     must be that key's",
                );
                    let why = format!("{mode_key} = record_value, {fields_key} = {}", f.join(","));
                    (Some(f), why)
                }
                None => {
                    problems.push((
                    mode_key.to_string(),
                    format!("record_value without {fields_key}: every column would be the key; {set}"),
                ));
                    (None, String::new())
                }
            }
        }
        "none" => {
            problems.push((
                mode_key.to_string(),
                format!(
                    "none (the default): the connector writes every change as a new row with no key — a redelivery \
                     is a second row. replaysafe keeps one row per source row, identified by the record key: {set}"
                ),
            ));
            (None, String::new())
        }
        "kafka" => {
            problems.push((
                mode_key.to_string(),
                format!(
                    "kafka: the connector keys rows by topic, partition and offset, so a change re-emitted at another \
                     offset is a second row. replaysafe identifies a change by what it is, never where it sits: {set}"
                ),
            ));
            (None, String::new())
        }
        other => {
            problems.push((
                mode_key.to_string(),
                format!("`{other}`: replaysafe identifies a row by the record key only; {set}"),
            ));
            (None, String::new())
        }
    }
}

/// `insert.mode`: replaysafe's row projection is an upsert guarded by the version.
fn insert_mode(cfg: &ConnectorConfig, notes: &mut Notes, problems: &mut Problems) {
    match cfg.get("insert.mode").unwrap_or("insert").to_ascii_lowercase().as_str() {
        "upsert" => {}
        "insert" => notes.differs(
            "insert.mode",
            "insert: the connector's INSERT fails on a key already there (an update, or a redelivery after a crash, \
             stops the task unless errors.tolerance = all); replaysafe writes a strictly newer version over the \
             stored row and recognises redeliveries",
        ),
        "update" => notes.differs(
            "insert.mode",
            "update: the connector changes existing rows only (a change of a row not in the table is lost); \
             replaysafe inserts it",
        ),
        other => problems.push(("insert.mode".to_string(), format!("`{other}` is none of insert, upsert, update"))),
    }
}

/// What a source delete does to the connector's table.
fn deletes(
    cfg: &ConnectorConfig,
    connector: Connector,
    t: &Transforms,
    problems: &mut Problems,
) -> Deletes {
    let enabled = match cfg
        .get("delete.enabled")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            problems.push((
                "delete.enabled".to_string(),
                format!("`{other}` is not true or false"),
            ));
            false
        }
    };
    match (&t.unwrap, connector) {
        (None, _) => {
            if enabled {
                Deletes::Remove
            } else {
                Deletes::Keep
            }
        }
        (Some(u), _) => {
            if enabled && (u.delete == DeleteEvent::Tombstone || u.tombstones_pass) {
                Deletes::Remove
            } else if u.delete == DeleteEvent::Rewritten {
                Deletes::Flag
            } else {
                Deletes::Keep
            }
        }
    }
}

/// `connection.url`, `connection.user(name)`, `connection.password`.
fn database(
    cfg: &ConnectorConfig,
    connector: Connector,
    notes: &mut Notes,
    problems: &mut Problems,
) -> Option<jdbc::Database> {
    let user_key = match connector {
        Connector::Debezium => "connection.username",
        Connector::Confluent => "connection.user",
    };
    let user = cfg.get(user_key).map(|u| (user_key, u));
    let password = cfg
        .get("connection.password")
        .map(|p| ("connection.password", p));
    let Some(url) = cfg.get("connection.url") else {
        notes.check(
            "connection.url",
            "not set: the pipeline has no [postgres] url and takes DATABASE_URL at run time",
        );
        return None;
    };
    match jdbc::database(url, user, password, notes) {
        Ok(d) => Some(d),
        Err(m) => {
            problems.push(("connection.url".to_string(), m));
            None
        }
    }
}

/// `errors.*`.
fn errors(
    cfg: &ConnectorConfig,
    notes: &mut Notes,
    problems: &mut Problems,
) -> (Option<&'static str>, String) {
    let out = match cfg
        .get("errors.tolerance")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("none") => {
            notes.differs(
                "errors.tolerance",
                "none: the connector's task stops at the first record it cannot write; replaysafe's none quarantines \
                 such a record (replaysafe_dead_letters) and stops only when one reason dominates a partition \
                 ([errors] max-consecutive, max-percent)",
            );
            (
                Some("none"),
                "errors.tolerance = none (Connect's default)".to_string(),
            )
        }
        Some("all") => {
            notes.differs(
                "errors.tolerance",
                "all: replaysafe quarantines every record it cannot apply into replaysafe_dead_letters, in the \
                 batch's transaction, and goes on",
            );
            (Some("all"), "errors.tolerance = all".to_string())
        }
        Some(other) => {
            problems.push((
                "errors.tolerance".to_string(),
                format!("`{other}` is not none or all"),
            ));
            (None, String::new())
        }
    };
    for e in cfg.with_prefix("errors.") {
        let why = if e.key.starts_with("errors.deadletterqueue.") {
            "no dead-letter topic: replaysafe keeps each record it cannot apply in replaysafe_dead_letters, in the \
             transaction of its batch (`replaysafe dead-letters list`, `dead-letters replay` after a fix)"
        } else if e.key.starts_with("errors.log.") {
            "each quarantined record is kept with its reason in replaysafe_dead_letters; logging is REPLAYSAFE_LOG's"
        } else if e.key.starts_with("errors.retry.") {
            "replaysafe retries a batch whose failure may pass (connection loss, serialization failure, lock \
             timeout: the SQLSTATE decides) itself"
        } else {
            continue;
        };
        notes.not_carried(&e.key, why);
        cfg.mark(&e.key);
    }
    out
}

/// `consumer.override.*`: where a new group starts.
fn consumer(cfg: &ConnectorConfig, notes: &mut Notes) -> (Option<&'static str>, String) {
    let reset = cfg
        .get("consumer.override.auto.offset.reset")
        .map(str::to_ascii_lowercase);
    for e in cfg.with_prefix("consumer.override.") {
        if e.key != "consumer.override.auto.offset.reset" {
            notes.not_carried(
                &e.key,
                "a Java consumer setting: set its librdkafka counterpart in [kafka.properties] if it matters (names \
                 differ)",
            );
            cfg.mark(&e.key);
        }
    }
    match reset.as_deref() {
        Some("latest") => (
            Some("latest"),
            "consumer.override.auto.offset.reset = latest: a new group reads what is produced from now on".to_string(),
        ),
        Some("none") => (
            None,
            "consumer.override.auto.offset.reset = none: no start, a new group stops (exit 3) until one is chosen"
                .to_string(),
        ),
        _ => (
            Some("earliest"),
            "a new group reads every change the topics still hold (version-guarded: a replay is harmless); a topic \
             that no longer holds every row needs a snapshot from the source connector first"
                .to_string(),
        ),
    }
}

/// `schema.evolution` / `auto.evolve` and the field filters → `new-columns`.
fn evolution(
    cfg: &ConnectorConfig,
    connector: Connector,
    notes: &mut Notes,
) -> (&'static str, String) {
    let (evolves, why) = match connector {
        Connector::Debezium => match cfg
            .get("schema.evolution")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("basic") => (true, "schema.evolution = basic"),
            _ => (false, "schema.evolution = none (the default)"),
        },
        Connector::Confluent => {
            if cfg
                .get("auto.create")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            {
                notes.not_carried(
                    "auto.create",
                    "replaysafe creates a row projection's table only from declared `columns`, which the connector \
                     config does not give: the table must exist (see the CREATE TABLE line of the projection)",
                );
            }
            cfg.mark("auto.create");
            match cfg
                .get("auto.evolve")
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                Some("true") => (true, "auto.evolve = true"),
                _ => (false, "auto.evolve = false (the default)"),
            }
        }
    };
    let filters: Vec<&str> = [
        "field.include.list",
        "field.exclude.list",
        "fields.whitelist",
        "fields.include",
    ]
    .into_iter()
    .filter(|k| cfg.get(k).is_some())
    .collect();
    for f in &filters {
        notes.not_carried(
            f,
            "the row projection writes the columns of its table and leaves other members of the row out \
             (new-columns = \"ignore\"): a copy of the connector's table has the columns it kept",
        );
    }
    if !filters.is_empty() {
        return (
            "ignore",
            format!("{why}, but a field filter is set: only the table's columns are written"),
        );
    }
    if evolves {
        (
            "add",
            format!("{why}: a column new in the source is added to the table"),
        )
    } else {
        (
            "ignore",
            format!("{why}: a column new in the source is not stored"),
        )
    }
}

/// The keys of either connector with no equivalent, named.
fn misc(cfg: &ConnectorConfig, connector: Connector, notes: &mut Notes, problems: &mut Problems) {
    cfg.mark("connector.class");
    if let Some(t) = cfg.get("tasks.max") {
        notes.not_carried(
            "tasks.max",
            &format!(
                "{t}: replaysafe works per partition — [postgres] connections (default 4) commit partitions in \
                 parallel, and more `replaysafe run` processes in the group share them (docs/operations.md \"Running \
                 several workers\")"
            ),
        );
    }
    if cfg.get("batch.size").is_some() {
        notes.differs(
            "batch.size",
            "the connector's JDBC batch; replaysafe's batch is one PostgreSQL transaction per partition ([batch] \
             max-records, default 5000), left at its default",
        );
    }
    let utc = |v: &str| {
        matches!(
            v.to_ascii_uppercase().as_str(),
            "UTC" | "Z" | "ETC/UTC" | "GMT" | "+00:00"
        )
    };
    for k in ["use.time.zone", "database.time_zone", "db.timezone"] {
        if let Some(tz) = cfg.get(k) {
            if !utc(tz) {
                notes.differs(
                    k,
                    &format!(
                        "the connector writes temporal values in {tz}; replaysafe's sessions use TimeZone = 'UTC': a \
                         `timestamp without time zone` column gets the UTC time"
                    ),
                );
            }
        }
    }
    for k in ["quote.identifiers", "quote.sql.identifiers"] {
        cfg.mark(k);
    }
    for k in ["collection.naming.strategy", "table.naming.strategy"] {
        if let Some(s) = cfg.get(k) {
            if !s.ends_with(".DefaultCollectionNamingStrategy")
                && !s.ends_with(".DefaultTableNamingStrategy")
            {
                problems.push((
                    k.to_string(),
                    format!("`{s}` names the tables in code the importer cannot run: write the projections' tables by hand"),
                ));
            }
        }
    }
    if let Some(s) = cfg.get("column.naming.strategy") {
        if !s.ends_with(".DefaultColumnNamingStrategy") {
            notes.not_carried(
                "column.naming.strategy",
                "columns named by a custom strategy: a row projection over a copy of the connector's table writes \
                 the source's column names, which must be the table's",
            );
        }
    }
    let retries = "replaysafe retries a batch whose failure may pass (the SQLSTATE decides) and waits for the \
                   database at start-up for --connect-timeout";
    let none = "no equivalent in replaysafe";
    let pooled = "replaysafe's own connections: [postgres] connections";
    let keys: &[(&str, &str)] = match connector {
        Connector::Debezium => &[
            ("flush.max.retries", retries),
            ("flush.retry.delay.ms", retries),
            ("connection.restart.on.errors", retries),
            ("connection.provider", pooled),
            (
                "use.reduction.buffer",
                "replaysafe folds a batch's changes per row itself",
            ),
            ("dialect.postgres.postgis.schema", none),
            ("dialect.postgres.unnest.insert.enabled", none),
            ("dialect.sqlserver.identity.insert", none),
            ("collection.table.format", none),
            ("cloud.events.schema.name.pattern", none),
        ],
        Connector::Confluent => &[
            ("max.retries", retries),
            ("retry.backoff.ms", retries),
            ("connection.attempts", retries),
            ("connection.backoff.ms", retries),
            ("dialect.name", "replaysafe writes to PostgreSQL only"),
            ("table.types", none),
            ("mssql.use.merge.holdlock", none),
            (
                "trim.sensitive.log",
                "replaysafe's output never holds a secret",
            ),
            ("insert.mode.databaselevel", none),
        ],
    };
    for (k, why) in keys {
        if cfg.get(k).is_some() {
            notes.not_carried(k, why);
        }
    }
    for prefix in ["connection.pool.", "hibernate."] {
        for e in cfg.with_prefix(prefix) {
            notes.not_carried(&e.key, if prefix == "hibernate." { none } else { pooled });
            cfg.mark(&e.key);
        }
    }
    if cfg.get("header.converter").is_some() {
        notes.not_carried(
            "header.converter",
            "headers are not part of a row projection's rows",
        );
    }
}

/// One row projection per table the connector writes.
#[allow(clippy::too_many_arguments)]
fn projections(
    cfg: &ConnectorConfig,
    connector: Connector,
    topics: &[String],
    t: &Transforms,
    connector_schema: &str,
    notes: &mut Notes,
    problems: &mut Problems,
) -> Vec<Projection> {
    let (format_key, format) = match connector {
        Connector::Debezium => match cfg.get("collection.name.format") {
            Some(f) => ("collection.name.format", f.to_string()),
            None => (
                "table.name.format",
                cfg.get("table.name.format")
                    .unwrap_or("${topic}")
                    .to_string(),
            ),
        },
        Connector::Confluent => (
            "table.name.format",
            cfg.get("table.name.format")
                .unwrap_or("${topic}")
                .to_string(),
        ),
    };
    cfg.mark("collection.name.format");
    let fold = match connector {
        Connector::Debezium => !cfg
            .get("quote.identifiers")
            .is_some_and(|q| q.eq_ignore_ascii_case("true")),
        Connector::Confluent => cfg
            .get("quote.sql.identifiers")
            .is_some_and(|q| q.eq_ignore_ascii_case("never")),
    };
    let mut by_table: BTreeMap<String, Projection> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for topic in topics {
        let routed = t.route(topic);
        let parts: Vec<&str> = topic.split('.').collect();
        let source =
            (parts.len() == 3 && parts.iter().all(|p| !p.is_empty())).then(|| (parts[1], parts[2]));
        let mut name = match connector {
            Connector::Debezium => format.replace("${topic}", &routed.replace('.', "_")),
            Connector::Confluent => format.replace("${topic}", &routed),
        };
        if name.contains("${source.") {
            match source {
                Some((schema, table)) if !name.contains("${source.db}") => {
                    name = name
                        .replace("${source.schema}", schema)
                        .replace("${source.table}", table);
                }
                _ => {
                    problems.push((
                        format_key.to_string(),
                        format!(
                            "`{format}` names the table after the change's source block, which the topic `{topic}` \
                             does not tell (not <topic.prefix>.<schema>.<table>): name the table in the file"
                        ),
                    ));
                    continue;
                }
            }
        }
        let qualified: Vec<&str> = name.split('.').collect();
        let bare = qualified.last().copied().unwrap_or_default();
        let table = if fold {
            bare.to_lowercase()
        } else {
            bare.to_string()
        };
        let their_schema = if qualified.len() >= 2 {
            let s = qualified[qualified.len() - 2];
            if fold {
                s.to_lowercase()
            } else {
                s.to_string()
            }
        } else {
            connector_schema.to_string()
        };
        if let Err(m) = Ident::new(&table) {
            problems.push((
                format_key.to_string(),
                format!("the table `{table}` of topic `{topic}`: {m} (replaysafe quotes every identifier)"),
            ));
            continue;
        }
        if table.len() > 52 {
            problems.push((
                format_key.to_string(),
                format!("the table `{table}` of topic `{topic}` is longer than 52 bytes (its tombstones live in `<table>_tombstones`)"),
            ));
            continue;
        }
        let routes: Vec<&str> = t.routes.iter().map(|r| r.alias.as_str()).collect();
        let via = if routed == *topic {
            String::new()
        } else {
            format!(" routed to `{routed}` by {}", routes.join(", "))
        };
        let source_table = source.map(|(s, tb)| format!("{s}.{tb}"));
        match &source_table {
            Some(s) => notes.check(
                "topics",
                &format!(
                    "source-table `{s}` of projection `{table}` is read from the topic `{topic}` as Debezium names \
                     topics (<topic.prefix>.<schema>.<table>): check it, a projection takes only that table's changes"
                ),
            ),
            None => notes.check(
                "topics",
                &format!(
                    "the topic `{topic}` does not name its source table: projection `{table}` takes the changes of a \
                     source table named `{table}` (any schema) — set source-table = \"<schema>.<table>\" if yours is \
                     named otherwise, else it stays empty"
                ),
            ),
        }
        match by_table.get_mut(&table) {
            Some(p) => {
                if p.source_table != source_table {
                    problems.push((
                        format_key.to_string(),
                        format!(
                            "topics `{}` and `{topic}` both go to table `{table}` from different source tables: a row \
                             projection takes one source table — one pipeline per source",
                            p.topics[0]
                        ),
                    ));
                }
                p.topics.push(topic.clone());
            }
            None => {
                order.push(table.clone());
                by_table.insert(
                    table.clone(),
                    Projection {
                        table: table.clone(),
                        connector_table: format!("{their_schema}.{table}"),
                        topics: vec![topic.clone()],
                        table_why: format!("{format_key} `{format}` of topic `{topic}`{via}"),
                        source_table,
                        key: None,
                        key_why: String::new(),
                        tombstones: "table",
                        tombstones_why: String::new(),
                        truncate: "ignore",
                        truncate_why: String::new(),
                        new_columns: "ignore",
                        new_columns_why: String::new(),
                        foreign_columns: Vec::new(),
                    },
                );
            }
        }
    }
    // Two projections of one source table would both apply its changes.
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for table in &order {
        if let Some(s) = &by_table[table].source_table {
            if let Some(other) = seen.insert(s.clone(), table.clone()) {
                problems.push((
                    "topics".to_string(),
                    format!(
                        "tables `{other}` and `{table}` both come from source table `{s}` (two source databases?): \
                         replaysafe's row projections select changes by source table, not by topic — one pipeline \
                         per source"
                    ),
                ));
            }
        }
    }
    order
        .into_iter()
        .filter_map(|t| by_table.remove(&t))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(json: &str) -> Result<Imported> {
        connector(
            "c.json",
            json,
            &Options {
                topics: Vec::new(),
                schema: "replica".to_string(),
            },
        )
    }

    /// The pipeline parses and validates (the password-file reference replaced: no environment in unit tests).
    fn valid(text: &str) {
        let text = text
            .replace("${REPLAYSAFE_DB_PASSWORD_FILE}", "/run/pw")
            .replace("${REPLAYSAFE_REGISTRY_PASSWORD_FILE}", "/run/rpw");
        crate::config::parse("generated.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }

    #[test]
    fn a_debezium_sink_becomes_a_row_projection() {
        let out = import(
            r#"{"name": "orders-sink", "config": {"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
            "topics": "shop.public.orders", "connection.url": "jdbc:postgresql://db:5432/app", "connection.username": "u",
            "connection.password": "s3cret", "insert.mode": "upsert", "delete.enabled": "true",
            "primary.key.mode": "record_key", "schema.evolution": "basic"}}"#,
        )
        .unwrap();
        valid(&out.pipeline);
        let p = &out.pipeline;
        assert!(p.contains("group-id = \"replaysafe-orders-sink\""), "{p}");
        assert!(p.contains("topics = [\"shop.public.orders\"]"), "{p}");
        assert!(p.contains("table = \"shop_public_orders\""), "{p}");
        assert!(p.contains("source-table = \"public.orders\""), "{p}");
        assert!(p.contains("tombstones = \"table\""), "{p}");
        assert!(p.contains("new-columns = \"add\""), "{p}");
        assert!(p.contains("url = \"postgresql://u@db:5432/app\""), "{p}");
        assert!(!p.contains("s3cret") && !format!("{:?}", out.notes).contains("s3cret"));
    }

    #[test]
    fn every_unusable_key_is_named_at_once() {
        let e = import(
            "{\n\"connector.class\": \"io.confluent.connect.jdbc.JdbcSinkConnector\",\n\"topics.regex\": \"orders.*\",\n\"connection.url\": \"jdbc:mysql://h/db\"\n}",
        )
        .unwrap_err()
        .to_string();
        for want in [
            "c.json:3:1: `topics.regex`",
            "c.json:4:1: `connection.url`",
            "`transforms`",
            "`pk.mode`",
        ] {
            assert!(e.contains(want), "{want} in {e}");
        }
    }

    #[test]
    fn unknown_keys_are_named_without_their_values() {
        let out = import(
            r#"{"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "topics": "t",
            "primary.key.mode": "record_key", "some.secret.thing": "hunter2"}"#,
        )
        .unwrap();
        valid(&out.pipeline);
        let n = out
            .notes
            .iter()
            .find(|n| n.key == "some.secret.thing")
            .unwrap();
        assert_eq!(n.kind, NoteKind::NotCarried);
        assert!(!out.pipeline.contains("hunter2"));
        assert!(
            out.pipeline.contains("tombstones = \"column\""),
            "delete.enabled unset: rows stay"
        );
        assert!(out.pipeline.contains("truncate = \"ignore\""));
    }
}
