//! MCP children that misbehave, and children that must be kept in: a flood of stderr without a
//! newline, a stderr line that is not UTF-8, a flood of lines, a Landlock-confined server
//! reaching for another session's files, the data folder or the network, the server-wide cap
//! on session-scoped servers, and `{workspace}` under a config given by a relative path.
//!
//! The servers are real children: the example rmcp server (`examples/mcp_example.rs`) started
//! with `--test-tools`. The stderr tests run the real binary (its RSS and its log are what a
//! user checks); the others run the server in-process (the same code path for children).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::mcp::example_server_path;
use crate::common::{config_text, Http, TestServer};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const DEADLINE: Duration = Duration::from_secs(20);

/// Every federated tool runs inline.
const TRUST_ALL: &str = "[policy]\ntrust = [\"mcp__*\"]\n";

/// A `[mcp_servers.NAME]` table running the example server with its test tools.
fn test_server(name: &str, args: &[&str], extra: &str) -> String {
    let mut all = vec!["--test-tools"];
    all.extend_from_slice(args);
    format!(
        "[mcp_servers.{name}]\ncommand = {:?}\nargs = {}\n{extra}\n",
        example_server_path().display().to_string(),
        json!(all)
    )
}

/// Config text for servers plus the policy that trusts them all.
fn trusted(servers: &[String]) -> String {
    format!("{}\n{TRUST_ALL}", servers.join("\n"))
}

/// Run one tool call in a turn of `sid`: the fake model asks for it, then ends the turn. The
/// tool result's text as the model got it.
async fn call_tool(http: &Http, fake: &FakeOpenAi, sid: &str, tool: &str, args: Value) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let id = format!("call_{}", N.fetch_add(1, Ordering::SeqCst));
    fake.push(Reply::tool_calls(&[(&id, tool, args)]));
    fake.push(Reply::text("done"));
    let (status, resp) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": format!("call {tool}")}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    result_of(fake, &id)
}

/// The result of call `id` in the requests the fake model received.
fn result_of(fake: &FakeOpenAi, id: &str) -> String {
    fake.requests()
        .iter()
        .rev()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}"))["content"]
        .as_str()
        .expect("text content")
        .to_string()
}

async fn session(http: &Http) -> String {
    let (status, v) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    v["sessionId"].as_str().unwrap().to_string()
}

/// Poll `f` until it holds or the deadline passes.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !f() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` is gone (absent, or a zombie awaiting its reaper).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field}"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("kB");
    kb * 1024
}

/// The real binary, run in `dir` with `--config <config>` (relative to `dir` when relative),
/// its log collected.
struct Proc {
    child: Child,
    http: Http,
    log: Arc<Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

/// A log line without terminal colour codes.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Proc {
    async fn spawn(dir: &Path, config: &str, rust_log: &str) -> Proc {
        let mut child = crate::common::binary::command()
            .current_dir(dir)
            .args(["serve", "--config", config, "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", rust_log)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn turnstile");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let addr = loop {
            let line = tokio::time::timeout(DEADLINE, lines.next_line())
                .await
                .expect("turnstile listening in time")
                .expect("stderr")
                .expect("turnstile exited before listening");
            let line = plain(&line);
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .expect("addr");
            }
        };
        let sink = log.clone();
        // Keep draining the log so the server never blocks on a full pipe.
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(plain(&line));
            }
        });
        Proc {
            child,
            http: Http::new(addr),
            log,
            reader,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("pid")
    }

    fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// SIGTERM, and wait for a clean exit.
    async fn stop(mut self) {
        // SAFETY: kill only sends a signal to our own child.
        unsafe {
            libc::kill(self.pid() as i32, libc::SIGTERM);
        }
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("turnstile exits after SIGTERM")
            .expect("wait");
        assert!(status.success(), "{status}");
        // The whole log, up to its end.
        tokio::time::timeout(DEADLINE, self.reader)
            .await
            .expect("the log ends after the exit")
            .expect("log reader");
    }
}

fn write_config(dir: &Path, fake: &FakeOpenAi, extra: &str) {
    std::fs::write(dir.join("tools.toml"), config_text(fake, extra)).unwrap();
}

