//! The environment's proxies (curl's reading of `http_proxy`, `https_proxy`, `all_proxy` and
//! `no_proxy`), and which one a URL goes through.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use http::{HeaderValue, Uri};

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

    pub(super) fn authority(&self) -> &str {
        self.uri.authority().map_or("", |a| a.as_str())
    }
}

/// `%XX` decoding (RFC 3986): each `%` followed by two hex digits becomes that byte, anything
/// else is kept as it is (`+` included). For proxy credentials and `data:` URIs; query strings
/// are form-decoded with `form_urlencoded` (`http/query.rs`).
pub(crate) fn percent_decode(s: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(s).collect()
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

#[cfg(test)]
mod tests;
