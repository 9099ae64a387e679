//! What a federated server asks of its client during a call made through `/mcp` goes to the
//! MCP client that made the call, when it declared the capability: a gateway's client is the
//! one to answer, not the gateway.
//!
//! - An elicitation: the client's answer goes back (with the schema's defaults applied and
//!   validated by [`crate::tools::mcp::elicit`]).
//! - A sampling request (only from servers with `[mcp_servers.X] sampling = true`): relayed
//!   with `maxTokens` capped at `sampling_max_tokens`, at most `sampling_calls_per_turn` per
//!   call (a call through `/mcp` is its own turn); the client's model answers, so turnstile's
//!   upstream is never charged.
//!
//! Either is bounded by the agent's `approval_ttl_s`, since a person may be asked.

// Sampling is deprecated by SEP-2577 (a later protocol); servers of the current ones use it.
#![allow(deprecated)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitationAction, ServerRequest,
};
use rmcp::service::Peer;
use rmcp::RoleServer;

use crate::tools::mcp::elicit::{Answer, Elicitor, Question};
use crate::tools::mcp::sampling::{Budget, Sampler};

/// Asks the `/mcp` client; no answer within `ttl` (the agent's `approval_ttl_s`) declines.
pub(super) struct ClientElicitor {
    pub peer: Peer<RoleServer>,
    pub ttl: Duration,
}

impl Elicitor for ClientElicitor {
    fn ask(&self, q: Question) -> BoxFuture<'static, Result<Answer, String>> {
        let peer = self.peer.clone();
        let ttl = self.ttl;
        Box::pin(async move {
            let schema = serde_json::from_value(q.schema)
                .map_err(|e| format!("the server's requested schema cannot be relayed: {e}"))?;
            let params = ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: q.message,
                requested_schema: schema,
            };
            let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
            let r = match tokio::time::timeout(ttl, peer.send_request(request)).await {
                Err(_) => {
                    return Err(format!(
                        "the client gave no answer within {} s (approval_ttl_s)",
                        ttl.as_secs()
                    ))
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the elicitation failed");
                    let why = crate::tools::mcp::describe_error("the MCP client", &e);
                    return Err(format!("the elicitation failed: {why}"));
                }
                Ok(Ok(ClientResult::ElicitResult(r))) => r,
                Ok(Ok(_)) => return Err("the client's answer was not an elicitation result".into()),
            };
            Ok(match r.action {
                ElicitationAction::Accept => Answer::Accept(match r.content {
                    Some(serde_json::Value::Object(o)) => o,
                    _ => serde_json::Map::new(),
                }),
                ElicitationAction::Cancel => Answer::Cancel,
                _ => Answer::Decline,
            })
        })
    }
}

/// Relays sampling requests to the `/mcp` client, for one call.
pub(super) struct ClientSampler {
    pub peer: Peer<RoleServer>,
    pub ttl: Duration,
    /// Requests relayed so far for this call.
    pub made: AtomicU32,
}

impl Sampler for ClientSampler {
    fn sample<'a>(
        &'a self,
        budget: &'a Budget,
        mut request: CreateMessageRequestParams,
    ) -> BoxFuture<'a, Result<CreateMessageResult, String>> {
        Box::pin(async move {
            let made = self.made.fetch_add(1, Ordering::Relaxed);
            if made >= budget.calls_per_turn {
                return Err(format!(
                    "sampling refused: this call already made {made} sampling requests for {} (limit: [mcp_servers.{}] sampling_calls_per_turn in tools.toml)",
                    budget.server, budget.server
                ));
            }
            request.max_tokens = request.max_tokens.clamp(1, budget.max_tokens.max(1));
            let asked = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(request));
            let answer = tokio::time::timeout(self.ttl, self.peer.send_request(asked)).await;
            let result = match answer {
                Err(_) => {
                    return Err(format!(
                        "sampling failed: the client gave no answer within {} s (approval_ttl_s)",
                        self.ttl.as_secs()
                    ))
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "sampling failed");
                    let why = crate::tools::mcp::describe_error("the MCP client", &e);
                    return Err(format!("sampling failed: {why}"));
                }
                Ok(Ok(ClientResult::CreateMessageResult(r))) => r,
                Ok(Ok(_)) => {
                    return Err("sampling failed: the client's answer was not a message".into())
                }
            };
            crate::metrics::mcp_sampling(&budget.server, "ok", None);
            tracing::info!(
                server = %budget.server,
                model = %result.model,
                "MCP sampling request answered by the /mcp client"
            );
            Ok(*result)
        })
    }
}
