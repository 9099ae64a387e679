//! MCP sampling (`sampling/createMessage`): a server asks for a completion from the model of
//! the session whose call it is serving.
//!
//! Only servers with `[mcp_servers.X] sampling = true` are told the client can sample (the
//! capability is declared for them alone); any other server's request is refused. A request is
//! answered by a [`Sampler`] the caller of a tool puts in its
//! [`CallContext`](crate::tools::CallContext): a turn's ([`UpstreamSampler`]) makes one call of
//! the session's upstream and model, with no tools, `maxTokens` capped at `sampling_max_tokens`,
//! and counts it against the turn's `sampling_calls_per_turn` (per server) and into the turn's
//! `usage`. A call through `/mcp` relays the request to its MCP client when that client can
//! sample (`protocol/mcp_endpoint/to_client.rs`), else it is refused. Every refusal is an MCP
//! error whose message names the key that decided it; every request is counted in
//! `turnstile_mcp_sampling_total{server,outcome}`.

// Sampling is deprecated by SEP-2577 (a later protocol); servers of the current ones use it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, Role, SamplingContent,
    SamplingMessageContentBlock,
};

use crate::message::{Block, Content, Message, Usage};
use crate::upstream::router::Router;
use crate::upstream::{ModelOutput, ModelRequest, ModelStop, Tuning};

/// Stop sequences passed on from a request (OpenAI takes at most 4).
pub const MAX_STOP_SEQUENCES: usize = 4;

pub use crate::tools::call::{Budget, Sampler};

/// What a turn's sampling came to: added to its `usage` and its log line when it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Upstream calls made for sampling requests.
    pub calls: u32,
    /// Requests refused by the budget.
    pub refused: u32,
    pub usage: Usage,
    /// Each call answered: its upstream, model and usage (for the principal's spend).
    pub answered: Vec<(String, String, Usage)>,
    /// Calls made (or under way) by server, against `sampling_calls_per_turn`.
    by_server: HashMap<String, u32>,
}

/// A turn's sampler: the session's model, through its agent's upstreams.
pub struct UpstreamSampler {
    router: Arc<Router>,
    /// The agent's upstreams, in order (empty: all).
    upstreams: Vec<String>,
    model: String,
    tally: Mutex<Tally>,
}

impl UpstreamSampler {
    pub fn new(router: Arc<Router>, upstreams: Vec<String>, model: String) -> UpstreamSampler {
        UpstreamSampler {
            router,
            upstreams,
            model,
            tally: Mutex::new(Tally::default()),
        }
    }

    /// What the turn's sampling has come to so far.
    pub fn tally(&self) -> Tally {
        crate::sync::lock(&self.tally).clone()
    }

    /// Count one call against the budget, or say why not.
    fn reserve(&self, budget: &Budget) -> Result<(), String> {
        let mut t = crate::sync::lock(&self.tally);
        let made = t.by_server.get(&budget.server).copied().unwrap_or(0);
        if made >= budget.calls_per_turn {
            t.refused += 1;
            return Err(format!(
                "sampling refused: this turn already made {made} sampling calls for {} (limit: [mcp_servers.{}] sampling_calls_per_turn in tools.toml)",
                budget.server, budget.server
            ));
        }
        t.by_server.insert(budget.server.clone(), made + 1);
        Ok(())
    }
}

impl Sampler for UpstreamSampler {
    fn sample<'a>(
        &'a self,
        budget: &'a Budget,
        request: CreateMessageRequestParams,
    ) -> BoxFuture<'a, Result<CreateMessageResult, String>> {
        Box::pin(async move {
            let req = to_request(&request, &self.model, budget)?;
            self.reserve(budget)?;
            let result = self.router.complete(&self.upstreams, &req).await;
            let (out, model, upstream) = result.map_err(|e| {
                tracing::warn!(server = %budget.server, error = %e, "a sampling call of the upstream failed");
                format!("sampling failed: the upstream call failed: {}", e.message)
            })?;
            {
                let mut t = crate::sync::lock(&self.tally);
                t.calls += 1;
                t.usage.add(out.usage);
                t.answered.push((upstream, model.clone(), out.usage));
            }
            crate::metrics::mcp_sampling(&budget.server, "ok", Some(out.usage));
            tracing::info!(
                server = %budget.server,
                %model,
                max_tokens = req.max_tokens.unwrap_or(0),
                tokens_in = out.usage.input_tokens,
                tokens_out = out.usage.output_tokens,
                "MCP sampling request answered"
            );
            Ok(to_result(out, &model))
        })
    }
}

