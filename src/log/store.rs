//! The embedded store: SQLite in WAL mode, with group commit done by the callers themselves.
//!
//! Writes are queued in memory ([`Store::append`] and friends cost a push under a lock). A caller
//! that needs its writes durable calls [`Store::flush`], which commits on the caller's own thread
//! (no hand-off to a writer thread, whose wake-ups cost more than the commit on a small machine):
//! the first caller to take the write connection commits everything queued so far in one
//! transaction, and callers whose writes that transaction held return without committing again
//! (leader/follower group commit). A turn flushes before it waits on the client, and during a model
//! or tool call once its oldest unwritten event is 1 ms old (`SYNC_AFTER` in `engine/turn.rs`), so
//! it costs one commit when its calls answer at once, and a few at most, never one per event.
//!
//! Checkpoints (copying the WAL back into the database, with its fsyncs) run on a thread of
//! their own, never inside a commit, so a turn never waits behind one.
//!
//! Durability: `synchronous = NORMAL` in WAL mode: a committed transaction survives the process
//! being killed (`kill -9`); with `fsync = true` every commit is also synced to disk
//! (`synchronous = FULL`), which survives power loss at the cost of one fsync per group.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use super::event::Event;
use crate::sync::lock;

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
}

/// A session row: its id, owner, creation time and its record (JSON, owned by the engine).
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub id: String,
    pub owner: Option<String>,
    pub created_at: String,
    pub record: String,
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

enum WriteOp {
    Event {
        session_id: Arc<str>,
        seq: u64,
        id: String,
        turn_id: String,
        kind: &'static str,
        json: Arc<str>,
    },
    PutSession(SessionRow),
    DeleteSession(String),
    PutFile(FileRow),
    DeleteFile(String),
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Every ticket up to this one has been through a commit.
    committed: std::sync::atomic::AtomicU64,
    /// Woken after every commit, for [`Store::flush`]es waiting on another's...
    commit_done: tokio::sync::Notify,
    /// ...when there are any: how many.
    waiting: std::sync::atomic::AtomicUsize,
    /// With `fsync`: a flush has a commit under way on a blocking thread ([`FsyncLead`]).
    fsync_leading: std::sync::atomic::AtomicBool,
    /// Testing: how many of the next commits fail ([`Store::fail_commits`]).
    fail_next: std::sync::atomic::AtomicU32,
    /// Recent failed commits: their ticket ranges and errors (see [`Store::failed`]).
    failures: Mutex<std::collections::VecDeque<(u64, u64, String)>>,
    /// Whether any commit has ever failed: when none has, [`Store::failed`] takes no lock.
    any_failed: std::sync::atomic::AtomicBool,
    /// Commits that wrote something ([`Store::commits`]).
    commits: std::sync::atomic::AtomicU64,
    writer: Mutex<Writer>,
    reader: Mutex<Connection>,
    /// Commits run on a blocking thread (each waits for an fsync).
    fsync: bool,
}

/// Writes not yet committed. Every write gets a ticket, counting from 1.
#[derive(Default)]
struct Queue {
    ops: Vec<WriteOp>,
    /// The ticket of the last write queued.
    last: u64,
}

struct Writer {
    conn: Connection,
    /// Every ticket up to this one has been through a commit (which may have failed).
    done: u64,
    commits: u32,
    last_checkpoint: std::time::Instant,
    checkpoint: std::sync::mpsc::SyncSender<()>,
}

/// Schema version 2 (`PRAGMA user_version`). Events sit in a rowid table in the order they were
/// written, so a commit appends to its last page; `(session_id, seq)` is a small index beside it.
/// Version 1 kept events in a `WITHOUT ROWID` table keyed by `(session_id, seq)`, whose large
/// rows split pages on most commits (several pages written per commit); it is migrated on open.
const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    owner TEXT,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    n INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    type TEXT NOT NULL,
    json TEXT NOT NULL
);
-- No index on (session_id, id): ids sort like seqs within a session, so `seq_of` finds an id by
-- bisection on this one, and every commit writes one page less.
CREATE UNIQUE INDEX IF NOT EXISTS events_by_seq ON events (session_id, seq);
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    owner TEXT,
    filename TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL
);
";

/// Bring a store of an older schema to [`SCHEMA_VERSION`], in one transaction.
fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction()?;
    let old_events: Option<String> = tx
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if old_events.is_some_and(|sql| sql.contains("WITHOUT ROWID")) {
        tx.execute_batch(
            "ALTER TABLE events RENAME TO events_v1;
             DROP INDEX IF EXISTS events_by_id;",
        )?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(
            "INSERT INTO events (session_id, seq, id, turn_id, type, json)
                 SELECT session_id, seq, id, turn_id, type, json FROM events_v1
                 ORDER BY session_id, seq;
             DROP TABLE events_v1;",
        )?;
    } else {
        tx.execute_batch(SCHEMA)?;
    }
    tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
    tx.commit()
}

