//! A session's state read from its log: its history, next seq, last turn, the calls it waits
//! on, the plan it waits on and where its run started. Used when a session is loaded, and when
//! it is read back after a failed commit.

use std::sync::Arc;

use super::history::Projector;
use super::session_record::{Pending, PendingKind, PlanDecision, SessionRecord};
use crate::log::{Event, EventBody, StopReason};

/// A proposed plan waiting for the client's decision (runs API plan mode): the plan turn has
/// ended (or is ending) with it, and the decision starts the next turn. Rebuilt from the log
/// (a turn that completed with a plan as its last message) after a restart.
#[derive(Debug)]
pub(crate) struct PlanWait {
    pub(crate) plan: String,
}

/// The calls of an earlier turn that `turn_id`'s `user.message` answers (a permission, a client
/// tool's result) with no `agent.tool_result` of `turn_id` for them yet: a turn cut off before
/// it wrote them must still answer them, or the history holds calls without their answers.
pub(crate) fn carried_calls(events: &[Arc<Event>], turn_id: &str) -> Vec<String> {
    let mut carried: Vec<String> = Vec::new();
    for ev in events.iter().filter(|e| e.turn_id == turn_id) {
        match &ev.body {
            EventBody::UserMessage { content, .. } => {
                let blocks = content.as_array().into_iter().flatten();
                carried.extend(
                    blocks
                        .filter(|b| {
                            matches!(b["type"].as_str(), Some("tool_permission" | "tool_result"))
                        })
                        .filter_map(|b| b["tool_use_id"].as_str().map(str::to_string)),
                );
            }
            EventBody::ToolResult { tool_use_id, .. } => carried.retain(|i| i != tool_use_id),
            _ => {}
        }
    }
    carried
}

/// The tool calls of a history that have no result (in the order they were made): those of a
/// turn cut off, and those of the turn before that a new message went on past.
pub(crate) fn unanswered_calls(history: &[crate::message::Message]) -> Vec<String> {
    use crate::message::{Block, Content, Message};
    let mut calls: Vec<String> = Vec::new();
    for m in history {
        match m {
            Message::Assistant {
                content: Content::Blocks(blocks),
            } => calls.extend(blocks.iter().filter_map(|b| match b {
                Block::ToolUse { tool_call_id, .. } => Some(tool_call_id.clone()),
                _ => None,
            })),
            Message::Tool { tool_call_id, .. } => calls.retain(|c| c != tool_call_id),
            _ => {}
        }
    }
    calls
}

/// The tool uses of `turn_id` among `events` that have no result.
pub(crate) fn open_calls(events: &[Arc<Event>], turn_id: &str) -> Vec<String> {
    let mut open = Vec::new();
    for ev in events.iter().filter(|e| e.turn_id == turn_id) {
        match &ev.body {
            EventBody::ToolUse { tool_use_id, .. } => open.push(tool_use_id.clone()),
            EventBody::ToolResult { tool_use_id, .. } => open.retain(|i| i != tool_use_id),
            _ => {}
        }
    }
    open
}

/// A session's row and events as read from the log.
pub(crate) struct LogCopy {
    pub(crate) row: Option<crate::log::SessionRow>,
    pub(crate) events: Vec<Event>,
}

/// What a session's log gives its state in memory.
pub(crate) struct Logged {
    pub(crate) history: Projector,
    pub(crate) next_seq: u64,
    /// The last turn's events.
    pub(crate) tail: Vec<Arc<Event>>,
    pub(crate) pending: Vec<Pending>,
    pub(crate) plan: Option<PlanWait>,
    pub(crate) run_start: u64,
}

/// Whether an event starts a run (a `user.message` that is not a plan decision).
pub(crate) fn starts_run(body: &EventBody) -> bool {
    matches!(body, EventBody::UserMessage { content, .. } if PlanDecision::of_content(content).is_none())
}

/// The plan a turn ended on: its last message, when it is a plan and the turn completed.
fn waiting_plan(turn: &[Arc<Event>]) -> Option<PlanWait> {
    if !matches!(
        turn.last().map(|e| &e.body),
        Some(EventBody::TurnCompleted { .. })
    ) {
        return None;
    }
    turn.iter().rev().find_map(|e| match &e.body {
        EventBody::AgentMessage {
            content,
            plan,
            compaction: false,
            ..
        } if !content.is_empty() => Some(plan.then(|| PlanWait {
            plan: content.clone(),
        })),
        _ => None,
    })?
}

impl Logged {
    pub(crate) fn read(record: &SessionRecord, events: Vec<Event>) -> Logged {
        let mut history = Projector::with_seed(&record.seed);
        let mut next_seq = 0;
        let mut tail: Vec<Arc<Event>> = Vec::new();
        // The last turn that ran: a queued turn cancelled before it started (its `user.message`
        // then `turn.cancelled`) leaves the calls of the turn before it open, as they stay open
        // in memory. (A waiting plan does not survive it: accepting any turn ends the wait.)
        let mut ran: Vec<Arc<Event>> = Vec::new();
        let mut run_start = 0;
        for ev in events {
            history.apply_event(&ev);
            next_seq = ev.seq;
            if starts_run(&ev.body) {
                run_start = ev.seq;
            }
            if matches!(ev.body, EventBody::UserMessage { .. }) {
                let last = std::mem::take(&mut tail);
                if !never_ran(&last) {
                    ran = last;
                }
            }
            tail.push(Arc::new(ev));
        }
        let open = if never_ran(&tail) { &ran } else { &tail };
        let pending = pending_calls(open, record);
        let plan = waiting_plan(&tail);
        Logged {
            history,
            next_seq,
            tail,
            pending,
            plan,
            run_start,
        }
    }
}

/// Whether a turn is one cancelled while it was queued: its `user.message` and `turn.cancelled`,
/// nothing between (a turn that started answers the calls left open first).
fn never_ran(turn: &[Arc<Event>]) -> bool {
    matches!(
        turn,
        [first, last] if matches!(first.body, EventBody::UserMessage { .. })
            && matches!(last.body, EventBody::TurnCancelled { .. })
    )
}

/// The calls a turn stopped on: its `agent.tool_use`s without a result, when it completed with
/// `stop_reason: tool_use`.
fn pending_calls(turn: &[Arc<Event>], record: &SessionRecord) -> Vec<Pending> {
    let stopped_on_tools = matches!(
        turn.last().map(|e| &e.body),
        Some(EventBody::TurnCompleted {
            stop_reason: StopReason::ToolUse,
            ..
        })
    );
    if !stopped_on_tools {
        return Vec::new();
    }
    let mut out: Vec<Pending> = Vec::new();
    for ev in turn {
        match &ev.body {
            EventBody::ToolUse {
                tool_use_id,
                name,
                input,
            } => out.push(Pending {
                call_id: tool_use_id.clone(),
                name: name.clone(),
                input: input.clone(),
                kind: if record.client_tools.iter().any(|t| &t.name == name) {
                    PendingKind::Client
                } else {
                    PendingKind::Permission
                },
                asked_at: ev.created_at.clone(),
                expires_at: None,
                expired: false,
                ended: None,
            }),
            EventBody::ToolResult { tool_use_id, .. } => out.retain(|p| &p.call_id != tool_use_id),
            _ => {}
        }
    }
    // A question of an MCP server waited in memory with its call: neither survives a restart.
    super::client_questions::unresumable(&mut out);
    out
}
