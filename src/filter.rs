//! Filters: CEL expressions over a record's typed fields (the `cel-interpreter` crate; CEL language
//! definition: github.com/google/cel-spec).
//!
//! `[[filter]] drop-if` rules decide before the ledger claim (a filtered record is counted under its rule's
//! name and never claimed, so a later backfill can still apply it); a projection's `filter` decides, per landed
//! row, whether that projection sees the row.

use std::sync::Arc;

use cel_interpreter::{Context, Program, Value};

use crate::config::Pipeline;
use crate::decode::{CelValue, Fields};

fn json_to_cel(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            let t = n.to_string();
            match t.parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Float(t.parse::<f64>().unwrap_or(f64::NAN)),
            }
        }
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(a) => Value::List(Arc::new(a.iter().map(json_to_cel).collect())),
        serde_json::Value::Object(o) => {
            let map: std::collections::HashMap<String, Value> =
                o.iter().map(|(k, v)| (k.clone(), json_to_cel(v))).collect();
            Value::from(map)
        }
    }
}

/// Builds the CEL context of one record: every field under its name (missing optional fields are `null`).
pub fn context<'a>(pipeline: &Pipeline, fields: &Fields) -> Context<'a> {
    let mut ctx = Context::default();
    for (plan, value) in pipeline.fields.iter().zip(fields) {
        let v = match value.as_ref().map(|v| (&v.cel, &v.text)) {
            None => Value::Null,
            Some((CelValue::String, s)) => Value::String(Arc::new(s.clone())),
            Some((CelValue::Int(i), _)) => Value::Int(*i),
            Some((CelValue::Float(f), _)) => Value::Float(*f),
            Some((CelValue::Bool(b), _)) => Value::Bool(*b),
            Some((CelValue::Json(j), _)) => json_to_cel(j),
        };
        ctx.add_variable_from_value(plan.name.as_str().to_string(), v);
    }
    ctx
}

/// Evaluates a boolean expression. A panic inside the CEL interpreter is caught silently ([`crate::cel::quietly`])
/// and becomes this record's evaluation error.
///
/// # Errors
/// A message when evaluation fails or the result is not a boolean.
pub fn eval(program: &Program, expr: &str, ctx: &Context<'_>) -> Result<bool, String> {
    match crate::cel::quietly(|| program.execute(ctx)) {
        Ok(Ok(Value::Bool(b))) => Ok(b),
        Ok(Ok(other)) => Err(format!("`{expr}` gave {other:?}, not a boolean")),
        Ok(Err(e)) => Err(format!("`{expr}` failed: {e}")),
        Err(panic) => Err(format!(
            "`{expr}` failed inside the CEL interpreter: {panic}"
        )),
    }
}

/// What the filters decided for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Keep; `passes[i]` says whether projection pass column `i` is true.
    Keep {
        /// One entry per projection with a `filter`, in pass-column order.
        passes: Vec<bool>,
        /// One entry per projection: whether its `delete-if` (JSON row projections) is true.
        deletes: Vec<bool>,
    },
    /// Dropped by the named `[[filter]]` rule.
    Filtered(String),
}

/// Runs the `[[filter]]` rules, then the projection filters.
///
/// # Errors
/// A message when an expression fails on this record (the record is then quarantined as `filter-error`).
pub fn decide(pipeline: &Pipeline, fields: &Fields) -> Result<Decision, String> {
    let has_deletes = pipeline
        .projections
        .iter()
        .any(|p| p.row.as_ref().is_some_and(|r| r.delete_if.is_some()));
    let needs = !pipeline.filters.is_empty() || pipeline.pass_columns() > 0 || has_deletes;
    if !needs {
        return Ok(Decision::Keep {
            passes: Vec::new(),
            deletes: Vec::new(),
        });
    }
    let ctx = context(pipeline, fields);
    for f in &pipeline.filters {
        if eval(&f.program, &f.expr, &ctx).map_err(|e| format!("filter `{}`: {e}", f.name))? {
            return Ok(Decision::Filtered(f.name.clone()));
        }
    }
    let mut passes = Vec::new();
    for p in &pipeline.projections {
        if let Some((src, program)) = &p.filter {
            passes.push(
                eval(program, src, &ctx)
                    .map_err(|e| format!("projection `{}` filter: {e}", p.name))?,
            );
        }
    }
    let mut deletes = Vec::new();
    if has_deletes {
        for p in &pipeline.projections {
            deletes.push(match p.row.as_ref().and_then(|r| r.delete_if.as_ref()) {
                Some((src, program)) => eval(program, src, &ctx)
                    .map_err(|e| format!("projection `{}` delete-if: {e}", p.name))?,
                None => false,
            });
        }
    }
    Ok(Decision::Keep { passes, deletes })
}

/// Runs [`decide`] and turns its answer into what the batch does with the record: claim it, count it as
/// filtered by the rule, or quarantine it as `filter-error`.
pub fn pending(
    pipeline: &Pipeline,
    fields: Fields,
    change: Option<std::sync::Arc<crate::decode::debezium::Change>>,
) -> crate::model::Pending {
    use crate::decode::{Reason, Rejection};
    use crate::model::Pending;
    match decide(pipeline, &fields) {
        Ok(Decision::Keep { passes, deletes }) => Pending::Claim {
            fields,
            passes,
            change,
            deletes,
        },
        Ok(Decision::Filtered(rule)) => Pending::Filtered(rule),
        Err(detail) => Pending::Quarantine(Rejection {
            reason: Reason::FilterError,
            detail,
        }),
    }
}
