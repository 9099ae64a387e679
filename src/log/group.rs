//! The backend-neutral half of group commit: the queue of writes with their tickets, the
//! durability watermark, the record of failed commits, and the wake-up of flushes waiting on
//! another's commit. A backend keeps the other half: who leads a commit (SQLite: whoever takes
//! the writer's lock; a network backend: whoever takes an async lock) and how a batch is
//! written. The model is described in `backend.rs`.
//!
//! A leader's commit, in order: [`GroupCommit::take`] the whole queue, write it as one
//! transaction, [`GroupCommit::settle`] its tickets (a failure is recorded before the watermark
//! passes it), let go of whatever made it the leader, then [`GroupCommit::wake_waiting`].
//! A follower that finds a commit under way counts itself with [`GroupCommit::waiting`],
//! registers its `Notified`, fences and looks again before it sleeps, so that it either sees
//! the commit's end or is woken by it.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::rows::{StoreError, WriteOp};
use crate::sync::lock;

/// A purge of expired idempotency keys rides along with the first key queued and every this
/// many after it (each purge deletes up to `PURGE_KEYS_AT_MOST`, twice this: purges keep up).
const PURGE_KEYS_EVERY: u64 = 1000;

/// Failed commits remembered, so that the callers whose writes they held learn of it.
const MAX_FAILURES: usize = 64;

#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: Mutex<Queue>,
    /// Every ticket up to this one has been through a commit.
    committed: AtomicU64,
    /// Woken after every commit, for flushes waiting on another's...
    commit_done: tokio::sync::Notify,
    /// ...when there are any: how many.
    waiting: AtomicUsize,
    /// Recent failed commits, whole or in part (see [`GroupCommit::failure`]).
    failures: Mutex<VecDeque<Failure>>,
    /// Whether any commit has ever failed: when none has, `failure` takes no lock.
    any_failed: AtomicBool,
    /// Idempotency keys queued (for the purge that rides along now and then).
    keys_put: AtomicU64,
}

/// A commit that failed: every ticket of `first..=last`, or only those of `only` (sorted).
struct Failure {
    first: u64,
    last: u64,
    only: Option<Vec<u64>>,
    error: String,
}

impl Failure {
    fn holds(&self, ticket: u64) -> bool {
        (self.first..=self.last).contains(&ticket)
            && self
                .only
                .as_ref()
                .is_none_or(|only| only.binary_search(&ticket).is_ok())
    }
}

/// Writes not yet committed. Every write gets a ticket, counting from 1.
#[derive(Default)]
struct Queue {
    ops: Vec<WriteOp>,
    /// The ticket of the last write queued.
    last: u64,
}

impl GroupCommit {
    /// Queue a write; its ticket.
    pub(crate) fn push(&self, op: WriteOp) -> u64 {
        let mut q = lock(&self.queue);
        q.ops.push(op);
        q.last += 1;
        q.last
    }

    /// Queue an idempotency key's row, with a purge of the keys created before
    /// `forget_before_ms` now and then (the first key queued, then every
    /// [`PURGE_KEYS_EVERY`]th): in the same commit, bounded. The key's ticket.
    pub(crate) fn push_key(&self, row: super::rows::KeyRow, forget_before_ms: i64) -> u64 {
        if self.keys_put.fetch_add(1, Ordering::Relaxed) % PURGE_KEYS_EVERY == 0 {
            self.push(WriteOp::PurgeKeys(forget_before_ms));
        }
        self.push(WriteOp::PutKey(row))
    }

    /// The ticket of the last write queued: what a flush called now waits for.
    pub(crate) fn last_queued(&self) -> u64 {
        lock(&self.queue).last
    }

    /// Everything queued, and the ticket of its last write (the leader's batch).
    pub(crate) fn take(&self) -> (Vec<WriteOp>, u64) {
        let mut q = lock(&self.queue);
        (std::mem::take(&mut q.ops), q.last)
    }

