//! The model call: the request built from the session's history, retries with backoff, and the
//! retraction of text streamed by an attempt that failed.

use std::sync::Arc;
use std::time::Duration;

use super::fragments::{overlapped, Deltas, FragmentFeed};
use super::{End, Turn};
use crate::log::{EventBody, FailReason};
use crate::message::Message;
use crate::upstream::{ModelOutput, ModelRequest, UpstreamError};

impl Turn {
    pub(super) fn request(
        &self,
        agent: &crate::config::AgentConfig,
        record: &crate::engine::session_record::SessionRecord,
        tools: Vec<crate::upstream::ToolDef>,
        thinking: bool,
    ) -> ModelRequest {
        let inlined = &self.inlined;
        let history = self.session.model_history(&|f| inlined.get(&f.id).cloned());
        let mut system = (!agent.system_prompt.is_empty()).then(|| agent.system_prompt.clone());
        let mut messages = Vec::with_capacity(history.len());
        for m in history {
            match m {
                // A seed system message replaces the agent's prompt for this session.
                Message::System { content } => system = Some(content),
                other => messages.push(other),
            }
        }
        crate::engine::client_questions::hide(&mut messages, &agent.elicitation_tool);
        messages.extend(self.extra.iter().cloned());
        let upstream = &self.inner.config.upstream;
        ModelRequest {
            model: record
                .options
                .get("model")
                .cloned()
                .unwrap_or_else(|| upstream.model.clone()),
            system,
            messages,
            tools,
            max_tokens: upstream.max_tokens,
            thinking,
            tuning: Default::default(),
        }
    }

    pub(super) fn calibration(&self) -> Arc<crate::engine::context_window::Calibration> {
        self.session
            .extension::<crate::engine::context_window::Calibration>()
    }

    /// A summary call: nothing is streamed, failures are retried like any model call.
    pub(super) async fn summarise(&mut self, req: &ModelRequest) -> Result<ModelOutput, End> {
        let retries = self.inner.config.upstream.retries;
        let mut attempt = 0;
        loop {
            let metered = crate::metrics::upstream(self.inner.provider.name(), &req.model);
            let sent = std::time::Instant::now();
            let result = self
                .inner
                .provider
                .complete(req, &mut crate::upstream::NoDeltas)
                .await;
            metered.call(sent, None, result.as_ref().ok().map(|o| o.usage));
            match result {
                Ok(out) => {
                    self.model_called = true;
                    return Ok(out);
                }
                Err(e) if !e.retryable || attempt >= retries => {
                    tracing::warn!(turn = %self.turn_id, error = %e, "the summary call failed");
                    return Err(End::Failed(
                        FailReason::ModelError,
                        format!("compacting the conversation failed: {}", e.message),
                    ));
                }
                Err(e) => {
                    attempt += 1;
                    let backoff = backoff(&e, attempt);
                    tracing::info!(turn = %self.turn_id, attempt, error = %e, ?backoff, "retrying the summary call");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// One model call, retried on retryable failures. Text streamed by an attempt that then
    /// fails is retracted with an empty `agent.message`.
    pub(super) async fn call_model(
        &mut self,
        req: &ModelRequest,
        thinking: bool,
    ) -> Result<ModelOutput, End> {
        let retries = self.inner.config.upstream.retries;
        let mut attempt = 0;
        self.steps += 1;
        loop {
            let metered = crate::metrics::upstream(self.inner.provider.name(), &req.model);
            let sent = std::time::Instant::now();
            let feed = FragmentFeed::new(&self.session, &self.turn_id, &self.flusher);
            let mut deltas = Deltas {
                sink: self.sink.as_ref(),
                streamed: &self.streamed,
                feed: &feed,
                thinking,
                streamed_text: false,
                kept: self.irrevocable.then(String::new),
                first_at: None,
            };
            // What the turn has said so far (its `user.message` first of all) is committed while
            // the upstream works on the request if it has not answered when that is due, and
            // published before anything the model says.
            let provider = &self.inner.provider;
            let span = crate::telemetry::model_span(provider.name(), &req.model, attempt + 1);
            let call =
                tracing::Instrument::instrument(provider.complete(req, &mut deltas), span.clone());
            let (result, synced) = overlapped(call, self.sync(), self.sync_due(), &feed).await?;
            if !synced {
                // The upstream answered before a commit was due. What the turn said is
                // committed with what comes next, unless the turn is to wait (a retry's
                // backoff) or live subscribers are owed the fragments they would have seen
                // (they may follow only the events before them).
                if result.is_err() || (feed.holds_any() && self.session.watched()) {
                    self.sync().await?;
                    feed.release();
                } else {
                    feed.discard();
                }
            }
            crate::telemetry::model_done(
                &span,
                result
                    .as_ref()
                    .map(|o| o.usage)
                    .map_err(|e| e.message.as_str()),
            );
            let streamed = deltas.streamed_text;
            metered.call(sent, deltas.first_at, result.as_ref().ok().map(|o| o.usage));
            let kept = deltas.kept.take().filter(|t| !t.is_empty());
            match result {
                Ok(out) => {
                    // A terminal event's usage is `null` until a model call has answered.
                    self.model_called = true;
                    return Ok(out);
                }
                Err(e) => {
                    if let Some(end) = self.failed_attempt(&e, kept, streamed) {
                        return Err(end);
                    }
                    if !e.retryable || attempt >= retries {
                        tracing::warn!(turn = %self.turn_id, error = %e, "upstream call failed");
                        return Err(End::Failed(FailReason::ModelError, e.message));
                    }
                    attempt += 1;
                    let backoff = backoff(&e, attempt);
                    tracing::info!(turn = %self.turn_id, attempt, error = %e, ?backoff, "retrying the upstream call");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// What is logged after an attempt that failed: text the watcher shows and cannot take back
    /// is kept, and the turn ends (`Some`); text streamed otherwise is retracted (an empty
    /// `agent.message`) before a retry.
    fn failed_attempt(
        &mut self,
        e: &UpstreamError,
        kept: Option<String>,
        streamed: bool,
    ) -> Option<End> {
        if let Some(text) = kept {
            // The watcher already shows this text and cannot take it back: the log keeps it
            // too, and the turn ends here rather than retrying.
            self.emit(EventBody::AgentMessage {
                content: text,
                plan: false,
                compaction: false,
                replaces: None,
            });
            tracing::warn!(turn = %self.turn_id, error = %e, "upstream call failed after text was streamed to a client that cannot retract it");
            return Some(End::Failed(FailReason::ModelError, e.message.clone()));
        }
        if streamed {
            self.emit(EventBody::AgentMessage {
                content: String::new(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
        None
    }
}

/// How long to wait before retry `attempt` (from 1) after `e`: what the upstream asked for, or
/// 250 ms doubling per attempt; at most 30 s.
fn backoff(e: &UpstreamError, attempt: u32) -> Duration {
    e.retry_after
        .unwrap_or(Duration::from_millis(250 << attempt.min(5)))
        .min(Duration::from_secs(30))
}
