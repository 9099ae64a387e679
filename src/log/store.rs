//! [`Store`]: the handle to the event log, the session table and file records that the rest of
//! the crate holds. It names no backend in its methods; it dispatches each call to the backend
//! it was opened with (`StoreBackend`, documented in `backend.rs`: the model, the
//! invariants, which calls block, the errors).
//!
//! Dispatch is by enum, not `Box<dyn>`: the write path (`append`, then `flush`) runs a few
//! times per event, and a `match` on a closed set of backends is a predictable branch the
//! compiler can inline through (with one backend it is no branch at all), where a trait object
//! would cost an indirect call per write and could not hold the backends' `async fn`s (their
//! futures are unnamed types; `dyn` would box each one). Generic `Store<B>` would have threaded
//! a type parameter through the engine, the protocols and the app for the same code.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::backend::{FileRow, SessionRow, StoreBackend, StoreError};
use super::event::Event;
use super::postgres::lease::{ClaimGuard, Heard, LeaseTaken};
use super::postgres::PgStore;
use super::sqlite::SqliteStore;

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(in crate::log) backend: Backend,
}

/// The backends a [`Store`] can be opened with.
#[derive(Clone)]
pub(in crate::log) enum Backend {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl From<SqliteStore> for Store {
    fn from(s: SqliteStore) -> Store {
        Store {
            backend: Backend::Sqlite(s),
        }
    }
}

/// Runs `$call` on the backend (bound to `$b`): one arm per backend.
macro_rules! on_backend {
    ($self:ident, $b:ident => $call:expr) => {
        match &$self.backend {
            Backend::Sqlite($b) => $call,
            Backend::Postgres($b) => $call,
        }
    };
}

impl Store {
    /// Open the embedded (SQLite) store: `dir/turnstile.db`, created if needed, migrated if
    /// older. With `fsync`, every commit is synced to disk.
    pub fn open(dir: &Path, fsync: bool) -> Result<Store, StoreError> {
        SqliteStore::open(dir, fsync).map(Store::from)
    }

    /// Open the shared (PostgreSQL) store at the connection string `url`, migrating its schema
    /// (refusing one newer than this build knows). With `fsync`, `synchronous_commit = on`.
    /// Leases of sessions last `lease` unless renewed; `instance` names this instance in them
    /// (kept across restarts, it lets a restarted instance close what it left at once; `None`:
    /// a new name).
    pub fn open_postgres(
        url: &str,
        fsync: bool,
        lease: std::time::Duration,
        instance: Option<String>,
    ) -> Result<Store, StoreError> {
        PgStore::open(url, fsync, lease, instance).map(|s| Store {
            backend: Backend::Postgres(s),
        })
    }

