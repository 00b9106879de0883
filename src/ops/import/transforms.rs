//! The connector's single message transforms (`transforms`, `transforms.<alias>.*`) and their predicates
//! (`predicates`, `predicates.<name>.*`, Kafka Connect's KIP-585) as far as they decide the rows: Kafka's
//! `RegexRouter` renames the topic the table is named after; Debezium's `ExtractNewRecordState` flattens the
//! envelope for a sink that cannot read it and decides what a source delete becomes. replaysafe reads the envelope
//! itself, so the transform is dropped, and only what it did to deletes is carried over.

use regex::Regex;

use super::input::ConnectorConfig;
use super::Notes;

/// `org.apache.kafka.connect.transforms.RegexRouter`.
pub const REGEX_ROUTER: &str = "org.apache.kafka.connect.transforms.RegexRouter";
/// Debezium's envelope-flattening transform.
pub const EXTRACT_NEW_RECORD_STATE: &str = "io.debezium.transforms.ExtractNewRecordState";

/// What a source delete becomes after `ExtractNewRecordState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteEvent {
    /// Removed from the stream.
    Dropped,
    /// A record with a null value (what a sink with `delete.enabled` deletes by).
    Tombstone,
    /// The row before the delete with a `__deleted = "true"` field (a soft delete).
    Rewritten,
}

/// `ExtractNewRecordState` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwrap {
    /// The transform's alias.
    pub alias: String,
    /// What a delete event becomes.
    pub delete: DeleteEvent,
    /// Whether the source's own tombstone (after a delete) reaches the sink.
    pub tombstones_pass: bool,
    /// Columns the transform adds to every row (`add.fields`, with their prefix).
    pub added_columns: Vec<String>,
}

/// A `RegexRouter`: topics that match `regex` whole (and the predicate, if any) are renamed.
#[derive(Debug)]
pub struct Route {
    /// The alias.
    pub alias: String,
    regex: Regex,
    replacement: String,
    only: Option<(Regex, bool)>,
}

impl Route {
    /// The topic after this route (Java's `Matcher.matches()` then `replaceFirst`).
    pub fn apply(&self, topic: &str) -> String {
        if let Some((pattern, negate)) = &self.only {
            if full_match(pattern, topic) == *negate {
                return topic.to_string();
            }
        }
        // Anchored at both ends (java_regex): a match is a whole match.
        match self.regex.captures(topic) {
            Some(c) => java_replacement(&self.replacement, &c),
            None => topic.to_string(),
        }
    }
}

/// Whether `re` (compiled by [`java_regex`], anchored) matches all of `text` (Java's `matches()`).
pub fn full_match(re: &Regex, text: &str) -> bool {
    re.is_match(text)
}

/// A Java regular expression compiled anchored at both ends (Java's `matches()`), or why it cannot be.
///
/// # Errors
/// The message, for a pattern the `regex` crate does not read (look-around, back-references).
pub fn java_regex(pattern: &str) -> std::result::Result<Regex, String> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
        format!(
            "the regular expression `{pattern}` cannot be read here ({}): replaysafe reads neither look-around nor \
             back-references",
            e.to_string().lines().last().unwrap_or("invalid").trim()
        )
    })
}

/// Java's `Matcher.replaceFirst` replacement: `$n` and `${name}` are groups, `\x` is `x`.
fn java_replacement(replacement: &str, caps: &regex::Captures<'_>) -> String {
    let mut out = String::new();
    let chars: Vec<char> = replacement.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                out.push(chars[i + 1]);
                i += 2;
            }
            '$' if i + 1 < chars.len() && chars[i + 1] == '{' => {
                let end = chars[i..].iter().position(|&c| c == '}').map(|e| i + e);
                match end {
                    Some(e) => {
                        let name: String = chars[i + 2..e].iter().collect();
                        out.push_str(caps.name(&name).map_or("", |m| m.as_str()));
                        i = e + 1;
                    }
                    None => {
                        out.push('$');
                        i += 1;
                    }
                }
            }
            '$' => {
                // Java reads as many digits as still name a group.
                let mut j = i + 1;
                let mut group: Option<usize> = None;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    let n =
                        group.unwrap_or(0) * 10 + chars[j].to_digit(10).map_or(0, |d| d as usize);
                    if group.is_some() && n >= caps.len() {
                        break;
                    }
                    group = Some(n);
                    j += 1;
                }
                match group {
                    Some(g) => out.push_str(caps.get(g).map_or("", |m| m.as_str())),
                    None => out.push('$'),
                }
                i = j.max(i + 1);
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The transforms that matter, read from `cfg`.
#[derive(Debug, Default)]
pub struct Transforms {
    /// `ExtractNewRecordState`, when configured.
    pub unwrap: Option<Unwrap>,
    /// The `RegexRouter`s, in the order applied.
    pub routes: Vec<Route>,
}

