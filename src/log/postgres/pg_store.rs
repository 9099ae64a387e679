//! The PostgreSQL backend's handle and what its parts share: the pool, the group-commit
//! queue, this instance's leases and deltas, and the store's own runtime.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::AtomicBool;
#[cfg(any(test, feature = "testkit"))]
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use super::delta_state::Deltas;
use super::heard::Heard;
use crate::log::group::GroupCommit;
use crate::log::StoreError;

/// The channel commits notify on: payload `<session id> <last committed seq>`.
pub(crate) const EVENTS_CHANNEL: &str = "turnstile_events";

/// Connections in the pool (the writer's and readers').
pub(super) const POOL_SIZE: usize = 16;

/// The PostgreSQL backend; cheap to clone.
#[derive(Clone)]
pub(crate) struct PgStore {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    /// The queue, its tickets, the watermark and the failed commits (`log/group.rs`).
    pub(super) group: GroupCommit,
    /// The leader's lock, holding every ticket up to which a commit has been tried.
    pub(super) writer: tokio::sync::Mutex<u64>,
    /// Whether the last commit failed (`/readyz`).
    pub(super) last_failed: AtomicBool,
    pub(super) pool: Pool,
    /// This instance's name in lease rows (`inst_…`, new at every start).
    pub(super) instance: String,
    /// This process's mark on the inbox rows it holds in its queues (`boot_…`, new at every
    /// start, unlike `instance`, which a restarted instance keeps).
    pub(super) boot: std::sync::Arc<str>,
    /// `[store] lease_s`.
    pub(super) lease: Duration,
    /// The sessions whose lease this instance holds (renewed by `lease::renew_loop`), each with
    /// the mark of its last take (see `PgStore::release_lease`).
    pub(super) held: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Sessions whose lease was newly taken and not yet read back by the engine
    /// (`PgStore::lease_read_back`).
    pub(super) unread: std::sync::Mutex<HashSet<String>>,
    /// Takes and releases of leases, one at a time: a release decided before a take (of the
    /// same session) that comes first sees the take's mark and does not happen.
    pub(super) lease_ops: tokio::sync::Mutex<u64>,
    /// Sessions with a claim under way (a lease taken for a turn not started yet), and how
    /// many: their lease is not released meanwhile.
    pub(super) claiming: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    /// What the listener hears (`lease::listen_loop`).
    pub(super) heard: tokio::sync::broadcast::Sender<Heard>,
    /// Deltas to and from other instances, and who watches what (`deltas.rs`).
    pub(super) deltas: Arc<Deltas>,
    /// Replies to the requests this instance relayed (`applied.rs`).
    pub(super) replies: super::heard::Replies,
    /// Testing only: commits to fail, commits counted.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) faults: Faults,
    /// Last: the runtime goes once nothing above needs it.
    pub(super) rt: Rt,
}

impl Shared {
    /// A new store's state: nothing queued, held or watched yet.
    pub(super) fn new(
        pool: Pool,
        instance: Option<String>,
        lease: Duration,
        heard: tokio::sync::broadcast::Sender<Heard>,
        rt: Rt,
    ) -> Shared {
        Shared {
            group: GroupCommit::default(),
            writer: tokio::sync::Mutex::new(0),
            last_failed: AtomicBool::new(false),
            pool,
            instance: instance.unwrap_or_else(|| crate::ids::new("inst")),
            boot: crate::ids::new("boot").into(),
            lease,
            held: Default::default(),
            unread: Default::default(),
            lease_ops: Default::default(),
            claiming: Default::default(),
            heard,
            deltas: Default::default(),
            replies: Default::default(),
            #[cfg(any(test, feature = "testkit"))]
            faults: Faults::default(),
            rt,
        }
    }
}

/// The store's own runtime, shut down without waiting when the store is dropped (which may
/// happen on an async thread, where a runtime cannot be dropped the blocking way).
pub(super) struct Rt(pub(super) Option<tokio::runtime::Runtime>);

impl Rt {
    #[expect(clippy::expect_used, reason = "taken only by Drop")]
    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime until dropped").handle()
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Test hooks: how many of the next commits fail, and the commits that wrote something.
#[cfg(any(test, feature = "testkit"))]
#[derive(Default)]
pub(crate) struct Faults {
    pub(crate) fail_next: std::sync::atomic::AtomicU32,
    pub(crate) commits: std::sync::atomic::AtomicU64,
}

/// Runs `fut` on the store's runtime and blocks this thread for its output.
pub(super) fn block_on<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| StoreError::WriteFailed("the store's task ended early".into()))?
}

/// Testing: the hooks `Store::commits` and `Store::fail_commits` dispatch to.
#[cfg(any(test, feature = "testkit"))]
impl PgStore {
    pub(crate) fn commits(&self) -> u64 {
        self.shared.faults.commits.load(Ordering::Relaxed)
    }

    pub(crate) fn fail_commits(&self, n: u32) {
        self.shared.faults.fail_next.store(n, Ordering::Relaxed);
    }
}

impl PgStore {
    /// Runs `f` with the pool on the store's runtime.
    pub(super) async fn run<T, Fut>(&self, f: impl FnOnce(Pool) -> Fut) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let fut = f(self.shared.pool.clone());
        self.shared
            .rt
            .handle()
            .spawn(fut)
            .await
            .map_err(|e| StoreError::Postgres(format!("store task failed: {e}")))?
    }
}
