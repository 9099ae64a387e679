//! The embedded store: SQLite in WAL mode, written by one thread with group commit.
//!
//! Appends are queued to the writer thread, which takes everything queued, writes it in one
//! transaction and commits. A caller that needs to know its writes are durable queues a
//! [`Store::flush`] barrier after them; the barrier resolves after the commit that holds them.
//! So a turn costs one commit wait (at its terminal event), not one per event.
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
use tokio::sync::{mpsc, oneshot};

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
    #[error("the store's writer has stopped")]
    WriterGone,
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
    Barrier(oneshot::Sender<Result<(), String>>),
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    writer: mpsc::UnboundedSender<WriteOp>,
    reader: Arc<Mutex<Connection>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    owner TEXT,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    type TEXT NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_by_id ON events (session_id, id);
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
    /// Open (creating if needed) `dir/turnstile.db` and start the writer thread.
    pub fn open(dir: &Path, fsync: bool) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.to_path_buf(),
            source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
        })?;
        let path = dir.join("turnstile.db");
        let writer_conn = open_conn(&path, fsync)?;
        writer_conn.execute_batch(SCHEMA)?;
        // No checkpoint inside a commit: the checkpointer thread does them.
        writer_conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let reader = open_conn(&path, fsync)?;
        let checkpoint_conn = open_conn(&path, fsync)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (ck_tx, ck_rx) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("turnstile-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, ck_rx))
            .map_err(|e| StoreError::WriteFailed(e.to_string()))?;
        std::thread::Builder::new()
            .name("turnstile-store".into())
            .spawn(move || writer_loop(writer_conn, rx, ck_tx))
            .map_err(|e| StoreError::WriteFailed(e.to_string()))?;
        Ok(Store {
            writer: tx,
            reader: Arc::new(Mutex::new(reader)),
        })
    }

    /// Queue an event for the next group commit.
    pub fn append(&self, session_id: &Arc<str>, ev: &Event) {
        let _ = self.writer.send(WriteOp::Event {
            session_id: session_id.clone(),
            seq: ev.seq,
            id: ev.id.clone(),
            turn_id: ev.turn_id.clone(),
            kind: ev.body.type_name(),
            json: ev.json.clone(),
        });
    }

    /// Queue an insert or replacement of a session row.
    pub fn put_session(&self, row: SessionRow) {
        let _ = self.writer.send(WriteOp::PutSession(row));
    }

    /// Queue the removal of a session and all its events.
    pub fn delete_session(&self, id: &str) {
        let _ = self.writer.send(WriteOp::DeleteSession(id.to_string()));
    }

    /// Queue a file's metadata.
    pub fn put_file(&self, row: FileRow) {
        let _ = self.writer.send(WriteOp::PutFile(row));
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

    /// Resolves once everything queued before it is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.writer
            .send(WriteOp::Barrier(tx))
            .map_err(|_| StoreError::WriterGone)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::WriteFailed(e)),
            Err(_) => Err(StoreError::WriterGone),
        }
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader.lock().unwrap_or_else(|p| p.into_inner());
            f(&conn)
        })
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
    pub async fn seq_of(
        &self,
        session_id: &str,
        event_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let (sid, eid) = (session_id.to_string(), event_id.to_string());
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT seq FROM events WHERE session_id = ?1 AND id = ?2",
                params![sid, eid],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|s| s as u64))
        })
        .await
    }

    /// Sessions whose last event is not a terminal one: turns that were running when the
    /// process stopped.
    pub async fn unfinished_sessions(&self) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            let mut stmt = c.prepare(
                "SELECT e.session_id FROM events e
                 JOIN (SELECT session_id, MAX(seq) AS m FROM events GROUP BY session_id) last
                   ON e.session_id = last.session_id AND e.seq = last.m
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

fn row_to_session(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get(0)?,
        owner: r.get(1)?,
        created_at: r.get(2)?,
        record: r.get(3)?,
    })
}

/// Most operations one group commit takes; a larger backlog is split over several commits.
const MAX_GROUP: usize = 4096;

/// Commits between checkpoint requests (about 1,000 pages of WAL at the default page size
/// for small events), and the longest time between them.
const CHECKPOINT_EVERY: u32 = 1000;
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs a passive checkpoint whenever the writer asks; ends when the writer does.
fn checkpoint_loop(conn: Connection, rx: std::sync::mpsc::Receiver<()>) {
    while rx.recv().is_ok() {
        // PASSIVE: copy what can be copied without blocking the writer or any reader.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "store: checkpoint failed");
        }
    }
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
}

fn writer_loop(
    mut conn: Connection,
    mut rx: mpsc::UnboundedReceiver<WriteOp>,
    checkpoint: std::sync::mpsc::SyncSender<()>,
) {
    let mut batch = Vec::with_capacity(64);
    let mut commits = 0u32;
    let mut last_checkpoint = std::time::Instant::now();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // A batch of barriers only (nothing new to write) needs no transaction.
        let writes = batch.iter().any(|op| !matches!(op, WriteOp::Barrier(_)));
        let result = if !writes {
            Ok(())
        } else {
            write_batch(&mut conn, &batch)
        }
        .map_err(|e| {
            tracing::error!(error = %e, "store: a group commit failed");
            e.to_string()
        });
        for op in batch.drain(..) {
            if let WriteOp::Barrier(ack) = op {
                let _ = ack.send(result.clone());
            }
        }
        commits += u32::from(writes);
        if commits >= CHECKPOINT_EVERY || last_checkpoint.elapsed() >= CHECKPOINT_AFTER {
            // A request already pending is enough: never block the writer on it.
            let _ = checkpoint.try_send(());
            commits = 0;
            last_checkpoint = std::time::Instant::now();
        }
    }
}

fn write_batch(conn: &mut Connection, batch: &[WriteOp]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
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
                WriteOp::PutFile(f) => {
                    tx.execute(
                        "INSERT INTO files (id, owner, filename, mime_type, size_bytes, sha256, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        params![f.id, f.owner, f.filename, f.mime_type, f.size_bytes as i64, f.sha256, f.created_at],
                    )?;
                }
                WriteOp::Barrier(_) => {}
            }
        }
    }
    tx.commit()
}
