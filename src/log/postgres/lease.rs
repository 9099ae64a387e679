//! Scale-out on one PostgreSQL: each session has at most one writer, the instance holding its
//! lease row (`leases`: session, holder, expiry), and every instance hears the others' commits.
//!
//! - **Leases.** [`PgStore::take_lease`] inserts the row, or takes it over when it is this
//!   instance's already or has expired, in one statement (so two instances never both win).
//!   A task renews this instance's leases every third of `lease_s`; a lease it finds gone
//!   (taken over after this instance stalled past its expiry) is forgotten. Releasing deletes
//!   the row; at shutdown every lease of the instance goes at once. An instance killed with
//!   `kill -9` renews nothing: its leases expire after `lease_s` and another takes them
//!   ([`PgStore::expired_leases`]).
//! - **Commits elsewhere.** A connection of its own `LISTEN`s on the channel the commits notify
//!   (`<session> <last seq>` per session, delivered only at `COMMIT`) and hands each on to
//!   [`PgStore::commits_heard`] subscribers, who read the rows by cursor (so a lost or repeated
//!   notification loses or repeats nothing). After the connection is lost and back, a
//!   [`Heard::Resync`] says that anything may have been missed. The same connection listens
//!   for the deltas of turns running elsewhere (`deltas.rs`), handed on as [`Heard::Delta`]
//!   in the order heard, so that a delta never passes the commit it follows.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::broadcast;

use super::applied::APPLIED_CHANNEL;
use super::deltas::{self, DELTAS_CHANNEL};
use super::inbox::{Released, INBOX_CHANNEL};
use super::pg_store::{PgStore, Shared, EVENTS_CHANNEL};

pub use super::heard::Heard;
use crate::log::StoreError;
use crate::sync::lock;

/// The outcome of [`PgStore::take_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseTaken {
    /// This instance holds the lease; `fresh`: it did not before (another instance may have
    /// written the session meanwhile: read it back, then say so with `Store::lease_read_back`).
    Held { fresh: bool },
    /// Another live instance holds it.
    Busy,
}

impl PgStore {
    /// This instance's name in the lease rows.
    pub(crate) fn instance(&self) -> &str {
        &self.shared.instance
    }

