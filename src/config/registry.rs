//! `[source] encoding` and `[source] schema-registry`: record values (and keys) framed by a schema registry —
//! byte 0 the magic `0x00`, bytes 1–4 the schema id (big-endian), then Avro binary, JSON text or Protobuf (message
//! indexes, then the message) (Confluent documentation "Wire format"; Apicurio Registry serves the same REST API under `/apis/ccompat/v7`).
//!
//! Secrets: `url`, `username`, `password`, `password-file`, `ca-file`, `cert-file` and `key-file` take
//! `${NAME}` expansion ([`super::expand`]); `password-file` is a file whose first line is the password.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::expand::{expand, expand_as, Secrecy};
use super::Source;
use crate::error::Result;

/// How record values and keys are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Plain JSON text (default). A schema-registry framed payload is quarantined with a reason that says so.
    #[default]
    Json,
    /// Schema-registry framed Avro binary (Confluent / Apicurio `AvroConverter`, `KafkaAvroSerializer`).
    Avro,
    /// Schema-registry framed JSON text (`JsonSchemaConverter`, `KafkaJsonSchemaSerializer`).
    JsonSchema,
    /// Schema-registry framed Protobuf: message indexes, then the message (`ProtobufConverter`,
    /// `KafkaProtobufSerializer`).
    Protobuf,
}

impl Encoding {
    /// The name as written in the pipeline file.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Json => "json",
            Encoding::Avro => "avro",
            Encoding::JsonSchema => "json-schema",
            Encoding::Protobuf => "protobuf",
        }
    }
}

/// `[source] schema-registry = { … }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRegistry {
    pub url: Spanned<String>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    pub password_file: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub cert_file: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
}

