//! The schema-registry client: schemas fetched by id over the Confluent-compatible REST API
//! (`GET {url}/schemas/ids/{id}` → `{"schema": "…", "schemaType": "AVRO" | "JSON" | "PROTOBUF", "references":
//! [{"name", "subject", "version"}]}`, Confluent
//! "Schema Registry API Reference"; Apicurio Registry serves it under `/apis/ccompat/v7`) and cached for the
//! life of the process (a schema id never changes its schema).
//!
//! A registry that does not answer (connection refused, timeout, HTTP 5xx/429) is retried with backoff for at
//! most `--connect-timeout` ([`crate::endpoint::connect_timeout`]); then [`Fetch::Unavailable`] stops the
//! pipeline like an unreachable database — never a dead letter. An id the registry does not know (HTTP 404) is
//! the record's fault: [`Fetch::Unknown`] quarantines it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

use crate::config::RegistryPlan;

/// The last schema fetch's retry while the registry is unavailable: when it was made and its error (already
/// scrubbed of secrets); `None` once a fetch got an answer. Read by `/readyz` (rule 7 of `health.rs`).
static RETRYING: std::sync::Mutex<Option<(Instant, String)>> = std::sync::Mutex::new(None);

/// Records a fetch's retry (`Some`: its error) or an answer (`None`) for [`retrying`].
fn retried(error: Option<&str>) {
    let mut r = RETRYING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *r = error.map(|e| (Instant::now(), e.to_string()));
}

/// Whether schema fetches are being retried: since when the last retry was made and its error.
pub fn retrying() -> Option<(Instant, String)> {
    RETRYING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// A schema the registry returned for an id.
#[derive(Debug)]
pub enum Schema {
    /// An Avro schema: parsed, and its Kafka Connect form (the JSON converter's `schema` member) for Debezium.
    Avro {
        /// The writer's schema.
        schema: apache_avro::Schema,
        /// The schemas it references (`references` of the registry's answer, fetched by subject and version,
        /// dependencies first).
        refs: Vec<apache_avro::Schema>,
        /// The schema's JSON text, parsed (custom properties such as `connect.name` kept), after its
        /// references' JSON, with their Connect schema.
        json: Box<crate::decode::avro::SchemaJson>,
    },
    /// A JSON Schema (the payload is JSON text; the schema itself is not needed to read it).
    Json,
    /// A Protobuf schema: the `.proto` file compiled with its references (imports), well-known types resolved.
    Protobuf(crate::decode::protobuf::ProtoSchema),
    /// Another type, named as the registry names it.
    Other(String),
}

/// A schema the registry's answer references (`references[]`: `name` is the import path a Protobuf schema's
/// `import` names; `subject`/`version` where its text was fetched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The reference's `name` (a Protobuf import path, an Avro full name).
    pub name: String,
    /// The referenced schema's text.
    pub text: String,
}

/// Why a schema could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetch {
    /// The registry does not know the id (or returned a schema that does not parse): the record is quarantined.
    Unknown(String),
    /// The registry could not be reached within `--connect-timeout`, or refused our credentials: the pipeline
    /// stops (exit 1) with nothing of the record applied.
    Unavailable(String),
}

/// The client and its cache; shared by every decoding thread.
pub struct Registry {
    plan: RegistryPlan,
    /// The strings no message may show: the password, the URL's password (as written and percent-decoded), the
    /// basic-authentication token.
    secrets: Vec<String>,
    agent: Mutex<Option<ureq::Agent>>,
    cache: Mutex<HashMap<u32, Arc<Schema>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("plan", &self.plan)
            .finish()
    }
}

/// The process's client for `plan`, built on first use and shared by every decoding thread (one schema cache
/// per registry: schema ids are the registry's).
pub fn client(plan: &RegistryPlan) -> Arc<Registry> {
    static CLIENTS: Mutex<Vec<Arc<Registry>>> = Mutex::new(Vec::new());
    let mut all = CLIENTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = all.iter().find(|r| r.plan == *plan) {
        return r.clone();
    }
    let r = Arc::new(Registry::new(plan.clone()));
    all.push(r.clone());
    r
}

