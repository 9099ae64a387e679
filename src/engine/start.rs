//! Starting turns: an order checked against the session's state and limits, then run at once,
//! or queued behind the running turn; cancelling them; the decision on a waiting plan.

use std::sync::Arc;

use super::approvals;
use super::delivery::channel;
use super::handle::TurnHandle;
use super::job::{Job, RunSlot, StopCause, TurnControl};
use super::record::{Pending, PlanDecision};
use super::session::{Session, State};
use super::settings::is_empty_update;
use super::shared::Engine;
use super::turn;
use super::types::{Client, EngineError, Runner, TurnInput, TurnOrder, WhenBusy};
use crate::{clock, ids};

/// `Retry-After` (seconds) of a session whose queue is full: about a turn's length.
pub(super) const QUEUE_RETRY_AFTER: u64 = 5;
/// `Retry-After` (seconds) of a server running all the turns it may.
const RUNNING_RETRY_AFTER: u64 = 2;
impl Engine {
    /// Start a turn: validate the order against the session's state, apply its overrides and
    /// run the turn (on its own task, or its watcher's), or queue it behind the running one when
    /// the order says so.
    pub fn start_turn(
        &self,
        session: &Arc<Session>,
        req: TurnOrder,
    ) -> Result<TurnHandle, EngineError> {
        self.start_turn_as(session, req, None)
    }

    /// [`Engine::start_turn`] under a turn id minted already (by the instance that answered
    /// the request: see `inbox.rs`), or a new one.
    pub(crate) fn start_turn_as(
        &self,
        session: &Arc<Session>,
        req: TurnOrder,
        turn_id: Option<String>,
    ) -> Result<TurnHandle, EngineError> {
        self.check_open()?;
        let drive = req.delivery.runner == Runner::Watcher;
        let config = &self.inner.config;
        let (tx, rx, overflow) = channel::channel();
        let mut st = session.lock();
        let (answering, slot) = self.admit(session, &mut st, &req)?;
        let agent = config.agent(&st.record.agent).ok_or_else(|| {
            EngineError::Conflict(format!(
                "the session's agent {:?} is no longer configured",
                st.record.agent
            ))
        })?;
        let changed = !is_empty_update(&req.update);
        let record = if changed {
            let mut record = (*st.record).clone();
            self.apply_update(agent, &mut record, req.update)?;
            Some(record)
        } else {
            None
        };
        if let TurnInput::Resume { .. } = &req.input {
            st.pending.clear();
        }
        // The session goes on: a plan that waited for a decision no longer does (a decision
        // took it before starting its turn).
        st.plan = None;
        if let Some(record) = record {
            st.record = Arc::new(record);
        }
        let control = TurnControl::new(turn_id.unwrap_or_else(|| ids::new("turn")));
        let job = Job {
            control: control.clone(),
            input: req.input,
            answering,
            sink: Some(tx),
            client: req.delivery.client,
            plan: req.plan,
            max_steps: req.max_steps,
            text: req.delivery.text,
            slot,
            parent: tracing::Span::current(),
        };
        crate::telemetry::note_turn(&control.turn_id);
        let run_now = if st.running.is_some() {
            st.queue.push_back(job);
            None
        } else {
            st.running = Some(control.clone());
            Some(job)
        };
        drop(st);
        if changed {
            self.store_settings(session, run_now.is_none());
        }
        let running = (drive && run_now.is_some()).then(|| self.inner.tracker.token());
        let driven = match run_now {
            Some(job) if drive => Some(turn::drive(&self.inner, session.clone(), job)),
            Some(job) => {
                turn::spawn(&self.inner, session.clone(), job);
                None
            }
            None => None,
        };
        let turn_id = control.turn_id.clone();
        let parts = (rx, overflow, driven, running);
        Ok(TurnHandle::new(
            turn_id,
            self.clone(),
            session.clone(),
            parts,
        ))
    }

