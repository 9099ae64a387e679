//! Logs and traces: the subscriber, the spans of a request, a turn, a model call and a tool call,
//! and the INFO line each request and each turn ends with.
//!
//! The span tree of a turn: `request` → `turn` → `model_call` (one per attempt) and `tool_call`
//! (one per server tool call). A turn runs on a task of its own (or its watcher's, see
//! `engine/run_by_watcher.rs`): its span is made from the parent its job carries (the span current when
//! it was started), never from wherever it happens to be polled. Field names are the same in the
//! log lines and, with the `otlp` feature, in the exported spans.
//!
//! Spans are exported over OTLP/HTTP (protobuf) when the binary is built with the `otlp` feature
//! and `[telemetry] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set; otherwise they only
//! give log lines their context.

use std::io::IsTerminal;
use std::time::Duration;

use tracing::field::Empty;
use tracing::Span;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::TelemetryConfig;

/// The span of one HTTP request. `route` is the route's template (`/sessions/{id}/turns`), never
/// the raw path; `session` the session the path names, if any. `principal` (the owner id of the
/// caller's key), `turn`, `status` and `duration_ms` are recorded later.
pub fn request_span(method: &str, route: &'static str, session: Option<&str>) -> Span {
    tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        %method,
        %route,
        session = session.map(tracing::field::display),
        principal = Empty,
        turn = Empty,
        status = Empty,
        duration_ms = Empty,
        otel.status_code = Empty,
    )
}

/// The request's answer: its status and how long it took to answer (to the head of the
/// response: a streamed body goes on after it) on the span, and its log line: INFO, or DEBUG for
/// the probes (`quiet`: `/healthz`, `/metrics`) that would otherwise flood the log.
pub fn request_done(span: &Span, quiet: bool, status: u16, took: Duration) {
    let duration_ms = millis(took);
    {
        let _in = span.enter();
        if quiet {
            tracing::debug!(status, duration_ms, "request");
        } else {
            tracing::info!(status, duration_ms, "request");
        }
    }
    span.record("status", status);
    span.record("duration_ms", duration_ms);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// Notes who calls on the request's span (the current one): the owner id of its key's principal
/// (`key:NAME`, or the digest of an `api_keys_env` key); nothing without keys.
pub fn note_principal(owner: Option<&str>) {
    if let Some(owner) = owner {
        Span::current().record("principal", tracing::field::display(owner));
    }
}

/// Notes the turn a request started on the request's span (the current one; a no-op elsewhere).
pub fn note_turn(turn: &str) {
    Span::current().record("turn", tracing::field::display(turn));
}

/// The span of one turn, a child of `parent` (the span current when the turn was started),
/// naming the session's principal (its owner id; a queued turn may run long after, and apart
/// from, the request that sent it). What it ends with is recorded by [`turn_done`].
pub fn turn_span(
    parent: &Span,
    session: &str,
    turn: &str,
    agent: &str,
    principal: Option<&str>,
) -> Span {
    tracing::info_span!(
        parent: parent,
        "turn",
        %session,
        %turn,
        %agent,
        principal = principal.map(tracing::field::display),
        outcome = Empty,
        reason = Empty,
        steps = Empty,
        tokens_in = Empty,
        tokens_out = Empty,
        duration_ms = Empty,
    )
}

/// How a turn ended, for [`turn_done`].
pub struct TurnEnd<'a> {
    /// `completed`, `cancelled` or `failed`.
    pub outcome: &'static str,
    /// The stop reason (`end_turn`, `tool_use`, ...) or the failure's reason (`timeout`, ...).
    pub reason: &'a str,
    /// Model calls made (retries not counted).
    pub steps: u32,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// MCP servers' sampling requests answered from the upstream (their tokens are counted in
    /// `tokens_in`/`tokens_out`).
    pub sampling_calls: u32,
    pub took: Duration,
}

