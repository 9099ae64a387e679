//! `Idempotency-Key` on `POST /sessions/{id}/turns`: a request sent again with the same key
//! (and the same body) gets the first one's response and acts once, on this instance or
//! another sharing the store, before or after a restart.
//!
//! A key records which turn its first request started, not the response bytes: a repeat
//! re-renders that turn from the log, which is what the first response was rendered from, so
//! it gets the same status and body (`stream: "none"`: the same JSON; `message`: the same
//! events; `delta`: the same events with each text as one delta, since deltas are not stored).
//! A repeat that comes while the turn still runs waits for it in `none` mode; in the streamed
//! modes it is a 409 naming the turn (follow it on the session's event stream). A request
//! refused before it started a turn (a 4xx) binds nothing: its repeat is judged afresh. A key
//! reused with another body is a 422.
//!
//! Where keys are kept:
//! - **In memory**, the fast path: each session in memory keeps its last [`MAX_KEYS`] keys for
//!   [`TTL`]; a repeat of one of them is answered from there, with no read of the store.
//! - **In the store** (`idempotency_keys`, both backends), for [`TTL`]: the key's row (the
//!   body's SHA-256, the turn, the `seq` its events come after) is queued when the turn starts,
//!   before the turn's first event, so the commit that makes the turn's first event durable
//!   holds it too (or an earlier one does). A key the memory does not know (a restart, another
//!   instance, a session that left memory, one of more than [`MAX_KEYS`]) is looked up there:
//!   one indexed read. Rows past [`TTL`] are ignored, and purged now and then by a bounded
//!   delete riding on a commit; deleting a session deletes its keys.
//! - **Two instances** (PostgreSQL): the first request reserves its key in the store (one
//!   `INSERT ... ON CONFLICT`, in one round trip) before it starts anything, so the same key
//!   sent to two instances at once starts one turn; the other request waits (up to
//!   [`RESERVED_WAIT`]) for that turn to be stored, then answers as a repeat. On SQLite (one
//!   process) the memory's reservation is enough and nothing is written before the turn.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use tokio::sync::watch;

use crate::http::ApiError;
use crate::log::{KeyReserved, KeyRow, Store};
use crate::sync::lock;

/// Keys kept per session (the oldest is forgotten first).
pub(crate) const MAX_KEYS: usize = 64;
/// How long a key is kept (in memory and in the store).
pub(crate) const TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a repeat waits for the turn of a key another instance reserved to be stored
/// (then it is a 409: in progress).
pub(crate) const RESERVED_WAIT: Duration = Duration::from_secs(10);
/// The longest key accepted.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// Where a keyed request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Being validated; its turn not started yet.
    Reserved,
    /// It started this turn; the turn's events come after `after_seq` in the session's log.
    Started { turn_id: String, after_seq: u64 },
    /// Refused before it started a turn: the key is free again.
    Released,
}

struct Entry {
    key: String,
    fingerprint: String,
    at: Instant,
    progress: watch::Sender<Progress>,
}

/// One session's keys.
#[derive(Default)]
pub(crate) struct Keys {
    entries: Mutex<VecDeque<Entry>>,
}

/// What to do with a keyed request.
pub(crate) enum Claim {
    /// The first with this key: go on, and report how it went through the ticket.
    First(Ticket),
    /// A repeat: wait on this for the first's turn.
    Repeat(watch::Receiver<Progress>),
}

/// The first request's hold on its key.
pub(crate) struct Ticket {
    progress: Option<watch::Sender<Progress>>,
    /// Where the key is written when its turn starts (none: kept in memory only).
    durable: Option<Durable>,
}

/// A key's row to be, and whether a reservation of it is in the store (PostgreSQL).
struct Durable {
    store: Store,
    row: KeyRow,
    reserved: bool,
}

impl Ticket {
    /// The request started this turn: its key's row is queued for the commit that holds the
    /// turn's first event (call it before the turn runs).
    pub(crate) fn started(mut self, turn_id: &str, after_seq: u64) {
        if let Some(mut d) = self.durable.take() {
            d.row.started = Some((turn_id.to_string(), after_seq));
            let forget_before = ms_ago(crate::clock::now_ms(), TTL);
            d.store.put_idempotency_key(d.row, forget_before);
        }
        if let Some(tx) = self.progress.take() {
            tx.send_replace(Progress::Started {
                turn_id: turn_id.to_string(),
                after_seq,
            });
        }
    }
}