#[tokio::test]
async fn stderr_of_96_mib_without_a_newline_grows_rss_by_under_48_mib() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake, &trusted(&[test_server("ex", &[], "")]));
    let p = Proc::spawn(
        dir.path(),
        "tools.toml",
        "info,turnstile::mcp::stderr=debug",
    )
    .await;
    let sid = session(&p.http).await;
    // Warm up: a turn with a call, so what is measured is the flood alone.
    let pid = call_tool(&p.http, &fake, &sid, "mcp__ex__pid", json!({})).await;
    let before = status_bytes(p.pid(), "VmRSS");

    const FLOOD: u64 = 96 << 20;
    let out = call_tool(
        &p.http,
        &fake,
        &sid,
        "mcp__ex__stderr_flood",
        json!({"bytes": FLOOD, "newline": false}),
    )
    .await;
    assert_eq!(out, format!("wrote {FLOOD} bytes to stderr"));
    // The flood ends the line: the whole stream has been read once this shows in the log.
    assert_eq!(
        call_tool(
            &p.http,
            &fake,
            &sid,
            "mcp__ex__stderr_write",
            json!({"text": "\nafter the flood"})
        )
        .await,
        "written"
    );
    until("the line after the flood in the log", || {
        !p.log_lines("after the flood").is_empty()
    })
    .await;
    let after = status_bytes(p.pid(), "VmRSS");
    let peak = status_bytes(p.pid(), "VmHWM");
    let grew = after.saturating_sub(before);
    let peak_grew = peak.saturating_sub(before);
    eprintln!(
        "RSS before {} MiB, after {} MiB, peak {} MiB",
        before >> 20,
        after >> 20,
        peak >> 20
    );
    assert!(grew < 48 << 20, "RSS grew by {} MiB", grew >> 20);
    assert!(
        peak_grew < 48 << 20,
        "peak RSS grew by {} MiB",
        peak_grew >> 20
    );
    // The long line was logged cut to 8 KiB, and the server is the same process.
    let cut = p.log_lines("cut=true");
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert!(cut[0].len() < 9 * 1024, "{} bytes", cut[0].len());
    assert_eq!(
        call_tool(&p.http, &fake, &sid, "mcp__ex__pid", json!({})).await,
        pid
    );
    p.stop().await;
}

#[tokio::test]
async fn a_stderr_line_that_is_not_utf8_leaves_the_childs_stderr_open() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake, &trusted(&[test_server("ex", &[], "")]));
    let p = Proc::spawn(
        dir.path(),
        "tools.toml",
        "info,turnstile::mcp::stderr=debug",
    )
    .await;
    let sid = session(&p.http).await;
    let pid = call_tool(&p.http, &fake, &sid, "mcp__ex__pid", json!({})).await;
    assert_eq!(
        call_tool(
            &p.http,
            &fake,
            &sid,
            "mcp__ex__stderr_write",
            json!({"text": "<- not UTF-8", "bad_utf8": true})
        )
        .await,
        "written"
    );
    // 1 MiB is more than a pipe holds: it goes through only if turnstile still reads (a
    // closed pipe fails it with EPIPE, which kills a Node server). 64 lines: fewer than the
    // log's burst, so the next line is logged.
    assert_eq!(
        call_tool(
            &p.http,
            &fake,
            &sid,
            "mcp__ex__stderr_flood",
            json!({"bytes": 16 * 1024, "newline": true, "lines": 64})
        )
        .await,
        format!("wrote {} bytes to stderr", 1024 * 1024)
    );
    assert_eq!(
        call_tool(
            &p.http,
            &fake,
            &sid,
            "mcp__ex__stderr_write",
            json!({"text": "still open"})
        )
        .await,
        "written"
    );
    until("the line after the bad one in the log", || {
        !p.log_lines("still open").is_empty()
    })
    .await;
    // The bad line is logged with replacement characters; the child never restarted.
    assert_eq!(p.log_lines("\u{fffd}\u{fffd}<- not UTF-8").len(), 1);
    assert_eq!(
        call_tool(&p.http, &fake, &sid, "mcp__ex__pid", json!({})).await,
        pid
    );
    p.stop().await;
}

