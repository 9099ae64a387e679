//! `requests_per_minute`: a token bucket per principal, as large as the limit and refilled at
//! the limit per minute, so that a burst of the whole minute's requests is allowed and then one
//! request per `60 / limit` seconds. Per instance: each instance of a shared store counts its
//! own (the limit is on what one instance admits).

use std::time::Instant;

/// One principal's bucket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket for `per_minute`.
    pub(crate) fn full(per_minute: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(per_minute),
            at: now,
        }
    }

    /// Take one request at `now`, or the whole seconds until one is there (at least 1).
    pub(crate) fn take(&mut self, per_minute: u32, now: Instant) -> Result<(), u64> {
        let rate = f64::from(per_minute.max(1)) / 60.0;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(per_minute));
        self.at = now;
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(((((1.0 - self.tokens) / rate) - 1e-6).ceil() as u64).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_minutes_requests_then_one_per_share_of_the_minute() {
        let t0 = Instant::now();
        let mut b = Bucket::full(2, t0);
        assert!(b.take(2, t0).is_ok());
        assert!(b.take(2, t0).is_ok());
        assert_eq!(b.take(2, t0), Err(30), "one comes back every 30 s");
        assert_eq!(b.take(2, t0 + Duration::from_secs(20)), Err(10));
        assert!(b.take(2, t0 + Duration::from_secs(30)).is_ok());
        assert!(b.take(2, t0 + Duration::from_secs(31)).is_err());
    }
}
