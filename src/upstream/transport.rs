//! The HTTP plumbing the streaming providers share, so it is written (and fixed) once.
//!
//! [`openai`](super::openai) and [`anthropic`](super::anthropic) speak different protocols over
//! the same transport: connections the calling task drives itself ([`crate::outbound::http1`]), a JSON
//! `POST` answered by an event stream (or, from a server that ignored `stream`, a whole JSON
//! document), errors read from bounded bodies, a call bounded by a timeout and a connection
//! handed back to the pool afterwards. That transport lives here; what each provider sends and
//! how it reads the events stays in its own file.
//!
//! Connections are made by [`crate::outbound::connector`], the one connector of every outbound
//! connection (the providers', the MCP HTTP client's, the OTLP exporter's).

use std::time::Duration;

use crate::outbound::http1::{Body, CallError, Pool};
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::Full;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::errors::{error_chain, read_capped, status_error};
use super::{DeltaSink, ModelOutput, ModelStop, UpstreamError, UpstreamErrorKind};
use crate::outbound::event_stream::{SseError, SseParser, DEFAULT_MAX_EVENT_BYTES};

pub(crate) use super::errors::{body_message, error_text, error_type_of, preview};
use crate::message::{ToolCall, Usage};

/// A provider's settings that retrying cannot fix (a bad base URL or key): a non-retryable
/// `Connect` error, reported when a call is made rather than when the provider is built.
fn config_error(message: &str) -> UpstreamError {
    let mut e = UpstreamError::new(UpstreamErrorKind::Connect, message);
    e.retryable = false;
    e
}

/// The upstream sent something that is not its protocol: the error every parse failure becomes.
pub(crate) fn protocol(message: impl Into<String>) -> UpstreamError {
    UpstreamError::new(UpstreamErrorKind::Protocol, message)
}

/// The part of an answer both protocols accumulate alike: the text and thinking (each fragment
/// pushed to the sink as it is added), the usage, and the byte count that bounds the whole answer
/// (tool calls included, through [`Collected::grow`]). Each provider's accumulator holds one.
#[derive(Default)]
pub(crate) struct Collected {
    pub(crate) text: String,
    pub(crate) thinking: String,
    pub(crate) usage: Usage,
    bytes: usize,
}

impl Collected {
    /// Counts `n` more bytes of the answer, failing once it exceeds `MAX_OUTPUT_BYTES`.
    pub(crate) fn grow(&mut self, n: usize) -> Result<(), UpstreamError> {
        /// The most text + thinking + tool arguments one call may accumulate.
        const MAX_OUTPUT_BYTES: usize = 64 * 1024 * 1024;
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > MAX_OUTPUT_BYTES {
            return Err(protocol(format!(
                "the upstream's answer exceeds {MAX_OUTPUT_BYTES} bytes"
            )));
        }
        Ok(())
    }

    /// Adds a text fragment (an empty one is no fragment).
    pub(crate) fn text(&mut self, t: &str, sink: &mut dyn DeltaSink) -> Result<(), UpstreamError> {
        self.fragment(false, t, sink)
    }

    /// Adds a thinking fragment (an empty one is no fragment).
    pub(crate) fn thinking(
        &mut self,
        t: &str,
        sink: &mut dyn DeltaSink,
    ) -> Result<(), UpstreamError> {
        self.fragment(true, t, sink)
    }

    fn fragment(
        &mut self,
        thinking: bool,
        t: &str,
        sink: &mut dyn DeltaSink,
    ) -> Result<(), UpstreamError> {
        if t.is_empty() {
            return Ok(());
        }
        self.grow(t.len())?;
        if thinking {
            sink.thinking(t);
            self.thinking.push_str(t);
        } else {
            sink.text(t);
            self.text.push_str(t);
        }
        Ok(())
    }

    /// The finished output, with the tool calls and stop the provider worked out.
    pub(crate) fn output(self, tool_calls: Vec<ToolCall>, stop: ModelStop) -> ModelOutput {
        ModelOutput {
            thinking: self.thinking,
            signed_thinking: Vec::new(),
            text: self.text,
            tool_calls,
            usage: self.usage,
            stop,
        }
    }
}

