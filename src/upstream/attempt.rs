//! One upstream as the [router](super::router) holds it (its provider, models, in-flight count
//! and breaker), and one call of it: an [`Attempt`], which holds a slot of the upstream's
//! `max_in_flight`, watches the sink for the first fragment, records the call's metrics and
//! tells the breaker how it went.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::breaker::{trouble, Breaker};
use super::{DeltaSink, ModelOutput, ModelRequest, Provider, UpstreamError};
use crate::config::UpstreamConfig;

/// One upstream: its provider and what the router keeps of it.
pub struct Upstream {
    pub(super) name: String,
    pub(super) provider: Arc<dyn Provider>,
    /// Its default model.
    pub(super) model: String,
    /// The models it serves; empty: any.
    pub(super) models: Vec<String>,
    /// For a request that sets none.
    max_tokens: Option<u32>,
    pub(super) retries: u32,
    pub(super) max_in_flight: Option<usize>,
    /// Shared with the same upstream of the router a reload replaces (see
    /// [`super::router::Router::carry_over`]), as is its breaker.
    pub(super) in_flight: Arc<AtomicUsize>,
    pub(super) breaker: Arc<Breaker>,
}

impl Upstream {
    /// The upstream `config` describes, calling `provider`.
    pub fn new(config: &UpstreamConfig, provider: Arc<dyn Provider>) -> Upstream {
        Upstream {
            name: config.name.clone(),
            provider,
            model: config.model.clone(),
            models: config.models.clone(),
            max_tokens: config.max_tokens,
            retries: config.retries,
            max_in_flight: config.max_in_flight,
            in_flight: Arc::new(AtomicUsize::new(0)),
            breaker: Arc::new(Breaker::new(config.breaker_failures, config.breaker_open)),
        }
    }

    pub(super) fn serves(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// A slot of `max_in_flight`, or `None` when it is full.
    pub(super) fn slot(&self) -> Option<Slot<'_>> {
        let n = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.max_in_flight.is_some_and(|max| n >= max) {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(&self.in_flight))
    }
}

/// One call's place in an upstream's `in_flight`, given back when dropped.
pub(super) struct Slot<'r>(&'r AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One call of one upstream.
pub struct Attempt<'r> {
    upstream: &'r Upstream,
    model: String,
    /// It is its half-open breaker's probe.
    probe: bool,
    /// Its outcome went to the breaker.
    recorded: bool,
    /// When the first fragment reached the sink.
    first_at: Option<Instant>,
    /// Its number on this upstream (from 1).
    number: u32,
    _slot: Slot<'r>,
}

impl<'r> Attempt<'r> {
    /// A call of `upstream` for `model`, in `slot`: its half-open breaker's probe or not, the
    /// `number`th on this upstream.
    pub(super) fn new(
        upstream: &'r Upstream,
        model: String,
        probe: bool,
        number: u32,
        slot: Slot<'r>,
    ) -> Attempt<'r> {
        Attempt {
            upstream,
            model,
            probe,
            recorded: false,
            first_at: None,
            number,
            _slot: slot,
        }
    }

    /// The upstream's name.
    pub fn upstream(&self) -> &'r str {
        &self.upstream.name
    }

    /// Whether a fragment reached the sink.
    pub fn streamed(&self) -> bool {
        self.first_at.is_some()
    }

    /// The provider's name (`openai`, ...).
    pub fn provider(&self) -> &'static str {
        self.upstream.provider.name()
    }

    /// The model it asks for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Its number on this upstream, from 1.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Makes the call (`req` with this attempt's model, and the upstream's `max_tokens` when
    /// it sets none), its fragments passed on to `sink`; records its metrics and tells the
    /// breaker how it went.
    pub async fn complete(
        &mut self,
        req: &ModelRequest,
        sink: &mut dyn DeltaSink,
    ) -> Result<ModelOutput, UpstreamError> {
        let metered = crate::metrics::upstream(self.provider(), &self.model);
        let sent = Instant::now();
        let mut watch = Watch {
            sink,
            first_at: None,
        };
        let provider = &self.upstream.provider;
        let max_tokens = req.max_tokens.or(self.upstream.max_tokens);
        let result = if req.model == self.model && req.max_tokens == max_tokens {
            provider.complete(req, &mut watch).await
        } else {
            let mut req = req.clone();
            req.model.clone_from(&self.model);
            req.max_tokens = max_tokens;
            provider.complete(&req, &mut watch).await
        };
        self.first_at = watch.first_at;
        metered.call(sent, self.first_at, result.as_ref().ok().map(|o| o.usage));
        let ok = result.as_ref().err().is_none_or(|e| !trouble(e));
        if self.upstream.breaker.record(ok, self.probe, Instant::now()) {
            tracing::warn!(upstream = %self.upstream.name, "circuit breaker opened: the upstream is skipped while another can answer");
        }
        self.recorded = true;
        match &result {
            Ok(_) => {
                tracing::debug!(upstream = %self.upstream.name, model = %self.model, "model call answered")
            }
            Err(e) => {
                tracing::debug!(upstream = %self.upstream.name, model = %self.model, error = %e, "model call failed")
            }
        }
        result
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.probe && !self.recorded {
            self.upstream.breaker.abandon();
        }
    }
}

/// Passes fragments on, noting when the first came.
struct Watch<'s> {
    sink: &'s mut dyn DeltaSink,
    first_at: Option<Instant>,
}

impl DeltaSink for Watch<'_> {
    fn text(&mut self, fragment: &str) {
        self.first_at.get_or_insert_with(Instant::now);
        self.sink.text(fragment);
    }

    fn thinking(&mut self, fragment: &str) {
        self.first_at.get_or_insert_with(Instant::now);
        self.sink.thinking(fragment);
    }
}
