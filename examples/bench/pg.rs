//! The PostgreSQL figures: `--store postgres` (section `pg`) and `--only failover`.
//!
//! Both start their own PostgreSQL cluster the way the tests do (`tests/common/postgres.rs`,
//! included here: `initdb` + `pg_ctl` into a temporary folder on a free port, as the `postgres`
//! user through `runuser` when running as root), on the machine's disk, with the server's own
//! `fsync = on` and `synchronous_commit = off` (the counterpart of turnstile's `fsync = false` on
//! SQLite: a commit does not wait for the WAL to reach the disk; a crash of PostgreSQL itself may
//! lose the last few hundred milliseconds, never consistency). turnstile's `[server] fsync =
//! true` forces `synchronous_commit = on` on its connections, the counterpart of SQLite's fsync.
//!
//! - `pg`: the same turns as the latency and throughput sections (no tools, stream none, a
//!   fresh session every [`TURNS_PER_SESSION`] turns) on SQLite, PostgreSQL with one instance and
//!   PostgreSQL with two instances (both in this process, each with its own data folder, on one
//!   database): sessions created on either, each turn sent to the other instance than the turn
//!   before. Added latency at c=1 against the direct call (interleaved rounds), turns/s at c=32
//!   with `fsync` off and on. A `409 session_busy` is retried (1 ms later) and counted. After each
//!   batch every session's log is read back (from the second instance on two) and every turn
//!   must be there: one `user.message` and one `turn.completed` each, nothing failed.
//! - `failover`: two instances as child processes (`--serve`), a turn held at the model on A,
//!   `kill -9` of A; the time until B's `events/stream` shows `turn.failed` `worker_lost`, then
//!   until a new turn sent to B at that moment has completed; with `lease_s = 2` and 10.

// The same file is `common::postgres` in `tests/bench_smoke.rs`, which includes this one too.
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/common/postgres.rs"]
mod cluster;

use std::collections::HashMap;
use std::io::BufRead as _;

use super::*;
use cluster::PgCluster;
use turnstile::testkit::fake_openai::Gate;

/// The sections of this file: not part of a run without `--only` (they need PostgreSQL).
pub(super) const OPT_IN: &[&str] = &["pg", "failover"];

/// The cluster's settings (on top of `tests/common/postgres.rs`'s defaults).
const CLUSTER_OPTIONS: &[&str] = &["-c", "synchronous_commit=off", "-c", "max_connections=300"];

fn start_cluster() -> Result<PgCluster> {
    std::panic::catch_unwind(|| PgCluster::start_with(CLUSTER_OPTIONS))
        .map_err(|_| anyhow!("could not start PostgreSQL (see the message above)"))
}

/// `/proc/loadavg`'s three averages.
pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// One store setting: one instance, or two sharing one database.
struct Target {
    name: &'static str,
    servers: Vec<Server>,
}

/// A batch's plans and, per session, how many turns it gets.
type Plans = (Vec<Vec<(Uri, Bytes)>>, HashMap<String, usize>);

impl Target {
    async fn start(
        name: &'static str,
        fake: &FakeOpenAi,
        fsync: bool,
        store: Option<&str>,
        instances: usize,
    ) -> Result<Target> {
        let mut servers = Vec::new();
        for _ in 0..instances {
            servers.push(Server::start(Some(&fake.base_url()), fsync, store.unwrap_or("")).await?);
        }
        Ok(Target { name, servers })
    }

    async fn stop(self) {
        for s in self.servers {
            s.stop().await;
        }
    }

    /// Per worker, `per_worker` turns, a fresh session every [`TURNS_PER_SESSION`] created on
    /// the instances in turn, and each turn sent to the instances in turn.
    async fn plans(&self, client: &Client, workers: usize, per_worker: usize) -> Result<Plans> {
        let k = self.servers.len();
        let body = turn_body("none");
        let mut plans = Vec::with_capacity(workers);
        let mut turns = HashMap::new();
        for w in 0..workers {
            let mut plan = Vec::with_capacity(per_worker);
            let mut sid = String::new();
            for i in 0..per_worker {
                if i % TURNS_PER_SESSION == 0 {
                    let home = &self.servers[(w + i / TURNS_PER_SESSION) % k];
                    sid = home.session(client, NO_TOOLS).await?;
                }
                plan.push((self.servers[(w + i) % k].turns_uri(&sid), body.clone()));
                *turns.entry(sid.clone()).or_insert(0) += 1;
            }
            plans.push(plan);
        }
        Ok((plans, turns))
    }

