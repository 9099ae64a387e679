//! turnstile: an MCP-bridging tool host and proxy that serves agent sessions (AAP v3, the runs
//! API and the event log) in front of an upstream LLM.
//!
//! Data flows one way:
//!
//! ```text
//! HTTP request → protocol adapter (protocol::aap | runs | events) → engine (turn loop)
//!                                                  ├→ upstream provider (openai | anthropic | echo)
//!                                                  └→ tool host (mcp | deliver_file | client)
//! engine → event log (durable, ordered, the single source of truth) → renderers → SSE / JSON
//! ```

pub mod app;
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
mod sync;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod tools;
pub mod upstream;
