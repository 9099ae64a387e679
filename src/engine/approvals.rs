//! Approvals that cannot hang or be forged: when a paused server call's permission expires,
//! what a grant is bound to, and which answers a follow-up may give.
//!
//! - **Expiry.** A permission is due `approval_ttl_s` after its call was logged (the
//!   `agent.tool_use`'s `created_at`, so a restart changes nothing). Expiry is applied lazily by
//!   every request that takes the session, and on time by a timer per session (armed when a
//!   turn pauses, or when a session with pending permissions is read back). When every call the
//!   session waits on has expired, a short turn of its own settles them in the log:
//!   `user.message` (a `tool_permission` block per call, `granted: false`, `reason: "approval
//!   expired"`, `expired: true`), one `agent.tool_result` per call (`Tool call denied: approval
//!   expired`, `is_error: true`), `turn.completed` (`end_turn`, no usage; the model is not
//!   called: it is told on the next turn, where the denial is in its history like any other).
//!   When other calls are still open (a client tool's result), the expired ones are marked and
//!   denied at the start of the follow-up, which need not answer them.
//! - **Binding.** When a turn pauses on a server call, the session's record keeps the call's
//!   server, tool, argument digest and the verdict and rule that asked (`AskedCall`). A grant
//!   runs the call only if it is still that call under a policy that allows it: a policy that
//!   now denies it turns the grant into a denial (`Tool call denied: the policy now denies <tool>
//!   (rule <rule>)`); one that now trusts or asks lets the grant apply, and the server's log says
//!   the policy changed.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Value};

use super::engine_handle::Inner;
use super::session::Session;
use super::session_record::{AskedCall, Pending, PendingKind, SessionRecord};
use super::session_state::State;
use super::session_tools::{Catalog, Route};
use super::types::Client;
use crate::config::{AgentConfig, Verdict};
use crate::log::{Event, EventBody, SessionRow, StopReason, Store};
use crate::tools::ServerTool;
use crate::{clock, ids};

/// The reason an expired permission is denied with.
pub const EXPIRED_REASON: &str = "approval expired";

/// The result an expired permission's call gets.
pub fn expired_result() -> String {
    format!("Tool call denied: {EXPIRED_REASON}")
}

/// The agent's `approval_ttl_s` (the default when the agent is gone).
fn ttl(inner: &Inner, record: &SessionRecord) -> Duration {
    inner
        .config()
        .agent(&record.agent)
        .map_or(Duration::from_secs(3600), |a| a.approval_ttl)
}

/// SHA-256 (hex) of a call's arguments as logged.
pub fn digest(input: &Value) -> String {
    let bytes = serde_json::to_vec(input).unwrap_or_default();
    let d = ring::digest::digest(&ring::digest::SHA256, &bytes);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Trust => "trust",
        Verdict::Ask => "ask",
        Verdict::Deny => "deny",
    }
}

/// What a server call that pauses for permission is bound to.
pub(crate) fn bind(call_id: &str, name: &str, input: &Value, host: &[ServerTool]) -> AskedCall {
    let tool = host.iter().find(|t| t.spec.name == name);
    AskedCall {
        call_id: call_id.to_string(),
        server: tool.map_or_else(String::new, |t| t.server.clone()),
        tool: tool.map_or_else(String::new, |t| t.tool.clone()),
        input_sha256: digest(input),
        verdict: tool.map_or("ask", |t| verdict_name(t.verdict)).to_string(),
        rule: tool.map_or_else(|| "default".to_string(), |t| t.rule.clone()),
    }
}

/// Set each permission's deadline from when it was asked, and mark those past it (`now_ms`).
/// Once expired, a call stays expired. The earliest deadline still ahead, if any.
pub(crate) fn stamp(pending: &mut [Pending], ttl: Duration, now_ms: i64) -> Option<i64> {
    let mut next: Option<i64> = None;
    // A question of an MCP server (an elicitation call) is bounded by the same ttl.
    for p in pending.iter_mut().filter(|p| {
        p.kind == PendingKind::Permission || super::client_questions::schema_of(p).is_some()
    }) {
        let Some(asked) = clock::parse_ms(&p.asked_at) else {
            continue;
        };
        let due = asked.saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64);
        p.expires_at = Some(clock::format_ms(due));
        p.expired |= due <= now_ms;
        if !p.expired {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
    }
    next
}

/// A turn paused on `pending`: stamp the permissions' deadlines, and keep what each server call
/// is bound to in the session's record (written with the turn's last events).
pub(crate) fn paused(
    inner: &Inner,
    session: &Session,
    st: &mut State,
    pending: &mut [Pending],
    asked: Vec<AskedCall>,
) {
    stamp(pending, ttl(inner, st.record()), clock::now_ms());
    if asked.is_empty() && st.record().asked.is_empty() {
        return;
    }
    let mut record = st.record().as_ref().clone();
    record.asked = asked;
    st.set_record(record);
    write_record(session, st, &inner.store);
}

