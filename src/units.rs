//! Conversions between the integer types that offsets, counts, days and durations cross — `i64` in Kafka and
//! PostgreSQL, `u64` counters, `usize` lengths, `u128` milliseconds of a `Duration` — in one place. Each saturates
//! at the target's bounds instead of wrapping, so a conversion never silently turns a large value into a small or
//! negative one (the `cast_*` lints of `Cargo.toml` refuse a bare `as` between them).

use std::time::Duration;

/// Milliseconds of `d`, `u64::MAX` past it (585 million years).
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A count or length that PostgreSQL or Kafka gives as `i64` (never negative there): 0 below 0.
pub fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A `u64` count as PostgreSQL's `bigint`: `i64::MAX` past it.
pub fn bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A length as PostgreSQL's `bigint`: `i64::MAX` past it.
pub fn bigint_len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A day count as PostgreSQL's `integer`: `i32::MAX` past it.
pub fn int_days(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A `u64` as a length or index: `usize::MAX` past it (32-bit targets).
pub fn len(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_saturate_instead_of_wrapping() {
        assert_eq!(ms(Duration::from_millis(1_500)), 1_500);
        assert_eq!(ms(Duration::MAX), u64::MAX);
        assert_eq!(count(-1), 0);
        assert_eq!(count(i64::MAX), i64::MAX as u64);
        assert_eq!(bigint(u64::MAX), i64::MAX);
        assert_eq!(bigint(7), 7);
        assert_eq!(bigint_len(usize::MAX), i64::MAX);
        assert_eq!(int_days(u32::MAX), i32::MAX);
        assert_eq!(int_days(400), 400);
        assert_eq!(len(u64::MAX), usize::MAX);
    }
}
