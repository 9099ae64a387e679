//! MCP both ways: turnstile as a client of MCP servers (federation, sampling, elicitation,
//! OAuth, the official conformance scenarios) and as a server (`/mcp`).

mod client;
mod conformance;
mod elicitation;
mod endpoint;
mod endpoint_conformance;
mod endpoint_resources;
mod endpoint_sessions;
mod example_server;
mod federation;
mod oauth_identity;
mod oauth_refresh;
mod reload;
mod sampling;
