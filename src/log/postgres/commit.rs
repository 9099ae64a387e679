//! The PostgreSQL backend's group commit: one leader at a time (an async lock), which takes
//! everything queued and writes it as one transaction in one round trip.
//!
//! The transaction is pipelined: `BEGIN`, one statement per run of events (all of them in one
//! `INSERT ... SELECT FROM unnest(...)`), one per other write (in queue order), one
//! `pg_notify` per session with events in the batch, then `COMMIT`, all sent before the first
//! answer is read (statements are prepared once per connection).
//!
//! **One session's clash fails that session only.** A statement that fails aborts the
//! transaction (the pipelined `COMMIT` is answered with a rollback). When the server refused a
//! statement (a stale writer's duplicate `(session_id, seq)`, a row it will not take) and the
//! batch held the writes of several sessions, the batch is written again, isolated
//! ([`write_isolated`]): each session's writes (and the file records and key purges, as one
//! more group) in a `SAVEPOINT` of their own; a group the server refuses is rolled back to its
//! savepoint and left out, the others go on and commit. The tickets of the groups left out fail
//! (`GroupCommit::settle_each`), everyone else's succeed. The normal case pays nothing for
//! this (the same one statement for all events, no savepoint); a clash costs a round trip
//! per group refused, plus two.
//!
//! **Only a lease's holder writes events, and never after a hole.** Each batch (each group,
//! when isolated) begins with the fence: the lease rows of the sessions whose events it writes
//! are locked to the commit, and unless this instance holds every one, and each session's first
//! event in the batch follows one the log has, the server refuses the batch. A writer whose
//! lease was taken over while it stalled (or while the database was away for longer than
//! `lease_s`), or whose earlier events were lost with a failed commit, so fails its commit and
//! reads the session back, as after any failed commit; the taker, whose take-over waited for the
//! lock, reads what the last fenced commit wrote.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::commit_plan::{plan, LastSeqs, Step};
use super::pg_store::{PgStore, EVENTS_CHANNEL};
use crate::log::backend::{pg_error_text, WriteOp};
use crate::log::rows::PURGE_KEYS_AT_MOST;
use crate::log::StoreError;

const INSERT_EVENTS: &str = "INSERT INTO events (session_id, seq, id, turn_id, type, json)
     SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[])";
const PUT_SESSION: &str = "INSERT INTO sessions (id, owner, created_at, record)
     VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET record = excluded.record";
const DELETE_SESSION: &str = "WITH e AS (DELETE FROM events WHERE session_id = $1),
          l AS (DELETE FROM leases WHERE session_id = $1),
          i AS (DELETE FROM inbox WHERE session_id = $1),
          k AS (DELETE FROM idempotency_keys WHERE session_id = $1)
     DELETE FROM sessions WHERE id = $1";
const PUT_FILE: &str =
    "INSERT INTO files (id, owner, filename, mime_type, size_bytes, sha256, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const DELETE_FILE: &str = "DELETE FROM files WHERE id = $1";
const INBOX_PUT: &str =
    "INSERT INTO inbox (session_id, kind, body, turn_id, taken) VALUES ($1, $2, $3, $4, $5)";
const INBOX_DONE: &str = "DELETE FROM inbox WHERE session_id = $1 AND turn_id = $2";
/// An idempotency key's row, its turn started (replacing this instance's reservation).
const PUT_KEY: &str =
    "INSERT INTO idempotency_keys (session_id, key, fingerprint, turn_id, after_seq, created_at)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (session_id, key) DO UPDATE SET fingerprint = excluded.fingerprint,
         turn_id = excluded.turn_id, after_seq = excluded.after_seq,
         created_at = excluded.created_at";
/// The oldest idempotency keys created before `$1`, at most `$2` (by the `created_at` index).
const PURGE_KEYS: &str = "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
         SELECT ctid FROM idempotency_keys WHERE created_at < $1 LIMIT $2))";
/// Locks the lease rows of the sessions whose events a batch (or a group) writes, and fails
/// unless this instance holds every one and each session's first event here follows one the
/// log has (schema migration 6).
const FENCE: &str = "SELECT turnstile_fence($1::text[], $2::int8[], $3)";
const NOTIFY: &str =
    "SELECT pg_notify($1, s || ' ' || q::text) FROM unnest($2::text[], $3::int8[]) AS t(s, q)";