/// `[source] schema-registry`, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryPlan {
    /// Base URL of the Confluent-compatible API, without a trailing `/` (e.g.
    /// `http://localhost:8081/apis/ccompat/v7`); schemas are read from `{url}/schemas/ids/{id}`.
    pub url: String,
    /// HTTP basic authentication: user name.
    pub username: Option<String>,
    /// HTTP basic authentication: the password (from `password` or the first line of `password-file`).
    pub password: Option<String>,
    /// PEM file of the CA certificates that verify an `https` registry (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (mutual TLS), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Debug for RegistryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryPlan")
            .field("url", &crate::endpoint::mask_urls(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// `[source] encoding` and `schema-registry`: `avro`, `json-schema` and `protobuf` need a registry; a registry
/// needs one of them.
///
/// # Errors
/// [`crate::error::Error::Config`] at the offending key.
pub fn registry(
    src: &Source,
    encoding: Option<&Spanned<String>>,
    raw: Option<&Spanned<RawRegistry>>,
) -> Result<(Encoding, Option<RegistryPlan>)> {
    let enc = match encoding {
        None => Encoding::Json,
        Some(e) => match e.get_ref().as_str() {
            "json" => Encoding::Json,
            "avro" => Encoding::Avro,
            "json-schema" => Encoding::JsonSchema,
            "protobuf" => Encoding::Protobuf,
            other => {
                return Err(src.error(
                    e.span(),
                    format!(
                        "`encoding` must be \"json\", \"avro\", \"json-schema\" or \"protobuf\", not `{other}`"
                    ),
                ))
            }
        },
    };
    match (enc, raw) {
        (Encoding::Json, None) => Ok((enc, None)),
        (Encoding::Json, Some(r)) => Err(src.error(
            r.span(),
            "`schema-registry` is only read with encoding = \"avro\", \"json-schema\" or \"protobuf\" (encoding is \"json\")",
        )),
        (_, None) => Err(src.error(
            encoding.expect("not the default").span(),
            format!(
                "encoding = \"{}\" needs `schema-registry = {{ url = \"http://…\" }}` in [source]",
                enc.as_str()
            ),
        )),
        (_, Some(r)) => Ok((enc, Some(plan(src, r.get_ref())?))),
    }
}

fn text(src: &Source, v: &Option<Spanned<String>>) -> Result<Option<(String, Spanned<String>)>> {
    match v {
        None => Ok(None),
        Some(s) => Ok(Some((expand(src, s.get_ref(), s.span())?, s.clone()))),
    }
}

fn file(src: &Source, v: &Option<Spanned<String>>, key: &str) -> Result<Option<PathBuf>> {
    let Some((path, at)) = text(src, v)? else {
        return Ok(None);
    };
    if !std::path::Path::new(&path).is_file() {
        return Err(src.error(at.span(), format!("`{key}`: no such file `{path}`")));
    }
    Ok(Some(PathBuf::from(path)))
}

fn plan(src: &Source, r: &RawRegistry) -> Result<RegistryPlan> {
    let url = expand_as(src, r.url.get_ref(), r.url.span(), Secrecy::Url)?;
    let url = url.trim_end_matches('/').to_string();
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(src.error(r.url.span(), "`url` must start with http:// or https://"));
    }
    let username = text(src, &r.username)?.map(|(u, _)| u);
    let secret = match &r.password {
        Some(p) => Some(expand_as(src, p.get_ref(), p.span(), Secrecy::Secret)?),
        None => None,
    };
    let password = match (secret, &r.password_file) {
        (Some(_), Some(f)) => {
            return Err(src.error(f.span(), "give `password` or `password-file`, not both"))
        }
        (Some(p), None) => Some(p),
        (None, Some(_)) => {
            let path = file(src, &r.password_file, "password-file")?
                .expect("password-file is set on this path");
            let at = r
                .password_file
                .as_ref()
                .expect("password-file is set on this path")
                .span();
            let body = std::fs::read_to_string(&path)
                .map_err(|e| src.error(at, format!("`password-file` {}: {e}", path.display())))?;
            Some(body.lines().next().unwrap_or("").to_string())
        }
        (None, None) => None,
    };
    if username.is_some() != password.is_some() {
        let at = r.username.as_ref().map_or(r.url.span(), |u| u.span());
        return Err(src.error(
            at,
            "basic authentication needs both `username` and `password` (or `password-file`)",
        ));
    }
    for (v, key) in [
        (&r.ca_file, "ca-file"),
        (&r.cert_file, "cert-file"),
        (&r.key_file, "key-file"),
    ] {
        if let (Some(s), false) = (v, https) {
            return Err(src.error(s.span(), format!("`{key}` needs an https:// `url`")));
        }
    }
    if r.cert_file.is_some() != r.key_file.is_some() {
        let at = r
            .cert_file
            .as_ref()
            .or(r.key_file.as_ref())
            .expect("one of cert-file and key-file is set here")
            .span();
        return Err(src.error(at, "`cert-file` and `key-file` go together"));
    }
    Ok(RegistryPlan {
        url,
        username,
        password,
        ca_file: file(src, &r.ca_file, "ca-file")?,
        cert_file: file(src, &r.cert_file, "cert-file")?,
        key_file: file(src, &r.key_file, "key-file")?,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    const BASE: &str = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nid = { path = \"/id\", type = \"text\" }\n\
                        [identity]\nkey = [\"id\"]\n";

    fn err(extra: &str) -> String {
        parse("p.toml", &format!("{BASE}{extra}"))
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn avro_needs_a_registry_and_a_registry_needs_avro() {
        let e = err("[source]\nformat = \"json\"\nencoding = \"avro\"\n");
        assert!(
            e.starts_with("p.toml:") && e.contains("needs `schema-registry"),
            "{e}"
        );
        let e = err("[source]\nformat = \"json\"\nschema-registry = { url = \"http://x\" }\n");
        assert!(e.contains("only read with encoding"), "{e}");
        let e = err("[source]\nformat = \"json\"\nencoding = \"protobuf3\"\n");
        assert!(
            e.contains("`encoding` must be") && e.contains("\"protobuf\""),
            "{e}"
        );
        let e = err("[source]\nformat = \"json\"\nencoding = \"protobuf\"\n");
        assert!(
            e.contains("encoding = \"protobuf\" needs `schema-registry"),
            "{e}"
        );
    }

    #[test]
    fn registry_keys_are_checked() {
        let head = "[source]\nformat = \"json\"\nencoding = \"avro\"\n";
        let e = err(&format!(
            "{head}schema-registry = {{ url = \"ftp://x\" }}\n"
        ));
        assert!(e.contains("http:// or https://"), "{e}");
        let e = err(&format!(
            "{head}schema-registry = {{ url = \"http://x\", username = \"u\" }}\n"
        ));
        assert!(e.contains("both `username` and `password`"), "{e}");
        let e = err(&format!(
            "{head}schema-registry = {{ url = \"http://x\", ca-file = \"/etc/hostname\" }}\n"
        ));
        assert!(e.contains("needs an https://"), "{e}");
        let e = err(&format!("{head}schema-registry = {{ url = \"http://x\", password = \"${{NO_SUCH_VAR_R}}\", username = \"u\" }}\n"));
        assert!(e.contains("NO_SUCH_VAR_R"), "{e}");
        let p = parse(
            "p.toml",
            &format!("{BASE}{head}schema-registry = {{ url = \"http://h:1/apis/ccompat/v7/\", username = \"u\", password = \"s3cret\" }}\n"),
        )
        .expect("valid");
        let r = p.registry.as_ref().expect("registry");
        assert_eq!(r.url, "http://h:1/apis/ccompat/v7");
        assert!(!format!("{r:?}").contains("s3cret"));
    }
}
