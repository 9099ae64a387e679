//! Timestamps as the contract writes them: RFC 3339, UTC, milliseconds (`2026-11-30T02:19:13.123Z`).

use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

const FORMAT: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// Now, formatted.
pub fn now() -> String {
    OffsetDateTime::now_utc()
        .format(FORMAT)
        .unwrap_or_else(|_| "1970-01-01T00:00:00.000Z".to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_utc_with_milliseconds() {
        let s = super::now();
        assert_eq!(s.len(), 24, "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.');
    }
}