impl Registry {
    /// A client for `plan`; no request is made until a schema is needed.
    pub fn new(plan: RegistryPlan) -> Registry {
        Registry {
            secrets: secrets(&plan),
            plan,
            agent: Mutex::new(None),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The validated settings.
    pub fn plan(&self) -> &RegistryPlan {
        &self.plan
    }

    /// `text` (a message that may hold the URL or the registry's answer) without a credential: URL passwords
    /// masked ([`crate::endpoint::mask_urls`]), every secret of the settings replaced by `***`.
    fn scrub(&self, text: &str) -> String {
        let mut out = crate::endpoint::mask_urls(text);
        for s in &self.secrets {
            out = out.replace(s.as_str(), crate::endpoint::MASK);
        }
        out
    }

    /// The registry's answer for a message: at most 200 characters, control characters escaped, no credential.
    fn short(&self, body: &str) -> String {
        self.scrub(&crate::printable::bounded(body.trim(), 200))
    }

    /// The schema of `id`, from the cache or the registry.
    ///
    /// # Errors
    /// [`Fetch::Unknown`] (quarantine the record) or [`Fetch::Unavailable`] (stop the pipeline).
    pub fn schema(&self, id: u32) -> Result<Arc<Schema>, Fetch> {
        if let Some(s) = self
            .cache
            .lock()
            .expect("cache: a thread panicked holding this lock")
            .get(&id)
        {
            return Ok(s.clone());
        }
        let body = self.fetch(&format!("/schemas/ids/{id}"))?;
        let mut refs = Vec::new();
        self.references(id, &body, &mut refs, 0)?;
        let schema = Arc::new(parse(id, &body, &refs)?);
        self.cache
            .lock()
            .expect("cache: a thread panicked holding this lock")
            .insert(id, schema.clone());
        Ok(schema)
    }

    /// Puts the registry's answer for `id` (`{"schema": "…", "schemaType": …}`, as `GET /schemas/ids/{id}`
    /// returns it) into the cache without asking the registry: for benchmarks and offline tools.
    ///
    /// # Errors
    /// [`Fetch::Unknown`] when the answer or its schema does not parse.
    pub fn cache_answer(&self, id: u32, answer: &str) -> Result<(), Fetch> {
        let schema = Arc::new(parse(id, answer, &[])?);
        self.cache
            .lock()
            .expect("cache: a thread panicked holding this lock")
            .insert(id, schema);
        Ok(())
    }

    fn agent(&self) -> Result<ureq::Agent, Fetch> {
        let mut slot = self
            .agent
            .lock()
            .expect("agent: a thread panicked holding this lock");
        if let Some(a) = slot.as_ref() {
            return Ok(a.clone());
        }
        let a = agent(&self.plan).map_err(|m| Fetch::Unavailable(self.scrub(&m)))?;
        *slot = Some(a.clone());
        Ok(a)
    }

    /// The schema texts `answer`'s `references` name (`GET {url}/subjects/{subject}/versions/{version}`),
    /// their own references first, each once, at most 16 levels deep.
    fn references(
        &self,
        id: u32,
        answer: &str,
        out: &mut Vec<Reference>,
        depth: u32,
    ) -> Result<(), Fetch> {
        let v: Value = serde_json::from_str(answer)
            .map_err(|e| not_the_api(id, &format!("answer is not JSON: {e}")))?;
        let Some(refs) = v.get("references").and_then(Value::as_array) else {
            return Ok(());
        };
        if depth > 16 && !refs.is_empty() {
            return Err(Fetch::Unknown(format!(
                "schema id {id}: references nested deeper than 16"
            )));
        }
        for r in refs {
            let name = r.get("name").and_then(Value::as_str).unwrap_or("");
            let (Some(subject), Some(version)) =
                (r.get("subject").and_then(Value::as_str), r.get("version"))
            else {
                return Err(Fetch::Unknown(format!(
                    "schema id {id}: a reference without subject/version: {}",
                    crate::printable::bounded(&r.to_string(), 200)
                )));
            };
            let body = self.fetch(&format!("/subjects/{subject}/versions/{version}"))?;
            self.references(id, &body, out, depth + 1)?;
            let text = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|b| b.get("schema").and_then(Value::as_str).map(str::to_string))
                .ok_or_else(|| {
                    Fetch::Unknown(format!("schema id {id}: reference {subject} has no schema"))
                })?;
            let reference = Reference {
                name: name.to_string(),
                text,
            };
            if !out.contains(&reference) {
                out.push(reference);
            }
        }
        Ok(())
    }

    /// `GET {url}{path}`, retried while the registry is unavailable.
    fn fetch(&self, path: &str) -> Result<String, Fetch> {
        let agent = self.agent()?;
        let url = format!("{}{path}", self.plan.url);
        let started = Instant::now();
        let bound = crate::endpoint::connect_timeout();
        let mut attempt = 0u32;
        loop {
            let attempt_result = self.get(&agent, &url).scrubbed(self);
            if matches!(attempt_result, Attempt::Done(_) | Attempt::Unknown(_)) {
                retried(None);
            }
            match attempt_result {
                Attempt::Done(body) => return Ok(body),
                Attempt::Unknown(m) => return Err(Fetch::Unknown(m)),
                Attempt::Refused(m) => return Err(Fetch::Unavailable(m)),
                Attempt::Retry(m) if started.elapsed() >= bound => {
                    return Err(Fetch::Unavailable(self.scrub(&format!(
                        "schema registry {}: {}: {m}",
                        self.plan.url,
                        crate::endpoint::gave_up(started.elapsed())
                    ))))
                }
                Attempt::Retry(m) => {
                    attempt += 1;
                    metrics::counter!("replaysafe_registry_retries_total").increment(1);
                    tracing::warn!(attempt, "schema registry unavailable, retrying: {m}");
                    retried(Some(&m));
                    let pause = Duration::from_millis(100 * 2u64.pow(attempt.min(6)));
                    std::thread::sleep(pause.min(bound.saturating_sub(started.elapsed())));
                }
            }
        }
    }

    fn get(&self, agent: &ureq::Agent, url: &str) -> Attempt {
        let mut req = agent.get(url).header(
            "Accept",
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        if let (Some(u), Some(p)) = (&self.plan.username, &self.plan.password) {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            req = req.header("Authorization", format!("Basic {token}"));
        }
        let mut resp = match req.call() {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(format!("GET {url}: {e}")),
        };
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(16 * 1024 * 1024)
            .read_to_string();
        let body = match body {
            Ok(b) => b,
            Err(e) => return Attempt::Retry(format!("GET {url}: reading the answer: {e}")),
        };
        match status {
            200 => Attempt::Done(body),
            404 if not_found(&body) => Attempt::Unknown(format!(
                "the registry has no schema with this id ({})",
                self.short(&body)
            )),
            404 => Attempt::Refused(format!(
                "schema registry {}: GET {url} answered HTTP 404 without the registry's \"not found\" error code                  (40401–40499): the URL does not serve the Confluent-compatible API — check [source]                  schema-registry url (Apicurio Registry: …/apis/ccompat/v7, not …/apis/registry/v2): {}",
                self.plan.url,
                self.short(&body)
            )),
            401 | 403 => Attempt::Refused(format!(
                "schema registry {}: HTTP {status} (credentials refused): {}",
                self.plan.url,
                self.short(&body)
            )),
            _ => Attempt::Retry(format!("GET {url}: HTTP {status}: {}", self.short(&body))),
        }
    }
}

/// Whether a 404 answer is the registry's own "not found" (Confluent error codes 40401 subject, 40402 version,
/// 40403 schema; Confluent "Schema Registry API Reference", Errors), not a path the server does not serve (a
/// wrong base URL: every id would look unknown and every record would be dead-lettered).
fn not_found(body: &str) -> bool {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("error_code").and_then(Value::as_i64))
        .is_some_and(|c| (40401..=40499).contains(&c))
}

enum Attempt {
    Done(String),
    Unknown(String),
    Refused(String),
    Retry(String),
}

impl Attempt {
    /// The attempt with its message scrubbed of credentials ([`Registry::scrub`]); the answer of a success is
    /// data, kept as is.
    fn scrubbed(self, r: &Registry) -> Attempt {
        match self {
            Attempt::Done(b) => Attempt::Done(b),
            Attempt::Unknown(m) => Attempt::Unknown(r.scrub(&m)),
            Attempt::Refused(m) => Attempt::Refused(r.scrub(&m)),
            Attempt::Retry(m) => Attempt::Retry(r.scrub(&m)),
        }
    }
}

/// What no message about `plan`'s registry may show: the password, the password of the URL's userinfo (as
/// written and percent-decoded), and the `Authorization: Basic` token (`user:password` in base64).
fn secrets(plan: &RegistryPlan) -> Vec<String> {
    let mut out: Vec<String> = plan.password.iter().cloned().collect();
    if let (Some(u), Some(p)) = (&plan.username, &plan.password) {
        out.push(base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}")));
    }
    let authority = plan
        .url
        .split_once("://")
        .map_or("", |(_, rest)| rest.rsplit_once('@').map_or("", |(u, _)| u));
    if let Some((user, pw)) = authority.split_once(':') {
        out.push(pw.to_string());
        out.push(percent_decoded(pw));
        out.push(base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            percent_decoded(user),
            percent_decoded(pw)
        )));
    }
    out.retain(|s| !s.is_empty());
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `%XX` escapes decoded (RFC 3986 § 2.1); an invalid escape or non-UTF-8 result is kept as written.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// An HTTP 200 answer that is not the registry's `{"schema": …}` (an HTML page of a proxy or a UI, another API):
/// the URL's fault, not the record's — every id would fail the same way — so the pipeline stops
/// ([`Fetch::Unavailable`]) instead of dead-lettering every record.
fn not_the_api(id: u32, what: &str) -> Fetch {
    Fetch::Unavailable(format!(
        "schema registry answer for schema id {id} is not the Confluent-compatible API's ({what}): check [source] \
         schema-registry url (Apicurio Registry: …/apis/ccompat/v7)"
    ))
}