/// A turn's end: recorded on its span (the current one) and logged at INFO.
pub fn turn_done(end: &TurnEnd<'_>) {
    let duration_ms = millis(end.took);
    tracing::info!(
        outcome = %end.outcome,
        reason = %end.reason,
        steps = end.steps,
        tokens_in = end.tokens_in,
        tokens_out = end.tokens_out,
        sampling_calls = end.sampling_calls,
        duration_ms,
        "turn ended"
    );
    let span = Span::current();
    span.record("outcome", tracing::field::display(end.outcome));
    span.record("reason", tracing::field::display(end.reason));
    span.record("steps", end.steps);
    span.record("tokens_in", end.tokens_in);
    span.record("tokens_out", end.tokens_out);
    span.record("duration_ms", duration_ms);
}

/// The span of one model call attempt (`attempt` counts from 1 on each upstream), a child of
/// the current (turn) span: which upstream and model answered; `outcome` and the tokens are
/// recorded by [`model_done`].
pub fn model_span(upstream: &str, provider: &str, model: &str, attempt: u32) -> Span {
    tracing::info_span!(
        "model_call",
        otel.kind = "client",
        %upstream,
        %provider,
        %model,
        attempt,
        outcome = Empty,
        tokens_in = Empty,
        tokens_out = Empty,
        otel.status_code = Empty,
    )
}

/// A model call's end, on its span: `ok` with its tokens, or the error.
pub fn model_done(span: &Span, result: Result<crate::message::Usage, &str>) {
    match result {
        Ok(usage) => {
            span.record("outcome", tracing::field::display("ok"));
            span.record("tokens_in", usage.input_tokens);
            span.record("tokens_out", usage.output_tokens);
        }
        Err(e) => {
            span.record("outcome", tracing::field::display(e));
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// The span of one server tool call, a child of the current (turn) span: the MCP server (or
/// `builtin`), the tool's own name there and the operator's verdict. `outcome` (`ok` or `error`)
/// is recorded when it returns.
pub fn tool_span(server: &str, tool: &str, verdict: &str) -> Span {
    tracing::info_span!("tool_call", server, tool, verdict, outcome = Empty,)
}

/// The snake_case name a serde enum is written as (a verdict, a stop reason).
pub fn snake<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "unknown".into(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where spans are exported to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OtlpTarget {
    /// `[telemetry] otlp_endpoint`: the collector's OTLP/HTTP base (`/v1/traces` is added).
    Config(String),
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), read by the
    /// exporter with the other standard `OTEL_EXPORTER_OTLP_*` variables.
    Env,
}

impl OtlpTarget {
    /// The config's endpoint first, else the standard variables; `None`: no export.
    pub fn resolve(config: &TelemetryConfig) -> Option<OtlpTarget> {
        if let Some(url) = config.otlp_endpoint.as_deref().filter(|s| !s.is_empty()) {
            return Some(OtlpTarget::Config(traces_url(url)));
        }
        let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .then_some(OtlpTarget::Env)
    }
}

/// An OTLP/HTTP base URL's traces path (as the standard variable is read).
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    }
}

/// Keeps the exporter of a process's spans; [`Telemetry::shutdown`] sends what it still holds.
#[derive(Default)]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Send the spans not yet exported (waits up to a few seconds). Runs the export on the
    /// runtime given to [`init`], which must still be running.
    pub fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                eprintln!("turnstile: could not send the last spans: {e}");
            }
        }
    }
}

/// Fields as the default text format writes them (`name=value`, the message bare), without
/// the `otel.*` ones (span names and kinds for the exporter, noise in a log line).
struct TextFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visit = TextVisit {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visit);
        visit.result
    }

    fn add_fields(
        &self,
        current: &'w mut tracing_subscriber::fmt::FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let mut more = String::new();
        self.format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut more),
            fields,
        )?;
        if !more.is_empty() {
            if !current.fields.is_empty() {
                current.fields.push(' ');
            }
            current.fields.push_str(&more);
        }
        Ok(())
    }
}

struct TextVisit<'a, 'w> {
    writer: &'a mut tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for TextVisit<'_, '_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("otel.") {
            return;
        }
        let space = if self.first { "" } else { " " };
        self.first = false;
        self.result = if name == "message" {
            write!(self.writer, "{space}{value:?}")
        } else {
            write!(self.writer, "{space}{name}={value:?}")
        };
    }
}

