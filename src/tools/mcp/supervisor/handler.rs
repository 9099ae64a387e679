//! The client side of one connection: what turnstile tells a server it supports, and how it
//! answers the server's requests: elicitation and sampling (routed to whoever can answer for
//! the call in flight), roots (a session-scoped instance's workspace), progress relayed, tool-list changes.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, Implementation, ProtocolVersion,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, RoleClient};
use rmcp::ClientHandler;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::config::ElicitationMode;
use crate::tools::mcp::elicit::{self, Answer, Asker, Elicitor, Question};
use crate::tools::mcp::sampling::{self, Budget, Sampler};
use crate::tools::relay::Relays;

/// Tells the supervisor a server changed its tool list, and answers the server's requests
/// (elicitation) on behalf of the calls in flight.
pub(super) struct Handler {
    pub(super) changed: mpsc::UnboundedSender<()>,
    pub(super) server: String,
    pub(super) elicitation: ElicitationMode,
    /// `Some` where `[mcp_servers.X] sampling = true`: the capability is declared, and
    /// requests are answered within this budget.
    pub(super) sampling: Option<Budget>,
    pub(super) calls: Calls,
    /// The calls whose progress is relayed (delivered by `ordered.rs`, in the server's order).
    pub(super) relays: Relays,
    /// Resource and prompt notifications, for `/mcp`.
    pub(super) events: super::catalog_events::Events,
    /// A session-scoped instance's root: its session's workspace (`None`: no roots declared).
    pub(super) root: Option<PathBuf>,
    /// Set once the server has asked for the roots.
    pub(super) roots_asked: watch::Sender<bool>,
}

/// The calls in flight on an instance, each with who can answer for it.
pub(super) type Calls = Arc<std::sync::Mutex<Vec<(u64, Asker)>>>;

/// A call registered in [`Calls`] until dropped.
pub(super) struct Registered {
    pub(super) calls: Calls,
    pub(super) id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        crate::sync::lock(&self.calls).retain(|(id, _)| *id != self.id);
    }
}

impl Handler {
    /// Who answers a question now, or why no one can.
    fn answerer(&self) -> Result<(Asker, Arc<dyn Elicitor>), String> {
        if self.elicitation == ElicitationMode::Decline {
            return Err("the server's elicitation = \"decline\"".into());
        }
        let calls = crate::sync::lock(&self.calls);
        let mut sessions: Vec<&Asker> = calls.iter().map(|(_, a)| a).collect();
        sessions.dedup_by(|a, b| a.session_id == b.session_id);
        match sessions.as_slice() {
            [] => Err("no tool call of a session is in flight on this server".into()),
            [one] => match &one.elicitor {
                Some(e) => Ok(((*one).clone(), e.clone())),
                None => Err(format!(
                    "no one can answer for session {} (no AAP client with the agent's elicitation_tool)",
                    one.session_id
                )),
            },
            _ => Err("calls of several sessions are in flight on this shared server: whose question it is cannot be told".into()),
        }
    }

    /// Who answers a sampling request now (the turn, or the `/mcp` client, of the one session
    /// with a call in flight), or why no one can.
    fn sampler(&self) -> Result<Arc<dyn Sampler>, String> {
        let calls = crate::sync::lock(&self.calls);
        let mut sessions: Vec<&Asker> = calls.iter().map(|(_, a)| a).collect();
        sessions.dedup_by(|a, b| a.session_id == b.session_id);
        match sessions.as_slice() {
            [] => Err("no tool call of a turn is in flight on this server".into()),
            [one] => one.sampler.clone().ok_or_else(|| {
                "the call in flight came through /mcp from a client that did not declare the sampling capability"
                    .into()
            }),
            _ => Err("calls of several sessions are in flight on this shared server: whose turn answers cannot be told".into()),
        }
    }

    async fn elicit(&self, request: ElicitRequestParams) -> ElicitResult {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            tracing::info!(server = %self.server, "MCP elicitation declined: URL elicitation is not supported");
            return ElicitResult::new(ElicitationAction::Decline);
        };
        let schema = serde_json::to_value(&requested_schema).unwrap_or(Value::Null);
        let (asker, elicitor) = match self.answerer() {
            Ok(found) => found,
            Err(why) => {
                tracing::info!(server = %self.server, reason = %why, "MCP elicitation declined");
                return ElicitResult::new(ElicitationAction::Decline);
            }
        };
        let question = Question {
            server: self.server.clone(),
            message,
            schema: schema.clone(),
        };
        // The call's timeout does not run while a person answers.
        let pause = asker.paused.begin();
        let answer = elicitor
            .ask(question)
            .await
            .and_then(|a| elicit::complete(&schema, a));
        drop(pause);
        match answer {
            Ok(Answer::Accept(content)) => {
                ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content))
            }
            Ok(Answer::Decline) => ElicitResult::new(ElicitationAction::Decline),
            Ok(Answer::Cancel) => ElicitResult::new(ElicitationAction::Cancel),
            Err(why) => {
                tracing::info!(server = %self.server, session = %asker.session_id, reason = %why, "MCP elicitation declined");
                ElicitResult::new(ElicitationAction::Decline)
            }
        }
    }
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        let _ = self.changed.send(());
        std::future::ready(())
    }

    fn on_resource_list_changed(
        &self,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        let _ = self.events.send(super::CatalogEvent::ResourcesChanged);
        std::future::ready(())
    }

    fn on_prompt_list_changed(
        &self,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        let _ = self.events.send(super::CatalogEvent::PromptsChanged);
        std::future::ready(())
    }

    fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        let _ = self
            .events
            .send(super::CatalogEvent::ResourceUpdated(params.uri));
        std::future::ready(())
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        Ok(self.elicit(request).await)
    }

    // Sampling is deprecated by SEP-2577 (a later protocol); servers of the current ones use it.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        request: rmcp::model::CreateMessageRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let budget = self.sampling.as_ref();
        sampling::answer(&self.server, budget, self.sampler(), request).await
    }

    // Roots are deprecated by SEP-2577 (a later protocol); servers of the current ones use them.
    #[allow(deprecated)]
    async fn list_roots(
        &self,
        _: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, rmcp::ErrorData> {
        self.roots_asked.send_replace(true);
        let roots = self
            .root
            .iter()
            .map(|p| rmcp::model::Root::new(file_uri(p)).with_name("workspace"))
            .collect();
        Ok(rmcp::model::ListRootsResult::new(roots))
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        // The initialize-based protocol: list_changed arrives as a plain notification.
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        let mut caps = ClientCapabilities::default();
        caps.elicitation =
            Some(ElicitationCapability::new().with_form(
                rmcp::model::FormElicitationCapability::new().with_schema_validation(true),
            ));
        #[allow(deprecated)]
        if self.sampling.is_some() {
            caps.sampling = Some(rmcp::model::SamplingCapability::default());
        }
        #[allow(deprecated)]
        if self.root.is_some() {
            // The root of an instance never changes (a new session gets a new instance).
            caps.roots = Some(rmcp::model::RootsCapabilities::default());
        }
        info.capabilities = caps;
        info.client_info = Implementation::new("turnstile", env!("CARGO_PKG_VERSION"));
        info
    }
}

/// `file://` URI of an absolute path (bytes outside the unreserved set percent-encoded).
fn file_uri(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