impl Drop for Ticket {
    /// Refused (or gone) before its turn started: the key binds nothing.
    fn drop(&mut self) {
        if let Some(tx) = self.progress.take() {
            tx.send_replace(Progress::Released);
        }
        if let Some(d) = self.durable.take().filter(|d| d.reserved) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if let Err(e) = d.store.release_idempotency_key(d.row).await {
                        tracing::warn!(error = %e, "could not release an idempotency key's reservation; it is taken over once stale");
                    }
                });
            }
        }
    }
}

/// `now_ms` less `d`.
fn ms_ago(now_ms: i64, d: Duration) -> i64 {
    now_ms.saturating_sub(d.as_millis() as i64)
}

/// The `Idempotency-Key` header: `None` without one; 400 for one that is empty, too long or
/// not visible ASCII.
pub(crate) fn key_of(headers: &http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = || {
        ApiError::bad_request(format!(
            "the Idempotency-Key header must be 1 to {MAX_KEY_LEN} visible ASCII characters (a UUID, for example)"
        ))
    };
    let s = v.to_str().map_err(|_| bad())?.trim();
    if s.is_empty() || s.len() > MAX_KEY_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(s.to_string()))
}

/// SHA-256 (hex) of a request body.
pub(crate) fn fingerprint(body: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, body);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

impl Keys {
    /// Claim `key` for a request whose body has this fingerprint.
    pub(crate) fn claim(&self, key: &str, fingerprint: &str) -> Result<Claim, ApiError> {
        let mut entries = lock(&self.entries);
        let now = Instant::now();
        entries.retain(|e| {
            now.duration_since(e.at) < TTL && *e.progress.borrow() != Progress::Released
        });
        if let Some(e) = entries.iter().find(|e| e.key == key) {
            if e.fingerprint != fingerprint {
                return Err(reused(key));
            }
            return Ok(Claim::Repeat(e.progress.subscribe()));
        }
        while entries.len() >= MAX_KEYS {
            entries.pop_front();
        }
        let (tx, _) = watch::channel(Progress::Reserved);
        entries.push_back(Entry {
            key: key.to_string(),
            fingerprint: fingerprint.to_string(),
            at: now,
            progress: tx.clone(),
        });
        Ok(Claim::First(Ticket {
            progress: Some(tx),
            durable: None,
        }))
    }
}

/// The turn a repeat replays: `None` when the first request was refused (the repeat then goes
/// on as a first).
pub(crate) async fn wait_started(mut rx: watch::Receiver<Progress>) -> Option<(String, u64)> {
    loop {
        match &*rx.borrow_and_update() {
            Progress::Started { turn_id, after_seq } => return Some((turn_id.clone(), *after_seq)),
            Progress::Released => return None,
            Progress::Reserved => {}
        }
        if rx.changed().await.is_err() {
            return None;
        }
    }
}

/// What a keyed request does.
pub(crate) enum Keyed {
    /// The first with this key: start its turn, and report it through the ticket.
    First(Ticket),
    /// A repeat: replay the turn the first started (its events come after the `seq`).
    Replay(String, u64),
}