fn open_conn(path: &Path, fsync: bool) -> Result<Connection, StoreError> {
    let open_err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(open_err)?;
    conn.pragma_update(None, "synchronous", if fsync { "FULL" } else { "NORMAL" })
        .map_err(open_err)?;
    Ok(conn)
}

impl Store {
    /// Open (creating if needed, migrating if older) `dir/turnstile.db`, and start the checkpointer.
    pub fn open(dir: &Path, fsync: bool) -> Result<Store, StoreError> {
        Store::open_tuned(dir, fsync, WAL_RESTART_FRAMES)
    }

    fn open_tuned(dir: &Path, fsync: bool, wal_restart_frames: i64) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.to_path_buf(),
            source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
        })?;
        let path = dir.join("turnstile.db");
        let mut writer_conn = open_conn(&path, fsync)?;
        migrate(&mut writer_conn)?;
        // The checkpointer thread copies the WAL back off the commit path. But under steady
        // commits its passive checkpoints never catch up with the last commit, and a WAL restarts
        // from its beginning only once wholly copied back: it would grow without end. So past
        // `wal_restart_frames` the writer checkpoints too, after its own commit — no other
        // commit can come between, the copy catches up (the thread did most of it), and the next
        // commit restarts the WAL. Bounded by the writer itself, whatever the thread's schedule.
        writer_conn.pragma_update(None, "wal_autocheckpoint", wal_restart_frames)?;
        let reader = open_conn(&path, fsync)?;
        let checkpoint_conn = open_conn(&path, fsync)?;
        let (ck_tx, ck_rx) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("turnstile-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, ck_rx))
            .map_err(|e| StoreError::WriteFailed(e.to_string()))?;
        Ok(Store {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                committed: Default::default(),
                commit_done: tokio::sync::Notify::new(),
                waiting: Default::default(),
                fsync_leading: Default::default(),
                fail_next: Default::default(),
                failures: Default::default(),
                any_failed: Default::default(),
                commits: Default::default(),
                writer: Mutex::new(Writer {
                    conn: writer_conn,
                    done: 0,
                    commits: 0,
                    last_checkpoint: std::time::Instant::now(),
                    checkpoint: ck_tx,
                }),
                reader: Mutex::new(reader),
                fsync,
            }),
        })
    }

    fn queue(&self, op: WriteOp) -> u64 {
        let mut q = lock(&self.shared.queue);
        q.ops.push(op);
        q.last += 1;
        q.last
    }

    /// Queue an event for the next commit; its ticket (see [`Store::committed`]).
    pub fn append(&self, session_id: &Arc<str>, ev: &Event) -> u64 {
        self.queue(WriteOp::Event {
            session_id: session_id.clone(),
            seq: ev.seq,
            id: ev.id.clone(),
            turn_id: ev.turn_id.clone(),
            kind: ev.body.type_name(),
            json: ev.json.clone(),
        })
    }

    /// Queue an insert or replacement of a session row; returns its ticket (see
    /// [`Store::committed`]).
    pub fn put_session(&self, row: SessionRow) -> u64 {
        self.queue(WriteOp::PutSession(row))
    }

    /// Queue the removal of a session and all its events.
    pub fn delete_session(&self, id: &str) {
        self.queue(WriteOp::DeleteSession(id.to_string()));
    }

    /// Queue a file's metadata.
    pub fn put_file(&self, row: FileRow) {
        self.queue(WriteOp::PutFile(row));
    }

    /// Queue the removal of a file's metadata.
    pub fn delete_file(&self, id: &str) {
        self.queue(WriteOp::DeleteFile(id.to_string()));
    }

    /// Bytes of the stored files of this owner (`None`: files made without an API key).
    pub async fn file_bytes_of(&self, owner: Option<String>) -> Result<u64, StoreError> {
        self.read(move |c| {
            let sum: i64 = c.query_row(
                "SELECT COALESCE(SUM(size_bytes), 0) FROM files WHERE owner IS ?1",
                params![owner],
                |r| r.get(0),
            )?;
            Ok(sum.max(0) as u64)
        })
        .await
    }

    /// Whether a file record names the blob with this SHA-256.
    pub async fn blob_in_use(&self, sha256: &str) -> Result<bool, StoreError> {
        let sha = sha256.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT EXISTS (SELECT 1 FROM files WHERE sha256 = ?1)",
                params![sha],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// The ids of the files a session's log references: attached to its user messages or
    /// delivered in its tool results, in order of first mention.
    pub async fn session_file_ids(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let sid = session_id.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare(
                "SELECT json FROM events WHERE session_id = ?1
                   AND type IN ('user.message', 'agent.tool_result') AND instr(json, '\"files\":[{') > 0
                 ORDER BY seq",
            )?;
            let mut ids = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut rows = stmt.query(params![sid])?;
            while let Some(row) = rows.next()? {
                let json: String = row.get(0)?;
                for id in file_ids_in(&json) {
                    if seen.insert(id.clone()) {
                        ids.push(id);
                    }
                }
            }
            Ok(ids)
        })
        .await
    }

    /// Which of these file ids a stored user message or tool result (of any session) references.
    /// One scan over the events that carry files, however many ids.
    pub async fn files_referenced(
        &self,
        ids: Vec<String>,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        self.read(move |c| {
            let mut found = std::collections::HashSet::new();
            let mut stmt = c.prepare(
                "SELECT json FROM events
                  WHERE type IN ('user.message', 'agent.tool_result') AND instr(json, '\"files\":[{') > 0",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let json: String = row.get(0)?;
                let quick: Vec<&String> = ids
                    .iter()
                    .filter(|id| !found.contains(*id) && json.contains(id.as_str()))
                    .collect();
                if quick.is_empty() {
                    continue;
                }
                let named = file_ids_in(&json);
                for id in quick {
                    if named.contains(id) {
                        found.insert(id.clone());
                    }
                }
                if found.len() == ids.len() {
                    break;
                }
            }
            Ok(found)
        })
        .await
    }

    /// Every write whose ticket is at most this has been through a commit.
    pub fn committed(&self) -> u64 {
        self.shared
            .committed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A file's metadata.
    pub async fn file(&self, id: &str) -> Result<Option<FileRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT id, owner, filename, mime_type, size_bytes, sha256, created_at FROM files WHERE id = ?1",
                params![id],
                |r| {
                    Ok(FileRow {
                        id: r.get(0)?,
                        owner: r.get(1)?,
                        filename: r.get(2)?,
                        mime_type: r.get(3)?,
                        size_bytes: r.get::<_, i64>(4)? as u64,
                        sha256: r.get(5)?,
                        created_at: r.get(6)?,
                    })
                },
            )
            .optional()?)
        })
        .await
    }

    /// Returns once everything queued before the call is committed. Commits on this thread
    /// (a small transaction with no fsync costs less than waking another thread), or on a
    /// blocking thread when every commit waits for an fsync. When another task is committing,
    /// waits for it asleep rather than on the writer's lock: the thread runs other tasks
    /// meanwhile (blocking on the lock had each worker stalled for most of a commit under load:
    /// A/B on 2 cores at c=32, 9,300–9,700 → 12,800–13,400 turns/s, added p50 −37 %; at c=1,
    /// where nobody waits, the same as before: no waiter is registered, none woken).
    pub async fn flush(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let target = lock(&self.shared.queue).last;
        let mut done = std::pin::pin!(self.shared.commit_done.notified());
        let mut waiting: Option<Waiting> = None;
        loop {
            if self.shared.committed.load(SeqCst) >= target {
                return self.outcome(target);
            }
            // Lead a commit, or wait for the one under way without blocking this thread (other
            // tasks run meanwhile); it may have taken its batch before our writes.
            if self.shared.fsync {
                if let Some(lead) = FsyncLead::take(&self.shared) {
                    let store = self.clone();
                    let commit = tokio::task::spawn_blocking(move || {
                        let _lead = lead;
                        store.commit()
                    });
                    return commit.await.unwrap_or_else(|e| {
                        Err(StoreError::WriteFailed(format!("commit task failed: {e}")))
                    });
                }
            } else {
                let leader = match self.shared.writer.try_lock() {
                    Ok(w) => Some(w),
                    Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) => None,
                };
                if let Some(w) = leader {
                    return self.commit_locked(target, w);
                }
            }
            if waiting.is_none() {
                // Counted, then registered, then the loop looks again: a commit that ended
                // meanwhile is seen, one that ends later wakes us (see `commit_locked`).
                waiting = Some(Waiting::count(&self.shared));
                done.as_mut().enable();
                std::sync::atomic::fence(SeqCst);
                continue;
            }
            done.as_mut().await;
            done.set(self.shared.commit_done.notified());
            done.as_mut().enable();
        }
    }

    /// [`Store::flush`] on the calling thread.
    pub fn commit(&self) -> Result<(), StoreError> {
        let target = lock(&self.shared.queue).last;
        self.commit_locked(target, lock(&self.shared.writer))
    }

    /// Commits what is queued, unless a commit since `target` was queued did already; the
    /// outcome for `target`.
    fn commit_locked(
        &self,
        target: u64,
        mut w: std::sync::MutexGuard<'_, Writer>,
    ) -> Result<(), StoreError> {
        if w.done < target {
            // Leader: commit everything queued, ours and whatever came after it.
            let (ops, last) = {
                let mut q = lock(&self.shared.queue);
                (std::mem::take(&mut q.ops), q.last)
            };
            let first = w.done + 1;
            let injected = self
                .shared
                .fail_next
                .fetch_update(
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                    |n| n.checked_sub(1),
                )
                .is_ok();
            let written = if injected {
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                    Some("injected by Store::fail_commits".into()),
                ))
            } else {
                crate::metrics::store_commit(|| write_batch(&mut w.conn, &ops))
            };
            match written {
                Ok(()) => {
                    w.commits += 1;
                    self.shared
                        .commits
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, "store: a group commit failed");
                    let mut failures = lock(&self.shared.failures);
                    if failures.len() == MAX_FAILURES {
                        failures.pop_front();
                    }
                    failures.push_back((first, last, e.to_string()));
                    self.shared
                        .any_failed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
            w.done = last;
            self.shared
                .committed
                .store(last, std::sync::atomic::Ordering::SeqCst);
            if w.commits >= CHECKPOINT_EVERY || w.last_checkpoint.elapsed() >= CHECKPOINT_AFTER {
                // A request already pending is enough: never block a commit on it.
                let _ = w.checkpoint.try_send(());
                w.commits = 0;
                w.last_checkpoint = std::time::Instant::now();
            }
        }
        drop(w);
        // Whether or not this committed (another may have, ours included): the lock is free
        // now, and a flush that found it taken waits to hear so.
        self.shared.wake_waiting();
        self.outcome(target)
    }

    /// Whether the commit that took `target` succeeded.
    fn outcome(&self, target: u64) -> Result<(), StoreError> {
        match self.failure(target) {
            Some(e) => Err(StoreError::WriteFailed(e)),
            None => Ok(()),
        }
    }

    /// Whether the commit that took this ticket failed: the write is not in the log, though
    /// [`Store::committed`] has passed it. Known for the last 64 failed commits.
    pub fn failed(&self, ticket: u64) -> bool {
        self.failure(ticket).is_some()
    }

    fn failure(&self, ticket: u64) -> Option<String> {
        if !self
            .shared
            .any_failed
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return None;
        }
        lock(&self.shared.failures)
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&ticket))
            .map(|(_, _, e)| e.clone())
    }

    /// How many commits have written something since the store was opened (each a SQLite
    /// transaction, and with `fsync` one sync of the disk).
    pub fn commits(&self) -> u64 {
        self.shared
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the store can be written now (`/readyz`): the last commit did not fail, and the
    /// writer can take SQLite's write lock (`BEGIN IMMEDIATE`, rolled back: nothing is
    /// written). Blocks while a commit is under way; call it off the async threads.
    pub fn probe_writable(&self) -> Result<(), StoreError> {
        let last = self.committed();
        if last > 0 {
            if let Some(e) = self.failure(last) {
                return Err(StoreError::WriteFailed(format!(
                    "the last commit failed: {e}"
                )));
            }
        }
        let w = lock(&self.shared.writer);
        w.conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")?;
        Ok(())
    }

    /// Testing: the next `n` commits fail (as on an I/O error), writing nothing.
    #[doc(hidden)]
    pub fn fail_commits(&self, n: u32) {
        self.shared
            .fail_next
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Testing: cap the database at its present size plus `pages` more pages (`None`: lift the
    /// cap), so that commits needing more fail as on a full disk (`SQLITE_FULL`).
    #[doc(hidden)]
    pub fn cap_size(&self, pages: Option<u64>) -> Result<(), StoreError> {
        let w = lock(&self.shared.writer);
        let max = match pages {
            Some(more) => {
                w.conn
                    .query_row("PRAGMA page_count", [], |r| r.get::<_, u64>(0))?
                    + more
            }
            None => 0xffff_fffe,
        };
        w.conn
            .query_row(&format!("PRAGMA max_page_count = {max}"), [], |_| Ok(()))?;
        drop(w);
        self.shared.wake_waiting();
        Ok(())
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&lock(&shared.reader)))
            .await
            .map_err(|e| StoreError::WriteFailed(format!("reader task failed: {e}")))?
    }

    /// One session row.
    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT id, owner, created_at, record FROM sessions WHERE id = ?1",
                params![id],
                row_to_session,
            )
            .optional()?)
        })
        .await
    }

    /// Sessions in creation order after `after` (exclusive), at most `limit`, for one owner.
    pub async fn list_sessions(
        &self,
        owner: Option<String>,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, owner, created_at, record FROM sessions
                 WHERE id > ?1 AND owner IS ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(
                    params![after.unwrap_or_default(), owner, limit as i64],
                    row_to_session,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// How many sessions an owner has (`None`: the sessions of a server without keys).
    pub async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        self.read(move |c| {
            let n: i64 = c
                .prepare_cached("SELECT COUNT(*) FROM sessions WHERE owner IS ?1")?
                .query_row(params![owner], |r| r.get(0))?;
            Ok(n as usize)
        })
        .await
    }

    /// For each session, whether its last turn stopped for the client (its last event is a
    /// `turn.completed` with `stop_reason: tool_use`): one point read per session, its last
    /// event only (`GET /sessions` reads nothing else of a session's log).
    pub async fn awaiting_client(&self, ids: Vec<String>) -> Result<Vec<bool>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT type, json FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1",
            )?;
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                let last: Option<(String, String)> = stmt
                    .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                out.push(last.is_some_and(|(kind, json)| {
                    kind == "turn.completed"
                        && serde_json::from_str::<serde_json::Value>(&json)
                            .is_ok_and(|v| v["stop_reason"] == "tool_use")
                }));
            }
            Ok(out)
        })
        .await
    }

    /// A session's events with `seq > after_seq`, at most `limit`, in order.
    pub async fn events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let sid = session_id.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT seq, json FROM events WHERE session_id = ?1 AND seq > ?2
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![sid, after_seq as i64, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (seq, json) = row?;
                out.push(
                    Event::parse(seq as u64, &json)
                        .map_err(|e| StoreError::Corrupt(format!("{sid} #{seq}: {e}")))?,
                );
            }
            Ok(out)
        })
        .await
    }

    /// The `seq` of the event with this id in this session.
    ///
    /// Event ids sort in creation order within a session, as seqs do, so this bisects the
    /// session's seqs on the primary key: about log2(events) point reads, no index to keep.
    pub async fn seq_of(
        &self,
        session_id: &str,
        event_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let (sid, eid) = (session_id.to_string(), event_id.to_string());
        self.read(move |c| {
            let id_at = |seq: i64| -> rusqlite::Result<Option<String>> {
                c.prepare_cached("SELECT id FROM events WHERE session_id = ?1 AND seq = ?2")?
                    .query_row(params![sid, seq], |r| r.get(0))
                    .optional()
            };
            let bounds: Option<(i64, i64)> = c
                .prepare_cached(
                    "SELECT MIN(seq), MAX(seq) FROM events WHERE session_id = ?1 HAVING COUNT(*) > 0",
                )?
                .query_row(params![sid], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((mut lo, mut hi)) = bounds else {
                return Ok(None);
            };
            while lo <= hi {
                let mid = lo + (hi - lo) / 2;
                let Some(id) = id_at(mid)? else {
                    // A hole (a commit that failed): scan the session instead.
                    return Ok(c
                        .query_row(
                            "SELECT seq FROM events WHERE session_id = ?1 AND id = ?2",
                            params![sid, eid],
                            |r| r.get::<_, i64>(0),
                        )
                        .optional()?
                        .map(|s| s as u64));
                };
                match id.as_str().cmp(eid.as_str()) {
                    std::cmp::Ordering::Equal => return Ok(Some(mid as u64)),
                    std::cmp::Ordering::Less => lo = mid + 1,
                    std::cmp::Ordering::Greater => hi = mid - 1,
                }
            }
            Ok(None)
        })
        .await
    }

    /// Sessions whose last event is not a terminal one: turns that were running when the
    /// process stopped.
    pub async fn unfinished_sessions(&self) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            let mut stmt = c.prepare(
                "SELECT s.id FROM sessions s JOIN events e
                   ON e.session_id = s.id
                  AND e.seq = (SELECT MAX(seq) FROM events WHERE session_id = s.id)
                 WHERE e.type NOT IN ('turn.completed', 'turn.failed', 'turn.cancelled')",
            )?;
            let ids = stmt
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
        .await
    }
}

