//! The PostgreSQL store backend (`[store] backend = "postgres"`): the event log, the session
//! table and file records in a database that several turnstile instances may share.
//!
//! - `schema.rs`: versioned migrations, run at start (a newer schema refuses to start).
//! - `commit.rs`: the group commit: the leader takes an async lock, writes everything queued
//!   (from every session) as one transaction sent in one round trip (pipelined), with a
//!   `pg_notify` per session inside it, so other instances hear of rows only once committed;
//!   `commit_plan.rs` plans a batch's statements (the fence of the sessions' leases first).
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
//! - `file_chunks.rs`: stored files' bytes, chunked in the database, so any instance serves them.
//! - `idem_keys.rs`: `Idempotency-Key`s of AAP turn requests, reserved across instances.
//! - `applied.rs`: the holder's replies to the requests it applied from the inbox.

pub(crate) mod applied;
mod commit;
mod commit_plan;
mod delta_state;
pub(crate) mod deltas;
pub(crate) mod file_chunks;
mod heard;
mod idem_keys;
pub(crate) mod inbox;
pub(crate) mod lease;
mod pg_store;
mod read;
mod schema;
mod usage_rows;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use super::backend::{
    FileRow, FileUsage, KeyReserved, KeyRow, SessionRow, StoreBackend, StoreError,
};
use super::event::Event;
use super::group::GroupCommit;
use pg_store::{block_on, Rt, Shared, POOL_SIZE};

pub(crate) use pg_store::PgStore;

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
        let (pool, listen_cfg) = pool(url, fsync)?;
        let rt = runtime()?;
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
            shared: Arc::new(Shared::new(pool, instance, lease, heard.clone(), rt)),
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

/// The longest a new connection (or a check of a pooled one) may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// The longest a request waits for a free connection of the pool.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// A pool of connections to the database at `url` (not connected yet), and the settings the
/// listener connects with.
fn pool(url: &str, fsync: bool) -> Result<(Pool, tokio_postgres::Config), StoreError> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(|e| {
        StoreError::OpenPostgres(format!("the connection string does not parse: {e}"))
    })?;
    cfg.application_name("turnstile");
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(CONNECT_WITHIN);
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
    // Bounded waits: with the server down or unreachable, a request that needs a connection
    // fails within seconds (503 `store_unavailable`) rather than hanging to its client's
    // timeout; a connection the server dropped is replaced on the next `get`.
    let pool = Pool::builder(manager)
        .max_size(POOL_SIZE)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_WITHIN))
        .recycle_timeout(Some(CONNECT_WITHIN))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::OpenPostgres(e.to_string()))?;
    Ok((pool, listen_cfg))
}

/// The store's own runtime (two threads).
fn runtime() -> Result<Rt, StoreError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("turnstile-pg")
        .enable_all()
        .build()
        .map_err(|e| StoreError::OpenPostgres(format!("cannot start its runtime: {e}")))?;
    Ok(Rt(Some(rt)))
}

impl StoreBackend for PgStore {
    fn put_inbox_row(
        &self,
        session_id: &Arc<str>,
        turn_id: &str,
        kind: &'static str,
        body: String,
    ) -> u64 {
        self.queue().push(crate::log::backend::WriteOp::InboxPut {
            session_id: session_id.clone(),
            turn_id: turn_id.to_string(),
            kind,
            body,
            taken: Some(self.shared.boot.clone()),
        })
    }

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
        // Asked whether or not the last commit failed: after a failure (the server restarted,
        // unreachable for a while) the store is ready again as soon as the server is back,
        // with no commit needed to find out.
        let failed = self.shared.last_failed.load(Ordering::Acquire);
        let pool = self.shared.pool.clone();
        block_on(self.shared.rt.handle(), async move {
            let c = pool.get().await.map_err(|e| {
                let last = if failed {
                    "the last commit failed; "
                } else {
                    ""
                };
                StoreError::Unavailable(format!("{last}no connection to postgres: {e}"))
            })?;
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

    async fn open_turn_id(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let sid = session_id.to_string();
        self.run(move |p| read::open_turn_id(p, sid)).await
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
        owners: crate::log::Owners,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.run(move |p| read::list_sessions(p, owners, after.unwrap_or_default(), limit))
            .await
    }

    async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        self.run(move |p| read::count_sessions(p, owner)).await
    }

    async fn reserve_key(
        &self,
        row: KeyRow,
        not_before_ms: i64,
    ) -> Result<KeyReserved, StoreError> {
        self.run(move |p| idem_keys::reserve(p, row, not_before_ms))
            .await
    }

    async fn release_key(&self, row: KeyRow) -> Result<(), StoreError> {
        self.run(move |p| idem_keys::release(p, row)).await
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

    async fn usage(
        &self,
        filter: crate::log::UsageFilter,
    ) -> Result<Vec<crate::log::UsageRow>, StoreError> {
        self.run(move |p| usage_rows::read(p, filter)).await
    }
}
