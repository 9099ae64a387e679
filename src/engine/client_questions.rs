//! MCP elicitation through an AAP client: a server's question during a tool call becomes a call
//! of the agent's `elicitation_tool` (a client tool the client declared), the turn stops
//! `tool_use` on it, and the client's result is the answer.
//!
//! A turn's server calls run in a [`Flight`]: each on a task of its own, its questions coming
//! back to the turn on a channel. When every call still running waits on a question, the turn
//! logs one `agent.tool_use` of the elicitation tool per question (input: the server, the call
//! that asks, the message and the requested schema) and stops; the flight waits in the
//! session's state for the follow-up, whose result for that call is validated against the
//! schema (a bad answer is a 400 naming the field, and nothing is consumed), then delivered to
//! the question, and the calls go on in that turn. The elicitation tool is a channel, not a tool
//! of the model: it is not offered, and its calls are left out of what the model is sent.
//!
//! A question cannot outlive its process: after a restart, a call that waited on one is ended
//! (`Cancelled.`) and its question declined, both logged with the reason (see
//! [`unresumable`]).

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::session_record::{Pending, PendingKind};
use crate::message::{Block, Content, Message, ToolCall};
use crate::tools::mcp::elicit::{Answer, Elicitor, Question};
use crate::tools::{CallContext, ToolHost, ToolOutput};

/// How many server tool calls of one turn run at once.
const TOOL_PARALLELISM: usize = 8;

/// The result of a question asked before a restart, which cannot be answered now.
pub(super) const RESTARTED: &str = "Declined: the server restarted while this question waited; the MCP call that asked it cannot be resumed.";

/// The result of a question not answered within the agent's `approval_ttl_s` (declined).
pub(super) const EXPIRED: &str = "Declined: not answered within approval_ttl_s.";

