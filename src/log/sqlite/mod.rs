//! The embedded store backend: SQLite in WAL mode, with group commit done by the callers
//! themselves (`commit.rs`).
//!
//! Writes are queued in memory (`append` and friends cost a push under a lock). A turn flushes
//! before it waits on the client, and during a model or tool call once its oldest unwritten
//! event is 1 ms old (`SYNC_AFTER` in the engine), so it costs one commit when its calls answer
//! at once, and a few at most, never one per event.
//!
//! Checkpoints (copying the WAL back into the database, with its fsyncs) run on a thread of
//! their own, never inside a commit, so a turn never waits behind one.
//!
//! Durability: `synchronous = NORMAL` in WAL mode: a committed transaction survives the process
//! being killed (`kill -9`); with `fsync = true` every commit is also synced to disk
//! (`synchronous = FULL`), which survives power loss at the cost of one fsync per group.
//!
//! Reads go through one reader connection on a blocking thread (`read.rs`, `file_records.rs`,
//! `idem_keys.rs`).

mod commit;
mod file_records;
mod holes;
mod idem_keys;
mod read;
mod schema;
mod testing;
#[cfg(test)]
mod tests;
mod usage_rows;
#[cfg(test)]
mod usage_tests;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use super::backend::{
    FileRow, FileUsage, KeyReserved, KeyRow, SessionRow, StoreBackend, StoreError, UsageFilter,
    UsageRow,
};
use super::event::Event;
use super::group::GroupCommit;
use super::InboxRow;
use crate::sync::lock;

/// The SQLite backend; cheap to clone.
#[derive(Clone)]
pub(crate) struct SqliteStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// The queue, its tickets, the watermark and the failed commits (`log/group.rs`).
    group: GroupCommit,
    /// With `fsync`: a flush has a commit under way on a blocking thread (`FsyncLead`).
    fsync_leading: AtomicBool,
    /// Testing only (`testing.rs`): faults to inject, commits counted; empty in production.
    faults: testing::Faults,
    writer: Mutex<Writer>,
    reader: Mutex<Connection>,
    /// Commits run on a blocking thread (each waits for an fsync).
    fsync: bool,
    /// The folder of the database (`/readyz` asks its filesystem for room after a failure).
    dir: std::path::PathBuf,
}

struct Writer {
    conn: Connection,
    /// Every ticket up to this one has been through a commit (which may have failed).
    done: u64,
    commits: u32,
    last_checkpoint: std::time::Instant,
    checkpoint: std::sync::mpsc::SyncSender<()>,
    /// When the usage riding on events was last folded (see `usage_rows.rs`).
    last_fold: std::time::Instant,
    /// The usage riding on the events committed since, added up by key (what a fold writes).
    riding: Vec<UsageRow>,
    /// Whether what rode on events before this process (one that stopped, perhaps by
    /// `kill -9`) has been folded: by the first commit, or the first read of usage. Not at
    /// open, which writes nothing (a test or tool may open the store beside the server).
    log_folded: bool,
    /// Sessions a failed commit left a hole in (see `holes.rs`).
    holes: holes::Holes,
}

/// WAL frames (about 64 MiB at the default page size) past which the writer checkpoints after
/// its commit, so that the WAL restarts (see `open_tuned`).
const WAL_RESTART_FRAMES: i64 = 16 * 1024;

impl SqliteStore {
    /// Open (creating if needed, migrating if older) `dir/turnstile.db`, and start the checkpointer.
    pub(crate) fn open(dir: &Path, fsync: bool) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_tuned(dir, fsync, WAL_RESTART_FRAMES)
    }

    fn open_tuned(
        dir: &Path,
        fsync: bool,
        wal_restart_frames: i64,
    ) -> Result<SqliteStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.to_path_buf(),
            source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
        })?;
        let path = dir.join("turnstile.db");
        let mut writer_conn = schema::open_conn(&path, fsync)?;
        schema::migrate(&mut writer_conn)?;
        // The checkpointer thread copies the WAL back off the commit path. But under steady
        // commits its passive checkpoints never catch up with the last commit, and a WAL restarts
        // from its beginning only once wholly copied back: it would grow without end. So past
        // `wal_restart_frames` the writer checkpoints too, after its own commit — no other
        // commit can come between, the copy catches up (the thread did most of it), and the next
        // commit restarts the WAL. Bounded by the writer itself, whatever the thread's schedule.
        writer_conn.pragma_update(None, "wal_autocheckpoint", wal_restart_frames)?;
        let reader = schema::open_conn(&path, fsync)?;
        let checkpoint_conn = schema::open_conn(&path, fsync)?;
        let (ck_tx, ck_rx) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("turnstile-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, ck_rx))
            .map_err(|e| StoreError::WriteFailed(e.to_string()))?;
        let writer = Writer {
            conn: writer_conn,
            done: 0,
            commits: 0,
            last_checkpoint: std::time::Instant::now(),
            checkpoint: ck_tx,
            last_fold: std::time::Instant::now(),
            riding: Vec::new(),
            log_folded: false,
            holes: Default::default(),
        };
        Ok(SqliteStore {
            shared: Arc::new(Shared {
                group: GroupCommit::default(),
                fsync_leading: Default::default(),
                faults: Default::default(),
                writer: Mutex::new(writer),
                reader: Mutex::new(reader),
                fsync,
                dir: dir.to_path_buf(),
            }),
        })
    }

    /// The turns a previous process accepted and did not begin (rows in the inbox), by
    /// session, in order: carried out at start.
    pub(crate) async fn inbox_at_start(&self) -> Result<Vec<(String, Vec<InboxRow>)>, StoreError> {
        self.read(|c| {
            let mut out = Vec::new();
            for sid in read::inbox_sessions(c)? {
                let rows = read::inbox_rows(c, &sid)?;
                out.push((sid, rows));
            }
            Ok(out)
        })
        .await
    }

    /// Runs `f` on the reader connection, on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&lock(&shared.reader)))
            .await
            .map_err(|e| StoreError::WriteFailed(format!("reader task failed: {e}")))?
    }
}

