//! `Range` requests (RFC 9110 §14): one `bytes=` range, or the whole representation.

/// A `Range` that cannot be satisfied (416).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsatisfiable {
    /// The size of what was asked for, for the `Content-Range` of the answer.
    pub size: u64,
}

/// A single `bytes=` range against `size`: `Ok(None)` for no (or an ignorable) Range header,
/// `Err(Unsatisfiable)` when it cannot be satisfied.
pub(crate) fn parse_range(
    header: Option<&str>,
    size: u64,
) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let bad = Unsatisfiable { size };
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None); // multiple ranges: answer with the whole file
    }
    let (a, b) = spec.split_once('-').ok_or(bad)?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", "") => return Err(bad),
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| bad)?;
            if n == 0 {
                return Err(bad);
            }
            (size.saturating_sub(n), size.checked_sub(1).ok_or(bad)?)
        }
        (s, "") => (s.parse().map_err(|_| bad)?, size.checked_sub(1).ok_or(bad)?),
        (s, e) => {
            let s: u64 = s.parse().map_err(|_| bad)?;
            let e: u64 = e.parse().map_err(|_| bad)?;
            (s, e.min(size.saturating_sub(1)))
        }
    };
    if start >= size || start > end {
        return Err(bad);
    }
    Ok(Some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=-4"), 10), Ok(Some((6, 9))));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some((8, 9))));
        assert_eq!(
            parse_range(Some("bytes=10-"), 10),
            Err(Unsatisfiable { size: 10 })
        );
        assert_eq!(
            parse_range(Some("bytes=4-2"), 10),
            Err(Unsatisfiable { size: 10 })
        );
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(
            parse_range(Some("bytes=-0"), 10),
            Err(Unsatisfiable { size: 10 })
        );
    }
}
