//! A scripted fake Anthropic Messages upstream: a real hyper server on `127.0.0.1:0` that speaks
//! the Messages streaming wire format and records every request.
//!
//! ```no_run
//! # async fn demo() {
//! use turnstile::testkit::fake_anthropic::{FakeAnthropic, Reply};
//! let fake = FakeAnthropic::start().await;
//! fake.push(Reply::text("Hello there").usage(12, 3));
//! // ... point the Anthropic provider at fake.base_url() and run a turn ...
//! let reqs = fake.wait_requests(1).await;
//! assert_eq!(reqs[0]["model"], "some-model");
//! # }
//! ```
//!
//! Each `POST /v1/messages` takes the next queued [`Reply`] (FIFO); with none queued it answers
//! HTTP 500 `{"type":"error","error":{"type":"api_error","message":"fake upstream: no scripted
//! reply"}}` so a test fails loudly. A streamed reply is, in order, one SSE event each (with its
//! `event:` line, as the real API sends them):
//!
//! - `message_start` (usage `input_tokens`, `output_tokens: 1`), then a `ping`;
//! - a `thinking` block when the reply has thinking: `content_block_start`, `thinking_delta`s,
//!   one `signature_delta`, `content_block_stop`;
//! - a `text` block when the reply has text: start, `text_delta`s, stop;
//! - one `tool_use` block per tool call, one after the other: start (with `id`, `name`, `input:
//!   {}`), an empty `input_json_delta`, the input JSON in `input_json_delta`s of `chunk_chars`
//!   characters, stop;
//! - `message_delta` (`stop_reason`, usage `output_tokens`) and `message_stop` (the ending part;
//!   [`Reply::error_event`] replaces it with an `error` event).
//!
//! Dropping the [`FakeAnthropic`] stops the server and every connection.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinHandle, JoinSet};

pub use super::fake_openai::Gate;

type Body = BoxBody<Bytes, io::Error>;

