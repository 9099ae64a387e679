//! Chaos: three real instances on one PostgreSQL behind a round-robin client, while an agitator
//! `kill -9`s and restarts instances, SIGTERMs them and restarts PostgreSQL, at seeded random
//! times. Clients make AAP turns (`none`, `delta`, `message`), turns that run a trusted MCP tool,
//! turns that stop on an `ask` tool answered through another instance, messages queued through
//! the events API, and read event streams. Afterwards every session's log passes the log
//! checker, every request answered `2xx` is in its log and ended (completed, or with a stated
//! reason), and no tool call ran twice (the MCP servers log each call they get; each call's
//! arguments are unique).
//!
//! Short form (CI): `cargo test --test all store::chaos -- --nocapture` (20 s of chaos).
//! Long form: `CHAOS_SECS=600 cargo test --release --test all store::chaos -- --nocapture`.
//! `CHAOS_SEED=<n>` replays a seed's schedule of faults and requests (the seed is printed; the
//! timing of processes still varies from run to run); `CHAOS_FAULTS=kill9,sigterm,pg_restart`
//! picks the kinds of fault (PostgreSQL restarts only when named: see [`fault_kinds`]).

mod agitator;
mod audit;
mod clients;
mod cluster;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use turnstile::log::Store;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

use crate::common::mcp::example_server;
use crate::common::postgres::PgCluster;
use crate::common::{config_text, logcheck::check_events};

/// `[store] lease_s`: a killed instance's sessions are taken over within 1.5 times this.
const LEASE_S: u64 = 2;
const INSTANCES: usize = 3;
const CLIENTS: usize = 4;
/// How long the logs may take to come to rest after the chaos.
const REST_WAIT: Duration = Duration::from_secs(30);

/// xorshift64*: a small seeded generator, so that a seed replays the same decisions.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A generator of its own, for another task.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

/// The kinds of fault to inject: `CHAOS_FAULTS` (a comma-separated list of `kill9`, `sigterm`
/// and `pg_restart`), else `kill9` and `sigterm`. PostgreSQL restarts are asked for by name:
/// each takes seconds of CI's 20 s short form; the ten-minute form with them is in the README.
fn fault_kinds() -> Vec<agitator::Kind> {
    let Ok(names) = std::env::var("CHAOS_FAULTS") else {
        return agitator::Kind::ALL
            .into_iter()
            .filter(|k| k.name() != "pg_restart")
            .collect();
    };
    names
        .split(',')
        .map(|n| {
            let found = agitator::Kind::ALL
                .into_iter()
                .find(|k| k.name() == n.trim());
            found.unwrap_or_else(|| {
                panic!("CHAOS_FAULTS: {n:?} is none of kill9, sigterm, pg_restart")
            })
        })
        .collect()
}

/// The model: `mcp [[tag]]` calls the trusted tool, `ask [[tag]]` the one that asks, each with
/// the tag as its argument and in its call id; after a tool's result it concludes; anything
/// else gets a text, streamed slowly enough for faults to cut turns midway.
fn model() -> Reply {
    Reply::by_request(|req| {
        let last = req["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "tool" {
            return Reply::text("Done with the tool.");
        }
        let text = last["content"].to_string();
        let tag = text
            .split("[[")
            .nth(1)
            .and_then(|r| r.split("]]").next())
            .unwrap_or("untagged")
            .to_string();
        let call = |kind: &str, tool: &str| {
            Reply::tool_calls(&[(&format!("call_{kind}_{tag}"), tool, json!({"text": tag}))])
        };
        if text.contains("mcp [[") {
            call("mcp", "mcp__ex__echo")
        } else if text.contains("ask [[") {
            call("ask", "mcp__gate__echo")
        } else {
            Reply::text(&format!(
                "An answer to {tag}, told slowly enough to be cut."
            ))
        }
    })
    .pace(Duration::from_millis(4))
}

/// Each instance's `tools.toml`: the fake model, the example MCP server twice (`ex` trusted,
/// `gate` asked), both logging their calls to `calls`, a 1 s drain, and `store`.
fn config(fake: &FakeOpenAi, calls: &Path, store: &str) -> String {
    let log = format!(
        "args = [\"--log-calls\", {:?}]",
        calls.display().to_string()
    );
    let extra = format!(
        "{}{}\n[policy]\ntrust = [\"mcp__ex__*\"]\nask = [\"mcp__gate__*\"]\n",
        example_server("ex", &log),
        example_server("gate", &log)
    );
    let text = config_text(fake, &extra).replace("[server]\n", "[server]\ndrain_s = 1\n");
    format!("{text}{store}")
}