    /// Every write whose ticket is at most this has been through a commit.
    pub(crate) fn committed(&self) -> u64 {
        self.committed.load(Ordering::SeqCst)
    }

    /// The commit of tickets `first..=last` is over: record its failure, if it failed, then
    /// move the watermark past it.
    pub(crate) fn settle(&self, first: u64, last: u64, failed: Option<String>) {
        if let Some(error) = failed {
            tracing::error!(error = %error, "store: a group commit failed");
            self.record(Failure {
                first,
                last,
                only: None,
                error,
            });
        }
        self.committed.store(last, Ordering::SeqCst);
    }

    /// The commit of tickets `first..=last` is over, and committed all but these groups of
    /// tickets (each with its error: one session's writes the server refused): only theirs
    /// fail. Then the watermark moves past it.
    pub(crate) fn settle_each(&self, first: u64, last: u64, failed: Vec<(Vec<u64>, String)>) {
        for (mut tickets, error) in failed {
            tracing::error!(error = %error, writes = tickets.len(), "store: a session's writes were refused; the rest of the group commit went in");
            tickets.sort_unstable();
            self.record(Failure {
                first,
                last,
                only: Some(tickets),
                error,
            });
        }
        self.committed.store(last, Ordering::SeqCst);
    }

    fn record(&self, failure: Failure) {
        let mut failures = lock(&self.failures);
        if failures.len() == MAX_FAILURES {
            failures.pop_front();
        }
        failures.push_back(failure);
        self.any_failed.store(true, Ordering::Release);
    }

    /// The error of the commit that took this ticket, if it failed (the last 64 failures).
    pub(crate) fn failure(&self, ticket: u64) -> Option<String> {
        if !self.any_failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.failures)
            .iter()
            .find(|f| f.holds(ticket))
            .map(|f| f.error.clone())
    }

    /// Whether the commit that took `target` succeeded (a commit that failed in part: whether
    /// `target`'s write is among those that went in).
    pub(crate) fn outcome(&self, target: u64) -> Result<(), StoreError> {
        match self.failure(target) {
            Some(e) => Err(StoreError::WriteFailed(e)),
            None => Ok(()),
        }
    }

    /// What a waiting flush sleeps on (count it with [`GroupCommit::waiting`] first, then
    /// `enable` it, fence, and look at the watermark again before awaiting it).
    pub(crate) fn commit_done(&self) -> tokio::sync::futures::Notified<'_> {
        self.commit_done.notified()
    }

    /// Count a flush among those waiting on a commit, until the guard is dropped.
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(self)
    }

    /// Wakes the flushes waiting on a commit, if any: called once the watermark or whatever
    /// makes a leader (a lock, a flag) has changed. With the fences on both sides, a flush
    /// either is counted here or sees the change when it looks again.
    pub(crate) fn wake_waiting(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.commit_done.notify_waiters();
        }
    }
}

/// A flush counted among those waiting on a commit, until it returns or is dropped.
pub(crate) struct Waiting<'a>(&'a GroupCommit);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_failed_in_part_fails_only_the_tickets_named() {
        let g = GroupCommit::default();
        for _ in 0..6 {
            g.push(WriteOp::DeleteFile("f".into()));
        }
        g.settle_each(1, 4, vec![(vec![3, 1], "23505: duplicate key".into())]);
        assert_eq!(g.committed(), 4);
        assert_eq!(g.failure(1).as_deref(), Some("23505: duplicate key"));
        assert_eq!(g.failure(3).as_deref(), Some("23505: duplicate key"));
        assert_eq!(g.failure(2), None);
        assert_eq!(g.failure(4), None);
        assert!(g.outcome(4).is_ok());
        assert!(g.outcome(3).is_err());
        // A whole failure after it fails every ticket of its range.
        g.settle(5, 6, Some("connection lost".into()));
        assert_eq!(g.failure(5).as_deref(), Some("connection lost"));
        assert_eq!(g.failure(6).as_deref(), Some("connection lost"));
        assert_eq!(g.failure(2), None);
    }
}