/// Install the process's subscriber: log lines to stderr (text, with colour only on a terminal,
/// or JSON), filtered by `RUST_LOG` (default `info,rmcp=warn`), and the span export if `otlp`
/// says where. `runtime` runs the exporter's HTTP calls.
pub fn init(
    json: bool,
    otlp: Option<OtlpTarget>,
    runtime: &tokio::runtime::Handle,
) -> Result<Telemetry, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let ansi = !json && std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.fmt_fields(TextFields).with_filter(filter).boxed()
    };
    #[cfg(feature = "otlp")]
    {
        let (layer, provider) = match otlp {
            Some(target) => {
                let (layer, provider) = otlp::layer(&target, runtime.clone())?;
                (Some(layer), Some(provider))
            }
            None => (None, None),
        };
        tracing_subscriber::registry()
            .with(fmt)
            .with(layer)
            .try_init()
            .map_err(|e| e.to_string())?;
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = runtime;
        tracing_subscriber::registry()
            .with(fmt)
            .try_init()
            .map_err(|e| e.to_string())?;
        if let Some(target) = otlp {
            tracing::warn!(
                ?target,
                "an OTLP endpoint is set but this build has no OTLP export (built without the `otlp` feature): no spans are exported"
            );
        }
        Ok(Telemetry::default())
    }
}

#[cfg(feature = "otlp")]
pub mod otlp {
    //! The OTLP/HTTP span exporter, sending with hyper (the client turnstile already has) on
    //! the server's runtime: no reqwest, no gRPC stack.

    use std::future::Future;
    use std::pin::Pin;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, Limited};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_http::{HttpClient, HttpError, Request, Response};
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    use super::OtlpTarget;

    /// How long one export may take.
    const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
    /// The most of a collector's answer read.
    const ANSWER_MAX: usize = 64 * 1024;

    /// The layer that turns spans into OTLP spans, and the provider that batches and sends
    /// them (keep it; shut it down at exit).
    pub fn layer<S>(
        target: &OtlpTarget,
        runtime: tokio::runtime::Handle,
    ) -> Result<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider), String>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let client = Client {
            inner: crate::outbound::https_client(Some(Duration::from_secs(5))),
            runtime,
        };
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_timeout(EXPORT_TIMEOUT);
        if let OtlpTarget::Config(url) = target {
            builder = builder.with_endpoint(url.clone());
        }
        let exporter = builder
            .build()
            .map_err(|e| format!("the OTLP exporter could not be made: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("turnstile")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("turnstile");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("turnstile", tracing::Level::INFO),
            );
        Ok((Box::new(layer), provider))
    }

    /// Sends an export on the server's runtime (the exporter calls from a thread of its own).
    #[derive(Debug)]
    struct Client {
        inner: crate::outbound::HttpsClient,
        runtime: tokio::runtime::Handle,
    }

    impl HttpClient for Client {
        fn send_bytes<'a, 'b>(
            &'a self,
            request: Request<Bytes>,
        ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
        where
            'a: 'b,
            Self: 'b,
        {
            let client = self.inner.clone();
            let call = async move {
                let answer = client.request(request.map(Full::new)).await?;
                let (head, body) = answer.into_parts();
                let body = Limited::new(body, ANSWER_MAX).collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(head, body))
            };
            // Made on the runtime: a timer needs one.
            let task = self
                .runtime
                .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, call).await });
            Box::pin(async move {
                match task.await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(_)) => Err("the OTLP export timed out".into()),
                    Err(e) => Err(e.into()),
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_endpoint_is_the_base_url() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://c:4318".into()),
        };
        assert_eq!(
            OtlpTarget::resolve(&config),
            Some(OtlpTarget::Config("http://c:4318/v1/traces".into()))
        );
    }

    #[test]
    fn serde_names() {
        assert_eq!(snake(&crate::config::Verdict::Trust), "trust");
        assert_eq!(snake(&crate::log::StopReason::EndTurn), "end_turn");
    }
}
