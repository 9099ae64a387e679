//! The benchmark's logic. `examples/bench.rs` is a thin `main` over it; `tests/ops/bench_smoke.rs`
//! includes this file and runs its smoke mode.
//!
//! Everything runs against the scripted fake OpenAI upstream ([`FakeOpenAi`]) in this process,
//! with a keep-alive hyper client (`TCP_NODELAY`). Latencies are measured in interleaved rounds
//! (direct and through turnstile alternate, the first round is a discarded warm-up) and reported
//! as the median over rounds of each round's percentile. Turnstile runs in this process
//! (`startup::start`), except for the idle-stream RSS figure, which needs the server's memory alone:
//! there the bench re-executes itself with `--serve CONFIG` ([`serve_main`]).
#![allow(dead_code)]

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use turnstile::message::{Block, Content, Message};
use turnstile::startup::{self, Running, StartOptions};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply, SendLog};
use turnstile::upstream::{ModelRequest, NoDeltas, Provider as _, ToolDef};

#[path = "failover.rs"]
mod failover;
#[path = "pg.rs"]
mod pg;

/// How turnstile is run for the idle-stream RSS figure.
#[derive(Debug, Clone)]
pub enum RssMode {
    /// Re-execute this binary with `--serve CONFIG` and read the child's `VmRSS`.
    Child(PathBuf),
    /// Start turnstile in this process and read this process's `VmRSS` (the client's sockets
    /// are counted too). For the smoke test, whose binary cannot be re-executed as a server.
    InProcess,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub smoke: bool,
    /// The built `mcp_example` binary.
    pub mcp_example: PathBuf,
    pub rss: RssMode,
    /// Progress lines on stderr.
    pub verbose: bool,
    /// Run only these sections (see [`SECTIONS`]); `None` runs them all.
    pub only: Option<Vec<String>>,
}

/// How much of everything: the full run and the smoke run take the same code paths.
#[derive(Debug, Clone)]
struct Counts {
    /// Rounds, the first a discarded warm-up.
    rounds: usize,
    /// Requests per round at concurrency 1, per mode.
    c1: usize,
    /// Requests per worker per round at concurrency 32, per mode.
    c32_per_worker: usize,
    /// Paced delta turns per round, per mode.
    delta_turns: usize,
    /// Rounds and calls per round for the MCP figure.
    mcp_rounds: usize,
    mcp_calls: usize,
    /// Idle streams for the two RSS figures.
    rss_streams: [usize; 2],
    /// Fan-out: subscribers, reply length in characters, runs.
    fanout_subscribers: usize,
    fanout_chars: usize,
    fanout_runs: usize,
    /// Turns per throughput run, and runs per setting.
    tput_turns: usize,
    tput_runs: usize,
}

impl Counts {
    fn new(smoke: bool) -> Counts {
        if smoke {
            Counts {
                rounds: 2,
                c1: 20,
                c32_per_worker: 2,
                delta_turns: 3,
                mcp_rounds: 2,
                mcp_calls: 5,
                rss_streams: [50, 50],
                fanout_subscribers: 5,
                fanout_chars: 4_000,
                fanout_runs: 1,
                tput_turns: 64,
                tput_runs: 1,
            }
        } else {
            Counts {
                rounds: 7,
                c1: 1500,
                c32_per_worker: 64,
                delta_turns: 100,
                mcp_rounds: 7,
                mcp_calls: 300,
                rss_streams: [1_000, 10_000],
                fanout_subscribers: 100,
                fanout_chars: 200_000,
                fanout_runs: 3,
                tput_turns: 6_000,
                tput_runs: 3,
            }
        }
    }
}

/// Turns per session before a worker moves to a fresh one (so that the history, which turnstile
/// sends upstream with every call, stays short and every turn costs about the same).
const TURNS_PER_SESSION: usize = 8;
/// Concurrency of the loaded figures.
const C32: usize = 32;
/// The paced reply: 20 deltas of 4 characters, 2 ms apart.
const PACED_DELTAS: usize = 20;
const PACE: Duration = Duration::from_millis(2);
const MODEL: &str = "bench-model";

// ---------------------------------------------------------------------------------------------
// Report

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub figure: String,
    pub value: String,
    pub target: String,
    /// `None` when the figure has no target.
    pub met: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Every figure, `machine` last.
    pub json: serde_json::Map<String, Value>,
    pub notes: Vec<String>,
}

impl Report {
    /// The table, as Markdown (it goes into the README as is).
    pub fn table(&self) -> String {
        let mut out = String::new();
        if !self.rows.is_empty() {
            out.push_str("| figure | value | target | met? |\n| --- | --- | --- | --- |\n");
        }
        for r in &self.rows {
            let met = match r.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "",
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                r.figure, r.value, r.target, met
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("\n{n}"));
        }
        out.push('\n');
        out
    }

    /// The JSON line with every figure.
    pub fn json_line(&self) -> String {
        Value::Object(self.json.clone()).to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

fn log(opts: &Options, msg: impl AsRef<str>) {
    if opts.verbose {
        eprintln!("[bench] {}", msg.as_ref());
    }
}

/// `<nproc> cores, <model name>`.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

/// Raise the soft open-files limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    }
}

/// `VmRSS` of a process in KiB (`self` for this one).
fn vm_rss_kib(pid: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// Nearest-rank percentile of sorted nanoseconds, in microseconds.
fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// p50 and p99 of one round, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Pcts {
    p50: f64,
    p99: f64,
}

fn pcts(mut ns: Vec<u64>) -> Pcts {
    ns.sort_unstable();
    Pcts {
        p50: pct_us(&ns, 50.0),
        p99: pct_us(&ns, 99.0),
    }
}

/// Median over rounds of the rounds' p50 and p99.
fn med(rounds: &[Pcts]) -> Pcts {
    Pcts {
        p50: median(&rounds.iter().map(|p| p.p50).collect::<Vec<_>>()),
        p99: median(&rounds.iter().map(|p| p.p99).collect::<Vec<_>>()),
    }
}

/// The order of `n` variants in round `r`: rotated every round, so none always goes first.
fn order(r: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| (i + r) % n).collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Splits an SSE byte stream into event blocks (the text between blank lines).
#[derive(Default)]
struct SseSplitter {
    buf: Vec<u8>,
}

impl SseSplitter {
    fn push(&mut self, data: &[u8], mut each: impl FnMut(&[u8])) {
        let scan_from = self.buf.len().saturating_sub(1);
        self.buf.extend_from_slice(data);
        let mut start = 0;
        let mut i = scan_from;
        while i + 1 < self.buf.len() {
            if self.buf[i] == b'\n' && self.buf[i + 1] == b'\n' {
                if i > start {
                    each(&self.buf[start..i]);
                }
                start = i + 2;
                i = start;
            } else {
                i += 1;
            }
        }
        self.buf.drain(..start);
    }
}

/// The `event:` name of an SSE block.
fn event_name(block: &[u8]) -> &[u8] {
    for line in block.split(|b| *b == b'\n') {
        if let Some(name) = line.strip_prefix(b"event: ") {
            return name;
        }
    }
    b""
}

/// The `data:` of an SSE block.
fn event_data(block: &[u8]) -> &[u8] {
    for line in block.split(|b| *b == b'\n') {
        if let Some(d) = line.strip_prefix(b"data: ") {
            return d;
        }
    }
    b""
}

// ---------------------------------------------------------------------------------------------
// HTTP

type Client = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// A keep-alive client with `TCP_NODELAY`.
fn client() -> Client {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(300))
        .build(conn)
}

fn post_req(uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a valid request")
}

async fn post_collect(client: &Client, uri: Uri, body: Bytes) -> Result<(StatusCode, Bytes)> {
    let resp = client.request(post_req(uri, body)).await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

async fn post_json(client: &Client, url: &str, body: &Value) -> Result<Value> {
    let (status, bytes) = post_collect(client, url.parse()?, Bytes::from(body.to_string())).await?;
    if !status.is_success() {
        bail!("POST {url}: {status} {}", String::from_utf8_lossy(&bytes));
    }
    Ok(serde_json::from_slice(&bytes)?)
}

async fn get_json(client: &Client, url: &str) -> Result<Value> {
    let resp = client
        .request(
            Request::get(url)
                .body(Full::new(Bytes::new()))
                .expect("a valid request"),
        )
        .await?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("GET {url}: {status} {}", String::from_utf8_lossy(&bytes));
    }
    Ok(serde_json::from_slice(&bytes)?)
}

