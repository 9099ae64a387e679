//! Outbound HTTP: every request turnstile makes (to model providers, remote MCP servers, OAuth
//! servers, the OTLP collector) is connected here, with one connector.
//!
//! - `proxy.rs`: the environment's proxies, curl's reading: `https_proxy`/`HTTPS_PROXY` for
//!   `https://` URLs, `http_proxy`/`HTTP_PROXY` for `http://` ones, `all_proxy`/`ALL_PROXY` for
//!   either (lowercase first), and `no_proxy`/`NO_PROXY` (comma-separated hosts, `.domain` or
//!   `domain` for a domain and its subdomains, IP addresses, CIDR ranges, `*` for all) for the
//!   hosts that are reached directly. Loopback is not exempt unless listed. Only `http://`
//!   proxies are spoken to: an `https://` URL goes through a `CONNECT` tunnel (TLS end to end
//!   with the server), an `http://` URL is sent to the proxy in absolute form. Credentials in
//!   the proxy URL (`http://user:pass@proxy:3128`) are sent as `Proxy-Authorization: Basic`.
//! - `tls.rs`: TLS that trusts the system's roots as well as the webpki ones.
//! - `connect.rs`: the connector (TCP with `TCP_NODELAY`, the proxy, TLS) and the pooled
//!   client built on it ([`https_client`]: hyper-util's, a task per connection), which the MCP
//!   HTTP client, OAuth and the OTLP exporter use.
//! - `http1.rs`: the providers' connections, on the same connector but driven by the task that
//!   makes the call (no hand-off per frame). The two differ on purpose: a model call is one
//!   request whose body one task reads to its end, so that task can poll the connection itself;
//!   rmcp's transport hands bodies to its own worker and sends requests concurrently on one
//!   client, which needs the connection to run on a task of its own.
//! - `event_stream.rs`: the bounded Server-Sent Events parsers: one tokenizer, and the event
//!   assemblers of the providers' streams and of the MCP client's.

pub(crate) mod connect;
pub mod event_stream;
pub(crate) mod http1;
pub mod proxy;
pub mod tls;

pub use connect::{connector, Connector, Stream};
pub(crate) use connect::{https_client, HttpsClient};
pub(crate) use proxy::percent_decode;
pub use proxy::{proxies, Proxies, Proxy};
pub use tls::tls_config;
