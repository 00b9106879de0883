//! SQL identifiers that come from configuration: validated, then always quoted.

use std::fmt;

/// Maximum identifier length PostgreSQL keeps (NAMEDATALEN - 1 bytes; PostgreSQL manual, "Identifiers and
/// Key Words").
pub const MAX_IDENT_BYTES: usize = 63;

/// A validated SQL identifier: `[a-z_][a-z0-9_]*`, at most 63 bytes. Rendered double-quoted by `Display`,
/// so it can never close the quote or smuggle SQL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    /// Validates `name`.
    ///
    /// # Errors
    /// A message naming the rule that `name` breaks.
    pub fn new(name: &str) -> Result<Self, String> {
        let mut chars = name.chars();
        let first_ok = matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return Err(format!(
                "`{name}` is not a valid SQL identifier: use lower-case letters, digits and `_`, starting with a letter or `_`"
            ));
        }
        if name.len() > MAX_IDENT_BYTES {
            return Err(format!(
                "`{name}` is longer than {MAX_IDENT_BYTES} bytes (PostgreSQL would truncate it)"
            ));
        }
        Ok(Ident(name.to_string()))
    }

    /// The bare name (no quotes).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// A schema-qualified table name, rendered `"schema"."table"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualifiedName {
    /// The schema.
    pub schema: Ident,
    /// The table.
    pub name: Ident,
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_quotes_them() {
        assert_eq!(
            Ident::new("daily_counts").unwrap().to_string(),
            "\"daily_counts\""
        );
    }

    #[test]
    fn rejects_injection_and_odd_names() {
        for bad in [
            "x\"; drop table t; --",
            "Daily",
            "1abc",
            "",
            "a-b",
            "a b",
            &"a".repeat(64),
        ] {
            assert!(Ident::new(bad).is_err(), "{bad} accepted");
        }
    }
}
