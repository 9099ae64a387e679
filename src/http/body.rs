//! Reading request bodies: bounded in size and in patience, and JSON errors that say where and
//! what.
//!
//! A body is refused before any of it is read when its declared `Content-Length` is over the
//! route's limit ([`check_declared_length`]); one that arrives in pieces is counted as it comes,
//! never more than the limit buffered; one that stalls (no bytes for `[server] idle_timeout_s`)
//! is cut off with a 408 instead of holding its connection and handler forever.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// How long a request body may send nothing before it is cut off, in milliseconds: the server's
/// `[server] idle_timeout_s`, set by [`set_stall_timeout`] when it starts serving.
static STALL_MS: AtomicU64 = AtomicU64::new(60_000);

/// Set how long a request body may stall (process-wide: the server calls it once at start).
pub(crate) fn set_stall_timeout(d: Duration) {
    STALL_MS.store(d.as_millis().max(1) as u64, Ordering::Relaxed);
}

fn stall_timeout() -> Duration {
    Duration::from_millis(STALL_MS.load(Ordering::Relaxed))
}

/// A request whose declared `Content-Length` is over `limit` bytes: 413 at once, before any
/// of its body is read. `key` names the config key that sets the limit, `kind` is the error type
/// (the route's own for a body over its limit, e.g. `file_too_large`).
pub(crate) fn check_declared_length(
    headers: &http::HeaderMap,
    limit: u64,
    key: &str,
    kind: &'static str,
) -> Result<(), ApiError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > limit => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            kind,
            format!(
                "the request body declares {n} bytes, over the limit of {limit} bytes ({key} in tools.toml); send less"
            ),
        )),
        _ => Ok(()),
    }
}

/// The body stalled: no bytes for the stall timeout.
#[derive(Debug)]
pub(crate) struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no bytes of the request body arrived for {} s (the limit: [server] idle_timeout_s in tools.toml); send the body without pausing",
            self.0.as_secs()
        )
    }
}

impl std::error::Error for Stalled {}

/// A body that fails with [`Stalled`] when no frame comes for the stall timeout. The timer is
/// made only when a frame is not ready at once (a small body that came with its head never
/// makes one), and is re-armed, not re-made, between frames.
pub(crate) struct Patient<B> {
    body: B,
    stall: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A frame came since the timer was last armed: re-arm it before waiting.
    rearm: bool,
}

/// `body`, cut off with [`Stalled`] when it sends nothing for `[server] idle_timeout_s`.
pub(crate) fn patient<B>(body: B) -> Patient<B> {
    Patient {
        body,
        stall: stall_timeout(),
        timer: None,
        rearm: false,
    }
}

impl<B> HttpBody for Patient<B>
where
    B: HttpBody + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(r) => {
                this.rearm = true;
                Poll::Ready(r.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = tokio::time::Instant::now() + this.stall;
                let timer = match &mut this.timer {
                    Some(t) => {
                        if this.rearm {
                            t.as_mut().reset(deadline);
                        }
                        t
                    }
                    None => this
                        .timer
                        .insert(Box::pin(tokio::time::sleep_until(deadline))),
                };
                this.rearm = false;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Stalled(this.stall))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The whole body, refusing more than `limit` bytes (413) and a body that stalls (408).
pub(crate) async fn read_limited(body: Incoming, limit: u64) -> Result<Bytes, ApiError> {
    match Limited::new(patient(body), limit as usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the request body is over the limit of {limit} bytes; send less, or raise [server] max_body_bytes"
                ),
            ))
        }
        Err(e) if e.downcast_ref::<Stalled>().is_some() => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_stalled",
            e.to_string(),
        )),
        Err(e) => Err(ApiError::bad_request(format!("could not read the request body: {e}"))),
    }
}

/// Parse a JSON body into `T`; an empty body parses as `{}`.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid here: {e}; see GET /meta and the AAP schema for the expected shape"
        ))
    })
}

/// Read and parse a JSON body.
pub(crate) async fn json<T: DeserializeOwned>(body: Incoming, limit: u64) -> Result<T, ApiError> {
    let bytes = read_limited(body, limit).await?;
    parse_json(&bytes)
}

#[cfg(test)]
mod tests;