// ---------------------------------------------------------------------------------------------
// Servers

/// Sessions with no tools at all: the default agent with an empty tool list.
const NO_TOOLS: &str = r#"{"agent":{"name":"assistant","tools":[]}}"#;
/// A session without an agent object: every permitted tool, trusted ones inline.
const ALL_TOOLS: &str = "{}";

/// A turnstile started in this process against the fake upstream.
struct Server {
    running: Option<Running>,
    base: String,
    _dir: tempfile::TempDir,
}

fn config_text(upstream: Option<&str>, fsync: bool, extra: &str) -> String {
    let upstream = match upstream {
        Some(url) => format!(
            "[upstream]\nprovider = \"openai\"\nbase_url = \"{url}\"\nmodel = \"{MODEL}\"\nretries = 0\n"
        ),
        None => String::new(),
    };
    // The RSS figure holds 10,000 streams open at once (default limits: 4096 connections, 64
    // streams per session), and the throughput figures make many sessions with one key.
    format!(
        "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\nfsync = {fsync}\nmax_connections = 65536\n\n[limits]\nsubscribers_per_session = 100000\nsessions_per_key = 10000000\n\n{upstream}\n{extra}\n"
    )
}

impl Server {
    async fn start(upstream: Option<&str>, fsync: bool, extra: &str) -> Result<Server> {
        // On the machine's disk (not tmpfs where there is one), so fsync costs what it costs.
        let dir = tempfile::Builder::new()
            .prefix("turnstile-bench-")
            .tempdir_in(bench_tmp())?;
        let path = dir.path().join("tools.toml");
        let text = config_text(upstream, fsync, extra);
        std::fs::write(&path, &text)?;
        let cfg = turnstile::config::load_str(&path, &text, &env())
            .map_err(|e| anyhow!("config: {e}"))?;
        let running = startup::start(cfg, "127.0.0.1:0".parse()?, StartOptions::default())
            .await
            .map_err(|e| anyhow!("start: {e}"))?;
        Ok(Server {
            base: format!("http://{}", running.addr),
            running: Some(running),
            _dir: dir,
        })
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), r.stop()).await;
        }
    }

    async fn session(&self, client: &Client, body: &str) -> Result<String> {
        let v = post_json(
            client,
            &format!("{}/sessions", self.base),
            &serde_json::from_str(body)?,
        )
        .await?;
        v["sessionId"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no sessionId in {v}"))
    }

    fn turns_uri(&self, session: &str) -> Uri {
        format!("{}/sessions/{session}/turns", self.base)
            .parse()
            .expect("a valid URI")
    }

    /// Per worker, the turn requests of a batch: `per_worker` turns, a fresh session every
    /// [`TURNS_PER_SESSION`] (all created before the batch starts).
    async fn turn_plans(
        &self,
        client: &Client,
        workers: usize,
        per_worker: usize,
        session_body: &str,
        body: &Bytes,
    ) -> Result<Vec<Vec<(Uri, Bytes)>>> {
        let mut plans = Vec::with_capacity(workers);
        for _ in 0..workers {
            let mut plan = Vec::with_capacity(per_worker);
            let mut uri = None;
            for i in 0..per_worker {
                if i % TURNS_PER_SESSION == 0 {
                    uri = Some(self.turns_uri(&self.session(client, session_body).await?));
                }
                plan.push((uri.clone().expect("set above"), body.clone()));
            }
            plans.push(plan);
        }
        Ok(plans)
    }
}

/// Where the bench's data folders go: `$TMPDIR` unless it is a tmpfs, else the target folder.
fn bench_tmp() -> PathBuf {
    let tmp = std::env::temp_dir();
    let is_tmpfs = std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 2 && f[2] == "tmpfs" && tmp.starts_with(f[1]) && f[1] != "/"
            })
        })
        .unwrap_or(false);
    if is_tmpfs {
        let t = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-tmp");
        let _ = std::fs::create_dir_all(&t);
        t
    } else {
        tmp
    }
}

/// The upstream request a client would send itself, as turnstile sends it.
fn direct_body() -> Bytes {
    Bytes::from(
        json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
    )
}

fn turn_body(stream: &str) -> Bytes {
    Bytes::from(
        json!({"stream": stream, "messages": [{"role": "user", "content": "hello"}]}).to_string(),
    )
}

const PLAIN_TEXT: &str = "The quick brown fox jumps over the lazy dog, twice.";

fn plain_reply() -> Reply {
    Reply::text(PLAIN_TEXT).chunk_chars(16)
}

fn paced_reply() -> Reply {
    Reply::text(&"abcd".repeat(PACED_DELTAS))
        .chunk_chars(4)
        .pace(PACE)
}

