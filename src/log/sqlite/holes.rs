//! No event after a hole: once a commit holding a session's events has failed, that session's
//! later events go in only where they follow an event the log has. The engine reads a session
//! back after a failed commit and writes on from what is stored; an event appended before it
//! knew (its turn's closing, a tool's result) would otherwise be written after the events lost
//! with the commit. PostgreSQL's fence refuses the same (`TSL02`, `postgres/schema.rs`).
//!
//! Costs nothing until a commit fails: only sessions named here are looked at, and each is
//! forgotten once an event of it follows one the log has.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection};

use crate::log::backend::WriteOp;

/// Sessions whose events a failed commit held, each with the first seq it lost.
#[derive(Default)]
pub(super) struct Holes(HashMap<Arc<str>, u64>);

impl Holes {
    /// The commit of `batch` failed: its sessions' events are not in the log.
    pub(super) fn lost(&mut self, batch: &[WriteOp]) {
        for op in batch {
            if let WriteOp::Event {
                session_id, seq, ..
            } = op
            {
                let first = self.0.entry(session_id.clone()).or_insert(*seq);
                *first = (*first).min(*seq);
            }
        }
    }

    /// Take out of `batch` (tickets from `first`) the writes refused, and return their
    /// tickets with why: from a session named here, its events until one follows an event the
    /// log (or the batch) has, and the rows that go with those events (a queued turn's inbox
    /// row taken, an idempotency key). A session whose event follows is forgotten; so is one
    /// deleted.
    pub(super) fn refuse(
        &mut self,
        conn: &Connection,
        batch: &mut Vec<WriteOp>,
        first: u64,
    ) -> rusqlite::Result<Option<(Vec<u64>, String)>> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let mut refused = Vec::new();
        let mut why = String::new();
        // The last seq of each session written by this batch so far.
        let mut written: HashMap<&str, u64> = HashMap::new();
        for (ticket, op) in (first..).zip(batch.iter()) {
            let Some(session) = op.session() else {
                continue;
            };
            if !self.0.contains_key(session) {
                continue;
            }
            match op {
                WriteOp::Event { seq, .. } => {
                    let follows = *seq == 1
                        || written.get(session) == Some(&(seq - 1))
                        || stored(conn, session, seq - 1)?;
                    if follows {
                        self.0.remove(session);
                        written.insert(session, *seq);
                    } else {
                        if why.is_empty() {
                            why = format!(
                                "session {session} has no event {}: its event {seq} would leave a hole (an earlier commit failed)",
                                seq - 1
                            );
                        }
                        refused.push(ticket);
                    }
                }
                WriteOp::InboxDone { .. } | WriteOp::PutKey(_) => refused.push(ticket),
                WriteOp::DeleteSession(_) => {
                    self.0.remove(session);
                }
                _ => {}
            }
        }
        if refused.is_empty() {
            return Ok(None);
        }
        let mut ticket = first..;
        batch.retain(|_| {
            let t = ticket.next().unwrap_or(u64::MAX);
            refused.binary_search(&t).is_err()
        });
        Ok(Some((refused, why)))
    }
}

/// Whether the log has the session's event `seq`.
fn stored(conn: &Connection, session: &str, seq: u64) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM events WHERE session_id = ?1 AND seq = ?2")?
        .exists(params![session, seq as i64])
}

#[cfg(test)]
mod tests;