    /// Write the session's new settings: committed now for a `queued` turn (one that runs now
    /// commits them with its first events).
    fn store_settings(&self, session: &Session, queued: bool) {
        self.persist(session);
        if queued {
            if let Err(e) = self.inner.store.commit() {
                tracing::error!(session = %session.id, error = %e, "the session's new settings could not be stored");
            }
        }
    }

    /// Whether the session can take the order now (with its lock held): it exists, is not busy
    /// unless the order queues, the order answers what the session waits on, and the limits
    /// allow it. The calls it answers, and its place among the running turns (`None`: queued).
    fn admit(
        &self,
        session: &Arc<Session>,
        st: &mut State,
        req: &TurnOrder,
    ) -> Result<(Vec<Pending>, Option<RunSlot>), EngineError> {
        if st.deleted {
            return Err(EngineError::NotFound {
                what: "session",
                id: session.id.to_string(),
            });
        }
        if let Some(r) = &st.running {
            if req.when_busy == WhenBusy::Refuse {
                return Err(EngineError::Busy {
                    turn_id: r.turn_id.clone(),
                });
            }
        }
        approvals::settle_locked(&self.inner, session, st, clock::now_ms());
        // A new message where no client can answer the open calls (a message of the events
        // API, a run) goes on: its turn answers them first (see `Turn::begin`). Where a client
        // attends, it is a conflict.
        let goes_on = matches!(req.delivery.client, Client::Absent { .. })
            && matches!(req.input, TurnInput::User { .. });
        let answering = if goes_on {
            Vec::new()
        } else {
            let history = &st.history;
            super::answers::check_answers(&st.pending, &req.input, &|| history.messages())?
        };
        Ok((answering, self.place(st)?))
    }

    /// A place for a new turn: behind the running one (`[limits] queued_turns`), or among the
    /// running turns (`[limits] running_turns`).
    fn place(&self, st: &State) -> Result<Option<RunSlot>, EngineError> {
        let limits = &self.inner.config.limits;
        if st.running.is_some() {
            let queued = st
                .queue
                .iter()
                .filter(|q| !q.control.token.is_cancelled())
                .count();
            if queued >= limits.queued_turns {
                return Err(EngineError::OverLimit {
                    kind: "too_many_queued_turns",
                    message: format!(
                        "this session already has {queued} turns queued behind the running one (limit: [limits] queued_turns in tools.toml); wait for one to finish or cancel some"
                    ),
                    server_wide: false,
                    retry_after: QUEUE_RETRY_AFTER,
                });
            }
            return Ok(None);
        }
        let slot = RunSlot::try_take(&self.inner.running_turns, limits.running_turns);
        if slot.is_none() {
            return Err(EngineError::OverLimit {
                kind: "too_many_running_turns",
                message: format!(
                    "the server is running {} turns, its limit (limit: [limits] running_turns in tools.toml); retry shortly",
                    limits.running_turns
                ),
                server_wide: true,
                retry_after: RUNNING_RETRY_AFTER,
            });
        }
        Ok(slot)
    }

    /// Cancel one turn (running or queued) or, with no id, the running turn and every queued
    /// one. Idempotent: a turn that already ended is left alone. The ids it stopped.
    pub fn cancel(&self, session: &Arc<Session>, turn_id: Option<&str>) -> Vec<String> {
        let mut stopped = Vec::new();
        let next = {
            let mut st = session.lock();
            let wanted = |id: &str| turn_id.is_none_or(|t| t == id);
            for q in st.queue.iter() {
                if wanted(&q.control.turn_id) && !q.control.token.is_cancelled() {
                    q.control.stop(StopCause::Cancelled);
                    stopped.push(q.control.turn_id.clone());
                }
            }
            // A plan waits from before its turn's last write is durable: that turn, still
            // running, has ended but for it. The interrupt ends the wait, not the turn.
            let plan_waits = turn_id.is_none() && st.plan.is_some();
            if let Some(r) = &st.running {
                if wanted(&r.turn_id) && !r.token.is_cancelled() && !plan_waits {
                    r.stop(StopCause::Cancelled);
                    stopped.push(r.turn_id.clone());
                }
            }
            if plan_waits && st.plan.take().is_some() {
                stopped.push(self.interrupt_plan(session, &mut st));
            }
            // Nothing running: cancelled queued turns are logged right away.
            turn::next_queued(session, &mut st, &self.inner.store)
        };
        if let Some(job) = next {
            turn::spawn(&self.inner, session.clone(), job);
        }
        stopped
    }

