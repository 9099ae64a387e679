//! The windows budgets count in: the UTC day (`tokens_per_day`, `tool_calls_per_day`) and the
//! calendar month in UTC (`usd_per_month`), as the store's `YYYY-MM-DD` days, and when each
//! resets (RFC 3339).

use time::{Date, Month, OffsetDateTime};

/// Today, UTC.
pub(crate) fn today() -> Date {
    OffsetDateTime::now_utc().date()
}

/// `YYYY-MM-DD`.
pub(crate) fn day_text(d: Date) -> String {
    format!(
        "{:04}-{:02}-{:02}",
        d.year().clamp(0, 9999),
        u8::from(d.month()),
        d.day()
    )
}

/// A `YYYY-MM-DD` day; `None` for anything else.
pub(crate) fn parse_day(s: &str) -> Option<Date> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let month = Month::try_from(digits(5..7)? as u8).ok()?;
    Date::from_calendar_date(digits(0..4)? as i32, month, digits(8..10)? as u8).ok()
}

/// The first day of `d`'s month.
pub(crate) fn month_start(d: Date) -> Date {
    d.replace_day(1).unwrap_or(d)
}

/// Midnight UTC starting the day after `d`, RFC 3339.
pub(crate) fn next_day_at(d: Date) -> String {
    midnight(day_after(d))
}

/// Midnight UTC starting the month after `d`'s, RFC 3339.
pub(crate) fn next_month_at(d: Date) -> String {
    midnight(month_after(d))
}

/// Seconds from now until midnight UTC starting `d` (at least 1).
pub(crate) fn seconds_until(d: Date) -> u64 {
    let at = d.midnight().assume_utc();
    let left = (at - OffsetDateTime::now_utc()).whole_seconds();
    left.max(1) as u64
}

fn midnight(d: Date) -> String {
    format!("{}T00:00:00Z", day_text(d))
}

/// The day after `d` (itself at the calendar's end).
pub(crate) fn day_after(d: Date) -> Date {
    d.next_day().unwrap_or(d)
}

/// The first day of the month after `d`'s.
pub(crate) fn month_after(d: Date) -> Date {
    let (y, m) = match d.month() {
        Month::December => (d.year() + 1, Month::January),
        m => (d.year(), m.next()),
    };
    Date::from_calendar_date(y, m, 1).unwrap_or(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_resets_are_utc_boundaries() {
        let d = parse_day("2026-12-31").unwrap();
        assert_eq!(day_text(d), "2026-12-31");
        assert_eq!(next_day_at(d), "2027-01-01T00:00:00Z");
        assert_eq!(next_month_at(d), "2027-01-01T00:00:00Z");
        assert_eq!(day_text(month_start(d)), "2026-12-01");
        let d = parse_day("2026-02-14").unwrap();
        assert_eq!(next_month_at(d), "2026-03-01T00:00:00Z");
        assert_eq!(day_text(month_after(d)), "2026-03-01");
        assert_eq!(day_text(day_after(d)), "2026-02-15");
        for bad in [
            "2026-2-14",
            "2026-02-30",
            "20260214",
            "2026-02-1x",
            "+026-02-14",
            "",
        ] {
            assert!(parse_day(bad).is_none(), "{bad}");
        }
    }
}
