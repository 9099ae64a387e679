//! What is open now (connections, event streams, `/mcp` sessions by state) and the time of
//! the event log's group commits.

use std::time::Instant;

use prometheus_client::metrics::gauge::Gauge;

use super::families::{StateLabels, METRICS};

/// Adds one to a gauge while it lives.
pub(crate) struct GaugeGuard(Gauge);

impl GaugeGuard {
    pub(super) fn new(g: &Gauge) -> GaugeGuard {
        g.inc();
        GaugeGuard(g.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// An open HTTP connection, counted until dropped.
pub(crate) fn connection_open() -> GaugeGuard {
    GaugeGuard::new(&METRICS.connections)
}

/// An open event stream, counted until dropped.
pub(crate) fn stream_open() -> GaugeGuard {
    GaugeGuard::new(&METRICS.streams)
}

/// An open `/mcp` session moved from state `from` to `to` ("live" or "parked"; `None`: opened
/// or ended).
pub(crate) fn mcp_endpoint_session(from: Option<&'static str>, to: Option<&'static str>) {
    let m = &METRICS.mcp_endpoint_sessions;
    if let Some(state) = from {
        m.get_or_create(&StateLabels { state }).dec();
    }
    if let Some(state) = to {
        m.get_or_create(&StateLabels { state }).inc();
    }
}

/// Time `commit` (one group commit of the event log).
pub(crate) fn store_commit<T>(commit: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = commit();
    METRICS
        .store_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    out
}

/// Record one group commit timed by its caller (an async commit: PostgreSQL's).
pub(crate) fn store_commit_took(elapsed: std::time::Duration) {
    METRICS.store_commit_seconds.observe(elapsed.as_secs_f64());
}
