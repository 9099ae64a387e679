//! A federated server's elicitation during a call made through `/mcp` goes to the MCP client
//! that made the call, when it declared the elicitation capability: its answer goes back (with
//! the schema's defaults applied and validated by [`crate::tools::mcp::elicit`]).

use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{
    ClientResult, ElicitRequest, ElicitRequestParams, ElicitationAction, ServerRequest,
};
use rmcp::service::Peer;
use rmcp::RoleServer;

use crate::tools::mcp::elicit::{Answer, Elicitor, Question};

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
                Ok(Err(e)) => return Err(format!("the elicitation failed: {e}")),
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
