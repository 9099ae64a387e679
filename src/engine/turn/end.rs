//! How a turn ends: the wrap-up call when its time is up, and its terminal event, made durable
//! before anyone sees it, after which the next queued turn takes the session.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{next_queued, to_watcher, End, Turn};
use crate::engine::turn_job::{StopCause, TurnControl};
use crate::log::{EventBody, FailReason, StopReason};
use crate::message::Message;
use crate::tools::ToolOutput;

/// What the model is told when `turn_timeout_s` has passed (its last call has no tools).
const WRAP_UP: &str = "The time for this task is up. Do not call tools. Conclude now: say briefly what was done, what was found, and what is left undone.";

impl Turn {
    /// `turn_timeout_s` has passed: the calls still running are answered `Cancelled.`, text
    /// streamed by a model call cut off is retracted, and the model gets one last call, with no
    /// tools, asked to conclude, within `wrap_up_s`. The turn then ends as that call does; it
    /// fails `timeout` only if the call fails or does not answer in time.
    pub(super) async fn wrap_up(
        &mut self,
        timeout: Duration,
        within: Duration,
    ) -> Result<StopReason, End> {
        let failed = |why: String| {
            End::Failed(
                FailReason::Timeout,
                format!(
                    "the turn ran longer than turn_timeout_s ({} s) and could not wrap up: {why}",
                    timeout.as_secs()
                ),
            )
        };
        tracing::info!(turn = %self.turn_id, timeout_s = timeout.as_secs(), "turn_timeout_s passed: the turn wraps up");
        self.retract_streamed();
        for id in std::mem::take(&mut self.open) {
            self.emit_result(&id, ToolOutput::error("Cancelled."));
        }
        // What the turn stopped on (calls for the client) stays for the client: only a turn
        // that was still running reaches here, with none.
        self.stop_on.clear();
        self.asked.clear();
        self.flight = None;
        let record = self.session.record();
        let config = self.config.clone();
        let Some(agent) = config.agent(&record.agent) else {
            return Err(failed("the session's agent is no longer configured".into()));
        };
        self.extra = vec![Message::User {
            content: crate::message::Content::Text(WRAP_UP.into()),
        }];
        let req = self.request(agent, &record, Vec::new(), false);
        let out = match tokio::time::timeout(within, self.call_model(&req, false)).await {
            Ok(Ok(out)) => out,
            Ok(Err(End::Failed(_, why))) => return Err(failed(why)),
            Ok(Err(end)) => return Err(end),
            Err(_) => {
                self.retract_streamed();
                return Err(failed(format!(
                    "the last model call did not answer within wrap_up_s ({} s)",
                    within.as_secs()
                )));
            }
        };
        self.usage.add(out.usage);
        if !out.text.is_empty() {
            self.emit(EventBody::AgentMessage {
                content: out.text.clone(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
        match out.stop {
            crate::upstream::ModelStop::MaxTokens => Ok(StopReason::MaxTokens),
            crate::upstream::ModelStop::Refusal => Ok(StopReason::Refusal),
            _ if out.text.trim().is_empty() => {
                Err(failed("the model's last call said nothing".into()))
            }
            _ => Ok(StopReason::EndTurn),
        }
    }

    /// Text streamed by a model call cut off (no event stored since) is retracted: an empty
    /// `agent.message`.
    fn retract_streamed(&mut self) {
        if self
            .streamed
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            self.emit(EventBody::AgentMessage {
                content: String::new(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
    }

    /// The terminal event of a turn that ended so; a turn that ended early first answers its
    /// open calls `Cancelled.`.
    fn terminal(&mut self, result: Result<StopReason, End>, control: &TurnControl) -> EventBody {
        // MCP servers' sampling calls are the turn's model calls too.
        let sampled = self.sampler.tally();
        self.usage.add(sampled.usage);
        let agent = self.session.record().agent.clone();
        for (upstream, model, usage) in &sampled.answered {
            self.spent(&agent, upstream, model, *usage);
        }
        self.model_called |= sampled.calls > 0;
        let usage = self.model_called.then_some(self.usage);
        match result {
            Ok(stop_reason) => EventBody::TurnCompleted { usage, stop_reason },
            Err(end) => {
                for id in std::mem::take(&mut self.open) {
                    self.emit_result(&id, ToolOutput::error("Cancelled."));
                }
                match end {
                    End::Stopped if control.cause() == Some(StopCause::Shutdown) => {
                        EventBody::TurnFailed {
                            reason: FailReason::WorkerShutdown,
                            usage,
                            message: Some("the server is shutting down".into()),
                        }
                    }
                    End::Stopped => EventBody::TurnCancelled { usage },
                    End::Failed(reason, message) => EventBody::TurnFailed {
                        reason,
                        usage,
                        message: Some(message),
                    },
                }
            }
        }
    }

    /// The turn's end in its agent's metrics and in its span and log line.
    fn note_end(&self, terminal: &EventBody) {
        use crate::metrics::TurnOutcome;
        let outcome = match terminal {
            EventBody::TurnCompleted { .. } => TurnOutcome::Completed,
            EventBody::TurnCancelled { .. } => TurnOutcome::Cancelled,
            _ => TurnOutcome::Failed,
        };
        self.metrics
            .0
            .ended(outcome, Some(self.metrics.1.elapsed()));
        let (outcome, reason) = match &terminal {
            EventBody::TurnCompleted { stop_reason, .. } => {
                ("completed", crate::telemetry::snake(stop_reason))
            }
            EventBody::TurnFailed { reason, .. } => ("failed", crate::telemetry::snake(reason)),
            _ => ("cancelled", String::new()),
        };
        crate::telemetry::turn_done(&crate::telemetry::TurnEnd {
            outcome,
            reason: &reason,
            steps: self.steps,
            tokens_in: self.usage.input_tokens,
            tokens_out: self.usage.output_tokens,
            sampling_calls: self.sampler.tally().calls,
            took: self.metrics.1.elapsed(),
        });
    }

    /// The watcher hears the end, then the next queued turn runs; when none is queued, the
    /// session's lease goes back first (a shared store: the client's next turn may go to any
    /// instance).
    async fn hand_over(
        &self,
        published: Vec<std::sync::Arc<crate::log::Event>>,
        next: Option<crate::engine::turn_job::Job>,
    ) {
        crate::engine::scaleout::turn_ended(&self.inner, &self.session, next.is_some()).await;
        to_watcher(self.sink.as_ref(), published);
        let Some(job) = next else { return };
        if self.inner.is_shutting_down() {
            // Not begun: its row in the inbox stays, and the turn is carried out after the
            // restart (or, on a shared store, by the instance that takes the session next).
            tracing::info!(turn = %job.control.turn_id, "a queued turn is left to run after the restart");
            return;
        }
        super::spawn(&self.inner, self.session.clone(), job);
    }

    /// Write the terminal event, make it durable, then let everyone see it.
    pub(super) async fn finish(mut self, result: Result<StopReason, End>, control: &TurnControl) {
        let terminal = self.terminal(result, control);
        self.note_end(&terminal);
        let mut stop_on = std::mem::take(&mut self.stop_on);
        let asked = std::mem::take(&mut self.asked);
        let store = &self.inner.store;
        // After a failed commit the terminal event is not written with the rest: it would go
        // into the log after a hole, perhaps with no start of its turn before it.
        let completed = matches!(terminal, EventBody::TurnCompleted { .. });
        let lost = self.session.lost_writes(store);
        if !lost {
            let mut st = self.session.lock();
            let stopped = matches!(terminal, EventBody::TurnCompleted { .. });
            self.session
                .append_locked(&mut st, store, &self.turn_id, terminal);
            if stopped && !stop_on.is_empty() {
                let session = &self.session;
                crate::engine::approvals::paused(
                    &self.inner,
                    session,
                    &mut st,
                    &mut stop_on,
                    asked,
                );
            }
            st.wait_on_calls(stop_on);
            // Calls waiting on questions wait on in the session (dropped: cancelled).
            st.hold_flight(self.flight.take().filter(|_| stopped));
        }
        let flushed = store.flush().await;
        if let Err(e) = &flushed {
            tracing::error!(turn = %self.turn_id, error = %e, "the turn's events could not be made durable");
        }
        // A failed commit: the session is rebuilt from the log, read now that every write of
        // the turn has been through a commit, and the turn closed there if it is open.
        let lost = lost || self.session.lost_writes(store);
        let copy = if lost {
            self.session.read_back(store).await
        } else {
            None
        };
        if lost && copy.is_none() {
            // The log cannot be read either (the store unreachable): the turn is closed there
            // once it can be, by itself, unless the session's next turn does it first.
            let session = Arc::downgrade(&self.session);
            tokio::spawn(repair_when_back(session, store.clone()));
        }
        // Under one lock: the terminal event reaches subscribers before anything of the next
        // turn, and the next queued turn takes the session.
        let (published, next) = {
            let mut st = self.session.lock();
            st.turn_ended(&self.turn_id);
            if self.proposed && !completed {
                // A plan whose turn did not complete waits for nothing.
                st.drop_plan();
            }
            let mut published = self.session.publish_durable_locked(&mut st, store);
            if let Some(copy) = copy {
                let why = flushed.err().map_or_else(
                    || "the event log could not be written".to_string(),
                    |e| format!("the event log could not be written: {e}"),
                );
                published.extend(self.session.rebuild_locked(
                    &mut st,
                    store,
                    &copy,
                    &self.turn_id,
                    &why,
                ));
            }
            (
                published,
                next_queued(&self.session, &mut st, &self.inner.store),
            )
        };
        self.hand_over(published, next).await;
        self.session.turn_over();
        // Paused on permissions: their expiry is timed from now on.
        crate::engine::approvals::settle(&self.inner, &self.session).await;
    }
}

/// How long a session whose last turn could not be closed in the log (the store unreachable)
/// is tried again for, and the longest pause between tries.
const REPAIR_FOR: Duration = Duration::from_secs(3600);
const REPAIR_EVERY: Duration = Duration::from_secs(2);

/// Tries, with a growing pause, to read the session back and close its last turn in the log
/// ([`crate::engine::session::Session::repair`]) until it can, the session is gone, or a turn
/// runs on it (whose start does the same).
async fn repair_when_back(
    session: Weak<crate::engine::session::Session>,
    store: crate::log::Store,
) {
    let why = "the event log could not be written when the turn ended";
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    while started.elapsed() < REPAIR_FOR {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(REPAIR_EVERY);
        let Some(session) = session.upgrade() else {
            return;
        };
        if session.repair(&store, why, true).await.is_ok() {
            tracing::info!(session = %session.id, "the session was read back from the log once the store was back");
            return;
        }
    }
}
