//! A keyless turnstile on loopback (the default) cannot be driven by a web page the user
//! visits: in the system's Chromium, a page on another loopback port posts to `/run` every way a
//! page may without a CORS preflight, and a page whose host name is re-pointed at 127.0.0.1 (DNS
//! rebinding) calls the API from what the browser takes for its own origin
//! (`tests/console/attack.mjs`). Nothing they send runs: no MCP call reaches the server, no
//! session is made, and the rebinding page reads no answer.

use std::path::Path;
use std::time::Duration;

use crate::common::console;
use serde_json::Value;

/// The example server (`echo` trusted, its calls logged to `calls.log`), the echo provider.
fn config(dir: &Path) -> std::path::PathBuf {
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n\n{}\n[policy]\ntrust = [\"mcp__ex__echo\"]\ndefault = \"deny\"\n",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        crate::common::mcp::example_server(
            "ex",
            &format!(
                "args = [\"--log-calls\", {:?}]",
                dir.join("calls.log").display().to_string()
            )
        ),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn attack(addr: std::net::SocketAddr) -> Value {
    let chromium = console::chromium();
    let script = console::script("attack.mjs");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&script)
        .current_dir(script.parent().unwrap())
        .env("TARGET", format!("http://{addr}"))
        .env("CHROMIUM", chromium)
        .kill_on_drop(true);
    let _one = console::BROWSER.lock().await;
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the attack finishes within 2 minutes")
        .expect("run node (Node.js is needed by the browser tests)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "attack.mjs failed ({})\n--- stderr ---\n{}\n--- stdout ---\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {stdout}"));
    serde_json::from_str(line).expect("RESULT json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_drive_a_keyless_loopback_server() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path())).await;
    let http = crate::common::Http::new(addr);
    // The same call from a client that is not a browser runs: the page's would have too.
    let (status, run) = http
        .post(
            "/run",
            &serde_json::json!({"goal": "/call mcp__ex__echo {\"text\":\"from-curl\"}"}),
        )
        .await;
    assert_eq!(status, 200, "{run}");
    let calls = || {
        std::fs::read_to_string(dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(calls().len(), 1, "{:?}", calls());

    let seen = attack(addr).await;
    let other = &seen["other_port"];
    assert!(
        other["read_status"]
            .as_str()
            .unwrap()
            .starts_with("blocked"),
        "{seen}"
    );
    // Nothing the pages sent ran: the one call is the first client's.
    assert_eq!(calls().len(), 1, "{:?} {seen}", calls());
    let (_, sessions) = http.get("/sessions").await;
    assert_eq!(sessions["sessions"], serde_json::json!([]), "{seen}");
    let rebinding = &seen["rebinding"];
    for key in ["same_origin_run", "same_origin_status"] {
        let answer = rebinding[key].as_str().unwrap();
        assert!(
            answer.starts_with("403") && answer.contains("host_not_allowed"),
            "{key}: {answer}"
        );
    }
}
