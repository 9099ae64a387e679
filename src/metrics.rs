//! Process counters, rendered in the Prometheus text format for `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        $(pub static $name: AtomicU64 = AtomicU64::new(0);)*

        /// Every counter in the Prometheus text format.
        pub fn render() -> String {
            let mut out = String::new();
            $(
                let name = concat!("turnstile_", stringify!($name)).to_ascii_lowercase();
                out.push_str(&format!("# HELP {name} {}\n# TYPE {name} counter\n{name} {}\n",
                    $help, $name.load(Ordering::Relaxed)));
            )*
            out
        }
    };
}

counters! {
    TURNS_STARTED: "Turns started.",
    TURNS_COMPLETED: "Turns that ended with turn.completed.",
    TURNS_FAILED: "Turns that ended with turn.failed.",
    TURNS_CANCELLED: "Turns that ended with turn.cancelled.",
    MODEL_CALLS: "Upstream model calls made (retries included).",
    TOOL_CALLS: "Server tool calls run.",
    CONNECTIONS_REFUSED: "Connections closed at once because [server] max_connections were open.",
    CONNECTIONS_TIMED_OUT: "Connections closed for [server] header_timeout_s or idle_timeout_s.",
}

/// Add one to a counter.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
