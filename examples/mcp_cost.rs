//! What turnstile itself spends on one MCP tool call, in instructions and allocations, for
//! profiling (the wall-clock figures are the bench's `mcp` section).
//!
//! ```text
//! cargo build --release --example mcp_cost --example mcp_example
//! target/release/examples/mcp_cost host 1000       # the tool host: McpHost::call on mcp__ex__add
//! target/release/examples/mcp_cost endpoint 1000   # tools/call through /mcp (raw HTTP client)
//! target/release/examples/mcp_cost direct 1000     # the baseline: an rmcp client calling `add`
//! valgrind --tool=callgrind --separate-threads=yes target/release/examples/mcp_cost host 1000
//! ```
//!
//! Each mode starts what it measures (the example MCP server as a stdio child), makes 50
//! warm-up calls, then N calls, and prints the allocations per call made by turnstile's threads
//! (the `/mcp` client runs on its own thread, whose allocations are not counted). For
//! instructions per call, run it under callgrind at two N and divide the difference of the
//! totals (without the client thread's) by the difference of the N.

// A tool for measuring and testing, not the server: a panic is its error message.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::json;
use turnstile::tools::{CallContext, ToolHost};

/// Counts the allocations (and reallocations) of every thread but the one marked uncounted.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if !UNCOUNTED.with(Cell::get) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to mimalloc unchanged; counting touches no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        mimalloc::MiMalloc.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        mimalloc::MiMalloc.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        mimalloc::MiMalloc.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WARMUP: usize = 50;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, n) = match args.as_slice() {
        [mode, n] => (mode.clone(), n.parse::<usize>().context("N")?),
        _ => bail!("usage: mcp_cost host|endpoint|direct N"),
    };
    let exe = std::env::current_exe()?;
    let child = exe.with_file_name(format!("mcp_example{}", std::env::consts::EXE_SUFFIX));
    if !child.is_file() {
        bail!(
            "{} is missing: cargo build --release --example mcp_example",
            child.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new()
        .prefix("turnstile-mcp-cost-")
        .tempdir()?;
    let path = dir.path().join("tools.toml");
    let text = format!(
        "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\n\n[limits]\nsessions_per_key = 1000\n\n[mcp_servers.ex]\ncommand = {:?}\n\n[policy]\ntrust = [\"mcp__ex__add\"]\n\n[mcp_endpoint]\nenabled = true\n",
        child.display().to_string()
    );
    std::fs::write(&path, &text)?;
    let cfg = turnstile::config::load_str(&path, &text, &turnstile::config::Env::process())
        .map_err(|e| anyhow!("config: {e}"))?;
    let (allocs, bytes, took) = match mode.as_str() {
        "host" => runtime.block_on(host(cfg, dir.path().join("sandboxes/ses_cost"), n))?,
        "endpoint" => runtime.block_on(endpoint(cfg, n))?,
        "direct" => runtime.block_on(direct(&child, n))?,
        other => bail!("unknown mode {other:?}: host, endpoint or direct"),
    };
    println!(
        "{mode}: {n} calls, {:.1} allocations/call, {:.0} bytes allocated/call, {:.1} µs/call",
        allocs as f64 / n as f64,
        bytes as f64 / n as f64,
        took.as_secs_f64() * 1e6 / n as f64
    );
    drop(runtime);
    Ok(())
}

fn counters() -> (u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

async fn host(
    cfg: turnstile::config::Config,
    workspace: PathBuf,
    n: usize,
) -> Result<(u64, u64, Duration)> {
    let host = turnstile::startup::tool_host(&Arc::new(cfg), None)
        .await
        .map_err(|e| anyhow!("tool host: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.tools().iter().any(|t| t.spec.name == "mcp__ex__add") {
        if Instant::now() > deadline {
            bail!("the tool host does not list mcp__ex__add");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ctx = CallContext {
        session_id: "ses_cost".into(),
        workspace,
        owner: None,
        elicitor: None,
        sampler: None,
    };
    let call = || async {
        let out = host
            .call(&ctx, "mcp__ex__add", json!({"a": 2, "b": 3}))
            .await;
        if out.is_error || !out.content.to_string().contains("sum") {
            bail!("add failed: {out:?}");
        }
        Ok(())
    };
    for _ in 0..WARMUP {
        call().await?;
    }
    let (a0, b0) = counters();
    let t = Instant::now();
    for _ in 0..n {
        call().await?;
    }
    let took = t.elapsed();
    let (a1, b1) = counters();
    host.shutdown().await;
    Ok((a1 - a0, b1 - b0, took))
}

/// The baseline: a plain rmcp client calling `add` on its own child.
async fn direct(child: &std::path::Path, n: usize) -> Result<(u64, u64, Duration)> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;
    use rmcp::ServiceExt;
    let mut cmd = tokio::process::Command::new(child);
    cmd.kill_on_drop(true);
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("spawning mcp_example")?;
    let client = ().serve(transport).await.context("MCP initialize")?;
    let serde_json::Value::Object(args) = json!({"a": 2, "b": 3}) else {
        unreachable!()
    };
    let call = || async {
        let params = CallToolRequestParams::new("add").with_arguments(args.clone());
        let res = client.call_tool(params).await.context("tools/call")?;
        if res.is_error == Some(true) {
            bail!("add failed: {res:?}");
        }
        Ok(())
    };
    for _ in 0..WARMUP {
        call().await?;
    }
    let (a0, b0) = counters();
    let t = Instant::now();
    for _ in 0..n {
        call().await?;
    }
    let took = t.elapsed();
    let (a1, b1) = counters();
    let _ = client.cancel().await;
    Ok((a1 - a0, b1 - b0, took))
}

async fn endpoint(cfg: turnstile::config::Config, n: usize) -> Result<(u64, u64, Duration)> {
    let running = turnstile::startup::start(
        cfg,
        "127.0.0.1:0".parse()?,
        turnstile::startup::StartOptions::default(),
    )
    .await
    .map_err(|e| anyhow!("start: {e}"))?;
    // The server waits for its MCP servers' first start-up attempt: the tool is listed.
    let addr = running.addr;
    let (start_tx, start_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let client = std::thread::Builder::new()
        .name("mcp-cost-client".into())
        .spawn(move || -> Result<Duration> {
            UNCOUNTED.with(|u| u.set(true));
            let mut c = RawClient::connect(addr)?;
            c.open()?;
            for _ in 0..WARMUP {
                c.add()?;
            }
            // Wait until the server side has read the counters.
            let _ = done_tx.send(());
            start_rx.recv()?;
            let t = Instant::now();
            for _ in 0..n {
                c.add()?;
            }
            Ok(t.elapsed())
        })?;
    if done_rx.await.is_err() {
        return Err(match client.join() {
            Ok(Err(e)) => e,
            _ => anyhow!("the client thread panicked"),
        });
    }
    let (a0, b0) = counters();
    start_tx.send(())?;
    let took = tokio::task::spawn_blocking(move || client.join())
        .await?
        .map_err(|_| anyhow!("the client thread panicked"))??;
    let (a1, b1) = counters();
    let _ = tokio::time::timeout(Duration::from_secs(15), running.stop()).await;
    Ok((a1 - a0, b1 - b0, took))
}

/// A minimal blocking HTTP/1.1 MCP client over one keep-alive connection, so that what the
/// client costs stays small and off the counted threads.
struct RawClient {
    conn: std::net::TcpStream,
    addr: std::net::SocketAddr,
    session: String,
    next_id: u64,
    buf: Vec<u8>,
}

impl RawClient {
    fn connect(addr: std::net::SocketAddr) -> Result<RawClient> {
        let conn = std::net::TcpStream::connect(addr)?;
        conn.set_nodelay(true)?;
        Ok(RawClient {
            conn,
            addr,
            session: String::new(),
            next_id: 0,
            buf: Vec::with_capacity(8192),
        })
    }

    fn open(&mut self) -> Result<()> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "mcp_cost", "version": "0"}}});
        let (head, body) = self.post(&init.to_string())?;
        self.session = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("mcp-session-id")
                    .then(|| v.trim().to_string())
            })
            .ok_or_else(|| anyhow!("no Mcp-Session-Id in {head}"))?;
        if !body.contains("serverInfo") {
            bail!("initialize: {body}");
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(&note.to_string())?;
        Ok(())
    }

    fn add(&mut self) -> Result<()> {
        self.next_id += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"mcp__ex__add","arguments":{{"a":2,"b":3}}}}}}"#,
            self.next_id
        );
        let (_, answer) = self.post(&body)?;
        if !answer.contains(r#""text":"5""#) || answer.contains(r#""isError":true"#) {
            bail!("tools/call: {answer}");
        }
        Ok(())
    }

    /// POST one message; the response's head and its body (de-chunked).
    fn post(&mut self, body: &str) -> Result<(String, String)> {
        let session = if self.session.is_empty() {
            String::new()
        } else {
            format!(
                "mcp-session-id: {}\r\nmcp-protocol-version: 2025-06-18\r\n",
                self.session
            )
        };
        let req = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n{session}content-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        self.conn.write_all(req.as_bytes())?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let lower = head.to_ascii_lowercase();
        let mut rest = self.buf.split_off(head_end);
        let mut out = Vec::new();
        if let Some(len) = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            while rest.len() < len {
                self.buf.clear();
                self.fill()?;
                rest.extend_from_slice(&self.buf);
            }
            out.extend_from_slice(&rest[..len]);
        } else if lower.contains("transfer-encoding: chunked") {
            loop {
                let Some(line_end) = find(&rest, b"\r\n") else {
                    self.more(&mut rest)?;
                    continue;
                };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&rest[..line_end])?.trim(), 16)?;
                if rest.len() < line_end + 2 + size + 2 {
                    self.more(&mut rest)?;
                    continue;
                }
                out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
                rest.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        }
        if !head.starts_with("HTTP/1.1 2") {
            bail!("{head}{}", String::from_utf8_lossy(&out));
        }
        Ok((head, String::from_utf8_lossy(&out).into_owned()))
    }

    fn more(&mut self, rest: &mut Vec<u8>) -> Result<()> {
        self.buf.clear();
        self.fill()?;
        rest.extend_from_slice(&self.buf);
        Ok(())
    }

    fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 8192];
        let got = self.conn.read(&mut chunk)?;
        if got == 0 {
            bail!("the server closed the connection");
        }
        self.buf.extend_from_slice(&chunk[..got]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