/// Closed-loop workers, each sending its plan's requests one after the other; the latency of
/// every request (to its whole body) in nanoseconds. A response must be 200 and hold `expect`.
async fn batch(
    client: &Client,
    plans: Vec<Vec<(Uri, Bytes)>>,
    expect: &'static [u8],
) -> Result<Vec<u64>> {
    let mut set = JoinSet::new();
    for plan in plans {
        let client = client.clone();
        set.spawn(async move {
            let mut out = Vec::with_capacity(plan.len());
            for (uri, body) in plan {
                let t = Instant::now();
                let (status, bytes) = post_collect(&client, uri.clone(), body).await?;
                let ns = t.elapsed().as_nanos() as u64;
                if status != StatusCode::OK || !contains(&bytes, expect) {
                    bail!(
                        "POST {uri}: {status} {}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(400)])
                    );
                }
                out.push(ns);
            }
            Ok(out)
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r??);
    }
    Ok(all)
}

fn direct_plans(fake: &FakeOpenAi, workers: usize, per_worker: usize) -> Vec<Vec<(Uri, Bytes)>> {
    let uri: Uri = format!("{}/chat/completions", fake.base_url())
        .parse()
        .expect("a valid URI");
    let body = direct_body();
    (0..workers)
        .map(|_| vec![(uri.clone(), body.clone()); per_worker])
        .collect()
}

const DIRECT_DONE: &[u8] = b"data: [DONE]";
const END_TURN: &[u8] = b"\"stopReason\":\"end_turn\"";

// ---------------------------------------------------------------------------------------------
// 1. Added latency, no tools, stream none

struct Latency {
    c1_direct: Pcts,
    c1_through: Pcts,
    c32_direct: Pcts,
    c32_through: Pcts,
    /// CPU time of this whole process (client, fake upstream and turnstile) per request at
    /// c=1, direct and through, in µs (medians over rounds): what is not CPU is waiting.
    c1_cpu: (f64, f64),
    /// One commit of one event on an idle store, and the slowest.
    barrier: (Pcts, f64),
}

/// One commit as a turn at c=1 meets it: one event appended to an idle store, then `flush`
/// (which commits on the calling thread). A plain turn whose upstream answers within 1 ms
/// commits once, before the client sees its end (a slower upstream: its first events 1 ms into
/// the call, while the upstream works, then the rest).
async fn store_barrier(count: usize) -> Result<(Pcts, f64)> {
    use turnstile::log::{Event, EventBody, Store};
    let dir = tempfile::Builder::new()
        .prefix("turnstile-bench-store-")
        .tempdir_in(bench_tmp())?;
    let store = Store::open(dir.path(), false)?;
    let session: Arc<str> = "ses_bench".into();
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let ev = Event::new(
            i as u64 + 1,
            format!("evt_bench{i:08}"),
            "turn_bench".into(),
            "2025-01-01T00:00:00.000Z".into(),
            EventBody::AgentMessage {
                content: PLAIN_TEXT.into(),
                plan: false,
                compaction: false,
                replaces: None,
            },
        );
        // Idle between commits, as at c=1.
        tokio::time::sleep(Duration::from_micros(200)).await;
        let t = Instant::now();
        store.append(&session, &ev);
        store.flush().await?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    let max = samples.iter().max().copied().unwrap_or(0) as f64 / 1000.0;
    Ok((pcts(samples), max))
}

/// CPU time (user + system) this process has used, in microseconds.
fn cpu_us() -> f64 {
    // SAFETY: getrusage fills a local struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return f64::NAN;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

async fn latency(
    opts: &Options,
    n: &Counts,
    client: &Client,
    fake: &FakeOpenAi,
    srv: &Server,
) -> Result<Latency> {
    let body = turn_body("none");
    let mut rounds: [Vec<Pcts>; 4] = Default::default();
    let mut cpu: [Vec<f64>; 2] = Default::default();
    for r in 0..n.rounds {
        // c=1 direct / through, then c=32 direct / through; each pair's order alternates.
        for (pair, (workers, per)) in [(1, n.c1), (C32, n.c32_per_worker)].iter().enumerate() {
            let through_plans = srv
                .turn_plans(client, *workers, *per, NO_TOOLS, &body)
                .await?;
            let mut through_plans = Some(through_plans);
            for v in order(r, 2) {
                let cpu0 = cpu_us();
                let samples = if v == 0 {
                    batch(client, direct_plans(fake, *workers, *per), DIRECT_DONE).await?
                } else {
                    batch(client, through_plans.take().expect("once"), END_TURN).await?
                };
                if r > 0 {
                    if pair == 0 {
                        cpu[v].push((cpu_us() - cpu0) / samples.len() as f64);
                    }
                    rounds[pair * 2 + v].push(pcts(samples));
                }
            }
        }
        log(
            opts,
            format!(
                "latency round {}/{} done{}",
                r + 1,
                n.rounds,
                if r == 0 { " (warm-up)" } else { "" }
            ),
        );
    }
    Ok(Latency {
        c1_direct: med(&rounds[0]),
        c1_through: med(&rounds[1]),
        c32_direct: med(&rounds[2]),
        c32_through: med(&rounds[3]),
        c1_cpu: (median(&cpu[0]), median(&cpu[1])),
        barrier: store_barrier(n.c1).await?,
    })
}

// ---------------------------------------------------------------------------------------------
// 2. Delta streaming: time to first delta and inter-delta gaps
//
// The paced upstream's own timing is taken out, per delta, on both paths: the fake records when
// it hands each event to its connection (a `SendLog`), so its timer jitter (a 2 ms sleep fires
// with ~1 ms granularity) does not swamp differences of a few µs. For each turn:
// - time to first delta = (first delta received − request sent) − (upstream's first delta sent −
//   upstream's first byte sent): what the path adds to the upstream's own wait;
// - gap added = (gap between deltas k−1 and k as received) − (the same gap as sent).
// "Added" figures are then through − direct, percentile by percentile.

/// Nearest-rank percentile of signed nanoseconds, in microseconds.
fn pct_us_signed(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn pcts_signed(mut ns: Vec<i64>) -> Pcts {
    ns.sort_unstable();
    Pcts {
        p50: pct_us_signed(&ns, 50.0),
        p99: pct_us_signed(&ns, 99.0),
    }
}

fn signed_ns(a: Instant, b: Instant) -> i64 {
    if a >= b {
        (a - b).as_nanos() as i64
    } else {
        -((b - a).as_nanos() as i64)
    }
}

#[derive(Default)]
struct DeltaSamples {
    /// Raw time to first delta (with the upstream's own wait).
    ttfd_raw: Vec<i64>,
    ttfd: Vec<i64>,
    gaps: Vec<i64>,
    /// Deltas seen per turn (through must match direct).
    counts: Vec<usize>,
}

impl DeltaSamples {
    /// `recv`: when each delta arrived; `sent`: when the upstream sent each event (its role
    /// chunk first, then one content chunk per delta).
    fn add(&mut self, t0: Instant, recv: &[Instant], sent: &[Instant]) -> Result<()> {
        self.counts.push(recv.len());
        if recv.is_empty() || sent.len() < recv.len() + 1 {
            bail!(
                "{} deltas received, {} upstream events logged",
                recv.len(),
                sent.len()
            );
        }
        self.ttfd_raw.push(signed_ns(recv[0], t0));
        self.ttfd
            .push(signed_ns(recv[0], t0) - signed_ns(sent[1], sent[0]));
        for k in 1..recv.len() {
            self.gaps
                .push(signed_ns(recv[k], recv[k - 1]) - signed_ns(sent[k + 1], sent[k]));
        }
        Ok(())
    }
}

/// One streamed request; the arrival time of every block `is_delta` accepts.
async fn stream_times(
    client: &Client,
    uri: Uri,
    body: Bytes,
    is_delta: fn(&[u8]) -> bool,
) -> Result<(Instant, Vec<Instant>)> {
    let t0 = Instant::now();
    let resp = client.request(post_req(uri.clone(), body)).await?;
    if resp.status() != StatusCode::OK {
        bail!("POST {uri}: {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut split = SseSplitter::default();
    let mut times = Vec::with_capacity(PACED_DELTAS + 4);
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let now = Instant::now();
        if let Some(d) = frame.data_ref() {
            split.push(d, |block| {
                if is_delta(block) {
                    times.push(now);
                }
            });
        }
    }
    Ok((t0, times))
}

/// A direct chunk with non-empty `content`.
fn is_content_chunk(block: &[u8]) -> bool {
    let data = event_data(block);
    if data == b"[DONE]" {
        return false;
    }
    serde_json::from_slice::<Value>(data)
        .ok()
        .and_then(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(|s| !s.is_empty())
        })
        .unwrap_or(false)
}

fn is_text_delta(block: &[u8]) -> bool {
    event_name(block) == b"text_delta"
}

struct Deltas {
    ttfd_raw_direct: Pcts,
    ttfd_raw_through: Pcts,
    ttfd_direct: Pcts,
    ttfd_through: Pcts,
    /// The direct request through a byte-splicing TCP proxy ([`splice_proxy`]).
    ttfd_splice: Pcts,
    gap_direct: Pcts,
    gap_through: Pcts,
    gap_splice: Pcts,
    /// Deltas per turn, direct and through (medians).
    per_turn: (f64, f64),
}

/// A TCP proxy in this process that copies bytes both ways and does nothing else: the floor of
/// what any proxy adds here by being one more process in the way, reading and writing every
/// byte once. The delta section sends the direct request through it too, so that turnstile's
/// figures can be read against what the hop itself costs.
async fn splice_proxy(target: SocketAddr) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    Ok(addr)
}

async fn deltas(
    opts: &Options,
    n: &Counts,
    client: &Client,
    fake: &FakeOpenAi,
    srv: &Server,
) -> Result<Deltas> {
    let sends = SendLog::new();
    fake.set_fallback(paced_reply().log_sends(sends.clone()));
    let direct_uri: Uri = format!("{}/chat/completions", fake.base_url()).parse()?;
    let splice = splice_proxy(fake.addr()).await?;
    let splice_uri: Uri = format!("http://{splice}/v1/chat/completions").parse()?;
    let body = turn_body("delta");
    // Variants: direct, through turnstile, direct through the splicing proxy.
    let mut ttfd_raw: [Vec<Pcts>; 3] = Default::default();
    let mut ttfd: [Vec<Pcts>; 3] = Default::default();
    let mut gaps: [Vec<Pcts>; 3] = Default::default();
    let mut counts: [Vec<f64>; 3] = Default::default();
    for r in 0..n.rounds {
        let plan = srv
            .turn_plans(client, 1, n.delta_turns, NO_TOOLS, &body)
            .await?
            .remove(0);
        for v in order(r, 3) {
            let mut s = DeltaSamples::default();
            for (uri, body) in &plan {
                sends.take();
                let (t0, recv) = match v {
                    0 => {
                        stream_times(client, direct_uri.clone(), direct_body(), is_content_chunk)
                            .await?
                    }
                    1 => stream_times(client, uri.clone(), body.clone(), is_text_delta).await?,
                    _ => {
                        stream_times(client, splice_uri.clone(), direct_body(), is_content_chunk)
                            .await?
                    }
                };
                s.add(t0, &recv, &sends.take())
                    .with_context(|| ["direct", "through", "spliced"][v])?;
            }
            if r > 0 {
                counts[v].extend(s.counts.iter().map(|c| *c as f64));
                ttfd_raw[v].push(pcts_signed(s.ttfd_raw));
                ttfd[v].push(pcts_signed(s.ttfd));
                gaps[v].push(pcts_signed(s.gaps));
            }
        }
        log(opts, format!("delta round {}/{} done", r + 1, n.rounds));
    }
    fake.set_fallback(plain_reply());
    Ok(Deltas {
        ttfd_raw_direct: med(&ttfd_raw[0]),
        ttfd_raw_through: med(&ttfd_raw[1]),
        ttfd_direct: med(&ttfd[0]),
        ttfd_through: med(&ttfd[1]),
        ttfd_splice: med(&ttfd[2]),
        gap_direct: med(&gaps[0]),
        gap_through: med(&gaps[1]),
        gap_splice: med(&gaps[2]),
        per_turn: (median(&counts[0]), median(&counts[1])),
    })
}

// ---------------------------------------------------------------------------------------------
// 3. A trusted MCP tool inside a turn vs a direct rmcp call

struct Mcp {
    /// Whole turns, for context: one without tools, one that calls the tool.
    plain: f64,
    tool: f64,
    /// What the upstream sees between the last event of the model's tool-call answer and the
    /// first event of its answer to the next request: through a turn that runs the tool, and
    /// through turnstile's own upstream client asking again at once (the same two requests, no
    /// tool, no turn). The difference is the tool's time inside the turn.
    gap_turn: f64,
    gap_again: f64,
    /// A direct rmcp call made where a turn makes it: right after the model's tool-call answer
    /// has come in (untimed). That is the baseline: a call in a loop, back to back with the one
    /// before, finds the child and the CPUs awake and runs ~35–45 µs faster than any call a turn
    /// (or any client between two model calls) can make.
    rmcp: f64,
    /// The same direct call back to back, for reference.
    rmcp_hot: f64,
    /// The same call through turnstile's tool host alone (no turn around it), after the model's
    /// answer as well.
    host: f64,
    /// The tool called through turnstile's `/mcp` by an MCP client, and the same tool called
    /// directly on a child, the two interleaved back to back.
    endpoint: Pcts,
    endpoint_direct: Pcts,
}

impl Mcp {
    fn in_turn(&self) -> f64 {
        self.gap_turn - self.gap_again
    }
    fn overhead(&self) -> f64 {
        self.in_turn() - self.rmcp
    }
}

async fn mcp(
    opts: &Options,
    n: &Counts,
    client: &Client,
    fake: &FakeOpenAi,
    srv: &Server,
    config_extra: &str,
) -> Result<Mcp> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;
    use rmcp::ServiceExt;
    use turnstile::tools::{CallContext, ToolHost};

    // The server's tools are listed once its MCP server has started.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tools = get_json(client, &format!("{}/tools", srv.base)).await?;
        if tools.to_string().contains("mcp__ex__add") {
            break;
        }
        if Instant::now() > deadline {
            bail!("turnstile does not list mcp__ex__add: {tools}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The direct client: its own process of the same binary, over stdio.
    let mut cmd = tokio::process::Command::new(&opts.mcp_example);
    cmd.kill_on_drop(true);
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("spawning mcp_example")?;
    let direct = ().serve(transport).await.context("MCP initialize")?;
    // Turnstile's own tool host, alone: the federation layer without a turn.
    let host_dir = tempfile::Builder::new()
        .prefix("turnstile-bench-host-")
        .tempdir_in(bench_tmp())?;
    let host_path = host_dir.path().join("tools.toml");
    let cfg =
        turnstile::config::load_str(&host_path, &config_text(None, false, config_extra), &env())
            .map_err(|e| anyhow!("config: {e}"))?;
    let host = startup::tool_host(&Arc::new(cfg), None)
        .await
        .map_err(|e| anyhow!("tool host: {e}"))?;
    while !host.tools().iter().any(|t| t.spec.name == "mcp__ex__add") {
        if Instant::now() > deadline {
            bail!("the tool host does not list mcp__ex__add");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ctx = CallContext {
        session_id: "ses_bench".into(),
        workspace: host_dir.path().join("sandboxes/ses_bench"),
        owner: None,
        elicitor: None,
        sampler: None,
    };
    let args = json!({"a": 2, "b": 3});
    let Value::Object(args) = args else {
        unreachable!()
    };

    let plain_body = turn_body("none");
    let tool_body =
        Bytes::from(json!({"messages": [{"role": "user", "content": "add 2 and 3"}]}).to_string());
    let mut call_no = 0u64;
    let (answered, asked) = (SendLog::new(), SendLog::new());
    // The two model requests of the tool turn, as turnstile's upstream client sends them.
    let upstream =
        turnstile::upstream::openai::OpenAi::new(fake.base_url(), None, Duration::from_secs(30));
    let offered: Vec<ToolDef> = host
        .tools()
        .iter()
        .map(|t| ToolDef {
            name: t.spec.name.clone(),
            description: t.spec.description.clone(),
            parameters: t.spec.parameters.clone(),
        })
        .collect();
    let ask = Message::User {
        content: Content::Text("add 2 and 3".into()),
    };
    let first = ModelRequest {
        model: MODEL.into(),
        system: None,
        messages: vec![ask.clone()],
        tools: offered,
        max_tokens: None,
        thinking: false,
        tuning: Default::default(),
    };
    let second = |call_id: &str| ModelRequest {
        messages: vec![
            ask.clone(),
            Message::Assistant {
                content: Content::Blocks(vec![Block::ToolUse {
                    tool_call_id: call_id.into(),
                    name: "mcp__ex__add".into(),
                    input: json!({"a": 2, "b": 3}),
                }]),
            },
            Message::Tool {
                tool_call_id: call_id.into(),
                content: Content::Text("5".into()),
            },
        ],
        ..first.clone()
    };
    // The first model request, answered with the tool call.
    let ask_first = || async {
        let out = upstream
            .complete(&first, &mut NoDeltas)
            .await
            .map_err(|e| anyhow!("first model request: {}", e.message))?;
        if out.tool_calls.is_empty() {
            bail!("the fake answered the first request without a tool call");
        }
        Ok(())
    };
    // What a turn has just done when it calls the tool: received the model's tool-call answer.
    let answer_first = || async {
        let call = ("call_0", "mcp__ex__add", json!({"a": 2, "b": 3}));
        fake.push(Reply::tool_calls(&[call]));
        ask_first().await
    };
    let script = |call_id: &str| {
        fake.push(
            Reply::tool_calls(&[(call_id, "mcp__ex__add", json!({"a": 2, "b": 3}))])
                .log_sends(answered.clone()),
        );
        fake.push(
            Reply::text("The sum is 5.")
                .chunk_chars(16)
                .log_sends(asked.clone()),
        );
    };
    let gap = || match (answered.take().last(), asked.take().first()) {
        (Some(&end), Some(&next)) => Ok(signed_ns(next, end).max(0) as u64),
        _ => Err(anyhow!(
            "the fake upstream logged no tool-call answer and next request"
        )),
    };
    // Variants: plain turn, tool turn, direct rmcp call, tool host call, the two model requests
    // asked back to back, direct rmcp calls back to back; then the gaps of variants 1 and 4.
    let mut rounds: [Vec<f64>; 8] = Default::default();
    for r in 0..n.mcp_rounds {
        let plain_plan = srv
            .turn_plans(client, 1, n.mcp_calls, ALL_TOOLS, &plain_body)
            .await?
            .remove(0);
        let tool_plan = srv
            .turn_plans(client, 1, n.mcp_calls, ALL_TOOLS, &tool_body)
            .await?
            .remove(0);
        for v in order(r, 6) {
            let mut samples = Vec::with_capacity(n.mcp_calls);
            let mut gaps = Vec::with_capacity(n.mcp_calls);
            match v {
                0 => {
                    for (uri, body) in &plain_plan {
                        let t = Instant::now();
                        let (status, bytes) =
                            post_collect(client, uri.clone(), body.clone()).await?;
                        samples.push(t.elapsed().as_nanos() as u64);
                        if status != StatusCode::OK || !contains(&bytes, END_TURN) {
                            bail!("plain turn: {status} {}", String::from_utf8_lossy(&bytes));
                        }
                    }
                }
                1 => {
                    for (uri, body) in &tool_plan {
                        call_no += 1;
                        let id = format!("call_{call_no}");
                        script(&id);
                        let t = Instant::now();
                        let (status, bytes) =
                            post_collect(client, uri.clone(), body.clone()).await?;
                        samples.push(t.elapsed().as_nanos() as u64);
                        gaps.push(gap()?);
                        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let ran = v["messages"].as_array().is_some_and(|m| {
                            m.iter().any(|m| {
                                m["role"] == "tool" && m["content"].to_string().contains('5')
                            })
                        });
                        if status != StatusCode::OK || v["stopReason"] != "end_turn" || !ran {
                            bail!("the tool turn did not run mcp__ex__add inline: {status} {v}");
                        }
                    }
                }
                4 => {
                    for _ in 0..n.mcp_calls {
                        call_no += 1;
                        let id = format!("call_{call_no}");
                        script(&id);
                        let t = Instant::now();
                        ask_first().await?;
                        upstream
                            .complete(&second(&id), &mut NoDeltas)
                            .await
                            .map_err(|e| anyhow!("second model request: {}", e.message))?;
                        samples.push(t.elapsed().as_nanos() as u64);
                        gaps.push(gap()?);
                    }
                }
                3 => {
                    for _ in 0..n.mcp_calls {
                        answer_first().await?;
                        let t = Instant::now();
                        let out = host
                            .call(&ctx, "mcp__ex__add", json!({"a": 2, "b": 3}))
                            .await;
                        samples.push(t.elapsed().as_nanos() as u64);
                        if out.is_error {
                            bail!("the tool host's add failed: {out:?}");
                        }
                    }
                }
                _ => {
                    for _ in 0..n.mcp_calls {
                        let params = CallToolRequestParams::new("add".to_owned())
                            .with_arguments(args.clone());
                        if v == 2 {
                            answer_first().await?;
                        }
                        let t = Instant::now();
                        let res = direct
                            .call_tool(params)
                            .await
                            .context("direct tools/call")?;
                        samples.push(t.elapsed().as_nanos() as u64);
                        if res.is_error == Some(true) {
                            bail!("direct add failed: {res:?}");
                        }
                    }
                }
            }
            if r > 0 {
                rounds[v].push(pcts(samples).p50);
                match v {
                    1 => rounds[6].push(pcts(gaps).p50),
                    4 => rounds[7].push(pcts(gaps).p50),
                    _ => {}
                }
            }
        }
        log(opts, format!("mcp round {}/{} done", r + 1, n.mcp_rounds));
    }
    let (endpoint, endpoint_direct) = through_endpoint(opts, n, srv, &direct, &args).await?;
    let _ = direct.cancel().await;
    drop(host);
    Ok(Mcp {
        endpoint,
        endpoint_direct,
        plain: median(&rounds[0]),
        tool: median(&rounds[1]),
        rmcp: median(&rounds[2]),
        host: median(&rounds[3]),
        rmcp_hot: median(&rounds[5]),
        gap_turn: median(&rounds[6]),
        gap_again: median(&rounds[7]),
    })
}

/// `mcp__ex__add` through `/mcp` (an rmcp streamable-HTTP client) and `add` on the direct child,
/// interleaved call by call: the median over rounds (the first a warm-up) of each one's p50, p99.
async fn through_endpoint(
    opts: &Options,
    n: &Counts,
    srv: &Server,
    direct: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    args: &serde_json::Map<String, Value>,
) -> Result<(Pcts, Pcts)> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    let url = format!("{}/mcp", srv.base);
    let endpoint = ()
        .serve(turnstile::tools::mcp::http_client::transport(
            &url,
            Default::default(),
            None,
        ))
        .await
        .context("MCP initialize over /mcp")?;
    let (mut via, mut straight) = (Vec::new(), Vec::new());
    for r in 0..n.mcp_rounds {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..n.mcp_calls {
            let t = Instant::now();
            let res = endpoint
                .call_tool(CallToolRequestParams::new("mcp__ex__add").with_arguments(args.clone()))
                .await
                .context("tools/call over /mcp")?;
            a.push(t.elapsed().as_nanos() as u64);
            if res.is_error == Some(true) {
                bail!("add over /mcp failed: {res:?}");
            }
            let t = Instant::now();
            direct
                .call_tool(CallToolRequestParams::new("add").with_arguments(args.clone()))
                .await
                .context("direct tools/call")?;
            b.push(t.elapsed().as_nanos() as u64);
        }
        if r > 0 {
            via.push(pcts(a));
            straight.push(pcts(b));
        }
        log(opts, format!("/mcp round {}/{} done", r + 1, n.mcp_rounds));
    }
    let _ = endpoint.cancel().await;
    Ok((med(&via), med(&straight)))
}

// ---------------------------------------------------------------------------------------------
// 4. RSS per idle event stream

/// `--serve CONFIG`: start turnstile from this config on `127.0.0.1:0`, print
/// `listening on ADDR` on stdout, serve until stdin closes.
pub fn serve_main(config: &Path) -> Result<()> {
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cfg = turnstile::config::load(config, &env()).map_err(|e| anyhow!("config: {e}"))?;
        let running = startup::start(cfg, "127.0.0.1:0".parse()?, StartOptions::default())
            .await
            .map_err(|e| anyhow!("start: {e}"))?;
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {}", running.addr)?;
            out.flush()?;
        }
        // Until the parent closes our stdin (or goes away).
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        })
        .await;
        let _ = tokio::time::timeout(Duration::from_secs(5), running.stop()).await;
        Ok(())
    })
}