    /// Every session's turns in its log, read from the last instance; what is wrong, if any.
    async fn check(&self, client: &Client, turns: &HashMap<String, usize>) -> Result<Vec<String>> {
        let base = &self.servers[self.servers.len() - 1].base;
        let mut problems = Vec::new();
        for (sid, want) in turns {
            let v = get_json(
                client,
                &format!("{base}/sessions/{sid}/events/history?limit=1000"),
            )
            .await?;
            let evs = v["events"].as_array().cloned().unwrap_or_default();
            let count = |t: &str| evs.iter().filter(|e| e["type"] == t).count();
            let mut ids: Vec<&str> = evs.iter().filter_map(|e| e["id"].as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            let (users, done, failed) = (
                count("user.message"),
                count("turn.completed"),
                count("turn.failed"),
            );
            if users != *want || done != *want || failed != 0 || ids.len() != evs.len() {
                problems.push(format!(
                    "{}: session {sid}: {want} turns answered 200, log has {users} user.message, {done} turn.completed, {failed} turn.failed, {} events ({} distinct ids): {:?}",
                    self.name,
                    evs.len(),
                    ids.len(),
                    evs.iter()
                        .map(|e| format!("{} {}", e["type"].as_str().unwrap_or("?"), e["reason"].as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                ));
            }
        }
        Ok(problems)
    }
}

/// Like [`batch`], but a `409 session_busy` is retried 1 ms later (counted; the latency is the
/// whole wait). Any other answer than 200 with `expect` is an error.
async fn batch_busy(
    client: &Client,
    plans: Vec<Vec<(Uri, Bytes)>>,
    expect: &'static [u8],
) -> Result<(Vec<u64>, usize)> {
    let mut set = JoinSet::new();
    for plan in plans {
        let client = client.clone();
        set.spawn(async move {
            let mut out = Vec::with_capacity(plan.len());
            let mut busy = 0usize;
            for (uri, body) in plan {
                let t = Instant::now();
                loop {
                    let (status, bytes) = post_collect(&client, uri.clone(), body.clone()).await?;
                    if status == StatusCode::CONFLICT && contains(&bytes, b"session_busy") {
                        busy += 1;
                        if t.elapsed() > Duration::from_secs(30) {
                            bail!("POST {uri}: still session_busy after 30 s");
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    if status != StatusCode::OK || !contains(&bytes, expect) {
                        bail!(
                            "POST {uri}: {status} {}",
                            String::from_utf8_lossy(&bytes[..bytes.len().min(400)])
                        );
                    }
                    break;
                }
                out.push(t.elapsed().as_nanos() as u64);
            }
            Ok::<_, anyhow::Error>((out, busy))
        });
    }
    let (mut all, mut busy) = (Vec::new(), 0);
    while let Some(r) = set.join_next().await {
        let (o, b) = r??;
        all.extend(o);
        busy += b;
    }
    Ok((all, busy))
}

/// What one target did in the `pg` section.
#[derive(Default)]
pub(super) struct Column {
    c1: Vec<Pcts>,
    tput: [Vec<f64>; 2],
    busy: usize,
    turns: usize,
    problems: Vec<String>,
}

pub(super) struct PgFigures {
    direct: Vec<Pcts>,
    columns: Vec<(&'static str, Column)>,
    sync_commit: String,
    load: (String, String),
    secs: f64,
}

/// Runs `plans` on `t`, then checks its log (untimed); the latencies and the batch's turns/s.
async fn run_checked(
    client: &Client,
    t: &Target,
    col: &mut Column,
    p: Plans,
) -> Result<(Vec<u64>, f64)> {
    let (plans, turns) = p;
    let t0 = Instant::now();
    let (ns, busy) = batch_busy(client, plans, END_TURN).await?;
    let rate = ns.len() as f64 / t0.elapsed().as_secs_f64();
    col.busy += busy;
    col.turns += ns.len();
    col.problems.extend(t.check(client, &turns).await?);
    Ok((ns, rate))
}

/// The `pg` section.
pub(super) async fn pg(
    opts: &Options,
    n: &Counts,
    client: &Client,
    fake: &FakeOpenAi,
) -> Result<PgFigures> {
    let started = Instant::now();
    let load0 = loadavg();
    let pg = tokio::task::spawn_blocking(start_cluster).await??;
    let mut sets = Vec::new();
    for fsync in [false, true] {
        let one = pg.store_table("");
        let two = pg.store_table("");
        sets.push([
            Target::start("SQLite", fake, fsync, None, 1).await?,
            Target::start("PostgreSQL, one instance", fake, fsync, Some(&one), 1).await?,
            Target::start("PostgreSQL, two instances", fake, fsync, Some(&two), 2).await?,
        ]);
    }
    let sync_commit = pg.psql("postgres", "SHOW synchronous_commit");
    let mut cols: Vec<Column> = (0..3).map(|_| Column::default()).collect();
    let mut direct = Vec::new();
    // Added latency at c=1, fsync = false, interleaved with the direct call.
    for r in 0..n.rounds {
        let mut plans = Vec::new();
        for t in &sets[0] {
            plans.push(Some(t.plans(client, 1, n.c1).await?));
        }
        for v in order(r, 4) {
            if v == 0 {
                let ns = batch(client, direct_plans(fake, 1, n.c1), DIRECT_DONE).await?;
                if r > 0 {
                    direct.push(pcts(ns));
                }
            } else {
                let p = plans[v - 1].take().expect("once");
                let (ns, _) = run_checked(client, &sets[0][v - 1], &mut cols[v - 1], p).await?;
                if r > 0 {
                    cols[v - 1].c1.push(pcts(ns));
                }
            }
        }
        log(
            opts,
            format!(
                "pg latency round {}/{} done; p50 / p99 µs: direct {:.0} / {:.0}, through {}",
                r + 1,
                n.rounds,
                direct.last().map_or(f64::NAN, |p| p.p50),
                direct.last().map_or(f64::NAN, |p| p.p99),
                cols.iter()
                    .map(|c| c
                        .c1
                        .last()
                        .map_or("-".into(), |p| format!("{:.0} / {:.0}", p.p50, p.p99)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    // Turns per second at c=32, fsync off and on.
    for (f, set) in sets.iter().enumerate() {
        for (i, t) in set.iter().enumerate() {
            let warm = t
                .plans(client, C32, 256.min(n.tput_turns).div_ceil(C32))
                .await?;
            run_checked(client, t, &mut cols[i], warm).await?;
        }
        for run in 0..n.tput_runs {
            for v in order(run, 3) {
                let t = &set[v];
                let p = t.plans(client, C32, n.tput_turns.div_ceil(C32)).await?;
                let (_, rate) = run_checked(client, t, &mut cols[v], p).await?;
                cols[v].tput[f].push(rate);
            }
            log(
                opts,
                format!(
                    "pg throughput fsync={} run {}: {:.0} / {:.0} / {:.0} turns/s",
                    f == 1,
                    run + 1,
                    cols[0].tput[f].last().unwrap_or(&f64::NAN),
                    cols[1].tput[f].last().unwrap_or(&f64::NAN),
                    cols[2].tput[f].last().unwrap_or(&f64::NAN)
                ),
            );
        }
    }
    for set in sets {
        for t in set {
            t.stop().await;
        }
    }
    let names = [
        "SQLite",
        "PostgreSQL, one instance",
        "PostgreSQL, two instances",
    ];
    Ok(PgFigures {
        direct,
        columns: names.into_iter().zip(cols).collect(),
        sync_commit,
        load: (load0, loadavg()),
        secs: started.elapsed().as_secs_f64(),
    })
}

/// The median of the runs' rates, and their range.
fn rate_cell(runs: &[f64]) -> String {
    let lo = runs.iter().copied().fold(f64::NAN, f64::min);
    format!("{:.0}/s ({lo:.0}–{:.0})", median(runs), max(runs))
}

impl PgFigures {
    /// The three stores side by side, as Markdown, with what was set and seen.
    pub(super) fn table(&self) -> String {
        let direct = med(&self.direct);
        let us = |x: f64| format!("{x:.0} µs");
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let each = |f: &dyn Fn(&Column) -> String| -> Vec<String> {
            self.columns.iter().map(|(_, c)| f(c)).collect()
        };
        rows.push((
            format!(
                "added latency p50, c=1 (direct {}; through)",
                us(direct.p50)
            ),
            each(&|c| {
                let m = med(&c.c1);
                format!("{} ({})", us(m.p50 - direct.p50), us(m.p50))
            }),
        ));
        rows.push((
            format!(
                "added latency p99, c=1 (direct {}; through)",
                us(direct.p99)
            ),
            each(&|c| {
                let m = med(&c.c1);
                format!("{} ({})", us(m.p99 - direct.p99), us(m.p99))
            }),
        ));
        rows.push((
            format!(
                "turns/s, c=32, `fsync = false` (PostgreSQL: `synchronous_commit = {}`)",
                self.sync_commit
            ),
            each(&|c| rate_cell(&c.tput[0])),
        ));
        rows.push((
            "turns/s, c=32, `fsync = true` (PostgreSQL: `synchronous_commit = on`, forced)".into(),
            each(&|c| rate_cell(&c.tput[1])),
        ));
        rows.push((
            "`409 session_busy` answers (retried 1 ms later)".into(),
            each(&|c| c.busy.to_string()),
        ));
        rows.push((
            "turns answered 200 / missing or wrong in the log".into(),
            each(&|c| format!("{} / {}", c.turns, c.problems.len())),
        ));
        let mut out = String::from("| figure |");
        for (name, _) in &self.columns {
            out.push_str(&format!(" {name} |"));
        }
        out.push_str("\n| --- |");
        out.push_str(&" --- |".repeat(self.columns.len()));
        out.push('\n');
        for (figure, values) in rows {
            out.push_str(&format!("| {figure} | {} |\n", values.join(" | ")));
        }
        out.push_str(&format!(
            "\nPostgreSQL: its own cluster (initdb, on this disk), `fsync = on`, `synchronous_commit = {}` for the cluster; turnstile's `fsync = true` sets `synchronous_commit = on` on its connections. Two instances: both in this process, one database, sessions created on either and each turn sent to the other instance than the one before. Load average {} before, {} after; {:.0} s.\n",
            self.sync_commit, self.load.0, self.load.1, self.secs
        ));
        let problems: Vec<&String> = self.columns.iter().flat_map(|(_, c)| &c.problems).collect();
        for p in problems.iter().take(10) {
            out.push_str(&format!("\nLOG PROBLEM: {p}"));
        }
        if problems.len() > 10 {
            out.push_str(&format!("\n... and {} more", problems.len() - 10));
        }
        out
    }

    /// Its figures for the JSON line (`pg_<figure>_<sqlite|pg1|pg2>`).
    pub(super) fn json(this: Option<&PgFigures>, j: &mut serde_json::Map<String, Value>) {
        let keys = ["sqlite", "pg1", "pg2"];
        let round = |v: f64| json!((v * 10.0).round() / 10.0);
        for (i, key) in keys.iter().enumerate() {
            let col = this.map(|f| (med(&f.direct), &f.columns[i].1));
            let fig = |g: &dyn Fn(Pcts, &Column) -> f64| col.map_or(f64::NAN, |(d, c)| g(d, c));
            j.insert(
                format!("pg_added_p50_us_{key}"),
                round(fig(&|d, c| med(&c.c1).p50 - d.p50)),
            );
            j.insert(
                format!("pg_added_p99_us_{key}"),
                round(fig(&|d, c| med(&c.c1).p99 - d.p99)),
            );
            j.insert(
                format!("pg_turns_per_s_{key}"),
                round(fig(&|_, c| median(&c.tput[0]))),
            );
            j.insert(
                format!("pg_turns_per_s_fsync_{key}"),
                round(fig(&|_, c| median(&c.tput[1]))),
            );
            j.insert(
                format!("pg_log_problems_{key}"),
                json!(col.map(|(_, c)| c.problems.len())),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Failover

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
        let mut proc = std::process::Command::new(exe)
            .arg("--serve")
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} --serve", exe.display()))?;
        let stdout = proc.stdout.take().expect("piped");
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
            .ok_or_else(|| anyhow!("the server child said {line:?}"))?;
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

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
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