impl Shared {
    /// Wakes the flushes waiting on a commit, if any: called once `committed`, the writer's lock
    /// or `fsync_leading` has changed. With the fences on both sides, a flush either is counted
    /// here or sees the change when it looks again.
    fn wake_waiting(&self) {
        use std::sync::atomic::{fence, Ordering::SeqCst};
        fence(SeqCst);
        if self.waiting.load(SeqCst) > 0 {
            self.commit_done.notify_waiters();
        }
    }
}

/// A flush counted among those waiting on a commit, until it returns or is dropped.
struct Waiting(Arc<Shared>);

impl Waiting {
    fn count(shared: &Arc<Shared>) -> Waiting {
        shared
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(shared.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The one flush that, with `fsync`, has a commit under way on a blocking thread; the others
/// wait for it asleep instead of each taking a blocking thread to wait on the writer's lock.
/// Let go (and the waiters woken) when dropped, whatever became of the commit.
struct FsyncLead(Arc<Shared>);

impl FsyncLead {
    fn take(shared: &Arc<Shared>) -> Option<FsyncLead> {
        use std::sync::atomic::Ordering;
        shared
            .fsync_leading
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| FsyncLead(shared.clone()))
    }
}

impl Drop for FsyncLead {
    fn drop(&mut self) {
        self.0
            .fsync_leading
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.0.wake_waiting();
    }
}

/// The ids in an event's `files` (a user message's attachments, a tool result's deliveries).
fn file_ids_in(json: &str) -> Vec<String> {
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

fn row_to_session(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get(0)?,
        owner: r.get(1)?,
        created_at: r.get(2)?,
        record: r.get(3)?,
    })
}

/// Failed commits remembered, so that the callers whose writes they held learn of it.
const MAX_FAILURES: usize = 64;

/// Commits between checkpoint requests (about 1,000 pages of WAL at the default page size
/// for small events), and the longest time between them.
const CHECKPOINT_EVERY: u32 = 1000;
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// WAL frames (about 64 MiB at the default page size) past which the writer checkpoints after
/// its commit, so that the WAL restarts (see `open_tuned`).
const WAL_RESTART_FRAMES: i64 = 16 * 1024;

/// Runs a passive checkpoint whenever a committer asks; ends when the store is dropped.
fn checkpoint_loop(conn: Connection, rx: std::sync::mpsc::Receiver<()>) {
    while rx.recv().is_ok() {
        // PASSIVE: copy what can be copied without blocking the writer or any reader.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "store: checkpoint failed");
        }
    }
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
}