/// Queue the session's row (its record) for the store.
fn write_record(session: &Session, st: &mut State, store: &Store) {
    let ticket = store.put_session(SessionRow {
        id: session.id.to_string(),
        owner: session.owner.clone(),
        created_at: session.created_at.clone(),
        record: serde_json::to_string(st.record()).unwrap_or_default(),
    });
    st.record_stored(ticket);
}

/// Apply expiry to a session (lazily, on every request that takes it, and from its timer):
/// see the module's doc. Arms the timer for the next deadline.
///
/// On a shared store only the holder of the session's lease writes its log: calls to settle
/// there take the lease first (when no other instance holds it; one that does settles them
/// itself, and its MCP calls waiting on questions are alive there, whatever the log says).
pub(crate) async fn settle(inner: &Arc<Inner>, session: &Arc<Session>) {
    settle_as_of(inner, session, clock::now_ms).await;
}

/// [`settle`] as if it were `now_ms()`.
pub(crate) async fn settle_as_of(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
    now_ms: impl Fn() -> i64,
) {
    settle_at(inner, session, now_ms());
    if !settles_with_lease(inner, session) {
        return;
    }
    let Ok(claim) = super::scaleout::claim(inner, session).await else {
        return;
    };
    // (Read back with the lease: stamped again.)
    settle_at(inner, session, now_ms());
    drop(claim);
    super::scaleout::release_when_idle(inner, session).await;
}

/// Whether this instance may write the session's log now: the embedded store, or it holds the
/// session's lease.
fn may_write(inner: &Inner, session: &Session) -> bool {
    inner.store.instance().is_none() || inner.store.lease_mark(&session.id).is_some()
}

/// Whether the session has calls to settle that only the lease's holder may write.
fn settles_with_lease(inner: &Inner, session: &Session) -> bool {
    if may_write(inner, session) {
        return false;
    }
    let st = session.lock();
    let pending = st.pending();
    !pending.is_empty() && pending.iter().all(|p| p.expired) && st.turns().running().is_none()
}

/// [`settle`] as if it were `now_ms`.
pub(crate) fn settle_at(inner: &Arc<Inner>, session: &Arc<Session>, now_ms: i64) {
    let next = {
        let mut st = session.lock();
        if st.pending().is_empty() {
            return;
        }
        settle_locked(inner, session, &mut st, now_ms)
    };
    if let Some(due) = next {
        arm(inner, session, due);
    }
}

/// [`settle`] with the session's lock held; the next deadline, for the timer.
pub(crate) fn settle_locked(
    inner: &Inner,
    session: &Session,
    st: &mut State,
    now_ms: i64,
) -> Option<i64> {
    if st.is_deleted() || st.pending().is_empty() {
        return None;
    }
    let ttl = ttl(inner, st.record());
    // Taken to be stamped; put back unless they are settled here.
    let mut calls = st.take_pending();
    let next = stamp(&mut calls, ttl, now_ms);
    let all_expired = calls.iter().all(|p| p.expired);
    // A turn that runs (or one the log still has open) goes first; it answers the calls.
    let open_in_log = st.out().tail.last().is_some_and(|e| !e.body.is_terminal());
    if !all_expired || st.turns().running().is_some() || open_in_log {
        st.wait_on_calls(calls);
        return next;
    }
    if !may_write(inner, session) {
        st.wait_on_calls(calls);
        return None;
    }
    let turn_id = ids::new("turn");
    let blocks: Vec<Value> = calls.iter().map(expired_block).collect();
    // MCP calls that waited on expired questions are cut short (see `engine/client_questions.rs`).
    let cut: Vec<String> = st
        .take_flight()
        .map(|f| f.running.clone())
        .unwrap_or_default();
    let store = &inner.store;
    let mut bodies = vec![EventBody::UserMessage {
        content: Value::Array(blocks),
        files: vec![],
        skills: vec![],
    }];
    let results = calls.iter().map(|p| (p.call_id.clone(), settled_result(p)));
    let cut_short = cut.iter().map(|id| (id.clone(), "Cancelled.".to_string()));
    bodies.extend(
        results
            .chain(cut_short)
            .map(|(tool_use_id, text)| EventBody::ToolResult {
                tool_use_id,
                content: Value::String(text),
                is_error: true,
                files: vec![],
            }),
    );
    bodies.push(EventBody::TurnCompleted {
        usage: None,
        stop_reason: StopReason::EndTurn,
    });
    for body in bodies {
        session.append_locked(st, store, &turn_id, body);
    }
    // Rare: committed here, under the session's lock, so that nothing comes between.
    if let Err(e) = store.commit() {
        tracing::error!(session = %session.id, error = %e, "expired permissions could not be logged");
    }
    let published: Vec<Arc<Event>> = session.publish_durable_locked(st, store);
    let ids: Vec<&str> = calls.iter().map(|p| p.call_id.as_str()).collect();
    let ended: Vec<String> = calls.iter().filter_map(|p| p.ended.clone()).collect();
    tracing::info!(session = %session.id, turn = %turn_id, calls = ?ids, ttl_s = ttl.as_secs(), events = published.len(),
        cut_short = ?cut, ended = ?ended,
        "pending calls settled: permissions and questions expired (approval_ttl_s), questions asked before a restart ended");
    None
}

