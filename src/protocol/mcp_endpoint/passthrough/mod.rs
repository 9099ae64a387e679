//! What `/mcp` passes through of the federated servers besides their tools: resources,
//! resource templates, prompts, completions and resource subscriptions, read-only, from the
//! shared servers that are up and declared them and from this MCP session's own instances of
//! the session-scoped ones (started for it when first needed, as for a tool call); and those
//! instances' log messages (a shared server's belong to no one session: not relayed).
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

mod child;
mod prompts;
mod resources;

#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, PromptReference, Reference, ResourceTemplateReference,
    ResourceUpdatedNotificationParam, ServerCapabilities,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer};
use tokio::sync::broadcast::error::RecvError;

use super::ask::{self, Subject};
use super::gate::Gate;
use crate::config::Verdict;
use crate::tools::mcp::policy::{self, Decision};
use crate::tools::mcp::supervisor::CatalogEvent;
use child::{child_of, within, Child};

/// Where relayed events come from: a shared server's instance, or the feed of this session's
/// own instances.
enum Source {
    Shared(String, tokio::sync::broadcast::Receiver<CatalogEvent>),
    Own(tokio::sync::broadcast::Receiver<(String, CatalogEvent)>),
}

impl Source {
    /// The next event, with its server's name.
    async fn recv(&mut self) -> Result<(String, CatalogEvent), RecvError> {
        match self {
            Source::Shared(server, events) => Ok((server.clone(), events.recv().await?)),
            Source::Own(feed) => feed.recv().await,
        }
    }
}

impl Gate {
    /// The servers that are up and pass `wanted`, in config order: the shared ones, then this
    /// session's own instances of the session-scoped ones (started for it if need be, where
    /// what they declared to their probe passes `wanted`), whose notifications are then
    /// relayed to its client.
    async fn children(
        &self,
        ctx: &RequestContext<RoleServer>,
        wanted: impl Fn(&ServerCapabilities) -> bool,
    ) -> Vec<Child> {
        let Some(mcp) = self.host.mcp_host() else {
            return Vec::new();
        };
        let mut out: Vec<Child> = mcp
            .shared_servers()
            .iter()
            .filter_map(|s| child_of(s, false, &wanted))
            .collect();
        self.relay_own(ctx);
        let own = mcp.session_servers(&self.call_context(ctx), &wanted).await;
        out.extend(own.iter().filter_map(|s| child_of(s, true, &wanted)));
        out
    }

    async fn child(
        &self,
        ctx: &RequestContext<RoleServer>,
        server: &str,
        wanted: impl Fn(&ServerCapabilities) -> bool,
    ) -> Option<Child> {
        self.children(ctx, wanted)
            .await
            .into_iter()
            .find(|c| c.server == server)
    }

