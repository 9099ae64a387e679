//! The engine's commands, in one place: what protocol adapters call to change a session.
//!
//! Each command is the same wherever the session runs: it takes the session's lease first
//! (`engine/scaleout/`), and when another instance runs the session (holds its lease) the
//! request goes to that one through the store's inbox, where `relayed.rs` applies it through
//! the same local steps. Adapters never take a lease nor pick a local or remote variant.
//!
//! - [`Engine::create_session`], [`Engine::delete_session`] (`lifecycle.rs`);
//! - [`Engine::start_turn`]: a turn a client attends (it may answer permissions and questions:
//!   a [`TurnInput::Resume`], sent to the instance whose MCP calls wait on them, see
//!   `answer_relay.rs`), or one nobody attends (a run); refused `session_busy` while a turn
//!   runs on the session, here or on another instance;
//! - [`Engine::queue_message`]: a message's turn nobody attends, queued behind the running one
//!   wherever it runs;
//! - [`Engine::cancel`]: one turn, or with none every turn and a plan's wait (an interrupt);
//! - [`Engine::decide_plan`]: confirm or reject the plan a run waits on.
//!
//! The local steps: `start.rs` (admit, then run or queue), `cancel.rs`, `plan.rs`.

mod answer_relay;
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

/// A turn refused by an instance handing the session's lease back claims it again after this,
/// doubled at each try (in all, at most ~0.4 s: one round trip of the store is what the hand-
/// back takes).
const CLAIM_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(25);