/// The registry's answer for `id` (and the schemas it references) → a [`Schema`].
fn parse(id: u32, body: &str, references: &[Reference]) -> Result<Schema, Fetch> {
    let bad = |m: String| Fetch::Unknown(format!("schema id {id}: {m}"));
    let v: Value = serde_json::from_str(body)
        .map_err(|e| not_the_api(id, &format!("answer is not JSON: {e}")))?;
    let text = v
        .get("schema")
        .and_then(Value::as_str)
        .ok_or_else(|| not_the_api(id, "answer has no `schema` string"))?;
    match v
        .get("schemaType")
        .and_then(Value::as_str)
        .unwrap_or("AVRO")
    {
        "AVRO" => {
            let mut refs: Vec<String> = Vec::new();
            for r in references {
                if !refs.contains(&r.text) {
                    refs.push(r.text.clone());
                }
            }
            let refs = refs.as_slice();
            let (schema, refs_parsed) = if refs.is_empty() {
                (apache_avro::Schema::parse_str(text), Vec::new())
            } else {
                match apache_avro::Schema::parse_str_with_list(text, refs) {
                    Ok((s, r)) => (Ok(s), r),
                    Err(e) => (Err(e), Vec::new()),
                }
            };
            let schema = schema.map_err(|e| bad(format!("not a valid Avro schema: {e}")))?;
            let json = refs
                .iter()
                .map(String::as_str)
                .chain([text])
                .map(|t| serde_json::from_str(t).map_err(|e| bad(format!("{e}"))))
                .collect::<Result<Vec<Value>, Fetch>>()?;
            Ok(Schema::Avro {
                schema,
                refs: refs_parsed,
                json: Box::new(crate::decode::avro::SchemaJson::new(json)),
            })
        }
        "JSON" => Ok(Schema::Json),
        "PROTOBUF" => crate::decode::protobuf::ProtoSchema::compile(id, text, references)
            .map(Schema::Protobuf)
            .map_err(|m| bad(format!("not a valid Protobuf schema: {m}"))),
        other => Ok(Schema::Other(other.to_string())),
    }
}

