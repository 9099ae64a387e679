//! The HTTP scaffolding shared by the scripted fake upstreams (`fake_openai` and
//! `fake_anthropic`, which build on it; it names neither): accept loop, request recording, the reply queue, and the
//! hold / break / pacing machinery that turns a reply's SSE events into a response body.
//!
//! What differs between wire formats (the route, the JSON of the server's own errors, how a
//! reply is rendered into SSE events, the stream's headers) comes in through [`Wire`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinHandle, JoinSet};

use crate::sync::lock;

/// The response body type of every fake: both fakes answer with either a full JSON body or a
/// stream of SSE events, so one boxed type covers both.
type Body = BoxBody<Bytes, io::Error>;

/// A one-shot latch: [`Gate::open`] releases every current and future [`Gate::wait`].
/// Opening before anyone waits works (the gate stays open).
///
/// Shared: both fakes hold a reply on a gate the same way (re-exported from each module).
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

/// Records when a reply's SSE events are handed to the connection (see
/// `fake_openai::Reply::log_sends`): benchmarks subtract the upstream's own timing (its
/// pacing and timer jitter) from what a client sees. Cheap to clone; clones share the log.
///
/// Lives here because the shared sender writes it, whatever the wire format.
#[derive(Clone, Default, Debug)]
pub struct SendLog(Arc<Mutex<Vec<std::time::Instant>>>);

impl SendLog {
    pub fn new() -> SendLog {
        SendLog::default()
    }

    /// The instants recorded so far, one per event in order (the first event first); clears
    /// the log.
    pub fn take(&self) -> Vec<std::time::Instant> {
        std::mem::take(&mut *lock(&self.0))
    }
}

/// How a paced reply spaces its events. Both schedules exist because the two fakes documented
/// different ones: OpenAI's benchmarks need an absolute schedule, Anthropic's fake sleeps
/// between events.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pace {
    /// Event `i` is due `i * every` after the first: timer granularity delays an event without
    /// pushing back the ones after it.
    Schedule(Duration),
    /// Waits `every` before each event after the first.
    Gap(Duration),
}

/// The part of a scripted reply that is the same in every wire format: an HTTP error instead of
/// a stream, a verbatim body, chunk size, break / hold / pacing, send log and extra headers.
/// Each fake's `Reply` holds one and sets it from its builder methods.
#[derive(Debug, Clone)]
pub(crate) struct Script {
    /// `Some` for an HTTP error reply (status, JSON body); `None` for a stream.
    pub error: Option<(u16, Value)>,
    /// `Some` for a verbatim body, sent in writes of `chunk_chars` bytes.
    pub raw: Option<String>,
    pub chunk_chars: usize,
    pub break_after: Option<usize>,
    pub hold: Option<(usize, Gate)>,
    pub pace: Option<Pace>,
    pub send_log: Option<SendLog>,
    pub headers: Vec<(String, String)>,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            error: None,
            raw: None,
            chunk_chars: 4,
            break_after: None,
            hold: None,
            pace: None,
            send_log: None,
            headers: Vec::new(),
        }
    }
}

/// Splits `s` into pieces of `n` characters (never inside a UTF-8 sequence). Shared: both
/// formats stream text, thinking and tool input this way.
pub(crate) fn split_chars(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// Why the server answered on its own instead of with a scripted reply; each wire format words
/// the error body its own way ([`Wire::failure_body`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failure {
    /// Not `POST` on [`Wire::ROUTE`] (404).
    NoRoute,
    /// The request body could not be read (400).
    Unreadable,
    /// The request body is not JSON (400).
    NotJson,
    /// The queue is empty and there is no fallback (500).
    NoReply,
    /// The request breaks a rule the real API enforces ([`Wire::validate`]) (400).
    Invalid,
}