/// The `user.message` block that settles a call no one answered: a denied permission, or a
/// tool result for a question of an MCP server (and its call) that expired or cannot go on.
fn expired_block(p: &Pending) -> Value {
    if p.ended.is_some() || super::client_questions::schema_of(p).is_some() {
        return json!({"type": "tool_result", "tool_use_id": p.call_id,
                      "content": settled_result(p), "is_error": true});
    }
    json!({"type": "tool_permission", "tool_use_id": p.call_id, "granted": false,
           "reason": EXPIRED_REASON, "expired": true})
}

/// The result a call settled without an answer gets.
fn settled_result(p: &Pending) -> String {
    match &p.ended {
        Some(text) => text.clone(),
        None if super::client_questions::schema_of(p).is_some() => {
            super::client_questions::EXPIRED.to_string()
        }
        None => expired_result(),
    }
}

/// Wake at `due` (ms since the epoch) to settle the session, unless a timer already wakes by then.
fn arm(inner: &Arc<Inner>, session: &Arc<Session>, due: i64) {
    let mut st = session.lock();
    if let Some((at, handle)) = &st.waits().timer {
        if *at <= due && !handle.is_finished() {
            return;
        }
        handle.abort();
    }
    // Weak: a timer keeps neither the engine nor the session alive (an evicted session is
    // settled when it is next read back).
    let (weak_inner, weak_session): (Weak<Inner>, Weak<Session>) =
        (Arc::downgrade(inner), Arc::downgrade(session));
    let wait = Duration::from_millis((due - clock::now_ms()).max(0) as u64 + 1);
    let task = tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        let (Some(inner), Some(session)) = (weak_inner.upgrade(), weak_session.upgrade()) else {
            return;
        };
        session.lock().timer_fired();
        settle(&inner, &session).await;
    });
    st.arm_timer(due, task.abort_handle());
}

/// How a grant is decided when it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Regrant {
    /// Run the call.
    Run,
    /// Do not: the call gets this error result.
    Refuse(String),
}

/// Re-decide a granted call under the policy and tools of now, against what it was bound to
/// when it asked (`asked`; `None` for a call paused before bindings were kept).
pub(crate) fn regrant(
    agent: &AgentConfig,
    host: &[ServerTool],
    record: &SessionRecord,
    p: &Pending,
    session_id: &str,
) -> Regrant {
    let name = &p.name;
    let asked = record.asked.iter().find(|a| a.call_id == p.call_id);
    let now = host.iter().find(|t| t.spec.name == *name);
    if let Some(tool) = now.filter(|t| t.verdict == Verdict::Deny) {
        tracing::info!(session = %session_id, call = %p.call_id, tool = %name, rule = %tool.rule,
            "a granted call is denied: the policy now denies it");
        return Regrant::Refuse(format!(
            "Tool call denied: the policy now denies {name} (rule {})",
            tool.rule
        ));
    }
    if let (Some(asked), Some(tool)) = (asked, now) {
        if asked.input_sha256 != digest(&p.input) {
            return Regrant::Refuse(
                "Tool call denied: its arguments are not those that asked for permission".into(),
            );
        }
        if !asked.server.is_empty() && (asked.server != tool.server || asked.tool != tool.tool) {
            return Regrant::Refuse(format!(
                "Tool call denied: {name} is now tool {} of server {}, not tool {} of server {} that asked for permission",
                tool.tool, tool.server, asked.tool, asked.server
            ));
        }
        let verdict = verdict_name(tool.verdict);
        if asked.verdict != verdict || asked.rule != tool.rule {
            tracing::info!(session = %session_id, call = %p.call_id, tool = %name,
                asked = %format!("{} (rule {})", asked.verdict, asked.rule),
                now = %format!("{verdict} (rule {})", tool.rule),
                "the policy changed since the call asked for permission; re-decided: the client's grant applies");
        }
    }
    match Catalog::new(agent, host, record, Client::Attends).route_granted(name) {
        Route::Refuse(msg) => Regrant::Refuse(msg),
        _ => Regrant::Run,
    }
}

#[cfg(test)]
mod tests;
