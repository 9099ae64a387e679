//! Start-up fails closed: a key variable that yields no key stops `serve` (it used to serve every
//! endpoint without a key), naming the variable.

use std::process::{Command, Stdio};

fn serve_with_keys_var(value: Option<&str>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let var = "TURNSTILE_TEST_KEYS_FAIL_CLOSED";
    std::fs::write(
        dir.path().join("tools.toml"),
        format!("[server]\napi_keys_env = \"{var}\"\n"),
    )
    .unwrap();
    let mut cmd = crate::common::binary::blocking_command();
    cmd.args(["serve", "--config"])
        .arg(dir.path().join("tools.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove(var);
    if let Some(v) = value {
        cmd.env(var, v);
    }
    // The server must exit on its own; a server that started would never return here, so bound
    // the wait by killing it after a generous deadline and reporting that as a failure.
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let guard = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
            std::thread::park_timeout(std::time::Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    let out = child.wait_with_output().unwrap();
    let _ = guard.join();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unset_or_empty_key_variable_stops_serve_naming_it() {
    for value in [None, Some(""), Some(" , ,")] {
        let (code, stderr) = serve_with_keys_var(value);
        assert_eq!(code, Some(1), "value {value:?}: {stderr}");
        assert!(
            stderr.contains("TURNSTILE_TEST_KEYS_FAIL_CLOSED") && stderr.contains("no key"),
            "value {value:?}: {stderr}"
        );
        assert!(!stderr.contains("listening on"), "{stderr}");
    }
}
