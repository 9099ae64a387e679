//! Every metric: the families registered at start, their buckets and labels, the handles
//! resolved from them once per name, and the text a scrape gets.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Turns accepted (started or queued).
pub(crate) static TURNS_STARTED: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Connections closed at once because `[server] max_connections` were open.
pub(crate) static CONNECTIONS_REFUSED: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Connections closed for `[server] header_timeout_s` or `idle_timeout_s`.
pub(crate) static CONNECTIONS_TIMED_OUT: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Add one to a counter.
pub(crate) fn inc(c: &Counter) {
    c.inc();
}

// Histogram buckets, in seconds.
pub(super) const TURN_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
pub(super) const FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
pub(super) const UPSTREAM_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
pub(super) const TOOL_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
pub(super) const COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

pub(super) type Hist = fn() -> Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AgentLabels {
    pub(super) agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TurnLabels {
    pub(super) agent: String,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModelLabels {
    pub(super) provider: &'static str,
    pub(super) model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabels {
    pub(super) provider: &'static str,
    pub(super) model: String,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServerToolLabels {
    pub(super) server: String,
    pub(super) tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ToolCallLabels {
    pub(super) server: String,
    pub(super) tool: String,
    pub(super) verdict: &'static str,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServerLabels {
    pub(super) server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SamplingLabels {
    pub(super) server: String,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PrincipalLabels {
    pub(super) principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RefusalLabels {
    pub(super) principal: String,
    pub(super) budget: &'static str,
}

/// Every metric, and the handles resolved so far.
pub(super) struct Metrics {
    pub(super) registry: Registry,
    pub(super) turns: Family<TurnLabels, Counter>,
    pub(super) turn_seconds: Family<AgentLabels, Histogram, Hist>,
    pub(super) upstream_calls: Family<CallLabels, Counter>,
    pub(super) first_token_seconds: Family<ModelLabels, Histogram, Hist>,
    pub(super) upstream_seconds: Family<ModelLabels, Histogram, Hist>,
    pub(super) input_tokens: Family<ModelLabels, Counter>,
    pub(super) output_tokens: Family<ModelLabels, Counter>,
    pub(super) tool_calls: Family<ToolCallLabels, Counter>,
    pub(super) tool_seconds: Family<ServerToolLabels, Histogram, Hist>,
    pub(super) mcp_up: Family<ServerLabels, Gauge>,
    pub(super) mcp_restarts: Family<ServerLabels, Counter>,
    pub(super) mcp_sampling: Family<SamplingLabels, Counter>,
    pub(super) mcp_sampling_input_tokens: Family<ServerLabels, Counter>,
    pub(super) mcp_sampling_output_tokens: Family<ServerLabels, Counter>,
    pub(super) mcp_endpoint_sessions: Family<StateLabels, Gauge>,
    pub(super) store_commit_seconds: Histogram,
    pub(super) principal_input_tokens: Family<PrincipalLabels, Counter>,
    pub(super) principal_output_tokens: Family<PrincipalLabels, Counter>,
    pub(super) principal_usd: Family<PrincipalLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    pub(super) principal_refusals: Family<RefusalLabels, Counter>,
    pub(super) pending_approvals: Gauge,
    pub(super) sessions: Gauge,
    pub(super) streams: Gauge,
    pub(super) connections: Gauge,
}

pub(super) fn hist(buckets: &'static [f64]) -> Histogram {
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
            principal_input_tokens: Family::default(),
            principal_output_tokens: Family::default(),
            principal_usd: Family::default(),
            principal_refusals: Family::default(),
            pending_approvals: Gauge::default(),
            sessions: Gauge::default(),
            streams: Gauge::default(),
            connections: Gauge::default(),
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
            "turnstile_principal_input_tokens", "Input tokens of the model calls of each principal's turns, as the upstreams reported them" => m.principal_input_tokens;
            "turnstile_principal_output_tokens", "Output tokens of the model calls of each principal's turns, as the upstreams reported them" => m.principal_output_tokens;
            "turnstile_principal_usd", "USD spent by each principal's model calls, priced from the answering upstream's price table" => m.principal_usd;
            "turnstile_principal_refusals", "Turns (and tool calls) refused by a principal's rate limit or budget, by principal and budget" => m.principal_refusals;
        );
        m
    }
}

pub(super) static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Handles resolved once per (provider or "", name), looked up without allocating.
pub(super) struct Handles<H>(pub(super) RwLock<HashMap<&'static str, HashMap<String, Arc<H>>>>);

impl<H> Default for Handles<H> {
    fn default() -> Self {
        Handles(RwLock::new(HashMap::new()))
    }
}

impl<H> Handles<H> {
    pub(super) fn get(&self, kind: &'static str, name: &str, make: impl FnOnce() -> H) -> Arc<H> {
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

/// Every metric in the Prometheus text format, with the engine's gauges as sampled now by the
/// caller (sessions in memory, tool calls waiting for permission).
pub(crate) fn render(sessions: usize, pending_approvals: usize) -> String {
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
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
