//! Progress of a tool call, relayed to whoever made it.
//!
//! A caller that wants a call's progress runs the call inside [`PROGRESS`]`.scope(sender, ..)`;
//! an MCP server's `notifications/progress` for that call then arrive on the sender. Without a
//! scope nothing is relayed (agent turns). A task-local rather than a parameter, so that the
//! [`super::ToolHost`] signature every host implements stays as it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{CallToolRequestParams, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleClient};
use tokio::sync::mpsc::UnboundedSender;

/// One progress report of a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

tokio::task_local! {
    /// Where the progress of the calls made in this scope goes.
    pub static PROGRESS: UnboundedSender<Progress>;
}

/// The sender of the current scope, if any.
pub fn current() -> Option<UnboundedSender<Progress>> {
    PROGRESS.try_with(Clone::clone).ok()
}

/// An MCP connection's calls whose progress is relayed, by their progress token.
pub type Relays = Arc<Mutex<HashMap<ProgressToken, UnboundedSender<Progress>>>>;

/// A server's `notifications/progress`: to the caller of its call, if it is relayed.
pub fn deliver(relays: &Relays, params: ProgressNotificationParam) {
    if let Some(to) = crate::sync::lock(relays).get(&params.progress_token) {
        let _ = to.send(Progress {
            progress: params.progress,
            total: params.total,
            message: params.message,
        });
    }
}

/// `tools/call`, cancelled on the server when dropped (as rmcp's `call_tool` is); in a
/// [`PROGRESS`] scope, the server's progress for it goes there.
pub async fn call_tool(
    peer: &Peer<RoleClient>,
    params: CallToolRequestParams,
    relays: &Relays,
) -> Result<rmcp::model::CallToolResult, rmcp::ServiceError> {
    use rmcp::model::{CallToolRequest, CancelledNotificationParam, ClientRequest, ServerResult};
    let Some(to) = current() else {
        return peer.call_tool(params).await;
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = peer
        .send_request_with_option(request, rmcp::service::PeerRequestOptions::no_options())
        .await?;
    /// Unregisters the relay, and cancels the request unless it was answered.
    struct Guard<'a> {
        peer: Peer<RoleClient>,
        id: Option<rmcp::model::RequestId>,
        token: rmcp::model::ProgressToken,
        relays: &'a Relays,
    }
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            crate::sync::lock(self.relays).remove(&self.token);
            if let Some(id) = self.id.take() {
                let peer = self.peer.clone();
                tokio::spawn(async move {
                    let _ = peer
                        .notify_cancelled(CancelledNotificationParam::new(Some(id), None))
                        .await;
                });
            }
        }
    }
    crate::sync::lock(relays).insert(handle.progress_token.clone(), to);
    let mut guard = Guard {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
        token: handle.progress_token.clone(),
        relays,
    };
    let answer = handle.await_response().await;
    guard.id = None;
    match answer? {
        ServerResult::CallToolResult(r) => Ok(r),
        _ => Err(rmcp::ServiceError::UnexpectedResponse),
    }
}