/// How long a relayed cancel or plan decision waits for the holder to apply it (it takes a
/// few milliseconds when the holder is alive).
const REPLY_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a turn waits for the session's turn whose terminal event is written to be over
/// (see [`Session::until_ending_turn_over`]): the commit it waits on, then a lock.
const TURN_OVER_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl Engine {
    /// Start a turn: validate the order against the session's state, apply its overrides and
    /// run the turn (on its own task, or its watcher's), or queue it behind the running one
    /// when the order says so. `session_busy` while another instance runs a turn on the
    /// session; a client's answers to calls another instance holds open go to it.
    pub async fn start_turn(
        &self,
        session: &Arc<Session>,
        order: TurnOrder,
    ) -> Result<TurnHandle, EngineError> {
        self.may_run(session)?;
        self.within_budget(session).await?;
        for attempt in 0..TRIES {
            let claim = match scaleout::claim(&self.inner, session).await {
                Err(busy @ EngineError::Busy { .. }) => {
                    let order = order.clone();
                    match answer_relay::answer_elsewhere(self, session, order, busy).await? {
                        answer_relay::Sent::Turn(handle) => return Ok(handle),
                        answer_relay::Sent::ClaimAgain => {
                            tokio::time::sleep(CLAIM_AGAIN_AFTER * (1 << attempt)).await;
                            continue;
                        }
                    }
                }
                claimed => claimed?,
            };
            session.until_ending_turn_over(TURN_OVER_WITHIN).await;
            let started = start::start_here(self, session, order, None, false);
            drop(claim);
            if started.is_err() {
                refused(self, session).await;
            }
            return started;
        }
        Err(EngineError::Busy {
            turn_id: String::new(),
        })
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
        self.may_run(session)?;
        self.within_budget(session).await?;
        let mut busy = None;
        for _ in 0..TRIES {
            match scaleout::claim(&self.inner, session).await {
                Ok(claim) => {
                    scaleout::take_sent_before(&self.inner, session).await;
                    let started = start::start_here(self, session, order, None, false);
                    drop(claim);
                    if started.is_err() {
                        refused(self, session).await;
                    }
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
                Posted::Queued(_) => return Ok(turn_id),
                Posted::NotHeld => continue,
                Posted::Full(n) => return Err(queue_full(n)),
            }
        }
        Err(busy.unwrap_or(EngineError::Busy {
            turn_id: String::new(),
        }))
    }

    /// Whether the session's owner may still use its agent (`[keys.NAME] agents` may have
    /// changed since the session was made): checked here too, before an order is relayed to
    /// the instance that runs the session, so that the caller gets the `forbidden` at once.
    fn may_run(&self, session: &Session) -> Result<(), EngineError> {
        let agent = session.record().agent.clone();
        self.agent_of(session, &agent).map(drop)
    }

    /// Whether the session's owner may start a turn now: its budgets (`[keys.NAME]`,
    /// `[limits]`) not spent and its rate limit not reached, checked before anything is
    /// started or relayed, so that no model is called for a refused turn. A turn accepted
    /// runs to its end whatever it spends.
    async fn within_budget(&self, session: &Session) -> Result<(), EngineError> {
        let config = &self.inner.config();
        let owner = session.owner.as_deref();
        let admitted = self.inner.ledger.admit(config, owner).await;
        admitted.map_err(|r| {
            tracing::info!(session = %session.id, principal = crate::usage::principal_name(owner), budget = r.budget, "a turn refused: {}", r.kind);
            EngineError::Refused(Box::new(r))
        })
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
        // Answered once durable: a queued turn's `cancel` row (or its log) is committed.
        if self.inner.store.instance().is_none() || session.lock().turns().running().is_some() {
            let stopped = cancel::cancel_here(self, session, turn_id);
            self.inner.store.flush().await?;
            return Ok(stopped);
        }
        for _ in 0..TRIES {
            match scaleout::claim(&self.inner, session).await {
                Ok(claim) => {
                    let stopped = cancel::cancel_here(self, session, turn_id);
                    let flushed = self.inner.store.flush().await;
                    drop(claim);
                    flushed?;
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
            if let Some(reply) = self.relay(session, &relayed, None).await? {
                // The holder's word on what it stopped; without it, what the log shows.
                let stopped = reply.and_then(|r| serde_json::from_value(r["stopped"].clone()).ok());
                return Ok(stopped.unwrap_or(stops));
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
        self.may_run(session)?;
        self.within_budget(session).await?;
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
                            refused(self, session).await;
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
            if let Some(reply) = self.relay(session, &relayed, Some(turn_id.clone())).await? {
                if let Some(e) = reply.as_ref().and_then(|r| r["error"].as_str()) {
                    return Err(EngineError::Conflict(e.to_string()));
                }
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

    /// Send a request to the instance that runs the session and wait for it to be applied
    /// there (at most [`REPLY_WITHIN`]), so that it has taken effect before the client hears
    /// back, as on one instance. `None`: no other instance holds the session (claim it);
    /// `Some` with the holder's reply (see [`Applied`](super::engine_handle::Applied)), or
    /// `None` in it when none came in time (the holder gone: the next one applies it).
    async fn relay(
        &self,
        session: &Session,
        relayed: &Relayed,
        turn_id: Option<String>,
    ) -> Result<Option<Option<serde_json::Value>>, EngineError> {
        let seq = match self.post_relayed(session, relayed, turn_id).await? {
            Posted::Queued(seq) => seq,
            Posted::NotHeld | Posted::Full(_) => return Ok(None),
        };
        let reply = self.inner.store.applied(seq, REPLY_WITHIN).await;
        if reply.is_none() {
            tracing::warn!(session = %session.id, kind = relayed.kind(), "the instance running the session did not reply in time; answered as the log shows");
        }
        Ok(Some(reply.and_then(|r| serde_json::from_str(&r).ok())))
    }

    /// Send a request to the instance that runs the session (see [`Engine::relay`]).
    async fn post_relayed(
        &self,
        session: &Session,
        relayed: &Relayed,
        turn_id: Option<String>,
    ) -> Result<Posted, EngineError> {
        let body = serde_json::to_string(relayed).unwrap_or_default();
        scaleout::post(&self.inner, session, relayed.kind(), body, turn_id).await
    }
}

/// A request refused after its claim (a conflict, a bad answer, a limit): nothing was started
/// here, so the lease the claim may have taken goes back. Kept, it would make the session's
/// next request `session_busy` on every other instance until one came here again.
async fn refused(engine: &Engine, session: &Arc<Session>) {
    scaleout::release_when_idle(&engine.inner, session).await;
}
