//! One connection's defence against a hostile (or just forgetful) client:
//!
//! - a request head must be complete `header_timeout` after its first byte (and a fresh
//!   connection must bring its first head within `header_timeout` of being accepted);
//! - a keep-alive connection with no request under way is closed after `idle_timeout`;
//! - a client that stops reading a response (writes blocked, nothing going out) is cut after
//!   `idle_timeout`;
//! - a response still being sent (an SSE stream of a turn or of `events/stream`) keeps its
//!   connection open however long it lasts: the connection is not idle.
//!
//! Why not hyper's `header_read_timeout`: in hyper 1.x its timer starts as soon as a keep-alive
//! connection goes idle (`State::idle` asks for a read, which arms it), so it would close every
//! idle keep-alive connection after `header_timeout`, and the two timeouts could not differ.
//!
//! Cheap by design: the IO wrapper only reads and writes flags with relaxed atomics (plain loads
//! and stores on x86; no timer is touched per read or write) and reads the clock only when the
//! state changes (the first byte of a head, a write that blocks, a response that ends). One
//! timer per connection wakes at most every `min(header_timeout, idle_timeout)` and checks the
//! flags; it sleeps to the exact deadline once one is known.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::Body;

/// What one connection is doing, shared by its IO wrapper, its responses and its watchdog
/// (all on the connection's task: the atomics are for `Send`, not for contention).
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// Responses not yet fully sent (their bodies are alive).
    busy: AtomicU32,
    /// Bytes of a request head have arrived since the connection last went idle, or the
    /// connection is fresh: the header timeout runs from `since`.
    head: AtomicBool,
    /// Milliseconds after `start`: when the connection last went idle, or when the pending head
    /// began.
    since: AtomicU64,
    /// The last write could not go out (the client is not reading) and none has since.
    write_blocked: AtomicBool,
    /// Milliseconds after `start` when writes blocked.
    blocked_since: AtomicU64,
}

impl Activity {
    /// A fresh connection: it owes its first request head.
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            busy: AtomicU32::new(0),
            head: AtomicBool::new(true),
            since: AtomicU64::new(0),
            write_blocked: AtomicBool::new(false),
            blocked_since: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A request head is complete and its handler starts: the connection is busy until the
    /// returned guard (kept in the response body) is dropped.
    pub(crate) fn begin(self: &Arc<Activity>) -> Busy {
        self.busy.fetch_add(1, Relaxed);
        self.head.store(false, Relaxed);
        Busy(self.clone())
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            busy: self.busy.load(Relaxed) > 0,
            head: self.head.load(Relaxed),
            since: self.since.load(Relaxed),
            write_blocked: self.write_blocked.load(Relaxed),
            blocked_since: self.blocked_since.load(Relaxed),
        }
    }
}

/// Keeps its connection busy (not idle) while alive; the response body carries it, so that a
/// stream keeps its connection until its last frame is sent.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Relaxed) == 1 {
            self.0.since.store(self.0.now_ms(), Relaxed);
        }
    }
}

/// A response body that keeps its connection busy until hyper drops it (sent, or the
/// connection gone). Forwards everything, `size_hint` included (it sets `Content-Length`).
pub(crate) struct Tracked {
    body: Body,
    _busy: Busy,
}

