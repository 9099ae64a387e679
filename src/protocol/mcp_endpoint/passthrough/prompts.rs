//! Prompts: listed and got through the server that serves them (see the parent module for their
//! names and the policy).

use std::time::Instant;

use futures_util::future::join_all;
use rmcp::model::{GetPromptRequestParams, GetPromptResult, ListPromptsResult, ServerCapabilities};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::super::ask::Subject;
use super::super::gate::Gate;
use super::super::uri::{expose_prompt, parse_prompt, plain_name, shown};
use super::child::{log, or_none, outcome, within, Child};
use crate::config::EndpointNames;
use crate::tools::mcp::policy;

/// Every prompt of `kids`, each with its child (a failed listing counts as none).
async fn prompts_of(kids: &[Child]) -> Vec<(&Child, rmcp::model::Prompt)> {
    let lists = join_all(
        kids.iter()
            .map(|c| within(c, "prompts/list", c.peer.list_all_prompts())),
    )
    .await;
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
    pub(in crate::protocol::mcp_endpoint) async fn list_prompts(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> ListPromptsResult {
        let kids = self.children(ctx, |c| c.prompts.is_some()).await;
        let listed = prompts_of(&kids).await;
        let names = self.shown_prompts(&listed);
        let mut out = Vec::new();
        for ((c, mut p), name) in listed.into_iter().zip(names) {
            if self
                .judge(ctx, &policy::prompt_name(&c.server, &p.name))
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
        shown(&pairs, self.config.mcp_endpoint.names, plain_name)
    }

    /// The server a client's prompt name is for, and the prompt's own name there: a name
    /// shown as the server's own (`names = "own"`, which asks the servers for their prompts),
    /// else `<server>/<prompt>`.
    pub(super) async fn prompt_child(
        &self,
        name: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(Child, String), ErrorData> {
        let wanted = |c: &ServerCapabilities| c.prompts.is_some();
        if self.config.mcp_endpoint.names == EndpointNames::Own {
            let kids = self.children(ctx, wanted).await;
            let listed = prompts_of(&kids).await;
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
        match self.child(ctx, server, wanted).await {
            // Only a prompt the server lists, by the name it lists: the policy judged that
            // name, not another spelling the server might take for it.
            Some(c) => match prompts_of(std::slice::from_ref(&c))
                .await
                .iter()
                .any(|(_, p)| p.name == prompt)
            {
                true => Ok((c, prompt.to_string())),
                false => Err(ErrorData::invalid_params(
                    format!("Prompt {name}: MCP server {server:?} lists no prompt {prompt:?} (see prompts/list)"),
                    None,
                )),
            },
            None => Err(ErrorData::invalid_params(
                format!("Prompt {name}: no MCP server {server:?} passes prompts through /mcp (not configured, not up, or it serves none)"),
                None,
            )),
        }
    }

    pub(in crate::protocol::mcp_endpoint) async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetPromptResult, ErrorData> {
        let started = Instant::now();
        let (child, prompt) = self.prompt_child(&request.name, ctx).await?;
        let name = policy::prompt_name(&child.server, &prompt);
        let what = format!("Prompt {}", request.name);
        let d = self.check(ctx, &what, &name).inspect_err(|_| {
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
}
