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
    let mut id = String::with_capacity(prefix.len() + 1 + 24);
    id.push_str(prefix);
    id.push('_');
    push_hex(&mut id, next_value(), 16);
    push_hex(&mut id, u64::from(fastrand::u32(..)), 8);
    id
}

/// `value`'s low `digits` hex digits, zero-padded (what `{:0Nx}` writes, without the formatting
/// machinery: an id is made for every event).
fn push_hex(out: &mut String, value: u64, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..digits).rev() {
        out.push(HEX[((value >> (shift * 4)) & 0xf) as usize] as char);
    }
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
        let mut hex = String::new();
        super::push_hex(&mut hex, 0x0191_c0ff_ee00_01a1, 16);
        super::push_hex(&mut hex, 0xb2c3d4, 8);
        assert_eq!(
            hex,
            format!("{:016x}{:08x}", 0x0191_c0ff_ee00_01a1_u64, 0xb2c3d4)
        );
    }
}