    /// Scale-out: take (or keep) the lease of a session, so that this instance is its one
    /// writer. The embedded store has one process: always held, never fresh.
    pub async fn take_lease(&self, session_id: &str) -> Result<LeaseTaken, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(LeaseTaken::Held { fresh: false }),
            Backend::Postgres(p) => p.take_lease(session_id).await,
        }
    }

    /// Scale-out: the mark of this instance's last take of a session's lease (`None`: not
    /// held, or the embedded store), for [`Store::release_lease`].
    pub fn lease_mark(&self, session_id: &str) -> Option<u64> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => p.lease_mark(session_id),
        }
    }

    /// Scale-out: a claim of the session's lease is under way until the guard is dropped
    /// (`None` on the embedded store).
    pub fn claiming(&self, session_id: &str) -> Option<ClaimGuard> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.claiming(session_id)),
        }
    }

    /// The shared store's size in bytes (PostgreSQL's `pg_database_size`; `None` when it cannot
    /// be read). The embedded store: `None`, its size is that of its files under `data_dir`.
    pub async fn database_bytes(&self) -> Option<u64> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => p.database_bytes().await.ok(),
        }
    }

    /// Scale-out: the sessions whose lease this instance holds.
    pub fn held_leases(&self) -> Vec<String> {
        match &self.backend {
            Backend::Sqlite(_) => Vec::new(),
            Backend::Postgres(p) => p.held_leases(),
        }
    }

    /// Scale-out: hand a session's lease back, unless it was taken again since `mark`
    /// ([`Store::lease_mark`]) was read.
    pub async fn release_lease(&self, session_id: &str, mark: u64) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.release_lease(session_id, mark).await,
        }
    }

    /// Scale-out: hand back every lease of this instance (at shutdown).
    pub async fn release_all_leases(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.release_all_leases().await,
        }
    }

    /// Scale-out: sessions whose lease expired (their instance died); none on SQLite.
    pub async fn expired_leases(&self) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Vec::new()),
            Backend::Postgres(p) => p.expired_leases().await,
        }
    }

    /// Scale-out: the commits of every instance sharing the store, as the listener hears them;
    /// `None` for a store no other process writes.
    pub fn commits_heard(&self) -> Option<tokio::sync::broadcast::Receiver<Heard>> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.commits_heard()),
        }
    }

    /// Scale-out: this instance's name in the lease rows (`None` on SQLite).
    pub fn instance(&self) -> Option<&str> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.instance()),
        }
    }

    /// Queue an event for the next commit; its ticket (see [`Store::committed`]).
    #[inline]
    pub fn append(&self, session_id: &Arc<str>, ev: &Event) -> u64 {
        on_backend!(self, b => b.append(session_id, ev))
    }

    /// Queue an insert or replacement of a session row; returns its ticket (see
    /// [`Store::committed`]).
    #[inline]
    pub fn put_session(&self, row: SessionRow) -> u64 {
        on_backend!(self, b => b.put_session(row))
    }

    /// Queue the removal of a session and all its events.
    #[inline]
    pub fn delete_session(&self, id: &str) {
        on_backend!(self, b => b.delete_session(id));
    }

    /// Queue a file's metadata.
    #[inline]
    pub fn put_file(&self, row: FileRow) {
        on_backend!(self, b => b.put_file(row));
    }

    /// Queue the removal of a file's metadata.
    #[inline]
    pub fn delete_file(&self, id: &str) {
        on_backend!(self, b => b.delete_file(id));
    }

    /// Returns once everything queued before the call is committed (group commit: one
    /// transaction for everything queued; a commit under way is waited for asleep).
    pub async fn flush(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.flush().await)
    }

    /// [`Store::flush`] on the calling thread: blocks it for a whole commit.
    #[inline]
    pub fn commit(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.commit())
    }

    /// Every write whose ticket is at most this has been through a commit.
    #[inline]
    pub fn committed(&self) -> u64 {
        on_backend!(self, b => b.committed())
    }

    /// Whether the commit that took this ticket failed: the write is not in the log, though
    /// [`Store::committed`] has passed it. Known for the last 64 failed commits.
    #[inline]
    pub fn failed(&self, ticket: u64) -> bool {
        on_backend!(self, b => b.failed(ticket))
    }

    /// Whether the store can be written now (`/readyz`). Blocks while a commit is under way;
    /// call it off the async threads.
    pub fn probe_writable(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.probe_writable())
    }

    /// A session's events with `seq > after_seq`, at most `limit`, in order.
    pub async fn events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        on_backend!(self, b => b.events(session_id, after_seq, limit).await)
    }

    /// The `seq` of the event with this id in this session.
    pub async fn seq_of(
        &self,
        session_id: &str,
        event_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        on_backend!(self, b => b.seq_of(session_id, event_id).await)
    }

    /// Sessions whose last event is not a terminal one: turns that were running when the
    /// process stopped.
    pub async fn unfinished_sessions(&self) -> Result<Vec<String>, StoreError> {
        on_backend!(self, b => b.unfinished_sessions().await)
    }

    /// For each session, whether its last turn stopped for the client (its last event is a
    /// `turn.completed` with `stop_reason: tool_use`).
    pub async fn awaiting_client(&self, ids: Vec<String>) -> Result<Vec<bool>, StoreError> {
        on_backend!(self, b => b.awaiting_client(ids).await)
    }

    /// One session row.
    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        on_backend!(self, b => b.session(id).await)
    }

    /// Sessions in creation order after `after` (exclusive), at most `limit`, for one owner.
    pub async fn list_sessions(
        &self,
        owner: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        on_backend!(self, b => b.list_sessions(owner, after, limit).await)
    }

    /// How many sessions an owner has (`None`: the sessions of a server without keys).
    pub async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        on_backend!(self, b => b.count_sessions(owner).await)
    }

    /// A file's metadata.
    pub async fn file(&self, id: &str) -> Result<Option<FileRow>, StoreError> {
        on_backend!(self, b => b.file(id).await)
    }

    /// Bytes of the stored files of this owner (`None`: files made without an API key).
    pub async fn file_bytes_of(&self, owner: Option<String>) -> Result<u64, StoreError> {
        on_backend!(self, b => b.file_bytes_of(owner).await)
    }

    /// Whether a file record names the blob with this SHA-256.
    pub async fn blob_in_use(&self, sha256: &str) -> Result<bool, StoreError> {
        on_backend!(self, b => b.blob_in_use(sha256).await)
    }

    /// The ids of the files a session's log references: attached to its user messages or
    /// delivered in its tool results, in order of first mention.
    pub async fn session_file_ids(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        on_backend!(self, b => b.session_file_ids(session_id).await)
    }

    /// Which of these file ids a stored user message or tool result (of any session) references.
    pub async fn files_referenced(&self, ids: Vec<String>) -> Result<HashSet<String>, StoreError> {
        on_backend!(self, b => b.files_referenced(ids).await)
    }
}
