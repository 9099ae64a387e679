//! What a web page the user visits could make the user's browser send us, refused.
//!
//! A keyless server on loopback trusts whoever can reach it, and a browser reaches it for any
//! page: a form post or a `no-cors` `fetch` from another site runs a turn without reading the
//! answer (a CORS "simple" request), and a page whose host name the attacker re-points at
//! 127.0.0.1 (DNS rebinding) reads the answers too. Three checks, on every route:
//!
//! - **Host.** On a keyless loopback server a request must name a loopback host (`localhost`,
//!   `*.localhost`, `127.x.x.x`, `[::1]`) or one of `[server] allowed_hosts`: a rebinding page
//!   names its own. With keys (a browser cannot add a bearer key to a page's request) or on a
//!   public address, any host is taken unless `allowed_hosts` is set.
//! - **Site.** A request the browser marks `Sec-Fetch-Site: cross-site` or `same-site` (another
//!   port of loopback is the same site), or, from a browser without that header, whose `Origin`
//!   is not the server's own, is refused; only a navigation to the console may come from
//!   elsewhere (a link to it). Clients that are not browsers send neither header.
//! - **Content type.** A `POST` with a body to a JSON route must say `application/json` (or
//!   `+json`): a form's or a `no-cors` fetch's types (`text/plain`, form encodings, none) are
//!   what a page can send without asking.

use std::net::{IpAddr, SocketAddr};

use http::{header, HeaderMap, Method, StatusCode};

use super::{ApiError, Request};

/// Which `Host` names are served.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hosts {
    Any,
    /// Loopback names and these (lower case, no port).
    Loopback(Vec<String>),
}

/// The checks of the module documentation, for one listener.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    hosts: Hosts,
    /// `[server] allowed_hosts`: an `Origin` naming one of them is the server's own too (behind
    /// a proxy that rewrites `Host`).
    allowed: Vec<String>,
}

impl Guard {
    /// The guard of a listener on `listen`: `allowed` is `[server] allowed_hosts` (`*` in it:
    /// any host), `keyed` whether API keys are required there.
    pub(crate) fn new(allowed: Option<&[String]>, listen: SocketAddr, keyed: bool) -> Guard {
        let list: Vec<String> = allowed
            .unwrap_or_default()
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let hosts = match allowed {
            Some(l) if l.iter().any(|h| h == "*") => Hosts::Any,
            Some(_) => Hosts::Loopback(list.clone()),
            None if !keyed && listen.ip().is_loopback() => Hosts::Loopback(Vec::new()),
            None => Hosts::Any,
        };
        Guard {
            hosts,
            allowed: list,
        }
    }

    /// Refuse what a web page could have sent (see the module documentation); `navigable`:
    /// the route is a page a link may lead to.
    pub(crate) fn check(&self, req: &Request, navigable: bool) -> Result<(), ApiError> {
        check_parts(self, req.method(), req.headers(), navigable)
    }

    fn host_allowed(&self, host: &str) -> bool {
        match &self.hosts {
            Hosts::Any => true,
            Hosts::Loopback(extra) => is_loopback_name(host) || extra.iter().any(|h| h == host),
        }
    }
}

fn check_parts(
    guard: &Guard,
    method: &Method,
    headers: &HeaderMap,
    navigable: bool,
) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(h) = host {
        let name = host_name(h);
        if !guard.host_allowed(&name) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!(
                    "this server answers requests for loopback names only, not {name:?} (a web page that re-points its own name at this machine would otherwise reach it); add the name to [server] allowed_hosts in tools.toml if you serve it under that name"
                ),
            ));
        }
    }
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let navigation = navigable
        && matches!(*method, Method::GET | Method::HEAD)
        && headers
            .get("sec-fetch-mode")
            .is_some_and(|m| m.as_bytes().eq_ignore_ascii_case(b"navigate"));
    let from_elsewhere = match site.as_deref() {
        Some("same-origin") | Some("none") => false,
        Some(_) => true,
        None => match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
            None => false,
            Some(origin) => !own_origin(guard, origin, host),
        },
    };
    if from_elsewhere && !navigation {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site_request",
            "a request from another web site (or another port of this machine) is refused: only the console served here, and clients that are not browsers, may call this API",
        ));
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) is the server's own: the `Host` the request
/// names, or a host of `[server] allowed_hosts`.
fn own_origin(guard: &Guard, origin: &str, host: Option<&str>) -> bool {
    let Some((_, authority)) = origin.split_once("://") else {
        // `null` (a sandboxed frame, a file) and anything else: not ours.
        return false;
    };
    host.is_some_and(|h| h.eq_ignore_ascii_case(authority))
        || guard.allowed.iter().any(|a| *a == host_name(authority))
}

/// The host name of a `Host` header or an origin's authority, lower case, without the port
/// (`[::1]:80` is `[::1]`).
fn host_name(authority: &str) -> String {
    let name = if authority.starts_with('[') {
        authority
            .split_once(']')
            .map_or(authority, |(v6, _)| &authority[..=v6.len()])
    } else {
        authority.split(':').next().unwrap_or(authority)
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `localhost`, `*.localhost` (RFC 6761: browsers resolve them to loopback), or a loopback
/// address.
fn is_loopback_name(name: &str) -> bool {
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A `POST` with a body must be JSON (see the module documentation); 415 otherwise.
pub(crate) fn require_json(req: &Request) -> Result<(), ApiError> {
    json_body(req.method(), req.headers())
}

fn json_body(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if *method != Method::POST {
        return Ok(());
    }
    let media = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?"))
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|l| l.as_bytes() != b"0");
    match media.as_deref() {
        Some("application/json") => Ok(()),
        Some(m) if m.starts_with("application/") && m.ends_with("+json") => Ok(()),
        None if !has_body => Ok(()),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "this endpoint takes JSON: send Content-Type: application/json (curl: --json '{{…}}'), not {}",
                match other {
                    Some(m) => format!("{m:?}"),
                    None => "a body without a Content-Type".to_string(),
                }
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
