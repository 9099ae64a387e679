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
///
/// rmcp picks a request's progress token as it sends the request, so a call can only be
/// registered once the request is on its way; a server that reports progress at once can be
/// heard before that. What arrives for a token no one has registered is kept (the newest
/// [`EARLY_KEPT`] reports) and handed over when its call registers.
#[derive(Clone, Default)]
pub struct Relays(Arc<Mutex<Waiting>>);

/// How many reports for tokens not (yet) registered are kept.
const EARLY_KEPT: usize = 64;

#[derive(Default)]
struct Waiting {
    calls: HashMap<ProgressToken, UnboundedSender<Progress>>,
    /// Reports heard before their call registered, oldest first (most are for calls whose
    /// progress no one relays, and age out).
    early: std::collections::VecDeque<(ProgressToken, Progress)>,
}

impl Relays {
    /// A server's `notifications/progress`: to the caller of its call, or kept for it.
    pub fn deliver(&self, params: ProgressNotificationParam) {
        let progress = Progress {
            progress: params.progress,
            total: params.total,
            message: params.message,
        };
        let mut waiting = crate::sync::lock(&self.0);
        match waiting.calls.get(&params.progress_token) {
            Some(to) => {
                let _ = to.send(progress);
            }
            None => {
                if waiting.early.len() == EARLY_KEPT {
                    waiting.early.pop_front();
                }
                waiting.early.push_back((params.progress_token, progress));
            }
        }
    }

    /// From now on the progress for `token` goes to `to`, starting with what was heard early.
    fn register(&self, token: ProgressToken, to: UnboundedSender<Progress>) {
        let mut waiting = crate::sync::lock(&self.0);
        waiting.early.retain(|(t, p)| {
            if *t == token {
                let _ = to.send(p.clone());
                return false;
            }
            true
        });
        waiting.calls.insert(token, to);
    }

    fn unregister(&self, token: &ProgressToken) {
        crate::sync::lock(&self.0).calls.remove(token);
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
            self.relays.unregister(&self.token);
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
    relays.register(handle.progress_token.clone(), to);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(token: &str, progress: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(
            ProgressToken(rmcp::model::NumberOrString::String(token.into())),
            progress,
        )
    }

    #[test]
    fn progress_heard_before_its_call_registers_reaches_the_call_first_and_in_order() {
        let relays = Relays::default();
        relays.deliver(report("a", 1.0));
        relays.deliver(report("b", 9.0));
        relays.deliver(report("a", 2.0));
        let (to, mut from) = tokio::sync::mpsc::unbounded_channel();
        relays.register(
            ProgressToken(rmcp::model::NumberOrString::String("a".into())),
            to,
        );
        relays.deliver(report("a", 3.0));
        let mut seen = Vec::new();
        while let Ok(p) = from.try_recv() {
            seen.push(p.progress);
        }
        assert_eq!(seen, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn progress_no_one_registers_for_is_kept_only_up_to_a_bound() {
        let relays = Relays::default();
        for i in 0..(EARLY_KEPT + 10) {
            relays.deliver(report(&format!("t{i}"), i as f64));
        }
        assert_eq!(crate::sync::lock(&relays.0).early.len(), EARLY_KEPT);
        let (to, mut from) = tokio::sync::mpsc::unbounded_channel();
        relays.register(
            ProgressToken(rmcp::model::NumberOrString::String("t0".into())),
            to,
        );
        assert!(from.try_recv().is_err(), "the oldest report aged out");
    }
}
