//! What the backends store and send through group commit: the session and file rows, the
//! queued write ([`WriteOp`]), and the one error every store call returns ([`StoreError`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::event::Event;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("store error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("a write to the store failed: {0}")]
    WriteFailed(String),
    #[error("a stored event is corrupt: {0}")]
    Corrupt(String),
    /// PostgreSQL: cannot connect, migrate, or the schema is newer than this build (at start).
    #[error("cannot open the postgres store: {0}")]
    OpenPostgres(String),
    /// PostgreSQL: an error on a read (or getting a connection for one).
    #[error("postgres store error: {0}")]
    Postgres(String),
    /// PostgreSQL: the database is down or unreachable (no connection, or it went away).
    #[error("the postgres store is unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// Whether the store could not be reached or written (a full disk, an I/O error, a commit
    /// that failed, the database down or unreachable), rather than refusing what was asked or
    /// holding something corrupt: a request may succeed once it is back (answered 503
    /// `store_unavailable`).
    pub fn is_unavailable(&self) -> bool {
        use rusqlite::ErrorCode as C;
        match self {
            StoreError::WriteFailed(_) | StoreError::Unavailable(_) => true,
            StoreError::Sql(e) => matches!(
                e.sqlite_error_code(),
                Some(
                    C::DiskFull
                        | C::SystemIoFailure
                        | C::DatabaseBusy
                        | C::DatabaseLocked
                        | C::CannotOpen
                        | C::ReadOnly
                )
            ),
            _ => false,
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> StoreError {
        if pg_unreachable(&e) {
            StoreError::Unavailable(pg_error_text(&e))
        } else {
            StoreError::Postgres(pg_error_text(&e))
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> StoreError {
        // No connection could be had (none free in time, none could be made): the database
        // is down or unreachable, or every connection is in use.
        StoreError::Unavailable(format!("no connection to postgres: {e}"))
    }
}

/// Whether a PostgreSQL error says the server is gone or going (the connection closed or
/// failed, SQLSTATE class 08 connection exception, 57P01-57P03 shutting down, starting up)
/// rather than that it refused a statement.
pub(crate) fn pg_unreachable(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
            let text = e.to_string();
            e.is_closed() || io || text.starts_with("error connecting") || text.contains("timeout")
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
        }
    }
}

/// A PostgreSQL error with the server's own message when there is one (`Display` alone says
/// only "db error").
pub(crate) fn pg_error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Whose sessions a listing holds: one owner's (`None`: those made without an API key), or
/// every one (an admin principal's listing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owners {
    One(Option<String>),
    Every,
}

/// A session row: its id, owner, creation time and its record (JSON, owned by the engine).
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub id: String,
    pub owner: Option<String>,
    pub created_at: String,
    pub record: String,
}

/// What one owner's stored files take: how many, and their bytes as counted against a quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileUsage {
    pub files: u64,
    pub bytes: u64,
}

/// A stored file's metadata (the bytes are a blob named by `sha256`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    pub id: String,
    pub owner: Option<String>,
    pub filename: String,
    pub mime_type: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub created_at: String,
}

/// An `Idempotency-Key` of a session's turn requests (AAP): the body it came with and the turn
/// its first request started. Shared by every instance on the store; kept 24 h.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub session_id: String,
    pub key: String,
    /// SHA-256 (hex) of the first request's body.
    pub fingerprint: String,
    /// The turn the first request started, and the `seq` its events come after; `None` while
    /// it is only reserved (PostgreSQL: by an instance whose turn has not started yet).
    pub started: Option<(String, u64)>,
    /// When the key was first used, in ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// What reserving a key in the store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyReserved {
    /// Nobody had it: it is this request's. `in_store`: a reservation row was written (on
    /// PostgreSQL), to be released if the request starts no turn.
    New { in_store: bool },
    /// An earlier request (of this process before a restart, or of another instance) had it.
    Taken(KeyRow),
}

