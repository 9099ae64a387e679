//! `ask`: the policy's question to the calling client, as an MCP elicitation. Accept grants;
//! decline or cancel refuse, with the client's reason when it gave one; a client that did not
//! declare the elicitation capability cannot be asked, so it is refused naming the rule.

use std::time::Duration;

use rmcp::model::{
    ClientResult, ElicitRequest, ElicitRequestParams, ElicitationAction, ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Value};

/// What is asked about.
pub(super) struct Subject {
    /// What it is, for a refusal: "Tool mcp__ex__add", "Resource turnstile://ex/…".
    pub what: String,
    /// The question shown to the user, without the rule: "Allow the tool … to run with …?"
    pub question: String,
    /// How a refusal starts: "Tool call denied".
    pub denied: &'static str,
    /// The `ask` rule that decided it.
    pub rule: String,
}

/// Whether the calling client declared the elicitation capability.
pub(super) fn can_elicit(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.peer
        .peer_info()
        .is_some_and(|i| i.capabilities.elicitation.is_some())
}

/// Ask the client; `None` when granted, else why not. No answer within `ttl` refuses.
pub(super) async fn ask(
    subject: &Subject,
    ttl: Duration,
    ctx: &RequestContext<RoleServer>,
) -> Option<String> {
    if !can_elicit(ctx) {
        return Some(format!(
            "{} needs permission (policy rule ask = {:?}) and this MCP client did not declare the elicitation capability, so none can be asked; use a client that supports elicitation, or have the operator trust it.",
            subject.what, subject.rule
        ));
    }
    let denied = subject.denied;
    let schema = serde_json::from_value(json!({
        "type": "object",
        "properties": {"reason": {"type": "string", "description": "Why (optional)"}},
    }))
    .ok()?;
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "{} (policy rule ask = {:?})",
            subject.question, subject.rule
        ),
        requested_schema: schema,
    };
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
    let result = match tokio::time::timeout(ttl, ctx.peer.send_request(request)).await {
        Err(_) => return Some(format!("{denied}: approval expired")),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the elicitation failed");
            let why = crate::tools::mcp::describe_error("the MCP client", &e);
            return Some(format!("{denied}: the elicitation failed ({why})"));
        }
        Ok(Ok(ClientResult::ElicitResult(r))) => r,
        Ok(Ok(_)) => {
            return Some(format!(
                "{denied}: the client's answer was not an elicitation result"
            ))
        }
    };
    let reason = result
        .content
        .as_ref()
        .and_then(|c| c.get("reason"))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    match result.action {
        ElicitationAction::Accept => None,
        _ => Some(match reason {
            Some(r) => format!("{denied}: {r}"),
            None => denied.to_string(),
        }),
    }
}