    /// Ends the wait of a plan when everything is cancelled (the runs API's interrupt): the
    /// run's last turn is a rejection of the plan, cancelled before it started, so the log, the
    /// run stream (`done`) and a restart all show that the run ended there. Logged now, or,
    /// while the plan's turn is still ending, queued cancelled behind it (logged as it ends).
    /// Its turn id.
    fn interrupt_plan(&self, session: &Session, st: &mut State) -> String {
        let decision = PlanDecision::Reject {
            reason: Some("Interrupted: the run was stopped.".into()),
        };
        let input = TurnInput::User {
            content: serde_json::Value::Array(vec![decision.block()]),
            files: vec![],
            skills: vec![],
        };
        let control = TurnControl::new(ids::new("turn"));
        let turn_id = control.turn_id.clone();
        if st.running.is_none() {
            turn::log_unstarted(session, st, &self.inner.store, &turn_id, &input);
            return turn_id;
        }
        control.stop(StopCause::Cancelled);
        let order = TurnOrder::unattended(input, "");
        st.queue.push_back(Job {
            control,
            input: order.input,
            answering: Vec::new(),
            sink: None,
            client: order.delivery.client,
            plan: false,
            max_steps: None,
            text: order.delivery.text,
            slot: None,
            parent: tracing::Span::current(),
        });
        turn_id
    }

    /// Confirm or reject the plan a run waits on (409 when none waits): the decision starts a
    /// new turn (queued behind the plan's turn if that is still ending) whose `user.message`
    /// carries it as a `plan_decision` block. Confirmed, the run goes on with tools; rejected, the
    /// model is asked for another plan. No client attends the decision's turn (see
    /// [`Client::Absent`] for `attend_at`). The decision's turn id.
    pub fn decide_plan(
        &self,
        session: &Arc<Session>,
        decision: PlanDecision,
        attend_at: &'static str,
    ) -> Result<String, EngineError> {
        self.decide_plan_as(session, decision, attend_at, None)
    }

    /// [`Engine::decide_plan`] under a turn id minted already, or a new one.
    pub(crate) fn decide_plan_as(
        &self,
        session: &Arc<Session>,
        decision: PlanDecision,
        attend_at: &'static str,
        turn_id: Option<String>,
    ) -> Result<String, EngineError> {
        let Some(plan) = session.lock().plan.take() else {
            return Err(no_plan());
        };
        let reject = matches!(decision, PlanDecision::Reject { .. });
        let input = TurnInput::User {
            content: serde_json::Value::Array(vec![decision.block()]),
            files: vec![],
            skills: vec![],
        };
        let req = TurnOrder {
            plan: reject,
            ..TurnOrder::unattended(input, attend_at)
        };
        match self.start_turn_as(session, req, turn_id) {
            Ok(handle) => Ok(handle.turn_id.clone()),
            Err(e) => {
                let mut st = session.lock();
                if st.plan.is_none() && st.running.is_none() {
                    st.plan = Some(plan);
                }
                Err(e)
            }
        }
    }
}

/// The answer to a plan decision where no plan waits.
pub(super) fn no_plan() -> EngineError {
    EngineError::Conflict(
        "no plan is waiting for approval in this session; start a run with \"plan\": true first"
            .into(),
    )
}
