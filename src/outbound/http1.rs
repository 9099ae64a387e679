//! Upstream HTTP/1 connections driven by the task that makes the call.
//!
//! A pooled client (hyper-util's) runs every connection on a task of its own: a call hands its
//! request to that task and gets the answer back frame by frame, a task switch each way for
//! every frame. Here the calling task polls the connection itself while it waits for the answer
//! and reads the body, so a model call costs no hand-off at all. Idle connections wait in a
//! small pool, unpolled; one the server has closed is seen (polled once, without waiting) and
//! dropped when taken, and a request that fails on a reused connection before any answer is sent
//! again once on a new one. A call that stops reading at the answer's final event gives the
//! connection back with the body's rest ([`Body::release`]): whoever takes it next reads that
//! rest (normally just the body's end, long arrived) without waiting, or drops the connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use tower_service::Service;

use crate::sync::lock;

type Io = MaybeHttpsStream<super::connect::Stream>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Idle connections kept, and for how long.
const MAX_IDLE: usize = 64;
const IDLE_FOR: Duration = Duration::from_secs(60);
/// How many bytes of a released body's rest are read before giving the connection up.
const REST_MAX: usize = 64 * 1024;

/// Why a call failed, for the caller's error message and kind.
#[derive(Debug)]
pub(crate) enum CallError {
    /// No connection could be made (TCP, TLS or the HTTP/1 handshake).
    Connect(BoxError),
    /// The request could not be sent, or the connection broke before the answer's head.
    Send(BoxError),
}

/// Connections to an upstream (made by [`super::connect::connector`]), kept for reuse.
pub(crate) struct Pool {
    connector: HttpsConnector<super::connect::Connector>,
    idle: Mutex<Vec<Idle>>,
}

/// A connection waiting in the pool, with the unread rest of its last answer if it was
/// released before the end.
struct Idle {
    conn: Conn,
    rest: Option<Incoming>,
    since: Instant,
}

impl Pool {
    pub(crate) fn new() -> Arc<Pool> {
        Arc::new(Pool {
            connector: super::connect::connector(None),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends a request (built by `make`, once more if a reused connection turns out dead before
    /// answering) and returns the answer's head, with its body tied to the connection.
    pub(crate) async fn send(
        self: &Arc<Self>,
        uri: &Uri,
        make: impl Fn() -> Request<Full<Bytes>>,
    ) -> Result<Response<Body>, CallError> {
        let mut conn = match self.idle() {
            Some(conn) => conn,
            None => self.connect(uri).await?,
        };
        loop {
            let req = match &conn.proxied {
                // Plain HTTP through a proxy: the absolute URL, and the proxy's credentials.
                Some(auth) => proxy_form(make(), uri, auth.as_ref()),
                None => origin_form(make(), uri),
            };
            let reused = conn.reused;
            match conn.request(req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let body = Body {
                        conn: Some(conn),
                        body,
                        pool: self.clone(),
                    };
                    return Ok(Response::from_parts(parts, body));
                }
                // A connection that sat idle may have been closed by the server just as the
                // request went out: once more, on a fresh connection.
                Err(_) if reused => conn = self.connect(uri).await?,
                Err(e) => return Err(CallError::Send(e)),
            }
        }
    }

    async fn connect(&self, uri: &Uri) -> Result<Conn, CallError> {
        let io = self
            .connector
            .clone()
            .call(uri.clone())
            .await
            .map_err(CallError::Connect)?;
        let proxied = match &io {
            MaybeHttpsStream::Http(s) => s.proxied.clone(),
            MaybeHttpsStream::Https(_) => None,
        };
        let (send, conn) = http1::handshake(io)
            .await
            .map_err(|e| CallError::Connect(e.into()))?;
        Ok(Conn {
            send,
            conn,
            done: false,
            reused: false,
            proxied,
        })
    }

    /// The most recently used idle connection that is still open (and whose last answer has
    /// ended).
    fn idle(&self) -> Option<Conn> {
        loop {
            let Idle {
                mut conn,
                rest,
                since,
            } = lock(&self.idle).pop()?;
            let ended = rest.is_none_or(|rest| conn.finish(rest));
            if ended && since.elapsed() < IDLE_FOR && conn.open() {
                conn.reused = true;
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next call: open and idle, or (`rest`) still in its last answer.
    fn put(&self, mut conn: Conn, rest: Option<Incoming>) {
        if rest.is_none() && !conn.open() {
            return;
        }
        let mut idle = lock(&self.idle);
        idle.retain(|i| i.since.elapsed() < IDLE_FOR);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                conn,
                rest,
                since: Instant::now(),
            });
        }
    }
}

/// HTTP/1 wants the path as the request target and the authority in `Host`.
fn origin_form(mut req: Request<Full<Bytes>>, uri: &Uri) -> Request<Full<Bytes>> {
    if let Some(authority) = uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            req.headers_mut().entry(HOST).or_insert(host);
        }
    }
    if let Some(pq) = uri.path_and_query() {
        if let Ok(path) = pq.as_str().parse() {
            *req.uri_mut() = path;
        }
    }
    req
}

/// Through a proxy, HTTP/1 wants the absolute URL as the request target, the authority in
/// `Host` and the proxy's credentials in `Proxy-Authorization`.
fn proxy_form(
    mut req: Request<Full<Bytes>>,
    uri: &Uri,
    auth: Option<&HeaderValue>,
) -> Request<Full<Bytes>> {
    if let Some(authority) = uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            req.headers_mut().entry(HOST).or_insert(host);
        }
    }
    if let Some(auth) = auth {
        req.headers_mut()
            .insert(http::header::PROXY_AUTHORIZATION, auth.clone());
    }
    *req.uri_mut() = uri.clone();
    req
}