#[tokio::test]
async fn a_flood_of_stderr_lines_is_rate_limited_and_counted() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake, &trusted(&[test_server("ex", &[], "")]));
    let p = Proc::spawn(
        dir.path(),
        "tools.toml",
        "info,turnstile::mcp::stderr=debug",
    )
    .await;
    let sid = session(&p.http).await;
    let started = std::time::Instant::now();
    const LINES: usize = 20_000;
    call_tool(
        &p.http,
        &fake,
        &sid,
        "mcp__ex__stderr_flood",
        json!({"bytes": 10, "newline": true, "lines": LINES}),
    )
    .await;
    let p_log = p.log.clone();
    // Stopping ends the child's stderr: the count of lines left out is reported then.
    p.stop().await;
    let elapsed = started.elapsed().as_secs_f64();
    let log = p_log.lock().unwrap();
    let logged = log.iter().filter(|l| l.contains("xxxxxxxxxx")).count();
    // A burst of 100, then 20 lines a second.
    let allowed = 100 + (20.0 * elapsed).ceil() as usize;
    assert!(
        logged > 0 && logged <= allowed,
        "{logged} lines logged in {elapsed:.1} s"
    );
    let reports: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("lines not logged") && l.contains("INFO"))
        .collect();
    let counted: usize = reports
        .iter()
        .filter_map(|l| {
            l.split("not_logged=")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    // Every line is logged or counted (the server's own last words, "stdin closed", may be
    // among those counted).
    assert!(
        (LINES..=LINES + 2).contains(&(counted + logged)),
        "{logged} logged, {counted} counted: {reports:?}"
    );
}

/// On a kernel without Landlock, a confined server is never started unconfined: `turnstile
/// check` fails and says why.
async fn landlock_is_refused(config: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config).unwrap();
    let out = crate::common::binary::command()
        .current_dir(dir.path())
        .args(["check", "--config", "tools.toml"])
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run turnstile check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("does not enforce Landlock"), "{stderr}");
}

/// Whether `out`, the result of the example server's `read_file` of `path`, is its error for
/// a read the sandbox refused. Not merely a text containing "Permission denied": the event log
/// records the refusals of earlier calls, so a read of `turnstile.db` that got through may
/// contain those words too.
fn refused(out: &str, path: &Path) -> bool {
    out.strip_prefix(&format!("cannot read {}: ", path.display()))
        .is_some_and(|why| why.starts_with("Permission denied"))
}

/// Where a file with `content` lies beneath `dir`.
fn find_file(dir: &Path, content: &[u8]) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, content) {
                return Some(found);
            }
        } else if std::fs::read(&path).is_ok_and(|c| c == content) {
            return Some(path);
        }
    }
    None
}

#[tokio::test]
async fn a_landlocked_session_server_reads_and_writes_only_its_workspace() {
    let fake = FakeOpenAi::start().await;
    // A second, unconfined server shows that the paths refused to `box` are right.
    let extra = trusted(&[
        test_server("box", &[], "scope = \"session\"\nsandbox = \"landlock\""),
        test_server("open", &[], "scope = \"session\""),
    ]);
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let http = &server.http;
    let a = session(http).await;
    let b = session(http).await;
    // A's upload, and a file in A's workspace.
    let (status, up) = http
        .call(
            "POST",
            "/files?filename=a-secret.txt",
            Some(&json!("A's uploaded secret")),
        )
        .await;
    assert_eq!(status, 201, "{up}");
    let upload = find_file(&server.data_dir(), b"\"A's uploaded secret\"").expect("the upload");
    let a_file = server.dir.path().join("sandboxes").join(&a).join("a.txt");
    std::fs::write(&a_file, "A's workspace file").unwrap();
    let db = server.data_dir().join("turnstile.db");
    assert!(db.is_file());

    if !turnstile::tools::mcp::sandbox::available() {
        landlock_is_refused(&config_text(&fake, &extra)).await;
        return;
    }
    let read = |path: &Path| json!({"path": path.display().to_string()});
    for secret in [&upload, &a_file, &db] {
        let out = call_tool(http, &fake, &b, "mcp__box__read_file", read(secret)).await;
        assert!(
            refused(&out, secret),
            "{} was readable: {out}",
            secret.display()
        );
        // Unconfined, the same path is readable: the sandbox is what refused it. (The event
        // log holds the refusals above once checkpointed: its content may well contain
        // "Permission denied", so only the form of an error is looked for.)
        let out = call_tool(http, &fake, &b, "mcp__open__read_file", read(secret)).await;
        assert!(!out.starts_with("cannot read "), "{out}");
    }
    // Its own workspace: write, then read back, by relative and absolute path.
    let out = call_tool(
        http,
        &fake,
        &b,
        "mcp__box__write_file",
        json!({"path": "mine.txt", "text": "B's own"}),
    )
    .await;
    assert_eq!(out, "wrote 7 bytes");
    let mine = server
        .dir
        .path()
        .join("sandboxes")
        .join(&b)
        .join("mine.txt");
    assert_eq!(
        call_tool(http, &fake, &b, "mcp__box__read_file", read(&mine)).await,
        "B's own"
    );
    assert_eq!(
        call_tool(
            http,
            &fake,
            &b,
            "mcp__box__read_file",
            json!({"path": "mine.txt"})
        )
        .await,
        "B's own"
    );
    // System files an interpreter needs stay readable.
    let out = call_tool(
        http,
        &fake,
        &b,
        "mcp__box__read_file",
        json!({"path": "/etc/passwd"}),
    )
    .await;
    assert!(out.contains("root:"), "{out}");
    // Writing next to the data folder is refused as before.
    let out = call_tool(
        http,
        &fake,
        &b,
        "mcp__box__write_file",
        json!({"path": server.dir.path().join("escape.txt").display().to_string(), "text": "x"}),
    )
    .await;
    assert!(out.contains("Permission denied"), "{out}");
    server.stop().await;
}

