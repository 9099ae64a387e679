//! The engine's commands, in one place: what protocol adapters call to change a session.
//!
//! Each command is the same wherever the session runs: it takes the session's lease first
//! (`engine/scaleout/`), and when another instance runs the session (holds its lease) the
//! request goes to that one through the store's inbox, where `relayed.rs` applies it through
//! the same local steps. Adapters never take a lease nor pick a local or remote variant.
//!
//! - [`Engine::create_session`], [`Engine::delete_session`] (`lifecycle.rs`);
//! - [`Engine::start_turn`]: a turn a client attends (it may answer permissions and questions:
//!   a [`TurnInput::Resume`]), or one nobody attends (a run); refused `session_busy` while
//!   another instance runs the session;
//! - [`Engine::queue_message`]: a message's turn nobody attends, queued behind the running one
//!   wherever it runs;
//! - [`Engine::cancel`]: one turn, or with none every turn and a plan's wait (an interrupt);
//! - [`Engine::decide_plan`]: confirm or reject the plan a run waits on.
//!
//! The local steps: `start.rs` (admit, then run or queue), `cancel.rs`, `plan.rs`.

mod cancel;
mod inbox_entry;
mod lifecycle;
mod plan;
pub(crate) mod relayed;
mod start;

use std::sync::Arc;

use super::engine_handle::Engine;
use super::scaleout;
use super::session::Session;
use super::session_record::PlanDecision;
use super::turn_handle::TurnHandle;
use super::turn_queue::queue_full;
use super::types::{EngineError, TurnOrder};
use crate::log::Posted;
use inbox_entry::Relayed;

/// Tries of a request while the lease changes hands under it (taken, handed back).
const TRIES: usize = 4;

impl Engine {
    /// Start a turn: validate the order against the session's state, apply its overrides and
    /// run the turn (on its own task, or its watcher's), or queue it behind the running one
    /// when the order says so. `session_busy` while another instance runs the session.
    pub async fn start_turn(
        &self,
        session: &Arc<Session>,
        order: TurnOrder,
    ) -> Result<TurnHandle, EngineError> {
        let claim = scaleout::claim(&self.inner, session).await?;
        let started = start::start_here(self, session, order, None, false);
        drop(claim);
        started
    }

    /// Queue a turn no client attends (`order` is [`TurnOrder::unattended`]: a message, a
    /// run) behind the session's running one, or run it: here, or through the inbox on the
    /// instance that runs the session. Returns once the turn is accepted durably (see
    /// [`TurnHandle::accepted`]; a row of the inbox is durable as it is posted). Its turn id.
    pub async fn queue_message(
        &self,
        session: &Arc<Session>,
        order: TurnOrder,
    ) -> Result<String, EngineError> {
        let mut busy = None;
        for _ in 0..TRIES {
            match scaleout::claim(&self.inner, session).await {
                Ok(claim) => {
                    let started = start::start_here(self, session, order, None, false);
                    drop(claim);
                    let mut handle = started?;
                    handle.accepted().await?;
                    return Ok(handle.turn_id.clone());
                }
                Err(e @ EngineError::Busy { .. }) => busy = Some(e),
                Err(e) => return Err(e),
            }
            let Some(body) = inbox_entry::row_of(&order.input, order.plan, order.max_steps) else {
                break;
            };
            let turn_id = crate::ids::new("turn");
            let posted =
                scaleout::post(&self.inner, session, "message", body, Some(turn_id.clone()));
            match posted.await? {
                Posted::Queued => return Ok(turn_id),
                Posted::NotHeld => continue,
                Posted::Full(n) => return Err(queue_full(n)),
            }
        }
        Err(busy.unwrap_or(EngineError::Busy {
            turn_id: String::new(),
        }))
    }

    /// Cancel one turn (running or queued) or, with none, the running turn, every queued one
    /// and a plan's wait (the runs API's interrupt), wherever the session runs. Idempotent: a
    /// turn that already ended is left alone. The ids stopped: here, those it stopped; sent to
    /// the instance running the session, the turn named, or the open turn its log shows.
    pub async fn cancel(
        &self,
        session: &Arc<Session>,
        turn_id: Option<&str>,
    ) -> Result<Vec<String>, EngineError> {
        if self.inner.store.instance().is_none() || session.lock().turns().running().is_some() {
            return Ok(cancel::cancel_here(self, session, turn_id));
        }
        for _ in 0..TRIES {
            match scaleout::claim(&self.inner, session).await {
                Ok(claim) => {
                    let stopped = cancel::cancel_here(self, session, turn_id);
                    drop(claim);
                    scaleout::release_when_idle(&self.inner, session).await;
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
            if self.relay(session, &relayed, None).await? == Posted::Queued {
                return Ok(stops);
            }
        }
        Ok(Vec::new())
    }

    /// Confirm or reject the plan a run waits on (409 when none waits), wherever the session
    /// runs: the decision starts a new turn (queued behind the plan's turn if that is still
    /// ending) whose `user.message` carries it as a `plan_decision` block. Confirmed, the run
    /// goes on with tools; rejected, the model is asked for another plan. No client attends
    /// the decision's turn (see [`Client::Absent`](super::types::Client::Absent) for
    /// `attend_at`). The decision's turn id.
    pub async fn decide_plan(
        &self,
        session: &Arc<Session>,
        decision: PlanDecision,
        attend_at: &'static str,
    ) -> Result<String, EngineError> {
        if self.inner.store.instance().is_none() {
            let mut handle = plan::decide_here(self, session, decision, attend_at, None, false)?;
            handle.accepted().await?;
            return Ok(handle.turn_id.clone());
        }
        let mut busy = None;
        for _ in 0..TRIES {
            match scaleout::claim(&self.inner, session).await {
                Ok(claim) => {
                    let decided =
                        plan::decide_here(self, session, decision, attend_at, None, false);
                    drop(claim);
                    let mut handle = match decided {
                        Ok(handle) => handle,
                        Err(e) => {
                            scaleout::release_when_idle(&self.inner, session).await;
                            return Err(e);
                        }
                    };
                    handle.accepted().await?;
                    return Ok(handle.turn_id.clone());
                }
                Err(e @ EngineError::Busy { .. }) => busy = Some(e),
                Err(e) => return Err(e),
            }
            if session.lock().plan().is_none() {
                return Err(plan::no_plan());
            }
            let relayed = Relayed::Plan {
                decision: decision.block(),
            };
            let turn_id = crate::ids::new("turn");
            if self.relay(session, &relayed, Some(turn_id.clone())).await? == Posted::Queued {
                // Decided: a second decision here is refused (the log says so once the
                // holder has run it).
                session.lock().drop_plan();
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
            let last = st.out().tail.last().cloned();
            (st.next_seq().saturating_sub(1), last)
        };
        let newer = self.inner.store.events(&session.id, seen, 1 << 16).await?;
        let last = newer.last().map(|e| Arc::new(e.clone())).or(last);
        Ok(last
            .filter(|e| !e.body.is_terminal())
            .map(|e| e.turn_id.clone()))
    }

    /// Send a request to the instance that runs the session.
    async fn relay(
        &self,
        session: &Session,
        relayed: &Relayed,
        turn_id: Option<String>,
    ) -> Result<Posted, EngineError> {
        let body = serde_json::to_string(relayed).unwrap_or_default();
        scaleout::post(&self.inner, session, relayed.kind(), body, turn_id).await
    }
}