impl Transforms {
    /// The topic as the sink sees it, after every route.
    pub fn route(&self, topic: &str) -> String {
        self.routes
            .iter()
            .fold(topic.to_string(), |t, r| r.apply(&t))
    }
}

/// Reads `transforms` and `predicates`: problems (fatal) go to `problems` as `(key, message)`.
pub fn read(
    cfg: &ConnectorConfig,
    notes: &mut Notes,
    problems: &mut Vec<(String, String)>,
) -> Transforms {
    let mut out = Transforms::default();
    let aliases: Vec<String> = cfg
        .get("transforms")
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let predicates = cfg.get("predicates").unwrap_or("").to_string();
    for alias in &aliases {
        let key = |k: &str| format!("transforms.{alias}.{k}");
        let Some(ty) = cfg.get(&key("type")).map(str::to_string) else {
            problems.push((key("type"), format!("transform `{alias}` has no `type`")));
            continue;
        };
        let predicate = cfg.get(&key("predicate")).map(str::to_string);
        let negate = cfg
            .get(&key("negate"))
            .is_some_and(|n| n.eq_ignore_ascii_case("true"));
        match ty.as_str() {
            EXTRACT_NEW_RECORD_STATE => {
                if let Some(p) = &predicate {
                    let pty = cfg.get(&format!("predicates.{p}.type")).unwrap_or("");
                    if !(pty.ends_with("RecordIsTombstone") && negate) {
                        notes.differs(
                            &key("predicate"),
                            "the predicate is not evaluated: what deletes do is worked out as if the transform \
                             applied to every record",
                        );
                    }
                }
                let tombstones_skip_it = predicate.as_deref().is_some_and(|p| {
                    negate
                        && cfg
                            .get(&format!("predicates.{p}.type"))
                            .is_some_and(|t| t.ends_with("RecordIsTombstone"))
                });
                if let Some(u) = unwrap(cfg, alias, tombstones_skip_it, notes, problems) {
                    out.unwrap = Some(u);
                }
            }
            REGEX_ROUTER => {
                let Some(regex) = cfg.get(&key("regex")).map(str::to_string) else {
                    problems.push((key("regex"), "a RegexRouter needs `regex`".to_string()));
                    continue;
                };
                let regex = match java_regex(&regex) {
                    Ok(r) => r,
                    Err(m) => {
                        problems.push((key("regex"), m));
                        continue;
                    }
                };
                let replacement = cfg.get(&key("replacement")).unwrap_or("").to_string();
                let only = match &predicate {
                    None => None,
                    Some(p) => match topic_predicate(cfg, p, &predicates) {
                        Ok(re) => Some((re, negate)),
                        Err(m) => {
                            problems.push((key("predicate"), m));
                            continue;
                        }
                    },
                };
                out.routes.push(Route {
                    alias: alias.clone(),
                    regex,
                    replacement,
                    only,
                });
            }
            "io.debezium.transforms.ByLogicalTableRouter" => problems.push((
                key("type"),
                "ByLogicalTableRouter merges tables into one and adds a key field \
                 (__dbz__physicalTableIdentifier) replaysafe does not add: write such a pipeline by hand"
                    .to_string(),
            )),
            "io.debezium.connector.mongodb.transforms.ExtractNewDocumentState" => problems.push((
                key("type"),
                "MongoDB change events: replaysafe's row projections read relational Debezium envelopes".to_string(),
            )),
            "io.debezium.transforms.outbox.EventRouter" => problems.push((
                key("type"),
                "the outbox event router's records are events, not row changes: a JSON pipeline (README \"Use it on \
                 your topic\") fits them"
                    .to_string(),
            )),
            other => notes.not_carried(
                &key("type"),
                &format!("the transform `{other}` is not reproduced: rows may differ where it changed them"),
            ),
        }
        for e in cfg.with_prefix(&format!("transforms.{alias}.")) {
            if cfg.unread().iter().any(|u| u.key == e.key) {
                notes.not_carried(
                    &e.key,
                    "a setting of the transform replaysafe does not reproduce",
                );
                cfg.mark(&e.key);
            }
        }
    }
    // Predicates are read through the transforms that name them.
    cfg.mark("predicates");
    for e in cfg.with_prefix("predicates.") {
        cfg.mark(&e.key);
    }
    out
}