impl StoreBackend for SqliteStore {
    fn queue(&self) -> &GroupCommit {
        &self.shared.group
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.flush_queued().await
    }

    fn commit(&self) -> Result<(), StoreError> {
        self.commit_queued()
    }

    fn committed(&self) -> u64 {
        self.shared.group.committed()
    }

    fn failed(&self, ticket: u64) -> bool {
        self.shared.group.failure(ticket).is_some()
    }

    fn probe_writable(&self) -> Result<(), StoreError> {
        self.probe()
    }

    async fn events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let sid = session_id.to_string();
        self.read(move |c| read::events(c, &sid, after_seq, limit))
            .await
    }

    async fn seq_of(&self, session_id: &str, event_id: &str) -> Result<Option<u64>, StoreError> {
        let (sid, eid) = (session_id.to_string(), event_id.to_string());
        self.read(move |c| read::seq_of(c, &sid, &eid)).await
    }

    async fn open_turn_id(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let sid = session_id.to_string();
        self.read(move |c| read::open_turn_id(c, &sid)).await
    }

    async fn unfinished_sessions(&self) -> Result<Vec<String>, StoreError> {
        self.read(read::unfinished_sessions).await
    }

    async fn awaiting_client(&self, ids: Vec<String>) -> Result<Vec<bool>, StoreError> {
        self.read(move |c| read::awaiting_client(c, &ids)).await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| read::session(c, &id)).await
    }

    async fn list_sessions(
        &self,
        owners: crate::log::Owners,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<SessionRow>, StoreError> {
        self.read(move |c| read::list_sessions(c, &owners, &after.unwrap_or_default(), limit))
            .await
    }

    async fn count_sessions(&self, owner: Option<String>) -> Result<usize, StoreError> {
        self.read(move |c| read::count_sessions(c, owner.as_deref()))
            .await
    }

    async fn reserve_key(
        &self,
        row: KeyRow,
        not_before_ms: i64,
    ) -> Result<KeyReserved, StoreError> {
        self.read(move |c| idem_keys::reserve(c, &row, not_before_ms))
            .await
    }

    async fn release_key(&self, _row: KeyRow) -> Result<(), StoreError> {
        Ok(())
    }

    async fn file(&self, id: &str) -> Result<Option<FileRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| file_records::file(c, &id)).await
    }

    async fn file_usage_of(
        &self,
        owner: Option<String>,
        min_bytes: u64,
    ) -> Result<FileUsage, StoreError> {
        self.read(move |c| file_records::file_usage_of(c, owner.as_deref(), min_bytes))
            .await
    }

    async fn usage(&self, filter: UsageFilter) -> Result<Vec<UsageRow>, StoreError> {
        // Every row, the ones still riding on events too.
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.fold_usage())
            .await
            .map_err(|e| StoreError::WriteFailed(format!("usage fold task failed: {e}")))??;
        self.read(move |c| usage_rows::read(c, &filter)).await
    }

    async fn blob_in_use(&self, sha256: &str) -> Result<bool, StoreError> {
        let sha = sha256.to_string();
        self.read(move |c| file_records::blob_in_use(c, &sha)).await
    }

    async fn session_file_ids(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let sid = session_id.to_string();
        self.read(move |c| file_records::session_file_ids(c, &sid))
            .await
    }

    async fn files_referenced(&self, ids: Vec<String>) -> Result<HashSet<String>, StoreError> {
        self.read(move |c| file_records::files_referenced(c, &ids))
            .await
    }
}

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
