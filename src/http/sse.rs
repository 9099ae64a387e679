//! Server-sent events: a response body that pulls its events from a stream, polled by the
//! connection's own task (no task or channel in between, so an event costs no extra wake-up on
//! its way out), with keep-alive comments while the stream is quiet. A client that goes away
//! drops the body and with it the stream; the stream's source (a turn, the event log) never
//! waits on it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;
use http::{header, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Response;

/// A comment line about every this often, so that proxies keep the connection open.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);

/// One SSE event in wire form.
pub(crate) fn format_event(name: &str, data: &str, id: Option<&str>) -> Bytes {
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

/// An SSE response sending what `events` yields (each item one or more events in wire form, see
/// [`format_event`]) until it ends, or `stop` is cancelled and it has nothing ready.
pub(crate) fn response(
    events: impl Stream<Item = Bytes> + Send + 'static,
    stop: &CancellationToken,
) -> Response {
    response_every(events, stop, KEEPALIVE)
}

/// [`response`] with keep-alive comments `every` this long.
fn response_every(
    events: impl Stream<Item = Bytes> + Send + 'static,
    stop: &CancellationToken,
    every: Duration,
) -> Response {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let body = SseBody {
        events: Box::pin(events),
        stop: Box::pin(stop.clone().cancelled_owned()),
        ticker,
        every,
        last_sent: tokio::time::Instant::now(),
        _open: crate::metrics::stream_open(),
    };
    let mut resp = http::Response::new(body.boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

struct SseBody {
    events: Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    ticker: tokio::time::Interval,
    every: Duration,
    /// When the last frame went out: a keep-alive is due `every` after it. The ticker is
    /// moved on only when it fires too early, not at every frame: re-arming a timer per event
    /// costs a timer-wheel update, and a wake-up of the worker parked on the I/O driver whenever
    /// it becomes the earliest timer (with deltas arriving over the network, at every delta).
    last_sent: tokio::time::Instant,
    /// Counted in `turnstile_streams_open` while the response lives.
    _open: crate::metrics::GaugeGuard,
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.events.as_mut().poll_next(cx) {
            Poll::Ready(Some(b)) => {
                self.last_sent = tokio::time::Instant::now();
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            // Stopping ends the stream once what is ready has gone out (a turn's last event,
            // written as the server shuts down, is not cut off).
            Poll::Pending if self.stop.as_mut().poll(cx).is_ready() => Poll::Ready(None),
            Poll::Pending => loop {
                if self.ticker.poll_tick(cx).is_pending() {
                    return Poll::Pending;
                }
                let due = self.last_sent + self.every;
                if tokio::time::Instant::now() >= due {
                    self.last_sent = tokio::time::Instant::now();
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                        b": keep-alive\n\n",
                    )))));
                }
                self.ticker.reset_at(due);
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// A keep-alive comment goes out a whole period after the last frame, whenever that was.
    /// (Timers never fire early: the bounds below hold on any machine.)
    #[tokio::test]
    async fn a_keep_alive_goes_out_a_whole_period_after_the_last_frame() {
        let every = Duration::from_millis(100);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let events = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let stop = CancellationToken::new();
        let mut body = response_every(events, &stop, every).into_body();
        let start = Instant::now();
        assert_eq!(&next(&mut body).await[..], b": keep-alive\n\n");
        assert!(start.elapsed() >= every);
        // An event part-way through the next period...
        tokio::time::sleep(every * 6 / 10).await;
        tx.send(format_event("x", "{}", None)).unwrap();
        assert_eq!(&next(&mut body).await[..], b"event: x\ndata: {}\n\n");
        let sent = Instant::now();
        // ...moves the next comment to a whole period after it, past the ticker's own time.
        assert_eq!(&next(&mut body).await[..], b": keep-alive\n\n");
        assert!(
            sent.elapsed() >= every,
            "{:?} after the event",
            sent.elapsed()
        );
        stop.cancel();
        assert!(body.frame().await.is_none(), "stopped");
    }

    async fn next(body: &mut crate::http::Body) -> Bytes {
        let frame = body.frame().await.expect("a frame").expect("no error");
        frame.into_data().expect("data")
    }
}
