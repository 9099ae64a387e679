//! Scale-out: requests that reach an instance while another runs the session (holds its
//! lease) go to that one through the store's inbox (`log/postgres/inbox.rs`), and are applied
//! there as if they had come to it, through the same calls (`start_turn`, `cancel`,
//! `decide_plan`): a queued message is queued (or run) under the turn id the receiving
//! instance answered; a cancel or an interrupt cancels; a plan decision decides.
//!
//! - Sending ([`Engine::queue_message`], [`Engine::cancel_anywhere`],
//!   [`Engine::decide_plan_anywhere`]): the request is done here when this instance holds the
//!   lease or takes it (no turn runs elsewhere); otherwise it is written to the inbox, and the
//!   answer is the one a local request gets (a queued message: its turn id).
//! - Taking ([`drain`]): the holder hears of the rows (`LISTEN`), of rows its release of the
//!   lease found, or of rows left for lack of room in its queue once a queued turn starts; it
//!   takes them in order, at most as many messages as its queue has room for (`[limits]
//!   queued_turns`: rows that do not fit wait in the inbox, where the sender counts them).
//!
//! On the embedded store (one process) there is no other instance: everything is done here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::record::PlanDecision;
use super::session::Session;
use super::shared::{Engine, Inner};
use super::types::{EngineError, TurnInput, TurnOrder};
use crate::log::{FileRef, InboxRow, Posted, Released};

/// Where a client attends a turn, for the turns the holder starts from the inbox (the events
/// and runs APIs say the same).
const ATTEND_AT: &str = "POST /sessions/{id}/turns";

/// Tries of a request while the lease changes hands under it (taken, handed back).
const TRIES: usize = 4;

/// A request in the inbox.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Relayed {
    Message {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
    },
    Cancel {
        turn_id: Option<String>,
    },
    Interrupt,
    /// The decision's `plan_decision` block.
    Plan {
        decision: Value,
    },
}

impl Relayed {
    fn kind(&self) -> &'static str {
        match self {
            Relayed::Message { .. } => "message",
            Relayed::Cancel { .. } => "cancel",
            Relayed::Interrupt => "interrupt",
            Relayed::Plan { .. } => "plan",
        }
    }
}

/// A session's inbox as this instance sees it: one taker at a time; whether rows were left
/// for lack of room.
#[derive(Default)]
struct InboxState {
    taking: tokio::sync::Mutex<()>,
    left: AtomicBool,
}

impl Engine {
    /// Queue a message's turn (no client attends it) behind the session's running one, or run
    /// it: here, or through the inbox on the instance that runs the session. Its turn id.
    pub async fn queue_message(
        &self,
        session: &Arc<Session>,
        input: TurnInput,
        attend_at: &'static str,
    ) -> Result<String, EngineError> {
        let mut busy = None;
        for _ in 0..TRIES {
            match self.claim(session).await {
                Ok(claim) => {
                    let order = TurnOrder::unattended(input, attend_at);
                    let started = self.start_turn(session, order).map(|h| h.turn_id.clone());
                    drop(claim);
                    return started;
                }
                Err(e @ EngineError::Busy { .. }) => busy = Some(e),
                Err(e) => return Err(e),
            }
            let TurnInput::User {
                content,
                files,
                skills,
            } = &input
            else {
                break;
            };
            let relayed = Relayed::Message {
                content: content.clone(),
                files: files.clone(),
                skills: skills.clone(),
            };
            let turn_id = crate::ids::new("turn");
            match self.post(session, &relayed, Some(turn_id.clone())).await? {
                Posted::Queued => return Ok(turn_id),
                Posted::NotHeld => continue,
                Posted::Full(n) => {
                    return Err(EngineError::OverLimit {
                        kind: "too_many_queued_turns",
                        message: format!(
                            "this session already has {n} turns queued behind the running one (limit: [limits] queued_turns in tools.toml); wait for one to finish or cancel some"
                        ),
                        server_wide: false,
                        retry_after: super::start::QUEUE_RETRY_AFTER,
                    })
                }
            }
        }
        Err(busy.unwrap_or(EngineError::Busy {
            turn_id: String::new(),
        }))
    }

