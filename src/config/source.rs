//! Where a span of the pipeline file is, for error messages naming `file:line:column`.

use std::ops::Range;

use crate::error::Error;

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
