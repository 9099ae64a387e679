//! The PostgreSQL backend's group commit: one leader at a time (an async lock), which takes
//! everything queued and writes it as one transaction in one round trip.
//!
//! The transaction is pipelined: `BEGIN`, one statement per run of events (all of them in one
//! `INSERT ... SELECT FROM unnest(...)`), one per other write (in queue order), one
//! `pg_notify` per session with events in the batch, then `COMMIT`, all sent before the first
//! answer is read (statements are prepared once per connection). A statement that fails
//! aborts the transaction (PostgreSQL answers `COMMIT` with a rollback), and its error fails
//! the whole batch.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::{PgStore, EVENTS_CHANNEL};
use crate::log::backend::{pg_error_text, WriteOp};
use crate::log::StoreError;

const INSERT_EVENTS: &str = "INSERT INTO events (session_id, seq, id, turn_id, type, json)
     SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[])";
const PUT_SESSION: &str = "INSERT INTO sessions (id, owner, created_at, record)
     VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET record = excluded.record";
const DELETE_SESSION: &str = "WITH e AS (DELETE FROM events WHERE session_id = $1),
          l AS (DELETE FROM leases WHERE session_id = $1)
     DELETE FROM sessions WHERE id = $1";
const PUT_FILE: &str =
    "INSERT INTO files (id, owner, filename, mime_type, size_bytes, sha256, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const DELETE_FILE: &str = "DELETE FROM files WHERE id = $1";
const NOTIFY: &str =
    "SELECT pg_notify($1, s || ' ' || q::text) FROM unnest($2::text[], $3::int8[]) AS t(s, q)";

type Param<'a> = &'a (dyn ToSql + Sync);
type Pending<'a> = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

impl PgStore {
    /// Commits what is queued, unless a commit since `target` was queued did already; the
    /// outcome for `target`. Runs on the store's runtime.
    pub(super) async fn commit_to(&self, target: u64) -> Result<(), StoreError> {
        let group = &self.shared.group;
        // Followers wait here asleep; whoever gets the lock next takes all that queued meanwhile.
        let mut done = self.shared.writer.lock().await;
        if *done < target {
            let (ops, last) = group.take();
            // Deltas that lead to events of this batch are heard before its commit.
            self.send_deltas_before_commit().await;
            let first = *done + 1;
            let started = std::time::Instant::now();
            let written = self.write(&ops).await;
            crate::metrics::store_commit_took(started.elapsed());
            self.shared
                .last_failed
                .store(written.is_err(), Ordering::Release);
            group.settle(first, last, written.err());
            *done = last;
        }
        drop(done);
        group.wake_waiting();
        group.outcome(target)
    }

