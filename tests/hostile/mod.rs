//! What a hostile or broken client, file, MCP server or input cannot do: bounds, quotas,
//! approvals that cannot be forged, paths that cannot escape, fuzzed requests.

mod approvals;
mod connections;
mod files;
mod fuzz_inputs;
mod mcp;
mod mcp_answers;
mod mcp_endpoint;
mod paths;
mod quotas;
mod startup;
