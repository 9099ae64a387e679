//! Keeping a turn's request within the model's context window (see `engine/context_window.rs`).

use super::{End, Turn};
use crate::log::{EventBody, FailReason};
use crate::message::Message;
use crate::upstream::ModelRequest;

impl Turn {
    /// Make `req` fit the model's context window (see `engine/context_window.rs`): past `compact_at` of it,
    /// compact the oldest turns first and build the request again with `rebuild`. A request
    /// still over the window fails the turn, with what to do. Returns the request and its size
    /// in bytes (for calibration).
    pub(super) async fn fit(
        &mut self,
        agent: &crate::config::AgentConfig,
        req: ModelRequest,
        rebuild: impl Fn(&Turn) -> ModelRequest,
    ) -> Result<(ModelRequest, usize), End> {
        let (window, known) =
            crate::engine::context_window::window(agent.context_tokens, &req.model);
        let threshold = (window as f64 * agent.compact_at) as u64;
        let cal = self.calibration();
        let bytes = crate::engine::context_window::request_bytes(&req);
        if cal.tokens(bytes) <= threshold {
            return Ok((req, bytes));
        }
        let (req, bytes) = if self.compact(agent, &req, window, known, threshold).await? {
            let req = rebuild(self);
            let bytes = crate::engine::context_window::request_bytes(&req);
            (req, bytes)
        } else {
            (req, bytes)
        };
        let tokens = cal.tokens(bytes);
        if known && tokens > window {
            return Err(self.too_big(tokens, window));
        }
        Ok((req, bytes))
    }

    /// The failure of a request that cannot fit the window, whatever is compacted.
    pub(super) fn too_big(&self, tokens: u64, window: u64) -> End {
        End::Failed(
            FailReason::ModelError,
            format!(
                "the request would be about {tokens} tokens, more than the model's context window of {window} tokens ([agents.{}] context_tokens in tools.toml), even with the earlier conversation compacted: the latest message or tool result is too large. Send a shorter message, or attach long text as a file",
                self.session.record().agent
            ),
        )
    }

    /// Compact the oldest messages into a summary (a model call of its own, without tools),
    /// logged as an `agent.message` with `compaction: true`. Returns whether it did.
    pub(super) async fn compact(
        &mut self,
        agent: &crate::config::AgentConfig,
        req: &ModelRequest,
        window: u64,
        known: bool,
        threshold: u64,
    ) -> Result<bool, End> {
        use crate::engine::context_window;
        let cal = self.calibration();
        let now = self.session.compactable();
        let sizes: Vec<usize> = now
            .messages
            .iter()
            .map(context_window::message_bytes)
            .collect();
        let shown: usize = req.messages.iter().map(context_window::message_bytes).sum();
        let fixed = context_window::request_bytes(req).saturating_sub(shown);
        // Room for the summary: a tenth of the window.
        let reserve = cal.bytes(window / 10);
        let cuts: Vec<(usize, bool)> = now.cuts.iter().map(|(at, user, _)| (*at, *user)).collect();
        // What no compaction can take away: over the window, a summary call would be wasted.
        let least = cuts.last().map_or(0, |&(at, _)| at);
        let least = cal.tokens(fixed + sizes[least.min(sizes.len())..].iter().sum::<usize>());
        if known && least > window {
            return Err(self.too_big(least, window));
        }
        let target = cal.bytes(threshold / 2);
        let Some(cut) = context_window::choose_cut(&sizes, &cuts, fixed + reserve, target) else {
            return Ok(false);
        };
        let (Some(first), Some((_, _, last))) = (
            now.first_id.clone(),
            now.cuts.iter().find(|(at, _, _)| *at == cut),
        ) else {
            return Ok(false);
        };
        let budget = cal.bytes(threshold.saturating_sub(window / 10));
        let text = context_window::summary_request_text(
            now.summary.as_deref(),
            &now.messages[..cut],
            budget,
        );
        let summary_req = ModelRequest {
            model: req.model.clone(),
            system: Some(context_window::SUMMARY_SYSTEM.into()),
            messages: vec![Message::User {
                content: crate::message::Content::Text(text),
            }],
            tools: Vec::new(),
            max_tokens: req.max_tokens,
            thinking: false,
            tuning: Default::default(),
        };
        tracing::info!(turn = %self.turn_id, agent = %agent.name, messages = cut, "compacting the oldest messages of the session");
        // What the turn has said is durable before the wait.
        self.sync().await?;
        let out = self.summarise(&summary_req).await?;
        cal.observe(
            context_window::request_bytes(&summary_req),
            out.usage.input_tokens,
        );
        self.usage.add(out.usage);
        let summary = out.text.trim();
        if summary.is_empty() {
            tracing::warn!(turn = %self.turn_id, "the model gave an empty summary: not compacted");
            return Ok(false);
        }
        self.emit(EventBody::AgentMessage {
            content: summary.to_string(),
            plan: false,
            compaction: true,
            replaces: Some([first, last.clone()]),
        });
        Ok(true)
    }
}