    /// Cancel one turn, or with none every turn (the runs API's interrupt), wherever the
    /// session runs. The ids stopped: here, those [`Engine::cancel`] stopped; sent to the
    /// instance running the session, the turn named, or the open turn its log shows.
    pub async fn cancel_anywhere(
        &self,
        session: &Arc<Session>,
        turn_id: Option<&str>,
    ) -> Result<Vec<String>, EngineError> {
        if self.inner.store.instance().is_none() || session.lock().running.is_some() {
            return Ok(self.cancel(session, turn_id));
        }
        for _ in 0..TRIES {
            match self.claim(session).await {
                Ok(claim) => {
                    let stopped = self.cancel(session, turn_id);
                    drop(claim);
                    super::lease::release_when_idle(&self.inner, session).await;
                    return Ok(stopped);
                }
                Err(EngineError::Busy { .. }) => {}
                Err(e) => return Err(e),
            }
            // What an interrupt stops is the turn open when it is sent: read before the post
            // (the holder may have ended it by the time the post returns).
            let (relayed, stops) = match turn_id {
                Some(t) => (
                    Relayed::Cancel {
                        turn_id: Some(t.to_string()),
                    },
                    vec![t.to_string()],
                ),
                None => (
                    Relayed::Interrupt,
                    self.open_turn(session).await?.into_iter().collect(),
                ),
            };
            if self.post(session, &relayed, None).await? == Posted::Queued {
                return Ok(stops);
            }
        }
        Ok(Vec::new())
    }

    /// [`Engine::decide_plan`] wherever the session runs: here when this instance holds the
    /// lease or takes it, else through the inbox (under a turn id minted here).
    pub async fn decide_plan_anywhere(
        &self,
        session: &Arc<Session>,
        decision: PlanDecision,
        attend_at: &'static str,
    ) -> Result<String, EngineError> {
        if self.inner.store.instance().is_none() {
            return self.decide_plan(session, decision, attend_at);
        }
        let mut busy = None;
        for _ in 0..TRIES {
            match self.claim(session).await {
                Ok(claim) => {
                    let decided = self.decide_plan(session, decision, attend_at);
                    drop(claim);
                    if decided.is_err() {
                        super::lease::release_when_idle(&self.inner, session).await;
                    }
                    return decided;
                }
                Err(e @ EngineError::Busy { .. }) => busy = Some(e),
                Err(e) => return Err(e),
            }
            if session.lock().plan.is_none() {
                return Err(super::start::no_plan());
            }
            let relayed = Relayed::Plan {
                decision: decision.block(),
            };
            let turn_id = crate::ids::new("turn");
            if self.post(session, &relayed, Some(turn_id.clone())).await? == Posted::Queued {
                // Decided: a second decision here is refused (the log says so once the
                // holder has run it).
                session.lock().plan = None;
                return Ok(turn_id);
            }
        }
        Err(busy.unwrap_or(EngineError::Busy {
            turn_id: String::new(),
        }))
    }

    /// The turn the session's log shows open (its last event not terminal), as the store
    /// holds it now: this instance may not have heard of the newest events yet.
    async fn open_turn(&self, session: &Session) -> Result<Option<String>, EngineError> {
        let (seen, last) = {
            let st = session.lock();
            let last = st.out.tail.last().cloned();
            (st.next_seq.saturating_sub(1), last)
        };
        let newer = self.inner.store.events(&session.id, seen, 1 << 16).await?;
        let last = newer.last().map(|e| Arc::new(e.clone())).or(last);
        Ok(last
            .filter(|e| !e.body.is_terminal())
            .map(|e| e.turn_id.clone()))
    }

    async fn post(
        &self,
        session: &Session,
        relayed: &Relayed,
        turn_id: Option<String>,
    ) -> Result<Posted, EngineError> {
        let body = serde_json::to_string(relayed).unwrap_or_default();
        let max = self.inner.config.limits.queued_turns;
        Ok(self
            .inner
            .store
            .post_inbox(&session.id, relayed.kind(), body, turn_id, max)
            .await?)
    }
}

/// [`drain`] on a task of its own.
pub(crate) fn drain_soon(inner: &Arc<Inner>, session_id: String) {
    let inner = inner.clone();
    tokio::spawn(async move { drain(&inner, &session_id).await });
}

