//! `key.converter` / `value.converter` (and their `*.`-prefixed settings) → `[source] encoding` and
//! `schema-registry`. replaysafe reads keys and values with one encoding; a registry password is never copied.

use super::input::ConnectorConfig;
use super::jdbc::{secret_file, value, Value};
use super::Notes;

/// The environment variable the generated registry `password-file` names.
pub const REGISTRY_PASSWORD_FILE_VAR: &str = "REPLAYSAFE_REGISTRY_PASSWORD_FILE";

const JSON: &str = "org.apache.kafka.connect.json.JsonConverter";
const CONFLUENT_AVRO: &str = "io.confluent.connect.avro.AvroConverter";
const APICURIO_AVRO: &str = "io.apicurio.registry.utils.converter.AvroConverter";
const CONFLUENT_JSON_SCHEMA: &str = "io.confluent.connect.json.JsonSchemaConverter";

/// `[source] schema-registry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// The Confluent-compatible API's base URL, without credentials.
    pub url: String,
    /// HTTP basic authentication's user.
    pub username: Option<String>,
    /// The file holding the password (a `${…}` reference or the provider's file).
    pub password_file: Option<String>,
}

/// `[source] encoding` and its registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    /// `json`, `avro` or `json-schema`.
    pub encoding: &'static str,
    /// Why, for the comment above it.
    pub why: String,
    /// The registry of `avro` and `json-schema`.
    pub registry: Option<Registry>,
}

/// The encoding a converter class writes, or why replaysafe cannot read it.
fn encoding_of(class: &str) -> std::result::Result<&'static str, String> {
    match class {
        JSON => Ok("json"),
        CONFLUENT_AVRO | APICURIO_AVRO => Ok("avro"),
        CONFLUENT_JSON_SCHEMA => Ok("json-schema"),
        c if c.contains("Protobuf") => Err("Protobuf: replaysafe does not read Protobuf frames".to_string()),
        c if c.ends_with("StringConverter") || c.ends_with("ByteArrayConverter") => Err(format!(
            "`{c}`: replaysafe reads Debezium change events as JSON, or framed by a schema registry (Avro, JSON Schema)"
        )),
        c => Err(format!(
            "`{c}` is not a converter replaysafe reads: {JSON}, {CONFLUENT_AVRO}, {APICURIO_AVRO} or {CONFLUENT_JSON_SCHEMA}"
        )),
    }
}