fn write_batch(conn: &mut Connection, batch: &[WriteOp]) -> rusqlite::Result<()> {
    // Cached BEGIN/COMMIT statements: `Connection::transaction` parses them on every call.
    conn.prepare_cached("BEGIN")?.execute([])?;
    let result = write_ops(conn, batch).and_then(|()| conn.prepare_cached("COMMIT")?.execute([]));
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result.map(|_| ())
}

fn write_ops(tx: &Connection, batch: &[WriteOp]) -> rusqlite::Result<()> {
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (session_id, seq, id, turn_id, type, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for op in batch {
            match op {
                WriteOp::Event {
                    session_id,
                    seq,
                    id,
                    turn_id,
                    kind,
                    json,
                } => {
                    insert.execute(params![
                        &**session_id,
                        *seq as i64,
                        id,
                        turn_id,
                        kind,
                        &**json
                    ])?;
                }
                WriteOp::PutSession(row) => {
                    tx.execute(
                        "INSERT INTO sessions (id, owner, created_at, record) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                        params![row.id, row.owner, row.created_at, row.record],
                    )?;
                }
                WriteOp::DeleteSession(id) => {
                    tx.execute("DELETE FROM events WHERE session_id = ?1", params![id])?;
                    tx.execute("DELETE FROM sessions WHERE id = ?1", params![id])?;
                }
                WriteOp::DeleteFile(id) => {
                    tx.execute("DELETE FROM files WHERE id = ?1", params![id])?;
                }
                WriteOp::PutFile(f) => {
                    tx.execute(
                        "INSERT INTO files (id, owner, filename, mime_type, size_bytes, sha256, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        params![f.id, f.owner, f.filename, f.mime_type, f.size_bytes as i64, f.sha256, f.created_at],
                    )?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::{params, Connection};

    use super::{SessionRow, Store};
    use crate::log::{Event, EventBody, StopReason};

    const CREATED: &str = "2026-01-01T00:00:00.000Z";

    fn event(seq: u64, body: EventBody) -> Event {
        Event::new(
            seq,
            crate::ids::new("evt"),
            "turn_1".into(),
            CREATED.into(),
            body,
        )
    }

    fn message(seq: u64) -> Event {
        event(
            seq,
            EventBody::AgentMessage {
                content: format!("message {seq}"),
                plan: false,
                compaction: false,
                replaces: None,
            },
        )
    }

    fn session_row(id: &str) -> SessionRow {
        SessionRow {
            id: id.into(),
            owner: None,
            created_at: CREATED.into(),
            record: "{}".into(),
        }
    }

    /// What identifies a stored event: its seq, id and exact bytes.
    fn keys(events: &[Event]) -> Vec<(u64, String, String)> {
        events
            .iter()
            .map(|e| (e.seq, e.id.clone(), e.json.to_string()))
            .collect()
    }

    async fn all_events(store: &Store, session: &str) -> Vec<Event> {
        store.events(session, 0, 100_000).await.unwrap()
    }

    /// The schema of version 1: events in a `WITHOUT ROWID` table, with an index on their ids.
    const V1_SCHEMA: &str = "
        CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT, created_at TEXT NOT NULL,
            record TEXT NOT NULL);
        CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
            turn_id TEXT NOT NULL, type TEXT NOT NULL, json TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
        CREATE UNIQUE INDEX events_by_id ON events (session_id, id);
        CREATE TABLE files (id TEXT PRIMARY KEY, owner TEXT, filename TEXT NOT NULL,
            mime_type TEXT NOT NULL, size_bytes INTEGER NOT NULL, sha256 TEXT NOT NULL,
            created_at TEXT NOT NULL);
    ";

    #[tokio::test]
    async fn a_version_1_store_is_migrated_without_losing_events() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("turnstile.db");
        let sessions = ["sess_a", "sess_b"];
        let mut written: [Vec<Event>; 2] = Default::default();
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(V1_SCHEMA).unwrap();
            conn.execute(
                "INSERT INTO sessions (id, owner, created_at, record) VALUES (?1, NULL, ?2, ?3)",
                params![sessions[0], CREATED, r#"{"v":1}"#],
            )
            .unwrap();
            for i in 0..50 {
                let (s, evs) = (i % 2, &mut written[i % 2]);
                let ev = message(evs.len() as u64 + 1);
                conn.execute(
                    "INSERT INTO events (session_id, seq, id, turn_id, type, json)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        sessions[s],
                        ev.seq as i64,
                        ev.id,
                        ev.turn_id,
                        ev.body.type_name(),
                        &*ev.json
                    ],
                )
                .unwrap();
                evs.push(ev);
            }
        }

        let store = Store::open(dir.path(), false).unwrap();
        for (s, evs) in sessions.iter().zip(&written) {
            assert_eq!(keys(&all_events(&store, s).await), keys(evs));
            for ev in evs {
                assert_eq!(store.seq_of(s, &ev.id).await.unwrap(), Some(ev.seq));
            }
        }
        let row = store.session(sessions[0]).await.unwrap().unwrap();
        assert_eq!(row.record, r#"{"v":1}"#);
        {
            let conn = Connection::open(&path).unwrap();
            let version: i64 = conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap();
            assert_eq!(version, 2);
            let leftovers: i64 = conn
                .query_row(
                    "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('events_by_id', 'events_v1')",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(leftovers, 0);
        }

        // Writes work on the migrated schema.
        let sid: Arc<str> = sessions[0].into();
        let new = message(written[0].len() as u64 + 1);
        let ticket = store.append(&sid, &new);
        store.commit().unwrap();
        assert_eq!(store.committed(), ticket);
        written[0].push(new.clone());
        assert_eq!(keys(&all_events(&store, &sid).await), keys(&written[0]));
        assert_eq!(store.seq_of(&sid, &new.id).await.unwrap(), Some(new.seq));
        drop(store);

        // A second open finds version 2 and leaves the store as it is.
        let store = Store::open(dir.path(), false).unwrap();
        for (s, evs) in sessions.iter().zip(&written) {
            assert_eq!(keys(&all_events(&store, s).await), keys(evs));
        }
    }

    #[tokio::test]
    async fn seq_of_finds_every_id_by_bisection_and_none_for_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        let sessions: Vec<Arc<str>> = ["sess_a", "sess_b", "sess_c"]
            .into_iter()
            .map(Into::into)
            .collect();
        let mut written: Vec<Vec<Event>> = vec![Vec::new(); sessions.len()];
        for i in 0..600 {
            let s = i % sessions.len();
            let ev = message(written[s].len() as u64 + 1);
            store.append(&sessions[s], &ev);
            written[s].push(ev);
            if i % 4 == 3 {
                store.commit().unwrap();
            }
        }
        store.commit().unwrap();

        for (s, evs) in sessions.iter().zip(&written) {
            assert_eq!(evs.len(), 200);
            for ev in evs {
                assert_eq!(store.seq_of(s, &ev.id).await.unwrap(), Some(ev.seq));
            }
        }
        let (a, b) = (&sessions[0], &sessions[1]);
        // Well-formed ids that were never written: after every event, before every event, and
        // between two events of the session (same time part as an event, smaller random part).
        let later = crate::ids::new("evt");
        let earliest = format!("evt_{}", "0".repeat(24));
        let stored = &written[0][100].id;
        let between = format!("{}00000000", &stored[..stored.len() - 8]);
        assert_ne!(
            &between, stored,
            "pick an event whose random part is not zero"
        );
        for unknown in [&later, &earliest, &between] {
            assert_eq!(store.seq_of(a, unknown).await.unwrap(), None, "{unknown}");
        }
        // An id of session A is not found in session B, though it sorts among B's ids.
        for ev in &written[0] {
            assert_eq!(store.seq_of(b, &ev.id).await.unwrap(), None);
        }
        assert_eq!(
            store.seq_of("sess_empty", &written[0][0].id).await.unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn seq_of_still_finds_ids_across_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        // The hole at every place in 1..=20. The first probe of a bisection over 1..=20 is
        // seq 10, so a hole there sends every lookup down the fallback scan; a hole elsewhere
        // is met only by the lookups whose probes land on it.
        for hole in 1..=20u64 {
            let sid: Arc<str> = format!("sess_hole_{hole}").into();
            let mut kept = Vec::new();
            let mut lost = None;
            for seq in 1..=20 {
                let ev = message(seq);
                if seq == hole {
                    lost = Some(ev); // Its commit failed: never stored.
                } else {
                    store.append(&sid, &ev);
                    kept.push(ev);
                }
            }
            store.commit().unwrap();
            assert_eq!(keys(&all_events(&store, &sid).await), keys(&kept));
            for ev in &kept {
                assert_eq!(
                    store.seq_of(&sid, &ev.id).await.unwrap(),
                    Some(ev.seq),
                    "hole at {hole}"
                );
            }
            let lost = lost.unwrap();
            assert_eq!(store.seq_of(&sid, &lost.id).await.unwrap(), None);
        }
    }

    #[tokio::test]
    async fn concurrent_commits_from_many_threads_make_every_write_durable() {
        const THREADS: usize = 8;
        const EVENTS: u64 = 200;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let sid: Arc<str> = format!("sess_{t}").into();
                    let mut written = Vec::new();
                    let mut last_ticket = 0;
                    for seq in 1..=EVENTS {
                        let ev = message(seq);
                        last_ticket = store.append(&sid, &ev);
                        store.commit().unwrap();
                        // Our own write is through a commit once commit() returns.
                        assert!(store.committed() >= last_ticket);
                        written.push(ev);
                    }
                    (sid, written, last_ticket)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let last_ticket = results.iter().map(|r| r.2).max().unwrap();
        assert_eq!(last_ticket, THREADS as u64 * EVENTS);
        assert_eq!(store.committed(), last_ticket);
        drop(store);

        let store = Store::open(dir.path(), false).unwrap();
        let mut total = 0;
        for (sid, written, _) in &results {
            let read = all_events(&store, sid).await;
            assert_eq!(keys(&read), keys(written), "{sid}");
            total += read.len();
        }
        assert_eq!(total, THREADS * EVENTS as usize);
    }

    /// Flushes that find another commit under way wait for it without blocking their thread;
    /// each returns once its own writes are committed, whoever committed them. With and
    /// without fsync (where one flush at a time commits on a blocking thread).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_flushes_from_many_tasks_make_every_write_durable() {
        concurrent_flushes(false).await;
        concurrent_flushes(true).await;
    }

    async fn concurrent_flushes(fsync: bool) {
        const TASKS: usize = 32;
        const EVENTS: u64 = 100;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), fsync).unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let sid: Arc<str> = format!("sess_{t}").into();
                    let mut written = Vec::new();
                    for seq in 1..=EVENTS {
                        let ev = message(seq);
                        let ticket = store.append(&sid, &ev);
                        store.flush().await.unwrap();
                        assert!(store.committed() >= ticket);
                        written.push(ev);
                    }
                    (sid, written)
                })
            })
            .collect();
        let all = futures_util::future::join_all(tasks);
        let results = tokio::time::timeout(std::time::Duration::from_secs(60), all)
            .await
            .expect("every flush returned");
        drop(store);

        let store = Store::open(dir.path(), false).unwrap();
        for r in results {
            let (sid, written) = r.unwrap();
            assert_eq!(
                keys(&all_events(&store, &sid).await),
                keys(&written),
                "{sid}"
            );
        }
    }

    /// Flushes beside threads that commit on their own all return: a flush that finds the
    /// writer's lock taken waits to hear it is free, also from a commit that had nothing to
    /// write (its writes went with another's). (That case once lost its wake-up and left a turn
    /// waiting for good, once in ten bench runs; its window is too narrow to hit at will here,
    /// so this is a stress test of the mixed path, not a reproduction.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flushes_beside_commits_on_other_threads_all_return() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Threads that keep taking the lock: mostly for commits that find nothing to write.
        let idle: Vec<_> = (0..3)
            .map(|_| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        store.commit().unwrap();
                    }
                })
            })
            .collect();
        // One flusher: no other flush's commit comes to wake it.
        let flusher = tokio::spawn({
            let store = store.clone();
            async move {
                let sid: Arc<str> = "sess_1".into();
                for seq in 1..=2000 {
                    store.append(&sid, &message(seq));
                    store.flush().await.unwrap();
                }
            }
        });
        let done = tokio::time::timeout(std::time::Duration::from_secs(60), flusher).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in idle {
            t.join().unwrap();
        }
        assert!(done.is_ok(), "a flush waited for good");
    }

    #[tokio::test]
    async fn unfinished_sessions_lists_sessions_whose_last_event_is_not_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        let (done, running): (Arc<str>, Arc<str>) = ("sess_done".into(), "sess_running".into());
        store.put_session(session_row(&done));
        store.put_session(session_row(&running));
        store.append(&done, &message(1));
        store.append(&running, &message(1));
        store.append(
            &done,
            &event(
                2,
                EventBody::TurnCompleted {
                    usage: None,
                    stop_reason: StopReason::EndTurn,
                },
            ),
        );
        store.append(&running, &message(2));
        store.commit().unwrap();
        assert_eq!(
            store.unfinished_sessions().await.unwrap(),
            vec![running.to_string()]
        );
    }

    #[test]
    fn the_wal_stops_growing_under_steady_commits() {
        // A small restart threshold, so that a few thousand commits cross it many times.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_tuned(dir.path(), false, 256).unwrap();
        let session: Arc<str> = "sess_wal".into();
        let wal = dir.path().join("turnstile.db-wal");
        let mut largest = 0;
        // Commits back to back, as under load: the checkpointer never sees a quiet WAL.
        for seq in 1..=12_000 {
            store.append(&session, &message(seq));
            store.commit().unwrap();
            largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        }
        // Every commit writes two or three frames: 12,000 commits would leave a WAL of 24,000+
        // frames (96 MiB+) if it never restarted. With restarts it stays near the threshold,
        // past it only while the thread's own checkpoint holds the checkpoint lock (the writer's
        // waits for the next commit then): a few hundred frames here, more on a busy machine.
        let frame = 4096 + 24;
        assert!(
            largest < 4096 * frame,
            "the WAL grew to {largest} bytes ({} frames)",
            largest / frame
        );
        drop(store);
        let store = Store::open(dir.path(), false).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let events = rt.block_on(store.events("sess_wal", 0, 20_000)).unwrap();
        assert_eq!(events.len(), 12_000);
    }
}