#[tokio::test]
async fn a_landlocked_server_connects_over_tcp_only_with_network_true() {
    let fake = FakeOpenAi::start().await;
    let extra = trusted(&[
        test_server("shut", &[], "sandbox = \"landlock\""),
        test_server("net", &[], "sandbox = \"landlock\"\nnetwork = true"),
    ]);
    if !turnstile::tools::mcp::sandbox::available() {
        landlock_is_refused(&config_text(&fake, &extra)).await;
        return;
    }
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = session(&server.http).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = json!({"addr": listener.local_addr().unwrap().to_string()});
    let shut = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__shut__connect",
        addr.clone(),
    )
    .await;
    let open = call_tool(&server.http, &fake, &sid, "mcp__net__connect", addr).await;
    assert_eq!(open, "connected");
    if turnstile::tools::mcp::sandbox::kernel_abi() >= 4 {
        assert!(shut.contains("Permission denied"), "{shut}");
    } else {
        // The kernel cannot restrict TCP; the start-up log says so (see McpHost::start).
        assert_eq!(shut, "connected");
    }
    server.stop().await;
}

/// A confined server whose args name the folder holding turnstile's config and data (through
/// a symlink), and another instance's folder (through `..`), reads the other files there but
/// none of turnstile's state: not the config or `turnstile.env` beside it, not the event log,
/// not the other instance's data folder or config.
#[tokio::test]
async fn a_landlocked_server_whose_args_name_turnstiles_folders_cannot_read_its_state() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().canonicalize().unwrap();
    std::fs::write(home.join("notes.txt"), "notes beside the config").unwrap();
    std::fs::write(home.join("turnstile.env"), "OPENAI_API_KEY=sk-secret").unwrap();
    let others = tempfile::tempdir().unwrap();
    let other = others.path().canonicalize().unwrap().join("b");
    std::fs::create_dir_all(other.join("data")).unwrap();
    std::fs::create_dir_all(other.join("pub")).unwrap();
    std::fs::write(other.join("data/turnstile.db"), "b's event log").unwrap();
    std::fs::write(other.join("tools.toml"), "# b's config").unwrap();
    std::fs::write(other.join("pub/readme.txt"), "b's readme").unwrap();
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("home");
    std::os::unix::fs::symlink(&home, &link).unwrap();
    let named = [
        "--label".to_string(),
        link.display().to_string(),
        "--label".to_string(),
        format!("{}/pub/..", other.display()),
    ];
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    let extra = trusted(&[
        test_server("box", &named, "sandbox = \"landlock\""),
        test_server("open", &[], ""),
    ]);
    if !turnstile::tools::mcp::sandbox::available() {
        landlock_is_refused(&config_text(&fake, &extra)).await;
        return;
    }
    let server = TestServer::start_in(dir, &config_text(&fake, &extra)).await;
    let sid = session(&server.http).await;
    let read = |path: PathBuf| json!({"path": path.display().to_string()});
    for (readable, content) in [
        (home.join("notes.txt"), "notes beside the config"),
        (other.join("pub/readme.txt"), "b's readme"),
    ] {
        let out = call_tool(
            &server.http,
            &fake,
            &sid,
            "mcp__box__read_file",
            read(readable),
        )
        .await;
        assert_eq!(out, content);
    }
    let db = server.data_dir().join("turnstile.db");
    assert!(db.is_file());
    for secret in [
        home.join("tools.toml"),
        home.join("turnstile.env"),
        db,
        other.join("data/turnstile.db"),
        other.join("tools.toml"),
    ] {
        let out = call_tool(
            &server.http,
            &fake,
            &sid,
            "mcp__box__read_file",
            read(secret.clone()),
        )
        .await;
        assert!(
            refused(&out, &secret),
            "{} was readable: {out}",
            secret.display()
        );
        // Unconfined, the same path is readable: the sandbox is what refused it.
        let out = call_tool(
            &server.http,
            &fake,
            &sid,
            "mcp__open__read_file",
            read(secret),
        )
        .await;
        assert!(!out.starts_with("cannot read "), "{out}");
    }
    server.stop().await;
}

