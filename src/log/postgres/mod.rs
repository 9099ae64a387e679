//! The PostgreSQL store backend (`[store] backend = "postgres"`): the event log, the session
//! table and file records in a database that several turnstile instances may share.
//!
//! - `schema.rs`: versioned migrations, run at start (a newer schema refuses to start).
//! - `commit.rs`: the group commit: the leader takes an async lock, writes everything queued
//!   (from every session) as one transaction sent in one round trip (pipelined), with a
//!   `pg_notify` per session inside it, so other instances hear of rows only once committed.
//! - `read.rs`: the reads (log by cursor, sessions, file records).
//! - `lease.rs`, `inbox.rs`: one writer per session (its lease), and the requests other
//!   instances leave for it.
//!
//! Durability: `COMMIT` is acknowledged per the server's `synchronous_commit` (PostgreSQL's
//! default `on`: the WAL is flushed, and synchronous standbys have it, before the watermark
//! moves). With `[server] fsync = true` every connection forces `synchronous_commit = on`
//! whatever the role or database says; otherwise the operator's setting stands (`off` trades
//! the last few hundred milliseconds of commits on a PostgreSQL crash, never consistency, for
//! latency). A turn costs one commit when its calls answer at once, so one WAL flush per group.
//!
//! All I/O runs on a small runtime of the store's own (two threads): its connections outlive
//! whichever runtime opened the store (a test's, the server's), and `commit` (blocking by
//! contract) can wait on it from any thread without starving the connection it waits for.
//!
//! - `deltas.rs`: streamed deltas to the instances that watch a session (`NOTIFY`).
//! - `files.rs`: stored files' bytes, chunked in the database, so any instance serves them.

mod commit;
pub(crate) mod deltas;
pub(crate) mod files;
pub(crate) mod inbox;
pub(crate) mod lease;
mod read;
mod schema;

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::backend::{FileRow, FileUsage, SessionRow, StoreBackend, StoreError};
use super::event::Event;
use super::group::GroupCommit;

/// The channel commits notify on: payload `<session id> <last committed seq>`.
pub(crate) const EVENTS_CHANNEL: &str = "turnstile_events";

/// Connections in the pool (the writer's and readers').
const POOL_SIZE: usize = 16;

/// The PostgreSQL backend; cheap to clone.
#[derive(Clone)]
pub(crate) struct PgStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// The queue, its tickets, the watermark and the failed commits (`log/group.rs`).
    group: GroupCommit,
    /// The leader's lock, holding every ticket up to which a commit has been tried.
    writer: tokio::sync::Mutex<u64>,
    /// Whether the last commit failed (`/readyz`).
    last_failed: AtomicBool,
    pool: Pool,
    /// This instance's name in lease rows (`inst_…`, new at every start).
    instance: String,
    /// `[store] lease_s`.
    lease: Duration,
    /// The sessions whose lease this instance holds (renewed by `lease::renew_loop`), each with
    /// the mark of its last take (see `PgStore::release_lease`).
    held: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Sessions whose lease was newly taken and not yet read back by the engine
    /// (`PgStore::lease_read_back`).
    unread: std::sync::Mutex<HashSet<String>>,
    /// Takes and releases of leases, one at a time: a release decided before a take (of the
    /// same session) that comes first sees the take's mark and does not happen.
    lease_ops: tokio::sync::Mutex<u64>,
    /// Sessions with a claim under way (a lease taken for a turn not started yet), and how
    /// many: their lease is not released meanwhile.
    claiming: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    /// What the listener hears (`lease::listen_loop`).
    heard: tokio::sync::broadcast::Sender<lease::Heard>,
    /// Deltas to and from other instances, and who watches what (`deltas.rs`).
    deltas: Arc<deltas::Deltas>,
    /// Testing only: commits to fail, commits counted.
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) faults: Faults,
    /// Last: the runtime goes once nothing above needs it.
    rt: Rt,
}

/// The store's own runtime, shut down without waiting when the store is dropped (which may
/// happen on an async thread, where a runtime cannot be dropped the blocking way).
struct Rt(Option<tokio::runtime::Runtime>);