impl Tracked {
    pub(crate) fn new(body: Body, busy: Busy) -> Tracked {
        Tracked { body, _busy: busy }
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, noting the first byte of each request head and whether writes are blocked.
pub(crate) struct Watched<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Watched<T> {
        Watched { io, activity }
    }

    fn wrote(&self, r: &Poll<io::Result<usize>>) {
        let a = &self.activity;
        match r {
            Poll::Pending => {
                if !a.write_blocked.load(Relaxed) {
                    a.blocked_since.store(a.now_ms(), Relaxed);
                    a.write_blocked.store(true, Relaxed);
                }
            }
            Poll::Ready(Ok(n)) if *n > 0 => {
                if a.write_blocked.load(Relaxed) {
                    a.write_blocked.store(false, Relaxed);
                }
            }
            Poll::Ready(_) => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let a = &this.activity;
            if !a.head.load(Relaxed) && a.busy.load(Relaxed) == 0 {
                // The first byte of the next request: its head has `header_timeout` from now.
                a.since.store(a.now_ms(), Relaxed);
                a.head.store(true, Relaxed);
            }
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Why a connection was closed by its watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// A request head was not complete within `[server] header_timeout_s`.
    Head,
    /// No request for `[server] idle_timeout_s`.
    Idle,
    /// The client read nothing of a response for `[server] idle_timeout_s`.
    Write,
}

impl Expired {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Expired::Head => "request head not complete within [server] header_timeout_s",
            Expired::Idle => "idle for [server] idle_timeout_s",
            Expired::Write => "client read nothing for [server] idle_timeout_s",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    busy: bool,
    head: bool,
    since: u64,
    write_blocked: bool,
    blocked_since: u64,
}

/// The earliest deadline that applies (milliseconds after the connection's start), or which
/// one has passed at `now`. `None`: nothing can expire until the state changes.
fn deadline(s: Snapshot, now: u64, header: u64, idle: u64) -> Result<Option<u64>, Expired> {
    let mut due: Option<(u64, Expired)> = None;
    let mut consider = |at: u64, why: Expired| {
        if due.is_none_or(|(d, _)| at < d) {
            due = Some((at, why));
        }
    };
    if s.write_blocked {
        consider(s.blocked_since.saturating_add(idle), Expired::Write);
    }
    if !s.busy {
        if s.head {
            consider(s.since.saturating_add(header), Expired::Head);
        } else {
            consider(s.since.saturating_add(idle), Expired::Idle);
        }
    }
    match due {
        Some((at, why)) if at <= now => Err(why),
        Some((at, _)) => Ok(Some(at)),
        None => Ok(None),
    }
}

/// Returns when the connection has broken one of its timeouts; the caller then drops the
/// connection (closing the socket). Never returns while a response is being sent to a
/// reading client.
pub(crate) async fn watchdog(activity: &Activity, header: Duration, idle: Duration) -> Expired {
    // A state change (a head starting, a response ending, writes blocking) is noticed within
    // `tick`; from then on the exact deadline is slept to, so timeouts are exact.
    let tick = header.min(idle);
    let (header, idle) = (header.as_millis() as u64, idle.as_millis() as u64);
    let tick_ms = tick.as_millis() as u64;
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
        sleep.as_mut().await;
        let now = activity.now_ms();
        let next = match deadline(activity.snapshot(), now, header, idle) {
            Err(why) => return why,
            Ok(at) => at.map_or(now + tick_ms, |at| at.min(now + tick_ms)),
        };
        sleep
            .as_mut()
            .reset(activity.start + Duration::from_millis(next));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(busy: bool, head: bool, since: u64) -> Snapshot {
        Snapshot {
            busy,
            head,
            since,
            write_blocked: false,
            blocked_since: 0,
        }
    }

    #[test]
    fn a_fresh_connection_owes_its_head_within_the_header_timeout() {
        let s = snap(false, true, 0);
        assert_eq!(deadline(s, 0, 1_000, 2_000), Ok(Some(1_000)));
        assert_eq!(deadline(s, 1_000, 1_000, 2_000), Err(Expired::Head));
    }

    #[test]
    fn an_idle_connection_lasts_the_idle_timeout_not_the_header_timeout() {
        let s = snap(false, false, 500);
        assert_eq!(deadline(s, 1_600, 1_000, 2_000), Ok(Some(2_500)));
        assert_eq!(deadline(s, 2_500, 1_000, 2_000), Err(Expired::Idle));
    }

    #[test]
    fn a_head_started_while_idle_has_the_header_timeout_from_its_first_byte() {
        let s = snap(false, true, 10_000);
        assert_eq!(deadline(s, 10_500, 1_000, 60_000), Ok(Some(11_000)));
        assert_eq!(deadline(s, 11_000, 1_000, 60_000), Err(Expired::Head));
    }

    #[test]
    fn a_busy_connection_never_expires_unless_its_client_stops_reading() {
        let s = snap(true, false, 0);
        assert_eq!(deadline(s, 1_000_000, 1_000, 2_000), Ok(None));
        let blocked = Snapshot {
            write_blocked: true,
            blocked_since: 5_000,
            ..s
        };
        assert_eq!(deadline(blocked, 6_000, 1_000, 2_000), Ok(Some(7_000)));
        assert_eq!(deadline(blocked, 7_000, 1_000, 2_000), Err(Expired::Write));
    }

    #[test]
    fn a_response_keeps_its_connection_busy_until_its_body_is_dropped() {
        let a = Activity::new();
        let first = a.begin();
        let second = a.begin();
        drop(first);
        assert!(a.snapshot().busy);
        drop(second);
        let s = a.snapshot();
        assert!(!s.busy && !s.head);
    }
}