#[tokio::test]
async fn past_session_servers_the_idlest_is_stopped_and_restarts_on_demand() {
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "[limits]\nsession_servers = 2\n\n{}",
        trusted(&[test_server("ex", &[], "scope = \"session\"")])
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let http = &server.http;
    let pid = |s: String| s.parse::<u32>().expect("a pid");
    let s1 = session(http).await;
    let s2 = session(http).await;
    let s3 = session(http).await;
    let p1 = pid(call_tool(http, &fake, &s1, "mcp__ex__pid", json!({})).await);
    let p2 = pid(call_tool(http, &fake, &s2, "mcp__ex__pid", json!({})).await);
    assert!(!gone(p1) && !gone(p2));
    // A third session's server: s1's, called longest ago, makes room.
    let p3 = pid(call_tool(http, &fake, &s3, "mcp__ex__pid", json!({})).await);
    until("s1's server stopped", || gone(p1)).await;
    assert!(!gone(p2) && !gone(p3));
    // s1 calls again: its server restarts (a new process) and s2's, now the idlest, goes.
    let p1b = pid(call_tool(http, &fake, &s1, "mcp__ex__pid", json!({})).await);
    assert_ne!(p1b, p1);
    until("s2's server stopped", || gone(p2)).await;
    assert!(!gone(p3) && !gone(p1b));
    server.stop().await;
}

#[tokio::test]
async fn past_session_servers_with_every_one_in_a_call_the_call_is_refused_naming_the_limit() {
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "[limits]\nsession_servers = 1\n\n{}",
        trusted(&[test_server("ex", &[], "scope = \"session\"")])
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let s1 = session(&server.http).await;
    let s2 = session(&server.http).await;
    // s1's server is in a call (it tells us so by connecting here) ...
    let notify = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    fake.push(Reply::tool_calls(&[(
        "c_slow",
        "mcp__ex__slow",
        json!({"ms": 60_000, "notify": notify.local_addr().unwrap().to_string()}),
    )]));
    let held = server
        .post_and_hold(
            &format!("/sessions/{s1}/turns"),
            &json!({"messages": [{"role": "user", "content": "slow"}]}),
        )
        .await;
    let (mut conn, _) = tokio::time::timeout(DEADLINE, notify.accept())
        .await
        .expect("the slow call started")
        .unwrap();
    let mut busy_pid = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut busy_pid)
        .await
        .unwrap();
    let busy_pid: u32 = busy_pid.trim().parse().unwrap();
    // ... so s2's call is refused, and s1's server is left alone.
    let out = call_tool(&server.http, &fake, &s2, "mcp__ex__pid", json!({})).await;
    assert_eq!(
        out,
        "turnstile has 1 session-scoped MCP servers running, each in a call \
         (limit: [limits] session_servers in tools.toml); try again later"
    );
    assert!(!gone(busy_pid));
    drop(held);
    let (status, _) = server
        .http
        .post(&format!("/sessions/{s1}/cancel"), &json!({}))
        .await;
    assert!(status < 300, "cancel: {status}");
    // Once the call is over, s2 gets a server (s1's makes room).
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let out = call_tool(&server.http, &fake, &s2, "mcp__ex__pid", json!({})).await;
        if out.parse::<u32>().is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "s2 never got a server: {out}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until("s1's server stopped", || gone(busy_pid)).await;
    server.stop().await;
}

