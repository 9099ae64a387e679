//! Outbound HTTP plumbing shared by the upstream providers and the MCP HTTP client: proxies
//! from the environment and TLS that trusts the system's roots as well as the webpki ones.
//!
//! Proxies follow curl's reading of the environment: `https_proxy`/`HTTPS_PROXY` for `https://`
//! URLs, `http_proxy`/`HTTP_PROXY` for `http://` ones, `all_proxy`/`ALL_PROXY` for either
//! (lowercase first), and `no_proxy`/`NO_PROXY` (comma-separated hosts, `.domain` or `domain`
//! for a domain and its subdomains, IP addresses, CIDR ranges, `*` for all) for the hosts that
//! are reached directly. Loopback is not exempt unless listed. Only `http://` proxies are
//! spoken to: an `https://` URL goes through a `CONNECT` tunnel (TLS end to end with the
//! server), an `http://` URL is sent to the proxy in absolute form. Credentials in the proxy URL
//! (`http://user:pass@proxy:3128`) are sent as `Proxy-Authorization: Basic`.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest proxy answer to `CONNECT` read (its head; it has no body).
const MAX_CONNECT_ANSWER: usize = 8 * 1024;

/// A proxy: where it is, and its credentials if its URL had some.
#[derive(Debug, Clone, PartialEq)]
pub struct Proxy {
    /// `http://host:port`.
    pub uri: Uri,
    /// `Basic ...`, marked sensitive.
    pub auth: Option<HeaderValue>,
}

impl Proxy {
    /// A proxy URL as the variables hold it (`host:port` alone means `http://host:port`).
    fn parse(s: &str) -> Option<Proxy> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        let with_scheme = if s.contains("://") {
            s.to_string()
        } else {
            format!("http://{s}")
        };
        let (scheme, rest) = with_scheme.split_once("://")?;
        if !scheme.eq_ignore_ascii_case("http") {
            tracing::warn!(proxy = %scheme, "only http:// proxies are supported; this proxy setting is ignored");
            return None;
        }
        let authority = rest.split('/').next()?;
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let host = if host.contains(':') && !host.ends_with(']') {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        let uri: Uri = format!("http://{host}").parse().ok()?;
        let auth = userinfo.and_then(|u| {
            let decoded = percent_decode(u);
            let encoded = base64::engine::general_purpose::STANDARD.encode(decoded);
            let mut v = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
            v.set_sensitive(true);
            Some(v)
        });
        Some(Proxy { uri, auth })
    }

    fn authority(&self) -> &str {
        self.uri.authority().map_or("", |a| a.as_str())
    }
}

/// `%XX` decoding (RFC 3986): each `%` followed by two hex digits becomes that byte, anything
/// else is kept as it is (`+` included: form decoding is the caller's). The one decoder of the
/// crate: proxy credentials, `data:` URIs, query parameters.
pub(crate) fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq)]
enum Bypass {
    All,
    /// A host name and its subdomains (lowercase, no leading dot).
    Domain(String),
    /// An address range (a single address has the full prefix).
    Net(IpAddr, u8),
}

/// The proxies of the environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proxies {
    http: Option<Proxy>,
    https: Option<Proxy>,
    bypass: Vec<Bypass>,
}

impl Proxies {
    /// From the process's environment.
    pub fn from_env() -> Proxies {
        Proxies::from_lookup(&|k| std::env::var(k).ok())
    }

    /// From the variables `lookup` gives.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Proxies {
        let var = |name: &str| {
            lookup(&name.to_ascii_lowercase())
                .or_else(|| lookup(&name.to_ascii_uppercase()))
                .filter(|v| !v.trim().is_empty())
        };
        let all = var("all_proxy").and_then(|v| Proxy::parse(&v));
        let http = var("http_proxy")
            .and_then(|v| Proxy::parse(&v))
            .or_else(|| all.clone());
        let https = var("https_proxy").and_then(|v| Proxy::parse(&v)).or(all);
        let bypass = var("no_proxy")
            .map(|v| v.split(',').filter_map(parse_bypass).collect())
            .unwrap_or_default();
        Proxies {
            http,
            https,
            bypass,
        }
    }

    /// The proxy a request to `uri` goes through, if any.
    pub fn for_uri(&self, uri: &Uri) -> Option<&Proxy> {
        let proxy = match uri.scheme_str() {
            Some("https") => self.https.as_ref(),
            _ => self.http.as_ref(),
        }?;
        let host = uri.host()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if self.bypassed(host) {
            return None;
        }
        Some(proxy)
    }

    fn bypassed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        self.bypass.iter().any(|b| match b {
            Bypass::All => true,
            Bypass::Domain(d) => host == *d || host.ends_with(&format!(".{d}")),
            Bypass::Net(net, bits) => ip.is_some_and(|ip| in_net(ip, *net, *bits)),
        })
    }
}

