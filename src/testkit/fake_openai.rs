//! A scripted fake OpenAI-compatible upstream: a real hyper server on `127.0.0.1:0` that speaks
//! the chat-completions streaming wire format and records every request.
//!
//! ```no_run
//! # async fn demo() {
//! use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};
//! let fake = FakeOpenAi::start().await;
//! fake.push(Reply::text("Hello there").usage(12, 3));
//! // ... point the OpenAI provider at fake.base_url() and run a turn ...
//! let reqs = fake.wait_requests(1).await;
//! assert_eq!(reqs[0]["model"], "some-model");
//! # }
//! ```
//!
//! Each `POST /v1/chat/completions` takes the next queued [`Reply`] (FIFO); with none queued it
//! answers HTTP 500 `{"error":{"message":"fake upstream: no scripted reply"}}` so a test fails
//! loudly. A streamed reply is, in order: a role chunk (`{"role":"assistant","content":""}`), the
//! thinking deltas (`reasoning_content`), the text deltas (`content`), the tool-call deltas, a
//! finish chunk, a usage chunk with `"choices":[]` when the request asked
//! `stream_options.include_usage`, and `data: [DONE]`. Dropping the [`FakeOpenAi`] stops the server
//! and every connection.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

type Body = BoxBody<Bytes, io::Error>;

/// A one-shot latch: [`Gate::open`] releases every current and future [`Gate::wait`].
/// Opening before anyone waits works (the gate stays open).
#[derive(Clone, Default)]
pub struct Gate(Arc<GateInner>);

#[derive(Default)]
struct GateInner {
    open: AtomicBool,
    notify: Notify,
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Opens the gate for good.
    pub fn open(&self) {
        self.0.open.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    pub fn is_open(&self) -> bool {
        self.0.open.load(Ordering::SeqCst)
    }

    /// Waits until the gate is open (returns at once if it already is).
    pub async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Gate").field(&self.is_open()).finish()
    }
}

