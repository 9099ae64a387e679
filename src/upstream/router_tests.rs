use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use super::*;
use crate::config::ProviderKind;
use crate::config::UpstreamConfig;
use crate::message::Usage;
use crate::upstream::{DeltaSink, ModelStop, Provider};

/// What a scripted provider does on one call.
#[derive(Clone)]
enum Step {
    Answer(&'static str),
    Fail(UpstreamErrorKind),
    /// Streams a fragment, then fails.
    FailAfterText(UpstreamErrorKind),
}

/// Answers from a script, recording the model of each call.
struct Scripted {
    steps: Mutex<Vec<Step>>,
    calls: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(steps: &[Step]) -> Arc<Scripted> {
        Arc::new(Scripted {
            steps: Mutex::new(steps.iter().rev().cloned().collect()),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Provider for Scripted {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn complete<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a mut dyn DeltaSink,
    ) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
        self.calls.lock().unwrap().push(req.model.clone());
        let step = self
            .steps
            .lock()
            .unwrap()
            .pop()
            .unwrap_or(Step::Answer("ok"));
        Box::pin(async move {
            match step {
                Step::Answer(text) => {
                    sink.text(text);
                    Ok(ModelOutput {
                        thinking: String::new(),
                        signed_thinking: Vec::new(),
                        text: text.to_string(),
                        tool_calls: Vec::new(),
                        usage: Usage::default(),
                        stop: ModelStop::EndTurn,
                    })
                }
                Step::Fail(kind) => Err(UpstreamError::new(kind, "failed")),
                Step::FailAfterText(kind) => {
                    sink.text("partial");
                    Err(UpstreamError::new(kind, "broke"))
                }
            }
        })
    }
}

fn config(name: &str, models: &[&str]) -> UpstreamConfig {
    UpstreamConfig {
        name: name.to_string(),
        provider: ProviderKind::Echo,
        base_url: String::new(),
        api_key_env: None,
        model: models.first().unwrap_or(&"any").to_string(),
        models: models.iter().map(|m| m.to_string()).collect(),
        max_tokens: None,
        timeout: Duration::from_secs(5),
        retries: 0,
        headers: Default::default(),
        max_in_flight: None,
        breaker_failures: 2,
        breaker_open: Duration::from_secs(3600),
        price: None,
    }
}

fn request(model: &str) -> ModelRequest {
    ModelRequest {
        model: model.to_string(),
        system: None,
        messages: Vec::new(),
        tools: Vec::new(),
        max_tokens: None,
        thinking: false,
        tuning: Default::default(),
    }
}

fn two(a: &Arc<Scripted>, b: &Arc<Scripted>, b_models: &[&str]) -> Router {
    Router::new(vec![
        Upstream::new(&config("primary", &["m1"]), a.clone()),
        Upstream::new(&config("fallback", b_models), b.clone()),
    ])
}

#[tokio::test]
async fn a_failure_before_any_fragment_falls_back_to_the_next_upstreams_default_model() {
    for kind in [
        UpstreamErrorKind::Connect,
        UpstreamErrorKind::Timeout,
        UpstreamErrorKind::Status(429),
        UpstreamErrorKind::Status(503),
    ] {
        let (a, b) = (
            Scripted::new(&[Step::Fail(kind.clone())]),
            Scripted::new(&[]),
        );
        let router = two(&a, &b, &["m2"]);
        let (out, model, _) = router.complete(&[], &request("m1")).await.unwrap();
        assert_eq!(
            (out.text.as_str(), model.as_str()),
            ("ok", "m2"),
            "{kind:?}"
        );
        assert_eq!(a.calls(), ["m1"]);
        assert_eq!(b.calls(), ["m2"]);
    }
}

#[tokio::test]
async fn a_request_error_or_a_failure_after_a_fragment_does_not_fall_back() {
    let (a, b) = (
        Scripted::new(&[Step::Fail(UpstreamErrorKind::Status(400))]),
        Scripted::new(&[]),
    );
    let router = two(&a, &b, &[]);
    assert!(router.complete(&[], &request("m1")).await.is_err());
    assert!(b.calls().is_empty());

    let (a, b) = (
        Scripted::new(&[Step::FailAfterText(UpstreamErrorKind::Stream)]),
        Scripted::new(&[]),
    );
    let router = two(&a, &b, &[]);
    let e = router.complete(&[], &request("m1")).await.unwrap_err();
    assert_eq!(e.message, "broke");
    assert!(b.calls().is_empty());
}

#[tokio::test]
async fn the_model_goes_to_the_upstream_that_serves_it_in_the_agents_order() {
    let (a, b) = (Scripted::new(&[]), Scripted::new(&[]));
    let router = two(&a, &b, &["m2"]);
    router.complete(&[], &request("m2")).await.unwrap();
    assert_eq!((a.calls().len(), b.calls()), (0, vec!["m2".to_string()]));
    // An agent naming only the fallback: every call goes there.
    router
        .complete(&["fallback".to_string()], &request("m1"))
        .await
        .unwrap();
    assert_eq!(b.calls(), ["m2", "m2"]);
    assert!(a.calls().is_empty());
}

#[tokio::test]
async fn an_open_breaker_is_skipped_while_another_answers_and_tried_when_none_does() {
    let fail = Step::Fail(UpstreamErrorKind::Status(503));
    let (a, b) = (
        Scripted::new(&[fail.clone(), fail.clone()]),
        Scripted::new(&[]),
    );
    let router = two(&a, &b, &[]);
    for _ in 0..3 {
        router.complete(&[], &request("m1")).await.unwrap();
    }
    assert_eq!(a.calls().len(), 2, "opened after 2 failures, then skipped");
    assert_eq!(b.calls().len(), 3);
    assert_eq!(router.status()[0].breaker, BreakerState::Open);
    // Only the primary for this agent: tried anyway.
    router
        .complete(&["primary".to_string()], &request("m1"))
        .await
        .unwrap();
    assert_eq!(a.calls().len(), 3);
    assert_eq!(router.status()[0].breaker, BreakerState::Closed);
}

#[tokio::test]
async fn retries_stay_on_the_upstream_then_fall_back() {
    let fail = Step::Fail(UpstreamErrorKind::Status(503));
    let (a, b) = (
        Scripted::new(&[fail.clone(), fail.clone()]),
        Scripted::new(&[]),
    );
    let mut primary = config("primary", &[]);
    primary.retries = 1;
    primary.breaker_failures = 10;
    let router = Router::new(vec![
        Upstream::new(&primary, a.clone()),
        Upstream::new(&config("fallback", &[]), b.clone()),
    ]);
    router.complete(&[], &request("m")).await.unwrap();
    assert_eq!((a.calls().len(), b.calls().len()), (2, 1));
}

#[tokio::test]
async fn a_full_upstream_is_passed_over_like_a_429() {
    let (a, b) = (Scripted::new(&[]), Scripted::new(&[]));
    let mut primary = config("primary", &[]);
    primary.max_in_flight = Some(1);
    let router = Router::new(vec![
        Upstream::new(&primary, a.clone()),
        Upstream::new(&config("fallback", &[]), b.clone()),
    ]);
    let mut route = router.route(&[], "m");
    let held = route.attempt().unwrap();
    assert_eq!(held.upstream(), "primary");
    assert_eq!(router.status()[0].in_flight, 1);
    let mut other = router.route(&["primary".to_string()], "m");
    let e = other.attempt().err().unwrap();
    assert!(e.message.contains("max_in_flight"), "{}", e.message);
    router.complete(&[], &request("m")).await.unwrap();
    assert_eq!((a.calls().len(), b.calls().len()), (0, 1));
    drop(held);
    assert_eq!(router.status()[0].in_flight, 0);
}

#[tokio::test]
async fn a_reloaded_router_keeps_the_breakers_of_unchanged_upstreams() {
    let fail = Step::Fail(UpstreamErrorKind::Status(503));
    let (a, b) = (
        Scripted::new(&[fail.clone(), fail.clone()]),
        Scripted::new(&[]),
    );
    let old = two(&a, &b, &[]);
    for _ in 0..2 {
        old.complete(&[], &request("m1")).await.unwrap();
    }
    assert_eq!(old.status()[0].breaker, BreakerState::Open);
    let kept = two(&a, &b, &[]).carry_over(&old, |_| true);
    assert_eq!(kept.status()[0].breaker, BreakerState::Open);
    let changed = two(&a, &b, &[]).carry_over(&old, |name| name != "primary");
    assert_eq!(changed.status()[0].breaker, BreakerState::Closed);
}
