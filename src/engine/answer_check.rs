//! Which answers a follow-up may give: one per call the session waits on, with the role that
//! call needs (a client tool's result, a server call's permission), and none for calls that are
//! not, or no longer, pending.

use std::collections::HashMap;

use super::approvals::expired_result;
use super::session_record::{Pending, PendingKind};
use super::types::{ClientResult, EngineError, Permission, TurnInput};
use crate::message::{Content, Message};

/// Check a turn's input against the calls the session waits on; the calls it answers.
/// `history`: the session's history, read only to name settled calls in an error.
///
/// 400 when the request is malformed or incomplete (a call answered twice or with the wrong
/// role, a pending call left unanswered); 409 when it is complete but names calls that are not,
/// or no longer, pending (unknown, settled, or expired). Either way the message names what is
/// still outstanding.
pub(crate) fn check_answers(
    pending: &[Pending],
    input: &TurnInput,
    history: &dyn Fn() -> Vec<Message>,
) -> Result<Vec<Pending>, EngineError> {
    let live = || pending.iter().filter(|p| !p.expired);
    let ids = |kind: PendingKind| -> Vec<&str> {
        pending
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.call_id.as_str())
            .collect()
    };
    let (results, permissions) = match input {
        // (Expired calls are settled before this is asked, unless a turn is open.)
        TurnInput::User { .. } if !pending.is_empty() => {
            return Err(EngineError::Conflict(format!(
                "the session waits for tool results ({}) and permissions ({}); send them all in one request as role \"tool\" and \"tool_permission\" messages before a new user message",
                ids(PendingKind::Client).join(", "),
                ids(PendingKind::Permission).join(", ")
            )))
        }
        TurnInput::User { .. } => return Ok(Vec::new()),
        TurnInput::Resume {
            results,
            permissions,
        } => (results, permissions),
    };
    let (answered, mut malformed, stale) = classify(pending, results, permissions);
    let missing: Vec<&str> = live()
        .filter(|p| !answered.contains_key(p.call_id.as_str()))
        .map(|p| p.call_id.as_str())
        .collect();
    if !missing.is_empty() {
        malformed.push(format!(
            "missing answers for toolCallId {}: every pending call needs its result or permission in this one request",
            missing.join(", ")
        ));
    }
    if malformed.is_empty() && stale.is_empty() {
        return Ok(pending.to_vec());
    }
    Err(refusal(pending, &stale, &malformed, history))
}

/// Each answer checked against the call it names: the calls answered (with the role that
/// answered), what is malformed (answered twice, with the wrong role), and the stale ids (not,
/// or no longer, pending: unknown, settled, or expired and granted).
fn classify<'a>(
    pending: &[Pending],
    results: &'a [ClientResult],
    permissions: &'a [Permission],
) -> (HashMap<&'a str, &'static str>, Vec<String>, Vec<&'a str>) {
    let mut answered = HashMap::new();
    let mut malformed = Vec::new();
    let mut stale = Vec::new();
    let answers = results
        .iter()
        .map(|r| (r.call_id.as_str(), None, Some(r)))
        .chain(
            permissions
                .iter()
                .map(|p| (p.call_id.as_str(), Some(p), None)),
        );
    for (id, perm, result) in answers {
        let role = if perm.is_some() {
            "tool_permission"
        } else {
            "tool"
        };
        if answered.insert(id, role).is_some() {
            malformed.push(format!("toolCallId {id} is answered twice"));
            continue;
        }
        match pending.iter().find(|p| p.call_id == id) {
            None => stale.push(id),
            Some(p) if p.ended.is_some() => stale.push(id),
            Some(p) if p.kind == PendingKind::Client && perm.is_some() => malformed.push(format!(
                "toolCallId {id} is client tool {}: answer it with a role \"tool\" message carrying its result",
                p.name
            )),
            Some(p) if p.kind == PendingKind::Permission && perm.is_none() => malformed.push(format!(
                "toolCallId {id} is server tool {}: answer it with a role \"tool_permission\" message (granted true or false)",
                p.name
            )),
            Some(p) if p.expired && perm.is_some_and(|g: &Permission| g.granted) => {
                stale.push(id);
            }
            Some(p) => {
                if let (Some(r), Some(schema)) = (result, super::client_questions::schema_of(p)) {
                    // An answer to an MCP server's question must fit the requested schema.
                    if let Err(why) = super::client_questions::client_answer(schema, &r.content, r.is_error) {
                        let server = p.input.get("server").and_then(|s| s.as_str());
                        malformed.push(format!(
                            "toolCallId {id} answers a question of MCP server {}: {why}",
                            server.unwrap_or("?")
                        ));
                    }
                }
            }
        }
    }
    (answered, malformed, stale)
}

