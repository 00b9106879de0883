//! `kind = "counter"`: `column += number of landed rows` per group (see [`super::aggregate`]).

use super::aggregate;
use super::kind::{Compiled, Ctx, Settings};
use crate::config::fields::ident;
use crate::error::Result;
use crate::ident::Ident;

/// The keys a counter takes.
pub(crate) const KEYS: &[&str] = &["table", "group-by", "column", "snapshots"];

/// Checks a counter's keys and builds its statement and table.
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
pub(crate) fn compile(ctx: &Ctx<'_>) -> Result<Compiled> {
    aggregate::compile(ctx, || {
        let c = match &ctx.raw().column {
            Some(c) => ident(ctx.src, c)?,
            None => Ident::new("n").expect("a built-in name is a valid SQL identifier"),
        };
        Ok((vec![(c, "count(*)".to_string(), "bigint")], vec![None]))
    })
}

/// Records `table`, `group-by` and `column`.
pub(crate) fn settings(s: &mut Settings<'_>) {
    aggregate::settings(s);
    let column = Settings::text(&s.rp.column).unwrap_or_else(|| "n".into());
    s.put("column", column);
}