    /// Take (or keep) the lease of a session.
    pub(crate) async fn take_lease(&self, session_id: &str) -> Result<LeaseTaken, StoreError> {
        let sid = session_id.to_string();
        let shared = self.shared.clone();
        self.run(move |pool| async move {
            let mut marks = shared.lease_ops.lock().await;
            let c = pool.get().await?;
            // With the lease, the other instances watching the session's deltas now: one whose
            // `w` notice the listener has not handed on yet still gets the turn's first deltas.
            let stmt = c
                .prepare_cached(
                    "WITH l AS (
                       INSERT INTO leases (session_id, holder, expires_at)
                       VALUES ($1, $2, now() + make_interval(secs => $3))
                       ON CONFLICT (session_id) DO UPDATE
                          SET holder = excluded.holder, expires_at = excluded.expires_at
                        WHERE leases.holder = excluded.holder OR leases.expires_at < now()
                       RETURNING holder)
                     SELECT EXISTS (SELECT 1 FROM l),
                            ARRAY(SELECT instance FROM delta_watchers
                                   WHERE session_id = $1 AND instance <> $2 AND expires_at > now()
                                   ORDER BY instance),
                            ARRAY(SELECT extract(epoch FROM expires_at - now())::float8
                                    FROM delta_watchers
                                   WHERE session_id = $1 AND instance <> $2 AND expires_at > now()
                                   ORDER BY instance),
                            (SELECT holder FROM leases WHERE session_id = $1)",
                )
                .await?;
            let secs = shared.lease.as_secs_f64();
            let row = c.query_one(&stmt, &[&sid, &shared.instance, &secs]).await?;
            if !row.get::<_, bool>(0) {
                return Ok(LeaseTaken::Busy);
            }
            let watchers: Vec<String> = row.get(1);
            let left: Vec<f64> = row.get(2);
            // Who held it before this statement (its snapshot): another instance may have
            // taken it over and handed it back while this one still counted it as its own.
            let was_mine = row.get::<_, Option<String>>(3).as_deref() == Some(&*shared.instance);
            let now = std::time::Instant::now();
            for (instance, left) in watchers.iter().zip(left) {
                let until = now + std::time::Duration::from_secs_f64(left.max(0.0));
                shared.deltas.note_watch(instance, vec![sid.clone()], until);
            }
            *marks += 1;
            let fresh = lock(&shared.held).insert(sid.clone(), *marks).is_none() || !was_mine;
            if fresh {
                lock(&shared.unread).insert(sid);
            }
            Ok(LeaseTaken::Held { fresh })
        })
        .await
    }

    /// The engine has read the session back since its lease was newly taken.
    pub(crate) fn lease_read_back(&self, session_id: &str) {
        lock(&self.shared.unread).remove(session_id);
    }

    /// Whether the session's lease was newly taken and the session not read back since (a
    /// claim may be reading it now, or have failed to).
    pub(crate) fn lease_unread(&self, session_id: &str) -> bool {
        lock(&self.shared.unread).contains(session_id)
    }

    /// The mark of the session's last take by this instance (`None`: not held), for
    /// [`PgStore::release_lease`].
    pub(crate) fn lease_mark(&self, session_id: &str) -> Option<u64> {
        lock(&self.shared.held).get(session_id).copied()
    }

    /// A claim of a session's lease is under way until the guard is dropped (its turn started,
    /// or refused): the lease is not released meanwhile.
    pub(crate) fn claiming(&self, session_id: &str) -> ClaimGuard {
        *lock(&self.shared.claiming)
            .entry(session_id.to_string())
            .or_default() += 1;
        ClaimGuard {
            store: self.clone(),
            session_id: session_id.to_string(),
        }
    }

    /// The sessions whose lease this instance holds.
    pub(crate) fn held_leases(&self) -> Vec<String> {
        lock(&self.shared.held).keys().cloned().collect()
    }

    /// Hand a session's lease back, unless it was taken again since `mark` was read (a turn
    /// was admitted meanwhile: it runs under the lease), or requests wait in its inbox (the
    /// holder takes them: see `inbox.rs` for why the two statements).
    pub(crate) async fn release_lease(
        &self,
        session_id: &str,
        mark: u64,
    ) -> Result<Released, StoreError> {
        self.release_lease_if(session_id, mark, || true).await
    }

    /// [`PgStore::release_lease`], if `idle` still says so when the release's turn comes (in
    /// line with takes, right before the row goes): a caller's "idle" seen before waiting for
    /// that turn may be stale by then (a claim came, took nothing new and started a turn).
    pub(crate) async fn release_lease_if(
        &self,
        session_id: &str,
        mark: u64,
        idle: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<Released, StoreError> {
        let sid = session_id.to_string();
        let shared = self.shared.clone();
        self.run(move |pool| async move {
            let _ops = shared.lease_ops.lock().await;
            if lock(&shared.held).get(&sid) != Some(&mark)
                || lock(&shared.claiming).contains_key(&sid)
                || !idle()
            {
                return Ok(Released::Kept);
            }
            let c = pool.get().await?;
            let lock_row = c
                .prepare_cached(
                    "SELECT 1 FROM leases WHERE session_id = $1 AND holder = $2 FOR UPDATE",
                )
                .await?;
            let delete = c
                .prepare_cached(
                    "DELETE FROM leases WHERE session_id = $1 AND holder = $2
                       AND NOT EXISTS (SELECT 1 FROM inbox WHERE session_id = $1)",
                )
                .await?;
            let me = &shared.instance;
            // One transaction in one round trip (each request is sent on its first poll, in
            // this order); the DELETE still takes its snapshot after the lock is granted.
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&sid, me];
            let (begin, ours, gone, commit) = futures_util::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock_row, &params),
                c.execute(&delete, &params),
                c.batch_execute("COMMIT"),
            );
            begin?;
            let (ours, gone) = (ours?.is_some(), gone?);
            commit?;
            if ours && gone == 0 {
                return Ok(Released::InboxWaiting);
            }
            lock(&shared.held).remove(&sid);
            lock(&shared.unread).remove(&sid);
            Ok(Released::Yes)
        })
        .await
    }

    /// Hand back every lease of this instance (SIGTERM), so others take its sessions at once;
    /// those with requests in the inbox are announced to every instance.
    pub(crate) async fn release_all_leases(&self) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        self.run(move |pool| async move {
            let _ops = shared.lease_ops.lock().await;
            let mut c = pool.get().await?;
            let tx = c.transaction().await?;
            let me = &shared.instance;
            tx.execute("SELECT 1 FROM leases WHERE holder = $1 FOR UPDATE", &[me])
                .await?;
            tx.execute(
                "SELECT pg_notify($2, s.session_id || ' ') FROM (SELECT DISTINCT session_id
                   FROM inbox WHERE session_id IN
                        (SELECT session_id FROM leases WHERE holder = $1)) s",
                &[me, &INBOX_CHANNEL],
            )
            .await?;
            tx.execute("DELETE FROM leases WHERE holder = $1", &[me])
                .await?;
            tx.commit().await?;
            lock(&shared.held).clear();
            lock(&shared.unread).clear();
            Ok(())
        })
        .await
    }

    /// Sessions whose lease has expired (their holder stopped renewing: killed, or cut off).
    pub(crate) async fn expired_leases(&self) -> Result<Vec<String>, StoreError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let rows = c
                .query(
                    "SELECT session_id FROM leases WHERE expires_at < now() ORDER BY session_id",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// What the listener hears from now on.
    pub(crate) fn commits_heard(&self) -> broadcast::Receiver<Heard> {
        self.shared.heard.subscribe()
    }
}