/// Claim `key` of a session for a request whose body has this fingerprint: in memory, and
/// when the memory does not know it, in the store (see the module documentation).
pub(crate) async fn claim(
    keys: &Keys,
    store: &Store,
    session_id: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Keyed, ApiError> {
    loop {
        match keys.claim(key, fingerprint)? {
            Claim::Repeat(rx) => match wait_started(rx).await {
                Some((turn_id, after_seq)) => return Ok(Keyed::Replay(turn_id, after_seq)),
                // The first was refused before it started a turn: this one goes on afresh.
                None => continue,
            },
            Claim::First(mut ticket) => {
                let (row, reserved) = match reserve(store, session_id, key, fingerprint).await? {
                    Stored::Free(row) => (row, false),
                    Stored::Reserved(row) => (row, true),
                    // Not kept in memory (the ticket dropped): the row's own age bounds it.
                    Stored::Started(turn_id, after_seq) => {
                        return Ok(Keyed::Replay(turn_id, after_seq))
                    }
                };
                ticket.durable = Some(Durable {
                    store: store.clone(),
                    row,
                    reserved,
                });
                return Ok(Keyed::First(ticket));
            }
        }
    }
}

/// What the store said of a key the memory did not know.
enum Stored {
    /// Free, and nothing written (SQLite): the key's row to be.
    Free(KeyRow),
    /// Reserved for this request (PostgreSQL): the row reserved.
    Reserved(KeyRow),
    /// An earlier request with it started this turn.
    Started(String, u64),
}

/// Reserve a session's key in the store for a request with this body. Waits (up to
/// [`RESERVED_WAIT`]) while another instance holds it reserved, its turn not stored yet.
async fn reserve(
    store: &Store,
    session_id: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Stored, ApiError> {
    let deadline = tokio::time::Instant::now() + RESERVED_WAIT;
    let mut pause = Duration::from_millis(5);
    loop {
        let row = KeyRow {
            session_id: session_id.to_string(),
            key: key.to_string(),
            fingerprint: fingerprint.to_string(),
            started: None,
            created_at_ms: crate::clock::now_ms(),
        };
        let not_before = ms_ago(row.created_at_ms, TTL);
        let found = store
            .reserve_idempotency_key(row.clone(), not_before)
            .await
            .map_err(crate::engine::EngineError::from)?;
        let stored = match found {
            KeyReserved::New { in_store: false } => return Ok(Stored::Free(row)),
            KeyReserved::New { in_store: true } => return Ok(Stored::Reserved(row)),
            KeyReserved::Taken(stored) => stored,
        };
        if stored.fingerprint != fingerprint {
            return Err(reused(key));
        }
        if let Some((turn_id, after_seq)) = stored.started {
            return Ok(Stored::Started(turn_id, after_seq));
        }
        if tokio::time::Instant::now() + pause > deadline {
            return Err(in_progress_elsewhere());
        }
        // Another instance validates the request or starts its turn: a few milliseconds.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The 422 for a key used before with another body.
fn reused(key: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
        format!(
            "Idempotency-Key {key:?} was used for another request body in this session; use a new key for a new request"
        ),
    )
}

/// The 409 for a repeat whose first, on another instance, has not started its turn in time.
fn in_progress_elsewhere() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "idempotent_request_in_progress",
        "a request with this Idempotency-Key is still being processed by another instance and has not started its turn yet; repeat the request in a moment",
    )
}

/// The 409 for a repeat of a streamed turn that still runs.
pub(crate) fn in_progress(turn_id: &str) -> ApiError {
    ApiError {
        extra: Some(Box::new(json!({ "turn_id": turn_id }))),
        ..ApiError::new(
            StatusCode::CONFLICT,
            "idempotent_request_in_progress",
            format!(
                "a request with this Idempotency-Key is still being processed as turn {turn_id}; follow it on GET /sessions/{{id}}/events/stream, or repeat the request once it has ended to get its response"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_claimed_once_and_a_refused_first_frees_it() {
        let keys = Keys::default();
        let Ok(Claim::First(ticket)) = keys.claim("k", "f") else {
            panic!("first")
        };
        assert!(matches!(keys.claim("k", "f"), Ok(Claim::Repeat(_))));
        let err = keys.claim("k", "other").err().unwrap();
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        drop(ticket);
        assert!(matches!(keys.claim("k", "f"), Ok(Claim::First(_))));
    }

    #[tokio::test]
    async fn a_repeat_waits_for_the_first_to_start_its_turn() {
        let keys = Keys::default();
        let Ok(Claim::First(ticket)) = keys.claim("k", "f") else {
            panic!("first")
        };
        let Ok(Claim::Repeat(rx)) = keys.claim("k", "f") else {
            panic!("repeat")
        };
        let waiter = tokio::spawn(wait_started(rx));
        ticket.started("turn_1", 7);
        assert_eq!(waiter.await.unwrap(), Some(("turn_1".to_string(), 7)));
    }

    #[test]
    fn keys_are_bounded_and_checked() {
        let keys = Keys::default();
        let mut tickets = Vec::new();
        for i in 0..MAX_KEYS + 5 {
            let Ok(Claim::First(t)) = keys.claim(&format!("k{i}"), "f") else {
                panic!("first {i}")
            };
            tickets.push(t);
        }
        assert_eq!(lock(&keys.entries).len(), MAX_KEYS);
        let mut h = http::HeaderMap::new();
        assert_eq!(key_of(&h).unwrap(), None);
        h.insert("idempotency-key", "abc-1".parse().unwrap());
        assert_eq!(key_of(&h).unwrap().as_deref(), Some("abc-1"));
        h.insert("idempotency-key", "a b".parse().unwrap());
        assert!(key_of(&h).is_err());
        h.insert("idempotency-key", "x".repeat(300).parse().unwrap());
        assert!(key_of(&h).is_err());
    }
}