/// The HTTP agent: a bounded attempt (10 s, or `--connect-timeout` when shorter), statuses as answers, TLS by
/// OpenSSL (native-tls) with `ca-file` roots and the `cert-file`/`key-file` client certificate.
fn agent(plan: &RegistryPlan) -> Result<ureq::Agent, String> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut tls = TlsConfig::builder().provider(TlsProvider::NativeTls);
    tls = match &plan.ca_file {
        Some(p) => {
            let pem = read(p)?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(format!("{}: {e}", p.display()))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            tls.root_certs(RootCerts::new_with_certs(&certs))
        }
        None => tls.root_certs(RootCerts::PlatformVerifier),
    };
    if let (Some(c), Some(k)) = (&plan.cert_file, &plan.key_file) {
        let cert = Certificate::from_pem(&read(c)?).map_err(|e| format!("{}: {e}", c.display()))?;
        let key = PrivateKey::from_pem(&read(k)?).map_err(|e| format!("{}: {e}", k.display()))?;
        tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
    }
    let attempt = crate::endpoint::ATTEMPT_TIMEOUT.min(crate::endpoint::connect_timeout());
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(attempt.max(Duration::from_secs(1))))
        .http_status_as_error(false)
        .tls_config(tls.build())
        .build();
    Ok(config.into())
}
