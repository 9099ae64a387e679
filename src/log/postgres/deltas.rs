//! Deltas across instances: the streamed text of a turn running on one instance, shown live to
//! a session's subscribers on another. Deltas are not stored; they travel by `NOTIFY` on their
//! own channel ([`DELTAS_CHANNEL`]), and only for sessions another instance watches.
//!
//! - **Watching.** An instance with a live subscriber of a session says so: a `delta_watchers`
//!   row (session, instance, expiry) and a `w` notification, both in one statement, before the
//!   subscriber's stream begins. It renews them every third of `lease_s`, like its leases, and
//!   says `u` when its last subscriber of the session has gone (an instance killed says
//!   nothing: its watch expires after `lease_s`). Every instance keeps the watches it hears
//!   (and, when its listener connects, those in the table) in memory; a session nobody else
//!   watches costs its writer one atomic load per fragment and nothing else.
//! - **Sending.** The writer's coalesced deltas (the same ones its own subscribers get: at most
//!   200 characters, or what 50 ms gathered) of a watched session are queued at once, under the
//!   session's lock, each with the seq of the last event its subscribers had been shown. A task
//!   sends what is queued as one `pg_notify` per payload of at most [`PAYLOAD_BYTES`]; what
//!   queues during a send goes in the next one (batching by backlog: no timer adds latency).
//! - **Order.** PostgreSQL delivers notifications in commit order, on one listening connection
//!   for both channels. A commit sends the deltas queued before it first
//!   ([`PgStore::send_deltas_before_commit`], called once the commit has taken its batch), so a
//!   delta that leads to a stored event is heard before that event's commit. The listener
//!   hands both to the engine on one channel (`Heard`), which shows a delta only if the
//!   subscribers there have seen exactly the events its writer's had: never after the stored
//!   event it leads to, never twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::delta_state::{Deltas, Wire};
use super::pg_store::{PgStore, Shared};

pub use super::delta_state::{DeltaTap, RemoteDelta};
use crate::log::StoreError;
use crate::sync::lock;

/// The channel deltas and watches go on.
pub(crate) const DELTAS_CHANNEL: &str = "turnstile_deltas";

/// A payload's bytes at most (PostgreSQL refuses 8000 and more).
pub(crate) const PAYLOAD_BYTES: usize = 7800;

/// One notification on [`DELTAS_CHANNEL`].
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Message {
    /// The sending instance (an instance ignores its own).
    i: String,
    /// Counts the sender's payloads: two equal payloads in one statement would be one.
    #[serde(default)]
    n: u64,
    /// Sessions it watches (from now on, for `lease_s`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    w: Vec<String>,
    /// Sessions it no longer watches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    u: Vec<String>,
    /// Deltas: (session, after_seq, turn, thinking, text).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    d: Vec<Wire>,
}

/// This instance watches a session's deltas until dropped (`Store::watch_deltas`).
pub struct DeltaWatch {
    store: PgStore,
    session_id: String,
}

impl Drop for DeltaWatch {
    fn drop(&mut self) {
        let last = {
            let mut w = lock(&self.store.shared.deltas.watching);
            match w.get_mut(&self.session_id) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    w.remove(&self.session_id);
                    true
                }
                None => false,
            }
        };
        if last {
            let store = self.store.clone();
            let sid = std::mem::take(&mut self.session_id);
            self.store.shared.rt.handle().spawn(async move {
                if let Err(e) = store.unwatch(sid).await {
                    tracing::debug!(error = %e, "store: could not withdraw a delta watch");
                }
            });
        }
    }
}

/// Split what is queued into payloads of at most [`PAYLOAD_BYTES`], in order (a text too long
/// for one is cut at character boundaries into several deltas).
fn payloads(instance: &str, first_n: u64, deltas: Vec<Wire>) -> Vec<String> {
    let empty = |n| Message {
        i: instance.to_string(),
        n,
        w: vec![],
        u: vec![],
        d: vec![],
    };
    let mut out = Vec::new();
    let mut msg = empty(first_n);
    // A delta's fields besides its text, JSON-quoted, at most this many bytes.
    let room = PAYLOAD_BYTES - 200 - instance.len();
    let mut size = 0;
    for (sid, after, turn, thinking, text) in deltas {
        for piece in pieces(&text, (room - sid.len() - turn.len()) / 6) {
            let len = sid.len() + turn.len() + 40 + json_len(piece);
            if size + len > room && !msg.d.is_empty() {
                let n = msg.n + 1;
                out.push(std::mem::replace(&mut msg, empty(n)));
                size = 0;
            }
            size += len;
            msg.d.push((
                sid.clone(),
                after,
                turn.clone(),
                thinking,
                piece.to_string(),
            ));
        }
    }
    if !msg.d.is_empty() {
        out.push(msg);
    }
    out.into_iter()
        .map(|m| serde_json::to_string(&m).unwrap_or_default())
        .collect()
}

