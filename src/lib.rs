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

pub mod api;
pub mod clock;
pub mod config;
pub mod engine;
pub mod files;
pub mod http;
pub mod ids;
pub mod log;
pub mod message;
pub mod metrics;
pub mod net;
pub mod protocol;
pub mod startup;
mod sync;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod tools;
pub mod upstream;
