//! turnstile: an MCP-bridging tool host and proxy that serves agent sessions (AAP v3, the runs
//! API and the event log) in front of an upstream LLM.
//!
//! Data flows one way:
//!
//! ```text
//! HTTP request → http (server, bodies, auth) → api (route table, dispatch)
//!     → protocol adapter (protocol::aap | runs | events | files | operator) → engine (turn loop)
//!                                                  ├→ upstream provider (openai | anthropic | echo)
//!                                                  └→ tool host (mcp | deliver_file | client)
//! engine → event log (durable, ordered, the single source of truth) → renderers → SSE / JSON
//! ```
//!
//! Imports run one way too: `api` → `protocol::*` → `engine`; `api` and `protocol::*` → `http`;
//! `http` imports no protocol and no route (it serves the handler `startup` gives it).
//!
//! The library's public face is what the binary, the tests and the bench use: `startup` (run a
//! server in-process), `config`, the `engine` and its `log`, `tools`, `upstream`, `files`,
//! `message`, `clock`, `ids`, `telemetry`, `memory` (the binary's say in giving memory back)
//! and, behind the `testkit` feature, the fake upstreams. The serving layers (`api`, `http`,
//! `protocol`) and `metrics` are private to the crate; `outbound` (outbound HTTP) is public for
//! its event-stream parser, which the tests fuzz.

pub(crate) mod api;
pub mod clock;
pub mod config;
pub mod engine;
pub mod files;
pub(crate) mod http;
pub mod ids;
pub mod log;
pub mod memory;
pub mod message;
pub(crate) mod metrics;
pub mod outbound;
pub(crate) mod protocol;
pub mod reload;
pub mod startup;
mod sync;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fakes: a panic is the failure"
)]
pub mod testkit;
pub mod tools;
pub mod upstream;
pub mod usage;