/// `text` cut into pieces of at most `max` bytes, at character boundaries.
fn pieces(text: &str, max: usize) -> Vec<&str> {
    let max = max.max(4);
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(rest);
    }
    out
}

/// The bytes of `s` as a JSON string.
fn json_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum::<usize>()
        + 2
}

/// Watch payloads (`w` or `u`) for these sessions, each under [`PAYLOAD_BYTES`].
fn watch_payloads(instance: &str, n: &AtomicU64, sessions: &[String], watch: bool) -> Vec<String> {
    let mut out = Vec::new();
    for group in sessions.chunks(100) {
        let msg = Message {
            i: instance.to_string(),
            n: n.fetch_add(1, Ordering::Relaxed),
            w: if watch { group.to_vec() } else { vec![] },
            u: if watch { vec![] } else { group.to_vec() },
            d: vec![],
        };
        out.push(serde_json::to_string(&msg).unwrap_or_default());
    }
    out
}

const NOTIFY_ALL: &str =
    "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS t(p, o) ORDER BY o";

impl PgStore {
    /// A handle to send this session's deltas to the instances watching it.
    pub(crate) fn delta_tap(&self, session_id: &Arc<str>) -> DeltaTap {
        DeltaTap {
            deltas: self.shared.deltas.clone(),
            session_id: session_id.clone(),
        }
    }