/// Open one idle `events/stream` with a raw connection; returns once the headers are in.
async fn open_stream(addr: SocketAddr, path: &str) -> Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nConnection: keep-alive\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            bail!("the server closed the stream before its headers");
        }
        head.extend_from_slice(&buf[..n]);
        if contains(&head, b"\r\n\r\n") {
            break;
        }
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!(
            "events/stream: {}",
            String::from_utf8_lossy(&head[..head.len().min(200)])
        );
    }
    Ok(s)
}

/// Open `count` streams, at most 64 connecting at a time.
async fn open_streams(
    addr: SocketAddr,
    path: &str,
    count: usize,
) -> Result<Vec<tokio::net::TcpStream>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..64.min(count) {
        let next = next.clone();
        let path = path.to_string();
        set.spawn(async move {
            let mut mine = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < count {
                mine.push(open_stream(addr, &path).await?);
            }
            Ok::<_, anyhow::Error>(mine)
        });
    }
    let mut all = Vec::with_capacity(count);
    while let Some(r) = set.join_next().await {
        all.extend(r??);
    }
    Ok(all)
}

struct Rss {
    streams: usize,
    before_kib: u64,
    after_kib: u64,
    in_process: bool,
}

impl Rss {
    fn per_stream(&self) -> f64 {
        (self.after_kib as f64 - self.before_kib as f64) / self.streams as f64
    }
}