    /// What this session sees of the servers: resources, prompts, completions and subscriptions
    /// where any shared server up, or any session-scoped one when probed, declared them (tools
    /// always); logging where a session-scoped one declared it (its instances' messages are
    /// their session's; a shared server's are no one session's).
    pub(super) fn capabilities(&self) -> ServerCapabilities {
        let (shared, session) = match self.host.mcp_host() {
            Some(mcp) => (
                mcp.shared_servers()
                    .iter()
                    .filter_map(|s| child_of(s, false, &|_: &ServerCapabilities| true))
                    .map(|c| c.caps)
                    .collect(),
                mcp.session_capabilities(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let all: Vec<&ServerCapabilities> = shared.iter().chain(&session).collect();
        let mut caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        if let Some(first) = all.iter().find_map(|c| c.resources.clone()) {
            let mut r = first;
            r.list_changed = Some(true);
            let subscribe = all.iter().any(|c| {
                c.resources
                    .as_ref()
                    .is_some_and(|r| r.subscribe == Some(true))
            });
            r.subscribe = subscribe.then_some(true);
            caps.resources = Some(r);
        }
        if let Some(mut p) = all.iter().find_map(|c| c.prompts.clone()) {
            p.list_changed = Some(true);
            caps.prompts = Some(p);
        }
        if all.iter().any(|c| c.completions.is_some()) {
            caps.completions = Some(Default::default());
        }
        if session.iter().any(|c| c.logging.is_some()) {
            caps.logging = Some(Default::default());
        }
        caps
    }

    /// `logging/setLevel`: this session's own instances are told (where they log), and their
    /// messages below it are no longer relayed. A shared server's level is left as it is: it
    /// is no one session's.
    #[allow(deprecated)]
    pub(super) async fn set_level(
        &self,
        request: SetLevelRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if self.capabilities().logging.is_none() {
            return Err(ErrorData::method_not_found::<
                rmcp::model::SetLevelRequestMethod,
            >());
        }
        *crate::sync::lock(&self.kept.level) = Some(request.level);
        let own: Vec<Child> = self
            .children(ctx, |c| c.logging.is_some())
            .await
            .into_iter()
            .filter(|c| c.own)
            .collect();
        for c in &own {
            within(c, "logging/setLevel", c.peer.set_level(request.clone())).await?;
        }
        Ok(())
    }

    /// The verdict for `name`, or `None` when this session does not see it (denied, or not
    /// among the agent's tools).
    fn judge(&self, ctx: &RequestContext<RoleServer>, name: &str) -> Option<Decision> {
        let d = policy::decide(&self.config.policy, name);
        let agent = self.agent_of(&ctx.extensions);
        (d.verdict != Verdict::Deny && agent.tool_globs.is_match(name)).then_some(d)
    }

    /// The verdict for `name` (`what` it is, for the refusal), refused when hidden.
    fn check(
        &self,
        ctx: &RequestContext<RoleServer>,
        what: &str,
        name: &str,
    ) -> Result<Decision, ErrorData> {
        let d = policy::decide(&self.config.policy, name);
        if d.verdict == Verdict::Deny {
            return Err(ErrorData::invalid_request(
                format!("{what} is denied by policy (rule deny = {:?}).", d.rule),
                None,
            ));
        }
        if !self.agent_of(&ctx.extensions).tool_globs.is_match(name) {
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
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let (child, reference) = match &request.r#ref {
            Reference::Prompt(p) => {
                let (child, prompt) = self.prompt_child(&p.name, ctx).await?;
                self.check(
                    ctx,
                    &format!("Prompt {}", p.name),
                    &policy::prompt_name(&child.server, &prompt),
                )?;
                let mut r = PromptReference::new(prompt);
                r.title = p.title.clone();
                (child, Reference::Prompt(r))
            }
            Reference::Resource(r) => {
                let resources::Resolved {
                    child, uri: raw, ..
                } = self
                    .resolve(&r.uri, resources::Named::Template, ctx)
                    .await?;
                self.check(
                    ctx,
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

    /// Relay the shared servers' resource and prompt notifications to this session's client
    /// until it ends (see [`relay`]).
    pub(super) fn relay_catalog(&self, peer: Peer<RoleServer>) {
        if let Some(mcp) = self.host.mcp_host() {
            for sup in mcp.shared_servers() {
                let source = Source::Shared(sup.name.clone(), sup.catalog_events());
                self.spawn_relay(peer.clone(), source);
            }
        }
    }

    /// Once per session, at its first request (before any of its own instances can have
    /// started, for a tool call or a listing): relay their notifications to its client. With no
    /// session-scoped server there are none, and no feed is made (its 64 slots, ~14 KiB, would
    /// stay with the session, parked or not, until it ends).
    pub(super) fn relay_own(&self, ctx: &RequestContext<RoleServer>) {
        let Some(mcp) = self.host.mcp_host() else {
            return;
        };
        let scoped =
            |s: &crate::config::McpServerConfig| s.scope == crate::config::McpScope::Session;
        if !self.config.mcp_servers.iter().any(scoped) {
            return;
        }
        if self.kept.relaying.set(()).is_err() {
            return;
        }
        let feed = mcp.session_catalog_events(&self.call_context(ctx).session_id);
        self.spawn_relay(ctx.peer.clone(), Source::Own(feed));
    }

    /// Relay the events of `source` to this session's client until it ends (or the source
    /// does): list changes, updates of the resources it subscribed to, and log messages (only
    /// session-scoped instances send them) at or above the level it set.
    fn spawn_relay(&self, peer: Peer<RoleServer>, mut source: Source) {
        let subscribed = self.kept.subscribed.clone();
        let level = self.kept.level.clone();
        let ended = self.ended.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    e = source.recv() => e,
                    _ = ended.cancelled() => break,
                };
                let sent = match event {
                    Err(RecvError::Closed) => break,
                    Ok((_, CatalogEvent::ResourcesChanged)) => {
                        peer.notify_resource_list_changed().await
                    }
                    Ok((_, CatalogEvent::PromptsChanged)) => {
                        peer.notify_prompt_list_changed().await
                    }
                    Ok((server, CatalogEvent::ResourceUpdated(raw))) => {
                        // Subscriptions are kept by the canonical URI the server was sent.
                        let raw = crate::tools::mcp::resource_uri::canonical(&raw).unwrap_or(raw);
                        let given = crate::sync::lock(&subscribed).get(&(server, raw)).cloned();
                        match given {
                            Some(uri) => {
                                let param = ResourceUpdatedNotificationParam::new(uri);
                                peer.notify_resource_updated(param).await
                            }
                            None => Ok(()),
                        }
                    }
                    #[allow(deprecated)]
                    Ok((_, CatalogEvent::Logged(message))) => {
                        let floor = *crate::sync::lock(&level);
                        if floor.is_some_and(|f| (message.level as u8) < (f as u8)) {
                            Ok(())
                        } else {
                            peer.notify_logging_message(message).await
                        }
                    }
                    // Missed some: whatever changed, the client re-lists.
                    Err(RecvError::Lagged(_)) | Ok((_, CatalogEvent::Missed)) => {
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