/// Reads the converters; fatal problems go to `problems` as `(key, message)`.
pub fn read(
    cfg: &ConnectorConfig,
    notes: &mut Notes,
    problems: &mut Vec<(String, String)>,
) -> Option<Encoding> {
    let value_class = cfg.get("value.converter").map(str::to_string);
    let key_class = cfg.get("key.converter").map(str::to_string);
    let mut read_one = |key: &str, class: &Option<String>| match class {
        None => Some(None),
        Some(c) => match encoding_of(c) {
            Ok(e) => Some(Some(e)),
            Err(m) => {
                problems.push((key.to_string(), m));
                None
            }
        },
    };
    let v = read_one("value.converter", &value_class)?;
    let k = read_one("key.converter", &key_class)?;
    let (encoding, prefix, class, why) = match (v, k) {
        (Some(ve), Some(ke)) if ve != ke => {
            problems.push((
                "key.converter".to_string(),
                format!(
                    "keys encoded as {ke} and values as {ve}: replaysafe reads a Debezium pipeline's keys with the \
                     values' encoding — use one converter for both"
                ),
            ));
            return None;
        }
        (Some(e), _) => {
            if k.is_none() {
                notes.check(
                    "key.converter",
                    &format!(
                        "not set: the Connect worker's key converter applies, and replaysafe reads keys as it reads \
                         values ({e}); set key.converter to {} if the worker's differs",
                        value_class.as_deref().unwrap_or_default()
                    ),
                );
            }
            (
                e,
                "value.converter.",
                value_class.clone().unwrap_or_default(),
                format!(
                    "value.converter {}",
                    value_class.as_deref().unwrap_or_default()
                ),
            )
        }
        (None, Some(e)) => {
            notes.check(
                "value.converter",
                &format!("not set: the Connect worker's value converter applies; the key converter's ({e}) is assumed"),
            );
            (
                e,
                "key.converter.",
                key_class.clone().unwrap_or_default(),
                format!("key.converter {}", key_class.as_deref().unwrap_or_default()),
            )
        }
        (None, None) => {
            notes.check(
                "value.converter",
                "not set (nor key.converter): the Connect worker's converters apply; Kafka's default, the \
                 JsonConverter, is assumed — add them to the connector config if the worker uses another",
            );
            return Some(Encoding {
                encoding: "json",
                why: "the Connect worker's converters (not in the connector config): JsonConverter assumed; JSON \
                      with or without schemas is read alike"
                    .to_string(),
                registry: None,
            });
        }
    };
    for p in ["value.converter.", "key.converter."] {
        cfg.mark(&format!("{p}schemas.enable"));
    }
    let registry = match encoding {
        "json" => None,
        _ if class == APICURIO_AVRO => apicurio(cfg, prefix, notes, problems),
        _ => confluent(cfg, prefix, notes, problems),
    };
    if encoding != "json" && registry.is_none() {
        return None;
    }
    // The other side's registry must be the same one.
    let other = if prefix == "value.converter." {
        "key.converter."
    } else {
        "value.converter."
    };
    for k in [
        format!("{other}schema.registry.url"),
        format!("{other}apicurio.registry.url"),
    ] {
        if cfg.get(&k).is_some() {
            notes.check(
                &k,
                "replaysafe reads keys and values through one registry: the values' is written",
            );
        }
    }
    for p in ["value.converter.", "key.converter."] {
        for e in cfg.with_prefix(p) {
            if cfg.unread().iter().any(|u| u.key == e.key) {
                notes.not_carried(
                    &e.key,
                    "a converter setting with no equivalent: replaysafe reads each record's schema by the id in it",
                );
                cfg.mark(&e.key);
            }
        }
    }
    let why = match encoding {
        "json" => format!("{why}: JSON with or without schemas is read alike"),
        _ => format!("{why}: framed by a schema registry"),
    };
    Some(Encoding {
        encoding,
        why,
        registry,
    })
}

/// Confluent's converters: `schema.registry.url`, `basic.auth.*`.
fn confluent(
    cfg: &ConnectorConfig,
    prefix: &str,
    notes: &mut Notes,
    problems: &mut Vec<(String, String)>,
) -> Option<Registry> {
    let url_key = format!("{prefix}schema.registry.url");
    let Some(urls) = cfg.get(&url_key) else {
        problems.push((
            url_key,
            "a registry converter needs the registry's URL".to_string(),
        ));
        return None;
    };
    let mut urls = urls.split(',').map(str::trim);
    let url = urls.next().unwrap_or_default().to_string();
    if urls.next().is_some() {
        notes.differs(
            &url_key,
            "several registry URLs: replaysafe takes the first",
        );
    }
    let (url, mut username, mut password_file) = strip_userinfo(&url_key, &url, notes);
    let source = cfg
        .get(&format!("{prefix}basic.auth.credentials.source"))
        .map(str::to_ascii_uppercase);
    let info_key = [
        format!("{prefix}basic.auth.user.info"),
        format!("{prefix}schema.registry.basic.auth.user.info"),
    ]
    .into_iter()
    .find(|k| cfg.get(k).is_some());
    match (source.as_deref(), info_key) {
        (Some("SASL_INHERIT"), _) => {
            problems.push((
                format!("{prefix}basic.auth.credentials.source"),
                "SASL_INHERIT: replaysafe authenticates to the registry with HTTP basic authentication only".to_string(),
            ));
            return None;
        }
        (_, Some(k)) => {
            let info = cfg.get(&k).unwrap_or_default().to_string();
            match value(&info) {
                Value::Literal(l) => {
                    let (user, password) = l.split_once(':').unwrap_or((l, ""));
                    username = Some(user.to_string());
                    password_file = secret_file(&k, password, REGISTRY_PASSWORD_FILE_VAR, notes);
                }
                _ => {
                    notes.secret(
                        &k,
                        &format!(
                            "read through a config provider: the user is taken from ${{REPLAYSAFE_REGISTRY_USER}} and \
                             the password from the file ${{{REGISTRY_PASSWORD_FILE_VAR}}} names; set both"
                        ),
                    );
                    username = Some("${REPLAYSAFE_REGISTRY_USER}".to_string());
                    password_file = Some(format!("${{{REGISTRY_PASSWORD_FILE_VAR}}}"));
                }
            }
        }
        _ => {}
    }
    for e in cfg.with_prefix(&format!("{prefix}schema.registry.ssl.")) {
        notes.not_carried(
            &e.key,
            "Java key and trust stores: give the registry's ca-file (and cert-file, key-file) as PEM in \
             [source] schema-registry",
        );
        cfg.mark(&e.key);
    }
    Some(Registry {
        url,
        username,
        password_file,
    })
}