/// A question from a call in flight, with where its answer goes.
pub(crate) struct Asked {
    pub(crate) call_id: String,
    pub(crate) question: Question,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// A question the turn stopped on: the elicitation call that carries it, and where the answer
/// goes.
pub(crate) struct Waiting {
    /// The elicitation call, as the turn stops on it.
    pub(crate) pending: Pending,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// The server calls of a turn in flight, with the questions they asked. Dropping it cancels
/// the calls still running.
pub(crate) struct Flight {
    host: Arc<dyn ToolHost>,
    ctx: CallContext,
    results_tx: mpsc::UnboundedSender<(String, ToolOutput)>,
    pub(crate) results: mpsc::UnboundedReceiver<(String, ToolOutput)>,
    questions_tx: Option<mpsc::UnboundedSender<Asked>>,
    pub(crate) questions: mpsc::UnboundedReceiver<Asked>,
    slots: Arc<Semaphore>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// The calls without a result yet.
    pub(crate) running: Vec<String>,
    /// The questions the turn stopped on (or will), by elicitation call id.
    pub(crate) waiting: Vec<Waiting>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Flight {
    /// A flight for one session's calls; `ask`: whether questions reach a client (else the
    /// calls run with no elicitor and questions are declined with a logged reason).
    pub(crate) fn new(host: Arc<dyn ToolHost>, ctx: CallContext, ask: bool) -> Flight {
        let (results_tx, results) = mpsc::unbounded_channel();
        let (questions_tx, questions) = mpsc::unbounded_channel();
        Flight {
            host,
            ctx,
            results_tx,
            results,
            questions_tx: ask.then_some(questions_tx),
            questions,
            slots: Arc::new(Semaphore::new(TOOL_PARALLELISM)),
            tasks: Vec::new(),
            running: Vec::new(),
            waiting: Vec::new(),
        }
    }

    /// Start a call on a task of its own; its result comes on [`Flight::results`].
    pub(crate) fn spawn(&mut self, call: ToolCall, span: tracing::Span) {
        let mut ctx = self.ctx.clone();
        ctx.elicitor = self.questions_tx.clone().map(|tx| -> Arc<dyn Elicitor> {
            Arc::new(CallElicitor {
                call_id: call.id.clone(),
                tx,
            })
        });
        let (host, slots, tx) = (
            self.host.clone(),
            self.slots.clone(),
            self.results_tx.clone(),
        );
        self.running.push(call.id.clone());
        let task = async move {
            let _slot = slots.acquire_owned().await;
            let timer = crate::metrics::tool(&*host, &call.name).start();
            let out = host.call(&ctx, &call.name, call.input).await;
            timer.done(out.is_error);
            let outcome = if out.is_error { "error" } else { "ok" };
            tracing::Span::current().record("outcome", tracing::field::display(outcome));
            let _ = tx.send((call.id, out));
        };
        let task = tokio::spawn(tracing::Instrument::instrument(task, span));
        self.tasks.push(task.abort_handle());
    }

    /// A call's result came.
    pub(crate) fn finished(&mut self, call_id: &str) {
        self.running.retain(|c| c != call_id);
    }

    /// Whether every call still running waits on a question (the turn stops for the client).
    pub(crate) fn stalled(&self) -> bool {
        !self.running.is_empty() && self.waiting.len() >= self.running.len()
    }

    /// Deliver the answer to the question `elicit_id` carries; false when none waits.
    pub(crate) fn answer(&mut self, elicit_id: &str, answer: Answer) -> bool {
        let Some(i) = self
            .waiting
            .iter()
            .position(|w| w.pending.call_id == elicit_id)
        else {
            return false;
        };
        let _ = self.waiting.remove(i).reply.send(answer);
        true
    }
}

/// Who answers for one call: the turn that runs it, through the session's client.
struct CallElicitor {
    call_id: String,
    tx: mpsc::UnboundedSender<Asked>,
}

impl Elicitor for CallElicitor {
    fn ask(&self, question: Question) -> BoxFuture<'static, Result<Answer, String>> {
        let (reply, answer) = oneshot::channel();
        let asked = Asked {
            call_id: self.call_id.clone(),
            question,
            reply,
        };
        let sent = self.tx.send(asked).is_ok();
        Box::pin(async move {
            if !sent {
                return Err("the turn that made the call has ended".into());
            }
            answer
                .await
                .map_err(|_| "the question was not answered: the session went on without it (a new message, a cancel, or an expiry)".into())
        })
    }
}

/// The input of the elicitation call that carries a question.
pub(crate) fn question_input(asked: &Asked) -> Value {
    json!({
        "server": asked.question.server,
        "toolCallId": asked.call_id,
        "message": asked.question.message,
        "requestedSchema": asked.question.schema,
    })
}

/// The requested schema of a pending elicitation call (`None`: not one).
pub(crate) fn schema_of(p: &Pending) -> Option<&Value> {
    if p.kind != PendingKind::Client {
        return None;
    }
    let o = p.input.as_object()?;
    if !o.contains_key("toolCallId") || !o.contains_key("message") {
        return None;
    }
    o.get("requestedSchema")
}

/// A client's answer to an elicitation call, completed (defaults) and validated against the
/// requested schema; the error names the field.
pub(crate) fn client_answer(
    schema: &Value,
    content: &Value,
    is_error: bool,
) -> Result<Answer, String> {
    if is_error {
        // A client tool that failed cannot answer: the question is cancelled.
        return Ok(Answer::Cancel);
    }
    let answer = crate::tools::mcp::elicit::parse_answer(content)?;
    crate::tools::mcp::elicit::complete(schema, answer)
}

/// After a restart, the calls a turn stopped on that were questions of MCP calls (and those MCP
/// calls, still open in the log) cannot go on: each is marked to be settled with its reason.
pub(crate) fn unresumable(pending: &mut [Pending]) {
    let asking: Vec<String> = pending
        .iter()
        .filter(|p| schema_of(p).is_some())
        .filter_map(|p| p.input.get("toolCallId")?.as_str().map(String::from))
        .collect();
    for p in pending.iter_mut() {
        let text = if schema_of(p).is_some() {
            RESTARTED
        } else if asking.contains(&p.call_id) {
            "Cancelled."
        } else {
            continue;
        };
        p.expired = true;
        p.ended = Some(text.to_string());
    }
}

/// The calls a turn stopped on, read from the log by an instance other than the one whose MCP
/// calls wait on questions (it holds the session's lease), as that one has them: the questions
/// still asked, and the MCP calls that asked them running, not waiting on an answer (undoes
/// [`unresumable`]).
pub(crate) fn still_asked(pending: &mut Vec<Pending>) {
    pending.retain(|p| p.ended.as_deref() != Some("Cancelled."));
    for p in pending.iter_mut() {
        if p.ended.as_deref() == Some(RESTARTED) {
            p.expired = false;
            p.ended = None;
        }
    }
}

/// What the model is sent: the elicitation calls (`tool`) and their results left out; they
/// were a channel to the person, not the model's calls.
pub(crate) fn hide(messages: &mut Vec<Message>, tool: &str) {
    let mut hidden: HashSet<String> = HashSet::new();
    for m in messages.iter_mut() {
        if let Message::Assistant {
            content: Content::Blocks(blocks),
        } = m
        {
            blocks.retain(|b| match b {
                Block::ToolUse {
                    tool_call_id, name, ..
                } if name == tool => {
                    hidden.insert(tool_call_id.clone());
                    false
                }
                _ => true,
            });
        }
    }
    if hidden.is_empty() {
        return;
    }
    messages.retain(|m| match m {
        Message::Assistant {
            content: Content::Blocks(b),
        } => !b.is_empty(),
        Message::Tool { tool_call_id, .. } => !hidden.contains(tool_call_id),
        _ => true,
    });
}

#[cfg(test)]
mod tests;