/// `predicates.<name>.type` = `TopicNameMatches`: its `pattern`.
fn topic_predicate(
    cfg: &ConnectorConfig,
    name: &str,
    declared: &str,
) -> std::result::Result<Regex, String> {
    if !declared.split(',').any(|p| p.trim() == name) {
        return Err(format!(
            "the predicate `{name}` is not declared in `predicates`"
        ));
    }
    let ty = cfg.get(&format!("predicates.{name}.type")).unwrap_or("");
    if !ty.ends_with("TopicNameMatches") {
        return Err(format!(
            "a RegexRouter under the predicate `{name}` ({ty}): only TopicNameMatches decides by the topic, which \
             is all the table's name can depend on"
        ));
    }
    let pattern = cfg.get(&format!("predicates.{name}.pattern")).unwrap_or("");
    java_regex(pattern)
}

/// `ExtractNewRecordState`'s delete handling: `delete.tombstone.handling.mode` (Debezium 2.5 on; default
/// `tombstone`), else the older `delete.handling.mode` (default `drop`) and `drop.tombstones` (default `true`).
fn unwrap(
    cfg: &ConnectorConfig,
    alias: &str,
    tombstones_skip_it: bool,
    notes: &mut Notes,
    problems: &mut Vec<(String, String)>,
) -> Option<Unwrap> {
    let key = |k: &str| format!("transforms.{alias}.{k}");
    if cfg.get(&key("route.by.field")).is_some() {
        problems.push((
            key("route.by.field"),
            "the tables are named after a field of each row: replaysafe's projections name their table in the file"
                .to_string(),
        ));
        return None;
    }
    let mode = cfg
        .get(&key("delete.tombstone.handling.mode"))
        .map(str::to_ascii_lowercase);
    let legacy_delete = cfg
        .get(&key("delete.handling.mode"))
        .map(str::to_ascii_lowercase);
    let legacy_drop = cfg
        .get(&key("drop.tombstones"))
        .map(str::to_ascii_lowercase);
    let (delete, tombstones_pass) = match (mode.as_deref(), &legacy_delete, &legacy_drop) {
        (Some(m), _, _) => match m {
            "drop" => (DeleteEvent::Dropped, false),
            "tombstone" | "delete-to-tombstone" => (DeleteEvent::Tombstone, false),
            "rewrite" => (DeleteEvent::Rewritten, false),
            "rewrite-with-tombstone" => (DeleteEvent::Rewritten, true),
            other => {
                problems.push((
                    key("delete.tombstone.handling.mode"),
                    format!(
                        "`{other}` is none of drop, tombstone, rewrite, rewrite-with-tombstone, delete-to-tombstone"
                    ),
                ));
                return None;
            }
        },
        (None, None, None) => {
            notes.check(
                &key("type"),
                "no delete handling set: Debezium 3's default (delete.tombstone.handling.mode = tombstone: a delete \
                 reaches the sink as a tombstone) is assumed; before 3.0 the default dropped deletes \
                 (delete.handling.mode = drop, drop.tombstones = true) and the connector's table kept deleted rows",
            );
            (DeleteEvent::Tombstone, false)
        }
        (None, d, t) => {
            let delete = match d.as_deref().unwrap_or("drop") {
                "drop" => DeleteEvent::Dropped,
                "none" => DeleteEvent::Tombstone,
                "rewrite" => DeleteEvent::Rewritten,
                other => {
                    problems.push((
                        key("delete.handling.mode"),
                        format!("`{other}` is none of drop, rewrite, none"),
                    ));
                    return None;
                }
            };
            let drop = match t.as_deref().unwrap_or("true") {
                "true" => true,
                "false" => false,
                other => {
                    problems.push((
                        key("drop.tombstones"),
                        format!("`{other}` is not true or false"),
                    ));
                    return None;
                }
            };
            (delete, !drop)
        }
    };
    let prefix = cfg
        .get(&key("add.fields.prefix"))
        .unwrap_or("__")
        .to_string();
    let added_columns: Vec<String> = cfg
        .get(&key("add.fields"))
        .map(|f| {
            f.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| match x.split_once(':') {
                    Some((_, renamed)) => renamed.to_string(),
                    None => format!("{prefix}{}", x.replace('.', "_")),
                })
                .collect()
        })
        .unwrap_or_default();
    if !added_columns.is_empty() {
        notes.not_carried(
            &key("add.fields"),
            &format!(
                "the columns {} the transform adds are not written: replaysafe keeps the change's source position \
                 in `_position` (drop them from the replica's copy of the table)",
                added_columns.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
            ),
        );
    }
    if cfg.get(&key("add.headers")).is_some() {
        notes.not_carried(
            &key("add.headers"),
            "headers the transform adds are not used by a row projection",
        );
    }
    for k in [
        "add.headers.prefix",
        "replace.null.with.default",
        "operation.header",
        "add.source.fields",
    ] {
        if cfg.get(&key(k)).is_some() {
            notes.not_carried(
                &key(k),
                "a setting of the flattening, which replaysafe does not do",
            );
        }
    }
    Some(Unwrap {
        alias: alias.to_string(),
        delete,
        tombstones_pass: tombstones_pass || tombstones_skip_it,
        added_columns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(json: &str) -> ConnectorConfig {
        ConnectorConfig::parse("c.json", json).unwrap()
    }

    #[test]
    fn a_regex_router_renames_as_java_does() {
        let c = cfg(
            r#"{"transforms": "route", "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.route.regex": "([^.]+)\\.([^.]+)\\.([^.]+)", "transforms.route.replacement": "$3"}"#,
        );
        let mut notes = Notes::default();
        let mut problems = Vec::new();
        let t = read(&c, &mut notes, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(t.route("dbserver1.inventory.customers"), "customers");
        assert_eq!(
            t.route("customers"),
            "customers",
            "no whole match: unchanged"
        );
        let re = java_regex("(?<db>[a-z]+)-(\\d)").unwrap();
        let caps = re.captures("shop-7").unwrap();
        assert_eq!(java_replacement("${db}_$2\\$x$", &caps), "shop_7$x$");
        assert_eq!(
            java_replacement("$12", &caps),
            "shop2",
            "$12 with 2 groups is $1 then 2"
        );
        assert!(java_regex("(?=a)b").is_err());
    }

    #[test]
    fn a_route_under_a_topic_predicate_applies_only_there() {
        let c = cfg(
            r#"{"transforms": "r", "transforms.r.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.r.regex": "pg\\.(.*)", "transforms.r.replacement": "$1", "transforms.r.predicate": "isPublic",
            "predicates": "isPublic", "predicates.isPublic.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
            "predicates.isPublic.pattern": "pg\\.public\\..*"}"#,
        );
        let (mut notes, mut problems) = (Notes::default(), Vec::new());
        let t = read(&c, &mut notes, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(t.route("pg.public.orders"), "public.orders");
        assert_eq!(t.route("pg.sales.orders"), "pg.sales.orders");
    }

    #[test]
    fn what_a_delete_becomes() {
        let delete = |extra: &str| {
            let c = cfg(&format!(
                r#"{{"transforms": "u", "transforms.u.type": "io.debezium.transforms.ExtractNewRecordState"{extra}}}"#
            ));
            let (mut notes, mut problems) = (Notes::default(), Vec::new());
            let u = read(&c, &mut notes, &mut problems).unwrap.unwrap();
            (u.delete, u.tombstones_pass)
        };
        assert_eq!(delete(""), (DeleteEvent::Tombstone, false));
        assert_eq!(
            delete(r#", "transforms.u.drop.tombstones": "false""#),
            (DeleteEvent::Dropped, true)
        );
        assert_eq!(
            delete(r#", "transforms.u.delete.handling.mode": "rewrite""#),
            (DeleteEvent::Rewritten, false)
        );
        assert_eq!(
            delete(r#", "transforms.u.delete.tombstone.handling.mode": "rewrite-with-tombstone""#),
            (DeleteEvent::Rewritten, true)
        );
        assert_eq!(
            delete(
                r#", "transforms.u.delete.tombstone.handling.mode": "drop", "transforms.u.drop.tombstones": "false""#
            ),
            (DeleteEvent::Dropped, false),
            "the newer key wins"
        );
    }
}