    /// This instance has a live subscriber of the session: other instances send it the
    /// session's deltas until the watch is dropped. Returns once they can hear it.
    pub(crate) async fn watch_deltas(&self, session_id: &str) -> Result<DeltaWatch, StoreError> {
        let first = {
            let mut w = lock(&self.shared.deltas.watching);
            let n = w.entry(session_id.to_string()).or_default();
            *n += 1;
            *n == 1
        };
        let watch = DeltaWatch {
            store: self.clone(),
            session_id: session_id.to_string(),
        };
        if first {
            let shared = self.shared.clone();
            let sid = session_id.to_string();
            self.run(move |pool| async move {
                let _ops = shared.deltas.watch_ops.lock().await;
                let c = pool.get().await?;
                let payload = watch_payloads(
                    &shared.instance,
                    &shared.deltas.numbered,
                    std::slice::from_ref(&sid),
                    true,
                );
                c.execute(
                    "WITH w AS (INSERT INTO delta_watchers (session_id, instance, expires_at)
                         VALUES ($3, $4, now() + make_interval(secs => $5))
                         ON CONFLICT (session_id, instance)
                         DO UPDATE SET expires_at = excluded.expires_at)
                     SELECT pg_notify($1, $2)",
                    &[
                        &DELTAS_CHANNEL,
                        &payload[0],
                        &sid,
                        &shared.instance,
                        &shared.lease.as_secs_f64(),
                    ],
                )
                .await?;
                Ok(())
            })
            .await?;
        }
        Ok(watch)
    }

    async fn unwatch(&self, sid: String) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        self.run(move |pool| async move {
            let _ops = shared.deltas.watch_ops.lock().await;
            // Watched again meanwhile: the watch stands.
            if lock(&shared.deltas.watching).contains_key(&sid) {
                return Ok(());
            }
            let c = pool.get().await?;
            let payload = watch_payloads(
                &shared.instance,
                &shared.deltas.numbered,
                std::slice::from_ref(&sid),
                false,
            );
            c.execute(
                "WITH w AS (DELETE FROM delta_watchers WHERE session_id = $3 AND instance = $4)
                 SELECT pg_notify($1, $2)",
                &[&DELTAS_CHANNEL, &payload[0], &sid, &shared.instance],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Send the deltas queued so far, and wait for a send under way: called by a commit once
    /// it has taken its batch, so that every delta queued before an event in the batch is
    /// heard before the event's commit. Nothing to do (one uncontended lock) when nothing is
    /// queued.
    pub(super) async fn send_deltas_before_commit(&self) {
        send_queued(&self.shared).await;
    }
}

/// Sends what is queued (see the module documentation).
async fn send_queued(s: &Shared) {
    let _sending = s.deltas.sending.lock().await;
    let queued = std::mem::take(&mut *lock(&s.deltas.queue));
    if queued.is_empty() {
        return;
    }
    let first = s
        .deltas
        .numbered
        .fetch_add(queued.len() as u64 * 2, Ordering::Relaxed);
    let payloads = payloads(&s.instance, first, queued);
    let sent = async {
        let c = s.pool.get().await?;
        let stmt = c.prepare_cached(NOTIFY_ALL).await?;
        c.execute(&stmt, &[&DELTAS_CHANNEL, &payloads]).await?;
        Ok::<_, StoreError>(())
    };
    if let Err(e) = sent.await {
        // Deltas are provisional: the stored message that follows has the whole text.
        tracing::warn!(error = %e, "store: could not send deltas to the instances watching");
    }
}

/// Sends queued deltas as they come, and renews this instance's watches every `every`, until
/// the store is dropped. Holds the store only while it works (`deltas` is the part it sleeps
/// on).
pub(super) async fn send_loop(shared: Weak<Shared>, deltas: Arc<Deltas>, every: Duration) {
    let mut renew = tokio::time::interval(every);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Registered before the queue is looked at: a delta queued after the look wakes it.
        let woken = deltas.wake.notified();
        let mut woken = std::pin::pin!(woken);
        woken.as_mut().enable();
        let renew_due = if lock(&deltas.queue).is_empty() {
            tokio::select! {
                _ = woken => false,
                _ = renew.tick() => true,
            }
        } else {
            false
        };
        let Some(s) = shared.upgrade() else { return };
        send_queued(&s).await;
        if renew_due {
            if let Err(e) = renew_watches(&s).await {
                tracing::warn!(error = %e, "store: could not renew the delta watches");
            }
        }
    }
}

/// Renew this instance's watches (rows and notifications).
async fn renew_watches(s: &Shared) -> Result<(), StoreError> {
    let _ops = s.deltas.watch_ops.lock().await;
    let sessions: Vec<String> = lock(&s.deltas.watching).keys().cloned().collect();
    if sessions.is_empty() {
        return Ok(());
    }
    let payloads = watch_payloads(&s.instance, &s.deltas.numbered, &sessions, true);
    let c = s.pool.get().await?;
    // Rows of instances that died watching.
    c.execute(
        "DELETE FROM delta_watchers WHERE expires_at < now() - interval '1 minute'",
        &[],
    )
    .await?;
    c.execute(
        "INSERT INTO delta_watchers (session_id, instance, expires_at)
         SELECT sid, $2, now() + make_interval(secs => $3) FROM unnest($1::text[]) AS t(sid)
         ON CONFLICT (session_id, instance) DO UPDATE SET expires_at = excluded.expires_at",
        &[&sessions, &s.instance, &s.lease.as_secs_f64()],
    )
    .await?;
    c.execute(NOTIFY_ALL, &[&DELTAS_CHANNEL, &payloads]).await?;
    Ok(())
}

/// The listener is (again) listening: learn the watches under way from the table.
pub(super) async fn load_watches(shared: Weak<Shared>) {
    let Some(s) = shared.upgrade() else { return };
    let rows = async {
        let c = s.pool.get().await?;
        let rows = c
            .query(
                "SELECT session_id, instance, extract(epoch FROM expires_at - now())::float8
                   FROM delta_watchers WHERE expires_at > now() AND instance <> $1",
                &[&s.instance],
            )
            .await?;
        Ok::<_, StoreError>(rows)
    };
    match rows.await {
        Ok(rows) => {
            let now = Instant::now();
            for r in rows {
                let left = Duration::from_secs_f64(r.get::<_, f64>(2).clamp(0.0, 3600.0));
                s.deltas.note_watch(r.get(1), vec![r.get(0)], now + left);
            }
        }
        Err(e) => tracing::warn!(error = %e, "store: cannot read the delta watches"),
    }
    s.deltas.listening.store(true, Ordering::Release);
    s.deltas.listening_now.notify_waiters();
}

/// A notification on [`DELTAS_CHANNEL`]: watches noted here, deltas handed on (in order).
pub(super) fn heard(s: &Shared, payload: &str) -> Vec<RemoteDelta> {
    let Ok(msg) = serde_json::from_str::<Message>(payload) else {
        tracing::debug!("store: a delta notification that does not parse");
        return vec![];
    };
    if msg.i == s.instance {
        return vec![];
    }
    if !msg.w.is_empty() {
        s.deltas.note_watch(&msg.i, msg.w, Instant::now() + s.lease);
    }
    if !msg.u.is_empty() {
        s.deltas.note_unwatch(&msg.i, msg.u);
    }
    msg.d
        .into_iter()
        .map(
            |(session_id, after_seq, turn_id, thinking, text)| RemoteDelta {
                session_id,
                after_seq,
                turn_id,
                thinking,
                text,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests;
