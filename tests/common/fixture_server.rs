//! The fixture MCP server (`tests/mcp_endpoint_resources/child.py`, the official Python SDK's
//! low-level server, in the test venv) with the conformance framework's reference resources,
//! template, prompts and completions: for tests/mcp/endpoint_resources.rs and
//! tests/mcp/endpoint_conformance.rs.

use std::path::{Path, PathBuf};

/// The test venv's Python (it imports `mcp`).
pub fn python() -> PathBuf {
    crate::common::provision::python()
}

/// A `[mcp_servers.NAME]` table running the fixture server.
pub fn fixture_server(name: &str) -> String {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_endpoint_resources/child.py");
    format!(
        "[mcp_servers.{name}]\ncommand = {:?}\nargs = [{:?}]\n",
        python().display().to_string(),
        script.display().to_string()
    )
}
