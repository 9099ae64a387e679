//! The model call: the request built from the session's history, retries with backoff, and the
//! retraction of text streamed by an attempt that failed.

use std::sync::Arc;

use super::fragments::{overlapped, Deltas, FragmentFeed};
use super::{End, Turn};
use crate::log::{EventBody, FailReason};
use crate::message::{Message, Usage};
use crate::upstream::router::{Attempt, Next};
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
        let config = &self.config;
        ModelRequest {
            model: record
                .options
                .get("model")
                .cloned()
                .unwrap_or_else(|| config.default_model(agent).to_string()),
            system,
            messages,
            tools,
            max_tokens: None,
            thinking,
            tuning: Default::default(),
        }
    }

    pub(super) fn calibration(&self) -> Arc<crate::engine::context_window::Calibration> {
        self.session
            .extension::<crate::engine::context_window::Calibration>()
    }

    /// A summary call: nothing is streamed, failures are retried and fall back like any model
    /// call.
    pub(super) async fn summarise(&mut self, req: &ModelRequest) -> Result<ModelOutput, End> {
        let (router, config) = (self.router.clone(), self.config.clone());
        let record = self.session.record();
        let order = super::upstreams_of(&config, &record.agent);
        match router.complete(order, req).await {
            Ok((out, model, upstream)) => {
                self.model_called = true;
                self.spent(&record.agent, &upstream, &model, out.usage);
                Ok(out)
            }
            Err(e) => {
                tracing::warn!(turn = %self.turn_id, error = %e, "the summary call failed");
                Err(End::Failed(
                    FailReason::ModelError,
                    format!("compacting the conversation failed: {}", e.message),
                ))
            }
        }
    }

    /// One model call, retried on retryable failures and falling back to the agent's next
    /// upstream while nothing streamed (see `upstream::router`). Text streamed by an attempt
    /// that then fails is retracted with an empty `agent.message`.
    pub(super) async fn call_model(
        &mut self,
        req: &ModelRequest,
        thinking: bool,
    ) -> Result<ModelOutput, End> {
        let (router, config) = (self.router.clone(), self.config.clone());
        let record = self.session.record();
        let order = super::upstreams_of(&config, &record.agent);
        let mut route = router.route(order, &req.model);
        self.steps += 1;
        let failed = |e: UpstreamError| End::Failed(FailReason::ModelError, e.message);
        let mut attempt = route.attempt().map_err(failed)?;
        loop {
            let (result, kept, streamed) = self.one_attempt(&mut attempt, req, thinking).await?;
            let e = match result {
                Ok(out) => {
                    // A terminal event's usage is `null` until a model call has answered.
                    self.model_called = true;
                    self.spent(
                        &record.agent,
                        attempt.upstream(),
                        attempt.model(),
                        out.usage,
                    );
                    return Ok(out);
                }
                Err(e) => e,
            };
            if let Some(end) = self.failed_attempt(&e, kept, streamed) {
                return Err(end);
            }
            let upstream = attempt.upstream();
            match route.after(attempt, &e) {
                None => {
                    tracing::warn!(turn = %self.turn_id, %upstream, error = %e, "upstream call failed");
                    return Err(failed(e));
                }
                Some(Next::Retry(backoff)) => {
                    tracing::info!(turn = %self.turn_id, %upstream, error = %e, ?backoff, "retrying the upstream call");
                    tokio::time::sleep(backoff).await;
                }
                Some(Next::Fallback) => {
                    tracing::info!(turn = %self.turn_id, %upstream, error = %e, "the upstream failed before answering: falling back");
                }
            }
            attempt = match route.attempt() {
                Ok(a) => a,
                Err(_) => return Err(failed(e)),
            };
        }
    }

    /// A model call of the turn answered: its usage goes to the principal's ledger (and the
    /// store, queued before the events that report it).
    pub(super) fn spent(&self, agent: &str, upstream: &str, model: &str, usage: Usage) {
        let call = crate::usage::ModelCall {
            owner: self.session.owner.as_deref(),
            agent,
            upstream,
            model,
            usage,
        };
        self.inner.ledger.model_call(&self.config, call);
    }

    /// One attempt of a model call: its result, the text kept for a watcher that cannot
    /// retract it, and whether text was streamed.
    async fn one_attempt(
        &mut self,
        attempt: &mut Attempt<'_>,
        req: &ModelRequest,
        thinking: bool,
    ) -> Result<(Result<ModelOutput, UpstreamError>, Option<String>, bool), End> {
        let feed = FragmentFeed::new(&self.session, &self.turn_id, &self.flusher);
        let mut deltas = Deltas {
            sink: self.sink.as_ref(),
            streamed: &self.streamed,
            feed: &feed,
            thinking,
            streamed_text: false,
            kept: self.irrevocable.then(String::new),
        };
        // What the turn has said so far (its `user.message` first of all) is committed while
        // the upstream works on the request if it has not answered when that is due, and
        // published before anything the model says.
        let span = crate::telemetry::model_span(
            attempt.upstream(),
            attempt.provider(),
            attempt.model(),
            attempt.number(),
        );
        let call =
            tracing::Instrument::instrument(attempt.complete(req, &mut deltas), span.clone());
        let (result, synced) = overlapped(call, self.sync(), self.sync_due(), &feed).await?;
        if !synced {
            // The upstream answered before a commit was due. What the turn said is
            // committed with what comes next, unless the turn is to wait (a retry's
            // backoff) or live subscribers are owed the fragments they would have seen
            // (they may follow only the events before them).
            if result.is_err() || (feed.holds_any() && self.session.watched_anywhere()) {
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
        let kept = deltas.kept.take().filter(|t| !t.is_empty());
        Ok((result, kept, deltas.streamed_text))
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
