//! The runs API (spec 002): a stateless `POST /run`, session runs with their SSE progress
//! stream, plan approval, interrupt.
//!
//! A run is a turn. Its stream is a rendering of the session's log: `message`, `partial_message
//! {text, step}`, `tool_call {name, step}`, `tool_result {name, success}`, `plan_proposed
//! {plan}`, `error {message}` and `done {finish_reason, total_steps}`. `GET /sessions/{id}/events`
//! replays the current run (or, when none runs, the most recent one) from its first event and
//! then follows live, so "POST the run, then subscribe" misses nothing; deltas are live only.
//!
//! Finish reasons: `NoMoreToolCalls` (the model finished), `MaxStepsReached` (`max_steps`
//! model calls and it still wanted tools), `MaxTokens`, `Refusal`, `Error` (the turn failed; an
//! `error` event says why), `Cancelled`. Statuses: `finished`, `failed`, `cancelled`.

use std::collections::HashMap;
use std::sync::Arc;

use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::history::Projector;
use crate::engine::log_follower::Follow;
use crate::engine::{
    DeltaKind, Feed, NewSession, PlanDecision, Runner, TurnHandle, TurnInput, TurnOrder,
};
use crate::http::detached::detached;
use crate::http::{body, json_response, sse, ApiError, Request, Response};
use crate::log::{EventBody, StopReason};
use crate::message::Message;
use crate::protocol::context::{App, Caller};

