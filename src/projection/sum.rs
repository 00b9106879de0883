//! `kind = "sum"`: `target += sum(field)` per group, for each `add` entry (see [`super::aggregate`]).

use std::collections::BTreeMap;

use toml::Spanned;

use super::aggregate::{self, Target};
use super::kind::{Compiled, Ctx, Settings};
use crate::config::fields::{ident, FieldType};
use crate::error::Result;

/// The keys a sum takes.
pub(crate) const KEYS: &[&str] = &["table", "group-by", "add", "snapshots"];

/// Checks a sum's keys (`add` maps columns to numeric or bigint fields) and builds its statement and table.
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
pub(crate) fn compile(ctx: &Ctx<'_>) -> Result<Compiled> {
    aggregate::compile(ctx, || {
        let (src, fields) = (ctx.src, ctx.fields);
        let mut targets: Vec<Target> = Vec::new();
        let mut value_fields: Vec<Option<usize>> = Vec::new();
        let add = ctx
            .raw()
            .add
            .as_ref()
            .ok_or_else(|| src.error(ctx.p.span(), "a `sum` projection needs `add`"))?;
        if add.get_ref().is_empty() {
            return Err(src.error(add.span(), "`add` must map at least one column to a field"));
        }
        let adds: &BTreeMap<Spanned<String>, Spanned<String>> = add.get_ref();
        for (target, field) in adds {
            let t = ident(src, target)?;
            let fi = fields.index(field)?;
            let f = &fields.plans[fi];
            if !matches!(f.ty, FieldType::Numeric | FieldType::Bigint) {
                return Err(src.error(
                    field.span(),
                    format!(
                        "`sum` adds numeric or bigint fields; `{}` is {}",
                        field.get_ref(),
                        f.ty.sql()
                    ),
                ));
            }
            targets.push((t, format!("coalesce(sum({}), 0)", f.name), "numeric"));
            value_fields.push(Some(fi));
        }
        Ok((targets, value_fields))
    })
}

/// Records `table`, `group-by` and `add` (and marks the added fields read).
pub(crate) fn settings(s: &mut Settings<'_>) {
    aggregate::settings(s);
    let add: Vec<(String, String)> =
        s.rp.add
            .as_ref()
            .map(|a| {
                a.get_ref()
                    .iter()
                    .map(|(t, f)| (t.get_ref().clone(), f.get_ref().clone()))
                    .collect()
            })
            .unwrap_or_default();
    s.put(
        "add",
        add.iter()
            .map(|(t, f)| format!("{t} = {f}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.used.extend(add.into_iter().map(|(_, f)| f));
}