async fn rss(opts: &Options, client: &Client, streams: usize) -> Result<Rss> {
    let limit = raise_nofile() as usize;
    let in_process = matches!(opts.rss, RssMode::InProcess);
    // This process holds the client ends (and, in process, the server ends too).
    let need = if in_process { 2 * streams } else { streams } + 200;
    if limit < need {
        bail!("RLIMIT_NOFILE is {limit}; {streams} streams need about {need}");
    }
    // The server: no upstream (echo), its own data folder.
    let dir = tempfile::Builder::new()
        .prefix("turnstile-bench-rss-")
        .tempdir_in(bench_tmp())?;
    let config = dir.path().join("tools.toml");
    std::fs::write(&config, config_text(None, false, ""))?;
    let mut child = None;
    let mut in_proc = None;
    let (addr, pid): (SocketAddr, String) = match &opts.rss {
        RssMode::Child(exe) => {
            let (c, addr) = serve_child(exe, &config).await?;
            let pid = c.id().to_string();
            child = Some(c);
            (addr, pid)
        }
        RssMode::InProcess => {
            let cfg =
                turnstile::config::load(&config, &env()).map_err(|e| anyhow!("config: {e}"))?;
            let running = startup::start(cfg, "127.0.0.1:0".parse()?, StartOptions::default())
                .await
                .map_err(|e| anyhow!("start: {e}"))?;
            let addr = running.addr;
            in_proc = Some(running);
            (addr, "self".to_string())
        }
    };
    let result = async {
        let base = format!("http://{addr}");
        let session = post_json(client, &format!("{base}/sessions"), &json!({})).await?;
        let sid = session["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId"))?
            .to_string();
        let path = format!("/sessions/{sid}/events/stream");
        // Warm up: a few streams opened and closed, so that first-use allocations are not
        // counted per stream.
        drop(open_streams(addr, &path, 16).await?);
        get_json(client, &format!("{base}/healthz")).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before_kib = vm_rss_kib(&pid)?;
        let open = open_streams(addr, &path, streams).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after_kib = vm_rss_kib(&pid)?;
        drop(open);
        Ok::<_, anyhow::Error>(Rss {
            streams,
            before_kib,
            after_kib,
            in_process,
        })
    }
    .await;
    if let Some(mut c) = child {
        drop(c.stdin.take());
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Some(r) = in_proc {
        let _ = tokio::time::timeout(Duration::from_secs(15), r.stop()).await;
    }
    let r = result?;
    log(
        opts,
        format!(
            "rss: {} streams, VmRSS {} -> {} KiB{}",
            r.streams,
            r.before_kib,
            r.after_kib,
            if r.in_process {
                " (in process)"
            } else {
                " (server child)"
            }
        ),
    );
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// 5. Delta fan-out through events/stream

struct Fanout {
    deltas: usize,
    secs: f64,
    min_per_sub: usize,
    max_per_sub: usize,
}

/// One subscriber: counts `agent.message.delta` events until the turn's terminal event.
async fn subscriber(
    client: Client,
    url: String,
    ready: Arc<tokio::sync::Barrier>,
) -> Result<(usize, Instant)> {
    let resp = client
        .request(
            Request::get(url.as_str())
                .header("accept", "text/event-stream")
                .body(Full::new(Bytes::new()))
                .expect("a valid request"),
        )
        .await?;
    if resp.status() != StatusCode::OK {
        bail!("GET {url}: {}", resp.status());
    }
    ready.wait().await;
    let mut body = resp.into_body();
    let mut split = SseSplitter::default();
    let mut deltas = 0usize;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Some(d) = frame.data_ref() {
            split.push(d, |block| match event_name(block) {
                b"agent.message.delta" => deltas += 1,
                b"turn.completed" | b"turn.failed" | b"turn.cancelled" => done = true,
                _ => {}
            });
        }
        if done {
            return Ok((deltas, Instant::now()));
        }
    }
    bail!("the stream ended before the turn did")
}