/// One scripted answer to one chat-completions request. Build with [`Reply::text`],
/// [`Reply::tool_calls`] or [`Reply::status`], then refine with the builder methods.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `Some` for an HTTP error reply (status, JSON body); `None` for a streamed completion.
    error: Option<(u16, Value)>,
    /// `Some` for a verbatim body (see [`Reply::raw`]).
    raw: Option<String>,
    thinking: String,
    text: String,
    tool_calls: Vec<(String, String, Value)>,
    finish: Option<String>,
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
            finish: None,
            usage: (10, 5),
            chunk_chars: 4,
            break_after: None,
            hold: None,
            pace: None,
            headers: Vec::new(),
        }
    }

    /// A text answer, streamed as `content` deltas of [`Reply::chunk_chars`] characters
    /// (default 4); finish reason `stop`.
    pub fn text(s: &str) -> Reply {
        Reply {
            text: s.to_string(),
            ..Reply::empty()
        }
    }

    /// Tool calls `(id, name, input)`; finish reason `tool_calls`. Each call opens with a chunk
    /// carrying its `index`, `id`, `type` and `function.name` (arguments `""`), then the
    /// arguments JSON follows in fragments of `chunk_chars` characters, the calls' fragments
    /// interleaved round-robin by index.
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

    /// A verbatim `text/event-stream` body, sent in writes of `chunk_chars` bytes (default 4;
    /// splits may fall inside UTF-8 sequences): for upstream quirks the builder cannot express.
    /// `hold_after`, `break_after` and `pace` count these writes.
    pub fn raw(body: &str) -> Reply {
        Reply {
            raw: Some(body.to_string()),
            ..Reply::empty()
        }
    }

    /// Reasoning (`reasoning_content` deltas), streamed before the text.
    pub fn thinking(mut self, s: &str) -> Reply {
        self.thinking = s.to_string();
        self
    }

    /// Text streamed before the tool calls (or replacing the text of [`Reply::text`]).
    pub fn with_text(mut self, s: &str) -> Reply {
        self.text = s.to_string();
        self
    }

    /// Overrides the finish reason (`length`, `content_filter`, ...).
    pub fn finish(mut self, reason: &str) -> Reply {
        self.finish = Some(reason.to_string());
        self
    }

    /// The usage of the final chunk (default 10 prompt / 5 completion tokens).
    pub fn usage(mut self, input: u64, output: u64) -> Reply {
        self.usage = (input, output);
        self
    }

    /// Characters per delta for text, thinking and tool arguments (0 counts as 1).
    pub fn chunk_chars(mut self, n: usize) -> Reply {
        self.chunk_chars = n.max(1);
        self
    }

    /// Sends only the first `n_chunks` SSE events (the role chunk counts; writes for [`Reply::raw`]), then breaks the
    /// connection: the chunked body is never terminated, no finish chunk, no `[DONE]`.
    pub fn break_after(mut self, n_chunks: usize) -> Reply {
        self.break_after = Some(n_chunks);
        self
    }

    /// Sends every delta, then waits for `gate` before the finish chunk, usage and `[DONE]`:
    /// keeps a turn running, with its output visible, until the test opens the gate.
    pub fn hold(self, gate: Gate) -> Reply {
        self.hold_after(usize::MAX, gate)
    }

    /// Sends the first `n_chunks` SSE events (the role chunk counts), then waits for `gate`
    /// before sending the rest. `usize::MAX` holds before the finish chunk, like [`Reply::hold`].
    pub fn hold_after(mut self, n_chunks: usize, gate: Gate) -> Reply {
        self.hold = Some((n_chunks, gate));
        self
    }

    /// Waits `every` before each SSE event after the first (benchmarks).
    pub fn pace(mut self, every: Duration) -> Reply {
        self.pace = Some(every);
        self
    }

    /// Sets a response header (e.g. `Retry-After` on a [`Reply::status`] reply; `Content-Type`
    /// replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The SSE events of a streamed reply, split into the deltas part and the ending part
    /// (finish chunk, usage chunk, `[DONE]`).
    fn events(&self, id: &str, model: &Value, include_usage: bool) -> (Vec<Bytes>, Vec<Bytes>) {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let chunk = |choices: Value, usage: Option<Value>| -> Bytes {
            let mut v = json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": choices,
            });
            if let Some(u) = usage {
                v["usage"] = u;
            }
            Bytes::from(format!("data: {v}\n\n"))
        };
        let delta = |d: Value| -> Bytes {
            chunk(
                json!([{"index": 0, "delta": d, "logprobs": null, "finish_reason": null}]),
                None,
            )
        };

        let mut deltas = vec![delta(
            json!({"role": "assistant", "content": "", "refusal": null}),
        )];
        for piece in split_chars(&self.thinking, self.chunk_chars) {
            deltas.push(delta(json!({"reasoning_content": piece})));
        }
        for piece in split_chars(&self.text, self.chunk_chars) {
            deltas.push(delta(json!({"content": piece})));
        }
        let mut fragments: Vec<VecDeque<String>> = Vec::new();
        for (i, (id, name, _)) in self.tool_calls.iter().enumerate() {
            deltas.push(delta(json!({"tool_calls": [{
                "index": i,
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]})));
            let args = self.tool_calls[i].2.to_string();
            fragments.push(split_chars(&args, self.chunk_chars).into());
        }
        // Round-robin over the calls until every call's arguments are out.
        while fragments.iter().any(|f| !f.is_empty()) {
            for (i, f) in fragments.iter_mut().enumerate() {
                if let Some(piece) = f.pop_front() {
                    deltas.push(delta(json!({"tool_calls": [{
                        "index": i,
                        "function": {"arguments": piece},
                    }]})));
                }
            }
        }

        let finish = self.finish.clone().unwrap_or_else(|| {
            if self.tool_calls.is_empty() {
                "stop".to_string()
            } else {
                "tool_calls".to_string()
            }
        });
        let mut ending = vec![chunk(
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish}]),
            None,
        )];
        if include_usage {
            let (input, output) = self.usage;
            ending.push(chunk(
                json!([]),
                Some(json!({
                    "prompt_tokens": input,
                    "completion_tokens": output,
                    "total_tokens": input + output,
                })),
            ));
        }
        ending.push(Bytes::from_static(b"data: [DONE]\n\n"));
        (deltas, ending)
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
pub struct FakeOpenAi {
    addr: SocketAddr,
    state: Arc<State>,
    server: JoinHandle<()>,
}

