//! What the engine does with one record before batching it: decode, the pipeline's filters, and — for a
//! backfill or a rebuild — the operator's `--filter` and the rebuild's window of event days.

use chrono::NaiveDate;

use crate::config::Pipeline;
use crate::decode;
use crate::error::{Error, Result};
use crate::filter;
use crate::model::Pending;

/// Decides what to do with a record: decode, filters. The ledger horizon is decided per record in the batch
/// transaction ([`crate::sink::Sink::apply`]), against the database's clock and its durable pruned-below day.
pub fn decide(
    pipeline: &Pipeline,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
) -> Pending {
    let (fields, change) = match decode::record(pipeline, key, value, old_key) {
        Ok(decode::Decoded::Fields { fields, change }) => (fields, change),
        Ok(decode::Decoded::Skip(rule)) => return Pending::Filtered(rule.to_string()),
        Err(r) => return Pending::Quarantine(r),
    };
    filter::pending(pipeline, fields, change)
}

/// The optional extras of a backfill or rebuild on top of [`decide`].
#[derive(Default)]
pub struct Extras {
    /// `--filter`: keep only records for which this compiled CEL program is true.
    pub keep: Option<cel_interpreter::Program>,
    /// A rebuild's window of partition-by days (inclusive): records of other days are filtered.
    pub window: Option<(NaiveDate, NaiveDate)>,
    /// Whether each record's partition-by day is computed (a backfill's per-day report).
    pub days: bool,
}

impl Extras {
    /// No `--filter`, no window, no per-day tracking: the decision is [`decide`] alone.
    pub fn is_plain(&self) -> bool {
        self.keep.is_none() && self.window.is_none() && !self.days
    }

    /// Compiles `--filter` against the pipeline's fields.
    ///
    /// # Errors
    /// [`Error::Usage`] naming `--filter` when the expression does not compile.
    pub fn new(
        pipeline: &Pipeline,
        filter: Option<&str>,
        window: Option<(NaiveDate, NaiveDate)>,
    ) -> Result<Extras> {
        let keep = match filter {
            Some(f) => Some(
                pipeline
                    .compile_filter(f)
                    .map_err(|m| Error::Usage(format!("--filter: {m}")))?,
            ),
            None => None,
        };
        Ok(Extras {
            keep,
            window,
            days: true,
        })
    }
}

/// [`decide`] with the [`Extras`]: the decision and the record's partition-by day (`None` when not tracked or
/// not decodable).
///
/// # Errors
/// The evaluation error of `--filter` on this record (the operator's expression failing is not the record's
/// fault: the caller stops before applying it).
pub fn decide_with(
    pipeline: &Pipeline,
    extras: &Extras,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
) -> std::result::Result<(Pending, Option<NaiveDate>), String> {
    if !extras.days && extras.keep.is_none() && extras.window.is_none() {
        return Ok((decide(pipeline, key, value, old_key), None));
    }
    let (fields, change) = match decode::record(pipeline, key, value, old_key) {
        Ok(decode::Decoded::Fields { fields, change }) => (fields, change),
        Ok(decode::Decoded::Skip(rule)) => return Ok((Pending::Filtered(rule.to_string()), None)),
        Err(r) => return Ok((Pending::Quarantine(r), None)),
    };
    let day = decode::partition_day(pipeline, &fields);
    if let (Some((a, b)), Some(d)) = (extras.window, day) {
        if d < a || d > b {
            return Ok((Pending::Filtered("outside-rebuild-window".into()), day));
        }
    }
    if let Some(program) = &extras.keep {
        let ctx = filter::context(pipeline, &fields);
        match filter::eval(program, "--filter", &ctx) {
            Ok(true) => {}
            Ok(false) => return Ok((Pending::Filtered("--filter".into()), day)),
            Err(detail) => return Err(detail),
        }
    }
    Ok((filter::pending(pipeline, fields, change), day))
}
