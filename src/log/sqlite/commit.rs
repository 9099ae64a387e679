//! The SQLite backend's group commit, done by the callers themselves (leader/follower).
//!
//! A caller that needs its writes durable calls `flush`, which commits on the
//! caller's own thread (no hand-off to a writer thread, whose wake-ups cost more than the
//! commit on a small machine): the first caller to take the write connection commits
//! everything queued so far in one transaction, and callers whose writes that transaction held
//! return without committing again. With `fsync`, one flush at a time commits on a blocking
//! thread and the others wait for it asleep.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, MutexGuard};

use rusqlite::{params, Connection};

use super::{Shared, SqliteStore, Writer};
use crate::log::backend::WriteOp;
use crate::log::group::Waiting;
use crate::log::StoreError;
use crate::sync::lock;

/// Commits between checkpoint requests (about 1,000 pages of WAL at the default page size
/// for small events), and the longest time between them.
const CHECKPOINT_EVERY: u32 = 1000;
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl SqliteStore {
    /// Returns once everything queued before the call is committed. Commits on this thread
    /// (a small transaction with no fsync costs less than waking another thread), or on a
    /// blocking thread when every commit waits for an fsync. When another task is committing,
    /// waits for it asleep rather than on the writer's lock: the thread runs other tasks
    /// meanwhile (blocking on the lock had each worker stalled for most of a commit under load:
    /// A/B on 2 cores at c=32, 9,300–9,700 → 12,800–13,400 turns/s, added p50 −37 %; at c=1,
    /// where nobody waits, the same as before: no waiter is registered, none woken).
    pub(super) async fn flush_queued(&self) -> Result<(), StoreError> {
        let group = &self.shared.group;
        let target = group.last_queued();
        let mut done = std::pin::pin!(group.commit_done());
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            if group.committed() >= target {
                return group.outcome(target);
            }
            // Lead a commit, or wait for the one under way without blocking this thread (other
            // tasks run meanwhile); it may have taken its batch before our writes.
            if self.shared.fsync {
                if let Some(lead) = FsyncLead::take(&self.shared) {
                    let store = self.clone();
                    let commit = tokio::task::spawn_blocking(move || {
                        let _lead = lead;
                        store.commit_queued()
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
                waiting = Some(group.waiting());
                done.as_mut().enable();
                std::sync::atomic::fence(SeqCst);
                continue;
            }
            done.as_mut().await;
            done.set(group.commit_done());
            done.as_mut().enable();
        }
    }

    /// [`SqliteStore::flush_queued`] on the calling thread.
    pub(super) fn commit_queued(&self) -> Result<(), StoreError> {
        let target = self.shared.group.last_queued();
        self.commit_locked(target, lock(&self.shared.writer))
    }

    /// Commits what is queued, unless a commit since `target` was queued did already; the
    /// outcome for `target`.
    fn commit_locked(&self, target: u64, mut w: MutexGuard<'_, Writer>) -> Result<(), StoreError> {
        if w.done < target {
            // Leader: commit everything queued, ours and whatever came after it.
            let group = &self.shared.group;
            let (ops, last) = group.take();
            let first = w.done + 1;
            let written = if let Some(injected) = self.shared.faults.inject() {
                Err(injected)
            } else {
                crate::metrics::store_commit(|| write_batch(&mut w.conn, &ops))
            };
            if written.is_ok() {
                w.commits += 1;
                self.shared.faults.committed();
            }
            group.settle(first, last, written.err().map(|e| e.to_string()));
            w.done = last;
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
        self.shared.group.wake_waiting();
        self.shared.group.outcome(target)
    }

    /// Whether the store can be written now (`/readyz`): the writer can take SQLite's write
    /// lock (`BEGIN IMMEDIATE`, rolled back: nothing is written). After a failed commit (a full
    /// disk, an I/O error) that is not enough: the database's filesystem must have
    /// [`PROBE_ROOM`] free and a real write (the header page, rewritten as it is) must commit,
    /// so that the store is ready again once space returns, with no turn needed to find out.
    /// Blocks while a commit is under way; call it off the async threads.
    pub(super) fn probe(&self) -> Result<(), StoreError> {
        let last = self.shared.group.committed();
        let failed = if last > 0 {
            self.shared.group.failure(last)
        } else {
            None
        };
        let w = lock(&self.shared.writer);
        let Some(e) = failed else {
            w.conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")?;
            return Ok(());
        };
        let unwritable =
            |why: String| StoreError::WriteFailed(format!("the last commit failed ({e}); {why}"));
        match free_bytes(&self.shared.dir) {
            Some(free) if free < PROBE_ROOM => {
                return Err(unwritable(format!(
                    "{} has {free} bytes free",
                    self.shared.dir.display()
                )))
            }
            _ => {}
        }
        let version: i64 = w.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let wrote = w.conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; PRAGMA user_version = {version}; COMMIT;"
        ));
        if let Err(err) = wrote {
            if !w.conn.is_autocommit() {
                let _ = w.conn.execute_batch("ROLLBACK");
            }
            return Err(unwritable(format!("a test write failed too: {err}")));
        }
        Ok(())
    }
}

/// The free space a store whose last commit failed needs to be called writable again.
const PROBE_ROOM: u64 = 1 << 20;

/// The bytes an unprivileged writer may still use on the filesystem of `dir` (`None` if it
/// cannot be asked).
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The one flush that, with `fsync`, has a commit under way on a blocking thread; the others
/// wait for it asleep instead of each taking a blocking thread to wait on the writer's lock.
/// Let go (and the waiters woken) when dropped, whatever became of the commit.
struct FsyncLead(Arc<Shared>);

impl FsyncLead {
    fn take(shared: &Arc<Shared>) -> Option<FsyncLead> {
        shared
            .fsync_leading
            .compare_exchange(false, true, SeqCst, SeqCst)
            .ok()
            .map(|_| FsyncLead(shared.clone()))
    }
}

impl Drop for FsyncLead {
    fn drop(&mut self) {
        self.0.fsync_leading.store(false, SeqCst);
        self.0.group.wake_waiting();
    }
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
                tx.execute("DELETE FROM inbox WHERE session_id = ?1", params![id])?;
                tx.execute("DELETE FROM sessions WHERE id = ?1", params![id])?;
                tx.execute(
                    "DELETE FROM idempotency_keys WHERE session_id = ?1",
                    params![id],
                )?;
            }
            WriteOp::PutKey(k) => super::idem_keys::put(tx, k)?,
            WriteOp::PurgeKeys(before) => super::idem_keys::purge(tx, *before)?,
            WriteOp::Usage(row) => super::usage_rows::add(tx, row)?,
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
            WriteOp::InboxPut {
                session_id,
                turn_id,
                kind,
                body,
                taken: _,
            } => {
                tx.prepare_cached(
                    "INSERT INTO inbox (session_id, kind, body, turn_id) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![&**session_id, kind, body, turn_id])?;
            }
            WriteOp::InboxDone {
                session_id,
                turn_id,
            } => {
                tx.prepare_cached("DELETE FROM inbox WHERE session_id = ?1 AND turn_id = ?2")?
                    .execute(params![&**session_id, turn_id])?;
            }
        }
    }
    Ok(())
}
