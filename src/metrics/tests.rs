use std::sync::Arc;
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;

use super::families::{hist, METRICS, TOOL_BUCKETS};
use super::tool_metrics::{NotRun, ToolMetrics};
use super::turn_metrics::upstream;

#[test]
fn a_tool_call_dropped_before_its_result_counts_as_cancelled() {
    let h = Arc::new(ToolMetrics {
        ok: Counter::default(),
        error: Counter::default(),
        cancelled: Counter::default(),
        denied: Counter::default(),
        refused: Counter::default(),
        expired: Counter::default(),
        seconds: hist(TOOL_BUCKETS),
    });
    h.clone().start().done(false);
    h.clone().start().done(true);
    drop(h.clone().start());
    h.not_run(NotRun::Denied);
    assert_eq!(
        [h.ok.get(), h.error.get(), h.cancelled.get(), h.denied.get()],
        [1, 1, 1, 1]
    );
}

#[test]
fn handles_are_resolved_once_per_name() {
    let a = upstream("echo", "unit-model");
    let b = upstream("echo", "unit-model");
    assert!(Arc::ptr_eq(&a, &b));
    a.call(
        Instant::now(),
        None,
        Some(crate::message::Usage {
            input_tokens: 3,
            output_tokens: 4,
            ..Default::default()
        }),
    );
    assert_eq!(b.input_tokens.get(), 3);
    let text = {
        let mut s = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut s, &METRICS.registry).unwrap();
        s
    };
    assert!(
        text.contains(
            "turnstile_upstream_input_tokens_total{provider=\"echo\",model=\"unit-model\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains("# TYPE turnstile_upstream_calls_total counter"),
        "{text}"
    );
    assert!(text.contains("turnstile_upstream_call_duration_seconds_bucket{le=\"+Inf\",provider=\"echo\",model=\"unit-model\"} 1") || text.contains("turnstile_upstream_call_duration_seconds_bucket{provider=\"echo\",model=\"unit-model\",le=\"+Inf\"} 1"), "{text}");
}