impl FakeOpenAi {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> FakeOpenAi {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake upstream: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake upstream: local_addr");
        let state = Arc::new(State::default());
        let server = tokio::spawn(accept_loop(listener, state.clone()));
        FakeOpenAi {
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

    /// Queues a reply; replies are served FIFO, one per `POST /v1/chat/completions`.
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

impl Drop for FakeOpenAi {
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

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    if req.method() != Method::POST || req.uri().path() != "/v1/chat/completions" {
        return Ok(full(
            StatusCode::NOT_FOUND,
            json!({"error": {"message": format!("fake upstream: no route {} {}", req.method(), req.uri().path()), "type": "invalid_request_error"}}),
        ));
    }
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(full(
                StatusCode::BAD_REQUEST,
                json!({"error": {"message": "fake upstream: unreadable body"}}),
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
            json!({"error": {"message": "fake upstream: request body is not JSON", "type": "invalid_request_error"}}),
        ));
    }

    let Some(reply) = lock(&state.replies).pop_front() else {
        return Ok(full(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"message": "fake upstream: no scripted reply", "type": "server_error"}}),
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
    let id = format!("chatcmpl-fake{n:06}");
    let model = request.get("model").cloned().unwrap_or(Value::Null);
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (deltas, ending) = match &reply.raw {
        Some(raw) => (
            raw.as_bytes()
                .chunks(reply.chunk_chars)
                .map(Bytes::copy_from_slice)
                .collect(),
            Vec::new(),
        ),
        None => reply.events(&id, &model, include_usage),
    };
    let hold_at = reply
        .hold
        .as_ref()
        .map(|(n, g)| (if *n == usize::MAX { deltas.len() } else { *n }, g.clone()));
    let events: Vec<Bytes> = deltas.into_iter().chain(ending).collect();
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
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
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

    async fn post(fake: &FakeOpenAi, body: Value) -> (u16, HeaderMap, Result<String, String>) {
        let req = Request::post(format!("{}/chat/completions", fake.base_url()))
            .header("content-type", "application/json")
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

    /// The JSON of every `data:` event but `[DONE]`, and whether `[DONE]` came last.
    fn chunks(body: &str) -> (Vec<Value>, bool) {
        let events: Vec<&str> = body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("data: line"))
            .collect();
        let done = events.last() == Some(&"[DONE]");
        let json = events
            .iter()
            .filter(|e| **e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        (json, done)
    }

    fn req(include_usage: bool) -> Value {
        json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": include_usage}})
    }

    #[tokio::test]
    async fn text_reply_has_the_openai_chunk_shape() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("Hello, world").usage(7, 3));
        let (status, headers, body) = post(&fake, req(true)).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "text/event-stream");
        let (chunks, done) = chunks(&body.unwrap());
        assert!(done);
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["model"], "m1");
            assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-"));
            assert!(c["created"].is_u64());
        }
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, world");
        // 12 chars in pieces of 4, after the role chunk.
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hell");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], 7);
        assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 3);
        assert_eq!(fake.requests(), vec![req(true)]);
    }

    #[tokio::test]
    async fn no_usage_chunk_unless_asked() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("x"));
        let (_, _, body) = post(&fake, req(false)).await;
        let (chunks, done) = chunks(&body.unwrap());
        assert!(done);
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
    }

    #[tokio::test]
    async fn tool_calls_are_interleaved_by_index() {
        let fake = FakeOpenAi::start().await;
        fake.push(
            Reply::tool_calls(&[
                ("call_a", "get_weather", json!({"city": "Tokyo"})),
                ("call_b", "get_time", json!({"tz": "Asia/Tokyo"})),
            ])
            .with_text("Checking.")
            .thinking("hm"),
        );
        let (_, _, body) = post(&fake, req(true)).await;
        let (chunks, _) = chunks(&body.unwrap());
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0).map(|ch| &ch["delta"]))
            .collect();
        let indices: Vec<u64> = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["index"].as_u64())
            .collect();
        assert!(
            indices.windows(2).any(|w| w[0] > w[1]),
            "interleaved: {indices:?}"
        );
        let mut args = [String::new(), String::new()];
        for d in &deltas {
            if let Some(tc) = d["tool_calls"].get(0) {
                let i = tc["index"].as_u64().unwrap() as usize;
                args[i].push_str(tc["function"]["arguments"].as_str().unwrap());
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
        // Thinking, then text, then tools; finish reason tool_calls.
        let first_text = deltas.iter().position(|d| d["content"] == "Chec").unwrap();
        let first_think = deltas
            .iter()
            .position(|d| d["reasoning_content"] == "hm")
            .unwrap();
        let first_tool = deltas
            .iter()
            .position(|d| d.get("tool_calls").is_some())
            .unwrap();
        assert!(first_think < first_text && first_text < first_tool);
        assert_eq!(deltas.last().unwrap(), &&json!({}));
        let finish = chunks
            .iter()
            .rev()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, Some("tool_calls"));
    }

    #[tokio::test]
    async fn status_reply_with_header_and_empty_queue() {
        let fake = FakeOpenAi::start().await;
        fake.push(
            Reply::status(429, json!({"error": {"message": "slow down"}}))
                .header("Retry-After", "3"),
        );
        let (status, headers, body) = post(&fake, req(true)).await;
        assert_eq!(status, 429);
        assert_eq!(headers["retry-after"], "3");
        assert_eq!(
            serde_json::from_str::<Value>(&body.unwrap()).unwrap()["error"]["message"],
            "slow down"
        );
        let (status, _, body) = post(&fake, req(true)).await;
        assert_eq!(status, 500);
        assert!(body.unwrap().contains("fake upstream: no scripted reply"));
        assert_eq!(fake.wait_requests(2).await.len(), 2);
    }

    #[tokio::test]
    async fn break_after_ends_the_body_with_an_error() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("abcdefgh").break_after(2));
        let (status, _, body) = post(&fake, req(true)).await;
        assert_eq!(status, 200);
        assert!(body.is_err(), "the client must see a broken body");
    }

    #[tokio::test]
    async fn hold_waits_for_the_gate_and_wait_requests_is_notified() {
        let fake = Arc::new(FakeOpenAi::start().await);
        let gate = Gate::new();
        fake.push(Reply::text("held").hold(gate.clone()));
        let f = fake.clone();
        let waiter = tokio::spawn(async move { f.wait_requests(1).await });
        let f = fake.clone();
        let call = tokio::spawn(async move { post(&f, req(true)).await });
        let seen = waiter.await.unwrap();
        assert_eq!(seen[0]["model"], "m1");
        assert!(!call.is_finished());
        gate.open();
        let (_, _, body) = call.await.unwrap();
        assert!(chunks(&body.unwrap()).1);
    }

    #[tokio::test]
    async fn gate_opened_before_waiting_stays_open() {
        let gate = Gate::new();
        gate.open();
        gate.wait().await;
        gate.clone().wait().await;
        assert!(gate.is_open());
    }

    #[test]
    fn split_chars_respects_utf8() {
        assert_eq!(split_chars("héllo世界", 3), vec!["hél", "lo世", "界"]);
        assert_eq!(split_chars("", 4), Vec::<String>::new());
    }
}
