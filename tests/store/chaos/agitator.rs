//! The agitator: at seeded random intervals, one fault at a time, `kill -9` an instance and
//! start it again, SIGTERM one and start it again once it has exited, or restart PostgreSQL
//! (`pg_ctl stop -m fast`, a pause, start again). One fault at a time: never more than one
//! instance down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::Child;

use super::cluster::Cluster;
use super::Rng;
use crate::common::postgres::PgCluster;

/// How long an instance sent SIGTERM may take to exit (its `drain_s` is 1).
const EXIT_WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Kill9,
    Sigterm,
    PgRestart,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Kill9, Kind::Sigterm, Kind::PgRestart];

    /// How often the agitator picks it, relatively.
    fn weight(self) -> u64 {
        match self {
            Kind::Kill9 => 45,
            Kind::Sigterm => 30,
            Kind::PgRestart => 25,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill9 => "kill9",
            Kind::Sigterm => "sigterm",
            Kind::PgRestart => "pg_restart",
        }
    }
}

/// A fault injected: its kind, the instance hit (and the generation it came back as), when.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: Kind,
    pub slot: Option<(usize, u64)>,
    pub at: Instant,
    /// When the instance listened again, or the database was back.
    pub back: Instant,
    /// What did not go as it should (an instance that did not exit on SIGTERM, or not with 0).
    pub trouble: Option<String>,
}

/// Injects faults until `until`; the faults, and the instances' processes (all running).
pub async fn run(
    cluster: Arc<Cluster>,
    pg: Arc<PgCluster>,
    mut children: Vec<Child>,
    mut rng: Rng,
    until: Instant,
    kinds: &[Kind],
) -> (Vec<Fault>, Vec<Child>) {
    let mut faults = Vec::new();
    let t0 = Instant::now();
    loop {
        let pause = rng.millis(600, 2200);
        if Instant::now() + pause >= until {
            return (faults, children);
        }
        tokio::time::sleep(pause).await;
        let mut roll = rng.below(kinds.iter().map(|k| k.weight()).sum());
        let i = rng.below(cluster.len() as u64) as usize;
        let kind = *kinds
            .iter()
            .find(|k| {
                let hit = roll < k.weight();
                roll = roll.saturating_sub(k.weight());
                hit
            })
            .unwrap();
        let fault = match kind {
            Kind::Kill9 => kill9(&cluster, &mut children[i], i).await,
            Kind::Sigterm => sigterm(&cluster, &mut children[i], i).await,
            Kind::PgRestart => pg_restart(&pg, rng.millis(200, 1500)).await,
        };
        eprintln!(
            "chaos: {:>6.2}s {} {:?}{}",
            (fault.at - t0).as_secs_f64(),
            fault.kind.name(),
            fault.slot,
            fault.trouble.as_deref().unwrap_or("")
        );
        faults.push(fault);
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    let pid = child.id().expect("a running instance") as libc::pid_t;
    // SAFETY: sends a signal to our own child process, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

async fn kill9(cluster: &Cluster, child: &mut Child, i: usize) -> Fault {
    let at = Instant::now();
    signal(child, libc::SIGKILL);
    let _ = child.wait().await;
    let (new, generation) = cluster.start(i).await;
    *child = new;
    Fault {
        kind: Kind::Kill9,
        slot: Some((i, generation)),
        at,
        back: Instant::now(),
        trouble: None,
    }
}

async fn sigterm(cluster: &Cluster, child: &mut Child, i: usize) -> Fault {
    let at = Instant::now();
    signal(child, libc::SIGTERM);
    let trouble = match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(Ok(status)) if status.success() => None,
        Ok(status) => Some(format!(" exited {status:?} on SIGTERM")),
        Err(_) => {
            signal(child, libc::SIGKILL);
            let _ = child.wait().await;
            Some(format!(" still running {EXIT_WAIT:?} after SIGTERM"))
        }
    };
    let (new, generation) = cluster.start(i).await;
    *child = new;
    Fault {
        kind: Kind::Sigterm,
        slot: Some((i, generation)),
        at,
        back: Instant::now(),
        trouble,
    }
}

async fn pg_restart(pg: &Arc<PgCluster>, down: Duration) -> Fault {
    let at = Instant::now();
    let stop = pg.clone();
    tokio::task::spawn_blocking(move || stop.stop_fast())
        .await
        .unwrap();
    tokio::time::sleep(down).await;
    let start = pg.clone();
    tokio::task::spawn_blocking(move || start.start_again())
        .await
        .unwrap();
    Fault {
        kind: Kind::PgRestart,
        slot: None,
        at,
        back: Instant::now(),
        trouble: None,
    }
}
