//! `Idempotency-Key` on `POST /sessions/{id}/turns`: a request sent again with the same key
//! (and the same body) gets the first one's response and acts once.
//!
//! Each session keeps its last [`MAX_KEYS`] keys for [`TTL`], in memory (a session that leaves
//! memory forgets them). A key records which turn its first request started, not the response
//! bytes: a repeat re-renders that turn from the log, which is what the first response was
//! rendered from, so it gets the same status and body (`stream: "none"`: the same JSON;
//! `message`: the same events; `delta`: the same events with each text as one delta, since
//! deltas are not stored). A repeat that comes while the turn still runs waits for it in `none`
//! mode; in the streamed modes it is a 409 naming the turn (follow it on the session's event
//! stream). A request refused before it started a turn (a 4xx) binds nothing: its repeat is
//! judged afresh. A key reused with another body is a 422.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use tokio::sync::watch;

use crate::http::ApiError;
use crate::sync::lock;

/// Keys kept per session (the oldest is forgotten first).
pub(crate) const MAX_KEYS: usize = 64;
/// How long a key is kept.
pub(crate) const TTL: Duration = Duration::from_secs(24 * 3600);
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
}

impl Ticket {
    /// The request started this turn.
    pub(crate) fn started(mut self, turn_id: &str, after_seq: u64) {
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
    }
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
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    format!(
                        "Idempotency-Key {key:?} was used for another request body in this session; use a new key for a new request"
                    ),
                ));
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
        Ok(Claim::First(Ticket { progress: Some(tx) }))
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
