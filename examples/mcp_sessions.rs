//! What idle `/mcp` sessions cost a real `turnstile serve`, read from outside as its `VmRSS`:
//! per session while they are open, and what is left once they are deleted.
//!
//! ```text
//! cargo build --release --bin turnstile --example mcp_sessions --example mcp_example
//! target/release/examples/mcp_sessions target/release/turnstile 3000   # live, then deleted
//! target/release/examples/mcp_sessions target/release/turnstile 3000 'session_park_s = 1'
//! ```
//!
//! It serves `/mcp` over the example MCP server (a shared child, `mcp_example` beside this
//! binary), opens and deletes 100 sessions to warm up, then opens N sessions (each `initialize`
//! and `notifications/initialized`, then left idle) from 4 keep-alive connections and deletes
//! them all (`DELETE /mcp` with their `Mcp-Session-Id`). After each step it waits until the
//! server's RSS has not moved for 3 s (at most 30 s), and prints the figures, with the highest
//! RSS seen while the sessions were open (sampled every 10 ms). A third argument is added to
//! the `[mcp_endpoint]` table: with `session_park_s = 1` the figure is that of parked sessions
//! (the default parks them after 30 s, after the figure is taken). With `MCP_SESSIONS_CALL=1`
//! each session also calls `mcp__ex__echo` once before going idle.
//!
//! Release build, 3,000 sessions, on 2 shared cores: live 88 KiB each, 1.3 % of the growth left
//! after deleting them; parked 1.6 KiB each (with a call each too). Before parking and giving
//! memory back: 149 KiB each (168 with a call), 100 % left.

// A tool for measuring and testing, not the server: a panic is its error message.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

const THREADS: usize = 4;
const WARMUP: usize = 100;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (binary, n, extra) = match args.as_slice() {
        [binary, n] => (PathBuf::from(binary), n.parse::<usize>().context("N")?, ""),
        [binary, n, extra] => (
            PathBuf::from(binary),
            n.parse::<usize>().context("N")?,
            extra.as_str(),
        ),
        _ => bail!("usage: mcp_sessions PATH/TO/turnstile N ['[mcp_endpoint] LINES']"),
    };
    let example = std::env::current_exe()?.with_file_name("mcp_example");
    if !example.is_file() {
        bail!(
            "{} is missing: cargo build --release --example mcp_example",
            example.display()
        );
    }
    let dir = tempfile::Builder::new()
        .prefix("turnstile-mcp-sessions-")
        .tempdir()?;
    let config = dir.path().join("tools.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\n\n[limits]\nsessions_per_key = {}\n\n[mcp_servers.ex]\ncommand = {:?}\n\n[policy]\ntrust = [\"mcp__ex__*\"]\n\n[mcp_endpoint]\nenabled = true\n{extra}\n",
            n + WARMUP,
            example.display().to_string()
        ),
    )?;
    let (mut child, addr) = serve(&binary, &config)?;
    let pid = child.id();
    let run = || -> Result<()> {
        let ids = open(addr, WARMUP)?;
        delete(addr, ids)?;
        let mut anon = [0; 3];
        let base = settled(pid)?;
        anon[0] = status_kib(pid, "RssAnon")?;
        let started = Instant::now();
        let highest = Highest::watch(pid);
        let ids = open(addr, n)?;
        let opened_in = started.elapsed();
        let peak = settled(pid)?;
        let highest = highest.stop();
        anon[1] = status_kib(pid, "RssAnon")?;
        let started = Instant::now();
        delete(addr, ids)?;
        let deleted_in = started.elapsed();
        let after = settled(pid)?;
        anon[2] = status_kib(pid, "RssAnon")?;
        let growth = peak.saturating_sub(base);
        let left = |of: u64| after.saturating_sub(base) as f64 * 100.0 / of.max(1) as f64;
        println!(
            "{n} sessions: VmRSS {base} KiB -> {peak} KiB open ({:.1} KiB/session, opened in {:.1} s; highest {highest} KiB) -> {after} KiB after deleting them in {:.1} s ({:.1} % of the growth left, {:.1} % of the highest)",
            growth as f64 / n as f64,
            opened_in.as_secs_f64(),
            deleted_in.as_secs_f64(),
            left(growth),
            left(highest.saturating_sub(base)),
        );
        println!("  RssAnon {} -> {} -> {} KiB", anon[0], anon[1], anon[2]);
        Ok(())
    };
    let result = run();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// `turnstile serve` of `config` on a free loopback port; its log drained on a thread.
