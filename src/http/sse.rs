//! Server-sent events: a response body fed by a bounded channel, with keep-alive comments while
//! the producer is quiet. A client that goes away drops the body, and the producer's next send
//! fails: that is how a producer learns to stop (it never blocks the engine: it reads from its
//! own feed and writes here).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::mpsc;

use super::Response;

/// A comment line about every this often, so that proxies keep the connection open.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// Frames buffered for a slow client before the producer waits.
const BUFFER: usize = 256;

/// The producer's end of an SSE response.
pub struct SseWriter {
    tx: mpsc::Sender<Bytes>,
}

/// The client went away.
#[derive(Debug)]
pub struct Closed;

impl SseWriter {
    /// Send one event. `id` is written as the `id:` field.
    pub async fn event(&self, name: &str, data: &str, id: Option<&str>) -> Result<(), Closed> {
        self.tx
            .send(format_event(name, data, id))
            .await
            .map_err(|_| Closed)
    }

    /// Whether the client is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when the client is gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// One SSE event in wire form.
pub fn format_event(name: &str, data: &str, id: Option<&str>) -> Bytes {
    let mut b = BytesMut::with_capacity(name.len() + data.len() + 32);
    if let Some(id) = id {
        b.put_slice(b"id: ");
        b.put_slice(id.as_bytes());
        b.put_u8(b'\n');
    }
    b.put_slice(b"event: ");
    b.put_slice(name.as_bytes());
    b.put_slice(b"\ndata: ");
    b.put_slice(data.as_bytes());
    b.put_slice(b"\n\n");
    b.freeze()
}

/// A new SSE response and its writer.
pub fn response() -> (SseWriter, Response) {
    let (tx, rx) = mpsc::channel(BUFFER);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let body = SseBody { rx, ticker };
    let mut resp = http::Response::new(body.boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    (SseWriter { tx }, resp)
}

struct SseBody {
    rx: mpsc::Receiver<Bytes>,
    ticker: tokio::time::Interval,
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => {
                self.ticker.reset();
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.ticker.poll_tick(cx) {
                Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    b": keep-alive\n\n",
                ))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