/// Each group of an isolated write in its own savepoint (one name: a group's is released, or
/// rolled back to, before the next is made).
const SAVEPOINT_GROUP: &str = "SAVEPOINT turnstile_group";
const RELEASE_GROUP: &str = "RELEASE SAVEPOINT turnstile_group";
const ROLLBACK_GROUP: &str = "ROLLBACK TO SAVEPOINT turnstile_group";

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
            let written = self.write(&ops, first).await;
            crate::metrics::store_commit_took(started.elapsed());
            self.shared
                .last_failed
                .store(written.is_err(), Ordering::Release);
            match written {
                Ok(refused) if !refused.is_empty() => group.settle_each(first, last, refused),
                written => group.settle(first, last, written.err()),
            }
            *done = last;
        }
        drop(done);
        group.wake_waiting();
        group.outcome(target)
    }

    /// Writes the batch whose first ticket is `first`: `Ok` with the groups of writes the server
    /// refused (their tickets and why; the rest is committed), or `Err` when nothing is.
    async fn write(&self, ops: &[WriteOp], first: u64) -> Result<Refused, String> {
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
            return Ok(Vec::new());
        }
        let client = self.shared.pool.get().await.map_err(|e| e.to_string())?;
        let st = statements(&client).await.map_err(|e| pg_error_text(&e))?;
        let me = self.shared.instance.as_str();
        let written = match write_batch(&client, &st, ops, me).await {
            Ok(()) => Ok(Vec::new()),
            Err(e) if refused(&e) && !client.is_closed() => {
                let groups = by_session(ops, first);
                if groups.len() < 2 {
                    Err(e)
                } else {
                    // The pipelined `COMMIT` ended the aborted transaction.
                    let _ = client.batch_execute("ROLLBACK").await;
                    tracing::warn!(error = %pg_error_text(&e), "store: a commit was refused; written again with each session's writes isolated");
                    write_isolated(&client, &st, &groups, me).await
                }
            }
            Err(e) => Err(e),
        };
        if written.is_err() && !client.is_closed() {
            let _ = client.batch_execute("ROLLBACK").await;
        }
        let refused = written.map_err(|e| pg_error_text(&e))?;
        #[cfg(any(test, feature = "testkit"))]
        self.shared
            .faults
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(refused)
    }
}

/// Groups of writes the server refused: their tickets, and its error.
type Refused = Vec<(Vec<u64>, String)>;

/// Whether the server refused a statement of the batch (its writes may be at fault: a
/// duplicate key, a row it will not take), rather than the connection failing.
fn refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some()
}

/// The prepared statements of one connection.
struct Statements {
    events: Statement,
    put_session: Statement,
    delete_session: Statement,
    put_file: Statement,
    delete_file: Statement,
    inbox_put: Statement,
    inbox_done: Statement,
    put_key: Statement,
    purge_keys: Statement,
    fence: Statement,
    add_usage: Statement,
    notify: Statement,
}

async fn statements(
    client: &deadpool_postgres::Client,
) -> Result<Statements, tokio_postgres::Error> {
    Ok(Statements {
        events: client.prepare_cached(INSERT_EVENTS).await?,
        put_session: client.prepare_cached(PUT_SESSION).await?,
        delete_session: client.prepare_cached(DELETE_SESSION).await?,
        put_file: client.prepare_cached(PUT_FILE).await?,
        delete_file: client.prepare_cached(DELETE_FILE).await?,
        inbox_put: client.prepare_cached(INBOX_PUT).await?,
        inbox_done: client.prepare_cached(INBOX_DONE).await?,
        put_key: client.prepare_cached(PUT_KEY).await?,
        purge_keys: client.prepare_cached(PURGE_KEYS).await?,
        fence: client.prepare_cached(FENCE).await?,
        add_usage: client.prepare_cached(super::usage_rows::ADD_USAGE).await?,
        notify: client.prepare_cached(NOTIFY).await?,
    })
}

/// A step sent (its request goes out on the first poll), by instance `me`; `None` for none.
fn send<'a>(
    c: &'a Client,
    st: &'a Statements,
    step: &'a Step<'a>,
    me: &'a &'a str,
) -> Option<Pending<'a>> {
    let (stmt, params): (&Statement, Vec<Param<'_>>) = match step {
        Step::Fence(sessions, firsts) => (&st.fence, vec![sessions, firsts, me]),
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
        Step::Key(k, turn, after) => (
            &st.put_key,
            vec![
                &k.session_id,
                &k.key,
                &k.fingerprint,
                turn,
                after,
                &k.created_at_ms,
            ],
        ),
        Step::Op(WriteOp::DeleteFile(id)) => (&st.delete_file, vec![id]),
        Step::Inbox {
            sid,
            kind,
            body,
            turn,
            taken,
        } => (&st.inbox_put, vec![sid, kind, body, turn, taken]),
        Step::InboxDone { sid, turn } => (&st.inbox_done, vec![sid, turn]),
        Step::Usage(r, [input, output, cached, calls, tools]) => (
            &st.add_usage,
            vec![
                &r.owner,
                &r.day,
                &r.agent,
                &r.upstream,
                &r.model,
                input,
                output,
                cached,
                &r.usd,
                calls,
                tools,
            ],
        ),
        Step::Op(WriteOp::PurgeKeys(before)) => (&st.purge_keys, vec![before, &PURGE_KEYS_AT_MOST]),
        // Planned as steps of their own.
        Step::Op(_) => return None,
    };
    Some(Box::pin(async move {
        c.execute_raw(stmt, params).await.map(|_| ())
    }))
}

/// The `pg_notify` of these sessions' last seqs (delivered at `COMMIT`); `None` for none.
fn notify<'a>(c: &'a Client, st: &'a Statements, last_seq: &LastSeqs<'a>) -> Option<Pending<'a>> {
    if last_seq.is_empty() {
        return None;
    }
    let sids: Vec<&'a str> = last_seq.keys().copied().collect();
    let seqs: Vec<i64> = last_seq.values().copied().collect();
    let stmt = &st.notify;
    Some(Box::pin(async move {
        let params: [Param<'_>; 3] = [&EVENTS_CHANNEL, &sids, &seqs];
        c.execute_raw(stmt, params).await.map(|_| ())
    }))
}

