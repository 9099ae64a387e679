//! The one connector of every outbound connection (the providers', the MCP HTTP client's, the
//! OAuth and OTLP requests'): TCP with `TCP_NODELAY`, through the environment's proxy where it
//! applies (a `CONNECT` tunnel for `https://`), TLS; and the pooled client built on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_service::Service;

use super::proxy::{proxies, Proxies, Proxy};
use super::tls::tls_config;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest proxy answer to `CONNECT` read (its head; it has no body).
const MAX_CONNECT_ANSWER: usize = 8 * 1024;

/// A connection made by [`Connector`]: to the server, or to a proxy (then `proxied` when
/// requests must be in absolute form, i.e. plain HTTP through the proxy).
pub struct Stream {
    io: TokioIo<TcpStream>,
    /// Plain HTTP through a proxy: requests carry the absolute URL (and the proxy's
    /// credentials, when it has some).
    pub proxied: Option<Option<HeaderValue>>,
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied.is_some())
    }
}

/// TCP connections (`TCP_NODELAY`), through the environment's proxy where it applies: what
/// the TLS layer of [`connector`] wraps.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    proxies: Arc<Proxies>,
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let proxy = self.proxies.for_uri(&uri).cloned();
        Box::pin(async move {
            let Some(proxy) = proxy else {
                let io = http.call(uri).await?;
                return Ok(Stream { io, proxied: None });
            };
            let io = http
                .call(proxy.uri.clone())
                .await
                .map_err(|e| format!("cannot connect to the proxy {}: {e}", proxy.authority()))?;
            if uri.scheme_str() != Some("https") {
                return Ok(Stream {
                    io,
                    proxied: Some(proxy.auth.clone()),
                });
            }
            let tcp = tunnel(io.into_inner(), &uri, &proxy).await?;
            Ok(Stream {
                io: TokioIo::new(tcp),
                proxied: None,
            })
        })
    }
}

/// Asks the proxy for a tunnel to `uri`'s host and port (`CONNECT`); the stream, once it
/// answered 2xx.
async fn tunnel(mut tcp: TcpStream, uri: &Uri, proxy: &Proxy) -> Result<TcpStream, BoxError> {
    let host = uri.host().ok_or("the URL has no host")?;
    let port = uri.port_u16().unwrap_or(443);
    let target = format!("{host}:{port}");
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = &proxy.auth {
        head.push_str("Proxy-Authorization: ");
        head.push_str(auth.to_str().unwrap_or_default());
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await?;
    let mut answer = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        if answer.len() > MAX_CONNECT_ANSWER {
            return Err(format!(
                "the proxy {}'s answer to CONNECT is too long",
                proxy.authority()
            )
            .into());
        }
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Err(format!(
                "the proxy {} closed the connection during CONNECT",
                proxy.authority()
            )
            .into());
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let status_line = String::from_utf8_lossy(&answer);
    let status_line = status_line.lines().next().unwrap_or_default();
    let ok = status_line
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code.starts_with('2'));
    if !ok {
        return Err(format!(
            "the proxy {} refused the tunnel to {target}: {status_line}",
            proxy.authority()
        )
        .into());
    }
    Ok(tcp)
}

/// The pooled HTTP/1 client (http and https) the MCP HTTP client and the OTLP exporter hold:
/// what [`https_client`] builds.
pub(crate) type HttpsClient = Client<HttpsConnector<Connector>, Full<Bytes>>;

/// A pooled client (hyper-util's, a task per connection) over [`connector`].
pub(crate) fn https_client(connect_timeout: Option<Duration>) -> HttpsClient {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(connector(connect_timeout))
}

/// Connects to `http://` and `https://` URLs, through the environment's proxy where it
/// applies: TLS (webpki and system roots), HTTP/1, `TCP_NODELAY`. `connect_timeout` bounds
/// the TCP connect (`None`: no bound of its own).
pub fn connector(connect_timeout: Option<Duration>) -> HttpsConnector<Connector> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_connect_timeout(connect_timeout);
    HttpsConnectorBuilder::new()
        .with_tls_config(tls_config())
        .https_or_http()
        .enable_http1()
        .wrap_connector(Connector {
            http,
            proxies: proxies(),
        })
}
