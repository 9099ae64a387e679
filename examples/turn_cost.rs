//! What turnstile itself spends on one turn (stream `none`, no tools), in instructions and
//! allocations, for profiling and for comparing builds (the wall-clock figures are the bench's
//! `latency` section).
//!
//! ```text
//! cargo build --release --example turn_cost
//! target/release/examples/turn_cost 2000                     # allocations per turn
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/turn_cost 1000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/turn_cost 3000
//! TURN_COST_BUDGETS=1 valgrind ...                           # with every budget on (never reached)
//! ```
//!
//! This process runs only the server (in-process, on 2 worker threads, the embedded store):
//! the fake OpenAI-compatible upstream and the client run in a child process (this binary
//! again, `turn_cost --peer`), so that neither is counted, by the allocator here or by
//! callgrind (which does not follow children). The client makes 100 warm-up turns, then N,
//! each `POST /sessions/{id}/turns` with `stream: none` on a keep-alive connection, a new
//! session every 20 turns. Instructions per turn: the difference of callgrind's totals
//! ("Collected") at two N divided by the difference of the N.

// A tool for measuring, not the server: a panic is its error message.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::alloc::{GlobalAlloc, Layout};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, bail, Context as _, Result};

/// Counts every allocation (and reallocation) of this process.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to mimalloc unchanged; counting touches no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        mimalloc::MiMalloc.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        mimalloc::MiMalloc.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        mimalloc::MiMalloc.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WARMUP: usize = 100;
const TURNS_PER_SESSION: usize = 20;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [peer] if peer == "--peer" => peer_main(),
        [n] => server_main(n.parse().context("N")?),
        _ => bail!("usage: turn_cost N"),
    }
}

/// The measured process: the server, driven by the peer over stdin/stdout (`URL` from the
/// peer, then `ADDR N` to it; `warm` from it, `go` to it; `done` from it).
fn server_main(n: usize) -> Result<()> {
    let mut peer = Command::new(std::env::current_exe()?)
        .arg("--peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning the peer")?;
    let mut to_peer = peer.stdin.take().expect("piped");
    let mut from_peer = BufReader::new(peer.stdout.take().expect("piped"));
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<String> {
        line.clear();
        from_peer.read_line(line)?;
        Ok(line.trim().to_string())
    };
    let upstream = read_line(&mut line)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new()
        .prefix("turnstile-turn-cost-")
        .tempdir()?;
    let path = dir.path().join("tools.toml");
    // TURN_COST_BUDGETS set: every budget and the rate limit on (never reached), so that each
    // turn pays for its checks.
    let budgets = match std::env::var_os("TURN_COST_BUDGETS") {
        Some(_) => "requests_per_minute = 1000000000\ntokens_per_day = 1000000000000\ntool_calls_per_day = 1000000\nusd_per_month = 1000000.0\n",
        None => "",
    };
    let text = format!(
        "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\n\n[limits]\nsessions_per_key = 100000\n{budgets}\n[upstream]\nprovider = \"openai\"\nbase_url = \"{upstream}\"\nmodel = \"fake-model\"\nretries = 0\n"
    );
    std::fs::write(&path, &text)?;
    let cfg = turnstile::config::load_str(&path, &text, &turnstile::config::Env::process())
        .map_err(|e| anyhow!("config: {e}"))?;
    let running = runtime
        .block_on(turnstile::startup::start(
            cfg,
            "127.0.0.1:0".parse()?,
            turnstile::startup::StartOptions::default(),
        ))
        .map_err(|e| anyhow!("start: {e}"))?;
    writeln!(to_peer, "{} {n}", running.addr)?;
    if read_line(&mut line)? != "warm" {
        bail!("the peer failed during warm-up");
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    writeln!(to_peer, "go")?;
    let done = read_line(&mut line)?;
    let after = ALLOCS.load(Ordering::Relaxed);
    let Some(micros) = done.strip_prefix("done ") else {
        bail!("the peer failed: {done:?}");
    };
    println!(
        "{n} turns: {:.1} allocations/turn, {micros} µs/turn (client-measured)",
        (after - before) as f64 / n as f64
    );
    runtime.block_on(running.stop());
    peer.wait()?;
    Ok(())
}

/// The peer: the fake upstream and the client.
fn peer_main() -> Result<()> {
    use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let fake = runtime.block_on(FakeOpenAi::start());
    fake.set_fallback(Reply::text("Tokyo: 18C, clear."));
    let thread = std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    println!("{}", fake.base_url());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let order = lines.next().ok_or_else(|| anyhow!("no order"))??;
    let (addr, n) = order
        .split_once(' ')
        .ok_or_else(|| anyhow!("bad order {order:?}"))?;
    let n: usize = n.parse()?;
    let mut client = Client::connect(addr.parse()?)?;
    for i in 0..WARMUP {
        client.turn(i)?;
    }
    println!("warm");
    lines.next().ok_or_else(|| anyhow!("no go"))??;
    let t = std::time::Instant::now();
    for i in 0..n {
        client.turn(i)?;
    }
    println!("done {:.1}", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    drop(fake);
    drop(thread);
    Ok(())
}

/// A blocking HTTP/1.1 client on one keep-alive connection.
struct Client {
    conn: std::net::TcpStream,
    session: String,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: std::net::SocketAddr) -> Result<Client> {
        let conn = std::net::TcpStream::connect(addr)?;
        conn.set_nodelay(true)?;
        Ok(Client {
            conn,
            session: String::new(),
            buf: Vec::new(),
        })
    }

    /// Turn `i`: in a new session every [`TURNS_PER_SESSION`].
    fn turn(&mut self, i: usize) -> Result<()> {
        if i % TURNS_PER_SESSION == 0 {
            let created = self.post("/sessions", "{}")?;
            let v: serde_json::Value = serde_json::from_str(&created)?;
            self.session = v["sessionId"]
                .as_str()
                .ok_or_else(|| anyhow!("no sessionId in {created}"))?
                .to_string();
        }
        let path = format!("/sessions/{}/turns", self.session);
        let body =
            r#"{"stream":"none","messages":[{"role":"user","content":"Weather in Tokyo?"}]}"#;
        let answer = self.post(&path, body)?;
        if !answer.contains("Tokyo: 18C") {
            bail!("turn: {answer}");
        }
        Ok(())
    }

    /// POST `body`; the response body (a `Content-Length` one).
    fn post(&mut self, path: &str, body: &str) -> Result<String> {
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.conn.write_all(req.as_bytes())?;
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("no content-length: {head}"))?;
        while self.buf.len() < head_end + len {
            self.fill()?;
        }
        let out = String::from_utf8_lossy(&self.buf[head_end..head_end + len]).into_owned();
        self.buf.drain(..head_end + len);
        if !head.starts_with("http/1.1 2") {
            bail!("{head}{out}");
        }
        Ok(out)
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
