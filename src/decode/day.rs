//! Calendar days as the pipeline carries them: ISO 8601 `YYYY-MM-DD` text (what PostgreSQL's `date` output
//! gives under `DateStyle = ISO`, and what a `date` field normalises to).
//!
//! Every event of a day-partitioned pipeline has its day read and written several times (decode, the ledger's
//! partition, the claim's column), and chrono's `parse_from_str`/`format` re-parse their format string each
//! call: 7% of the consumer's CPU in the issue 15 profile. These take the fixed-width form directly and fall
//! back to chrono for anything else, so they accept and print exactly what `"%Y-%m-%d"` does.

use std::fmt::Write as _;

use chrono::{Datelike, NaiveDate};

/// The day `text` names: `YYYY-MM-DD` (the same inputs chrono's `"%Y-%m-%d"` accepts); `None` when it is not a
/// valid date.
pub fn parse(text: &str) -> Option<NaiveDate> {
    let b = text.as_bytes();
    if b.len() == 10 && b[4] == b'-' && b[7] == b'-' {
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            b[r].iter().try_fold(0u32, |n, &c| {
                c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
            })
        };
        if let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) {
            return NaiveDate::from_ymd_opt(y as i32, m, d);
        }
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()
}

/// `day` as `YYYY-MM-DD` (years outside 0..=9999 as chrono's `%Y` writes them: with a sign).
pub fn text(day: NaiveDate) -> String {
    let mut s = String::with_capacity(10);
    if (0..=9999).contains(&day.year()) {
        let _ = write!(s, "{:04}-{:02}-{:02}", day.year(), day.month(), day.day());
    } else {
        let _ = write!(s, "{}", day.format("%Y-%m-%d"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_text_agree_with_chrono_formats() {
        for t in [
            "2026-11-30",
            "0001-01-01",
            "9999-12-31",
            "2024-02-29",
            "2023-02-29",
            "2026-13-01",
            "2026-1-5",
            "20261130",
            "2026-11-3x",
            "+12026-11-30",
            "",
        ] {
            let want = NaiveDate::parse_from_str(t, "%Y-%m-%d").ok();
            assert_eq!(parse(t), want, "{t:?}");
            if let Some(d) = want {
                assert_eq!(text(d), d.format("%Y-%m-%d").to_string(), "{t:?}");
            }
        }
        let far = NaiveDate::from_ymd_opt(12026, 1, 2).unwrap();
        assert_eq!(text(far), far.format("%Y-%m-%d").to_string());
    }
}
