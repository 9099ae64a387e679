//! A turn's server tool calls: the granted calls of a resumed turn, and the calls the model makes
//! that run at once, in parallel (bounded), each result logged as it completes.

use std::collections::HashMap;

use super::{End, Turn};
use crate::engine::client_questions::{self, Asked, Flight, Waiting};
use crate::engine::session_record::{Pending, PendingKind};
use crate::engine::types::{ClientResult, Permission};
use crate::log::EventBody;
use crate::message::ToolCall;
use crate::metrics::NotRun;
use crate::tools::{CallContext, ToolOutput};

impl Turn {
    /// A tool's result as the model may be given it: over `[limits] tool_result_bytes`, its
    /// first part and a note naming the workspace file that holds the whole (see `oversize.rs`).
    pub(super) async fn bounded(&self, call_id: &str, out: ToolOutput) -> ToolOutput {
        let workspace = self.config.server.sandboxes.join(&*self.session.id);
        let limit = self.config.limits.tool_result_bytes;
        crate::engine::oversize::bound(&workspace, call_id, out, limit).await
    }

    /// Log the result of every call the last turn stopped on: the client's results, the
    /// denials, and the granted calls run here.
    pub(super) async fn resume(
        &mut self,
        answering: Vec<Pending>,
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
    ) -> Result<(), End> {
        self.open = answering.iter().map(|p| p.call_id.clone()).collect();

        let mut results: HashMap<String, ClientResult> = results
            .into_iter()
            .map(|r| (r.call_id.clone(), r))
            .collect();
        let mut permissions: HashMap<String, Permission> = permissions
            .into_iter()
            .map(|p| (p.call_id.clone(), p))
            .collect();
        let record = self.session.record();
        let config = self.config.clone();
        let host_tools = self.inner.tools.tools();
        let mut granted = Vec::new();
        // Calls still in flight, waiting on questions this follow-up answers.
        self.flight = self.session.lock().take_flight();
        for p in answering {
            if p.ended.is_some() || client_questions::schema_of(&p).is_some() {
                self.settle_question(&p, results.remove(&p.call_id)).await;
            } else if let Some(r) = results.remove(&p.call_id) {
                let out = ToolOutput {
                    content: r.content,
                    is_error: r.is_error,
                    files: vec![],
                };
                let out = self.bounded(&p.call_id, out).await;
                self.emit_result(&p.call_id, out);
            } else if p.expired {
                // Its permission expired before the client answered (a grant was refused).
                let text = crate::engine::approvals::expired_result();
                crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Expired);
                self.emit_result(&p.call_id, ToolOutput::error(text));
            } else if let Some(perm) = permissions.remove(&p.call_id) {
                if !perm.granted {
                    let text = match perm.reason.as_deref().map(str::trim) {
                        Some(reason) if !reason.is_empty() => format!("Tool call denied: {reason}"),
                        _ => "Tool call denied".to_string(),
                    };
                    crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Denied);
                    self.emit_result(&p.call_id, ToolOutput::error(text));
                    continue;
                }
                use crate::engine::approvals::{regrant, Regrant};
                let owner = self.session.owner.as_deref();
                let decided = match config.agent_as(owner, &record.agent) {
                    Some(agent) => regrant(&agent, &host_tools, &record, &p, &self.session.id),
                    None => Regrant::Refuse("The session's agent is gone.".into()),
                };
                match decided {
                    Regrant::Refuse(msg) => {
                        crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Refused);
                        self.emit_result(&p.call_id, ToolOutput::error(msg))
                    }
                    Regrant::Run => granted.push(p.call()),
                }
            }
        }
        self.run_tools(granted).await
    }

    /// The answer to a question of an MCP server (an elicitation call; see
    /// `engine/client_questions.rs`): logged as the call's result and delivered to the call that asked.
    /// A question not answered in time is declined; one from before a restart, and its call,
    /// are ended with their reason.
    async fn settle_question(&mut self, p: &Pending, r: Option<ClientResult>) {
        let (answer, out) = match (&p.ended, r) {
            (Some(text), _) => (None, ToolOutput::error(text.clone())),
            (None, Some(r)) => {
                let schema = client_questions::schema_of(p).cloned().unwrap_or_default();
                // Checked when the follow-up was admitted; a failure here declines.
                let answer = client_questions::client_answer(&schema, &r.content, r.is_error)
                    .unwrap_or(crate::tools::mcp::elicit::Answer::Decline);
                let out = ToolOutput {
                    content: r.content,
                    is_error: r.is_error,
                    files: vec![],
                };
                (Some(answer), self.bounded(&p.call_id, out).await)
            }
            (None, None) => (
                Some(crate::tools::mcp::elicit::Answer::Decline),
                ToolOutput::error(client_questions::EXPIRED),
            ),
        };
        self.emit_result(&p.call_id, out);
        if let Some(answer) = answer {
            let delivered = self
                .flight
                .as_mut()
                .is_some_and(|f| f.answer(&p.call_id, answer));
            if !delivered {
                tracing::info!(session = %self.session.id, question = %p.call_id,
                    "an answer to an MCP server's question came, but no call waits on it any more");
            }
        }
    }

    /// Run server tool calls in parallel (bounded), with the calls still in flight from the
    /// last turn (waiting on questions to the client), logging each result as it completes. When
    /// every call still running waits on a question, the turn stops for the client: the
    /// questions are its calls (see `engine/client_questions.rs`).
    pub(super) async fn run_tools(&mut self, calls: Vec<ToolCall>) -> Result<(), End> {
        if calls.is_empty() && self.flight.is_none() {
            return Ok(());
        }
        if !calls.is_empty() && !self.begun.load(std::sync::atomic::Ordering::Relaxed) {
            // A call runs only once the turn's start is in the log: a turn cut off by a crash
            // or a store failure after its calls ran is then found begun (closed with a
            // reason; a repeat of its Idempotency-Key answered with that), never carried out
            // again from the start with its calls run twice. A model call of more than
            // `SYNC_AFTER` has committed it already.
            self.sync().await?;
        }
        let mut flight = match self.flight.take() {
            Some(f) => f,
            None => self.new_flight(),
        };
        let listing = self.inner.tools.tools();
        let agent = self.session.record().agent.clone();
        for call in calls {
            // `tool_calls_per_day`: a call over it is not run, and the model is told.
            let owner = self.session.owner.as_deref();
            let counted = self.inner.ledger.tool_call(&self.config, owner, &agent);
            if let Err(text) = counted.await {
                self.emit_result(&call.id, ToolOutput::error(text));
                continue;
            }
            let span = match listing.iter().find(|t| t.spec.name == call.name) {
                Some(t) => {
                    let verdict = crate::telemetry::snake(&t.verdict);
                    crate::telemetry::tool_span(&t.server, &t.tool, &verdict)
                }
                None => crate::telemetry::tool_span("unknown", &call.name, "unknown"),
            };
            flight.spawn(call, span);
        }
        let driven = self.drive(&mut flight).await;
        if flight.stalled() {
            // Stopped on questions: the calls wait for the answers in the session's state.
            self.flight = Some(flight);
        }
        driven
    }

    fn new_flight(&self) -> Flight {
        let ctx = CallContext {
            session_id: self.session.id.to_string(),
            workspace: self.config.server.sandboxes.join(&*self.session.id),
            owner: self.session.owner.clone(),
            elicitor: None,
            sampler: Some(self.sampler.clone()),
        };
        Flight::new(
            self.inner.tools.clone(),
            ctx,
            self.elicitation_tool().is_some(),
        )
    }

    /// The agent's elicitation tool, when the client attends and declared it: then MCP
    /// servers' questions reach the client as its calls.
    pub(super) fn elicitation_tool(&self) -> Option<String> {
        if !matches!(self.client, crate::engine::types::Client::Attends) {
            return None;
        }
        let record = self.session.record();
        let agent = self.config.agent(&record.agent)?;
        let name = &agent.elicitation_tool;
        record
            .client_tools
            .iter()
            .any(|t| &t.name == name)
            .then(|| name.clone())
    }

    /// Log the results as they come, and the questions; until every call has its result, or
    /// every call still running waits on a question.
    async fn drive(&mut self, flight: &mut Flight) -> Result<(), End> {
        loop {
            if flight.running.is_empty() {
                return Ok(());
            }
            if flight.stalled() {
                for w in &flight.waiting {
                    self.open.retain(|id| *id != w.pending.call_id);
                    self.stop_on.push(w.pending.clone());
                }
                return Ok(());
            }
            // What the turn said before (its tool uses, its results) is committed and
            // published when it is due (see `sync_due`) while the calls go on.
            let due = self.sync_due();
            tokio::select! {
                Some((id, out)) = flight.results.recv() => {
                    flight.finished(&id);
                    let out = self.bounded(&id, out).await;
                    self.emit_result(&id, out);
                    // The last result goes out with the next commit, which comes at once.
                    if !flight.running.is_empty() {
                        self.sync().await?;
                    }
                }
                Some(asked) = flight.questions.recv() => self.question(flight, asked),
                _ = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() => {
                    self.sync().await?;
                }
            }
        }
    }

    /// A call asks the client a question: logged as a call of the elicitation tool, which the
    /// turn stops on once every call still running waits on one.
    fn question(&mut self, flight: &mut Flight, asked: Asked) {
        let Some(tool) = self.elicitation_tool() else {
            // (Questions come only where there is a client to ask.)
            return;
        };
        let id = crate::ids::new("elicit");
        let input = client_questions::question_input(&asked);
        let logged = self.emit(EventBody::ToolUse {
            tool_use_id: id.clone(),
            name: tool.clone(),
            input: input.clone(),
        });
        tracing::info!(session = %self.session.id, server = %asked.question.server, call = %asked.call_id,
            question = %id, "an MCP server asks the client (elicitation): the turn stops for the answer");
        flight.waiting.push(Waiting {
            reply: asked.reply,
            pending: Pending {
                call_id: id,
                name: tool,
                input,
                kind: PendingKind::Client,
                asked_at: logged.map(|e| e.created_at.clone()).unwrap_or_default(),
                expires_at: None,
                expired: false,
                ended: None,
            },
        });
    }
}
