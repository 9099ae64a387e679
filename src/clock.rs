//! Timestamps as the contract writes them: RFC 3339, UTC, milliseconds (`2026-11-30T02:19:13.123Z`).

use time::OffsetDateTime;

/// Now, formatted.
pub fn now() -> String {
    format(OffsetDateTime::now_utc())
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