/// Write `ops` as one transaction, pipelined in one round trip.
async fn write_batch(
    client: &deadpool_postgres::Client,
    st: &Statements,
    ops: &[WriteOp],
    me: &str,
) -> Result<(), tokio_postgres::Error> {
    let (steps, last_seq) = plan(ops);
    let me = &me;
    let c: &Client = client;
    let mut pending: Vec<Pending<'_>> = Vec::with_capacity(steps.len() + 3);
    pending.push(Box::pin(c.batch_execute("BEGIN")));
    pending.extend(steps.iter().filter_map(|step| send(c, st, step, me)));
    pending.extend(notify(c, st, &last_seq));
    pending.push(Box::pin(c.batch_execute("COMMIT")));
    join_in_order(pending).await.into_iter().collect()
}

/// The writes of one session in a batch (or of no session: file records), with their tickets.
struct Group<'a> {
    tickets: Vec<u64>,
    ops: Vec<&'a WriteOp>,
}

/// The batch whose first ticket is `first`, by session, in order of first appearance.
fn by_session(ops: &[WriteOp], first: u64) -> Vec<Group<'_>> {
    let mut index: std::collections::HashMap<Option<&str>, usize> = Default::default();
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (ticket, op) in (first..).zip(ops) {
        let owner = op.session();
        let i = *index.entry(owner).or_insert_with(|| {
            groups.push(Group {
                tickets: Vec::new(),
                ops: Vec::new(),
            });
            groups.len() - 1
        });
        groups[i].tickets.push(ticket);
        groups[i].ops.push(op);
    }
    groups
}

/// Write the batch as one transaction with each group in a savepoint of its own: the groups
/// pipelined; one the server refuses is rolled back to its savepoint and left out, and those
/// after it are sent again; then the notifications of the groups kept, and `COMMIT`. The
/// groups left out.
async fn write_isolated(
    client: &deadpool_postgres::Client,
    st: &Statements,
    groups: &[Group<'_>],
    me: &str,
) -> Result<Refused, tokio_postgres::Error> {
    let me = &me;
    let c: &Client = client;
    let planned: Vec<(Vec<Step<'_>>, LastSeqs<'_>)> =
        groups.iter().map(|g| plan(g.ops.iter().copied())).collect();
    let mut left_out: Refused = Vec::new();
    let mut kept = vec![true; groups.len()];
    let mut next = 0;
    let mut rollback = false;
    c.batch_execute("BEGIN").await?;
    while next < groups.len() {
        // Each sent future, with the group it belongs to.
        let mut pending: Vec<(Pending<'_>, usize)> = Vec::new();
        if std::mem::take(&mut rollback) {
            // Back to the savepoint of the group refused last: the groups before it stand.
            pending.push((Box::pin(c.batch_execute(ROLLBACK_GROUP)), usize::MAX));
        }
        for (g, (steps, _)) in planned.iter().enumerate().skip(next) {
            pending.push((Box::pin(c.batch_execute(SAVEPOINT_GROUP)), g));
            pending.extend(
                steps
                    .iter()
                    .filter_map(|s| send(c, st, s, me))
                    .map(|p| (p, g)),
            );
            pending.push((Box::pin(c.batch_execute(RELEASE_GROUP)), g));
        }
        let (futures, owners): (Vec<_>, Vec<_>) = pending.into_iter().unzip();
        let results = join_in_order(futures).await;
        let Some((at, e)) = results
            .into_iter()
            .enumerate()
            .find_map(|(i, r)| r.err().map(|e| (i, e)))
        else {
            break;
        };
        let g = owners[at];
        if g == usize::MAX || !refused(&e) {
            return Err(e);
        }
        left_out.push((groups[g].tickets.clone(), pg_error_text(&e)));
        kept[g] = false;
        next = g + 1;
        rollback = true;
    }
    if rollback {
        // The last group was refused: back to its savepoint.
        c.batch_execute(ROLLBACK_GROUP).await?;
    }
    let mut last_seq: LastSeqs<'_> = BTreeMap::new();
    for ((_, seqs), _) in planned.iter().zip(&kept).filter(|(_, k)| **k) {
        last_seq.extend(seqs.iter().map(|(s, q)| (*s, *q)));
    }
    let mut pending: Vec<Pending<'_>> = Vec::new();
    pending.extend(notify(c, st, &last_seq));
    pending.push(Box::pin(c.batch_execute("COMMIT")));
    join_in_order(pending)
        .await
        .into_iter()
        .collect::<Result<(), _>>()?;
    Ok(left_out)
}

/// Polls every future, first in the order given (each sends its request on its first poll, so
/// they reach the server in that order), until all are done; their outcomes, in that order.
async fn join_in_order(mut pending: Vec<Pending<'_>>) -> Vec<Result<(), tokio_postgres::Error>> {
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
