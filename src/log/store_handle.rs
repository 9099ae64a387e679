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

use super::backend::{
    FileRow, FileUsage, KeyReserved, KeyRow, SessionRow, StoreBackend, StoreError,
};
use super::event::Event;
use super::postgres::deltas::{DeltaTap, DeltaWatch};
use super::postgres::inbox::{InboxRow, Posted, Released};
use super::postgres::lease::{ClaimGuard, Heard, LeaseTaken};
use super::postgres::PgStore;
use super::sqlite::SqliteStore;

/// How long opening a stream waits for the database to note its watch of the session's deltas.
const WATCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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

    /// Scale-out: the session has been read back since its lease was newly taken. Nothing on
    /// the embedded store.
    pub fn lease_read_back(&self, session_id: &str) {
        if let Backend::Postgres(p) = &self.backend {
            p.lease_read_back(session_id);
        }
    }

    /// Scale-out: whether the session's lease was newly taken and the session not read back
    /// since ([`Store::lease_read_back`]); never on the embedded store.
    pub fn lease_unread(&self, session_id: &str) -> bool {
        match &self.backend {
            Backend::Sqlite(_) => false,
            Backend::Postgres(p) => p.lease_unread(session_id),
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

    /// Scale-out: the sessions whose lease this instance holds.
    pub fn held_leases(&self) -> Vec<String> {
        match &self.backend {
            Backend::Sqlite(_) => Vec::new(),
            Backend::Postgres(p) => p.held_leases(),
        }
    }

    /// Scale-out: hand a session's lease back, unless it was taken again since `mark`
    /// ([`Store::lease_mark`]) was read, or requests wait in its inbox.
    pub async fn release_lease(&self, session_id: &str, mark: u64) -> Result<Released, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Released::Yes),
            Backend::Postgres(p) => p.release_lease(session_id, mark).await,
        }
    }

    /// Scale-out: leave a request (`kind`: `message`, `cancel`, `interrupt`, `plan`) for the
    /// instance holding the session's lease, if another does (a `message` only while fewer
    /// than `max_messages` wait). The embedded store has no other instance: `NotHeld`.
    pub async fn post_inbox(
        &self,
        session_id: &str,
        kind: &'static str,
        body: String,
        turn_id: Option<String>,
        max_messages: usize,
    ) -> Result<Posted, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Posted::NotHeld),
            Backend::Postgres(p) => {
                p.post_inbox(session_id, kind, body, turn_id, max_messages)
                    .await
            }
        }
    }

    /// Scale-out: take, in order, the requests waiting for this instance (holding the lease)
    /// in the session's inbox, at most `room` messages; and whether some stay. `own_too`: the
    /// rows this process marked as its own too (see `postgres/inbox.rs`).
    pub async fn take_inbox(
        &self,
        session_id: &str,
        room: usize,
        own_too: bool,
    ) -> Result<(Vec<InboxRow>, bool), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok((Vec::new(), false)),
            Backend::Postgres(p) => p.take_inbox(session_id, room, own_too).await,
        }
    }

    /// Scale-out: say that these inbox rows (by seq) were applied, each with its outcome,
    /// to the instances that sent them (see `postgres/applied.rs`).
    pub async fn notify_applied(&self, replies: Vec<(i64, String)>) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.notify_applied(replies).await,
        }
    }

    /// Scale-out: the outcome the holder replied for the inbox row `seq` it applied; `None`
    /// if none comes `within`.
    pub async fn applied(&self, seq: i64, within: std::time::Duration) -> Option<String> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => p.applied(seq, within).await,
        }
    }

    /// Scale-out: the turns queued for a session on any instance, in the order they run
    /// (none on the embedded store: its queue is the engine's).
    pub async fn queued_turns(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Vec::new()),
            Backend::Postgres(p) => p.queued_turns(session_id).await,
        }
    }

    /// Scale-out: drop what waits in the inbox of a session that is gone.
    pub async fn drop_inbox(&self, session_id: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.drop_inbox(session_id).await,
        }
    }

    /// Scale-out: put rows taken by [`Store::take_inbox`] back in their places.
    pub async fn put_back_inbox(
        &self,
        session_id: &str,
        rows: Vec<InboxRow>,
    ) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(p) => p.put_back_inbox(session_id, rows).await,
        }
    }

    /// Scale-out: [`Store::release_lease`], if `idle` still holds when the release comes
    /// (checked in line with takes of leases, right before the lease goes).
    pub async fn release_lease_if(
        &self,
        session_id: &str,
        mark: u64,
        idle: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<Released, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Released::Yes),
            Backend::Postgres(p) => p.release_lease_if(session_id, mark, idle).await,
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

    /// Scale-out: a handle to send a session's streamed deltas to the other instances that
    /// watch it (`None` on SQLite).
    pub fn delta_tap(&self, session_id: &Arc<str>) -> Option<DeltaTap> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.delta_tap(session_id)),
        }
    }

    /// Scale-out: this instance has a live subscriber of the session, until the watch is
    /// dropped: the instance running its turns sends it their deltas. Returns once it will
    /// (`None` on SQLite, or when the database could not be told: the stored events still
    /// come, the deltas may not).
    pub async fn watch_deltas(&self, session_id: &str) -> Option<DeltaWatch> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            // A database that does not answer soon does not hold the stream up.
            Backend::Postgres(p) => {
                let asked = tokio::time::timeout(WATCH_WAIT, p.watch_deltas(session_id)).await;
                match asked {
                    Ok(Ok(w)) => Some(w),
                    Ok(Err(e)) => {
                        tracing::warn!(session = %session_id, error = %e, "could not ask for the deltas of a session run elsewhere");
                        None
                    }
                    Err(_) => {
                        tracing::warn!(session = %session_id, "asking for the deltas of a session run elsewhere took over {WATCH_WAIT:?}; streaming without them");
                        None
                    }
                }
            }
        }
    }

    /// The bytes the store takes in its database: `None` on SQLite (its files are measured
    /// on disk); on PostgreSQL, the total size of turnstile's tables (see `postgres/file_chunks.rs`).
    pub async fn db_bytes(&self) -> Result<Option<u64>, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(None),
            Backend::Postgres(p) => p.db_bytes().await.map(Some),
        }
    }

    /// Where stored files' bytes live: `None` on disk (SQLite), or in the shared database.
    pub(crate) fn blob_db(&self) -> Option<&PgStore> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p),
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

    /// Queue the row of a turn accepted but not begun (queued behind the running one), which
    /// stands for it until [`Store::inbox_row_done`] is committed with its `user.message`; its
    /// ticket (see [`Store::committed`]). `kind` is `message` or `plan`, `body` the engine's
    /// JSON of the request.
    pub fn put_inbox_row(
        &self,
        session_id: &Arc<str>,
        turn_id: &str,
        kind: &'static str,
        body: String,
    ) -> u64 {
        on_backend!(self, b => b.put_inbox_row(session_id, turn_id, kind, body))
    }

    /// Queue the removal of a queued turn's row: it has begun (queue this with its
    /// `user.message`), was cancelled while it waited, or cannot be carried out.
    pub fn inbox_row_done(&self, session_id: &Arc<str>, turn_id: &str) -> u64 {
        on_backend!(self, b => b.inbox_row_done(session_id, turn_id))
    }

    /// The embedded store: the turns a previous process accepted and did not begin, by session
    /// in order, to be carried out at start. A shared store has none here: an instance's rows
    /// are taken by the next holder of each session's lease (see `take_inbox`).
    pub async fn inbox_at_start(&self) -> Result<Vec<(String, Vec<InboxRow>)>, StoreError> {
        match &self.backend {
            Backend::Sqlite(s) => s.inbox_at_start().await,
            Backend::Postgres(_) => Ok(Vec::new()),
        }
    }

    /// Queue the row of an `Idempotency-Key` whose request started its turn (`row.started`),
    /// before the turn's first event: it is committed with it, or before it. Now and then a
    /// bounded purge of the keys created before `forget_before_ms` rides along.
    #[inline]
    pub fn put_idempotency_key(&self, row: KeyRow, forget_before_ms: i64) -> u64 {
        on_backend!(self, b => b.put_key(row, forget_before_ms))
    }

    /// Reserve an `Idempotency-Key` for a first request, or find the row of the request that
    /// had it (created at or after `not_before_ms`). PostgreSQL: one `INSERT ... ON CONFLICT`
    /// (the instances sharing the database cannot both have it), plus one read when taken;
    /// SQLite: one indexed read (its process's memory reserves).
    pub async fn reserve_idempotency_key(
        &self,
        row: KeyRow,
        not_before_ms: i64,
    ) -> Result<KeyReserved, StoreError> {
        on_backend!(self, b => b.reserve_key(row, not_before_ms).await)
    }

    /// Give back a reservation ([`KeyReserved::New`] `in_store`) whose request started no turn.
    pub async fn release_idempotency_key(&self, row: KeyRow) -> Result<(), StoreError> {
        on_backend!(self, b => b.release_key(row).await)
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

    /// The turn of the session's last stored event unless that event ended it (`None`: no
    /// event, or the turn ended): one row, however long the log.
    pub async fn open_turn_id(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        on_backend!(self, b => b.open_turn_id(session_id).await)
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

    /// Sessions in creation order after `after` (exclusive), at most `limit`, of `owners`.
    pub async fn list_sessions(
        &self,
        owners: super::Owners,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        on_backend!(self, b => b.list_sessions(owners, after, limit).await)
    }

    /// How many sessions an owner has (`None`: the sessions of a server without keys).
    pub async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        on_backend!(self, b => b.count_sessions(owner).await)
    }

    /// A file's metadata.
    pub async fn file(&self, id: &str) -> Result<Option<FileRow>, StoreError> {
        on_backend!(self, b => b.file(id).await)
    }

    /// How many files this owner has stored (`None`: files made without an API key), and
    /// their bytes with each file counted as at least `min_bytes`.
    pub async fn file_usage_of(
        &self,
        owner: Option<String>,
        min_bytes: u64,
    ) -> Result<FileUsage, StoreError> {
        on_backend!(self, b => b.file_usage_of(owner, min_bytes).await)
    }

    /// Queue an increment of a usage row: committed with the writes queued with it (a turn's
    /// events that report the usage are queued after it).
    pub fn add_usage(&self, row: super::UsageRow) -> u64 {
        on_backend!(self, b => b.add_usage(row))
    }

    /// The usage rows `filter` names (at most 100,000).
    pub async fn usage(
        &self,
        filter: super::UsageFilter,
    ) -> Result<Vec<super::UsageRow>, StoreError> {
        on_backend!(self, b => b.usage(filter).await)
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
