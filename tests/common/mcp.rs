//! The example MCP server (`examples/mcp_example.rs`) for tests: where its binary is, and a
//! `[mcp_servers]` table that runs it.

use std::path::PathBuf;

/// The path of the built `mcp_example` binary: beside this test binary's `deps/` folder (which
/// follows `CARGO_TARGET_DIR` and the profile), else under `$CARGO_TARGET_DIR/debug/examples/`,
/// else under `<manifest>/target/debug/examples/`. Panics with a hint when none exists.
pub fn example_server_path() -> PathBuf {
    let name = format!("mcp_example{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // <target>/<profile>/deps/<test binary>
        if let Some(profile_dir) = exe.parent().and_then(|deps| deps.parent()) {
            candidates.push(profile_dir.join("examples").join(&name));
        }
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(dir).join("debug/examples").join(&name));
    }
    candidates.push(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/debug/examples")
            .join(&name),
    );
    let Some(path) = candidates.iter().find(|path| path.is_file()) else {
        panic!(
            "the mcp_example binary is missing (looked at {candidates:?}); build it with \
             `cargo build --example mcp_example` (plain `cargo test` builds it too)"
        )
    };
    // `cargo test --test all -- mcp::example_server::` does not rebuild examples: refuse a stale binary.
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/mcp_example.rs");
    let modified = |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified());
    if let (Ok(binary), Ok(source)) = (modified(path), modified(&source)) {
        assert!(
            binary >= source,
            "{} is older than examples/mcp_example.rs; rebuild it with \
             `cargo build --example mcp_example` (plain `cargo test` rebuilds it too)",
            path.display()
        );
    }
    path.clone()
}

/// A `[mcp_servers.NAME]` table running the example server with these extra lines.
pub fn example_server(name: &str, extra: &str) -> String {
    format!(
        "[mcp_servers.{name}]\ncommand = {:?}\n{extra}\n",
        example_server_path().display().to_string()
    )
}