/// What a wire format supplies to the shared server: the only things the two fakes do
/// differently.
pub(crate) trait Wire: Send + Sync + 'static {
    type Reply: Clone + Send + Sync + 'static;
    /// The one path that takes replies, e.g. `/v1/messages`.
    const ROUTE: &'static str;
    /// `Content-Type` of a streamed reply.
    const CONTENT_TYPE: &'static str;
    /// The JSON body of an error the server produces itself.
    fn failure_body(failure: Failure, message: &str) -> Value;
    /// The format-independent part of a reply.
    fn script(reply: &Self::Reply) -> &Script;
    /// A streamed reply's SSE events, split into the content part and the ending part (a
    /// `Reply::hold`-style hold at `usize::MAX` stops between them). `n` numbers the
    /// response, for ids.
    fn events(reply: &Self::Reply, request: &Value, n: u64) -> (Vec<Bytes>, Vec<Bytes>);
    /// Extra headers of a streamed reply (e.g. a request id); none by default.
    fn stream_headers(_headers: &mut HeaderMap, _n: u64) {}
    /// Refuses a request the real API would refuse (`Err` says why, as its 400 would). The
    /// request is still recorded; no scripted reply is taken.
    fn validate(_request: &Value) -> Result<(), String> {
        Ok(())
    }
}

/// Everything the server shares with the handle that owns it.
struct State<R> {
    replies: Mutex<VecDeque<R>>,
    /// Served when `replies` is empty.
    fallback: Mutex<Option<R>>,
    requests: Mutex<Vec<(HeaderMap, Value)>>,
    /// Whether request bodies and headers are kept (default true).
    record: AtomicBool,
    /// Every request received, recorded or not.
    received: AtomicU64,
    arrived: Notify,
    next_id: AtomicU64,
    connections: AtomicU64,
}

impl<R> Default for State<R> {
    fn default() -> State<R> {
        State {
            replies: Mutex::default(),
            fallback: Mutex::default(),
            requests: Mutex::default(),
            record: AtomicBool::new(true),
            received: AtomicU64::new(0),
            arrived: Notify::new(),
            next_id: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        }
    }
}

/// A running fake server for wire format `W`: the body of both `FakeOpenAi` and
/// `FakeAnthropic`, whose public methods forward here. Dropping it stops the server and every
/// connection.
pub(crate) struct Server<W: Wire> {
    addr: SocketAddr,
    state: Arc<State<W::Reply>>,
    server: JoinHandle<()>,
}

impl<W: Wire> Server<W> {
    /// Binds `127.0.0.1:0` and starts serving.
    pub(super) async fn start() -> Server<W> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake upstream: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake upstream: local_addr");
        let state = Arc::new(State::default());
        let server = tokio::spawn(accept_loop::<W>(listener, state.clone()));
        Server {
            addr,
            state,
            server,
        }
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub(super) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub(super) fn push(&self, reply: W::Reply) {
        lock(&self.state.replies).push_back(reply);
    }

    pub(super) fn set_fallback(&self, reply: Option<W::Reply>) {
        *lock(&self.state.fallback) = reply;
    }

    pub(super) fn record_requests(&self, on: bool) {
        self.state.record.store(on, Ordering::SeqCst);
    }

    pub(super) fn request_count(&self) -> u64 {
        self.state.received.load(Ordering::SeqCst)
    }

    pub(super) fn pending_replies(&self) -> usize {
        lock(&self.state.replies).len()
    }