/// A queued turn of the session started (its queue has room again): rows left in the inbox
/// for lack of room are taken now.
pub(crate) fn room_opened(inner: &Arc<Inner>, session: &Session) {
    if session
        .extension::<InboxState>()
        .left
        .load(Ordering::Acquire)
    {
        drain_soon(inner, session.id.to_string());
    }
}

/// Take the requests waiting in the session's inbox and apply them, while this instance
/// holds its lease (or takes it: none holds it); then, the session idle, hand the lease back
/// (or, more rows found by that release, take them too). Rows that cannot be applied now (the
/// server runs all the turns it may, or stops) go back, for the sweep of held leases.
pub(crate) async fn drain(inner: &Arc<Inner>, session_id: &str) {
    let engine = Engine {
        inner: inner.clone(),
    };
    if engine.check_open().is_err() {
        return;
    }
    let session = match engine.load(session_id).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            // Deleted: what it was sent goes with it.
            let _ = inner.store.drop_inbox(session_id).await;
            return;
        }
        Err(_) => return,
    };
    let state = session.extension::<InboxState>();
    let _one = state.taking.lock().await;
    let store = &inner.store;
    loop {
        let Ok(claim) = engine.claim(&session).await else {
            return; // another instance holds it: the rows are its
        };
        let (rows, left) = match store.take_inbox(&session.id, room(inner, &session)).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "could not read the session's inbox");
                return;
            }
        };
        state.left.store(left, Ordering::Release);
        let back = apply(&engine, &session, rows);
        drop(claim);
        if !back.is_empty() {
            state.left.store(true, Ordering::Release);
            if let Err(e) = store.put_back_inbox(&session.id, back).await {
                tracing::error!(session = %session.id, error = %e, "requests taken from the inbox could not be put back: they are lost");
            }
            return;
        }
        if session.lock().running.is_some() {
            return; // the end of its turns hands the lease back, or takes what came meanwhile
        }
        if super::lease::release(inner, &session).await != Some(Released::InboxWaiting) {
            return;
        }
    }
}

/// How many messages the session's queue can take now (one more when no turn runs: it runs).
fn room(inner: &Inner, session: &Session) -> usize {
    let st = session.lock();
    let queued = st
        .queue
        .iter()
        .filter(|q| !q.control.token.is_cancelled())
        .count();
    let idle = usize::from(st.running.is_none());
    (inner.config.limits.queued_turns + idle).saturating_sub(queued)
}

/// Apply the rows in order, as the requests they were; the rows that must wait (from the first
/// that cannot be applied now on).
fn apply(engine: &Engine, session: &Arc<Session>, rows: Vec<InboxRow>) -> Vec<InboxRow> {
    let mut rows = rows.into_iter();
    while let Some(row) = rows.next() {
        let relayed: Relayed = match serde_json::from_str(&row.body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "an inbox row does not parse; dropped");
                continue;
            }
        };
        let done = match relayed {
            Relayed::Message {
                content,
                files,
                skills,
            } => {
                let input = TurnInput::User {
                    content,
                    files,
                    skills,
                };
                let order = TurnOrder::unattended(input, ATTEND_AT);
                engine
                    .start_turn_as(session, order, row.turn_id.clone())
                    .map(drop)
            }
            Relayed::Cancel { turn_id } => {
                engine.cancel(session, turn_id.as_deref());
                Ok(())
            }
            Relayed::Interrupt => {
                engine.cancel(session, None);
                Ok(())
            }
            Relayed::Plan { decision } => {
                match PlanDecision::of_content(&Value::Array(vec![decision])) {
                    Some(d) => engine
                        .decide_plan_as(session, d, ATTEND_AT, row.turn_id.clone())
                        .map(drop),
                    None => Ok(()),
                }
            }
        };
        match done {
            Ok(()) => {}
            Err(EngineError::ShuttingDown)
            | Err(EngineError::OverLimit {
                server_wide: true, ..
            }) => return std::iter::once(row).chain(rows).collect(),
            Err(e) => {
                tracing::warn!(session = %session.id, turn = ?row.turn_id, error = %e, "a request from another instance could not be applied; dropped");
            }
        }
    }
    Vec::new()
}
