//! Prefixed ids (`sess_`, `turn_`, `evt_`, `file_`) that sort in creation order.
//!
//! An id is the prefix, 16 hex digits of a process-wide monotonic value (milliseconds since the
//! epoch shifted left 16 bits, plus a counter), and 8 random hex digits so that ids are not
//! guessable. Fixed width, so that string order is creation order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static LAST: AtomicU64 = AtomicU64::new(0);

fn next_value() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        << 16;
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = if now > last { now } else { last + 1 };
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// A new id with this prefix (without the underscore): `new("evt")` → `evt_0191c0ffee000001a1b2c3d4`.
pub fn new(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:08x}", next_value(), fastrand::u32(..))
}

/// Whether `s` looks like an id with this prefix (cheap validation of path parameters).
pub fn is_valid(prefix: &str, s: &str) -> bool {
    s.len() == prefix.len() + 1 + 24
        && s.starts_with(prefix)
        && s.as_bytes()[prefix.len()] == b'_'
        && s[prefix.len() + 1..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_sort_in_creation_order_and_are_unique() {
        let ids: Vec<String> = (0..10_000).map(|_| super::new("evt")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        assert!(super::is_valid("evt", &ids[0]));
        assert!(!super::is_valid("sess", &ids[0]));
        assert!(!super::is_valid("evt", "evt_../../etc"));
    }
}
