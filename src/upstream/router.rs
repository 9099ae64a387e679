//! Several upstreams behind every model call: a model is routed to the upstream that serves it,
//! retried there on retryable failures, and falls back to the next upstream when that one
//! cannot answer — only while nothing of the answer has reached the caller's sink.
//!
//! A [`Route`] is one model call's way through the upstreams. Its plan is the agent's upstreams
//! (in their order) that serve the model asked for, then the others, each asked for its own
//! default model. An [`Attempt`] is one call of one upstream (see `attempt.rs`); its outcome
//! goes to the upstream's breaker (`breaker.rs`). After a failure,
//! [`Route::after`] says what comes next:
//!
//! - a retryable failure (connect error, 429, 5xx, broken stream) with retries left on this
//!   upstream: the same upstream again, after a backoff;
//! - else, when no fragment reached the sink and the failure is the upstream's trouble
//!   (connect error, timeout, 429, 5xx, broken stream): the next upstream of the plan;
//! - else the call fails with this error.
//!
//! An upstream at its `max_in_flight` is passed over as if it had answered 429; one whose
//! breaker is open is passed over while a later one of the plan admits the call, and is tried
//! anyway when none does (the breaker reorders, it never fails a call on its own: a lone
//! upstream behaves as if it had no breaker).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::attempt::Slot;
pub use super::attempt::{Attempt, Upstream};
use super::breaker::{trouble, Admit, BreakerState};
use super::{ModelOutput, ModelRequest, UpstreamError, UpstreamErrorKind};

/// An upstream's state, as `/status` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UpstreamStatus {
    pub name: String,
    pub provider: &'static str,
    /// Its default model.
    pub model: String,
    /// The models it serves; empty: any.
    pub models: Vec<String>,
    pub breaker: BreakerState,
    pub consecutive_failures: u32,
    pub in_flight: usize,
    pub max_in_flight: Option<usize>,
}

/// The upstreams, in file order.
pub struct Router {
    upstreams: Vec<Upstream>,
}

impl Router {
    /// A router over `upstreams` (at least one).
    pub fn new(upstreams: Vec<Upstream>) -> Router {
        Router { upstreams }
    }

    /// A reload: the upstreams that `same` says are unchanged since `old` (by name) take over
    /// `old`'s breaker and count of calls in flight, so that a reload neither forgets an
    /// upstream's trouble nor lets calls past its `max_in_flight`.
    pub fn carry_over(mut self, old: &Router, same: impl Fn(&str) -> bool) -> Router {
        for u in &mut self.upstreams {
            let Some(o) = old.upstreams.iter().find(|o| o.name == u.name) else {
                continue;
            };
            if same(&u.name) {
                u.breaker = o.breaker.clone();
                u.in_flight = o.in_flight.clone();
            }
        }
        self
    }

    /// Every upstream's state.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        let now = Instant::now();
        self.upstreams
            .iter()
            .map(|u| {
                let (breaker, consecutive_failures) = u.breaker.state(now);
                UpstreamStatus {
                    name: u.name.clone(),
                    provider: u.provider.name(),
                    model: u.model.clone(),
                    models: u.models.clone(),
                    breaker,
                    consecutive_failures,
                    in_flight: u.in_flight.load(Ordering::Acquire),
                    max_in_flight: u.max_in_flight,
                }
            })
            .collect()
    }

    /// The way of one call of `model` through the upstreams named in `order` (the agent's;
    /// empty or naming none of them: all, in file order).
    pub fn route<'r>(&'r self, order: &[String], model: &str) -> Route<'r> {
        // (Built in one vector: a call of a turn makes one route.)
        let named = |n: &String| self.upstreams.iter().find(|u| &u.name == n);
        let any_named = order.iter().any(|n| named(n).is_some());
        let each = |serving: bool, plan: &mut Vec<(&'r Upstream, bool)>| {
            let mut add = |u: &'r Upstream| {
                if Upstream::serves(u, model) == serving {
                    plan.push((u, serving));
                }
            };
            if any_named {
                order.iter().filter_map(named).for_each(&mut add);
            } else {
                self.upstreams.iter().for_each(&mut add);
            }
        };
        let mut plan = Vec::with_capacity(if any_named {
            order.len()
        } else {
            self.upstreams.len()
        });
        each(true, &mut plan);
        each(false, &mut plan);
        Route {
            plan,
            asked: model.to_string(),
            at: 0,
            from: 0,
            tries: 0,
            streamed: false,
            made: 0,
        }
    }

    /// One whole call with nothing streamed (a summary, a sampling request): retried and
    /// falling back like a turn's. The output, the model that gave it and its upstream.
    pub async fn complete(
        &self,
        order: &[String],
        req: &ModelRequest,
    ) -> Result<(ModelOutput, String, String), UpstreamError> {
        let mut route = self.route(order, &req.model);
        let mut attempt = route.attempt()?;
        loop {
            let result = attempt.complete(req, &mut super::NoDeltas).await;
            let e = match result {
                Ok(out) => {
                    let (model, upstream) = (attempt.model(), attempt.upstream());
                    return Ok((out, model.to_string(), upstream.to_string()));
                }
                Err(e) => e,
            };
            let upstream = attempt.upstream();
            match route.after(attempt, &e) {
                None => return Err(e),
                Some(Next::Retry(backoff)) => {
                    tracing::info!(%upstream, error = %e, ?backoff, "retrying the upstream call");
                    tokio::time::sleep(backoff).await;
                }
                Some(Next::Fallback) => {}
            }
            attempt = route.attempt().map_err(|_| e)?;
        }
    }
}

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The same upstream again, after this wait.
    Retry(Duration),
    /// The next upstream of the plan.
    Fallback,
}