/// A `2xx` answer to [`Endpoint::post`], by how it must be read.
enum Answer {
    /// An event stream (what was asked for).
    Stream(Body),
    /// A whole `application/json` document: a server or gateway that ignored `stream: true`.
    Json(Body),
}

/// Where a provider sends its calls and how: the URL, the API key header, the timeout and the
/// connection pool. Both providers hold one; only the path, the key's header and the extra headers
/// differ between them.
pub(crate) struct Endpoint {
    base_url: String,
    /// `{base_url}{path}`, or why it is not a URL.
    uri: Result<Uri, UpstreamError>,
    /// The key's header and value (marked sensitive), or why the key is not a header value.
    key: Result<Option<(HeaderName, HeaderValue)>, UpstreamError>,
    timeout: Duration,
    pool: std::sync::Arc<Pool>,
    /// `[upstream] headers`, expanded: on every request, over any of the same name.
    extra: Vec<(HeaderName, HeaderValue)>,
    /// What must never reach the log: the key and the extra headers' values (an upstream's
    /// error body may echo what it was sent).
    secrets: Vec<String>,
}

/// Secrets shorter than this are not redacted (they would blank common words).
const MIN_SECRET_LEN: usize = 6;

impl Endpoint {
    /// Calls go to `{base_url}{path}`. A non-empty `api_key` is sent in `key_header` as
    /// `{key_prefix}{api_key}`. `timeout` bounds each whole call, from connecting to the last
    /// byte. Bad values are kept as errors, reported by each call (see [`config_error`]).
    pub(crate) fn new(
        base_url: String,
        path: &str,
        key_header: HeaderName,
        key_prefix: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Endpoint {
        let uri = format!("{base_url}{path}").parse::<Uri>().map_err(|e| {
            config_error("the upstream base URL is not a URL: see [upstream] base_url")
                .with_detail(format!("{base_url:?}: {e}"))
        });
        let secrets = api_key
            .iter()
            .filter(|k| k.len() >= MIN_SECRET_LEN)
            .cloned()
            .collect();
        let key = match api_key.filter(|k| !k.is_empty()) {
            None => Ok(None),
            Some(key) => HeaderValue::from_str(&format!("{key_prefix}{key}"))
                .map(|mut v| {
                    v.set_sensitive(true);
                    Some((key_header, v))
                })
                .map_err(|_| config_error("the upstream API key is not a valid HTTP header value")),
        };
        Endpoint {
            base_url,
            uri,
            key,
            timeout,
            pool: Pool::new(),
            extra: Vec::new(),
            secrets,
        }
    }

    /// Sends these headers on every request too (`[upstream] headers`), replacing any of the
    /// same name. Their values are redacted from errors as the key is.
    pub(crate) fn set_headers(&mut self, headers: Vec<(HeaderName, HeaderValue)>) {
        for (_, v) in &headers {
            if let Ok(v) = v.to_str() {
                // A value and its last word (`Bearer <token>`: the token alone may be echoed).
                for s in [v, v.rsplit(' ').next().unwrap_or(v)] {
                    if s.len() >= MIN_SECRET_LEN && !self.secrets.iter().any(|k| k == s) {
                        self.secrets.push(s.to_string());
                    }
                }
            }
        }
        self.extra = headers;
    }

    /// `e` with every secret this endpoint sends replaced by `[redacted]`, in its message and
    /// its detail (both are logged).
    fn redact(&self, mut e: UpstreamError) -> UpstreamError {
        let scrub = |s: &mut String| {
            for secret in &self.secrets {
                if s.contains(secret.as_str()) {
                    *s = s.replace(secret.as_str(), "[redacted]");
                }
            }
        };
        scrub(&mut e.message);
        if let Some(d) = e.detail.as_mut() {
            scrub(d);
        }
        e
    }

    /// The base URL calls go to.
    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    /// One model call: POSTs `body` (with `headers`, see [`Endpoint::post`]) and reads the
    /// answer into an `A`, event by event or whole, all within the timeout. When the answer
    /// stopped at its final event the connection goes back to the pool with the body's rest,
    /// for the next call to read (a finished answer is never lost to what follows it).
    pub(crate) async fn call<A: Accumulate>(
        &self,
        body: &(impl serde::Serialize + Sync),
        headers: &[(&HeaderName, &'static str)],
        error_message: fn(&[u8]) -> String,
        sink: &mut dyn DeltaSink,
    ) -> Result<ModelOutput, UpstreamError> {
        let call = async {
            match self.post(body, headers, error_message).await? {
                Answer::Json(body) => {
                    let (answer, bytes) = read_json(body).await?;
                    Ok((A::whole(answer, &bytes, sink)?, None))
                }
                Answer::Stream(body) => read_stream::<A>(body, sink).await,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok((output, rest))) => {
                if let Some(body) = rest {
                    body.release();
                }
                Ok(output)
            }
            Ok(Err(e)) => Err(self.redact(e)),
            Err(_) => Err(UpstreamError::new(
                UpstreamErrorKind::Timeout,
                format!(
                    "the upstream call did not finish within {:.1}s",
                    self.timeout.as_secs_f64()
                ),
            )),
        }
    }

    /// POSTs `body` as JSON, asking for an event stream, with `headers` (before `User-Agent`)
    /// and the key. A failure to connect or send is a `Connect` error; a non-`2xx` answer is the
    /// error [`status_error`] makes, its message read from the body by `error_message`.
    async fn post(
        &self,
        body: &(impl serde::Serialize + Sync),
        headers: &[(&HeaderName, &'static str)],
        error_message: fn(&[u8]) -> String,
    ) -> Result<Answer, UpstreamError> {
        let uri = self.uri.clone()?;
        let key = self.key.clone()?;
        let body = Bytes::from(serde_json::to_vec(body).map_err(|e| protocol(e.to_string()))?);
        let make = || {
            let mut builder = Request::post(uri.clone())
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream");
            for (name, value) in headers {
                builder = builder.header(*name, *value);
            }
            builder = builder.header(USER_AGENT, concat!("turnstile/", env!("CARGO_PKG_VERSION")));
            if let Some((name, value)) = &key {
                builder = builder.header(name, value);
            }
            if let Some(h) = builder.headers_mut() {
                for (name, value) in &self.extra {
                    h.insert(name.clone(), value.clone());
                }
            }
            // Parts checked above (the URI) or static: building cannot fail.
            builder.body(Full::new(body.clone())).unwrap_or_default()
        };

        let resp = self.pool.send(&uri, make).await.map_err(|e| {
            let (what, e) = match e {
                CallError::Connect(e) => ("could not connect to", e),
                CallError::Send(e) => ("could not send the request to", e),
            };
            UpstreamError::new(UpstreamErrorKind::Connect, format!("{what} the upstream"))
                .with_detail(format!("{}: {}", self.base_url, error_chain(&*e)))
        })?;

        let status = resp.status();
        let (parts, body) = resp.into_parts();
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &parts.headers, body, error_message).await);
        }
        let is_json = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
        Ok(if is_json {
            Answer::Json(body)
        } else {
            Answer::Stream(body)
        })
    }
}

/// The protocol-specific half of reading an answer, implemented by each provider's output
/// accumulator and driven by [`Endpoint::call`]: what an event means, when the answer is
/// finished, and how a whole (non-streamed) answer is read.
pub(crate) trait Accumulate: Default {
    /// What a whole `application/json` answer parses as.
    type Whole: DeserializeOwned;
    /// The error message for a stream that ends before the answer finished.
    const UNFINISHED: &'static str;
    /// Applies one event's data, pushing fragments to `sink` as they are parsed; `true` when it
    /// was the final event (`[DONE]`, `message_stop`).
    fn event(&mut self, data: &str, sink: &mut dyn DeltaSink) -> Result<bool, UpstreamError>;
    /// Whether the answer is complete even if the stream ends without its final event (a stop
    /// reason came).
    fn stopped(&self) -> bool;
    /// The finished output.
    fn finish(self) -> Result<ModelOutput, UpstreamError>;
    /// The output of a whole JSON answer (`bytes` is the answer, for quoting in errors).
    fn whole(
        answer: Self::Whole,
        bytes: &[u8],
        sink: &mut dyn DeltaSink,
    ) -> Result<ModelOutput, UpstreamError>;
}

/// Reads an event stream as it arrives into a fresh `A`: body frames go through an
/// [`SseParser`] and each event's data to [`Accumulate::event`]. At the final event returns the
/// output and the body's unread rest (for [`Endpoint::call`] to release); when the body ends first
/// (the last, unterminated event is still applied), the output if a stop reason came, else a
/// `Stream` error.
async fn read_stream<A: Accumulate>(
    mut body: Body,
    sink: &mut dyn DeltaSink,
) -> Result<(ModelOutput, Option<Body>), UpstreamError> {
    let mut parser = SseParser::with_limit(DEFAULT_MAX_EVENT_BYTES);
    let mut acc = A::default();
    let sse_error = |e: SseError| protocol(format!("bad event stream: {e}"));
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                return Err(UpstreamError::new(
                    UpstreamErrorKind::Stream,
                    "the upstream stream broke off",
                )
                .with_detail(error_chain(&*e)))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        parser.feed(&data);
        while let Some(ev) = parser.next_event().map_err(sse_error)? {
            if acc.event(&ev.data, sink)? {
                return Ok((acc.finish()?, Some(body)));
            }
        }
    }
    let mut done = false;
    if let Some(ev) = parser.finish().map_err(sse_error)? {
        done = acc.event(&ev.data, sink)?;
    }
    if done || acc.stopped() {
        return Ok((acc.finish()?, None));
    }
    Err(UpstreamError::new(UpstreamErrorKind::Stream, A::UNFINISHED))
}

/// One event's data parsed as `T`; `None` when it is blank. What does not parse is a protocol
/// error quoting it, `what` naming the kind of event ("chunk", "event").
pub(crate) fn parse_event<T: DeserializeOwned>(
    data: &str,
    what: &str,
) -> Result<Option<T>, UpstreamError> {
    let data = data.trim();
    if data.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(data).map(Some).map_err(|e| {
        protocol(format!("unparseable {what} from the upstream ({e})"))
            .with_detail(preview(data.as_bytes()))
    })
}

/// A streamed tool call's input, by the rules both protocols share: blank is `empty`, `null` is
/// `{}`. `Ok(None)` when it does not parse but the answer was cut by `max_tokens`: the call is
/// incomplete and dropped, the stop reason says why.
pub(crate) fn tool_input(
    json: &str,
    empty: Value,
    stop: ModelStop,
) -> Result<Option<Value>, serde_json::Error> {
    if json.trim().is_empty() {
        return Ok(Some(empty));
    }
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Null) => Ok(Some(Value::Object(Map::new()))),
        Ok(v) => Ok(Some(v)),
        Err(_) if stop == ModelStop::MaxTokens => Ok(None),
        Err(e) => Err(e),
    }
}

