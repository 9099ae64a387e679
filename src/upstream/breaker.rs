//! A circuit breaker per upstream, so that calls stop going to an upstream that keeps failing
//! while another can answer.
//!
//! Closed, it counts consecutive failures (connect errors, timeouts, 429, 5xx, broken streams:
//! see [`super::router`]); at `breaker_failures` it opens. Open, the router skips the upstream
//! for `breaker_open_s` (unless no other can take the call). Then it is half-open: the next call
//! is let through as the one probe, and others still skip it; the probe's success closes the
//! breaker, its failure opens it for another period. Any answer from the upstream is a success
//! here (a 400 says it is up), only the failures above count.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{UpstreamError, UpstreamErrorKind};
use crate::sync::lock;

/// What `/status` shows of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

/// Whether a call may go to the upstream now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: go.
    Yes,
    /// Half-open: go, as the one probe.
    Probe,
    /// Open (or half-open with its probe under way): skip it if another can answer.
    No,
}

pub(crate) struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    failures: u32,
    /// When it opened; `None` while closed.
    opened: Option<Instant>,
    /// A half-open breaker's probe is under way.
    probing: bool,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `open_for`.
    pub(crate) fn new(threshold: u32, open_for: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            open_for,
            state: Mutex::default(),
        }
    }

    /// Whether a call may go now; a half-open breaker's `Probe` is given out once until
    /// [`Breaker::record`] or [`Breaker::abandon`] says how it went.
    pub(crate) fn admit(&self, now: Instant) -> Admit {
        let mut s = lock(&self.state);
        match s.opened {
            None => Admit::Yes,
            Some(at) if now.saturating_duration_since(at) < self.open_for || s.probing => Admit::No,
            Some(_) => {
                s.probing = true;
                Admit::Probe
            }
        }
    }

    /// A call's outcome: `ok` closes the breaker; a failure counts, and opens it at the
    /// threshold or when it was the probe. Whether it opened now.
    pub(crate) fn record(&self, ok: bool, probe: bool, now: Instant) -> bool {
        let mut s = lock(&self.state);
        if probe {
            s.probing = false;
        }
        if ok {
            s.failures = 0;
            s.opened = None;
            return false;
        }
        s.failures = s.failures.saturating_add(1);
        let opens = probe || (s.opened.is_none() && s.failures >= self.threshold);
        if opens {
            s.opened = Some(now);
        }
        opens
    }

    /// A probe that ended with no outcome (its call was cancelled): the next call probes.
    pub(crate) fn abandon(&self) {
        lock(&self.state).probing = false;
    }

    /// The state and the count of consecutive failures.
    pub(crate) fn state(&self, now: Instant) -> (BreakerState, u32) {
        let s = lock(&self.state);
        let state = match s.opened {
            None => BreakerState::Closed,
            Some(at) if now.saturating_duration_since(at) < self.open_for => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        };
        (state, s.failures)
    }
}

/// Whether `e` says the upstream is in trouble (rather than the request being wrong): what
/// opens breakers and falls back.
pub(crate) fn trouble(e: &UpstreamError) -> bool {
    matches!(
        e.kind,
        UpstreamErrorKind::Connect | UpstreamErrorKind::Timeout | UpstreamErrorKind::Stream
    ) || matches!(e.kind, UpstreamErrorKind::Status(s) if s == 429 || s >= 500)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_at_the_threshold_then_lets_one_probe_through() {
        let b = Breaker::new(3, Duration::from_secs(30));
        let t0 = Instant::now();
        for _ in 0..2 {
            assert_eq!(b.admit(t0), Admit::Yes);
            b.record(false, false, t0);
        }
        assert_eq!(b.state(t0), (BreakerState::Closed, 2));
        b.record(false, false, t0);
        assert_eq!(b.state(t0), (BreakerState::Open, 3));
        assert_eq!(b.admit(t0 + Duration::from_secs(29)), Admit::No);

        let later = t0 + Duration::from_secs(30);
        assert_eq!(b.state(later).0, BreakerState::HalfOpen);
        assert_eq!(b.admit(later), Admit::Probe);
        assert_eq!(b.admit(later), Admit::No, "one probe at a time");
        b.record(true, true, later);
        assert_eq!(b.state(later), (BreakerState::Closed, 0));
        assert_eq!(b.admit(later), Admit::Yes);
    }

    #[test]
    fn a_failed_probe_opens_it_again_and_an_abandoned_one_is_given_out_again() {
        let b = Breaker::new(1, Duration::from_secs(10));
        let t0 = Instant::now();
        b.record(false, false, t0);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(b.admit(t1), Admit::Probe);
        b.abandon();
        assert_eq!(b.admit(t1), Admit::Probe);
        b.record(false, true, t1);
        assert_eq!(b.state(t1).0, BreakerState::Open);
        assert_eq!(b.admit(t1 + Duration::from_secs(9)), Admit::No);
        assert_eq!(b.admit(t1 + Duration::from_secs(10)), Admit::Probe);
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        b.record(false, false, t0);
        b.record(true, false, t0);
        b.record(false, false, t0);
        assert_eq!(b.state(t0), (BreakerState::Closed, 1));
    }
}
