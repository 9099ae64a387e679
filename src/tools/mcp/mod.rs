//! MCP federation: the servers of `[mcp_servers]` become tools named `mcp__<server>__<tool>`,
//! each with the policy's verdict and the rule that decided it.
//!
//! Shared servers (`scope = "shared"`) run once for the process. Session-scoped servers run one
//! instance per session, started at the session's first call with its workspace as cwd and
//! `{workspace}` in their args, stopped when the session is deleted or idle; their tool list is
//! taken at start-up from a probe instance in a scratch folder. At most `[limits]
//! session_servers` run at once server-wide, and at most `session_servers_per_key` for the
//! sessions of one API key (so one key cannot take every slot from the others): past either the
//! idlest (least recently called, no call in flight) of those counted is stopped to make room,
//! and when every one is in a call the new call gets an error result naming the limit.

pub mod content;
pub mod describe;
pub mod elicit;
mod federation;
mod first_start;
pub mod http_client;
pub mod naming;
pub mod oauth;
pub mod policy;
mod reconfigure;
mod reports;
pub mod resource_uri;
pub mod sampling;
pub mod sandbox;
mod session_instance;
pub mod stderr;
pub mod supervisor;
mod too_large;

pub use describe::describe_error;
pub use federation::{FederationError, McpHost};
pub use reports::{InstanceReport, ServerProgress, ServerReport, StartReport};
