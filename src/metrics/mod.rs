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

mod families;
mod gauges;
mod spend_metrics;
mod tool_metrics;
mod turn_metrics;

#[cfg(test)]
mod tests;

pub(crate) use families::{
    inc, render, CONNECTIONS_REFUSED, CONNECTIONS_TIMED_OUT, CONTENT_TYPE, TURNS_STARTED,
};
pub(crate) use gauges::{
    connection_open, mcp_endpoint_session, store_commit, store_commit_took, stream_open, GaugeGuard,
};
pub(crate) use spend_metrics::spend;
pub(crate) use tool_metrics::{
    mcp, mcp_sampling, tool, McpMetrics, NotRun, ToolDirectory, ToolLabels,
};
pub(crate) use turn_metrics::{turns, upstream, TurnMetrics, TurnOutcome};