/// The error for answers that do not fit what the session waits on: a conflict (409) when
/// only stale calls are named, else invalid (400); the message names what is outstanding.
fn refusal(
    pending: &[Pending],
    stale: &[&str],
    malformed: &[String],
    history: &dyn Fn() -> Vec<Message>,
) -> EngineError {
    let live = || pending.iter().filter(|p| !p.expired);
    let mut errors: Vec<String> = stale
        .iter()
        .map(|id| stale_call(pending, id, history))
        .collect();
    errors.extend(malformed.iter().cloned());
    let outstanding: Vec<String> = live()
        .map(|p| {
            let what = match p.kind {
                PendingKind::Client => "client tool, answer with role \"tool\"",
                PendingKind::Permission => "server tool, answer with role \"tool_permission\"",
            };
            format!("{} ({}: {what})", p.call_id, p.name)
        })
        .collect();
    let outstanding = if outstanding.is_empty() {
        "no tool calls are pending in this session: send a user message instead".to_string()
    } else {
        format!("still outstanding: {}", outstanding.join(", "))
    };
    let message = format!("{}; {outstanding}", errors.join("; "));
    if malformed.is_empty() {
        EngineError::Conflict(message)
    } else {
        EngineError::Invalid(message)
    }
}

/// Why `id` cannot be answered: it expired, was settled already, or was never a call here.
fn stale_call(pending: &[Pending], id: &str, history: &dyn Fn() -> Vec<Message>) -> String {
    if let Some(p) = pending
        .iter()
        .find(|p| p.call_id == id && p.ended.is_some())
    {
        return format!(
            "toolCallId {id} ({}) was a question of an MCP server asked before the server restarted: it cannot be answered now (its call was ended)",
            p.name
        );
    }
    if let Some(p) = pending.iter().find(|p| p.call_id == id && p.expired) {
        return format!(
            "toolCallId {id} ({}) has expired: its permission was not given within [agents] approval_ttl_s (by {}), so it is denied (approval expired); ask the model to call it again",
            p.name,
            p.expires_at.as_deref().unwrap_or("its deadline")
        );
    }
    let settled = history().into_iter().find_map(|m| match m {
        Message::Tool {
            tool_call_id,
            content,
        } if tool_call_id == id => Some(content),
        _ => None,
    });
    match settled {
        Some(Content::Text(t)) if t == expired_result() => format!(
            "toolCallId {id} has expired: its permission was not given within [agents] approval_ttl_s, so it was denied (approval expired); ask the model to call it again"
        ),
        Some(Content::Text(t)) if t == super::client_questions::RESTARTED => format!(
            "toolCallId {id} was a question of an MCP server asked before the server restarted: it was declined then, and the call that asked was ended"
        ),
        Some(Content::Text(t)) if t == super::client_questions::EXPIRED => format!(
            "toolCallId {id} was a question of an MCP server not answered within [agents] approval_ttl_s: it was declined, and the call that asked was ended"
        ),
        Some(_) => format!("toolCallId {id} is already settled: it has its result"),
        None => format!("toolCallId {id} is not a call of this session"),
    }
}