/// One model call's way through the upstreams (see the [module documentation](self)).
pub struct Route<'r> {
    /// The upstreams in the order tried, each with whether it serves the model asked for
    /// (else it is asked for its own default model).
    plan: Vec<(&'r Upstream, bool)>,
    /// The model asked for.
    asked: String,
    /// The plan's upstream of the last attempt.
    at: usize,
    /// Where the next attempt looks first.
    from: usize,
    /// Failed attempts on the plan's `at`.
    tries: u32,
    /// A fragment reached the sink: the call stays on its upstream.
    streamed: bool,
    /// Attempts made.
    made: u32,
}

impl<'r> Route<'r> {
    /// The next attempt: the first upstream from where the route stands that has room and
    /// whose breaker admits the call, else the first with room; an error when every one is
    /// at its `max_in_flight`.
    pub fn attempt(&mut self) -> Result<Attempt<'r>, UpstreamError> {
        let end = if self.streamed {
            self.from + 1
        } else {
            self.plan.len()
        };
        let now = Instant::now();
        let mut closed_off = None;
        let mut full = Vec::new();
        for i in self.from..end.min(self.plan.len()) {
            let up = self.plan[i].0;
            let Some(slot) = up.slot() else {
                full.push(up.name.as_str());
                continue;
            };
            match up.breaker.admit(now) {
                Admit::Yes => return Ok(self.start(i, slot, false)),
                Admit::Probe => return Ok(self.start(i, slot, true)),
                Admit::No if closed_off.is_none() => closed_off = Some((i, slot)),
                Admit::No => {}
            }
        }
        if let Some((i, slot)) = closed_off {
            tracing::info!(upstream = %self.plan[i].0.name, "every upstream left for this call has its breaker open: trying this one anyway");
            return Ok(self.start(i, slot, false));
        }
        let mut e = UpstreamError::new(
            UpstreamErrorKind::Status(429),
            format!(
                "no upstream can take the call now: each is at its max_in_flight ({})",
                full.join(", ")
            ),
        );
        e.retryable = false;
        Err(e)
    }

    fn start(&mut self, i: usize, slot: Slot<'r>, probe: bool) -> Attempt<'r> {
        let (upstream, serves) = self.plan[i];
        let model = if serves {
            self.asked.clone()
        } else {
            upstream.model.clone()
        };
        if self.made > 0 && i != self.at {
            tracing::info!(upstream = %upstream.name, %model, "falling back to the next upstream");
        }
        if i != self.at {
            self.tries = 0;
        }
        if model != self.asked {
            tracing::info!(upstream = %upstream.name, asked = %self.asked, %model, "the upstream does not serve the model asked for: using its default model");
        }
        self.at = i;
        self.made += 1;
        Attempt::new(upstream, model, probe, self.tries + 1, slot)
    }

    /// After `attempt` failed with `e`: a retry, a fallback, or `None` to fail with `e`.
    pub fn after(&mut self, attempt: Attempt<'r>, e: &UpstreamError) -> Option<Next> {
        self.streamed |= attempt.streamed();
        drop(attempt);
        let up = self.plan[self.at].0;
        self.tries += 1;
        if e.retryable && self.tries <= up.retries {
            self.from = self.at;
            return Some(Next::Retry(backoff(e, self.tries)));
        }
        if self.streamed || !trouble(e) || self.at + 1 >= self.plan.len() {
            return None;
        }
        self.from = self.at + 1;
        Some(Next::Fallback)
    }
}

/// How long to wait before retry `n` (from 1) after `e`: what the upstream asked for, or
/// 250 ms doubling per retry; at most 30 s.
pub fn backoff(e: &UpstreamError, n: u32) -> Duration {
    e.retry_after
        .unwrap_or(Duration::from_millis(250 << n.min(5)))
        .min(Duration::from_secs(30))
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