impl Rt {
    fn handle(&self) -> &tokio::runtime::Handle {
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
fn block_on<T: Send + 'static>(
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

impl PgStore {
    /// Connect to the database at `url`, migrate it, and keep a pool; renew this instance's
    /// leases (of `lease`) and listen for commits. With `fsync`, every connection runs with
    /// `synchronous_commit = on`.
    pub(crate) fn open(
        url: &str,
        fsync: bool,
        lease: Duration,
        instance: Option<String>,
    ) -> Result<PgStore, StoreError> {
        let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::OpenPostgres(format!("the connection string does not parse: {e}"))
        })?;
        cfg.application_name("turnstile");
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(Duration::from_secs(10));
        }
        if fsync {
            cfg.options("-c synchronous_commit=on");
        }
        let listen_cfg = cfg.clone();
        let manager = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::OpenPostgres(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("turnstile-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::OpenPostgres(format!("cannot start its runtime: {e}")))?;
        let rt = Rt(Some(rt));
        let p = pool.clone();
        block_on(rt.handle(), async move {
            let mut client = p
                .get()
                .await
                .map_err(|e| StoreError::OpenPostgres(e.to_string()))?;
            schema::migrate(&mut client).await
        })?;
        let (heard, _) = tokio::sync::broadcast::channel(4096);
        let store = PgStore {
            shared: Arc::new(Shared {
                group: GroupCommit::default(),
                writer: tokio::sync::Mutex::new(0),
                last_failed: AtomicBool::new(false),
                pool,
                instance: instance.unwrap_or_else(|| crate::ids::new("inst")),
                lease,
                held: Default::default(),
                unread: Default::default(),
                lease_ops: Default::default(),
                claiming: Default::default(),
                heard: heard.clone(),
                deltas: Default::default(),
                #[cfg(any(test, feature = "testkit"))]
                faults: Faults::default(),
                rt,
            }),
        };
        let weak = Arc::downgrade(&store.shared);
        let handle = store.shared.rt.handle();
        handle.spawn(lease::renew_loop(weak.clone(), lease / 3));
        handle.spawn(lease::listen_loop(weak.clone(), listen_cfg, heard));
        let d = store.shared.deltas.clone();
        handle.spawn(deltas::send_loop(weak, d.clone(), lease / 3));
        block_on(handle, async move {
            d.until_listening(Duration::from_secs(5)).await;
            Ok(())
        })?;
        Ok(store)
    }
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
    async fn run<T, Fut>(&self, f: impl FnOnce(Pool) -> Fut) -> Result<T, StoreError>
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

impl StoreBackend for PgStore {
    fn queue(&self) -> &GroupCommit {
        &self.shared.group
    }

    async fn flush(&self) -> Result<(), StoreError> {
        let group = &self.shared.group;
        let target = group.last_queued();
        if group.committed() >= target {
            return group.outcome(target);
        }
        // On the store's runtime: a flush dropped midway never abandons a commit midway.
        let me = self.clone();
        self.shared
            .rt
            .handle()
            .spawn(async move { me.commit_to(target).await })
            .await
            .unwrap_or_else(|e| Err(StoreError::WriteFailed(format!("commit task failed: {e}"))))
    }

    fn commit(&self) -> Result<(), StoreError> {
        let target = self.shared.group.last_queued();
        if self.shared.group.committed() >= target {
            return self.shared.group.outcome(target);
        }
        let me = self.clone();
        block_on(self.shared.rt.handle(), async move {
            me.commit_to(target).await
        })
    }

    fn committed(&self) -> u64 {
        self.shared.group.committed()
    }

    fn failed(&self, ticket: u64) -> bool {
        self.shared.group.failure(ticket).is_some()
    }

    fn probe_writable(&self) -> Result<(), StoreError> {
        if self.shared.last_failed.load(Ordering::Acquire) {
            return Err(StoreError::WriteFailed(
                "the last commit to postgres failed".into(),
            ));
        }
        let pool = self.shared.pool.clone();
        block_on(self.shared.rt.handle(), async move {
            let c = pool.get().await?;
            let standby: bool = c.query_one("SELECT pg_is_in_recovery()", &[]).await?.get(0);
            if standby {
                return Err(StoreError::WriteFailed(
                    "the postgres server is a read-only standby".into(),
                ));
            }
            Ok(())
        })
    }

    async fn events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let sid = session_id.to_string();
        self.run(move |p| read::events(p, sid, after_seq, limit))
            .await
    }

    async fn seq_of(&self, session_id: &str, event_id: &str) -> Result<Option<u64>, StoreError> {
        let (sid, eid) = (session_id.to_string(), event_id.to_string());
        self.run(move |p| read::seq_of(p, sid, eid)).await
    }

    async fn last_turn_id(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let sid = session_id.to_string();
        self.run(move |p| read::last_turn_id(p, sid)).await
    }

    async fn unfinished_sessions(&self) -> Result<Vec<String>, StoreError> {
        let me = self.shared.instance.clone();
        self.run(move |p| read::unfinished_sessions(p, me)).await
    }

    async fn awaiting_client(&self, ids: Vec<String>) -> Result<Vec<bool>, StoreError> {
        self.run(move |p| read::awaiting_client(p, ids)).await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let id = id.to_string();
        self.run(move |p| read::session(p, id)).await
    }

    async fn list_sessions(
        &self,
        owner: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.run(move |p| read::list_sessions(p, owner, after.unwrap_or_default(), limit))
            .await
    }

    async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        self.run(move |p| read::count_sessions(p, owner)).await
    }

    async fn file(&self, id: &str) -> Result<Option<FileRow>, StoreError> {
        let id = id.to_string();
        self.run(move |p| read::file(p, id)).await
    }

    async fn file_usage_of(
        &self,
        owner: Option<String>,
        min_bytes: u64,
    ) -> Result<FileUsage, StoreError> {
        self.run(move |p| read::file_usage_of(p, owner, min_bytes))
            .await
    }

    async fn blob_in_use(&self, sha256: &str) -> Result<bool, StoreError> {
        let sha = sha256.to_string();
        self.run(move |p| read::blob_in_use(p, sha)).await
    }

    async fn session_file_ids(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let sid = session_id.to_string();
        self.run(move |p| read::session_file_ids(p, sid)).await
    }

    async fn files_referenced(&self, ids: Vec<String>) -> Result<HashSet<String>, StoreError> {
        self.run(move |p| read::files_referenced(p, ids)).await
    }
}
