//! What every projection kind's config check works with: the [`Ctx`] of one `[[projection]]` entry, what a kind
//! compiles to ([`Compiled`], with the [`Aggregate`] shape of counters and sums), and the [`Settings`] a kind
//! records.

use std::collections::BTreeMap;

use toml::Spanned;

use crate::config::fields::{FieldPlan, Fields, Format};
use crate::config::raw::RawProjection;
use crate::config::source::Source;
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};

/// One `[[projection]]` entry with what its check needs from the rest of the pipeline.
pub(crate) struct Ctx<'a> {
    /// The file, for errors.
    pub src: &'a Source,
    /// The pipeline's `format`.
    pub format: Format,
    /// The pipeline's fields, by name.
    pub fields: &'a Fields<'a>,
    /// `postgres.schema`.
    pub schema: &'a Ident,
    /// Field indices of `[identity] key`.
    pub key: &'a [usize],
    /// Field index of `[identity] partition-by`.
    pub partition_by: Option<usize>,
    /// The entry as written.
    pub p: &'a Spanned<RawProjection>,
    /// Its position among the projections (0-based).
    pub n: usize,
    /// Its pass column in `landed` (`"_pass_N"`, quoted), when it has a filter.
    pub pass: Option<String>,
    /// Every kind but `row`: the condition under which a copy reaches it ([`super::reach_condition`]).
    pub reach: Option<String>,
    /// ` WHERE <pass column> AND <reach>` (either alone, or empty).
    pub where_pass: String,
}

impl Ctx<'_> {
    /// The entry's keys.
    pub fn raw(&self) -> &RawProjection {
        self.p.get_ref()
    }

    /// A key this kind requires.
    ///
    /// # Errors
    /// `a `<kind>` projection needs `<key>``, at the entry.
    pub fn need(&self, v: Option<&Spanned<String>>, k: &str) -> Result<Spanned<String>> {
        v.cloned().ok_or_else(|| {
            self.src.error(
                self.p.span(),
                format!("a `{}` projection needs `{k}`", self.raw().kind.get_ref()),
            )
        })
    }
}

/// What a kind compiles to.
pub(crate) struct Compiled {
    /// Default name (the table's, or `projection-N`).
    pub name: String,
    /// The statement run in each batch transaction.
    pub statement: String,
    /// Idempotent DDL `init` runs.
    pub setup: Vec<String>,
    /// counter/sum: the table's shape.
    pub aggregate: Option<Aggregate>,
    /// It reads the record itself, not only fields ([`super::Reads::Record`]): a `sql` statement naming a
    /// coordinate column or one the copy condition cannot be put around.
    pub reads_record: bool,
}

/// The shape of a counter or sum projection's table.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// The table.
    pub table: QualifiedName,
    /// Field indices of the group-by columns (the primary key).
    pub group_by: Vec<usize>,
    /// The value columns (counter: one; sum: the `add` targets).
    pub values: Vec<Ident>,
    /// Per value column, the field it adds (sum: the `add` field's index; counter: `None`).
    pub value_fields: Vec<Option<usize>>,
}

/// A projection's settings being recorded (see [`super::ProjectionPlan::settings`]), with the fields it reads.
pub(crate) struct Settings<'a> {
    /// The pipeline's fields.
    pub fields: &'a [FieldPlan],
    /// `postgres.schema`.
    pub schema: &'a Ident,
    /// The entry as written.
    pub rp: &'a RawProjection,
    /// `setting → value`.
    pub out: BTreeMap<String, String>,
    /// Names of the fields the projection reads.
    pub used: Vec<String>,
}

impl Settings<'_> {
    /// Records `k = v`.
    pub fn put(&mut self, k: &str, v: String) {
        self.out.insert(k.to_string(), v);
    }

    /// A list key's values as written (empty when absent).
    pub fn list(v: &Option<Spanned<Vec<Spanned<String>>>>) -> Vec<String> {
        v.as_ref()
            .map(|l| l.get_ref().iter().map(|s| s.get_ref().clone()).collect())
            .unwrap_or_default()
    }

    /// A text key's value as written.
    pub fn text(v: &Option<Spanned<String>>) -> Option<String> {
        v.as_ref().map(|s| s.get_ref().clone())
    }

    /// The `table` key schema-qualified (`default` when absent).
    pub fn table(&self, default: &str) -> String {
        let t = Self::text(&self.rp.table).unwrap_or_else(|| default.to_string());
        if t.contains('.') {
            t
        } else {
            format!("{}.{t}", self.schema.as_str())
        }
    }
}
