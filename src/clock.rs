//! Timestamps as the contract writes them: RFC 3339, UTC, milliseconds (`2026-11-30T02:19:13.123Z`).

use time::OffsetDateTime;

/// Now, formatted.
pub fn now() -> String {
    format(OffsetDateTime::now_utc())
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// A timestamp this module wrote (`2026-11-30T02:19:13.123Z`), in milliseconds since the Unix
/// epoch; `None` for anything else.
pub fn parse_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u32> { s.get(from..to)?.parse().ok() };
    let month = time::Month::try_from(num(5, 7)? as u8).ok()?;
    let date = time::Date::from_calendar_date(num(0, 4)? as i32, month, num(8, 10)? as u8).ok()?;
    let at = time::Time::from_hms_milli(
        num(11, 13)? as u8,
        num(14, 16)? as u8,
        num(17, 19)? as u8,
        num(20, 23)? as u16,
    )
    .ok()?;
    let t = time::PrimitiveDateTime::new(date, at).assume_utc();
    Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Milliseconds since the Unix epoch as the contract writes a time (clamped to years 0..9999).
pub fn format_ms(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format(t)
}

/// `t` as the contract writes it. The digits are written here rather than by `time`'s format
/// descriptions, which interpret their items at every call: every event carries a timestamp.
fn format(t: OffsetDateTime) -> String {
    let mut out = String::with_capacity(24);
    // The system clock of a running server reads no year before 0 or after 9999.
    push_digits(&mut out, t.year().clamp(0, 9999) as u32, 4);
    out.push('-');
    push_digits(&mut out, u8::from(t.month()).into(), 2);
    out.push('-');
    push_digits(&mut out, t.day().into(), 2);
    out.push('T');
    push_digits(&mut out, t.hour().into(), 2);
    out.push(':');
    push_digits(&mut out, t.minute().into(), 2);
    out.push(':');
    push_digits(&mut out, t.second().into(), 2);
    out.push('.');
    push_digits(&mut out, t.millisecond().into(), 3);
    out.push('Z');
    out
}

/// `n`'s low `width` decimal digits, zero-padded.
fn push_digits(out: &mut String, n: u32, width: u32) {
    for place in (0..width).rev() {
        out.push(char::from(b'0' + (n / 10u32.pow(place) % 10) as u8));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_utc_with_milliseconds() {
        let s = super::now();
        assert_eq!(s.len(), 24, "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.');
    }

    #[test]
    fn parses_what_it_writes_and_nothing_else() {
        let s = super::now();
        let ms = super::parse_ms(&s).unwrap();
        assert_eq!(super::format_ms(ms), s);
        assert_eq!(super::parse_ms("1970-01-01T00:00:01.500Z"), Some(1500));
        assert_eq!(super::format_ms(1500), "1970-01-01T00:00:01.500Z");
        for bad in [
            "",
            "2026-13-01T00:00:00.000Z",
            "2026-01-01 00:00:00.000Z",
            "2026-01-01T00:00:00Z",
            "x026-01-01T00:00:00.000Z",
        ] {
            assert_eq!(super::parse_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn writes_what_the_time_crate_writes() {
        use time::macros::{datetime, format_description};
        let rfc3339_ms = format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        for t in [
            datetime!(2026-11-30 02:19:13.123 UTC),
            datetime!(2001-01-09 23:05:07.009 UTC),
            datetime!(1999-12-31 00:00:59.999 UTC),
            datetime!(0042-02-28 10:00:00 UTC),
        ] {
            assert_eq!(super::format(t), t.format(rfc3339_ms).unwrap());
        }
    }
}
