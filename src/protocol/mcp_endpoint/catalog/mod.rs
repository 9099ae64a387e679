//! What `/mcp` passes through of the federated servers besides their tools: resources,
//! resource templates, prompts, completions and resource subscriptions, read-only, from the
//! shared servers that are up and declared them (a session-scoped server's instances start per
//! session for its tool calls; theirs are not passed through).
//!
//! Names round-trip to their server: a prompt is `<server>/<prompt>` (a server name has no
//! `/`), a resource `turnstile://<server>/<uri>` (the server's own URI or URI template after the
//! first `/` past the server, so that it stays an absolute URI; its name is `<server>/<name>`).
//! With `[mcp_endpoint] names = "own"` a prompt, resource or template is listed by its server's
//! own name or URI where no other server lists the same one. A URI without the prefix (as a
//! tool result's link or a prompt's embedded resource carries it) goes to the one server that
//! lists it, else the one with a template matching it, else the only server with resources. A
//! URI comes back in the form the client sent it.
//!
//! The policy judges each by `mcp__<server>__<uri>` or `mcp__<server>__<prompt>` (see
//! [`policy::resource_name`]), the agent's `tools` globs apply to the same names: `deny` hides
//! and refuses, `ask` asks the client (elicitation, as for tools) before a read or a prompt;
//! listing, completing and subscribing (which give no content) need no approval.

mod prompts;
mod resources;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CompleteRequestParams, CompleteResult, PromptReference, Reference, ResourceTemplateReference,
    ResourceUpdatedNotificationParam, ServerCapabilities,
};
use rmcp::service::{Peer, RequestContext, RoleClient};
use rmcp::{ErrorData, RoleServer, ServiceError};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::ask::{self, Subject};
use super::gate::Gate;
use crate::config::Verdict;
use crate::tools::mcp::policy::{self, Decision};
use crate::tools::mcp::supervisor::CatalogEvent;

/// The resources one session subscribed to: (server, the server's URI) → the URI as the client
/// gave it.
pub type Subscribed = Arc<Mutex<HashMap<(String, String), String>>>;

/// A shared server that is up: its connection, `timeout_s` and declared capabilities.
#[derive(Clone)]
struct Child {
    server: String,
    peer: Peer<RoleClient>,
    timeout: Duration,
    caps: ServerCapabilities,
}

/// A request to a child, bounded by its `timeout_s`; the child's own JSON-RPC error passes
/// through.
async fn within<T>(
    child: &Child,
    what: &str,
    request: impl Future<Output = Result<T, ServiceError>>,
) -> Result<T, ErrorData> {
    match tokio::time::timeout(child.timeout, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(ServiceError::McpError(e))) => Err(e),
        Ok(Err(e)) => Err(ErrorData::internal_error(
            format!("MCP server {} failed {what}: {e}", child.server),
            None,
        )),
        Err(_) => Err(ErrorData::internal_error(
            format!(
                "MCP server {} did not answer {what} within {} s (its timeout_s)",
                child.server,
                child.timeout.as_secs()
            ),
            None,
        )),
    }
}

fn log(server: &str, what: &str, name: &str, d: &Decision, outcome: &str, started: Instant) {
    tracing::info!(
        server,
        name,
        verdict = %crate::telemetry::snake(&d.verdict),
        outcome,
        duration_ms = started.elapsed().as_millis() as u64,
        "mcp endpoint {what}"
    );
}

/// A child's list, or none when it failed (logged, unless the child does not serve the method).
fn or_none<T>(child: &Child, what: &str, listed: Result<Vec<T>, ErrorData>) -> Vec<T> {
    listed.unwrap_or_else(|e| {
        if e.code != rmcp::model::ErrorCode::METHOD_NOT_FOUND {
            tracing::warn!(server = %child.server, error = %e.message, "{what} failed");
        }
        Vec::new()
    })
}

fn outcome<T>(r: &Result<T, ErrorData>) -> &'static str {
    if r.is_ok() {
        "ok"
    } else {
        "error"
    }
}

impl Gate {
    /// The shared servers that are up and pass `wanted`, in config order.
    fn children(&self, wanted: impl Fn(&ServerCapabilities) -> bool) -> Vec<Child> {
        let Some(mcp) = self.host.mcp_host() else {
            return Vec::new();
        };
        mcp.shared_servers()
            .iter()
            .filter_map(|s| {
                let peer = s.peer()?;
                let caps = peer.peer_info()?.capabilities.clone();
                wanted(&caps).then(|| Child {
                    server: s.name.clone(),
                    peer,
                    timeout: s.timeout(),
                    caps,
                })
            })
            .collect()
    }

    fn child(&self, server: &str, wanted: impl Fn(&ServerCapabilities) -> bool) -> Option<Child> {
        self.children(wanted)
            .into_iter()
            .find(|c| c.server == server)
    }

