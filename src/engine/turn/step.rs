//! The turn loop: the turn's start, then model steps, each routing its tool calls (run now, stop
//! for the client, or refuse), until the model is done, the turn stops for the client or its
//! step budget is spent.

use std::collections::HashMap;

use super::{user_message, End, Turn, NOT_ANSWERED};
use crate::engine::session_record::{Pending, PendingKind};
use crate::engine::session_tools::{Catalog, Route};
use crate::engine::types::TurnInput;
use crate::log::{EventBody, FailReason, StopReason};
use crate::message::Message;
use crate::metrics::NotRun;
use crate::tools::ToolOutput;
use crate::upstream::ModelOutput;

impl Turn {
    pub(super) async fn body(
        &mut self,
        input: TurnInput,
        answering: Vec<Pending>,
        plan: bool,
        max_steps: Option<u32>,
    ) -> Result<StopReason, End> {
        let input_kind = match &input {
            TurnInput::User { content, .. } => {
                crate::engine::session_record::PlanDecision::of_content(content)
            }
            TurnInput::Resume { .. } => None,
        };
        self.begin(input, answering).await?;
        if !self.stop_on.is_empty() {
            // The answered calls asked again: the turn stops for the client at once.
            return Ok(StopReason::ToolUse);
        }
        let record = self.session.record();
        let config = self.config.clone();
        // Its tools as the session's principal sees them (`[keys.NAME] tools`).
        let owner = self.session.owner.as_deref();
        let agent = &*config.agent_as(owner, &record.agent).ok_or_else(|| {
            End::Failed(
                FailReason::InternalError,
                format!(
                    "the session's agent {:?} is no longer configured for the session's key",
                    record.agent
                ),
            )
        })?;
        // The operator's budget is a ceiling: a request may ask for fewer steps, never more.
        let max_steps = max_steps.map_or(agent.max_steps, |m| m.min(agent.max_steps));
        if plan {
            // A plan turn (a run's first, or after a rejection) ends with its plan.
            let rejected = matches!(
                &input_kind,
                Some(crate::engine::session_record::PlanDecision::Reject { .. })
            );
            return self.plan(agent, !rejected).await;
        }
        let mut step = 0;
        while step < max_steps {
            step += 1;
            if let Some(stop) = self.step(agent, step == max_steps).await? {
                return Ok(stop);
            }
        }
        // Only reached with a budget of no steps.
        Ok(StopReason::MaxSteps)
    }

    /// The turn's start: a turn the log still has open is closed, the input is logged, and what
    /// it answers is settled (the calls a new message goes on past; the client's results and
    /// decisions, and the granted calls run).
    async fn begin(&mut self, input: TurnInput, answering: Vec<Pending>) -> Result<(), End> {
        let store = &self.inner.store;
        if self.session.lost_writes(store) {
            // The last turn's writes were lost and its log could not be read back then (the
            // store unreachable): it is read back, and that turn closed, before this one goes
            // on from what is stored.
            let why = "the event log could not be written when the turn ended";
            self.session.repair(store, why, false).await.map_err(|()| {
                End::Failed(
                    FailReason::InternalError,
                    "the event log could not be read: the store is unavailable".into(),
                )
            })?;
        }
        {
            // A turn the log still has open (its closing could not be written) is closed
            // first, in the same commit as this turn's start.
            let mut st = self.session.lock();
            let why = "the event log could not be written when the turn ended";
            let store = &self.inner.store;
            let reason = FailReason::InternalError;
            self.session.close_open_locked(&mut st, store, reason, why);
        }
        self.emit(user_message(&input));
        let (row, confirm) = self.start;
        if row {
            self.inner
                .store
                .inbox_row_done(&self.session.id, &self.turn_id);
        }
        if row || confirm {
            // Its start durable before the model is called: a turn carried out again after a
            // crash has done nothing yet, and a request answered `202` never waits a timer.
            self.sync().await?;
        }
        match input {
            TurnInput::User { .. } => {
                // Calls the session still waits on (the last turn stopped on them, before or
                // after this message was sent): the session went on without their answers.
                let (open, flight) = {
                    let mut st = self.session.lock();
                    (st.take_pending(), st.take_flight())
                };
                for p in open {
                    self.emit_result(&p.call_id, ToolOutput::error(NOT_ANSWERED));
                }
                // MCP calls that waited on those questions are cut short.
                for id in flight.iter().flat_map(|f| f.running.clone()) {
                    self.emit_result(&id, ToolOutput::error("Cancelled."));
                }
                Ok(())
            }
            TurnInput::Resume {
                results,
                permissions,
            } => self.resume(answering, results, permissions).await,
        }
    }

