//! The pipeline file: parsed in two stages, [`raw`] (TOML as written) and [`plan`] (validated, typed).
//!
//! Every error names `file:line:column`. See `reference.toml` for every key, its default and unit.

pub mod plan;
pub mod raw;

pub use plan::{
    FieldPlan, FieldType, FilterPlan, IdentityPlan, KafkaPlan, LedgerPlan, Pipeline, PostgresPlan,
    ProjectionKind, ProjectionPlan, StartPolicy,
};

use std::ops::Range;
use std::path::Path;

use crate::error::{Error, Result};

/// Where a span of the file is, for error messages.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file name as given.
    pub path: String,
    /// The file's text.
    pub text: String,
}

impl Source {
    /// `file:line:column` (1-based) of byte offset `pos`.
    pub fn locate(&self, pos: usize) -> String {
        let pos = pos.min(self.text.len());
        let before = &self.text[..pos];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("{}:{}:{}", self.path, line, col)
    }

    /// A config error at `span`.
    pub fn error(&self, span: Range<usize>, message: impl Into<String>) -> Error {
        Error::Config {
            location: self.locate(span.start),
            message: message.into(),
        }
    }
}

/// Reads, parses and validates a pipeline file. Environment: `DATABASE_URL` when `postgres.url` is absent,
/// `KAFKA_BROKERS` when `kafka.brokers` is absent.
///
/// # Errors
/// [`Error::ReadConfig`] when the file cannot be read, [`Error::Config`] (with `file:line:column`) for any
/// syntax error, unknown key, bad type, bad JSON pointer, unknown field reference, invalid SQL identifier or
/// CEL expression that does not compile.
pub fn load(path: &Path) -> Result<Pipeline> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&path.display().to_string(), &text)
}

/// Parses and validates pipeline text; `name` is used in error locations.
///
/// # Errors
/// As [`load`], without the I/O error.
pub fn parse(name: &str, text: &str) -> Result<Pipeline> {
    let src = Source {
        path: name.to_string(),
        text: text.to_string(),
    };
    let raw: raw::RawPipeline = toml::from_str(text).map_err(|e| {
        let location = match e.span() {
            Some(span) => src.locate(span.start),
            None => format!("{name}:1:1"),
        };
        Error::Config {
            location,
            message: e.message().trim().to_string(),
        }
    })?;
    plan::validate(&src, raw)
}