/// Apicurio's converter: its native API URL mapped to the Confluent-compatible one, and the framing replaysafe
/// reads (`as-confluent`, `headers.enabled = false`, `use-id = contentId`; docs/cdc.md "Schema registry: Avro,
/// JSON Schema and Protobuf").
fn apicurio(
    cfg: &ConnectorConfig,
    prefix: &str,
    notes: &mut Notes,
    problems: &mut Vec<(String, String)>,
) -> Option<Registry> {
    let url_key = format!("{prefix}apicurio.registry.url");
    let Some(url) = cfg.get(&url_key).map(str::to_string) else {
        problems.push((
            url_key,
            "Apicurio's converter needs the registry's URL".to_string(),
        ));
        return None;
    };
    let base = url.trim_end_matches('/');
    let Some(root) = ["/apis/registry/v2", "/apis/registry/v3"]
        .iter()
        .find_map(|s| base.strip_suffix(s))
    else {
        problems.push((
            url_key,
            "not Apicurio's native API (…/apis/registry/v2 or v3): the Confluent-compatible URL cannot be derived"
                .to_string(),
        ));
        return None;
    };
    let url = format!("{root}/apis/ccompat/v7");
    notes.differs(
        &url_key,
        &format!("the same registry's Confluent-compatible API is read: {url}"),
    );
    let mut ok = true;
    for (k, want) in [
        ("apicurio.registry.as-confluent", "true"),
        ("apicurio.registry.headers.enabled", "false"),
        ("apicurio.registry.use-id", "contentId"),
    ] {
        let key = format!("{prefix}{k}");
        if cfg.get(&key) != Some(want) {
            problems.push((
                key,
                format!(
                    "must be {want}: replaysafe reads Confluent's framing (a 4-byte content id in the value), \
                     not Apicurio's own"
                ),
            ));
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    let (url, mut username, mut password_file) =
        strip_userinfo(&format!("{prefix}apicurio.registry.url"), &url, notes);
    if let Some(u) = cfg.get(&format!("{prefix}apicurio.auth.username")) {
        username = Some(u.to_string());
    }
    let pw_key = format!("{prefix}apicurio.auth.password");
    if let Some(p) = cfg.get(&pw_key).map(str::to_string) {
        password_file = secret_file(&pw_key, &p, REGISTRY_PASSWORD_FILE_VAR, notes);
    }
    Some(Registry {
        url,
        username,
        password_file,
    })
}

/// A registry URL without its `user:password@` (the user kept apart, the password never copied).
fn strip_userinfo(
    key: &str,
    url: &str,
    notes: &mut Notes,
) -> (String, Option<String>, Option<String>) {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return (url.to_string(), None, None);
    };
    let end = url[start..].find('/').map_or(url.len(), |e| start + e);
    let Some(at) = url[start..end].rfind('@').map(|a| start + a) else {
        return (url.to_string(), None, None);
    };
    let info = &url[start..at];
    let bare = format!("{}{}", &url[..start], &url[at + 1..]);
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    let file = if password.is_empty() {
        None
    } else {
        notes.secret(
            key,
            &format!(
                "the URL's password is not copied: the pipeline reads it from the file ${{{REGISTRY_PASSWORD_FILE_VAR}}} \
                 names (first line); set {REGISTRY_PASSWORD_FILE_VAR} before check and run"
            ),
        );
        Some(format!("${{{REGISTRY_PASSWORD_FILE_VAR}}}"))
    };
    (bare, Some(user.to_string()), file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(json: &str) -> (Option<Encoding>, Notes, Vec<(String, String)>) {
        let c = ConnectorConfig::parse("c.json", json).unwrap();
        let (mut notes, mut problems) = (Notes::default(), Vec::new());
        let e = read(&c, &mut notes, &mut problems);
        (e, notes, problems)
    }

    #[test]
    fn confluent_avro_with_credentials() {
        let (e, notes, problems) = enc(
            r#"{"key.converter": "io.confluent.connect.avro.AvroConverter", "value.converter": "io.confluent.connect.avro.AvroConverter",
            "value.converter.schema.registry.url": "http://registry:8081", "value.converter.basic.auth.credentials.source": "USER_INFO",
            "value.converter.basic.auth.user.info": "sr-user:sr-secret", "key.converter.schema.registry.url": "http://registry:8081"}"#,
        );
        assert!(problems.is_empty(), "{problems:?}");
        let e = e.unwrap();
        assert_eq!(e.encoding, "avro");
        let r = e.registry.unwrap();
        assert_eq!(r.url, "http://registry:8081");
        assert_eq!(r.username.as_deref(), Some("sr-user"));
        assert_eq!(
            r.password_file.as_deref(),
            Some("${REPLAYSAFE_REGISTRY_PASSWORD_FILE}")
        );
        assert!(!format!("{notes:?}").contains("sr-secret"));
    }

    #[test]
    fn apicurio_needs_confluent_framing() {
        let (e, _, problems) = enc(
            r#"{"value.converter": "io.apicurio.registry.utils.converter.AvroConverter", "key.converter": "io.apicurio.registry.utils.converter.AvroConverter",
            "value.converter.apicurio.registry.url": "http://r:8080/apis/registry/v2"}"#,
        );
        assert!(e.is_none());
        let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "value.converter.apicurio.registry.as-confluent",
                "value.converter.apicurio.registry.headers.enabled",
                "value.converter.apicurio.registry.use-id"
            ]
        );
        let (e, _, problems) = enc(
            r#"{"value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
            "value.converter.apicurio.registry.url": "http://r:8080/apis/registry/v2", "value.converter.apicurio.registry.as-confluent": "true",
            "value.converter.apicurio.registry.headers.enabled": "false", "value.converter.apicurio.registry.use-id": "contentId"}"#,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            e.unwrap().registry.unwrap().url,
            "http://r:8080/apis/ccompat/v7"
        );
    }

    #[test]
    fn mixed_or_unreadable_converters_are_refused() {
        let (_, _, problems) = enc(
            r#"{"key.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter": "io.confluent.connect.avro.AvroConverter",
            "value.converter.schema.registry.url": "http://r"}"#,
        );
        assert_eq!(problems[0].0, "key.converter");
        let (_, _, problems) =
            enc(r#"{"value.converter": "io.confluent.connect.protobuf.ProtobufConverter"}"#);
        assert_eq!(problems[0].0, "value.converter");
        let (e, notes, problems) = enc(
            r#"{"value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"}"#,
        );
        assert!(problems.is_empty());
        assert_eq!(e.unwrap().encoding, "json");
        assert!(format!("{notes:?}").contains("key.converter"));
    }
}
