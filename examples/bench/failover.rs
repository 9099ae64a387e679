//! `--only failover`: two turnstile instances as child processes (`--serve`) on one database of
//! a PostgreSQL cluster of their own (see `pg.rs`), a turn held at the model on A, `kill -9` of
//! A; the time until B's `events/stream` shows `turn.failed` `worker_lost`, then until a new
//! turn sent to B at that moment has completed; with `lease_s = 2` and 10.

use super::pg::{loadavg, max, start_cluster, PgCluster};
use super::*;
use turnstile::testkit::fake_openai::Gate;
/// A turnstile child process (`<bench> --serve CONFIG`): closing its stdin stops it; dropped,
/// it is killed.
struct Child {
    proc: std::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Child {
    async fn spawn(exe: &Path, config: &str) -> Result<Child> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-bench-failover-")
            .tempdir_in(bench_tmp())?;
        let path = dir.path().join("tools.toml");
        std::fs::write(&path, config)?;
        let (proc, addr) = serve_child(exe, &path).await?;
        Ok(Child {
            base: format!("http://{addr}"),
            proc,
            _dir: dir,
        })
    }

    /// `kill -9`, and wait for it to be gone.
    async fn kill_9(mut self) -> Result<()> {
        // SAFETY: kill with a pid of our own child and a valid signal.
        if unsafe { libc::kill(self.proc.id() as i32, libc::SIGKILL) } != 0 {
            bail!(
                "kill -9 {}: {}",
                self.proc.id(),
                std::io::Error::last_os_error()
            );
        }
        tokio::task::spawn_blocking(move || {
            let _ = self.proc.wait();
            drop(self);
        })
        .await?;
        Ok(())
    }

    /// Close its stdin (it stops as on SIGTERM), then wait up to 15 s.
    async fn stop(mut self) {
        drop(self.proc.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if !matches!(self.proc.try_wait(), Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if matches!(self.proc.try_wait(), Ok(None)) {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

/// A session with no tools on the instance at `base`.
async fn session_at(client: &Client, base: &str) -> Result<String> {
    let v = post_json(
        client,
        &format!("{base}/sessions"),
        &serde_json::from_str(NO_TOOLS)?,
    )
    .await?;
    v["sessionId"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no sessionId in {v}"))
}

/// Follows `events/stream` of a session (headers in when this returns); the receiver gets the
/// moment a `turn.failed` with `worker_lost` arrives.
async fn watch_lost(
    client: &Client,
    base: &str,
    sid: &str,
) -> Result<tokio::sync::oneshot::Receiver<Instant>> {
    let req = Request::get(format!("{base}/sessions/{sid}/events/stream"))
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::new()))?;
    let resp = client.request(req).await?;
    if resp.status() != StatusCode::OK {
        bail!("events/stream on B: {}", resp.status());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut body = resp.into_body();
        let mut split = SseSplitter::default();
        let mut tx = Some(tx);
        while let Some(Ok(frame)) = body.frame().await {
            let now = Instant::now();
            if let Some(d) = frame.data_ref() {
                split.push(d, |block| {
                    if event_name(block) == b"turn.failed"
                        && contains(event_data(block), b"worker_lost")
                    {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(now);
                        }
                    }
                });
            }
            if tx.is_none() {
                break;
            }
        }
    });
    Ok(rx)
}

/// The failover timings of one `lease_s`, in seconds from the `kill -9`.
pub(super) struct Failover {
    lease_s: u64,
    /// Until B's `events/stream` (open since before the turn) delivers `turn.failed`
    /// `worker_lost`.
    stream: Vec<f64>,
    /// Until B's `events/history` (polled every 20 ms) ends with it.
    history: Vec<f64>,
    /// Until a turn sent to B once its history shows it has completed.
    next: Vec<f64>,
    /// When A's lease row expires (read right after the kill).
    expiry: Vec<f64>,
    /// `409 session_busy` answers to that turn (retried 10 ms later).
    busy: usize,
    runs: usize,
    problems: Vec<String>,
}

const FAILOVER_LOG: [&str; 5] = [
    "user.message",
    "turn.failed",
    "user.message",
    "agent.message",
    "turn.completed",
];

/// `type reason` of each event, for a problem's message.
fn describe(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or("?"),
                e["reason"].as_str().unwrap_or("")
            )
            .trim()
            .to_string()
        })
        .collect()
}

async fn history(client: &Client, base: &str, sid: &str) -> Result<Vec<Value>> {
    let v = get_json(
        client,
        &format!("{base}/sessions/{sid}/events/history?limit=1000"),
    )
    .await?;
    Ok(v["events"].as_array().cloned().unwrap_or_default())
}

/// Where one failover happens: the cluster, B, the config and database both use.
struct Stage<'a> {
    client: &'a Client,
    fake: &'a FakeOpenAi,
    exe: &'a Path,
    config: String,
    pg: &'a PgCluster,
    db: String,
    b: Child,
}