/// Start a turn of `sid` (as `http`'s key) whose one call, `slow`, stays in flight; returns
/// once the call has reached its server, with the request's task (the turn goes on without it).
async fn hold_a_call(http: &Http, fake: &FakeOpenAi, sid: &str) -> tokio::task::JoinHandle<()> {
    let notify = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    fake.push(Reply::tool_calls(&[(
        &format!("c_slow_{sid}"),
        "mcp__ex__slow",
        json!({"ms": 60_000, "notify": notify.local_addr().unwrap().to_string()}),
    )]));
    let (http, path) = (http.clone(), format!("/sessions/{sid}/turns"));
    let task = tokio::spawn(async move {
        http.post(
            &path,
            &json!({"messages": [{"role": "user", "content": "slow"}]}),
        )
        .await;
    });
    tokio::time::timeout(DEADLINE, notify.accept())
        .await
        .expect("the slow call started")
        .unwrap();
    task
}

#[tokio::test]
async fn one_keys_sessions_cannot_take_every_session_server() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_HOSTILE_MCP_SHARE_KEYS";
    let extra = format!(
        "[limits]\nsession_servers = 3\nsession_servers_per_key = 2\n\n{}",
        trusted(&[test_server("ex", &[], "scope = \"session\"")])
    );
    let text = config_text(&fake, &extra)
        .replace("[server]", &format!("[server]\napi_keys_env = \"{var}\""));
    let server = TestServer::start_with_env(&text, &[(var, "key-a,key-b")]).await;
    let (a, b) = (server.http.with_key("key-a"), server.http.with_key("key-b"));
    let a_sessions = [session(&a).await, session(&a).await, session(&a).await];
    let b1 = session(&b).await;
    // Key a's sessions hold two servers in calls: its share.
    let held = [
        hold_a_call(&a, &fake, &a_sessions[0]).await,
        hold_a_call(&a, &fake, &a_sessions[1]).await,
    ];
    // Its third session's call is refused, naming the per-key limit...
    let out = call_tool(&a, &fake, &a_sessions[2], "mcp__ex__pid", json!({})).await;
    assert_eq!(
        out,
        "this API key's sessions have 2 session-scoped MCP servers running, each in a call \
         (limit: [limits] session_servers_per_key in tools.toml); try again when one ends"
    );
    // ... and key b still gets a server: a's calls left room for it.
    let out = call_tool(&b, &fake, &b1, "mcp__ex__pid", json!({})).await;
    assert!(out.parse::<u32>().is_ok(), "key b's call ran: {out}");
    for (sid, task) in a_sessions.iter().zip(held) {
        let (status, _) = a.post(&format!("/sessions/{sid}/cancel"), &json!({})).await;
        assert!(status < 300, "cancel: {status}");
        task.await.unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn workspace_in_args_is_absolute_under_a_relative_config_path() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &fake,
        &trusted(&[test_server(
            "ex",
            &["--label", "{workspace}"],
            "scope = \"session\"",
        )]),
    );
    // `--config tools.toml`, relative to the server's current directory.
    let p = Proc::spawn(dir.path(), "tools.toml", "info").await;
    let sid = session(&p.http).await;
    let argv: Vec<String> =
        serde_json::from_str(&call_tool(&p.http, &fake, &sid, "mcp__ex__argv", json!({})).await)
            .expect("a JSON array");
    let label = argv
        .iter()
        .position(|a| a == "--label")
        .and_then(|i| argv.get(i + 1))
        .unwrap_or_else(|| panic!("no --label in {argv:?}"));
    let workspace = Path::new(label);
    assert!(workspace.is_absolute(), "{label}");
    // The child runs inside its workspace; the path names that very folder.
    assert_eq!(
        workspace.canonicalize().unwrap(),
        dir.path()
            .join("sandboxes")
            .join(&sid)
            .canonicalize()
            .unwrap()
    );
    let cwd = call_tool(&p.http, &fake, &sid, "mcp__ex__cwd", json!({})).await;
    assert_eq!(
        Path::new(&cwd).canonicalize().unwrap(),
        workspace.canonicalize().unwrap()
    );
    p.stop().await;
}