/// One row of usage (see `crate::usage`): what one principal's model calls and tool calls of
/// one agent, upstream and model came to on one UTC day. Written as an increment: the store
/// adds each count to the row with the same key (upsert-add), so instances sharing a store
/// (PostgreSQL) each add theirs. A tool call's row has `upstream` and `model` empty.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageRow {
    /// The principal's owner id; empty for a server without keys.
    pub owner: String,
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub agent: String,
    pub upstream: String,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    pub cached_tokens: u64,
    pub usd: f64,
    /// Model calls answered.
    pub calls: u64,
    /// Server tool calls run.
    pub tool_calls: u64,
}

/// Which usage rows a read wants: one owner's (`None`: every owner's), days `from..=to`
/// (`YYYY-MM-DD`, either open).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFilter {
    pub owner: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Usage rows a read returns at most (a read past it is cut, and says so).
pub(crate) const USAGE_ROWS_AT_MOST: usize = 100_000;

/// Expired idempotency keys deleted by one purge at most (see `WriteOp::PurgeKeys`).
pub(crate) const PURGE_KEYS_AT_MOST: i64 = 2000;

/// A write waiting in a backend's queue for the next commit.
pub(crate) enum WriteOp {
    Event {
        session_id: Arc<str>,
        seq: u64,
        id: String,
        turn_id: String,
        /// The event's type as stored (`user.message`, `turn.completed`, ...): the reads that
        /// filter on it (`unfinished_sessions`, `awaiting_client`, the file scans) use these.
        kind: &'static str,
        json: Arc<str>,
    },
    PutSession(SessionRow),
    DeleteSession(String),
    PutFile(FileRow),
    DeleteFile(String),
    /// A turn accepted but not begun (queued behind the running one): its row in the inbox
    /// stands for it until the commit that holds its `user.message` (see [`WriteOp::InboxDone`]),
    /// so that a crash in between leaves it to be carried out.
    InboxPut {
        session_id: Arc<str>,
        turn_id: String,
        /// `message` or `plan` (a request that starts a turn).
        kind: &'static str,
        body: String,
        /// PostgreSQL: the process that holds the turn in its queue (rows of a process that is
        /// gone are taken again by the session's next holder). `None` on SQLite (one process:
        /// every row is taken again at start).
        taken: Option<Arc<str>>,
    },
    /// The queued turn has begun (this commit holds its `user.message`) or was cancelled
    /// while it waited: its row goes.
    InboxDone {
        session_id: Arc<str>,
        turn_id: String,
    },
    /// Insert or replace an idempotency key's row (its turn started).
    PutKey(KeyRow),
    /// Delete at most [`PURGE_KEYS_AT_MOST`] idempotency keys created before this (ms).
    PurgeKeys(i64),
    /// Add to a usage row (see [`UsageRow`]).
    Usage(UsageRow),
}

impl WriteOp {
    /// The session the write belongs to (`None`: file records, key purges, usage).
    pub(crate) fn session(&self) -> Option<&str> {
        match self {
            WriteOp::Event { session_id, .. }
            | WriteOp::InboxPut { session_id, .. }
            | WriteOp::InboxDone { session_id, .. } => Some(session_id),
            WriteOp::PutSession(r) => Some(&r.id),
            WriteOp::DeleteSession(id) => Some(id),
            WriteOp::PutKey(k) => Some(&k.session_id),
            WriteOp::PutFile(_)
            | WriteOp::DeleteFile(_)
            | WriteOp::PurgeKeys(_)
            | WriteOp::Usage(_) => None,
        }
    }

    pub(crate) fn event(session_id: &Arc<str>, ev: &Event) -> WriteOp {
        WriteOp::Event {
            session_id: session_id.clone(),
            seq: ev.seq,
            id: ev.id.clone(),
            turn_id: ev.turn_id.clone(),
            kind: ev.body.type_name(),
            json: ev.json.clone(),
        }
    }
}
