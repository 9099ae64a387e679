//! `GET /console`: the web console, a single-page app whose assets (the top-level `console/`
//! folder) are embedded in the binary and served under a strict Content-Security-Policy.
//!
//! The assets are public (they hold no data; the app signs in with a key kept in the browser's
//! `sessionStorage` and calls the API from the same origin with it). One data route of its own,
//! `GET /console/pending`, needs the key like the API: the calls waiting for a person's
//! permission across the caller's sessions, each with the policy verdict and rule that asked
//! (one request for the console's approvals badge instead of one per session).

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Empty, Full};

use serde_json::{json, Value};

use crate::http::{json_response, query_param, ApiError, Request, Response};
use crate::protocol::context::{App, Caller};

/// No inline script or style, nothing from another origin, no framing, no form posts.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One embedded asset: its path under `/console/`, content type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../../console/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../console/app.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../console/style.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../../console/favicon.svg"),
    },
];

/// `GET /console/{asset}`: an embedded asset, or a 404 naming where the console is.
pub(crate) fn asset(name: &str, req: &Request) -> Result<Response, ApiError> {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => Ok(asset_response(asset, req)),
        None => Err(ApiError::not_found(format!(
            "no console asset /console/{name}; the console is at /console"
        ))),
    }
}

/// An asset (or a 304 when the client's copy is current), with the console's security headers.
fn asset_response(asset: &Asset, req: &Request) -> Response {
    let etag = etag(asset.body);
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let (status, body) = if fresh {
        (StatusCode::NOT_MODIFIED, Empty::new().boxed_unsync())
    } else if *req.method() == Method::HEAD {
        (StatusCode::OK, Empty::new().boxed_unsync())
    } else {
        (
            StatusCode::OK,
            Full::new(Bytes::from_static(asset.body)).boxed_unsync(),
        )
    };
    let mut resp = http::Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    if !fresh {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(asset.body.len()));
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Revalidated on every load (cheap: a 304 by ETag), so a new binary's console is seen at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// `GET /console/pending[?session=ID]`: `{"pending": [{"session", "agent", "toolCallId", "name",
/// "input", "expires_at", "expired"?, "server", "tool", "verdict", "rule"}]}`, the permissions
/// that the caller's sessions (or that one) wait for, newest session first.
pub(crate) async fn pending(
    app: &App,
    caller: &Caller,
    req: &Request,
) -> Result<Response, ApiError> {
    let reach = caller.reach();
    let mut ids = Vec::new();
    if let Some(id) = query_param(req, "session") {
        ids.push(id);
    } else {
        let mut after: Option<String> = None;
        loop {
            let (views, next) = app.engine.list_sessions(reach, after.as_deref()).await?;
            ids.extend(
                views
                    .iter()
                    .filter(|v| json!(v.status) == json!("awaiting_client"))
                    .map(|v| v.id.clone()),
            );
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        ids.reverse();
    }
    let mut out = Vec::new();
    for id in ids {
        // Deleted meanwhile (or another key's, for `?session=`): nothing waits there.
        let Ok(session) = app.engine.session(reach, &id).await else {
            continue;
        };
        let view = app.engine.view(&session);
        for p in &view.pending {
            let mut item = serde_json::to_value(p).unwrap_or(Value::Null);
            if item["kind"] != "permission" {
                continue;
            }
            item["session"] = json!(view.id);
            item["agent"] = json!(view.record.agent);
            if let Some(asked) = view.record.asked.iter().find(|a| a.call_id == p.call_id) {
                item["server"] = json!(asked.server);
                item["tool"] = json!(asked.tool);
                item["verdict"] = json!(asked.verdict);
                item["rule"] = json!(asked.rule);
            }
            out.push(item);
        }
    }
    Ok(json_response(StatusCode::OK, &json!({ "pending": out })))
}

/// A strong ETag from the asset's bytes (FNV-1a, 64 bits): stable for one build's assets.
fn etag(body: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_non_empty_and_the_page_loads_only_its_own_assets() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.name);
        }
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(html.contains("src=\"/console/app.js\""));
        assert!(html.contains("href=\"/console/style.css\""));
        assert!(!html.contains("<script>"), "no inline script under the CSP");
        assert!(!html.contains("style=\""), "no inline style under the CSP");
    }

    #[test]
    fn etags_differ_with_content() {
        assert_ne!(etag(b"a"), etag(b"b"));
        assert_eq!(etag(b"a"), etag(b"a"));
    }
}
