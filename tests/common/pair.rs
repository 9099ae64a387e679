//! `TURNSTILE_TEST_STORE=postgres-pair`: every test server on PostgreSQL is two instances on
//! one database (sharing the sandboxes folder, as a shared volume, each with a data folder of
//! its own) behind [`RoundRobin`], a reverse proxy that sends each request to the next
//! instance in turn, as a load balancer without session affinity would. A test then sees what
//! a client of such a deployment sees: any answer a single instance would not give is a gap.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Whether the tests run on two instances (`TURNSTILE_TEST_STORE=postgres-pair`).
pub fn selected() -> bool {
    std::env::var("TURNSTILE_TEST_STORE").is_ok_and(|v| v == "postgres-pair")
}

/// An HTTP/1.1 reverse proxy on a port of its own, alternating between two backends request
/// by request (not connection by connection). Bodies stream both ways as they come (an SSE
/// stream flows event by event); a client going away drops the backend's request too. The
/// `Host` header is passed on as the client sent it (the proxy's loopback address).
pub struct RoundRobin {
    pub addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

type Answer = Response<Either<Incoming, Full<Bytes>>>;

impl RoundRobin {
    pub async fn start(backends: [SocketAddr; 2]) -> RoundRobin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build_http();
        let next = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (client, next) = (client.clone(), next.clone());
                let service = hyper::service::service_fn(move |req| {
                    let to = backends[next.fetch_add(1, Ordering::Relaxed) % 2];
                    forward(client.clone(), to, req)
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), service),
                );
            }
        });
        RoundRobin { addr, accept }
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The request sent on to `to`; its answer, or 502 naming why there is none.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    to: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Answer, std::convert::Infallible> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = format!("http://{to}{path}").parse().expect("a URI");
    Ok(match client.request(req).await {
        Ok(resp) => resp.map(Either::Left),
        Err(e) => Response::builder()
            .status(502)
            .body(Either::Right(Full::new(Bytes::from(format!(
                "proxy to {to}: {e:?}"
            )))))
            .expect("a response"),
    })
}
