//! Resources and resource templates: listed, read and subscribed to through the server that
//! serves them (see the parent module for their names and the policy).

use std::time::Instant;

use futures_util::future::join_all;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceRequestParams,
    ReadResourceResult, ResourceContents, SubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::super::ask::Subject;
use super::super::gate::Gate;
use super::super::uri::{expose_prompt, expose_uri, parse_uri, shown, template_matches};
use super::{log, or_none, outcome, within, Child};
use crate::tools::mcp::policy;

/// How a server claims a URI, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Claim {
    None,
    Template,
    Lists,
}

impl Gate {
    pub(in crate::protocol::mcp_endpoint) async fn list_resources(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> ListResourcesResult {
        let kids = self.children(ctx, |c| c.resources.is_some()).await;
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

    pub(in crate::protocol::mcp_endpoint) async fn list_resource_templates(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> ListResourceTemplatesResult {
        let kids = self.children(ctx, |c| c.resources.is_some()).await;
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
    pub(super) async fn resolve(
        &self,
        uri: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(Child, String), ErrorData> {
        let kids = self.children(ctx, |c| c.resources.is_some()).await;
        if let Some((server, raw)) = parse_uri(uri) {
            return match kids.into_iter().find(|c| c.server == server) {
                Some(c) => Ok((c, raw.to_string())),
                None => Err(ErrorData::resource_not_found(
                    format!("Resource {uri}: no MCP server {server:?} passes resources through /mcp (not configured, not up, or it serves none)"),
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

    pub(in crate::protocol::mcp_endpoint) async fn read_resource(
        &self,
        uri: String,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        let started = Instant::now();
        let (child, raw) = self.resolve(&uri, ctx).await?;
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

    /// The URI (or template) each of a listing's resources is shown by (see [`shown`]).
    fn shown<'c>(&self, listed: impl Iterator<Item = (&'c &'c Child, &'c str)>) -> Vec<String> {
        let pairs: Vec<(&str, String)> = listed
            .map(|(c, uri)| (uri, expose_uri(&c.server, uri)))
            .collect();
        shown(&pairs, self.config.mcp_endpoint.names)
    }

    pub(in crate::protocol::mcp_endpoint) async fn subscribe(
        &self,
        uri: String,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (child, raw) = self.resolve(&uri, ctx).await?;
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
        crate::sync::lock(&self.kept.subscribed).insert((child.server, raw), uri);
        Ok(())
    }

    /// Only this session stops hearing of it: the server's subscription may serve others.
    pub(in crate::protocol::mcp_endpoint) fn unsubscribe(&self, uri: &str) {
        crate::sync::lock(&self.kept.subscribed).retain(|_, given| given != uri);
    }
}
