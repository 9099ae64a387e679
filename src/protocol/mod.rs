//! Protocol adapters: each turns its requests into engine calls and renders the event log into
//! its own wire format. A protocol module never imports another protocol's module.

pub mod aap;
pub mod console;
pub mod context;
pub mod events;
pub mod files_api;
pub mod mcp_endpoint;
pub mod operator;
pub mod runs;