    pub(super) fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    pub(super) fn requests(&self) -> Vec<Value> {
        lock(&self.state.requests)
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    pub(super) fn request_headers(&self) -> Vec<HeaderMap> {
        lock(&self.state.requests)
            .iter()
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Waits until at least `n` requests have been recorded, then returns them all.
    pub(super) async fn wait_requests(&self, n: usize) -> Vec<Value> {
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

impl<W: Wire> Drop for Server<W> {
    fn drop(&mut self) {
        // The accept loop owns the connections' JoinSet: aborting it ends them all.
        self.server.abort();
    }
}

/// Accepts connections (`TCP_NODELAY`, HTTP/1 keep-alive) and serves each on a task owned by
/// the loop, so that aborting the loop ends them all.
async fn accept_loop<W: Wire>(listener: TcpListener, state: Arc<State<W::Reply>>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle::<W>(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A complete JSON response.
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

/// Routes, records the request, and answers with the next queued reply (or the fallback).
async fn handle<W: Wire>(
    req: Request<Incoming>,
    state: Arc<State<W::Reply>>,
) -> Result<Response<Body>, Infallible> {
    let fail = |status, failure, message: &str| Ok(full(status, W::failure_body(failure, message)));
    if req.method() != Method::POST || req.uri().path() != W::ROUTE {
        let msg = format!(
            "fake upstream: no route {} {}",
            req.method(),
            req.uri().path()
        );
        return fail(StatusCode::NOT_FOUND, Failure::NoRoute, &msg);
    }
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return fail(
                StatusCode::BAD_REQUEST,
                Failure::Unreadable,
                "fake upstream: unreadable body",
            )
        }
    };
    let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
    let is_json = parsed.is_ok();
    let body = match parsed {
        Ok(v) => v,
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    state.received.fetch_add(1, Ordering::SeqCst);
    if state.record.load(Ordering::Relaxed) {
        lock(&state.requests).push((parts.headers, body.clone()));
    }
    state.arrived.notify_waiters();
    if !is_json {
        return fail(
            StatusCode::BAD_REQUEST,
            Failure::NotJson,
            "fake upstream: request body is not JSON",
        );
    }
    if let Err(message) = W::validate(&body) {
        return fail(StatusCode::BAD_REQUEST, Failure::Invalid, &message);
    }

    let queued = lock(&state.replies).pop_front();
    let Some(reply) = queued.or_else(|| lock(&state.fallback).clone()) else {
        return fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            Failure::NoReply,
            "fake upstream: no scripted reply",
        );
    };
    let script = W::script(&reply);
    let mut resp = match &script.error {
        Some((code, err_body)) => full(
            StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            err_body.clone(),
        ),
        None => {
            let n = state.next_id.fetch_add(1, Ordering::Relaxed);
            stream_reply::<W>(&reply, &body, n)
        }
    };
    for (name, value) in &script.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    Ok(resp)
}

/// The streamed response of a reply: its events (or raw body writes), written straight from
/// memory when nothing needs waiting for, else by [`scripted_sender`].
fn stream_reply<W: Wire>(reply: &W::Reply, request: &Value, n: u64) -> Response<Body> {
    let script = W::script(reply);
    let (content, ending) = match &script.raw {
        Some(raw) => (
            raw.as_bytes()
                .chunks(script.chunk_chars)
                .map(Bytes::copy_from_slice)
                .collect(),
            Vec::new(),
        ),
        None => W::events(reply, request, n),
    };
    let hold_at = script
        .hold
        .as_ref()
        .map(|(n, g)| (if *n == usize::MAX { content.len() } else { *n }, g.clone()));
    let events: VecDeque<Bytes> = content.into_iter().chain(ending).collect();
    let break_after = script.break_after;
    let pace = script.pace;
    let send_log = script.send_log.clone();
    let body = if hold_at.is_none() && break_after.is_none() && pace.is_none() && send_log.is_none()
    {
        // Nothing to wait for: hand hyper the events as they are (no task, no channel).
        BodyExt::boxed(ReadyBody { events })
    } else {
        BodyExt::boxed(ChannelBody {
            rx: scripted_sender(events, hold_at, break_after, pace, send_log),
            error: None,
        })
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(W::CONTENT_TYPE),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    W::stream_headers(h, n);
    resp
}

/// Sends `events` on a channel from a task, following the reply's hold, break and pacing.
fn scripted_sender(
    events: VecDeque<Bytes>,
    hold_at: Option<(usize, Gate)>,
    break_after: Option<usize>,
    pace: Option<Pace>,
    send_log: Option<SendLog>,
) -> mpsc::Receiver<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
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
            match (pace, i > 0) {
                (Some(Pace::Schedule(every)), true) => {
                    let due = start + every.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
                    tokio::time::sleep_until(due).await;
                }
                (Some(Pace::Gap(every)), true) => tokio::time::sleep(every).await,
                _ => {}
            }
            if let Some(log) = &send_log {
                lock(&log.0).push(std::time::Instant::now());
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
    rx
}

/// A response body of events that are all ready: one frame per event, never pending.
struct ReadyBody {
    events: VecDeque<Bytes>,
}

impl hyper::body::Body for ReadyBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Poll::Ready(self.events.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.events.is_empty()
    }
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