/// The last WARN and ERROR lines of each instance's log, for a failure's message.
fn instance_logs(cluster: &cluster::Cluster) -> String {
    let mut out = String::new();
    for i in 0..cluster.len() {
        let text = std::fs::read_to_string(cluster.dir(i).join("log.txt")).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.starts_with("---"))
            .collect();
        out.push_str(&format!("--- instance {i}:\n"));
        for l in &lines[lines.len().saturating_sub(30)..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// For a failed run: each instance's whole log, the MCP servers' calls, the database's `inbox`
/// and `leases` rows and the events of `sessions` (one `<session>.jsonl` each), kept under
/// `target/chaos-<seed>/`; where, with the rows.
fn keep_evidence<'a>(
    cluster: &cluster::Cluster,
    pg: &PgCluster,
    url: &str,
    seed: u64,
    sessions: impl Iterator<Item = (&'a str, &'a Vec<turnstile::log::Event>)>,
) -> String {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join(format!("chaos-{seed}"));
    let _ = std::fs::create_dir_all(&dir);
    for i in 0..cluster.len() {
        let _ = std::fs::copy(
            cluster.dir(i).join("log.txt"),
            dir.join(format!("instance{i}.log")),
        );
    }
    let _ = std::fs::copy(cluster.dir(0).join("calls.txt"), dir.join("calls.txt"));
    for (sid, events) in sessions {
        let lines: Vec<&str> = events.iter().map(|e| &*e.json).collect();
        let _ = std::fs::write(dir.join(format!("{sid}.jsonl")), lines.join("\n"));
    }
    let db = url.rsplit('/').next().unwrap();
    let rows = format!(
        "inbox (seq|session|kind|turn|taken):\n{}\nleases (session|holder|expires):\n{}",
        pg.psql(
            db,
            "SELECT seq, session_id, kind, turn_id, taken FROM inbox ORDER BY seq"
        ),
        pg.psql(db, "SELECT * FROM leases"),
    );
    let _ = std::fs::write(dir.join("db.txt"), &rows);
    format!(
        "{rows}\nlogs kept in {}\n{}",
        dir.display(),
        instance_logs(cluster)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_nothing_accepted_is_lost_and_no_tool_runs_twice() {
    let started = Instant::now();
    let seed = env_u64("CHAOS_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        t.unwrap().as_nanos() as u64
    });
    let secs = env_u64("CHAOS_SECS").unwrap_or(20).max(4);
    println!("chaos: seed {seed} (CHAOS_SEED={seed} replays it), {secs} s of faults and load");
    let pg = Arc::new(PgCluster::start());
    let fake = FakeOpenAi::start().await;
    fake.record_requests(false);
    fake.set_fallback(model());
    let work = tempfile::tempdir().unwrap();
    let calls = work.path().join("calls.txt");
    let (table, url) = pg.store_table_and_url(&format!("lease_s = {LEASE_S}"));
    let cluster = Arc::new(cluster::Cluster::new(
        &config(&fake, &calls, &table),
        INSTANCES,
    ));
    let mut children = Vec::new();
    for i in 0..INSTANCES {
        children.push(cluster.start(i).await.0);
    }

    let until = Instant::now() + Duration::from_secs(secs);
    // The last faults leave the clients a few seconds to see the instances back.
    let faults_until = until - Duration::from_secs(3);
    let sessions = Arc::new(Mutex::new(Vec::new()));
    let mut rng = Rng::new(seed);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let run = clients::run(c, cluster.clone(), rng.fork(), until, sessions.clone());
            tokio::spawn(run)
        })
        .collect();
    let watcher = tokio::spawn(watch::run(
        cluster.clone(),
        sessions.clone(),
        rng.fork(),
        until,
    ));
    let agitator = {
        let (cluster, pg, rng, kinds) = (cluster.clone(), pg.clone(), rng.fork(), fault_kinds());
        async move { agitator::run(cluster, pg, children, rng, faults_until, &kinds).await }
    };
    let (faults, children) = tokio::spawn(agitator).await.unwrap();
    let mut tallies = Vec::new();
    for c in clients {
        tallies.push(c.await.unwrap());
    }
    let watched = watcher.await.unwrap();
    let chaos_took = started.elapsed();

    let sessions: Vec<String> = tallies.iter().flat_map(|t| t.sessions.clone()).collect();
    let accepted: Vec<clients::Accepted> =
        tallies.iter().flat_map(|t| t.accepted.clone()).collect();
    let store = Store::open_postgres(&url, false, Duration::from_secs(LEASE_S), None).unwrap();
    let rest_from = Instant::now();
    let (logs, at_rest) = audit::wait_for_rest(&store, &sessions, &accepted, REST_WAIT).await;
    let rest_took = rest_from.elapsed();
    // The log checker on every session; a failure (its message printed above) is reported
    // with the rest.
    let unchecked: Vec<&String> = logs
        .iter()
        .filter(|(_, events)| std::panic::catch_unwind(|| check_events(events)).is_err())
        .map(|(sid, _)| sid)
        .collect();
    let turns: HashMap<String, Vec<audit::Turn>> = logs
        .iter()
        .map(|(s, e)| (s.clone(), audit::turns(e)))
        .collect();
    let acc = audit::account(&accepted, &turns);
    let (executed, twice) = audit::executions(&calls);
    let (recovery, unrecovered) = audit::recovery(&faults, &cluster.successes());

    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(f.kind.name()).or_default() += 1;
    }
    let mut refused: BTreeMap<u16, u64> = BTreeMap::new();
    for t in &tallies {
        for (s, n) in &t.refused {
            *refused.entry(*s).or_default() += n;
        }
    }
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &accepted {
        *kinds.entry(a.kind).or_default() += 1;
    }
    let unanswered: usize = tallies.iter().map(|t| t.unanswered.len()).sum();
    let troubles: Vec<String> = faults
        .iter()
        .filter_map(|f| f.trouble.as_ref().map(|t| format!("{:?}{t}", f.slot)))
        .collect();
    let ms = |d: Duration| d.as_millis() as u64;
    let report = json!({
        "seed": seed,
        "secs": secs,
        "took_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "requests": tallies.iter().map(|t| t.requests).sum::<u64>() + watched.streams,
        "http_attempts": cluster.attempts.load(std::sync::atomic::Ordering::Relaxed),
        "accepted": accepted.len(),
        "accepted_by_kind": kinds,
        "refused_by_status": refused.iter().map(|(s, n)| (s.to_string(), *n)).collect::<BTreeMap<_, _>>(),
        "unanswered": unanswered,
        "errors_5xx": tallies.iter().flat_map(|t| t.errors.clone()).collect::<Vec<_>>(),
        "faults": faults.len(),
        "faults_by_kind": by_kind,
        "lost": acc.lost.len(),
        "unended": acc.unended.len(),
        "ends": acc.ends,
        "tool_executions": executed,
        "duplicated": twice.len(),
        "recovery_p50_ms": ms(audit::percentile(&recovery, 0.5)),
        "recovery_p99_ms": ms(audit::percentile(&recovery, 0.99)),
        "recovery_max_ms": ms(recovery.last().copied().unwrap_or_default()),
        "unrecovered": unrecovered,
        "rest_ms": ms(rest_took),
        "streams_read": watched.streams,
        "stream_events": watched.events,
        "stream_regressions": watched.regressions.len(),
        "fault_troubles": troubles,
    });
    println!(
        "chaos report: seed {seed}, {secs} s ({:.1} s in all, {:.1} s of it load), {} requests ({} HTTP), {} accepted, {} faults {:?}, lost {}, duplicated {}, recovery p50 {} ms p99 {} ms",
        started.elapsed().as_secs_f64(),
        chaos_took.as_secs_f64(),
        report["requests"],
        report["http_attempts"],
        accepted.len(),
        faults.len(),
        by_kind,
        acc.lost.len(),
        twice.len(),
        report["recovery_p50_ms"],
        report["recovery_p99_ms"],
    );
    println!("CHAOS_REPORT {report}");
    for (what, list) in [
        ("lost", &acc.lost),
        ("unended", &acc.unended),
        ("run twice", &twice),
    ] {
        if !list.is_empty() {
            println!("chaos: {what}: {list:#?}");
        }
    }

    let failed = !acc.lost.is_empty()
        || !twice.is_empty()
        || !acc.unended.is_empty()
        || !at_rest
        || !unchecked.is_empty();
    let evidence = if failed {
        let all = logs.iter().map(|(sid, events)| (sid.as_str(), events));
        let _ = std::fs::copy(&calls, cluster.dir(0).join("calls.txt"));
        keep_evidence(&cluster, &pg, &url, seed, all)
    } else {
        String::new()
    };
    assert!(
        unchecked.is_empty(),
        "the log checker failed on {unchecked:?} (above)\n{evidence}"
    );
    assert!(
        acc.lost.is_empty(),
        "accepted and lost: {:#?}\n{evidence}",
        acc.lost
    );
    assert!(
        twice.is_empty(),
        "tool calls run twice: {twice:#?}\n{evidence}"
    );
    assert!(
        acc.unended.is_empty() && at_rest,
        "not at rest within {REST_WAIT:?}: {:#?}\n{evidence}",
        acc.unended,
    );
    assert!(watched.regressions.is_empty(), "{:#?}", watched.regressions);
    assert!(
        troubles.is_empty(),
        "{troubles:?}\n{}",
        instance_logs(&cluster)
    );
    assert!(!faults.is_empty() && !accepted.is_empty(), "{report}");
    drop(children);
}
