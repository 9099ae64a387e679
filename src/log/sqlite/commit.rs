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

use super::{usage_rows, Shared, SqliteStore, Writer};
use crate::log::backend::WriteOp;
use crate::log::group::Waiting;
use crate::log::{StoreError, UsageRow};
use crate::sync::lock;

/// Commits between checkpoint requests (about 1,000 pages of WAL at the default page size
/// for small events), and the longest time between them.
const CHECKPOINT_EVERY: u32 = 1000;
const CHECKPOINT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// How often a commit folds the usage riding on events into `usage` (see `usage_rows.rs`).
const FOLD_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

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
            let (mut ops, last) = group.take();
            let first = w.done + 1;
            let fold = !w.riding.is_empty() && w.last_fold.elapsed() >= FOLD_AFTER;
            let refused = {
                let w = &mut *w;
                w.holes.refuse(&w.conn, &mut ops, first)
            };
            let written = match (refused, self.shared.faults.inject()) {
                (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                (Ok(refused), None) => {
                    let w = &mut *w;
                    let usage = (&w.riding[..], fold, w.log_folded);
                    crate::metrics::store_commit(|| write_batch(&mut w.conn, &ops, usage))
                        .map(|u| (u, refused))
                }
            };
            if written.is_err() {
                w.holes.lost(&ops);
            }
            let written = match written.map_err(|e| e.to_string()) {
                Ok((usage, refused)) => {
                    w.commits += 1;
                    w.log_folded = true;
                    self.shared.faults.committed();
                    if usage.folded {
                        w.riding.clear();
                        w.last_fold = std::time::Instant::now();
                    }
                    usage_rows::merge_into(&mut w.riding, usage.riding);
                    Ok(refused)
                }
                Err(e) => Err(e),
            };
            match written {
                Ok(Some(refused)) => group.settle_each(first, last, vec![refused]),
                Ok(None) => group.settle(first, last, None),
                Err(e) => group.settle(first, last, Some(e)),
            }
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

    /// Fold the usage riding on events into `usage` now (see `usage_rows.rs`), on the writer
    /// (after the commit under way, if any): before usage is read.
    pub(super) fn fold_usage(&self) -> Result<(), StoreError> {
        let mut w = lock(&self.shared.writer);
        if w.riding.is_empty() && w.log_folded {
            return Ok(());
        }
        let w = &mut *w;
        let tx = w
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if !w.log_folded {
            usage_rows::fold_from_log(&tx)?;
        }
        usage_rows::fold(&tx, &w.riding)?;
        tx.commit()?;
        w.log_folded = true;
        w.riding.clear();
        w.last_fold = std::time::Instant::now();
        Ok(())
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

/// What a batch did with usage (see `usage_rows.rs`).
#[derive(Default)]
struct UsageWritten {
    /// The usage riding on the batch's last event, added up (not folded yet).
    riding: Vec<UsageRow>,
    /// The writer's riding usage (`Writer::riding`) went into `usage`, with the mark.
    folded: bool,
}

/// Write `batch` as one transaction. `riding`: the usage riding on the events committed since
/// the last fold (see `usage_rows.rs`), folded by this batch with `fold`, or before it deletes
/// a session.
fn write_batch(
    conn: &mut Connection,
    batch: &[WriteOp],
    (riding, fold, log_folded): (&[UsageRow], bool, bool),
) -> rusqlite::Result<UsageWritten> {
    // Cached BEGIN/COMMIT statements: `Connection::transaction` parses them on every call.
    // IMMEDIATE: a batch that reads (a fold's mark) must not find its snapshot stale when it
    // comes to write (that is SQLITE_BUSY at once, with no busy wait).
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let from_log = if log_folded {
        Ok(())
    } else {
        usage_rows::fold_from_log(conn)
    };
    let result = from_log
        .and_then(|()| write_ops(conn, batch, riding))
        .and_then(|mut w| {
            if fold && !w.folded {
                usage_rows::merge_into(&mut w.riding, riding.iter().cloned());
                usage_rows::fold(conn, &w.riding)?;
                w = UsageWritten {
                    riding: Vec::new(),
                    folded: true,
                };
            }
            conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(w)
        });
    if result.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Where the batch's usage rides (see `usage_rows.rs`): on its last event (its index), added
/// up. Without an event, or in a batch that deletes a session, it rides on nothing (and is
/// added to `usage` at once).
fn riding_of(batch: &[WriteOp]) -> (Option<usize>, UsageWritten) {
    let deletes = batch
        .iter()
        .any(|op| matches!(op, WriteOp::DeleteSession(_)));
    let last_event = batch
        .iter()
        .rposition(|op| matches!(op, WriteOp::Event { .. }))
        .filter(|_| !deletes);
    let mut written = UsageWritten::default();
    if last_event.is_some() {
        let usage = batch.iter().filter_map(|op| match op {
            WriteOp::Usage(row) => Some(row.clone()),
            _ => None,
        });
        usage_rows::merge_into(&mut written.riding, usage);
    }
    (last_event, written)
}

fn write_ops(
    tx: &Connection,
    batch: &[WriteOp],
    pending: &[UsageRow],
) -> rusqlite::Result<UsageWritten> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO events (session_id, seq, id, turn_id, type, json, usage)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let (last_event, mut written) = riding_of(batch);
    let riding_json = (!written.riding.is_empty()).then(|| usage_rows::riding(&written.riding));
    for (i, op) in batch.iter().enumerate() {
        match op {
            WriteOp::Event {
                session_id,
                seq,
                id,
                turn_id,
                kind,
                json,
            } => {
                let usage = riding_json.as_deref().filter(|_| Some(i) == last_event);
                insert.execute(params![
                    &**session_id,
                    *seq as i64,
                    id,
                    turn_id,
                    kind,
                    &**json,
                    usage
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
                delete_session(tx, id, pending, !written.folded)?;
                written.folded = true;
            }
            WriteOp::PutKey(k) => super::idem_keys::put(tx, k)?,
            WriteOp::PurgeKeys(before) => super::idem_keys::purge(tx, *before)?,
            WriteOp::Usage(row) if riding_json.is_none() => usage_rows::add(tx, row)?,
            WriteOp::Usage(_) => {}
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
    Ok(written)
}

/// Delete a session's events, inbox rows, row and idempotency keys. The usage riding on its
/// events is its principal's, session or not: with `fold`, `pending` (what rides on every
/// event not folded) goes into `usage` first; then every event left counts as folded.
fn delete_session(
    tx: &Connection,
    id: &str,
    pending: &[UsageRow],
    fold: bool,
) -> rusqlite::Result<()> {
    if fold {
        usage_rows::fold(tx, pending)?;
    }
    tx.execute("DELETE FROM events WHERE session_id = ?1", params![id])?;
    tx.execute("DELETE FROM inbox WHERE session_id = ?1", params![id])?;
    tx.execute("DELETE FROM sessions WHERE id = ?1", params![id])?;
    tx.execute(
        "DELETE FROM idempotency_keys WHERE session_id = ?1",
        params![id],
    )?;
    usage_rows::mark_folded(tx)
}
