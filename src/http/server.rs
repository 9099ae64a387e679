//! The accept loop: one task per connection, `TCP_NODELAY` on every socket, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::routes::{handle, App};

/// Serve until `shutdown` is cancelled, then stop accepting and give open connections `grace`
/// to finish (streams of running turns end when their turns end).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: CancellationToken,
    grace: Duration,
) {
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
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let app = app.clone();
        let service = service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, std::convert::Infallible>(handle(app, req).await) }
        });
        let conn = http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
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
