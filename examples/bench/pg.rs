//! The PostgreSQL figures of `--store postgres` (section `pg`); `--only failover` is in
//! `failover.rs`.
//!
//! Both sections start their own PostgreSQL cluster the way the tests do (`tests/common/postgres.rs`,
//! included here: `initdb` + `pg_ctl` into a temporary folder on a free port, as the `postgres`
//! user through `runuser` when running as root), on the machine's disk, with the server's own
//! `fsync = on` and `synchronous_commit = off` (the counterpart of turnstile's `fsync = false` on
//! SQLite: a commit does not wait for the WAL to reach the disk; a crash of PostgreSQL itself may
//! lose the last few hundred milliseconds, never consistency). turnstile's `[server] fsync =
//! true` forces `synchronous_commit = on` on its connections, the counterpart of SQLite's fsync.
//!
//! The same turns as the latency and throughput sections (no tools, stream none, a
//! fresh session every [`TURNS_PER_SESSION`] turns) on SQLite, PostgreSQL with one instance and
//! PostgreSQL with two instances (both in this process, each with its own data folder, on one
//! database): sessions created on either, each turn sent to the other instance than the turn
//! before. Added latency at c=1 against the direct call (interleaved rounds), turns/s at c=32
//! with `fsync` off and on. A `409 session_busy` is retried (1 ms later) and counted. After each
//! batch every session's log is read back (from the second instance on two) and every turn
//! must be there: one `user.message` and one `turn.completed` each, nothing failed.

// The same file is `common::postgres` in `tests/ops/bench_smoke.rs`, which includes this one too.
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/common/postgres.rs"]
mod cluster;

use std::collections::HashMap;

use super::*;
pub(super) use cluster::{vars, PgCluster};

/// The sections of this file: not part of a run without `--only` (they need PostgreSQL).
pub(super) const OPT_IN: &[&str] = &["pg", "failover"];

/// The cluster's settings (on top of `tests/common/postgres.rs`'s defaults).
const CLUSTER_OPTIONS: &[&str] = &["-c", "synchronous_commit=off", "-c", "max_connections=300"];

pub(super) fn start_cluster() -> Result<PgCluster> {
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

/// The largest of `v` (NaN when empty).
pub(super) fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}