fn parse_bypass(entry: &str) -> Option<Bypass> {
    let e = entry.trim().to_ascii_lowercase();
    if e.is_empty() {
        return None;
    }
    if e == "*" {
        return Some(Bypass::All);
    }
    if let Some((addr, bits)) = e.split_once('/') {
        let addr: IpAddr = addr.parse().ok()?;
        let bits: u8 = bits.parse().ok()?;
        return Some(Bypass::Net(addr, bits));
    }
    let bare = e.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        return Some(Bypass::Net(ip, bits));
    }
    // `host:port`: the port is not looked at.
    let host = e.trim_start_matches("*.").trim_start_matches('.');
    let host = host.split(':').next().unwrap_or(host);
    Some(Bypass::Domain(host.to_string()))
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = u32::from(bits.min(32));
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = u32::from(bits.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The environment's proxies, read once.
pub fn proxies() -> Arc<Proxies> {
    static PROXIES: OnceLock<Arc<Proxies>> = OnceLock::new();
    PROXIES
        .get_or_init(|| {
            let p = Proxies::from_env();
            if p.http.is_some() || p.https.is_some() {
                tracing::info!(
                    http = p.http.as_ref().map(Proxy::authority).unwrap_or("-"),
                    https = p.https.as_ref().map(Proxy::authority).unwrap_or("-"),
                    no_proxy = p.bypass.len(),
                    "outbound HTTP goes through a proxy"
                );
            }
            Arc::new(p)
        })
        .clone()
}

/// TLS for outbound connections: the webpki roots plus the system's (`SSL_CERT_FILE`,
/// `SSL_CERT_DIR`, else the distribution's bundle), built once.
pub fn tls_config() -> rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            let (added, _) = roots.add_parsable_certificates(native_certs());
            tracing::debug!(system_roots = added, "TLS roots: webpki and the system's");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(roots.clone())
                        .with_no_client_auth()
                })
                .unwrap_or_else(|_| {
                    rustls::ClientConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                    .expect("TLS 1.3 with ring is always supported")
                })
        })
        .clone()
}

/// The system's CA certificates (Linux locations, as OpenSSL finds them).
fn native_certs() -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut files = Vec::new();
    if let Some(f) = std::env::var_os("SSL_CERT_FILE") {
        files.push(std::path::PathBuf::from(f));
    } else if let Some(f) = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file())
    {
        files.push(f);
    }
    if let Some(dir) = std::env::var_os("SSL_CERT_DIR") {
        for d in std::env::split_paths(&dir) {
            if let Ok(entries) = std::fs::read_dir(&d) {
                files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
            }
        }
    }
    files
        .iter()
        .filter_map(|f| CertificateDer::pem_file_iter(f).ok())
        .flat_map(|certs| certs.flatten())
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(vars: &[(&str, &str)]) -> Proxies {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Proxies::from_lookup(&move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    fn via(p: &Proxies, url: &str) -> Option<String> {
        p.for_uri(&url.parse().unwrap())
            .map(|p| p.authority().to_string())
    }

    #[test]
    fn proxies_follow_the_scheme_and_no_proxy() {
        let p = proxies(&[
            ("HTTPS_PROXY", "http://secure:3128"),
            ("http_proxy", "plain:8080"),
            ("HTTP_PROXY", "http://ignored:1"),
            (
                "NO_PROXY",
                "internal.example, .corp, 10.0.0.0/8, ::1, 192.168.1.5",
            ),
        ]);
        assert_eq!(
            via(&p, "https://api.openai.com/v1").as_deref(),
            Some("secure:3128")
        );
        assert_eq!(
            via(&p, "http://127.0.0.1:11434/v1").as_deref(),
            Some("plain:8080")
        );
        assert_eq!(via(&p, "https://internal.example/x"), None);
        assert_eq!(via(&p, "https://a.internal.example/x"), None);
        assert_eq!(
            via(&p, "https://notinternal.example/x").as_deref(),
            Some("secure:3128")
        );
        assert_eq!(via(&p, "https://x.corp/"), None);
        assert_eq!(via(&p, "http://10.1.2.3/"), None);
        assert_eq!(via(&p, "http://11.1.2.3/").as_deref(), Some("plain:8080"));
        assert_eq!(via(&p, "http://[::1]:8080/"), None);
        assert_eq!(via(&p, "http://192.168.1.5/"), None);
        assert_eq!(
            via(
                &proxies(&[("no_proxy", "*"), ("ALL_PROXY", "p:1")]),
                "https://a/"
            ),
            None
        );
        assert_eq!(
            via(&proxies(&[("ALL_PROXY", "p:1")]), "https://a/").as_deref(),
            Some("p:1")
        );
        assert_eq!(via(&proxies(&[]), "https://a/"), None);
        // Only http:// proxies are spoken to.
        assert_eq!(
            via(&proxies(&[("HTTPS_PROXY", "socks5://s:1")]), "https://a/"),
            None
        );
    }

    #[test]
    fn proxy_credentials_become_basic_auth() {
        let p = Proxy::parse("http://us%40er:p%3Ass@proxy:3128/").unwrap();
        assert_eq!(p.authority(), "proxy:3128");
        let expected = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
        assert_eq!(
            p.auth.unwrap().to_str().unwrap(),
            format!("Basic {expected}")
        );
        assert_eq!(Proxy::parse("proxy").unwrap().authority(), "proxy:80");
    }

    #[test]
    fn percent_decoding_keeps_what_is_not_an_escape() {
        assert_eq!(percent_decode("a%2"), b"a%2");
        assert_eq!(percent_decode("%zz%41"), b"%zzA");
        assert_eq!(percent_decode("%+1%2b+"), b"%+1++");
        assert_eq!(percent_decode("%e4%b8%ad"), "中".as_bytes());
    }

    #[test]
    fn system_roots_are_trusted_besides_webpki() {
        // Whatever the machine has, the config builds (and its roots include webpki's).
        let _ = tls_config();
    }
}
