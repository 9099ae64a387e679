//! The accept loop: one task per connection, `TCP_NODELAY` on every socket, at most
//! `[server] max_connections` open at once, each watched for its timeouts (see [`super::conn`]),
//! graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::conn::{watchdog, Activity, Tracked, Watched};
use super::{Request, Response};
use crate::config::ServerConfig;
use crate::metrics;

/// At most one WARN line about refused connections this often.
const REFUSED_WARN_EVERY: Duration = Duration::from_secs(10);

/// Serve every request with `handle` until `shutdown` is cancelled, then stop accepting and
/// give open connections `grace` to finish (streams of running turns end when their turns end).
/// `server` gives the connection limits and timeouts.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    server: ServerConfig,
    handle: H,
    shutdown: CancellationToken,
    grace: Duration,
) where
    H: Fn(Request) -> F + Clone + Send + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let (header_timeout, idle_timeout) = (server.header_timeout, server.idle_timeout);
    super::body::set_stall_timeout(idle_timeout);
    let slots = Arc::new(Semaphore::new(server.max_connections));
    let mut refused = Refused::default();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the limit: closed at once (dropping it), so it holds no descriptor.
            drop(stream);
            refused.one(server.max_connections);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let activity = Activity::new();
        let handle = handle.clone();
        let on_request = activity.clone();
        let service = service_fn(move |req| {
            let busy = on_request.begin();
            let resp = handle(req);
            async move {
                let resp = resp.await;
                Ok::<_, std::convert::Infallible>(resp.map(|body| Tracked::new(body, busy)))
            }
        });
        // hyper's own `header_read_timeout` stays off (no timer is set): it would also close
        // idle keep-alive connections after the header timeout; the watchdog does both.
        let conn = http1::Builder::new().keep_alive(true).serve_connection(
            TokioIo::new(Watched::new(stream, activity.clone())),
            service,
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _slot = slot;
            let _open = metrics::connection_open();
            tokio::select! {
                // The connection first: polled on every wake-up, the watchdog's timer after it.
                biased;
                r = conn => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                },
                why = watchdog(&activity, header_timeout, idle_timeout) => {
                    metrics::inc(&metrics::CONNECTIONS_TIMED_OUT);
                    tracing::debug!(%peer, reason = why.as_str(), "connection closed");
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open after the shutdown grace period");
    }
}

/// Connections refused for `max_connections`: counted, and logged at most once per
/// [`REFUSED_WARN_EVERY`] (a flood must not flood the log too).
#[derive(Default)]
struct Refused {
    since_warn: u64,
    last_warn: Option<Instant>,
}

impl Refused {
    fn one(&mut self, max: usize) {
        metrics::inc(&metrics::CONNECTIONS_REFUSED);
        self.since_warn += 1;
        let now = Instant::now();
        if self
            .last_warn
            .is_none_or(|t| now.duration_since(t) >= REFUSED_WARN_EVERY)
        {
            tracing::warn!(
                refused = self.since_warn,
                "refused connections: {max} are open (the limit: [server] max_connections in tools.toml); \
                 raise it if this is expected load"
            );
            self.since_warn = 0;
            self.last_warn = Some(now);
        }
    }
}
