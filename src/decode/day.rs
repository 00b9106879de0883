//! Calendar days as the pipeline carries them: ISO 8601 `YYYY-MM-DD` text (what PostgreSQL's `date` output
//! gives under `DateStyle = ISO`, and what a `date` field normalises to).
//!
//! Every event of a day-partitioned pipeline has its day read and written several times (decode, the ledger's
//! partition, the claim's column), and chrono's `parse_from_str`/`format` re-parse their format string each
//! call: 7% of the consumer's CPU in the issue 15 profile. These take the fixed-width form directly and fall
//! back to chrono for anything else, so they accept and print exactly what `"%Y-%m-%d"` does.

use std::fmt::Write as _;

use chrono::{
    DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, SecondsFormat, Timelike, Utc,
};

/// The day `text` names: `YYYY-MM-DD` (the same inputs chrono's `"%Y-%m-%d"` accepts), and PostgreSQL's ISO
/// output of the days outside years 1–9999 that [`text`] prints: more year digits (`10000-01-01`) and the
/// ` BC` suffix (`0044-03-15 BC`); `None` when it is not a valid date.
pub fn parse(text: &str) -> Option<NaiveDate> {
    let b = text.as_bytes();
    if b.len() == 10 && b[4] == b'-' && b[7] == b'-' {
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            b[r].iter().try_fold(0u32, |n, &c| {
                c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
            })
        };
        if let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) {
            return NaiveDate::from_ymd_opt(i32::try_from(y).ok()?, m, d);
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some(d);
    }
    // PostgreSQL's forms: `YYYYY-MM-DD` (no sign), `YYYY-MM-DD BC` (year n BC is astronomical year 1 - n).
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    let mut parts = body.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str, n: std::ops::RangeInclusive<usize>| {
        n.contains(&s.len()) && s.bytes().all(|c| c.is_ascii_digit())
    };
    if !digits(y, 4..=7) || !digits(m, 2..=2) || !digits(d, 2..=2) || (!bc && y.len() == 4) {
        return None;
    }
    let y: i32 = y.parse().ok()?;
    let year = if bc {
        if y == 0 {
            return None;
        }
        1 - y
    } else {
        y
    };
    NaiveDate::from_ymd_opt(year, m.parse().ok()?, d.parse().ok()?)
}

/// `day` as PostgreSQL prints a `date` under `DateStyle = ISO`: `YYYY-MM-DD`; years after 9999 with more digits
/// (`10000-01-01`, never chrono's `+10000-01-01`, which PostgreSQL reads as a time zone); years before 1 as
/// `YYYY-MM-DD BC` (astronomical year 0 is 1 BC, −43 is 44 BC).
pub fn text(day: NaiveDate) -> String {
    let mut s = String::with_capacity(13);
    let (year, bc) = if day.year() >= 1 {
        (day.year(), false)
    } else {
        (1 - day.year(), true)
    };
    let _ = write!(s, "{:04}-{:02}-{:02}", year, day.month(), day.day());
    if bc {
        s.push_str(" BC");
    }
    s
}

/// `t` as PostgreSQL input of a `timestamp` in its ISO output form: `YYYY-MM-DD HH:MM:SS[.fraction]` (trailing
/// zeros of the fraction dropped), years as [`text`] prints them, ` BC` last.
pub fn timestamp_text(t: NaiveDateTime) -> String {
    let day = text(t.date());
    let (date, bc) = match day.strip_suffix(" BC") {
        Some(d) => (d.to_string(), " BC"),
        None => (day, ""),
    };
    format!("{date} {}{bc}", time_text(t.time()))
}

/// `t` as `HH:MM:SS[.fraction]`, trailing zeros of the fraction dropped (PostgreSQL's output of a `time`).
pub fn time_text(t: NaiveTime) -> String {
    let mut s = format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second());
    let ns = t.nanosecond() % 1_000_000_000;
    if ns > 0 {
        let f = format!("{ns:09}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s
}

/// An instant as timestamptz input: RFC 3339 (`2026-07-01T00:00:10.5Z`, chrono's form) for years 1–9999;
/// outside them PostgreSQL's own form in UTC (`10000-01-01 00:00:00+00`, `0044-03-15 12:00:00+00 BC`), which
/// RFC 3339 cannot spell and PostgreSQL reads.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    if (1..=9999).contains(&t.year()) {
        return t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    }
    let naive = timestamp_text(t.naive_utc());
    match naive.strip_suffix(" BC") {
        Some(n) => format!("{n}+00 BC"),
        None => format!("{naive}+00"),
    }
}