async fn fanout_once(n: &Counts, client: &Client, srv: &Server) -> Result<Fanout> {
    let sid = srv.session(client, NO_TOOLS).await?;
    let url = format!("{}/sessions/{sid}/events/stream", srv.base);
    let subs = n.fanout_subscribers;
    let ready = Arc::new(tokio::sync::Barrier::new(subs + 1));
    let mut set = JoinSet::new();
    for _ in 0..subs {
        set.spawn(subscriber(client.clone(), url.clone(), ready.clone()));
    }
    ready.wait().await;
    let t0 = Instant::now();
    let v = post_json(
        client,
        &format!("{}/sessions/{sid}/messages", srv.base),
        &json!({"content": "go"}),
    )
    .await?;
    if v["turn_id"].as_str().is_none() {
        bail!("POST messages: {v}");
    }
    let mut total = 0;
    let mut last = t0;
    let (mut min, mut max) = (usize::MAX, 0);
    while let Some(r) = set.join_next().await {
        let (d, at) = r??;
        total += d;
        last = last.max(at);
        min = min.min(d);
        max = max.max(d);
    }
    Ok(Fanout {
        deltas: total,
        secs: (last - t0).as_secs_f64(),
        min_per_sub: min,
        max_per_sub: max,
    })
}

// ---------------------------------------------------------------------------------------------
// 6. Turns per second with the durable log