/// One connection: the request side and the connection's own future, polled by whoever holds it.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    conn: http1::Connection<Io, Full<Bytes>>,
    /// The connection's future has finished (closed or failed): it must not be polled again.
    done: bool,
    reused: bool,
    /// Plain HTTP through a proxy (with its credentials, if any): see [`proxy_form`].
    proxied: Option<Option<HeaderValue>>,
}

impl Conn {
    /// Whether the connection can take another request (polled once, without waiting, so a
    /// close by the server is seen).
    fn open(&mut self) -> bool {
        if self.done || self.send.is_closed() {
            return false;
        }
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        if Pin::new(&mut self.conn).poll(&mut cx).is_ready() {
            self.done = true;
            return false;
        }
        self.send.is_ready()
    }

    /// Reads what has arrived of an answer's rest, without waiting: whether the answer ended
    /// (a rest that has not, or that runs past [`REST_MAX`], costs the connection).
    fn finish(&mut self, mut rest: Incoming) -> bool {
        use hyper::body::Body as _;
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let mut seen = 0;
        loop {
            if !self.done && Pin::new(&mut self.conn).poll(&mut cx).is_ready() {
                self.done = true;
            }
            match Pin::new(&mut rest).poll_frame(&mut cx) {
                Poll::Ready(None) => return !self.done,
                Poll::Ready(Some(Ok(frame))) => {
                    seen += frame.data_ref().map_or(0, Bytes::len);
                    if seen > REST_MAX {
                        return false;
                    }
                }
                Poll::Ready(Some(Err(_))) | Poll::Pending => return false,
            }
        }
    }

    async fn request(&mut self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, BoxError> {
        let answer = self.send.send_request(req);
        self.drive(answer).await?.map_err(Into::into)
    }

    /// Runs `fut` while polling the connection (which writes the request and reads the answer).
    async fn drive<F: Future>(&mut self, fut: F) -> Result<F::Output, BoxError> {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            if !self.done {
                match Pin::new(&mut self.conn).poll(cx) {
                    Poll::Pending => {}
                    Poll::Ready(Ok(())) => self.done = true,
                    Poll::Ready(Err(e)) => {
                        self.done = true;
                        // What the answer got before the error is still delivered below.
                        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                            return Poll::Ready(Ok(out));
                        }
                        return Poll::Ready(Err(e.into()));
                    }
                }
            }
            match fut.as_mut().poll(cx) {
                Poll::Ready(out) => Poll::Ready(Ok(out)),
                // With the connection gone, nothing will wake `fut` again.
                Poll::Pending if self.done => {
                    Poll::Ready(Err("the upstream closed the connection".into()))
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// An answer's body, read by polling its connection; the connection goes back to the pool when
/// the body is read to its end ([`Body::frame`] returns `None`) or released, and is closed
/// otherwise.
pub(crate) struct Body {
    conn: Option<Conn>,
    body: Incoming,
    pool: Arc<Pool>,
}

impl Body {
    /// Gives the connection back before the body's end (the caller read all it wanted): the
    /// next call that takes it reads the rest first.
    pub(crate) fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put(conn, Some(self.body));
        }
    }

    /// The next frame; `None` at the end of the body.
    pub(crate) async fn frame(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        let conn = self.conn.as_mut()?;
        match conn.drive(self.body.frame()).await {
            Ok(Some(Ok(frame))) => Some(Ok(frame)),
            Ok(Some(Err(e))) => {
                self.conn = None;
                Some(Err(e.into()))
            }
            Ok(None) => {
                if let Some(conn) = self.conn.take() {
                    self.pool.put(conn, None);
                }
                None
            }
            Err(e) => {
                self.conn = None;
                Some(Err(e))
            }
        }
    }
}