/// The answer to a server's sampling request: refused when the server is not allowed
/// (`budget` is `None`) or no one can answer (`sampler` says why), else the sampler's.
pub async fn answer(
    server: &str,
    budget: Option<&Budget>,
    sampler: Result<Arc<dyn Sampler>, String>,
    request: CreateMessageRequestParams,
) -> Result<CreateMessageResult, rmcp::ErrorData> {
    let refused = |why: String| {
        tracing::info!(server, reason = %why, "MCP sampling request refused");
        crate::metrics::mcp_sampling(server, "refused", None);
        Err(rmcp::ErrorData::invalid_request(why, None))
    };
    let Some(budget) = budget else {
        return refused(format!(
            "sampling refused: this server may not sample (set [mcp_servers.{server}] sampling = true in tools.toml to allow it)"
        ));
    };
    let sampler = match sampler {
        Ok(s) => s,
        Err(why) => return refused(format!("sampling refused: {why}")),
    };
    match sampler.sample(budget, request).await {
        Ok(result) => Ok(result),
        Err(why) if why.starts_with("sampling refused") => refused(why),
        Err(why) => {
            crate::metrics::mcp_sampling(server, "error", None);
            Err(rmcp::ErrorData::internal_error(why, None))
        }
    }
}

/// One upstream model call for a sampling request: its messages (text and images), its system
/// prompt, `maxTokens` capped at the budget's, its `temperature` (within 0 to 1) and up to
/// [`MAX_STOP_SEQUENCES`] `stopSequences`; no tools. `modelPreferences` and `includeContext`
/// are not followed (the session's model answers, with no other context): logged when given.
pub fn to_request(
    params: &CreateMessageRequestParams,
    model: &str,
    budget: &Budget,
) -> Result<ModelRequest, String> {
    if params.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(
            "sampling refused: tools in a sampling request are not supported (the capability does not declare them)".into(),
        );
    }
    if params.model_preferences.is_some() || params.include_context.is_some() {
        tracing::debug!(
            server = %budget.server,
            "sampling: modelPreferences and includeContext are not followed; the session's model answers"
        );
    }
    let mut messages = Vec::with_capacity(params.messages.len());
    for (i, m) in params.messages.iter().enumerate() {
        let blocks = match &m.content {
            SamplingContent::Single(b) => vec![to_block(b, i)?],
            SamplingContent::Multiple(bs) => bs
                .iter()
                .map(|b| to_block(b, i))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let content = Content::from_blocks(blocks);
        messages.push(match m.role {
            Role::User => Message::User { content },
            Role::Assistant => Message::Assistant { content },
        });
    }
    if messages.is_empty() {
        return Err("sampling refused: the request has no messages".into());
    }
    Ok(ModelRequest {
        model: model.to_string(),
        system: params.system_prompt.clone().filter(|s| !s.is_empty()),
        messages,
        tools: Vec::new(),
        max_tokens: Some(params.max_tokens.clamp(1, budget.max_tokens.max(1))),
        thinking: false,
        tuning: Tuning {
            temperature: params
                .temperature
                .filter(|t| t.is_finite())
                .map(|t| t.clamp(0.0, 1.0)),
            stop: params
                .stop_sequences
                .iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .take(MAX_STOP_SEQUENCES)
                .cloned()
                .collect(),
        },
    })
}

fn to_block(b: &SamplingMessageContentBlock, i: usize) -> Result<Block, String> {
    match b {
        SamplingMessageContentBlock::Text(t) => Ok(Block::Text {
            text: t.text.clone(),
        }),
        SamplingMessageContentBlock::Image(img) => Ok(Block::Image {
            url: format!("data:{};base64,{}", img.mime_type, img.data),
        }),
        SamplingMessageContentBlock::Audio(_) => Err(format!(
            "sampling refused: messages[{i}] holds audio, which the upstream is not sent"
        )),
        _ => Err(format!(
            "sampling refused: messages[{i}] holds tool use or results, which are not supported"
        )),
    }
}

/// The server's answer: the assistant's text, the model, why it stopped.
pub fn to_result(out: ModelOutput, model: &str) -> CreateMessageResult {
    let stop = match out.stop {
        ModelStop::MaxTokens => CreateMessageResult::STOP_REASON_END_MAX_TOKEN,
        ModelStop::ToolUse => CreateMessageResult::STOP_REASON_TOOL_USE,
        ModelStop::EndTurn => CreateMessageResult::STOP_REASON_END_TURN,
        ModelStop::Refusal => "refusal",
    };
    CreateMessageResult::new(
        rmcp::model::SamplingMessage::new(
            Role::Assistant,
            SamplingMessageContentBlock::text(out.text),
        ),
        model.to_string(),
    )
    .with_stop_reason(stop)
}

#[cfg(test)]
mod tests;