    /// What this session sees of the servers: resources, prompts, completions and subscriptions
    /// where any server up declared them (tools always).
    pub(super) fn capabilities(&self) -> ServerCapabilities {
        let kids = self.children(|_| true);
        let mut caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        if let Some(first) = kids.iter().find_map(|c| c.caps.resources.clone()) {
            let mut r = first;
            r.list_changed = Some(true);
            let subscribe = kids.iter().any(|c| {
                c.caps
                    .resources
                    .as_ref()
                    .is_some_and(|r| r.subscribe == Some(true))
            });
            r.subscribe = subscribe.then_some(true);
            caps.resources = Some(r);
        }
        if let Some(mut p) = kids.iter().find_map(|c| c.caps.prompts.clone()) {
            p.list_changed = Some(true);
            caps.prompts = Some(p);
        }
        if kids.iter().any(|c| c.caps.completions.is_some()) {
            caps.completions = Some(Default::default());
        }
        caps
    }

    /// The verdict for `name`, or `None` when this session does not see it (denied, or not
    /// among the agent's tools).
    fn judge(&self, name: &str) -> Option<Decision> {
        let d = policy::decide(&self.config.policy, name);
        (d.verdict != Verdict::Deny && self.agent.tool_globs.is_match(name)).then_some(d)
    }

    /// The verdict for `name` (`what` it is, for the refusal), refused when hidden.
    fn check(&self, what: &str, name: &str) -> Result<Decision, ErrorData> {
        let d = policy::decide(&self.config.policy, name);
        if d.verdict == Verdict::Deny {
            return Err(ErrorData::invalid_request(
                format!("{what} is denied by policy (rule deny = {:?}).", d.rule),
                None,
            ));
        }
        if !self.agent.tool_globs.is_match(name) {
            return Err(ErrorData::invalid_request(
                format!(
                    "{what} is not among agent {}'s tools ({name}).",
                    self.agent.name
                ),
                None,
            ));
        }
        Ok(d)
    }

    /// Ask the client when the verdict is `ask`; a refusal is an error with the reason.
    async fn permit(
        &self,
        d: &Decision,
        subject: Subject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if d.verdict != Verdict::Ask {
            return Ok(());
        }
        match ask::ask(&subject, self.agent.approval_ttl, ctx).await {
            None => Ok(()),
            Some(why) => Err(ErrorData::invalid_request(why, None)),
        }
    }

    pub(super) async fn complete(
        &self,
        mut request: CompleteRequestParams,
    ) -> Result<CompleteResult, ErrorData> {
        let (child, reference) = match &request.r#ref {
            Reference::Prompt(p) => {
                let (child, prompt) = self.prompt_child(&p.name).await?;
                self.check(
                    &format!("Prompt {}", p.name),
                    &policy::prompt_name(&child.server, &prompt),
                )?;
                let mut r = PromptReference::new(prompt);
                r.title = p.title.clone();
                (child, Reference::Prompt(r))
            }
            Reference::Resource(r) => {
                let (child, raw) = self.resolve(&r.uri).await?;
                self.check(
                    &format!("Resource {}", r.uri),
                    &policy::resource_name(&child.server, &raw),
                )?;
                (
                    child,
                    Reference::Resource(ResourceTemplateReference::new(raw)),
                )
            }
            _ => return Err(ErrorData::invalid_params(
                "completion/complete: unknown kind of ref (ref/prompt and ref/resource are known)",
                None,
            )),
        };
        if child.caps.completions.is_none() {
            return Ok(CompleteResult::default());
        }
        request.r#ref = reference;
        within(&child, "completion/complete", child.peer.complete(request)).await
    }

    /// Relay the servers' resource and prompt notifications to this session's client until
    /// `ended`: list changes, and updates of the resources it subscribed to.
    pub(super) fn relay_catalog(&self, peer: Peer<RoleServer>, ended: CancellationToken) {
        let Some(mcp) = self.host.mcp_host() else {
            return;
        };
        for sup in mcp.shared_servers() {
            let mut events = sup.catalog_events();
            let server = sup.name.clone();
            let subscribed = self.subscribed.clone();
            let (peer, ended) = (peer.clone(), ended.clone());
            tokio::spawn(async move {
                loop {
                    let event = tokio::select! {
                        e = events.recv() => e,
                        _ = ended.cancelled() => break,
                    };
                    let sent = match event {
                        Err(RecvError::Closed) => break,
                        Ok(CatalogEvent::ResourcesChanged) => {
                            peer.notify_resource_list_changed().await
                        }
                        Ok(CatalogEvent::PromptsChanged) => peer.notify_prompt_list_changed().await,
                        Ok(CatalogEvent::ResourceUpdated(raw)) => {
                            let given = crate::sync::lock(&subscribed)
                                .get(&(server.clone(), raw))
                                .cloned();
                            match given {
                                Some(uri) => {
                                    let param = ResourceUpdatedNotificationParam::new(uri);
                                    peer.notify_resource_updated(param).await
                                }
                                None => Ok(()),
                            }
                        }
                        // Missed some: whatever changed, the client re-lists.
                        Err(RecvError::Lagged(_)) => {
                            let _ = peer.notify_resource_list_changed().await;
                            peer.notify_prompt_list_changed().await
                        }
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            });
        }
    }
}
