//! A session-scoped server's instance as the federation keeps it: when it was last called,
//! its calls in flight, whose it is, and which limit a new one found full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::supervisor::Supervisor;

/// A session-scoped instance unused this long is stopped (it restarts at the next call).
pub(super) const SESSION_IDLE: Duration = Duration::from_secs(600);

/// A session-scoped instance: its supervisor, when it was last called, its calls in flight,
/// and the API key owner of its session (whose share of `[limits] session_servers` it takes).
pub(super) struct SessionInstance {
    pub(super) sup: Arc<Supervisor>,
    pub(super) used: Instant,
    pub(super) in_flight: Arc<AtomicUsize>,
    pub(super) owner: Option<String>,
}

impl SessionInstance {
    /// Mark a call as started (now, in flight until the guard drops).
    pub(super) fn begin(&mut self) -> (Arc<Supervisor>, InFlight) {
        self.used = Instant::now();
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        (self.sup.clone(), InFlight(self.in_flight.clone()))
    }

    pub(super) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }
}

/// Which limit a new session-scoped instance found full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// `[limits] session_servers`: any idle instance may make room.
    Server,
    /// `[limits] session_servers_per_key`: only one of the same key's.
    Key,
}

impl Full {
    pub(super) fn key(self) -> &'static str {
        match self {
            Full::Server => "[limits] session_servers",
            Full::Key => "[limits] session_servers_per_key",
        }
    }
}

/// A call in flight on a session-scoped instance (which is then never stopped to make room).
pub(super) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Session-scoped instances by (session id, server name). By name, not index: a reload that
/// adds or removes other servers leaves a session's instances where they are.
pub(super) type SessionInstances = HashMap<(String, String), SessionInstance>;