/// A tool call's id, or a made-up `{prefix}{16 hex digits}` when the upstream sent none (the
/// engine pairs each tool result with its call by id).
pub(crate) fn call_id(id: String, prefix: &str) -> String {
    if id.is_empty() {
        format!("{prefix}{:016x}", fastrand::u64(..))
    } else {
        id
    }
}

/// Reads a whole `2xx` JSON answer (bounded like one event) and parses it as `T`; returns the
/// bytes too, for quoting in the caller's errors.
async fn read_json<T: DeserializeOwned>(body: Body) -> Result<(T, Vec<u8>), UpstreamError> {
    let (bytes, truncated) = read_capped(body, DEFAULT_MAX_EVENT_BYTES)
        .await
        .map_err(|e| {
            UpstreamError::new(UpstreamErrorKind::Stream, "the upstream response broke off")
                .with_detail(error_chain(&*e))
        })?;
    if truncated {
        return Err(protocol(format!(
            "the upstream's JSON answer exceeds {DEFAULT_MAX_EVENT_BYTES} bytes"
        )));
    }
    let value = serde_json::from_slice(&bytes).map_err(|e| {
        protocol(format!("unparseable JSON answer from the upstream ({e})"))
            .with_detail(preview(&bytes))
    })?;
    Ok((value, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_shows_its_detail_only_in_its_log_form() {
        let e = UpstreamError::new(
            UpstreamErrorKind::Status(400),
            "the upstream answered HTTP 400",
        )
        .with_detail("body with sk-secret");
        assert_eq!(e.message, "the upstream answered HTTP 400");
        assert_eq!(
            e.to_string(),
            "the upstream answered HTTP 400 [body with sk-secret]"
        );
    }
}
