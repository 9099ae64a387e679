//! The seam between the engine and where its log lives: [`StoreBackend`], what a store backend
//! implements, and the rows and errors every backend shares. The rest of the crate holds a
//! [`Store`](super::Store) and never names a backend; the SQLite backend
//! ([`SqliteStore`](super::sqlite::SqliteStore)) is the first implementation.
//!
//! # The model: queued writes, tickets and one durability watermark
//!
//! Writes are *queued*, not written: [`append`](StoreBackend::append),
//! [`put_session`](StoreBackend::put_session) and the other write calls push the write on an
//! in-memory queue and return at once with its **ticket**, a number counting from 1 in the
//! order the writes were queued (one counter per store, across sessions). They never block and
//! never fail; they may be called under the engine's session lock, and are (that lock is what
//! orders a session's events: see below).
//!
//! A caller that needs its writes durable calls [`flush`](StoreBackend::flush) (async) or
//! [`commit`](StoreBackend::commit) (the same, blocking the calling thread). Both return once
//! every write queued *before the call* has been through a commit, and whether the commit that
//! held the caller's writes succeeded. **Group commit:** whoever commits takes *everything*
//! queued so far, from every session, into one transaction (SQLite: one transaction, with
//! `fsync` one sync; PostgreSQL: one transaction in one round trip); callers whose writes were
//! in it return without committing again. A turn therefore costs one commit when its calls
//! answer at once and a few at most, never one per event: the engine flushes before it waits on
//! the client and, during a model or tool call, once its oldest unwritten event is 1 ms old.
//!
//! [`committed`](StoreBackend::committed) is the watermark: every write whose ticket is at most
//! this has been through a commit. A commit can *fail* (I/O error, full disk, lost connection):
//! then its whole batch is not in the log, the watermark passes it all the same, and
//! [`failed`](StoreBackend::failed)`(ticket)` says so for the tickets it held. A failed batch
//! is never retried by the store: the engine reads the session back and goes on from what the
//! log holds (`Session::read_back`).
//!
//! # Invariants a backend keeps
//!
//! - **Order.** A session's events are appended with consecutive `seq`s (1, 2, ...) and ids that
//!   sort as their seqs do (both assigned by the engine under the session's lock, in the order
//!   of the `append` calls). A backend commits the writes of one batch in queue order, and
//!   batches in ticket order; [`events`](StoreBackend::events) returns them by `seq`. A failed
//!   commit may leave a hole in a session's seqs; reads must cope (see `seq_of`).
//! - **Visible once durable.** The engine publishes an event to subscribers (streams, runs, AAP
//!   watchers) only once `committed() >= ticket && !failed(ticket)`. The durability signal is
//!   the watermark: a backend advances [`committed`](StoreBackend::committed) only after the
//!   transaction is durable (SQLite: `COMMIT` returned; PostgreSQL: `COMMIT` acknowledged, with
//!   `synchronous_commit` as configured), and wakes the flushes waiting on it. Subscribers then
//!   read stored events by cursor ([`events`](StoreBackend::events) with `after_seq`), so a
//!   subscriber that missed a notification loses nothing.
//! - **Rows.** A session row written with [`put_session`](StoreBackend::put_session) replaces
//!   the record of an existing one (owner and creation time are kept). Deleting a session
//!   deletes its events and idempotency keys in the same commit.
//! - **Restart recovery.** [`unfinished_sessions`](StoreBackend::unfinished_sessions) lists the
//!   sessions whose last stored event is not terminal (`turn.completed`, `turn.failed`,
//!   `turn.cancelled`): turns a previous process left running. At start the engine closes each
//!   with `turn.failed` `worker_lost` (answering orphan tool uses `Cancelled.`) and flushes.
//!
//! # Tickets are local; subscribers are the engine's
//!
//! Tickets and the watermark belong to one process's handle: they are never stored, and
//! restart from 0 when the store is opened. Subscribers (the engine's per-session watchers)
//! live in the engine, which publishes after `flush` returns, in ticket order; the store only
//! says what is durable. A backend shared by several processes (PostgreSQL) tells *other*
//! processes the same way: it notifies inside the commit's transaction (`pg_notify` is
//! delivered only at `COMMIT`, so never before the rows are durable) with the session and its
//! last committed `seq`, and the listening process reads the rows by cursor
//! ([`events`](StoreBackend::events) after the last `seq` it published), so a lost or repeated
//! notification loses or repeats nothing. The batch holds what that needs: each
//! [`WriteOp::Event`] names its session and `seq`.
//!
//! # Which calls block
//!
//! | call | may block the thread | may wait |
//! |---|---|---|
//! | `append`, `put_session`, `delete_session`, `put_file`, `delete_file`, `put_key` | no (a short lock) | no |
//! | `committed`, `failed` | no | no |
//! | `flush` | no | yes (async: for the commit of its writes) |
//! | `commit` | **yes**, for a whole commit (called under the session lock, rarely) | - |
//! | `probe_writable` | **yes** (call it on a blocking thread: `/readyz` does) | - |
//! | reads (`events`, `open_turn_id`, `session`, `file`, ...), `reserve_key`, `release_key` | no | yes (async) |
//!
//! # Test hooks
//!
//! Not part of the trait: `Store::fail_commits`, `Store::cap_size` and `Store::commits` exist
//! only with `cfg(test)` or the `testkit` feature (`sqlite/testing.rs`, one match arm per
//! backend); a production build carries neither the hooks nor their counters.
//!
//! # Errors
//!
//! Every fallible call returns [`StoreError`]: `Open` (cannot open or migrate; at start only),
//! `Sql` (a backend error on a read), `WriteFailed` (the commit that held the caller's writes
//! failed, or a blocking task died), `Corrupt` (a stored row does not parse); PostgreSQL's
//! `OpenPostgres` (at start) and `Postgres` (a read) carry the server's message.