fn serve(binary: &Path, config: &Path) -> Result<(Child, SocketAddr)> {
    let mut child = Command::new(binary)
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn,turnstile=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            bail!("turnstile exited before listening");
        };
        let line = line?;
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .context("an address")?
                .parse()?;
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok((child, addr))
}

/// `VmRSS` of `pid` in KiB.
fn vm_rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS")
}

/// Field `name` of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, name: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no {name} in /proc/{pid}/status"))
}

/// `VmRSS` of `pid` once it has not moved for 3 s (at most 30 s).
fn settled(pid: u32) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = vm_rss_kib(pid)?;
    let mut since = Instant::now();
    while Instant::now() < deadline && since.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
        let now = vm_rss_kib(pid)?;
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(last)
}

/// The highest `VmRSS` of a process, sampled every 10 ms on a thread of its own.
struct Highest {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Highest {
    fn watch(pid: u32) -> Highest {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut highest = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                highest = highest.max(vm_rss_kib(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(10));
            }
            highest
        });
        Highest { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Open `n` sessions from [`THREADS`] connections; their ids.
fn open(addr: SocketAddr, n: usize) -> Result<Vec<String>> {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let mine = n / THREADS + usize::from(t < n % THREADS);
            std::thread::spawn(move || -> Result<Vec<String>> {
                let mut c = Raw::connect(addr)?;
                (0..mine).map(|_| c.open()).collect()
            })
        })
        .collect();
    let mut ids = Vec::with_capacity(n);
    for t in threads {
        ids.extend(
            t.join()
                .map_err(|_| anyhow!("a client thread panicked"))??,
        );
    }
    Ok(ids)
}

/// Delete the sessions `ids` from [`THREADS`] connections.
fn delete(addr: SocketAddr, ids: Vec<String>) -> Result<()> {
    let per = ids.len().div_ceil(THREADS).max(1);
    let threads: Vec<_> = ids
        .chunks(per)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            std::thread::spawn(move || -> Result<()> {
                let mut c = Raw::connect(addr)?;
                chunk.iter().try_for_each(|id| c.delete(id))
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow!("a client thread panicked"))??;
    }
    Ok(())
}

/// A blocking HTTP/1.1 client over one keep-alive connection.
struct Raw {
    conn: TcpStream,
    addr: SocketAddr,
    buf: Vec<u8>,
    /// `MCP_SESSIONS_CALL` is set: each session makes one tool call before going idle.
    call: bool,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Result<Raw> {
        let conn = TcpStream::connect(addr)?;
        conn.set_nodelay(true)?;
        Ok(Raw {
            conn,
            addr,
            buf: Vec::new(),
            call: std::env::var_os("MCP_SESSIONS_CALL").is_some(),
        })
    }

    /// `initialize` and `notifications/initialized` (and a tool call, see `call`): the new
    /// session's id.
    fn open(&mut self) -> Result<String> {
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"mcp_sessions","version":"0"}}}"#;
        let (head, body) = self.send("POST", None, init)?;
        let id =
            header(&head, "mcp-session-id").ok_or_else(|| anyhow!("no Mcp-Session-Id: {head}"))?;
        if !body.contains("serverInfo") {
            bail!("initialize: {body}");
        }
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        self.send("POST", Some(&id), note)?;
        if self.call {
            let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp__ex__echo","arguments":{"text":"hi"}}}"#;
            let (_, answer) = self.send("POST", Some(&id), call)?;
            if !answer.contains(r#""text":"hi""#) {
                bail!("tools/call: {answer}");
            }
        }
        Ok(id)
    }

    fn delete(&mut self, id: &str) -> Result<()> {
        self.send("DELETE", Some(id), "").map(drop)
    }

    /// One request; the response's head and body (de-chunked). A status other than 2xx fails.
    fn send(
        &mut self,
        method: &str,
        session: Option<&str>,
        body: &str,
    ) -> Result<(String, String)> {
        let session = session
            .map(|s| format!("mcp-session-id: {s}\r\nmcp-protocol-version: 2025-06-18\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n{session}content-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        self.conn.write_all(req.as_bytes())?;
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end);
        let mut out = Vec::new();
        if let Some(len) = header(&head, "content-length").and_then(|v| v.parse().ok()) {
            while self.buf.len() < len {
                self.fill()?;
            }
            out.extend(self.buf.drain(..len));
        } else if header(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let Some(line_end) = find(&self.buf, b"\r\n") else {
                    self.fill()?;
                    continue;
                };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&self.buf[..line_end])?.trim(), 16)?;
                if self.buf.len() < line_end + 2 + size + 2 {
                    self.fill()?;
                    continue;
                }
                out.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
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

/// The value of header `name` in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
