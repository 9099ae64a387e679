//! The metrics of server tool calls (per server, tool and verdict) and of MCP servers
//! (up, restarts, sampling).

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use prometheus_client::metrics::gauge::Gauge;

use super::families::{
    Handles, SamplingLabels, ServerLabels, ServerToolLabels, ToolCallLabels, METRICS,
};
use super::gauges::GaugeGuard;

/// The tool metrics resolved so far, by federated name.
static BY_TOOL: LazyLock<Handles<ToolMetrics>> = LazyLock::new(Handles::default);
/// The MCP server metrics resolved so far, by server.
static BY_SERVER: LazyLock<Handles<McpMetrics>> = LazyLock::new(Handles::default);

/// The metrics of one server tool.
pub(crate) struct ToolMetrics {
    pub(super) ok: Counter,
    pub(super) error: Counter,
    pub(super) cancelled: Counter,
    pub(super) denied: Counter,
    pub(super) refused: Counter,
    pub(super) expired: Counter,
    pub(super) seconds: Histogram,
}

/// Why a tool call was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotRun {
    /// The client denied permission.
    Denied,
    /// The policy or the catalog refused it (denied tool, unknown or disabled tool).
    Refused,
    /// Its permission expired.
    Expired,
}

/// What the tool metrics need to know of a tool host (implemented in the tools module, so that
/// this module imports none): where a federated tool name comes from.
pub(crate) trait ToolDirectory {
    /// The labels of the tool federated as `name`; `None` for a name the host does not list.
    fn labels_of(&self, name: &str) -> Option<ToolLabels>;
}

/// The labels of one server tool's metrics.
pub(crate) struct ToolLabels {
    /// The MCP server's name (`builtin` for built-in tools).
    pub server: String,
    /// The tool's own name on its server.
    pub tool: String,
    /// The operator's verdict: `trust`, `ask` or `deny`.
    pub verdict: &'static str,
}

/// The handle of the metrics of the server tool federated as `name`. A name the host does not
/// list is counted as server `unknown`, tool `unknown` (a model may make names up).
pub(crate) fn tool<H: ToolDirectory + ?Sized>(host: &H, name: &str) -> Arc<ToolMetrics> {
    let m = &*METRICS;
    let make = |server: &str, tool: &str, verdict: &'static str| {
        let c = |outcome| {
            m.tool_calls.get_or_create_owned(&ToolCallLabels {
                server: server.to_string(),
                tool: tool.to_string(),
                verdict,
                outcome,
            })
        };
        ToolMetrics {
            ok: c("ok"),
            error: c("error"),
            cancelled: c("cancelled"),
            denied: c("denied"),
            refused: c("refused"),
            expired: c("expired"),
            seconds: m.tool_seconds.get_or_create_owned(&ServerToolLabels {
                server: server.to_string(),
                tool: tool.to_string(),
            }),
        }
    };
    if let Some(known) = BY_TOOL
        .0
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get("")
        .and_then(|t| t.get(name))
    {
        return known.clone();
    }
    match host.labels_of(name) {
        Some(t) => BY_TOOL.get("", name, || make(&t.server, &t.tool, t.verdict)),
        None => BY_TOOL.get("unknown", "", || make("unknown", "unknown", "none")),
    }
}

impl ToolMetrics {
    /// A call starts: its outcome is counted when [`ToolCall::done`] is called, or as
    /// `cancelled` when the call is dropped before.
    pub(crate) fn start(self: Arc<Self>) -> ToolCall {
        ToolCall {
            metrics: self,
            started: Instant::now(),
            done: false,
        }
    }

    /// A call that was not run.
    pub(crate) fn not_run(&self, why: NotRun) {
        match why {
            NotRun::Denied => &self.denied,
            NotRun::Refused => &self.refused,
            NotRun::Expired => &self.expired,
        }
        .inc();
    }
}

/// A tool call under way.
pub(crate) struct ToolCall {
    metrics: Arc<ToolMetrics>,
    started: Instant,
    done: bool,
}

impl ToolCall {
    /// The call gave a result (`is_error`: an error result).
    pub(crate) fn done(mut self, is_error: bool) {
        self.done = true;
        let m = &self.metrics;
        if is_error { &m.error } else { &m.ok }.inc();
        m.seconds.observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for ToolCall {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled.inc();
            self.metrics
                .seconds
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

/// The metrics of one MCP server (all its instances).
pub(crate) struct McpMetrics {
    up: Gauge,
    restarts: Counter,
}

/// The handle of MCP server `server`'s metrics.
pub(crate) fn mcp(server: &str) -> Arc<McpMetrics> {
    let m = &*METRICS;
    BY_SERVER.get("", server, || {
        let labels = ServerLabels {
            server: server.to_string(),
        };
        McpMetrics {
            up: m.mcp_up.get_or_create_owned(&labels),
            restarts: m.mcp_restarts.get_or_create_owned(&labels),
        }
    })
}

impl McpMetrics {
    /// An instance is up until the guard is dropped.
    pub(crate) fn up(&self) -> GaugeGuard {
        GaugeGuard::new(&self.up)
    }

    /// An instance is being restarted.
    pub(crate) fn restarted(&self) {
        self.restarts.inc();
    }
}

/// A sampling request of MCP server `server` ended so (`ok`, `refused`, `error`), with the
/// tokens of the upstream call that answered it. Not on a hot path: labels are built per call.
pub(crate) fn mcp_sampling(
    server: &str,
    outcome: &'static str,
    usage: Option<crate::message::Usage>,
) {
    let m = &*METRICS;
    let server = server.to_string();
    if let Some(u) = usage {
        let labels = ServerLabels {
            server: server.clone(),
        };
        m.mcp_sampling_input_tokens
            .get_or_create(&labels)
            .inc_by(u.input_tokens);
        m.mcp_sampling_output_tokens
            .get_or_create(&labels)
            .inc_by(u.output_tokens);
    }
    m.mcp_sampling
        .get_or_create(&SamplingLabels { server, outcome })
        .inc();
}
