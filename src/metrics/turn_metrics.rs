//! The metrics of turns (per agent) and of upstream model calls (per provider and model).

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::families::{AgentLabels, CallLabels, Handles, ModelLabels, TurnLabels, METRICS};

/// The turn metrics resolved so far, by agent.
static BY_AGENT: LazyLock<Handles<TurnMetrics>> = LazyLock::new(Handles::default);
/// The upstream metrics resolved so far, by provider and model.
static BY_MODEL: LazyLock<Handles<Upstream>> = LazyLock::new(Handles::default);

/// The turn metrics of one agent.
pub(crate) struct TurnMetrics {
    completed: Counter,
    failed: Counter,
    cancelled: Counter,
    seconds: Histogram,
}

/// How a turn ended, as `turnstile_turns_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnOutcome {
    Completed,
    Failed,
    Cancelled,
}

/// The handle of `agent`'s turn metrics.
pub(crate) fn turns(agent: &str) -> Arc<TurnMetrics> {
    let m = &*METRICS;
    BY_AGENT.get("", agent, || {
        let c = |outcome| {
            m.turns.get_or_create_owned(&TurnLabels {
                agent: agent.to_string(),
                outcome,
            })
        };
        TurnMetrics {
            completed: c("completed"),
            failed: c("failed"),
            cancelled: c("cancelled"),
            seconds: m.turn_seconds.get_or_create_owned(&AgentLabels {
                agent: agent.to_string(),
            }),
        }
    })
}

impl TurnMetrics {
    /// A turn ended; `ran`: how long it ran (`None` for a queued turn that never started).
    pub(crate) fn ended(&self, outcome: TurnOutcome, ran: Option<Duration>) {
        match outcome {
            TurnOutcome::Completed => &self.completed,
            TurnOutcome::Failed => &self.failed,
            TurnOutcome::Cancelled => &self.cancelled,
        }
        .inc();
        if let Some(ran) = ran {
            self.seconds.observe(ran.as_secs_f64());
        }
    }
}

/// The upstream metrics of one provider and model.
pub(crate) struct Upstream {
    ok: Counter,
    error: Counter,
    first_token: Histogram,
    seconds: Histogram,
    pub(super) input_tokens: Counter,
    output_tokens: Counter,
}

/// The handle of the upstream metrics for `model` at `provider`.
pub(crate) fn upstream(provider: &'static str, model: &str) -> Arc<Upstream> {
    let m = &*METRICS;
    BY_MODEL.get(provider, model, || {
        let labels = ModelLabels {
            provider,
            model: model.to_string(),
        };
        let call = |outcome| {
            m.upstream_calls.get_or_create_owned(&CallLabels {
                provider,
                model: model.to_string(),
                outcome,
            })
        };
        Upstream {
            ok: call("ok"),
            error: call("error"),
            first_token: m.first_token_seconds.get_or_create_owned(&labels),
            seconds: m.upstream_seconds.get_or_create_owned(&labels),
            input_tokens: m.input_tokens.get_or_create_owned(&labels),
            output_tokens: m.output_tokens.get_or_create_owned(&labels),
        }
    })
}

impl Upstream {
    /// One call ended: sent at `started`, first fragment at `first` (if any streamed), with
    /// the usage it reported when it succeeded.
    pub(crate) fn call(
        &self,
        started: Instant,
        first: Option<Instant>,
        usage: Option<crate::message::Usage>,
    ) {
        let took = started.elapsed();
        self.seconds.observe(took.as_secs_f64());
        let first = first.map_or(took, |f| f.saturating_duration_since(started));
        self.first_token.observe(first.as_secs_f64());
        match usage {
            Some(u) => {
                self.ok.inc();
                self.input_tokens.inc_by(u.input_tokens);
                self.output_tokens.inc_by(u.output_tokens);
            }
            None => {
                self.error.inc();
            }
        }
    }
}