/// See [`PgStore::claiming`].
pub struct ClaimGuard {
    store: PgStore,
    session_id: String,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let mut claiming = lock(&self.store.shared.claiming);
        if let Some(n) = claiming.get_mut(&self.session_id) {
            *n -= 1;
            if *n == 0 {
                claiming.remove(&self.session_id);
            }
        }
    }
}

/// Renews this instance's leases every third of `lease_s` until the store is dropped.
pub(super) async fn renew_loop(shared: Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = shared.upgrade() else { return };
        if lock(&s.held).is_empty() {
            continue;
        }
        // One at a time with takes and releases: a take between the update and the bookkeeping
        // below would be forgotten.
        let _ops = s.lease_ops.lock().await;
        let renewed = async {
            let c = s.pool.get().await?;
            let rows = c
                .query(
                    "UPDATE leases SET expires_at = now() + make_interval(secs => $2)
                      WHERE holder = $1 RETURNING session_id",
                    &[&s.instance, &s.lease.as_secs_f64()],
                )
                .await?;
            Ok::<_, StoreError>(
                rows.iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect::<Vec<_>>(),
            )
        };
        match renewed.await {
            Ok(still) => {
                let still: std::collections::HashSet<String> = still.into_iter().collect();
                lock(&s.held).retain(|sid, _| {
                    let kept = still.contains(sid);
                    if !kept {
                        tracing::warn!(session = %sid, "store: lost the lease of a session (taken over after it expired)");
                    }
                    kept
                });
            }
            Err(e) => tracing::warn!(error = %e, "store: could not renew the leases"),
        }
    }
}

/// Listens for commits on a connection of its own, reconnecting when it is lost, until the
/// store is dropped.
pub(super) async fn listen_loop(
    shared: Weak<Shared>,
    config: tokio_postgres::Config,
    tx: broadcast::Sender<Heard>,
) {
    let mut first = true;
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        match config.connect(tokio_postgres::NoTls).await {
            Ok((client, mut conn)) => {
                let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                let sql = format!(
                    "LISTEN {EVENTS_CHANNEL}; LISTEN {INBOX_CHANNEL}; LISTEN {DELTAS_CHANNEL}; \
                     LISTEN {APPLIED_CHANNEL}"
                );
                let listen = client.batch_execute(&sql);
                // The connection must be driven for LISTEN to be answered.
                let mut listen = std::pin::pin!(listen);
                let listening = loop {
                    tokio::select! {
                        r = &mut listen => break r.is_ok(),
                        m = messages.next() => if m.is_none() { break false },
                    }
                };
                if listening {
                    // Notifications wait in the connection meanwhile (one query).
                    deltas::load_watches(shared.clone()).await;
                    if !first {
                        let _ = tx.send(Heard::Resync);
                    }
                    first = false;
                    while let Some(Ok(m)) = messages.next().await {
                        if shared.strong_count() == 0 {
                            return;
                        }
                        if let tokio_postgres::AsyncMessage::Notification(n) = m {
                            if n.channel() == APPLIED_CHANNEL {
                                let Some(s) = shared.upgrade() else { return };
                                s.replies.heard(n.payload());
                                continue;
                            }
                            if n.channel() == DELTAS_CHANNEL {
                                let Some(s) = shared.upgrade() else { return };
                                for d in deltas::heard(&s, n.payload()) {
                                    let _ = tx.send(Heard::Delta(d));
                                }
                                continue;
                            }
                            let heard = if n.channel() == INBOX_CHANNEL {
                                super::inbox::parse(n.payload())
                                    .map(|(session_id, holder)| Heard::Inbox { session_id, holder })
                            } else {
                                parse(n.payload())
                            };
                            if let Some(heard) = heard {
                                let _ = tx.send(heard);
                            }
                        }
                    }
                }
                tracing::warn!("store: lost the postgres listening connection; reconnecting");
            }
            Err(e) => tracing::warn!(error = %e, "store: cannot connect to listen for commits"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `<session id> <seq>`.
fn parse(payload: &str) -> Option<Heard> {
    let (sid, seq) = payload.rsplit_once(' ')?;
    Some(Heard::Commit {
        session_id: sid.to_string(),
        seq: seq.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_session_and_seq() {
        assert_eq!(
            parse("sess_a 12"),
            Some(Heard::Commit {
                session_id: "sess_a".into(),
                seq: 12
            })
        );
        assert_eq!(parse("garbage"), None);
        assert_eq!(parse("sess_a x"), None);
    }
}
