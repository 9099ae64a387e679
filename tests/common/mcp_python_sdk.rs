//! The MCP Python SDK client for tests/mcp/endpoint.rs.

use std::path::PathBuf;

/// The pinned version of PyPI `mcp` the endpoint's tests speak with (a dependency of the pinned
/// `mcp-server-time`, so it is in the test venv of `provision::python`).
pub const MCP_SDK: &str = "2.3.0";

/// The test venv's Python, checked to import `mcp` at [`MCP_SDK`].
pub fn python() -> PathBuf {
    let python = crate::common::provision::python();
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('mcp'))",
        ])
        .output()
        .expect("run the test venv's python");
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        version, MCP_SDK,
        "the test venv has mcp {version:?}; tests/mcp/endpoint.rs is written against mcp=={MCP_SDK} \
         (pinned through mcp-server-time in tests/common/provision.rs)"
    );
    python
}
