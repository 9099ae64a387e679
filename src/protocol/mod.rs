//! Protocol adapters: each turns its requests into engine calls and renders the event log into
//! its own wire format. A protocol module never imports another protocol's module.

pub(crate) mod aap;
pub(crate) mod console;
pub(crate) mod context;
pub(crate) mod events;
pub(crate) mod files_api;
pub(crate) mod mcp_endpoint;
pub(crate) mod operator;
pub(crate) mod runs;
pub(crate) mod usage_api;