use std::future::Future;
use std::sync::Arc;

use super::event::Event;
use super::group::GroupCommit;
pub(crate) use super::rows::pg_error_text;
pub(crate) use super::rows::WriteOp;
pub(crate) use super::rows::{
    FileRow, FileUsage, KeyReserved, KeyRow, Owners, SessionRow, StoreError, UsageFilter, UsageRow,
};

/// What a store backend implements: the event log, the session table and file records, with
/// group commit. See the [module documentation](self) for the model and the invariants.
///
/// Reads and `flush` return `Send` futures (the engine awaits them in spawned tasks); a
/// network backend does its I/O there. `commit` and `probe_writable` are blocking by contract.
pub(crate) trait StoreBackend: Clone + Send + Sync + 'static {
    // --- Writes: queued, never blocking, never failing; each returns its ticket. ---

    /// The backend's write queue (see [`GroupCommit`]): every write below goes there, and the
    /// backend's commit takes it.
    fn queue(&self) -> &GroupCommit;

    /// Queue an event of `session_id` for the next commit.
    fn append(&self, session_id: &Arc<str>, ev: &Event) -> u64 {
        self.queue().push(WriteOp::event(session_id, ev))
    }
    /// Queue an insert, or a replacement of the record, of a session row.
    fn put_session(&self, row: SessionRow) -> u64 {
        self.queue().push(WriteOp::PutSession(row))
    }
    /// Queue the removal of a session and all its events.
    fn delete_session(&self, id: &str) -> u64 {
        self.queue().push(WriteOp::DeleteSession(id.to_string()))
    }
    /// Queue a file's metadata.
    fn put_file(&self, row: FileRow) -> u64 {
        self.queue().push(WriteOp::PutFile(row))
    }
    /// Queue the removal of a file's metadata.
    fn delete_file(&self, id: &str) -> u64 {
        self.queue().push(WriteOp::DeleteFile(id.to_string()))
    }
    /// Queue the row of a turn accepted but not begun (see [`WriteOp::InboxPut`]).
    fn put_inbox_row(
        &self,
        session_id: &Arc<str>,
        turn_id: &str,
        kind: &'static str,
        body: String,
    ) -> u64 {
        self.queue().push(WriteOp::InboxPut {
            session_id: session_id.clone(),
            turn_id: turn_id.to_string(),
            kind,
            body,
            taken: None,
        })
    }
    /// Queue the removal of a queued turn's row (see [`WriteOp::InboxDone`]).
    fn inbox_row_done(&self, session_id: &Arc<str>, turn_id: &str) -> u64 {
        self.queue().push(WriteOp::InboxDone {
            session_id: session_id.clone(),
            turn_id: turn_id.to_string(),
        })
    }

    /// Queue an idempotency key's row (its turn started), replacing a reservation; now and
    /// then a bounded purge of keys created before `forget_before_ms` rides along.
    fn put_key(&self, row: KeyRow, forget_before_ms: i64) -> u64 {
        self.queue().push_key(row, forget_before_ms)
    }

    /// Queue an increment of a usage row (committed with what is queued with it: a turn's
    /// events that report the usage come after it in the queue).
    fn add_usage(&self, row: UsageRow) -> u64 {
        self.queue().push(WriteOp::Usage(row))
    }

    // --- Durability. ---

    /// Returns once everything queued before the call has been through a commit (leading one,
    /// or waiting asleep for the one under way); `WriteFailed` if the commit that held this
    /// caller's writes failed.
    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// [`flush`](StoreBackend::flush), blocking the calling thread.
    fn commit(&self) -> Result<(), StoreError>;
    /// The watermark: every write whose ticket is at most this has been through a commit.
    fn committed(&self) -> u64;
    /// Whether the commit that took this ticket failed (its write is not in the log). Known
    /// for recent failed commits (SQLite: the last 64).
    fn failed(&self, ticket: u64) -> bool;
    /// Whether the store can be written now (`/readyz`): the last commit did not fail and the
    /// store would take a write. Blocking.
    fn probe_writable(&self) -> Result<(), StoreError>;

    // --- The log, by session with a cursor. ---

    /// A session's events with `seq > after_seq`, at most `limit`, in `seq` order.
    fn events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;
    /// The `seq` of the event with this id in this session (`Last-Event-ID` resume).
    fn seq_of(
        &self,
        session_id: &str,
        event_id: &str,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;
    /// The turn of the session's last stored event, unless that event ended it (`None`: no
    /// event, or the last turn ended): one row read by the `(session, seq)` key from its end,
    /// whatever the log's length (`session_busy` names it).
    fn open_turn_id(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
    /// Sessions whose last event is not terminal: turns a previous process left running.
    fn unfinished_sessions(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// For each session, whether its last event is a `turn.completed` with
    /// `stop_reason: tool_use` (the turn stopped for the client).
    fn awaiting_client(
        &self,
        ids: Vec<String>,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    // --- The session table. ---

    /// One session row.
    fn session(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<SessionRow>, StoreError>> + Send;
    /// The sessions of `owners` in id order after `after` (exclusive), at most `limit`.
    fn list_sessions(
        &self,
        owners: Owners,
        after: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SessionRow>, StoreError>> + Send;
    /// How many sessions an owner has (`None`: sessions made without an API key).
    fn count_sessions(
        &self,
        owner: Option<String>,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    // --- Idempotency keys (AAP turn requests). ---

    /// Reserve `row.key` of `row.session_id` for a first request, unless a key created at or
    /// after `not_before_ms` is stored (then it, whatever its body). PostgreSQL writes the
    /// reservation (`INSERT ... ON CONFLICT`), so that two instances cannot both have it;
    /// SQLite, one process whose memory reserves, only looks (one indexed read).
    fn reserve_key(
        &self,
        row: KeyRow,
        not_before_ms: i64,
    ) -> impl Future<Output = Result<KeyReserved, StoreError>> + Send;
    /// Give back a reservation whose request started no turn (PostgreSQL; nothing on SQLite).
    fn release_key(&self, row: KeyRow) -> impl Future<Output = Result<(), StoreError>> + Send;

    // --- Usage. ---

    /// The usage rows `filter` names, at most [`USAGE_ROWS_AT_MOST`](super::rows::USAGE_ROWS_AT_MOST).
    fn usage(
        &self,
        filter: UsageFilter,
    ) -> impl Future<Output = Result<Vec<UsageRow>, StoreError>> + Send;

    // --- File records. ---

    /// A file's metadata.
    fn file(&self, id: &str) -> impl Future<Output = Result<Option<FileRow>, StoreError>> + Send;
    /// How many files this owner has stored, and their bytes, each counted as at least
    /// `min_bytes`.
    fn file_usage_of(
        &self,
        owner: Option<String>,
        min_bytes: u64,
    ) -> impl Future<Output = Result<FileUsage, StoreError>> + Send;
    /// Whether a file record names the blob with this SHA-256.
    fn blob_in_use(&self, sha256: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// The ids of the files a session's log references (user-message attachments, tool-result
    /// deliveries), in order of first mention.
    fn session_file_ids(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// Which of these file ids a stored user message or tool result (of any session) names.
    fn files_referenced(
        &self,
        ids: Vec<String>,
    ) -> impl Future<Output = Result<std::collections::HashSet<String>, StoreError>> + Send;
}

/// The ids in an event's `files` (a user message's attachments, a tool result's deliveries).
pub(crate) fn file_ids_in(json: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Files {
        #[serde(default)]
        files: Vec<Id>,
    }
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_str::<Files>(json)
        .map(|f| f.files.into_iter().map(|f| f.id).collect())
        .unwrap_or_default()
}