/// Where a client can attend a turn (run client tools, answer permissions): named in the error
/// result of such a call in a run, which no client attends.
const ATTEND_AT: &str = "POST /sessions/{id}/turns";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatelessRun {
    goal: String,
    system_prompt: Option<String>,
    max_steps: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRun {
    goal: String,
    #[serde(default)]
    plan: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Confirm {
    edits: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Reject {
    reason: Option<String>,
}

/// A run's goal as the turn's user message.
fn goal(text: String) -> TurnInput {
    TurnInput::User {
        content: Value::String(text),
        files: vec![],
        skills: vec![],
    }
}

/// The finish reason and status of a terminal event.
fn finish(body: &EventBody) -> (&'static str, &'static str) {
    match body {
        EventBody::TurnCompleted { stop_reason, .. } => (
            match stop_reason {
                StopReason::EndTurn | StopReason::ToolUse => "NoMoreToolCalls",
                StopReason::MaxSteps => "MaxStepsReached",
                StopReason::MaxTokens => "MaxTokens",
                StopReason::Refusal => "Refusal",
            },
            "finished",
        ),
        EventBody::TurnCancelled { .. } => ("Cancelled", "cancelled"),
        _ => ("Error", "failed"),
    }
}

/// Turns a run's events into run-stream events, counting model steps. A run in plan mode spans
/// turns: the plan's turn ends with its plan (no `done`: the run waits), and the decision's
/// turn (its `user.message` carries a `plan_decision` block, shown as a user `message`) goes on
/// the same run.
#[derive(Default)]
pub(crate) struct RunRenderer {
    /// The last turn ended on a plan that waits for a decision.
    awaiting_plan: bool,
    step: u32,
    /// Whether the current step has shown anything yet (a new step starts after tool results).
    in_step: bool,
    names: HashMap<String, String>,
}

impl RunRenderer {
    fn enter_step(&mut self) {
        if !self.in_step {
            self.step += 1;
            self.in_step = true;
        }
    }

    /// The run-stream events (name, data) for one feed item.
    pub(crate) fn render(&mut self, item: &Feed) -> Vec<(&'static str, Value)> {
        match item {
            Feed::Delta {
                kind: DeltaKind::Message,
                text,
                ..
            } => {
                self.enter_step();
                vec![(
                    "partial_message",
                    json!({"text": &**text, "step": self.step}),
                )]
            }
            Feed::Delta { .. } | Feed::Fragment { .. } => {
                self.enter_step();
                vec![]
            }
            Feed::Event(ev) => self.event(&ev.body),
        }
    }

    /// The run-stream events of one logged event.
    fn event(&mut self, body: &EventBody) -> Vec<(&'static str, Value)> {
        match body {
            EventBody::UserMessage { content, .. } => match PlanDecision::of_content(content) {
                Some(decision) => {
                    self.awaiting_plan = false;
                    self.in_step = false;
                    vec![(
                        "message",
                        json!({"role": "user", "content": [decision.block()]}),
                    )]
                }
                None => {
                    *self = RunRenderer::default();
                    vec![]
                }
            },
            EventBody::AgentThinking { .. } => {
                self.enter_step();
                vec![]
            }
            // A compaction's summary is not something the agent said: not shown.
            EventBody::AgentMessage {
                compaction: true, ..
            } => vec![],
            EventBody::AgentMessage { content, plan, .. } => {
                self.enter_step();
                if *plan {
                    // The next model call (after the decision) is a new step.
                    self.in_step = false;
                    self.awaiting_plan = true;
                    vec![("plan_proposed", json!({ "plan": content }))]
                } else if content.is_empty() {
                    vec![]
                } else {
                    vec![(
                        "message",
                        json!({"role": "assistant", "content": [{"type": "text", "text": content}]}),
                    )]
                }
            }
            EventBody::ToolUse {
                tool_use_id, name, ..
            } => {
                self.enter_step();
                self.names.insert(tool_use_id.clone(), name.clone());
                vec![("tool_call", json!({"name": name, "step": self.step}))]
            }
            EventBody::ToolResult {
                tool_use_id,
                is_error,
                ..
            } => {
                self.in_step = false;
                let name = self.names.get(tool_use_id).cloned().unwrap_or_default();
                vec![("tool_result", json!({"name": name, "success": !is_error}))]
            }
            EventBody::TurnCompleted { .. } if self.awaiting_plan => vec![],
            body => self.end(body),
        }
    }

    /// The events of a run's end: `error` (when it failed), then `done`.
    fn end(&self, body: &EventBody) -> Vec<(&'static str, Value)> {
        let (reason, _) = finish(body);
        let mut out = Vec::new();
        if let EventBody::TurnFailed {
            reason: why,
            message,
            ..
        } = body
        {
            let why = serde_json::to_value(why)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            out.push((
                "error",
                json!({"message": format!("{why}: {}", message.clone().unwrap_or_default())}),
            ));
        }
        out.push((
            "done",
            json!({"finish_reason": reason, "total_steps": self.step}),
        ));
        out
    }
}

/// `POST /run`: a one-off run in a session that is deleted afterwards. On a task of its own,
/// like a turn request: a client that goes away must not cut the run short of deleting its
/// session.
pub(crate) async fn run(app: Arc<App>, caller: Caller, req: Request) -> Result<Response, ApiError> {
    detached("the run", move |reply| async move {
        let _ = reply.send(run_detached(&app, &caller, req).await);
    })
    .await
}

/// A stateless run, from its request to its answer, its session deleted after it.
async fn run_detached(app: &App, caller: &Caller, req: Request) -> Result<Response, ApiError> {
    let body: StatelessRun = body::json(req.into_body(), app.max_body()).await?;
    if body.goal.trim().is_empty() {
        return Err(ApiError::bad_request(
            "goal is empty: say what the agent should do",
        ));
    }
    if body.max_steps == Some(0) {
        return Err(ApiError::bad_request("max_steps must be at least 1"));
    }
    let seed = body
        .system_prompt
        .map(|content| vec![Message::System { content }])
        .unwrap_or_default();
    let view = app
        .engine
        .create_session(
            caller.owned(),
            NewSession {
                agent: None,
                seed,
                client_tools: vec![],
            },
        )
        .await?;
    let session = app.engine.session(caller.reach(), &view.id).await?;
    // Runs on a task of its own (see `run`), which reads it to its end.
    let started = app
        .engine
        .start_turn(&session, {
            let mut order = TurnOrder::unattended(goal(body.goal), ATTEND_AT);
            order.delivery.runner = Runner::Watcher;
            // Answered with its outcome, not a `202`: its start commits with what follows.
            order.delivery.confirm = false;
            order.with_max_steps(body.max_steps)
        })
        .await;
    let result = match started {
        Ok(handle) => run_to_end(handle).await,
        Err(e) => Err(e.into()),
    };
    let _ = app.engine.delete_session(caller.reach(), &view.id).await;
    result
}

/// Read a run's turn to its end: the run's answer (its outcome, the messages it added, its
/// usage).
async fn run_to_end(mut handle: TurnHandle) -> Result<Response, ApiError> {
    let mut renderer = RunRenderer::default();
    let mut projector = Projector::default();
    while let Some(item) = handle.recv().await {
        renderer.render(&item);
        if let Feed::Event(ev) = &item {
            if ev.body.is_terminal() {
                let out = run_result(&ev.body, projector, renderer.step);
                return Ok(json_response(StatusCode::OK, &out));
            }
            if !matches!(ev.body, EventBody::UserMessage { .. }) {
                projector.apply(&ev.body);
            }
        }
    }
    Err(ApiError::store_unavailable(
        "the run could not be written to the event log: the store is unavailable (a full disk, an I/O error, the database down) or the session was deleted; see the server log",
    ))
}

/// A stateless run's answer, from its terminal event.
fn run_result(end: &EventBody, projector: Projector, steps: u32) -> Value {
    let (reason, status) = finish(end);
    let usage = match end {
        EventBody::TurnCompleted { usage, .. }
        | EventBody::TurnFailed { usage, .. }
        | EventBody::TurnCancelled { usage } => *usage,
        _ => None,
    }
    .unwrap_or_default();
    let mut out = json!({
        "status": status,
        "finish_reason": reason,
        "messages": projector.into_messages(),
        "usage": {"total_steps": steps, "total_tokens": usage.input_tokens + usage.output_tokens},
    });
    if let EventBody::TurnFailed {
        reason, message, ..
    } = end
    {
        out["error"] = json!({"reason": reason, "message": message});
    }
    out
}

/// `POST /sessions/{id}/run {"goal", "plan"?}`: `202 {"turn_id"}`; progress on `/events`.
pub(crate) async fn session_run(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let body: SessionRun = body::json(req.into_body(), app.max_body()).await?;
    if body.goal.trim().is_empty() {
        return Err(ApiError::bad_request(
            "goal is empty: say what the agent should do",
        ));
    }
    let order = TurnOrder {
        plan: body.plan,
        ..TurnOrder::unattended(goal(body.goal), ATTEND_AT)
    };
    let turn_id = app.engine.queue_message(&session, order).await?;
    Ok(json_response(
        StatusCode::ACCEPTED,
        &json!({"turn_id": turn_id, "session_id": &*session.id, "status": "accepted"}),
    ))
}

/// `GET /sessions/{id}/events`: the current (or last) run from its first event, then live.
pub(crate) async fn events(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    // The run's first turn on (a plan decision's turn goes on its plan's run).
    let start = session.run_start().saturating_sub(1);
    let follow = Follow::stream(&app.engine, session, start).await?;
    let state = (follow, RunRenderer::default());
    let events = futures_util::stream::unfold(state, |(mut follow, mut renderer)| async move {
        loop {
            let item = follow.next().await?;
            // One item may render as several events: they go out as one chunk.
            let mut wire = bytes::BytesMut::new();
            for (name, data) in renderer.render(&item) {
                wire.extend_from_slice(&sse::format_event(name, &data.to_string(), None));
            }
            if !wire.is_empty() {
                return Some((wire.freeze(), (follow, renderer)));
            }
        }
    });
    Ok(sse::response(events, &app.streams))
}

/// `POST /sessions/{id}/plan/confirm {"edits"?}`.
pub(crate) async fn confirm(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let body: Confirm = body::json(req.into_body(), app.max_body()).await?;
    let turn_id = app
        .engine
        .decide_plan(
            &session,
            PlanDecision::Confirm { edits: body.edits },
            ATTEND_AT,
        )
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"status": "confirmed", "turn_id": turn_id}),
    ))
}

/// `POST /sessions/{id}/plan/reject {"reason"?}`.
pub(crate) async fn reject(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let body: Reject = body::json(req.into_body(), app.max_body()).await?;
    let turn_id = app
        .engine
        .decide_plan(
            &session,
            PlanDecision::Reject {
                reason: body.reason,
            },
            ATTEND_AT,
        )
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"status": "rejected", "turn_id": turn_id}),
    ))
}

/// `POST /sessions/{id}/interrupt`: the runs API's name for cancelling everything.
pub(crate) async fn interrupt(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let cancelled = app.engine.cancel(&session, None).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "cancelled": cancelled }),
    ))
}