/// One scripted answer to one Messages request. Build with [`Reply::text`],
/// [`Reply::tool_calls`], [`Reply::status`], [`Reply::api_error`] or [`Reply::raw`], then refine
/// with the builder methods.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `Some` for an HTTP error reply (status, JSON body); `None` for a streamed message.
    error: Option<(u16, Value)>,
    /// `Some` for a verbatim body (see [`Reply::raw`]).
    raw: Option<String>,
    thinking: String,
    text: String,
    tool_calls: Vec<(String, String, Value)>,
    stop_reason: Option<String>,
    /// An `error` event `(type, message)` sent instead of `message_delta` + `message_stop`.
    error_event: Option<(String, String)>,
    usage: (u64, u64),
    chunk_chars: usize,
    break_after: Option<usize>,
    hold: Option<(usize, Gate)>,
    pace: Option<Duration>,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn empty() -> Reply {
        Reply {
            error: None,
            raw: None,
            thinking: String::new(),
            text: String::new(),
            tool_calls: Vec::new(),
            stop_reason: None,
            error_event: None,
            usage: (10, 5),
            chunk_chars: 4,
            break_after: None,
            hold: None,
            pace: None,
            headers: Vec::new(),
        }
    }

    /// A text answer, streamed as `text_delta`s of [`Reply::chunk_chars`] characters (default 4);
    /// stop reason `end_turn`.
    pub fn text(s: &str) -> Reply {
        Reply {
            text: s.to_string(),
            ..Reply::empty()
        }
    }

    /// Tool calls `(id, name, input)`, one `tool_use` block each; stop reason `tool_use`. Each
    /// input is sent as JSON text in `input_json_delta` fragments of `chunk_chars` characters.
    pub fn tool_calls(calls: &[(&str, &str, Value)]) -> Reply {
        Reply {
            tool_calls: calls
                .iter()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect(),
            ..Reply::empty()
        }
    }

    /// An HTTP error response with this status and JSON body (no stream).
    pub fn status(code: u16, body: Value) -> Reply {
        Reply {
            error: Some((code, body)),
            ..Reply::empty()
        }
    }

    /// An HTTP error response in the Anthropic shape:
    /// `{"type":"error","error":{"type": error_type,"message": message}}`.
    pub fn api_error(code: u16, error_type: &str, message: &str) -> Reply {
        Reply::status(
            code,
            json!({"type": "error", "error": {"type": error_type, "message": message}}),
        )
    }

    /// A verbatim `text/event-stream` body, sent in writes of `chunk_chars` bytes (default 4;
    /// splits may fall inside UTF-8 sequences): for upstream quirks the builder cannot express.
    /// `hold_after`, `break_after` and `pace` count these writes.
    pub fn raw(body: &str) -> Reply {
        Reply {
            raw: Some(body.to_string()),
            ..Reply::empty()
        }
    }

    /// Thinking (a `thinking` block of `thinking_delta`s), streamed before the text.
    pub fn thinking(mut self, s: &str) -> Reply {
        self.thinking = s.to_string();
        self
    }

    /// Text streamed before the tool calls (or replacing the text of [`Reply::text`]).
    pub fn with_text(mut self, s: &str) -> Reply {
        self.text = s.to_string();
        self
    }

    /// Overrides the stop reason (`max_tokens`, `refusal`, `stop_sequence`, `pause_turn`, ...).
    pub fn finish(mut self, stop_reason: &str) -> Reply {
        self.stop_reason = Some(stop_reason.to_string());
        self
    }

    /// Ends the stream with an `error` event (e.g. `overloaded_error`) instead of
    /// `message_delta` and `message_stop`, as the API does when it fails mid-answer.
    pub fn error_event(mut self, error_type: &str, message: &str) -> Reply {
        self.error_event = Some((error_type.to_string(), message.to_string()));
        self
    }

    /// `input_tokens` of `message_start` and `output_tokens` of `message_delta` (default 10 / 5).
    pub fn usage(mut self, input: u64, output: u64) -> Reply {
        self.usage = (input, output);
        self
    }

    /// Characters per delta for text, thinking and tool input JSON (0 counts as 1).
    pub fn chunk_chars(mut self, n: usize) -> Reply {
        self.chunk_chars = n.max(1);
        self
    }

    /// Sends only the first `n_events` SSE events (`message_start` and `ping` count; writes for
    /// [`Reply::raw`]), then breaks the connection: the chunked body is never terminated.
    pub fn break_after(mut self, n_events: usize) -> Reply {
        self.break_after = Some(n_events);
        self
    }

    /// Sends every content event, then waits for `gate` before `message_delta` and
    /// `message_stop`: keeps a turn running, with its output visible, until the test opens it.
    pub fn hold(self, gate: Gate) -> Reply {
        self.hold_after(usize::MAX, gate)
    }

    /// Sends the first `n_events` SSE events, then waits for `gate` before sending the rest.
    /// `usize::MAX` holds before the ending, like [`Reply::hold`].
    pub fn hold_after(mut self, n_events: usize, gate: Gate) -> Reply {
        self.hold = Some((n_events, gate));
        self
    }

    /// Waits `every` before each SSE event after the first (benchmarks).
    pub fn pace(mut self, every: Duration) -> Reply {
        self.pace = Some(every);
        self
    }

    /// Sets a response header (e.g. `retry-after` on a [`Reply::status`] reply; `content-type`
    /// replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The SSE events of a streamed reply, split into the content part and the ending part.
    fn events(&self, id: &str, model: &Value) -> (Vec<Bytes>, Vec<Bytes>) {
        let ev = |v: Value| -> Bytes {
            let name = v["type"].as_str().unwrap_or("message").to_string();
            Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
        };
        let (input_tokens, output_tokens) = self.usage;
        let mut content = vec![
            ev(json!({"type": "message_start", "message": {
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,
                },
            }})),
            ev(json!({"type": "ping"})),
        ];
        let mut index = 0u64;
        let delta = |index: u64, d: Value| {
            ev(json!({"type": "content_block_delta", "index": index, "delta": d}))
        };
        let stop = |index: u64| ev(json!({"type": "content_block_stop", "index": index}));
        if !self.thinking.is_empty() {
            content.push(ev(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
            for piece in split_chars(&self.thinking, self.chunk_chars) {
                content.push(delta(
                    index,
                    json!({"type": "thinking_delta", "thinking": piece}),
                ));
            }
            content.push(delta(
                index,
                json!({"type": "signature_delta", "signature": "RmFrZVNpZ25hdHVyZQ=="}),
            ));
            content.push(stop(index));
            index += 1;
        }
        if !self.text.is_empty() {
            content.push(ev(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}})));
            for piece in split_chars(&self.text, self.chunk_chars) {
                content.push(delta(index, json!({"type": "text_delta", "text": piece})));
            }
            content.push(stop(index));
            index += 1;
        }
        for (id, name, input) in &self.tool_calls {
            content.push(ev(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
            content.push(delta(
                index,
                json!({"type": "input_json_delta", "partial_json": ""}),
            ));
            for piece in split_chars(&input.to_string(), self.chunk_chars) {
                content.push(delta(
                    index,
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            content.push(stop(index));
            index += 1;
        }

        let ending = match &self.error_event {
            Some((kind, message)) => vec![ev(json!({"type": "error",
                "error": {"type": kind, "message": message}}))],
            None => {
                let stop_reason = self.stop_reason.clone().unwrap_or_else(|| {
                    if self.tool_calls.is_empty() {
                        "end_turn".to_string()
                    } else {
                        "tool_use".to_string()
                    }
                });
                vec![
                    ev(json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                        "usage": {"output_tokens": output_tokens}})),
                    ev(json!({"type": "message_stop"})),
                ]
            }
        };
        (content, ending)
    }
}

/// Splits `s` into pieces of `n` characters (never inside a UTF-8 sequence).
fn split_chars(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

#[derive(Default)]
struct State {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<(HeaderMap, Value)>>,
    arrived: Notify,
    next_id: AtomicU64,
    connections: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not turn every later call into a second panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fake server. See the module documentation.
pub struct FakeAnthropic {
    addr: SocketAddr,
    state: Arc<State>,
    server: JoinHandle<()>,
}

impl FakeAnthropic {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> FakeAnthropic {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake upstream: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake upstream: local_addr");
        let state = Arc::new(State::default());
        let server = tokio::spawn(accept_loop(listener, state.clone()));
        FakeAnthropic {
            addr,
            state,
            server,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a reply; replies are served FIFO, one per `POST /v1/messages`.
    pub fn push(&self, reply: Reply) {
        lock(&self.state.replies).push_back(reply);
    }

    /// How many queued replies no request has taken yet.
    pub fn pending_replies(&self) -> usize {
        lock(&self.state.replies).len()
    }

    /// How many TCP connections the server has accepted (to check connection reuse).
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Every request body received so far, in order (a body that is not JSON is kept as a string).
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.state.requests)
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// The headers of every request received so far, in order.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        lock(&self.state.requests)
            .iter()
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Waits until at least `n` requests have arrived, then returns them all.
    pub async fn wait_requests(&self, n: usize) -> Vec<Value> {
        loop {
            let arrived = self.state.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if lock(&self.state.requests).len() >= n {
                return self.requests();
            }
            arrived.await;
        }
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        // The accept loop owns the connections' JoinSet: aborting it ends them all.
        self.server.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn api_error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    if req.method() != Method::POST || req.uri().path() != "/v1/messages" {
        let msg = format!(
            "fake upstream: no route {} {}",
            req.method(),
            req.uri().path()
        );
        return Ok(full(
            StatusCode::NOT_FOUND,
            api_error_body("not_found_error", &msg),
        ));
    }
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(full(
                StatusCode::BAD_REQUEST,
                api_error_body("invalid_request_error", "fake upstream: unreadable body"),
            ))
        }
    };
    let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
    let body = match &parsed {
        Ok(v) => v.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    lock(&state.requests).push((parts.headers, body.clone()));
    state.arrived.notify_waiters();
    if parsed.is_err() {
        return Ok(full(
            StatusCode::BAD_REQUEST,
            api_error_body(
                "invalid_request_error",
                "fake upstream: request body is not JSON",
            ),
        ));
    }

    let Some(reply) = lock(&state.replies).pop_front() else {
        return Ok(full(
            StatusCode::INTERNAL_SERVER_ERROR,
            api_error_body("api_error", "fake upstream: no scripted reply"),
        ));
    };
    let mut resp = match &reply.error {
        Some((code, err_body)) => full(
            StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            err_body.clone(),
        ),
        None => stream_reply(&reply, &body, &state),
    };
    for (name, value) in &reply.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    Ok(resp)
}

fn stream_reply(reply: &Reply, request: &Value, state: &State) -> Response<Body> {
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let id = format!("msg_fake{n:06}");
    let model = request.get("model").cloned().unwrap_or(Value::Null);
    let (content, ending) = match &reply.raw {
        Some(raw) => (
            raw.as_bytes()
                .chunks(reply.chunk_chars)
                .map(Bytes::copy_from_slice)
                .collect(),
            Vec::new(),
        ),
        None => reply.events(&id, &model),
    };
    let hold_at = reply
        .hold
        .as_ref()
        .map(|(n, g)| (if *n == usize::MAX { content.len() } else { *n }, g.clone()));
    let events: Vec<Bytes> = content.into_iter().chain(ending).collect();
    let (tx, rx) = mpsc::channel(16);
    let break_after = reply.break_after;
    let pace = reply.pace;
    tokio::spawn(async move {
        for (i, ev) in events.into_iter().enumerate() {
            if break_after == Some(i) {
                let _ = tx
                    .send(Err(io::Error::other("fake upstream: scripted break")))
                    .await;
                return;
            }
            if let Some((at, gate)) = &hold_at {
                if *at == i {
                    tokio::select! {
                        _ = gate.wait() => {}
                        _ = tx.closed() => return, // the client went away meanwhile
                    }
                }
            }
            if let (Some(every), true) = (pace, i > 0) {
                tokio::time::sleep(every).await;
            }
            if tx.send(Ok(ev)).await.is_err() {
                return; // the client went away
            }
        }
        if break_after.is_some() {
            // Asked to break after the whole stream: still never end it cleanly.
            let _ = tx
                .send(Err(io::Error::other("fake upstream: scripted break")))
                .await;
        }
    });
    let mut resp = Response::new(BodyExt::boxed(ChannelBody { rx, error: None }));
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    h.insert(
        HeaderName::from_static("request-id"),
        HeaderValue::from_str(&format!("req_fake{n:06}"))
            .unwrap_or_else(|_| HeaderValue::from_static("req_fake")),
    );
    resp
}

/// A response body fed by the reply task; an `Err` item makes hyper abort the connection.
///
/// The error is held back for one poll: hyper buffers the frames before it and would drop them
/// unsent on the error, so returning `Pending` once (with a wake-up) lets it flush them first.
struct ChannelBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    error: Option<io::Error>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(e) = self.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Err(e))) => {
                self.error = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other.map(|item| item.map(|r| r.map(Frame::data))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

    fn client() -> TestClient {
        Client::builder(TokioExecutor::new()).build_http()
    }

    async fn post(fake: &FakeAnthropic, body: Value) -> (u16, HeaderMap, Result<String, String>) {
        let req = Request::post(format!("{}/messages", fake.base_url()))
            .header("content-type", "application/json")
            .header("x-api-key", "k")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8(b.to_bytes().to_vec()).unwrap())
            .map_err(|e| e.to_string());
        (status, headers, body)
    }

    /// `(event name, data JSON)` of every event; checks the name matches the data's `type`.
    fn events(body: &str) -> Vec<Value> {
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').expect("two lines");
                let name = name.strip_prefix("event: ").expect("event: line");
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").expect("data: line")).unwrap();
                assert_eq!(data["type"], name);
                data
            })
            .collect()
    }

    fn req() -> Value {
        json!({"model": "claude-test", "max_tokens": 100, "stream": true,
               "messages": [{"role": "user", "content": "hi"}]})
    }

    #[tokio::test]
    async fn text_reply_has_the_anthropic_event_shape() {
        let fake = FakeAnthropic::start().await;
        fake.push(Reply::text("Hello, world").usage(7, 3));
        let (status, headers, body) = post(&fake, req()).await;
        assert_eq!(status, 200);
        assert!(headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let evs = events(&body.unwrap());
        let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(evs[0]["message"]["model"], "claude-test");
        assert_eq!(evs[0]["message"]["usage"]["input_tokens"], 7);
        assert!(evs[0]["message"]["id"]
            .as_str()
            .unwrap()
            .starts_with("msg_"));
        let text: String = evs
            .iter()
            .filter_map(|e| e["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "Hello, world");
        assert_eq!(evs[3]["delta"]["text"], "Hell");
        assert_eq!(evs[7]["delta"]["stop_reason"], "end_turn");
        assert_eq!(evs[7]["usage"]["output_tokens"], 3);
        assert_eq!(fake.requests(), vec![req()]);
        assert_eq!(fake.request_headers()[0]["x-api-key"], "k");
    }

    #[tokio::test]
    async fn thinking_text_and_tools_come_as_indexed_blocks() {
        let fake = FakeAnthropic::start().await;
        fake.push(
            Reply::tool_calls(&[
                ("toolu_a", "get_weather", json!({"city": "Tokyo"})),
                ("toolu_b", "get_time", json!({"tz": "Asia/Tokyo"})),
            ])
            .with_text("Checking.")
            .thinking("hm"),
        );
        let (_, _, body) = post(&fake, req()).await;
        let evs = events(&body.unwrap());
        let starts: Vec<(u64, &str)> = evs
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| {
                (
                    e["index"].as_u64().unwrap(),
                    e["content_block"]["type"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            starts,
            [
                (0, "thinking"),
                (1, "text"),
                (2, "tool_use"),
                (3, "tool_use")
            ]
        );
        let mut args = [String::new(), String::new()];
        for e in &evs {
            if e["delta"]["type"] == "input_json_delta" {
                let i = e["index"].as_u64().unwrap() as usize - 2;
                args[i].push_str(e["delta"]["partial_json"].as_str().unwrap());
            }
        }
        assert_eq!(
            serde_json::from_str::<Value>(&args[0]).unwrap(),
            json!({"city": "Tokyo"})
        );
        assert_eq!(
            serde_json::from_str::<Value>(&args[1]).unwrap(),
            json!({"tz": "Asia/Tokyo"})
        );
        assert!(evs.iter().any(|e| e["delta"]["type"] == "signature_delta"));
        let md = evs.iter().find(|e| e["type"] == "message_delta").unwrap();
        assert_eq!(md["delta"]["stop_reason"], "tool_use");
    }

    #[tokio::test]
    async fn error_event_replaces_the_ending() {
        let fake = FakeAnthropic::start().await;
        fake.push(Reply::text("ab").error_event("overloaded_error", "Overloaded"));
        let (_, _, body) = post(&fake, req()).await;
        let evs = events(&body.unwrap());
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "error");
        assert_eq!(last["error"]["type"], "overloaded_error");
        assert!(evs.iter().all(|e| e["type"] != "message_stop"));
    }

    #[tokio::test]
    async fn status_reply_with_header_and_empty_queue() {
        let fake = FakeAnthropic::start().await;
        fake.push(
            Reply::api_error(529, "overloaded_error", "Overloaded").header("retry-after", "3"),
        );
        let (status, headers, body) = post(&fake, req()).await;
        assert_eq!(status, 529);
        assert_eq!(headers["retry-after"], "3");
        let v: Value = serde_json::from_str(&body.unwrap()).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
        let (status, _, body) = post(&fake, req()).await;
        assert_eq!(status, 500);
        assert!(body.unwrap().contains("fake upstream: no scripted reply"));
        assert_eq!(fake.wait_requests(2).await.len(), 2);
        assert_eq!(fake.pending_replies(), 0);
    }

    #[tokio::test]
    async fn break_after_ends_the_body_with_an_error() {
        let fake = FakeAnthropic::start().await;
        fake.push(Reply::text("abcdefgh").break_after(3));
        let (status, _, body) = post(&fake, req()).await;
        assert_eq!(status, 200);
        assert!(body.is_err(), "the client must see a broken body");
    }

    #[tokio::test]
    async fn hold_waits_for_the_gate() {
        let fake = Arc::new(FakeAnthropic::start().await);
        let gate = Gate::new();
        fake.push(Reply::text("held").hold(gate.clone()));
        let f = fake.clone();
        let call = tokio::spawn(async move { post(&f, req()).await });
        let seen = fake.wait_requests(1).await;
        assert_eq!(seen[0]["model"], "claude-test");
        assert!(!call.is_finished());
        gate.open();
        let (_, _, body) = call.await.unwrap();
        assert_eq!(
            events(&body.unwrap()).last().unwrap()["type"],
            "message_stop"
        );
    }

    #[tokio::test]
    async fn unknown_routes_are_404() {
        let fake = FakeAnthropic::start().await;
        let req = Request::get(format!("{}/models", fake.base_url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), 404);
    }
}
