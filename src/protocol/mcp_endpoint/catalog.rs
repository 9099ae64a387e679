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

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, PromptReference,
    ReadResourceRequestParams, ReadResourceResult, Reference, ResourceContents,
    ResourceTemplateReference, ResourceUpdatedNotificationParam, ServerCapabilities,
    SubscribeRequestParams,
};
use rmcp::service::{Peer, RequestContext, RoleClient};
use rmcp::{ErrorData, RoleServer, ServiceError};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::ask::{self, Subject};
use super::gate::Gate;
use super::uri::{expose_prompt, expose_uri, parse_prompt, parse_uri, shown, template_matches};
use crate::config::{EndpointNames, Verdict};
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

/// How a server claims a URI, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Claim {
    None,
    Template,
    Lists,
}

/// The children's prompts, each with its child (a failed listing counts as none).
fn prompts_of(
    kids: &[Child],
    lists: Vec<Result<Vec<rmcp::model::Prompt>, ErrorData>>,
) -> Vec<(&Child, rmcp::model::Prompt)> {
    kids.iter()
        .zip(lists)
        .flat_map(|(c, l)| {
            or_none(c, "listing prompts", l)
                .into_iter()
                .map(move |p| (c, p))
        })
        .collect()
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

    pub(super) async fn list_resources(&self) -> ListResourcesResult {
        let kids = self.children(|c| c.resources.is_some());
        let lists = join_all(
            kids.iter()
                .map(|c| within(c, "resources/list", c.peer.list_all_resources())),
        )
        .await;
        let listed: Vec<(&Child, rmcp::model::Resource)> = kids
            .iter()
            .zip(lists)
            .flat_map(|(c, l)| {
                or_none(c, "listing resources", l)
                    .into_iter()
                    .map(move |r| (c, r))
            })
            .collect();
        let names = self.shown(listed.iter().map(|(c, r)| (c, r.uri.as_str())));
        let mut out = Vec::new();
        for ((c, mut r), uri) in listed.into_iter().zip(names) {
            if self
                .judge(&policy::resource_name(&c.server, &r.uri))
                .is_some()
            {
                if uri != r.uri {
                    r.name = expose_prompt(&c.server, &r.name);
                }
                r.uri = uri;
                out.push(r);
            }
        }
        ListResourcesResult::with_all_items(out)
    }

    pub(super) async fn list_resource_templates(&self) -> ListResourceTemplatesResult {
        let kids = self.children(|c| c.resources.is_some());
        let lists = join_all(kids.iter().map(|c| {
            within(
                c,
                "resources/templates/list",
                c.peer.list_all_resource_templates(),
            )
        }))
        .await;
        let listed: Vec<(&Child, rmcp::model::ResourceTemplate)> = kids
            .iter()
            .zip(lists)
            .flat_map(|(c, l)| {
                or_none(c, "listing resource templates", l)
                    .into_iter()
                    .map(move |t| (c, t))
            })
            .collect();
        let names = self.shown(listed.iter().map(|(c, t)| (c, t.uri_template.as_str())));
        let mut out = Vec::new();
        for ((c, mut t), template) in listed.into_iter().zip(names) {
            if self
                .judge(&policy::resource_name(&c.server, &t.uri_template))
                .is_some()
            {
                if template != t.uri_template {
                    t.name = expose_prompt(&c.server, &t.name);
                }
                t.uri_template = template;
                out.push(t);
            }
        }
        ListResourceTemplatesResult::with_all_items(out)
    }

    /// How `child` claims `uri`: it lists it, or has a template matching it, or neither.
    async fn claims(&self, child: &Child, uri: &str) -> Claim {
        let listed = within(child, "resources/list", child.peer.list_all_resources()).await;
        if listed.is_ok_and(|l| l.iter().any(|r| r.uri == uri)) {
            return Claim::Lists;
        }
        let templates = within(
            child,
            "resources/templates/list",
            child.peer.list_all_resource_templates(),
        )
        .await;
        if templates.is_ok_and(|l| l.iter().any(|t| template_matches(&t.uri_template, uri))) {
            return Claim::Template;
        }
        Claim::None
    }

    /// The server a client's URI is for, and the URI as that server names it.
    async fn resolve(&self, uri: &str) -> Result<(Child, String), ErrorData> {
        let kids = self.children(|c| c.resources.is_some());
        if let Some((server, raw)) = parse_uri(uri) {
            return match kids.into_iter().find(|c| c.server == server) {
                Some(c) => Ok((c, raw.to_string())),
                None => Err(ErrorData::resource_not_found(
                    format!("Resource {uri}: no MCP server {server:?} passes resources through /mcp (not configured, not up, scope = \"session\", or it serves none)"),
                    None,
                )),
            };
        }
        let claims = join_all(kids.iter().map(|c| self.claims(c, uri))).await;
        // The servers that list it; else those with a template for it; else the only one.
        let best = claims.iter().max().copied().unwrap_or(Claim::None);
        let only = kids.len() == 1;
        let mut claiming: Vec<Child> = kids
            .into_iter()
            .zip(claims)
            .filter(|(_, claim)| (*claim == best && best != Claim::None) || only)
            .map(|(c, _)| c)
            .collect();
        match claiming.len() {
            1 => Ok((claiming.remove(0), uri.to_string())),
            0 => Err(ErrorData::resource_not_found(
                format!("Resource {uri}: no MCP server lists it; read a URI from resources/list (turnstile://<server>/<uri>)"),
                None,
            )),
            _ => Err(ErrorData::invalid_params(
                format!("Resource {uri}: several MCP servers serve it; name one as turnstile://<server>/{uri}"),
                None,
            )),
        }
    }

    pub(super) async fn read_resource(
        &self,
        uri: String,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        let started = Instant::now();
        let (child, raw) = self.resolve(&uri).await?;
        let prefixed = raw != uri;
        let name = policy::resource_name(&child.server, &raw);
        let what = format!("Resource {uri}");
        let d = self.check(&what, &name).inspect_err(|_| {
            let d = policy::decide(&self.config.policy, &name);
            log(&child.server, "resource read", &raw, &d, "refused", started);
        })?;
        let subject = Subject {
            question: format!("Allow reading the resource {uri} ({})?", child.server),
            what,
            denied: "Resource read denied",
            rule: d.rule.clone(),
        };
        if let Err(e) = self.permit(&d, subject, ctx).await {
            log(&child.server, "resource read", &raw, &d, "denied", started);
            return Err(e);
        }
        let params = ReadResourceRequestParams::new(raw.clone());
        let read = within(&child, "resources/read", child.peer.read_resource(params)).await;
        log(
            &child.server,
            "resource read",
            &raw,
            &d,
            outcome(&read),
            started,
        );
        let mut read = read?;
        if prefixed {
            for c in &mut read.contents {
                if let ResourceContents::TextResourceContents { uri, .. }
                | ResourceContents::BlobResourceContents { uri, .. } = c
                {
                    *uri = expose_uri(&child.server, uri);
                }
            }
        }
        Ok(read)
    }

    pub(super) async fn list_prompts(&self) -> ListPromptsResult {
        let kids = self.children(|c| c.prompts.is_some());
        let lists = join_all(
            kids.iter()
                .map(|c| within(c, "prompts/list", c.peer.list_all_prompts())),
        )
        .await;
        let listed = prompts_of(&kids, lists);
        let names = self.shown_prompts(&listed);
        let mut out = Vec::new();
        for ((c, mut p), name) in listed.into_iter().zip(names) {
            if self
                .judge(&policy::prompt_name(&c.server, &p.name))
                .is_some()
            {
                p.name = name;
                out.push(p);
            }
        }
        ListPromptsResult::with_all_items(out)
    }

    /// The name each of `listed`'s prompts is shown by (see [`shown`]).
    fn shown_prompts(&self, listed: &[(&Child, rmcp::model::Prompt)]) -> Vec<String> {
        let pairs: Vec<(&str, String)> = listed
            .iter()
            .map(|(c, p)| (p.name.as_str(), expose_prompt(&c.server, &p.name)))
            .collect();
        shown(&pairs, self.config.mcp_endpoint.names)
    }

    /// The URI (or template) each of a listing's resources is shown by (see [`shown`]).
    fn shown<'c>(&self, listed: impl Iterator<Item = (&'c &'c Child, &'c str)>) -> Vec<String> {
        let pairs: Vec<(&str, String)> = listed
            .map(|(c, uri)| (uri, expose_uri(&c.server, uri)))
            .collect();
        shown(&pairs, self.config.mcp_endpoint.names)
    }

    /// The server a client's prompt name is for, and the prompt's own name there: a name
    /// shown as the server's own (`names = "own"`, which asks the servers for their prompts),
    /// else `<server>/<prompt>`.
    async fn prompt_child(&self, name: &str) -> Result<(Child, String), ErrorData> {
        let wanted = |c: &ServerCapabilities| c.prompts.is_some();
        if self.config.mcp_endpoint.names == EndpointNames::Own {
            let kids = self.children(wanted);
            let lists = join_all(
                kids.iter()
                    .map(|c| within(c, "prompts/list", c.peer.list_all_prompts())),
            )
            .await;
            let listed = prompts_of(&kids, lists);
            let names = self.shown_prompts(&listed);
            if let Some(((c, p), _)) = listed.iter().zip(&names).find(|(_, n)| *n == name) {
                return Ok(((*c).clone(), p.name.clone()));
            }
        }
        let Some((server, prompt)) = parse_prompt(name) else {
            return Err(ErrorData::invalid_params(
                format!("Prompt {name}: /mcp names prompts <server>/<prompt> (see prompts/list)"),
                None,
            ));
        };
        match self.child(server, wanted) {
            Some(c) => Ok((c, prompt.to_string())),
            None => Err(ErrorData::invalid_params(
                format!("Prompt {name}: no MCP server {server:?} passes prompts through /mcp (not configured, not up, scope = \"session\", or it serves none)"),
                None,
            )),
        }
    }

    pub(super) async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetPromptResult, ErrorData> {
        let started = Instant::now();
        let (child, prompt) = self.prompt_child(&request.name).await?;
        let name = policy::prompt_name(&child.server, &prompt);
        let what = format!("Prompt {}", request.name);
        let d = self.check(&what, &name).inspect_err(|_| {
            let d = policy::decide(&self.config.policy, &name);
            log(&child.server, "prompt", &prompt, &d, "refused", started);
        })?;
        let args = request
            .arguments
            .as_ref()
            .map(|a| serde_json::Value::Object(a.clone()))
            .unwrap_or_default();
        let subject = Subject {
            question: format!("Allow the prompt {} with {args}?", request.name),
            what,
            denied: "Prompt denied",
            rule: d.rule.clone(),
        };
        if let Err(e) = self.permit(&d, subject, ctx).await {
            log(&child.server, "prompt", &prompt, &d, "denied", started);
            return Err(e);
        }
        let mut params = GetPromptRequestParams::new(prompt.clone());
        params.arguments = request.arguments;
        let got = within(&child, "prompts/get", child.peer.get_prompt(params)).await;
        log(&child.server, "prompt", &prompt, &d, outcome(&got), started);
        got
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

    pub(super) async fn subscribe(&self, uri: String) -> Result<(), ErrorData> {
        let (child, raw) = self.resolve(&uri).await?;
        self.check(
            &format!("Resource {uri}"),
            &policy::resource_name(&child.server, &raw),
        )?;
        let can = child
            .caps
            .resources
            .as_ref()
            .is_some_and(|r| r.subscribe == Some(true));
        if !can {
            return Err(ErrorData::invalid_request(
                format!(
                    "Resource {uri}: MCP server {} does not support subscriptions",
                    child.server
                ),
                None,
            ));
        }
        #[allow(deprecated)]
        let subscribed = child
            .peer
            .subscribe(SubscribeRequestParams::new(raw.clone()));
        within(&child, "resources/subscribe", subscribed).await?;
        crate::sync::lock(&self.subscribed).insert((child.server, raw), uri);
        Ok(())
    }

    /// Only this session stops hearing of it: the server's subscription may serve others.
    pub(super) fn unsubscribe(&self, uri: &str) {
        crate::sync::lock(&self.subscribed).retain(|_, given| given != uri);
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