async fn throughput(client: &Client, srv: &Server, turns: usize) -> Result<f64> {
    let per = turns.div_ceil(C32);
    let plans = srv
        .turn_plans(client, C32, per, NO_TOOLS, &turn_body("none"))
        .await?;
    let t0 = Instant::now();
    let done = batch(client, plans, END_TURN).await?;
    Ok(done.len() as f64 / t0.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// The run

/// Checks that a `NO_TOOLS` session's turn offers the upstream no tools.
async fn check_no_tools(client: &Client, fake: &FakeOpenAi, srv: &Server) -> Result<()> {
    fake.record_requests(true);
    let sid = srv.session(client, NO_TOOLS).await?;
    let (status, bytes) = post_collect(client, srv.turns_uri(&sid), turn_body("none")).await?;
    fake.record_requests(false);
    if status != StatusCode::OK || !contains(&bytes, END_TURN) {
        bail!(
            "a plain turn failed: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let sent = fake
        .requests()
        .pop()
        .ok_or_else(|| anyhow!("nothing sent upstream"))?;
    if sent
        .get("tools")
        .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        bail!("a session with no tools still offered tools upstream: {sent}");
    }
    Ok(())
}

/// The sections of the run, for `--only`.
/// `pg` and `failover` (they start PostgreSQL) run only when named.
pub const SECTIONS: &[&str] = &[
    "latency", "delta", "fanout", "mcp", "tput", "rss", "pg", "failover",
];

/// Runs the bench. Everything runs in a spawned task, so the client's side is on a runtime
/// worker in every section (not on the thread that called `block_on`, which would add a thread
/// wake-up to every request it sends).
pub async fn run(opts: &Options) -> Result<Report> {
    let opts = opts.clone();
    tokio::spawn(async move { run_on_worker(&opts).await }).await?
}

async fn run_on_worker(opts: &Options) -> Result<Report> {
    let n = Counts::new(opts.smoke);
    let wants = |s: &str| {
        opts.only
            .as_ref()
            .map_or(!pg::OPT_IN.contains(&s), |o| o.iter().any(|x| x == s))
    };
    let started = Instant::now();
    let client = client();
    let fake = FakeOpenAi::start().await;
    fake.record_requests(false);
    fake.set_fallback(plain_reply());
    let nan = Pcts {
        p50: f64::NAN,
        p99: f64::NAN,
    };

    // 1, 2, 5: one server, no MCP servers, sessions without tools.
    let mut lat = None;
    let mut del = None;
    let mut fans = Vec::new();
    if wants("latency") || wants("delta") || wants("fanout") {
        let srv = Server::start(Some(&fake.base_url()), false, "").await?;
        check_no_tools(&client, &fake, &srv).await?;
        if wants("latency") {
            log(opts, "1. added latency, stream none, c=1 and c=32");
            lat = Some(latency(opts, &n, &client, &fake, &srv).await?);
        }
        if wants("delta") {
            log(opts, "2. delta streaming, paced upstream");
            del = Some(deltas(opts, &n, &client, &fake, &srv).await?);
        }
        if wants("fanout") {
            log(opts, "5. delta fan-out through events/stream");
            let long: String = "lorem ipsum dolor sit amet, consectetur adipiscing elit. "
                .chars()
                .cycle()
                .take(n.fanout_chars)
                .collect();
            fake.set_fallback(Reply::text(&long).chunk_chars(8));
            for i in 0..n.fanout_runs {
                let f = fanout_once(&n, &client, &srv).await?;
                log(
                    opts,
                    format!(
                        "fan-out run {}: {} deltas in {:.3} s ({}..{} per subscriber)",
                        i + 1,
                        f.deltas,
                        f.secs,
                        f.min_per_sub,
                        f.max_per_sub
                    ),
                );
                fans.push(f);
            }
        }
        fake.set_fallback(plain_reply());
        srv.stop().await;
    }

    let mut mcp_fig = None;
    if wants("mcp") {
        log(opts, "3. a trusted MCP tool in a turn");
        let mcp_extra = format!(
            "[mcp_servers.ex]\ncommand = {:?}\n\n[policy]\ntrust = [\"mcp__ex__add\"]\n\n[mcp_endpoint]\nenabled = true\n",
            opts.mcp_example.display().to_string()
        );
        let srv = Server::start(Some(&fake.base_url()), false, &mcp_extra).await?;
        mcp_fig = Some(mcp(opts, &n, &client, &fake, &srv, &mcp_extra).await?);
        srv.stop().await;
    }

    let (mut tp_fast, mut tp_safe) = (Vec::new(), Vec::new());
    if wants("tput") {
        log(opts, "6. turns per second, c=32, fsync off and on");
        let fast = Server::start(Some(&fake.base_url()), false, "").await?;
        let safe = Server::start(Some(&fake.base_url()), true, "").await?;
        // Warm-up, discarded.
        throughput(&client, &fast, 256.min(n.tput_turns)).await?;
        throughput(&client, &safe, 256.min(n.tput_turns)).await?;
        for i in 0..n.tput_runs {
            for v in order(i, 2) {
                if v == 0 {
                    tp_fast.push(throughput(&client, &fast, n.tput_turns).await?);
                } else {
                    tp_safe.push(throughput(&client, &safe, n.tput_turns).await?);
                }
            }
            log(
                opts,
                format!(
                    "throughput run {}: fsync=false {:.0}/s, fsync=true {:.0}/s",
                    i + 1,
                    tp_fast.last().unwrap_or(&f64::NAN),
                    tp_safe.last().unwrap_or(&f64::NAN)
                ),
            );
        }
        fast.stop().await;
        safe.stop().await;
    }

    let mut pg_figs = None;
    if wants("pg") {
        log(opts, "7. SQLite, PostgreSQL one instance, two instances");
        pg_figs = Some(pg::pg(opts, &n, &client, &fake).await?);
    }
    let mut failover = None;
    if wants("failover") {
        log(opts, "8. failover: kill -9 of an instance mid-turn");
        failover = Some(failover::failover(opts, &client, &fake).await?);
    }

    let mut rss_figs = Vec::new();
    if wants("rss") {
        log(opts, "4. RSS per idle events/stream");
        if opts.smoke {
            let r = rss(opts, &client, n.rss_streams[0]).await?;
            rss_figs.push((r.per_stream(), r.streams, r.in_process));
            rss_figs.push((r.per_stream(), r.streams, r.in_process));
        } else {
            for &count in &n.rss_streams {
                let r = rss(opts, &client, count).await?;
                rss_figs.push((r.per_stream(), r.streams, r.in_process));
            }
        }
    }
    drop(fake);

    // ---- figures (NaN, and null in the JSON, for a section not run)
    let lat_v = lat.as_ref();
    let c1_direct = lat_v.map_or(nan, |l| l.c1_direct);
    let c1_through = lat_v.map_or(nan, |l| l.c1_through);
    let c32_direct = lat_v.map_or(nan, |l| l.c32_direct);
    let c32_through = lat_v.map_or(nan, |l| l.c32_through);
    let added_p50 = c1_through.p50 - c1_direct.p50;
    let added_p99 = c1_through.p99 - c1_direct.p99;
    let added_p50_c32 = c32_through.p50 - c32_direct.p50;
    let added_p99_c32 = c32_through.p99 - c32_direct.p99;
    let ratio = c1_through.p50 / c1_direct.p50;
    let ratio_c32 = c32_through.p50 / c32_direct.p50;
    let (ttfd_p50, ttfd_p99, gap_p50, gap_p99) = match &del {
        Some(d) => (
            d.ttfd_through.p50 - d.ttfd_direct.p50,
            d.ttfd_through.p99 - d.ttfd_direct.p99,
            d.gap_through.p50 - d.gap_direct.p50,
            d.gap_through.p99 - d.gap_direct.p99,
        ),
        None => (f64::NAN, f64::NAN, f64::NAN, f64::NAN),
    };
    let fan_rates: Vec<f64> = fans.iter().map(|f| f.deltas as f64 / f.secs).collect();
    let deltas_per_s = median(&fan_rates);
    let turns_per_s = median(&tp_fast);
    let turns_per_s_fsync = median(&tp_safe);

    let us = |x: f64| format!("{x:.0} µs");
    let mut rows = Vec::new();
    let mut row = |figure: &str, value: String, target: &str, met: Option<bool>| {
        rows.push(Row {
            figure: figure.to_string(),
            value,
            target: target.to_string(),
            met,
        })
    };
    if lat.is_some() {
        row(
            "added latency p50, no tools, stream none, c=1",
            format!(
                "{} ({} direct → {} through)",
                us(added_p50),
                us(c1_direct.p50),
                us(c1_through.p50)
            ),
            "≤ 150 µs",
            Some(added_p50 <= 150.0),
        );
        row(
            "added latency p99, no tools, stream none, c=1",
            format!(
                "{} ({} → {})",
                us(added_p99),
                us(c1_direct.p99),
                us(c1_through.p99)
            ),
            "≤ 500 µs",
            Some(added_p99 <= 500.0),
        );
        row(
            "through/direct p50 ratio, c=1",
            format!("{ratio:.2}×"),
            "",
            None,
        );
        let cpu = lat_v.map_or((f64::NAN, f64::NAN), |l| l.c1_cpu);
        row(
            "CPU per request at c=1, whole process (client + fake + turnstile)",
            format!(
                "{} direct, {} through (+{})",
                us(cpu.0),
                us(cpu.1),
                us(cpu.1 - cpu.0)
            ),
            "",
            None,
        );
        let (barrier, barrier_max) = lat_v.map_or((nan, f64::NAN), |l| l.barrier);
        row(
            "one durable-log commit (append + flush, idle store); a plain turn makes one when its upstream answers within 1 ms",
            format!(
                "{} p50, {} p99, {} max",
                us(barrier.p50),
                us(barrier.p99),
                us(barrier_max)
            ),
            "",
            None,
        );
        row(
            "added latency p50 / p99, c=32",
            format!(
                "{} / {} (p50 {} → {}, ratio {ratio_c32:.2}×)",
                us(added_p50_c32),
                us(added_p99_c32),
                us(c32_direct.p50),
                us(c32_through.p50)
            ),
            "",
            None,
        );
    }
    if let Some(d) = &del {
        row(
            "added time to first delta p99 (p50), upstream's own wait taken out",
            format!(
                "{} ({}; raw {} → {} p99, with the paced upstream's timer jitter)",
                us(ttfd_p99),
                us(ttfd_p50),
                us(d.ttfd_raw_direct.p99),
                us(d.ttfd_raw_through.p99)
            ),
            "≤ 200 µs",
            Some(ttfd_p99 <= 200.0),
        );
        row(
            "added inter-delta gap p99 (p50), source gaps taken out",
            format!(
                "{} ({}; received − sent gap p99 {:.0} µs direct, {:.0} µs through; {}/{} deltas a turn)",
                us(gap_p99),
                us(gap_p50),
                d.gap_direct.p99,
                d.gap_through.p99,
                d.per_turn.0,
                d.per_turn.1
            ),
            "≤ 20 µs",
            Some(gap_p99 <= 20.0),
        );
        row(
            "for reference: added by a byte-splicing TCP proxy (the floor of any proxy here), time to first delta p99 (p50); inter-delta gap p99",
            format!(
                "{} ({}); {}",
                us(d.ttfd_splice.p99 - d.ttfd_direct.p99),
                us(d.ttfd_splice.p50 - d.ttfd_direct.p50),
                us(d.gap_splice.p99 - d.gap_direct.p99)
            ),
            "",
            None,
        );
    }
    if let Some(m) = &mcp_fig {
        row(
            "MCP tool overhead p50 (the tool's time inside the turn − a direct rmcp call)",
            format!(
                "{} (in the turn {}: the upstream waits {} between the model's tool call and the next request, {} when turnstile's client asks again at once; direct rmcp call after a model answer {}, back to back {}; turnstile's tool host alone {}; whole turns: {} with the tool, {} without)",
                us(m.overhead()),
                us(m.in_turn()),
                us(m.gap_turn),
                us(m.gap_again),
                us(m.rmcp),
                us(m.rmcp_hot),
                us(m.host),
                us(m.tool),
                us(m.plain)
            ),
            "≤ 100 µs",
            Some(m.overhead() <= 100.0),
        );
        row(
            "A trusted MCP tool through /mcp − the same tool called directly on the child, p50 (p99)",
            format!(
                "{} ({}); through /mcp {} ({}), direct {} ({})",
                us(m.endpoint.p50 - m.endpoint_direct.p50),
                us(m.endpoint.p99 - m.endpoint_direct.p99),
                us(m.endpoint.p50),
                us(m.endpoint.p99),
                us(m.endpoint_direct.p50),
                us(m.endpoint_direct.p99)
            ),
            "",
            None,
        );
    }
    for (i, (kib, count, in_process)) in rss_figs.iter().enumerate() {
        let label = if opts.smoke {
            format!(
                "RSS per idle events/stream ({count} streams, smoke{})",
                if i == 0 { "" } else { ", same figure" }
            )
        } else {
            format!("RSS per idle events/stream ({count} streams)")
        };
        row(
            &label,
            format!(
                "{kib:.1} KiB{}",
                if *in_process {
                    " (in process, client sockets included)"
                } else {
                    " (server process alone)"
                }
            ),
            "≤ 100 KiB",
            Some(*kib <= 100.0),
        );
    }
    if !fans.is_empty() {
        row(
            &format!(
                "delta events/s fanned out to {} subscribers",
                n.fanout_subscribers
            ),
            format!(
                "{deltas_per_s:.0}/s ({} deltas in {:.3} s, median run)",
                fans[0].deltas,
                median(&fans.iter().map(|f| f.secs).collect::<Vec<_>>())
            ),
            "≥ 50,000/s",
            Some(deltas_per_s >= 50_000.0),
        );
    }
    if !tp_fast.is_empty() {
        row(
            "turns/s, c=32, stream none, fsync = false",
            format!("{turns_per_s:.0}/s"),
            "",
            None,
        );
        row(
            "turns/s, c=32, stream none, fsync = true",
            format!(
                "{turns_per_s_fsync:.0}/s ({:.2}× of fsync = false)",
                turns_per_s_fsync / turns_per_s
            ),
            "",
            None,
        );
    }

    let mut notes = vec![format!(
        "{}; {} run in {:.0} s; medians over {} measured rounds (first round discarded).",
        machine(),
        if opts.smoke { "smoke" } else { "full" },
        started.elapsed().as_secs_f64(),
        n.rounds - 1
    )];
    if let Some(p) = &pg_figs {
        notes.push(p.table());
    }
    if let Some((f, load)) = &failover {
        notes.push(failover::failover_table(f, load));
    }
    if matches!(opts.rss, RssMode::InProcess) && !rss_figs.is_empty() {
        notes.push(
            "RSS measured in process (smoke test): the figure includes the client's sockets."
                .to_string(),
        );
    }

    let mut j = serde_json::Map::new();
    // json!(NaN) is null: a section that did not run.
    let mut put = |k: &str, v: f64, digits: i32| {
        let scale = 10f64.powi(digits);
        j.insert(k.to_string(), json!((v * scale).round() / scale));
    };
    put("added_p50_us", added_p50, 1);
    put("added_p99_us", added_p99, 1);
    put("added_p50_us_c32", added_p50_c32, 1);
    put("added_p99_us_c32", added_p99_c32, 1);
    put("direct_p50_us", c1_direct.p50, 1);
    put("direct_p50_us_c32", c32_direct.p50, 1);
    put(
        "store_barrier_p50_us",
        lat.as_ref().map_or(f64::NAN, |l| l.barrier.0.p50),
        1,
    );
    put(
        "cpu_per_turn_added_us",
        lat.as_ref().map_or(f64::NAN, |l| l.c1_cpu.1 - l.c1_cpu.0),
        1,
    );
    put("ratio_p50", ratio, 2);
    put("ratio_p50_c32", ratio_c32, 2);
    put(
        "ttfd_raw_added_p99_us",
        del.as_ref()
            .map_or(f64::NAN, |d| d.ttfd_raw_through.p99 - d.ttfd_raw_direct.p99),
        1,
    );
    put("ttfd_added_p50_us", ttfd_p50, 1);
    put("ttfd_added_p99_us", ttfd_p99, 1);
    put("gap_added_p50_us", gap_p50, 1);
    put("gap_added_p99_us", gap_p99, 1);
    let splice = |f: fn(&Deltas) -> f64| del.as_ref().map_or(f64::NAN, f);
    put(
        "splice_ttfd_added_p50_us",
        splice(|d| d.ttfd_splice.p50 - d.ttfd_direct.p50),
        1,
    );
    put(
        "splice_ttfd_added_p99_us",
        splice(|d| d.ttfd_splice.p99 - d.ttfd_direct.p99),
        1,
    );
    put(
        "splice_gap_added_p99_us",
        splice(|d| d.gap_splice.p99 - d.gap_direct.p99),
        1,
    );
    put(
        "mcp_overhead_p50_us",
        mcp_fig.as_ref().map_or(f64::NAN, Mcp::overhead),
        1,
    );
    put(
        "mcp_tool_in_turn_p50_us",
        mcp_fig.as_ref().map_or(f64::NAN, Mcp::in_turn),
        1,
    );
    for (key, fig) in [
        (
            "mcp_endpoint_p50_us",
            (|m: &Mcp| m.endpoint.p50) as fn(&Mcp) -> f64,
        ),
        ("mcp_endpoint_p99_us", |m| m.endpoint.p99),
        ("mcp_endpoint_direct_p50_us", |m| m.endpoint_direct.p50),
        ("mcp_endpoint_direct_p99_us", |m| m.endpoint_direct.p99),
    ] {
        put(key, mcp_fig.as_ref().map_or(f64::NAN, fig), 1);
    }
    put(
        "mcp_host_call_p50_us",
        mcp_fig.as_ref().map_or(f64::NAN, |m| m.host),
        1,
    );
    put(
        "mcp_direct_p50_us",
        mcp_fig.as_ref().map_or(f64::NAN, |m| m.rmcp),
        1,
    );
    put(
        "mcp_direct_hot_p50_us",
        mcp_fig.as_ref().map_or(f64::NAN, |m| m.rmcp_hot),
        1,
    );
    put(
        "rss_kib_per_stream_1000",
        rss_figs.first().map_or(f64::NAN, |r| r.0),
        1,
    );
    put(
        "rss_kib_per_stream_10000",
        rss_figs.get(1).map_or(f64::NAN, |r| r.0),
        1,
    );
    put("deltas_per_s", deltas_per_s, 0);
    put("turns_per_s", turns_per_s, 0);
    put("turns_per_s_fsync", turns_per_s_fsync, 0);
    pg::PgFigures::json(pg_figs.as_ref(), &mut j);
    failover::failover_json(failover.as_ref().map(|f| f.0.as_slice()), &mut j);
    j.insert("smoke".into(), json!(opts.smoke));
    j.insert("machine".into(), json!(machine()));

    Ok(Report {
        rows,
        json: j,
        notes,
    })
}

// ---------------------------------------------------------------------------------------------
// The example binary beside this one

/// The `mcp_example` binary of the same profile, beside `exe` (`target/<profile>/examples/`).
pub fn mcp_example_beside(exe: &Path) -> PathBuf {
    let name = format!("mcp_example{}", std::env::consts::EXE_SUFFIX);
    exe.parent()
        .map(|d| d.join(&name))
        .unwrap_or_else(|| PathBuf::from(&name))
}

/// The `mcp_example` binary beside `exe`, built first with `cargo build [--release] --example
/// mcp_example` when it is missing or older than its source (`cargo run --example bench` builds
/// only the bench). Says so on stderr.
pub fn ensure_mcp_example(exe: &Path) -> Result<PathBuf> {
    let path = mcp_example_beside(exe);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mcp_example.rs");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (modified(&path), modified(&source)) {
        (None, _) => true,
        (Some(bin), Some(src)) => bin < src,
        (Some(_), None) => false,
    };
    if !stale {
        return Ok(path);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.arg("build");
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    cmd.args(["--example", "mcp_example", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    eprintln!(
        "[bench] {} is missing or stale: building it with `{} build{} --example mcp_example`",
        path.display(),
        Path::new(&cargo).display(),
        if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        }
    );
    let status = cmd.status().context("running cargo")?;
    if !status.success() || !path.is_file() {
        bail!(
            "could not build mcp_example ({status}); build it with `cargo build{} --example mcp_example`",
            if cfg!(debug_assertions) { "" } else { " --release" }
        );
    }
    Ok(path)
}

/// The environment turnstile is loaded with here: the process's and the variables naming the
/// PostgreSQL databases made by this run (never set in the process: the tests include this file).
fn env() -> turnstile::config::Env {
    turnstile::config::Env::process().with(pg::vars())
}

/// `EXE --serve CONFIG` (the bench's own binary serving in a child process) and the address it
/// says it listens on.
async fn serve_child(exe: &Path, config: &Path) -> Result<(std::process::Child, SocketAddr)> {
    let mut c = std::process::Command::new(exe)
        .envs(pg::vars())
        .arg("--serve")
        .arg(config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {} --serve", exe.display()))?;
    let stdout = c.stdout.take().expect("piped");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await??;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("the server child said {line:?}"))?
        .parse()?;
    Ok((c, addr))
}
