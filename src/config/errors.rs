//! `[errors]`: the pipeline's declared error tolerance, after Kafka Connect's `errors.tolerance`
//! (<https://kafka.apache.org/documentation/#sinkconnectorconfigs_errors.tolerance>: `none`, the default, stops
//! the task on an error; `all` skips problem records). replaysafe's `none` is softer than Connect's: a poison
//! record here and there is still quarantined; what stops the pipeline is a *systematic* failure — one reason
//! dominating a partition's records, as a misspelled `[fields]` pointer does.
//!
//! The rule (checked in the batch transaction against the partition's unresolved dead letters, see
//! [`crate::sink::dead_letters::tolerance_statement`]): the batch stops, nothing of it committed, when one of
//! its quarantined records ends
//! - a run of `max-consecutive` consecutive offsets all quarantined for that record's reason, or
//! - a window of `window` consecutive offsets in which more than `max-percent` % of the offsets were
//!   quarantined for that reason.

use serde::Deserialize;
use toml::Spanned;

use super::source::Source;
use crate::error::Result;

/// Default `errors.max-consecutive`: this many consecutive offsets of a partition quarantined for one reason
/// stop the pipeline.
pub const DEFAULT_MAX_CONSECUTIVE: u32 = 100;
/// Default `errors.window`, in offsets.
pub const DEFAULT_WINDOW: u32 = 1000;
/// Default `errors.max-percent`: more than this share (%) of a window quarantined for one reason stops.
pub const DEFAULT_MAX_PERCENT: u32 = 50;
/// The largest `max-consecutive` and `window` accepted (offsets).
pub const MAX_WINDOW: u32 = 1_000_000;

/// `[errors]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawErrors {
    pub tolerance: Option<Spanned<String>>,
    pub max_consecutive: Option<Spanned<i64>>,
    pub window: Option<Spanned<i64>>,
    pub max_percent: Option<Spanned<i64>>,
}

/// What a pipeline does with records it cannot apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    /// `"none"` (default): quarantine, but stop on a systematic failure ([`ErrorsPlan`]'s thresholds).
    None,
    /// `"all"`: quarantine every failing record and go on, whatever the share.
    All,
}

/// `[errors]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorsPlan {
    /// `tolerance`.
    pub tolerance: Tolerance,
    /// `max-consecutive`: consecutive offsets of a partition quarantined for one reason that stop it (1 ..=
    /// [`MAX_WINDOW`]).
    pub max_consecutive: u32,
    /// `window`: offsets over which `max-percent` is counted (1 ..= [`MAX_WINDOW`]).
    pub window: u32,
    /// `max-percent`: more than this share (0 ..= 100 %) of a window quarantined for one reason stops; 100
    /// disables the window rule.
    pub max_percent: u32,
}

impl Default for ErrorsPlan {
    fn default() -> ErrorsPlan {
        ErrorsPlan {
            tolerance: Tolerance::None,
            max_consecutive: DEFAULT_MAX_CONSECUTIVE,
            window: DEFAULT_WINDOW,
            max_percent: DEFAULT_MAX_PERCENT,
        }
    }
}

impl ErrorsPlan {
    /// Whether the batch transaction checks the thresholds.
    pub fn stops(&self) -> bool {
        self.tolerance == Tolerance::None
    }

    /// The quarantined offsets of one reason in a window above which the window rule stops (`count > limit`).
    pub fn window_limit(&self) -> u64 {
        u64::from(self.window) * u64::from(self.max_percent) / 100
    }
}

fn within(
    src: &Source,
    v: &Option<Spanned<i64>>,
    key: &str,
    range: (u32, u32),
    default: u32,
) -> Result<u32> {
    match v {
        None => Ok(default),
        Some(s) if (i64::from(range.0)..=i64::from(range.1)).contains(s.get_ref()) => {
            Ok(u32::try_from(*s.get_ref()).expect("within the u32 range checked above"))
        }
        Some(s) => Err(src.error(
            s.span(),
            format!(
                "`errors.{key}` must be a whole number between {} and {}",
                range.0, range.1
            ),
        )),
    }
}

/// Validates `[errors]` (absent: the defaults).
///
/// # Errors
/// [`crate::error::Error::Config`] (`file:line:column`) for an unknown `tolerance` or a number out of range.
pub fn errors(src: &Source, raw: Option<&RawErrors>) -> Result<ErrorsPlan> {
    let Some(raw) = raw else {
        return Ok(ErrorsPlan::default());
    };
    let tolerance = match &raw.tolerance {
        None => Tolerance::None,
        Some(t) => match t.get_ref().as_str() {
            "none" => Tolerance::None,
            "all" => Tolerance::All,
            other => {
                return Err(src.error(
                    t.span(),
                    format!("`errors.tolerance` must be \"none\" or \"all\", not `{other}`"),
                ))
            }
        },
    };
    Ok(ErrorsPlan {
        tolerance,
        max_consecutive: within(
            src,
            &raw.max_consecutive,
            "max-consecutive",
            (1, MAX_WINDOW),
            DEFAULT_MAX_CONSECUTIVE,
        )?,
        window: within(src, &raw.window, "window", (1, MAX_WINDOW), DEFAULT_WINDOW)?,
        max_percent: within(
            src,
            &raw.max_percent,
            "max-percent",
            (0, 100),
            DEFAULT_MAX_PERCENT,
        )?,
    })
}

#[cfg(test)]
mod tests {
    fn parse(extra: &str) -> crate::Result<super::ErrorsPlan> {
        let text = format!(
            "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nid = {{ path = \"/id\", type = \"text\" }}\n\
             [identity]\nkey = [\"id\"]\n{extra}"
        );
        crate::config::parse("p.toml", &text).map(|p| p.errors)
    }

    #[test]
    fn defaults_values_and_errors() {
        assert_eq!(parse("").unwrap(), super::ErrorsPlan::default());
        let p = parse(
            "[errors]\ntolerance = \"all\"\nmax-consecutive = 5\nwindow = 20\nmax-percent = 30\n",
        )
        .unwrap();
        assert_eq!(
            (p.stops(), p.max_consecutive, p.window, p.window_limit()),
            (false, 5, 20, 6)
        );
        let e = parse("[errors]\ntolerance = \"some\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:9:13: `errors.tolerance` must be"),
            "{e}"
        );
        let e = parse("[errors]\nwindow = 0\n").unwrap_err().to_string();
        assert!(
            e.contains("p.toml:9:10: `errors.window` must be a whole number between 1 and"),
            "{e}"
        );
    }
}