/// One failover: a turn held at the model on a fresh A, `kill -9` of A, B takes over.
/// `stagger`: how long the turn runs before the kill. Runs one after the other would otherwise
/// kill A at the same point of B's expiry check every time (a run ends right after one; the
/// next kill follows a fixed setup later), always the worst case: the runs spread it over
/// the check's period instead.
async fn failover_once(s: &Stage<'_>, f: &mut Failover, stagger: Duration) -> Result<()> {
    let (client, b) = (s.client, &s.b);
    let a = Child::spawn(s.exe, &s.config).await?;
    let sid = session_at(client, &a.base).await?;
    let mut lost = watch_lost(client, &b.base, &sid).await?;
    let gate = Gate::new();
    s.fake
        .push(Reply::text("never finished").hold(gate.clone()));
    let before = s.fake.request_count();
    post_json(
        client,
        &format!("{}/sessions/{sid}/messages", a.base),
        &json!({"content": "a slow turn"}),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.fake.request_count() == before {
        if Instant::now() > deadline {
            bail!("A's turn did not reach the upstream within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Killed before its first commit, the turn would leave nothing behind to close (no event,
    // so no worker_lost ever: see the report): wait until B reads its user.message.
    while !history(client, &b.base, &sid)
        .await?
        .iter()
        .any(|e| e["type"] == "user.message")
    {
        if Instant::now() > deadline {
            bail!("A's user.message did not reach B's events/history within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(stagger).await;
    let killed = Instant::now();
    a.kill_9().await?;
    f.runs += 1;
    // When A's lease expires, seen from the database right after the kill.
    let expires = tokio::task::block_in_place(|| {
        s.pg.psql(
            &s.db,
            &format!("SELECT extract(epoch FROM expires_at - now()) FROM leases WHERE session_id = '{sid}'"),
        )
    });
    let expires = expires.parse::<f64>().unwrap_or(f64::NAN) + killed.elapsed().as_secs_f64();
    f.expiry.push(expires);
    let within = Duration::from_secs(2 * f.lease_s + 15);
    let (mut on_stream, mut in_history) = (None, None);
    let mut evs = Vec::new();
    while killed.elapsed() < within && (on_stream.is_none() || in_history.is_none()) {
        if on_stream.is_none() {
            if let Ok(t) = lost.try_recv() {
                on_stream = Some(t - killed);
            }
        }
        if in_history.is_none() {
            evs = history(client, &b.base, &sid).await?;
            if evs
                .last()
                .is_some_and(|e| e["type"] == "turn.failed" && e["reason"] == "worker_lost")
            {
                in_history = Some(killed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(t) = on_stream {
        f.stream.push(t.as_secs_f64());
    }
    if let Some(t) = in_history {
        f.history.push(t.as_secs_f64());
    }
    if on_stream.is_none() || in_history.is_none() {
        let leases = s.pg.psql(
            &s.db,
            &format!("SELECT holder, round(extract(epoch FROM expires_at - now())::numeric, 2) FROM leases WHERE session_id = '{sid}'"),
        );
        f.problems.push(format!(
            "lease_s = {}: session {sid}: {:?} after kill -9 of A: B's events/stream {}, B's events/history {} (it holds {:?}); lease row (holder|expires in s): {:?}",
            f.lease_s,
            within,
            on_stream.map_or("never showed worker_lost".to_string(), |t| format!("showed worker_lost after {t:?}")),
            in_history.map_or("never ended with worker_lost".to_string(), |t| format!("ended with worker_lost after {t:?}")),
            describe(&evs),
            leases
        ));
        if in_history.is_none() {
            gate.open();
            return Ok(());
        }
    }
    let uri = format!("{}/sessions/{sid}/turns", b.base).parse::<Uri>()?;
    loop {
        let (status, bytes) = post_collect(client, uri.clone(), turn_body("none")).await?;
        if status == StatusCode::CONFLICT
            && contains(&bytes, b"session_busy")
            && killed.elapsed() < within
        {
            f.busy += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        if status != StatusCode::OK || !contains(&bytes, END_TURN) {
            bail!(
                "the next turn on B: {status} {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        break;
    }
    f.next.push(killed.elapsed().as_secs_f64());
    gate.open();
    let evs = history(client, &b.base, &sid).await?;
    let types: Vec<&str> = evs.iter().filter_map(|e| e["type"].as_str()).collect();
    if types != FAILOVER_LOG || evs[1]["reason"] != "worker_lost" {
        f.problems.push(format!(
            "lease_s = {}: session {sid}: log on B after the next turn {:?}",
            f.lease_s,
            describe(&evs)
        ));
    }
    Ok(())
}

/// The `failover` section.
pub(super) async fn failover(
    opts: &Options,
    client: &Client,
    fake: &FakeOpenAi,
) -> Result<(Vec<Failover>, String)> {
    let RssMode::Child(exe) = &opts.rss else {
        bail!(
            "the failover section runs turnstile as child processes: run it from the bench binary"
        );
    };
    let load0 = loadavg();
    let pg = tokio::task::spawn_blocking(start_cluster).await??;
    let (leases, runs) = if opts.smoke {
        (vec![2u64], 1)
    } else {
        (vec![2u64, 10], 5)
    };
    let mut out = Vec::new();
    for lease_s in leases {
        let (store, url) = pg.store_table_and_url(&format!("lease_s = {lease_s}"));
        let config = config_text(Some(&fake.base_url()), false, &store);
        let stage = Stage {
            client,
            fake,
            exe,
            b: Child::spawn(exe, &config).await?,
            config,
            pg: &pg,
            db: url.rsplit('/').next().unwrap_or_default().to_string(),
        };
        let mut f = Failover {
            lease_s,
            stream: Vec::new(),
            history: Vec::new(),
            next: Vec::new(),
            expiry: Vec::new(),
            busy: 0,
            runs: 0,
            problems: Vec::new(),
        };
        for i in 0..runs {
            let period = lease_s as f64 / 2.0;
            let stagger = Duration::from_secs_f64(period * (i as f64 + 0.5) / runs as f64);
            failover_once(&stage, &mut f, stagger).await?;
            log(
                opts,
                format!(
                    "failover lease_s = {lease_s} run {}: A's lease expires {:.2} s after the kill; worker_lost on B's stream after {:.2} s, in its history after {:.2} s, next turn done after {:.2} s{}",
                    i + 1,
                    f.expiry.last().unwrap_or(&f64::NAN),
                    f.stream.last().unwrap_or(&f64::NAN),
                    f.history.last().unwrap_or(&f64::NAN),
                    f.next.last().unwrap_or(&f64::NAN),
                    if f.problems.is_empty() { "" } else { " (PROBLEMS, see below)" }
                ),
            );
        }
        stage.b.stop().await;
        out.push(f);
    }
    Ok((
        out,
        format!("load average {load0} before, {} after", loadavg()),
    ))
}

/// The failover table, as Markdown.
pub(super) fn failover_table(figs: &[Failover], load: &str) -> String {
    let mut out = String::from(
        "| `lease_s` | runs | A's lease row expires, median / max | after `kill -9` of A mid-turn, B's `events/stream` shows `turn.failed` `worker_lost`, median / max (runs) | B's `events/history` ends with it (polled every 20 ms) | a turn then sent to B has completed (from the kill) | `409 session_busy` to it | problems |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for f in figs {
        out.push_str(&format!(
            "| {} | {} | {:.2} s / {:.2} s | {:.2} s / {:.2} s ({}) | {:.2} s / {:.2} s ({}) | {:.2} s / {:.2} s ({}) | {} | {} |\n",
            f.lease_s,
            f.runs,
            median(&f.expiry),
            max(&f.expiry),
            median(&f.stream),
            max(&f.stream),
            f.stream.len(),
            median(&f.history),
            max(&f.history),
            f.history.len(),
            median(&f.next),
            max(&f.next),
            f.next.len(),
            f.busy,
            f.problems.len()
        ));
    }
    out.push_str(&format!(
        "\nTwo turnstile processes (`--serve`) on one PostgreSQL database; A holds a turn at the model when it is killed, B follows the session's events/stream from before the turn; A is killed (i + 0.5) / runs × lease_s / 2 into run i's turn, so that the kills fall at spread points of B's expiry check. A holder renews its leases every lease_s / 3 and every instance looks for expired ones every lease_s / 2, so worker_lost is due between 2/3 and 1.5 × lease_s after the kill. {load}.\n"
    ));
    for p in figs.iter().flat_map(|f| &f.problems) {
        out.push_str(&format!("\nPROBLEM: {p}"));
    }
    out
}

/// JSON figures of the failover section.
pub(super) fn failover_json(figs: Option<&[Failover]>, j: &mut serde_json::Map<String, Value>) {
    for lease in [2u64, 10] {
        let f = figs.and_then(|fs| fs.iter().find(|f| f.lease_s == lease));
        let r = |v: Option<f64>| {
            json!(v
                .map(|x| (x * 1000.0).round() / 1000.0)
                .filter(|x| x.is_finite()))
        };
        for (key, fig) in [
            (
                "stream_median",
                (|f: &Failover| median(&f.stream)) as fn(&Failover) -> f64,
            ),
            ("stream_max", |f| max(&f.stream)),
            ("history_median", |f| median(&f.history)),
            ("next_median", |f| median(&f.next)),
            ("next_max", |f| max(&f.next)),
        ] {
            j.insert(format!("failover_{key}_s_lease{lease}"), r(f.map(fig)));
        }
        j.insert(
            format!("failover_problems_lease{lease}"),
            json!(f.map(|f| f.problems.len())),
        );
    }
}
