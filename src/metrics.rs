//! Process metrics, rendered in the Prometheus text format (0.0.4) for `GET /metrics` (and on
//! `[server] metrics_listen`, see [`serve`]).
//!
//! Built on `prometheus-client`. Label values are bounded: agent names, models (the config's
//! `model` or one of an agent's `models`), provider names, MCP server and tool names (from the
//! config and the servers' listings; a name the model made up is counted as tool `unknown`).
//! Never a session or turn id.
//!
//! The hot path never formats or allocates: the labelled metrics an event touches are resolved
//! once per agent, model and tool into a handle ([`TurnMetrics`], [`Upstream`], [`ToolMetrics`])
//! kept in a small map looked up by `&str`; recording is then an atomic add or a histogram's
//! uncontended lock.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Turns accepted (started or queued).
pub static TURNS_STARTED: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Connections closed at once because `[server] max_connections` were open.
pub static CONNECTIONS_REFUSED: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Connections closed for `[server] header_timeout_s` or `idle_timeout_s`.
pub static CONNECTIONS_TIMED_OUT: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Add one to a counter.
pub fn inc(c: &Counter) {
    c.inc();
}

// Histogram buckets, in seconds.
const TURN_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
const FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const UPSTREAM_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
const TOOL_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

type Hist = fn() -> Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabels {
    agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    agent: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    provider: &'static str,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    provider: &'static str,
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerToolLabels {
    server: String,
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolCallLabels {
    server: String,
    tool: String,
    verdict: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SamplingLabels {
    server: String,
    outcome: &'static str,
}

/// Every metric, and the handles resolved so far.
struct Metrics {
    registry: Registry,
    turns: Family<TurnLabels, Counter>,
    turn_seconds: Family<AgentLabels, Histogram, Hist>,
    upstream_calls: Family<CallLabels, Counter>,
    first_token_seconds: Family<ModelLabels, Histogram, Hist>,
    upstream_seconds: Family<ModelLabels, Histogram, Hist>,
    input_tokens: Family<ModelLabels, Counter>,
    output_tokens: Family<ModelLabels, Counter>,
    tool_calls: Family<ToolCallLabels, Counter>,
    tool_seconds: Family<ServerToolLabels, Histogram, Hist>,
    mcp_up: Family<ServerLabels, Gauge>,
    mcp_restarts: Family<ServerLabels, Counter>,
    mcp_sampling: Family<SamplingLabels, Counter>,
    mcp_sampling_input_tokens: Family<ServerLabels, Counter>,
    mcp_sampling_output_tokens: Family<ServerLabels, Counter>,
    mcp_endpoint_sessions: Family<StateLabels, Gauge>,
    store_commit_seconds: Histogram,
    pending_approvals: Gauge,
    sessions: Gauge,
    streams: Gauge,
    connections: Gauge,
    by_agent: Handles<TurnMetrics>,
    by_model: Handles<Upstream>,
    by_tool: Handles<ToolMetrics>,
    by_server: Handles<McpMetrics>,
}

fn hist(buckets: &'static [f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

/// Register each `name, help => metric;` (a clone of it: metrics are shared handles).
macro_rules! register {
    ($registry:expr, $($name:literal, $help:literal => $metric:expr;)*) => {
        $($registry.register($name, $help, $metric.clone());)*
    };
}

impl Metrics {
    fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            turns: Family::default(),
            turn_seconds: Family::new_with_constructor(|| hist(TURN_BUCKETS)),
            upstream_calls: Family::default(),
            first_token_seconds: Family::new_with_constructor(|| hist(FIRST_TOKEN_BUCKETS)),
            upstream_seconds: Family::new_with_constructor(|| hist(UPSTREAM_BUCKETS)),
            input_tokens: Family::default(),
            output_tokens: Family::default(),
            tool_calls: Family::default(),
            tool_seconds: Family::new_with_constructor(|| hist(TOOL_BUCKETS)),
            mcp_up: Family::default(),
            mcp_restarts: Family::default(),
            mcp_sampling: Family::default(),
            mcp_sampling_input_tokens: Family::default(),
            mcp_sampling_output_tokens: Family::default(),
            mcp_endpoint_sessions: Family::default(),
            store_commit_seconds: hist(COMMIT_BUCKETS),
            pending_approvals: Gauge::default(),
            sessions: Gauge::default(),
            streams: Gauge::default(),
            connections: Gauge::default(),
            by_agent: Handles::default(),
            by_model: Handles::default(),
            by_tool: Handles::default(),
            by_server: Handles::default(),
        };
        // Counter names get `_total` from the encoder.
        register!(m.registry,
            "turnstile_turns_started", "Turns accepted (run at once or queued)" => (*TURNS_STARTED);
            "turnstile_turns", "Turns ended, by agent and outcome (completed, failed, cancelled)" => m.turns;
            "turnstile_turn_duration_seconds", "Wall time of a turn, from its start to its terminal event" => m.turn_seconds;
            "turnstile_upstream_calls", "Upstream model calls (each retry is one), by provider, model and outcome (ok, error)" => m.upstream_calls;
            "turnstile_upstream_first_token_seconds", "Time from sending a model request to its first streamed fragment (the whole call when nothing streamed)" => m.first_token_seconds;
            "turnstile_upstream_call_duration_seconds", "Wall time of one upstream model call" => m.upstream_seconds;
            "turnstile_upstream_input_tokens", "Input tokens the upstream reported, by provider and model" => m.input_tokens;
            "turnstile_upstream_output_tokens", "Output tokens the upstream reported, by provider and model" => m.output_tokens;
            "turnstile_tool_calls", "Server tool calls, by MCP server, tool, the operator's verdict (trust, ask, deny) and outcome (ok, error, cancelled; denied, refused, expired when not run)" => m.tool_calls;
            "turnstile_tool_call_duration_seconds", "Wall time of a server tool call that ran" => m.tool_seconds;
            "turnstile_pending_approvals", "Tool calls waiting for a client's permission (sessions in memory)" => m.pending_approvals;
            "turnstile_sessions_active", "Sessions held in memory" => m.sessions;
            "turnstile_streams_open", "Open event streams (SSE responses)" => m.streams;
            "turnstile_connections_open", "Open HTTP connections" => m.connections;
            "turnstile_connections_refused", "Connections closed at once because [server] max_connections were open" => (*CONNECTIONS_REFUSED);
            "turnstile_connections_timed_out", "Connections closed for [server] header_timeout_s or idle_timeout_s" => (*CONNECTIONS_TIMED_OUT);
            "turnstile_mcp_servers_up", "MCP server instances connected and listed, by server" => m.mcp_up;
            "turnstile_mcp_restarts", "MCP server instances restarted after they exited or failed to start, by server" => m.mcp_restarts;
            "turnstile_mcp_sampling", "MCP servers' sampling requests, by server and outcome (ok, refused, error)" => m.mcp_sampling;
            "turnstile_mcp_sampling_input_tokens", "Input tokens of the upstream calls that answered sampling requests, by server" => m.mcp_sampling_input_tokens;
            "turnstile_mcp_sampling_output_tokens", "Output tokens of the upstream calls that answered sampling requests, by server" => m.mcp_sampling_output_tokens;
            "turnstile_mcp_endpoint_sessions", "Open /mcp sessions, by state (live: in memory; parked: idle, kept as a record until their next request)" => m.mcp_endpoint_sessions;
            "turnstile_store_commit_duration_seconds", "Time to write one group commit of the event log" => m.store_commit_seconds;
        );
        m
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Handles resolved once per (provider or "", name), looked up without allocating.
struct Handles<H>(RwLock<HashMap<&'static str, HashMap<String, Arc<H>>>>);

impl<H> Default for Handles<H> {
    fn default() -> Self {
        Handles(RwLock::new(HashMap::new()))
    }
}

impl<H> Handles<H> {
    fn get(&self, kind: &'static str, name: &str, make: impl FnOnce() -> H) -> Arc<H> {
        if let Some(h) = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(kind)
            .and_then(|m| m.get(name))
        {
            return h.clone();
        }
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        map.entry(kind)
            .or_default()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }
}

/// The turn metrics of one agent.
pub struct TurnMetrics {
    completed: Counter,
    failed: Counter,
    cancelled: Counter,
    seconds: Histogram,
}

/// How a turn ended, as `turnstile_turns_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    Completed,
    Failed,
    Cancelled,
}

/// The handle of `agent`'s turn metrics.
pub fn turns(agent: &str) -> Arc<TurnMetrics> {
    let m = &*METRICS;
    m.by_agent.get("", agent, || {
        let c = |outcome| {
            m.turns.get_or_create_owned(&TurnLabels {
                agent: agent.to_string(),
                outcome,
            })
        };
        TurnMetrics {
            completed: c("completed"),
            failed: c("failed"),
            cancelled: c("cancelled"),
            seconds: m.turn_seconds.get_or_create_owned(&AgentLabels {
                agent: agent.to_string(),
            }),
        }
    })
}

impl TurnMetrics {
    /// A turn ended; `ran`: how long it ran (`None` for a queued turn that never started).
    pub fn ended(&self, outcome: TurnOutcome, ran: Option<Duration>) {
        match outcome {
            TurnOutcome::Completed => &self.completed,
            TurnOutcome::Failed => &self.failed,
            TurnOutcome::Cancelled => &self.cancelled,
        }
        .inc();
        if let Some(ran) = ran {
            self.seconds.observe(ran.as_secs_f64());
        }
    }
}

/// The upstream metrics of one provider and model.
pub struct Upstream {
    ok: Counter,
    error: Counter,
    first_token: Histogram,
    seconds: Histogram,
    input_tokens: Counter,
    output_tokens: Counter,
}

/// The handle of the upstream metrics for `model` at `provider`.
pub fn upstream(provider: &'static str, model: &str) -> Arc<Upstream> {
    let m = &*METRICS;
    m.by_model.get(provider, model, || {
        let labels = ModelLabels {
            provider,
            model: model.to_string(),
        };
        let call = |outcome| {
            m.upstream_calls.get_or_create_owned(&CallLabels {
                provider,
                model: model.to_string(),
                outcome,
            })
        };
        Upstream {
            ok: call("ok"),
            error: call("error"),
            first_token: m.first_token_seconds.get_or_create_owned(&labels),
            seconds: m.upstream_seconds.get_or_create_owned(&labels),
            input_tokens: m.input_tokens.get_or_create_owned(&labels),
            output_tokens: m.output_tokens.get_or_create_owned(&labels),
        }
    })
}

impl Upstream {
    /// One call ended: sent at `started`, first fragment at `first` (if any streamed), with
    /// the usage it reported when it succeeded.
    pub fn call(
        &self,
        started: Instant,
        first: Option<Instant>,
        usage: Option<crate::message::Usage>,
    ) {
        let took = started.elapsed();
        self.seconds.observe(took.as_secs_f64());
        let first = first.map_or(took, |f| f.saturating_duration_since(started));
        self.first_token.observe(first.as_secs_f64());
        match usage {
            Some(u) => {
                self.ok.inc();
                self.input_tokens.inc_by(u.input_tokens);
                self.output_tokens.inc_by(u.output_tokens);
            }
            None => {
                self.error.inc();
            }
        }
    }
}

/// The metrics of one server tool.
pub struct ToolMetrics {
    ok: Counter,
    error: Counter,
    cancelled: Counter,
    denied: Counter,
    refused: Counter,
    expired: Counter,
    seconds: Histogram,
}

/// Why a tool call was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRun {
    /// The client denied permission.
    Denied,
    /// The policy or the catalog refused it (denied tool, unknown or disabled tool).
    Refused,
    /// Its permission expired.
    Expired,
}

/// What the tool metrics need to know of a tool host (implemented in the tools module, so that
/// this module imports none): where a federated tool name comes from.
pub trait ToolDirectory {
    /// The labels of the tool federated as `name`; `None` for a name the host does not list.
    fn labels_of(&self, name: &str) -> Option<ToolLabels>;
}

/// The labels of one server tool's metrics.
pub struct ToolLabels {
    /// The MCP server's name (`builtin` for built-in tools).
    pub server: String,
    /// The tool's own name on its server.
    pub tool: String,
    /// The operator's verdict: `trust`, `ask` or `deny`.
    pub verdict: &'static str,
}

/// The handle of the metrics of the server tool federated as `name`. A name the host does not
/// list is counted as server `unknown`, tool `unknown` (a model may make names up).
pub fn tool<H: ToolDirectory + ?Sized>(host: &H, name: &str) -> Arc<ToolMetrics> {
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
    if let Some(known) = m
        .by_tool
        .0
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get("")
        .and_then(|t| t.get(name))
    {
        return known.clone();
    }
    match host.labels_of(name) {
        Some(t) => m
            .by_tool
            .get("", name, || make(&t.server, &t.tool, t.verdict)),
        None => m
            .by_tool
            .get("unknown", "", || make("unknown", "unknown", "none")),
    }
}

impl ToolMetrics {
    /// A call starts: its outcome is counted when [`ToolCall::done`] is called, or as
    /// `cancelled` when the call is dropped before.
    pub fn start(self: Arc<Self>) -> ToolCall {
        ToolCall {
            metrics: self,
            started: Instant::now(),
            done: false,
        }
    }

    /// A call that was not run.
    pub fn not_run(&self, why: NotRun) {
        match why {
            NotRun::Denied => &self.denied,
            NotRun::Refused => &self.refused,
            NotRun::Expired => &self.expired,
        }
        .inc();
    }
}

/// A tool call under way.
pub struct ToolCall {
    metrics: Arc<ToolMetrics>,
    started: Instant,
    done: bool,
}

impl ToolCall {
    /// The call gave a result (`is_error`: an error result).
    pub fn done(mut self, is_error: bool) {
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
pub struct McpMetrics {
    up: Gauge,
    restarts: Counter,
}

/// The handle of MCP server `server`'s metrics.
pub fn mcp(server: &str) -> Arc<McpMetrics> {
    let m = &*METRICS;
    m.by_server.get("", server, || {
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
    pub fn up(&self) -> GaugeGuard {
        GaugeGuard::new(&self.up)
    }

    /// An instance is being restarted.
    pub fn restarted(&self) {
        self.restarts.inc();
    }
}

/// A sampling request of MCP server `server` ended so (`ok`, `refused`, `error`), with the
/// tokens of the upstream call that answered it. Not on a hot path: labels are built per call.
pub fn mcp_sampling(server: &str, outcome: &'static str, usage: Option<crate::message::Usage>) {
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

/// Adds one to a gauge while it lives.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn new(g: &Gauge) -> GaugeGuard {
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
pub fn connection_open() -> GaugeGuard {
    GaugeGuard::new(&METRICS.connections)
}

/// An open event stream, counted until dropped.
pub fn stream_open() -> GaugeGuard {
    GaugeGuard::new(&METRICS.streams)
}

/// An open `/mcp` session moved from state `from` to `to` ("live" or "parked"; `None`: opened
/// or ended).
pub fn mcp_endpoint_session(from: Option<&'static str>, to: Option<&'static str>) {
    let m = &METRICS.mcp_endpoint_sessions;
    if let Some(state) = from {
        m.get_or_create(&StateLabels { state }).dec();
    }
    if let Some(state) = to {
        m.get_or_create(&StateLabels { state }).inc();
    }
}

/// Time `commit` (one group commit of the event log).
pub fn store_commit<T>(commit: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = commit();
    METRICS
        .store_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    out
}

/// Record one group commit timed by its caller (an async commit: PostgreSQL's).
pub fn store_commit_took(elapsed: std::time::Duration) {
    METRICS.store_commit_seconds.observe(elapsed.as_secs_f64());
}

/// Every metric in the Prometheus text format, with the engine's gauges as sampled now by the
/// caller (sessions in memory, tool calls waiting for permission).
pub fn render(sessions: usize, pending_approvals: usize) -> String {
    let m = &*METRICS;
    m.sessions.set(sessions as i64);
    m.pending_approvals.set(pending_approvals as i64);
    let mut out = String::with_capacity(16 * 1024);
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &m.registry) {
        tracing::error!(error = %e, "metrics could not be rendered");
    }
    out
}

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_dropped_before_its_result_counts_as_cancelled() {
        let h = Arc::new(ToolMetrics {
            ok: Counter::default(),
            error: Counter::default(),
            cancelled: Counter::default(),
            denied: Counter::default(),
            refused: Counter::default(),
            expired: Counter::default(),
            seconds: hist(TOOL_BUCKETS),
        });
        h.clone().start().done(false);
        h.clone().start().done(true);
        drop(h.clone().start());
        h.not_run(NotRun::Denied);
        assert_eq!(
            [h.ok.get(), h.error.get(), h.cancelled.get(), h.denied.get()],
            [1, 1, 1, 1]
        );
    }

    #[test]
    fn handles_are_resolved_once_per_name() {
        let a = upstream("echo", "unit-model");
        let b = upstream("echo", "unit-model");
        assert!(Arc::ptr_eq(&a, &b));
        a.call(
            Instant::now(),
            None,
            Some(crate::message::Usage {
                input_tokens: 3,
                output_tokens: 4,
            }),
        );
        assert_eq!(b.input_tokens.get(), 3);
        let text = {
            let mut s = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut s, &METRICS.registry)
                .unwrap();
            s
        };
        assert!(
            text.contains(
                "turnstile_upstream_input_tokens_total{provider=\"echo\",model=\"unit-model\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE turnstile_upstream_calls_total counter"),
            "{text}"
        );
        assert!(text.contains("turnstile_upstream_call_duration_seconds_bucket{le=\"+Inf\",provider=\"echo\",model=\"unit-model\"} 1") || text.contains("turnstile_upstream_call_duration_seconds_bucket{provider=\"echo\",model=\"unit-model\",le=\"+Inf\"} 1"), "{text}");
    }
}
