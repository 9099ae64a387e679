//! The console shows an MCP server's question (elicitation) as a form and answers it: the real
//! binary, the fake upstream, the Python SDK server of tests/mcp_elicitation/server.py, and the
//! system's Chromium driven by tests/console/drive.mjs (scenario `elicitation`).

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{config_text, console};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_question_is_a_form_whose_answer_is_validated_and_reaches_the_server() {
    let fake = FakeOpenAi::start().await;
    fake.record_requests(true);
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__asker__ask",
        json!({}),
    )]));
    let answer = "You are Ada, who likes blue.";
    fake.push(Reply::text(answer));
    let python = crate::common::provision::python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_elicitation/server.py");
    let extra = format!(
        "[mcp_servers.asker]\ncommand = {:?}\nargs = [{:?}]\n\n[policy]\ntrust = [\"mcp__asker__*\"]\n",
        python.display().to_string(),
        script.display().to_string()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, config_text(&fake, &extra)).unwrap();
    let (_child, addr) = crate::common::binary::serve(&path).await;

    let shots = console::shots_dir();
    let script = console::script("drive.mjs");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&script)
        .current_dir(script.parent().unwrap())
        .env("BASE", format!("http://{addr}"))
        .env("SCENARIO", "elicitation")
        .env("SHOTS", &shots)
        .env("CHROMIUM", console::chromium())
        .env("ANSWER", answer)
        .kill_on_drop(true);
    let _one = console::BROWSER.lock().await;
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the browser scenario finishes within 2 minutes")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the elicitation scenario failed; screenshots in {}\n{}\n{stdout}",
        shots.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a RESULT line");
    let result: Value = serde_json::from_str(line).unwrap();
    assert!(result["result"].to_string().contains("ada@example.com"));
    // The model got the call's result (with the schema's default for what the form left as
    // it was), and never the question's channel.
    let last = fake.requests().last().cloned().unwrap().to_string();
    assert!(last.contains("ada@example.com"), "{last}");
    assert!(last.contains("subscribe"), "{last}");
    assert!(!last.contains("Who are you?"), "{last}");
}