/// A minimal MCP stdio server in Python with one tool, `read {path}`.
const PY_SERVER: &str = r#"
import json, sys
def answer(id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if id is None:
        continue
    if method == "initialize":
        answer(id, {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                    "serverInfo": {"name": "py", "version": "1"}})
    elif method == "tools/list":
        answer(id, {"tools": [{"name": "read", "description": "read a file",
                               "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]})
    elif method == "tools/call":
        try:
            with open(msg["params"]["arguments"]["path"]) as f:
                answer(id, {"content": [{"type": "text", "text": f.read()}], "isError": False})
        except OSError as e:
            answer(id, {"content": [{"type": "text", "text": str(e)}], "isError": True})
    else:
        answer(id, {})
"#;

/// The same server in Node.
const JS_SERVER: &str = r#"
const fs = require("fs");
const rl = require("readline").createInterface({ input: process.stdin });
const answer = (id, result) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, result }) + "\n");
rl.on("line", (line) => {
  const msg = JSON.parse(line);
  if (msg.id === undefined) return;
  if (msg.method === "initialize") {
    answer(msg.id, { protocolVersion: msg.params.protocolVersion, capabilities: { tools: {} },
                     serverInfo: { name: "js", version: "1" } });
  } else if (msg.method === "tools/list") {
    answer(msg.id, { tools: [{ name: "read", description: "read a file",
                               inputSchema: { type: "object", properties: { path: { type: "string" } } } }] });
  } else if (msg.method === "tools/call") {
    try {
      answer(msg.id, { content: [{ type: "text", text: fs.readFileSync(msg.params.arguments.path, "utf8") }], isError: false });
    } catch (e) {
      answer(msg.id, { content: [{ type: "text", text: String(e) }], isError: true });
    }
  } else {
    answer(msg.id, {});
  }
});
"#;

/// Python and Node, as found on PATH (a pyenv shim, /usr/bin/node), start confined: their
/// install folders and the script are readable; the data folder is not.
#[tokio::test]
async fn python_and_node_servers_run_confined_and_cannot_read_the_data_folder() {
    let scripts = tempfile::tempdir().unwrap();
    std::fs::write(scripts.path().join("server.py"), PY_SERVER).unwrap();
    std::fs::write(scripts.path().join("server.js"), JS_SERVER).unwrap();
    let table = |name: &str, command: &str, script: &str| {
        format!(
            "[mcp_servers.{name}]\ncommand = {command:?}\nargs = [{:?}]\nscope = \"session\"\nsandbox = \"landlock\"\n",
            scripts.path().join(script).display().to_string()
        )
    };
    let fake = FakeOpenAi::start().await;
    let extra = trusted(&[
        table("py", "python3", "server.py"),
        table("js", "node", "server.js"),
    ]);
    if !turnstile::tools::mcp::sandbox::available() {
        landlock_is_refused(&config_text(&fake, &extra)).await;
        return;
    }
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = session(&server.http).await;
    std::fs::write(
        server
            .dir
            .path()
            .join("sandboxes")
            .join(&sid)
            .join("own.txt"),
        "own file",
    )
    .unwrap();
    let db = server.data_dir().join("turnstile.db");
    for tool in ["mcp__py__read", "mcp__js__read"] {
        let own = call_tool(&server.http, &fake, &sid, tool, json!({"path": "own.txt"})).await;
        assert_eq!(own, "own file", "{tool}");
        let out = call_tool(
            &server.http,
            &fake,
            &sid,
            tool,
            json!({"path": db.display().to_string()}),
        )
        .await;
        // The error itself, not a text that merely holds its words (as the event log, with
        // the first server's refusal in it, may).
        assert!(
            out.starts_with("[Errno 13] Permission denied") || out.starts_with("Error: EACCES"),
            "{tool}: {out}"
        );
    }
    server.stop().await;
}
