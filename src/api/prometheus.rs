//! `GET /metrics`: the process metrics ([`crate::metrics`]) with the engine's gauges sampled at
//! each scrape, on the API's port and, with `[server] metrics_listen`, on a port of its own.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::engine::Engine;
use crate::http::browser::Guard;
use crate::http::{text_response, ApiError, Request, Response};
use crate::metrics::{render, CONTENT_TYPE};

/// The metrics in the Prometheus text format, the engine's gauges sampled now.
pub(crate) fn response(engine: &Engine) -> Response {
    let (sessions, pending) = engine.gauges();
    text_response(StatusCode::OK, CONTENT_TYPE, render(sessions, pending))
}

/// The metrics port's one route.
fn answer(engine: &Engine, guard: &Guard, req: &Request) -> Response {
    if let Err(e) = guard.check(req, false) {
        return e.into_response();
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => response(engine),
        (_, "/metrics") => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "only GET is served on /metrics",
        )
        .into_response(),
        (_, path) => ApiError::not_found(format!(
            "{path} is not served here: [server] metrics_listen serves only GET /metrics"
        ))
        .into_response(),
    }
}

/// Serve `GET /metrics` alone, without API keys, on `[server] metrics_listen` (a port for the
/// scraper, kept off the API's), until `shutdown`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    engine: Engine,
    guard: Guard,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (engine, guard) = (engine.clone(), guard.clone());
        let service = hyper::service::service_fn(move |req: Request| {
            std::future::ready(Ok::<_, std::convert::Infallible>(answer(
                &engine, &guard, &req,
            )))
        });
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            // A scrape under way finishes; an idle keep-alive connection closes at once.
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        });
    }
}
