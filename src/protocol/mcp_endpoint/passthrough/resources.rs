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
use super::super::uri::{
    expose_prompt, expose_uri, parse_uri, shown, template_matches, TEMPLATE_BUDGET,
};
use super::child::{log, or_none, outcome, within, Child};
use crate::tools::mcp::policy;
use crate::tools::mcp::resource_uri::{canonical, canonical_template};

/// What a client names: a resource's URI, or a URI template (a completion's `ref/resource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Named {
    Uri,
    Template,
}

impl Named {
    /// The canonical form of `uri` (see [`crate::tools::mcp::resource_uri`]); a URI without
    /// one is refused saying why.
    fn canonical(self, uri: &str) -> Result<String, ErrorData> {
        let c = match self {
            Named::Uri => canonical(uri),
            Named::Template => canonical_template(uri),
        };
        c.map_err(|why| {
            ErrorData::invalid_params(
                format!(
                    "Resource {uri}: {why}; see the README for how turnstile reads resource URIs"
                ),
                None,
            )
        })
    }
}

/// A resource a client named: its server, the URI as the server is sent it (canonical), and
/// whether the client named it through `turnstile://<server>/`.
pub(super) struct Resolved {
    pub(super) child: Child,
    pub(super) uri: String,
    pub(super) prefixed: bool,
}

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
            // Listed by its canonical URI, what a read of it is judged by and sends; one
            // without a canonical form could not be read: not listed.
            .filter_map(|(c, mut r)| {
                r.uri = canonical(&r.uri).ok()?;
                Some((c, r))
            })
            .collect();
        let names = self.shown(listed.iter().map(|(c, r)| (c, r.uri.as_str())));
        let mut out = Vec::new();
        for ((c, mut r), uri) in listed.into_iter().zip(names) {
            if self
                .judge(ctx, &policy::resource_name(&c.server, &r.uri))
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
            .filter_map(|(c, mut t)| {
                t.uri_template = canonical_template(&t.uri_template).ok()?;
                Some((c, t))
            })
            .collect();
        let names = self.shown(listed.iter().map(|(c, t)| (c, t.uri_template.as_str())));
        let mut out = Vec::new();
        for ((c, mut t), template) in listed.into_iter().zip(names) {
            if self
                .judge(ctx, &policy::resource_name(&c.server, &t.uri_template))
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

    /// How `child` claims the canonical `uri`: it lists it (or, for a template, lists that
    /// template), or has a template matching it, or neither. Templates are matched off the
    /// async workers, within [`TEMPLATE_BUDGET`] for the request.
    async fn claims(&self, child: &Child, uri: &str, named: Named) -> Claim {
        let listed = within(child, "resources/list", child.peer.list_all_resources()).await;
        let same = |own: &str| canonical(own).is_ok_and(|c| c == uri);
        if named == Named::Uri && listed.is_ok_and(|l| l.iter().any(|r| same(&r.uri))) {
            return Claim::Lists;
        }
        let templates = match within(
            child,
            "resources/templates/list",
            child.peer.list_all_resource_templates(),
        )
        .await
        {
            Ok(l) => l,
            Err(_) => return Claim::None,
        };
        if named == Named::Template {
            let same = |t: &str| canonical_template(t).is_ok_and(|c| c == uri);
            return match templates.iter().any(|t| same(&t.uri_template)) {
                true => Claim::Lists,
                false => Claim::None,
            };
        }
        let uri = uri.to_string();
        let server = child.server.clone();
        let matched = tokio::task::spawn_blocking(move || {
            let mut budget = TEMPLATE_BUDGET;
            for t in &templates {
                match template_matches(&t.uri_template, &uri, &mut budget) {
                    Some(true) => return true,
                    Some(false) => {}
                    None => {
                        tracing::warn!(
                            server,
                            templates = templates.len(),
                            "matching a URI against the server's resource templates passed its budget; the rest are taken as not matching"
                        );
                        return false;
                    }
                }
            }
            false
        })
        .await;
        match matched {
            Ok(true) => Claim::Template,
            _ => Claim::None,
        }
    }

    /// The server a client's URI (or template) is for, and the canonical URI it is sent.
    pub(super) async fn resolve(
        &self,
        uri: &str,
        named: Named,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Resolved, ErrorData> {
        if let Some((server, raw)) = parse_uri(uri) {
            let own = named.canonical(raw)?;
            let kids = self.children(ctx, |c| c.resources.is_some()).await;
            return match kids.into_iter().find(|c| c.server == server) {
                Some(child) => Ok(Resolved { child, uri: own, prefixed: true }),
                None => Err(ErrorData::resource_not_found(
                    format!("Resource {uri}: no MCP server {server:?} passes resources through /mcp (not configured, not up, or it serves none)"),
                    None,
                )),
            };
        }
        let own = named.canonical(uri)?;
        let kids = self.children(ctx, |c| c.resources.is_some()).await;
        let claims = join_all(kids.iter().map(|c| self.claims(c, &own, named))).await;
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
            1 => Ok(Resolved {
                child: claiming.remove(0),
                uri: own,
                prefixed: false,
            }),
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
        let Resolved {
            child,
            uri: raw,
            prefixed,
        } = self.resolve(&uri, Named::Uri, ctx).await?;
        let name = policy::resource_name(&child.server, &raw);
        let what = format!("Resource {uri}");
        let d = self.check(ctx, &what, &name).inspect_err(|_| {
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
        // Canonical URIs show no control or bidirectional characters.
        shown(&pairs, self.config.mcp_endpoint.names, |_| true)
    }

    pub(in crate::protocol::mcp_endpoint) async fn subscribe(
        &self,
        uri: String,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Resolved {
            child, uri: raw, ..
        } = self.resolve(&uri, Named::Uri, ctx).await?;
        self.check(
            ctx,
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