    async fn write(&self, ops: &[WriteOp]) -> Result<(), String> {
        #[cfg(any(test, feature = "testkit"))]
        {
            let f = &self.shared.faults;
            if f.fail_next
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err("injected by Store::fail_commits".into());
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        let client = self.shared.pool.get().await.map_err(|e| e.to_string())?;
        let written = write_batch(&client, ops).await;
        if written.is_err() && !client.is_closed() {
            let _ = client.batch_execute("ROLLBACK").await;
        }
        written.map_err(|e| pg_error_text(&e))?;
        #[cfg(any(test, feature = "testkit"))]
        self.shared
            .faults
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// The prepared statements of one connection.
struct Statements {
    events: Statement,
    put_session: Statement,
    delete_session: Statement,
    put_file: Statement,
    delete_file: Statement,
    notify: Statement,
}

/// One statement of the batch, with what it binds.
enum Step<'a> {
    Events {
        sid: Vec<&'a str>,
        seq: Vec<i64>,
        id: Vec<&'a str>,
        turn: Vec<&'a str>,
        kind: Vec<&'a str>,
        json: Vec<&'a str>,
    },
    File(&'a crate::log::FileRow, i64),
    Op(&'a WriteOp),
}

/// Plan the batch: consecutive events become one statement; other writes keep their place.
fn plan(ops: &[WriteOp]) -> (Vec<Step<'_>>, BTreeMap<&str, i64>) {
    let mut steps: Vec<Step<'_>> = Vec::new();
    let mut last_seq: BTreeMap<&str, i64> = BTreeMap::new();
    for op in ops {
        match op {
            WriteOp::Event {
                session_id,
                seq,
                id,
                turn_id,
                kind,
                json,
            } => {
                let seq = *seq as i64;
                let e = last_seq.entry(&**session_id).or_insert(seq);
                *e = (*e).max(seq);
                if !matches!(steps.last(), Some(Step::Events { .. })) {
                    steps.push(Step::Events {
                        sid: vec![],
                        seq: vec![],
                        id: vec![],
                        turn: vec![],
                        kind: vec![],
                        json: vec![],
                    });
                }
                if let Some(Step::Events {
                    sid,
                    seq: seqs,
                    id: ids,
                    turn,
                    kind: kinds,
                    json: jsons,
                }) = steps.last_mut()
                {
                    sid.push(session_id);
                    seqs.push(seq);
                    ids.push(id);
                    turn.push(turn_id);
                    kinds.push(kind);
                    jsons.push(json);
                }
            }
            WriteOp::PutFile(f) => steps.push(Step::File(f, f.size_bytes as i64)),
            other => steps.push(Step::Op(other)),
        }
    }
    (steps, last_seq)
}

/// Write `ops` as one transaction, pipelined in one round trip.
async fn write_batch(
    client: &deadpool_postgres::Client,
    ops: &[WriteOp],
) -> Result<(), tokio_postgres::Error> {
    let st = Statements {
        events: client.prepare_cached(INSERT_EVENTS).await?,
        put_session: client.prepare_cached(PUT_SESSION).await?,
        delete_session: client.prepare_cached(DELETE_SESSION).await?,
        put_file: client.prepare_cached(PUT_FILE).await?,
        delete_file: client.prepare_cached(DELETE_FILE).await?,
        notify: client.prepare_cached(NOTIFY).await?,
    };
    let (steps, last_seq) = plan(ops);
    let notify_sids: Vec<&str> = last_seq.keys().copied().collect();
    let notify_seqs: Vec<i64> = last_seq.values().copied().collect();
    let c: &Client = client;
    let mut pending: Vec<Pending<'_>> = Vec::with_capacity(steps.len() + 3);
    pending.push(Box::pin(c.batch_execute("BEGIN")));
    for step in &steps {
        let (stmt, params): (&Statement, Vec<Param<'_>>) = match step {
            Step::Events {
                sid,
                seq,
                id,
                turn,
                kind,
                json,
            } => (&st.events, vec![sid, seq, id, turn, kind, json]),
            Step::File(f, size) => (
                &st.put_file,
                vec![
                    &f.id,
                    &f.owner,
                    &f.filename,
                    &f.mime_type,
                    size,
                    &f.sha256,
                    &f.created_at,
                ],
            ),
            Step::Op(WriteOp::PutSession(r)) => (
                &st.put_session,
                vec![&r.id, &r.owner, &r.created_at, &r.record],
            ),
            Step::Op(WriteOp::DeleteSession(id)) => (&st.delete_session, vec![id]),
            Step::Op(WriteOp::DeleteFile(id)) => (&st.delete_file, vec![id]),
            Step::Op(WriteOp::Event { .. } | WriteOp::PutFile(_)) => continue,
        };
        pending.push(Box::pin(async move {
            c.execute_raw(stmt, params).await.map(|_| ())
        }));
    }
    if !notify_sids.is_empty() {
        let params: Vec<Param<'_>> = vec![&EVENTS_CHANNEL, &notify_sids, &notify_seqs];
        let stmt = &st.notify;
        pending.push(Box::pin(async move {
            c.execute_raw(stmt, params).await.map(|_| ())
        }));
    }
    pending.push(Box::pin(c.batch_execute("COMMIT")));
    join_in_order(pending).await
}

/// Polls every future, first in the order given (each sends its request on its first poll, so
/// they reach the server in that order), until all are done; the first error in that order.
async fn join_in_order(mut pending: Vec<Pending<'_>>) -> Result<(), tokio_postgres::Error> {
    let mut results: Vec<Option<Result<(), tokio_postgres::Error>>> =
        pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut busy = false;
        for (f, r) in pending.iter_mut().zip(results.iter_mut()) {
            if r.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *r = Some(v),
                    Poll::Pending => busy = true,
                }
            }
        }
        if busy {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