    /// One model step: call the model with the session's history and tools, log what it says,
    /// and route its tool calls. `Some` when the turn ends here; `last`: the step budget is
    /// spent after this one.
    async fn step(
        &mut self,
        agent: &crate::config::AgentConfig,
        last: bool,
    ) -> Result<Option<StopReason>, End> {
        let record = self.session.record();
        let host_tools = self.inner.tools.tools();
        let catalog = Catalog::new(agent, &host_tools, &record, self.client);
        let thinking = match record.options.get("thinking").map(String::as_str) {
            Some("on") => true,
            Some("off") => false,
            _ => agent.thinking,
        };
        self.prepare_attachments().await;
        let req = self.request(agent, &record, catalog.offered(), thinking);
        let rebuild = |t: &Turn| t.request(agent, &record, catalog.offered(), thinking);
        let (req, bytes) = self.fit(agent, req, rebuild).await?;
        let out = self.call_model(&req, thinking).await?;
        self.calibration().observe(bytes, out.usage.input_tokens);
        self.usage.add(out.usage);

        if let Some(ev) = EventBody::thinking(&out.thinking, &out.signed_thinking) {
            if thinking {
                self.emit(ev);
            }
        }
        if !out.text.is_empty() {
            self.emit(EventBody::AgentMessage {
                content: out.text.clone(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
        let ModelOutput {
            tool_calls, stop, ..
        } = out;
        if tool_calls.is_empty() {
            return match stop {
                crate::upstream::ModelStop::MaxTokens => Ok(Some(StopReason::MaxTokens)),
                crate::upstream::ModelStop::Refusal => Ok(Some(StopReason::Refusal)),
                _ if !self.said => Err(End::Failed(
                    FailReason::EmptyOutput,
                    "the model finished without a reply".into(),
                )),
                _ => Ok(Some(StopReason::EndTurn)),
            };
        }
        let mut asked_at = HashMap::new();
        for call in &tool_calls {
            let logged = self.emit(EventBody::ToolUse {
                tool_use_id: call.id.clone(),
                name: call.name.clone(),
                input: call.input.clone(),
            });
            if let Some(ev) = logged {
                asked_at.insert(call.id.clone(), ev.created_at.clone());
            }
        }
        if last {
            for call in &tool_calls {
                self.emit_result(
                    &call.id,
                    ToolOutput::error("not run: the turn's step budget is spent"),
                );
            }
            return Ok(Some(StopReason::MaxSteps));
        }
        self.route_calls(&catalog, &host_tools, tool_calls, asked_at)
            .await
    }

    /// Send each of a step's tool calls where the catalog routes it: run the inline ones now
    /// (in parallel), refuse the refused, and stop the turn (`tool_use`) on those the client
    /// must answer. `asked_at`: when each call was logged.
    async fn route_calls(
        &mut self,
        catalog: &Catalog<'_>,
        host_tools: &[crate::tools::ServerTool],
        tool_calls: Vec<crate::message::ToolCall>,
        mut asked_at: HashMap<String, String>,
    ) -> Result<Option<StopReason>, End> {
        let mut inline = Vec::new();
        let mut stop_on = Vec::new();
        let mut asked = Vec::new();
        for call in tool_calls {
            let kind = match catalog.route(&call.name) {
                Route::Client => PendingKind::Client,
                Route::Ask => {
                    let binding = crate::engine::approvals::bind(
                        &call.id,
                        &call.name,
                        &call.input,
                        host_tools,
                    );
                    asked.push(binding);
                    PendingKind::Permission
                }
                Route::Inline => {
                    inline.push(call);
                    continue;
                }
                Route::Refuse(msg) => {
                    crate::metrics::tool(&*self.inner.tools, &call.name).not_run(NotRun::Refused);
                    self.emit_result(&call.id, ToolOutput::error(msg));
                    continue;
                }
            };
            stop_on.push(Pending {
                asked_at: asked_at.remove(&call.id).unwrap_or_default(),
                call_id: call.id,
                name: call.name,
                input: call.input,
                kind,
                expires_at: None,
                expired: false,
                ended: None,
            });
        }
        self.run_tools(inline).await?;
        if stop_on.is_empty() && self.stop_on.is_empty() {
            return Ok(None);
        }
        self.open
            .retain(|id| !stop_on.iter().any(|p| &p.call_id == id));
        // (With the questions of MCP calls, when some asked the client.)
        self.stop_on.extend(stop_on);
        self.asked = asked;
        Ok(Some(StopReason::ToolUse))
    }

    /// Plan mode: ask for a plan with no tools offered and log it (`agent.message`, `plan:
    /// true`); the turn then ends (`end_turn`) and the session waits for the decision, which
    /// starts the next turn (see `Engine::decide_plan`). The history then carries the decision:
    /// a confirmation (its edits replacing the plan), or a rejection with its reason, which asks
    /// for another plan. `first`: the run's first plan (asked for here; a rejection asks itself).
    pub(super) async fn plan(
        &mut self,
        agent: &crate::config::AgentConfig,
        first: bool,
    ) -> Result<StopReason, End> {
        if first {
            self.extra = vec![Message::User {
                content: crate::message::Content::Text(
                    "Before doing anything, propose a short, numbered plan for this goal. Do not call tools yet; the plan will be reviewed first.".into(),
                ),
            }];
        }
        let record = self.session.record();
        self.prepare_attachments().await;
        let req = self.request(agent, &record, Vec::new(), false);
        let out = self.call_model(&req, false).await?;
        self.usage.add(out.usage);
        if out.text.trim().is_empty() {
            return Err(End::Failed(
                FailReason::EmptyOutput,
                "the model proposed no plan".into(),
            ));
        }
        // The plan waits before anyone can see it, so a client that answers `plan_proposed`
        // at once finds it (its decision's turn then queues behind the end of this one).
        self.session
            .lock()
            .wait_on_plan(crate::engine::replay::PlanWait {
                plan: out.text.clone(),
            });
        self.proposed = true;
        self.emit(EventBody::AgentMessage {
            content: out.text,
            plan: true,
            compaction: false,
            replaces: None,
        });
        Ok(StopReason::EndTurn)
    }
}