/// An ISO 8601 date or date-time text as PostgreSQL reads it: Java's `DateTimeFormatter.ISO_*` (Debezium's
/// `ZonedTimestamp`, `IsoDate`, `IsoTimestamp`) writes years after 9999 with a `+` (`+10000-01-01T04:59:59Z`,
/// what `9999-12-31 23:59:59-05` is in UTC) and years before 1 astronomically (`0000` is 1 BC, `-0043` is 44 BC);
/// PostgreSQL reads the former without its sign and the latter as `0044-… BC`. Any other text is returned as
/// it is.
pub fn iso_for_postgres(s: &str) -> std::borrow::Cow<'_, str> {
    let year_len = |t: &str| t.bytes().take_while(u8::is_ascii_digit).count();
    if let Some(rest) = s.strip_prefix('+') {
        let n = year_len(rest);
        if n >= 4 && rest.as_bytes().get(n) == Some(&b'-') {
            return std::borrow::Cow::Owned(rest.to_string());
        }
    }
    let (astro, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let n = year_len(rest);
    if n < 4 || rest.as_bytes().get(n) != Some(&b'-') {
        return std::borrow::Cow::Borrowed(s);
    }
    let Ok(y) = rest[..n].parse::<u64>() else {
        return std::borrow::Cow::Borrowed(s);
    };
    match (astro, y) {
        (false, 0) | (true, _) => std::borrow::Cow::Owned(format!("{:04}{} BC", y + 1, &rest[n..])),
        _ => std::borrow::Cow::Borrowed(s),
    }
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
            if let Some(d) = want.filter(|d| (1..=9999).contains(&d.year())) {
                assert_eq!(text(d), d.format("%Y-%m-%d").to_string(), "{t:?}");
            }
        }
    }

    /// Days and instants outside years 1–9999 print as PostgreSQL prints (and reads) them, and read back.
    #[test]
    fn days_outside_years_1_to_9999_are_postgresql_text() {
        for (y, m, d, want) in [
            (10000, 1, 1, "10000-01-01"),
            (262142, 12, 31, "262142-12-31"),
            (0, 12, 31, "0001-12-31 BC"),
            (-43, 3, 15, "0044-03-15 BC"),
            (-4713, 11, 24, "4714-11-24 BC"),
            (1, 1, 1, "0001-01-01"),
            (9999, 12, 31, "9999-12-31"),
        ] {
            let day = NaiveDate::from_ymd_opt(y, m, d).unwrap();
            assert_eq!(text(day), want);
            assert_eq!(parse(want), Some(day), "{want}");
        }
        assert_eq!(parse("0000-01-01 BC"), None);
        assert_eq!(
            parse("+10000-01-01"),
            NaiveDate::parse_from_str("+10000-01-01", "%Y-%m-%d").ok()
        );
        let t = NaiveDate::from_ymd_opt(-43, 3, 15)
            .unwrap()
            .and_hms_micro_opt(12, 0, 0, 500_000)
            .unwrap();
        assert_eq!(timestamp_text(t), "0044-03-15 12:00:00.5 BC");
        assert_eq!(rfc3339(t.and_utc()), "0044-03-15 12:00:00.5+00 BC");
        let far = NaiveDate::from_ymd_opt(10000, 1, 1)
            .unwrap()
            .and_hms_opt(0, 59, 59)
            .unwrap();
        assert_eq!(rfc3339(far.and_utc()), "10000-01-01 00:59:59+00");
        let near = NaiveDate::from_ymd_opt(2026, 7, 1)
            .unwrap()
            .and_hms_milli_opt(0, 0, 10, 500)
            .unwrap();
        assert_eq!(rfc3339(near.and_utc()), "2026-07-01T00:00:10.500Z");
        for (java, pg) in [
            (
                "+10000-01-01T04:59:59.999999Z",
                "10000-01-01T04:59:59.999999Z",
            ),
            ("-0043-03-15T12:00:00Z", "0044-03-15T12:00:00Z BC"),
            ("0000-12-31", "0001-12-31 BC"),
            ("2026-12-02T01:05:36.649077Z", "2026-12-02T01:05:36.649077Z"),
            ("-infinity", "-infinity"),
            ("infinity", "infinity"),
            ("-5", "-5"),
        ] {
            assert_eq!(iso_for_postgres(java), pg, "{java}");
        }
    }
}
