//! `turnstile login SERVER`: the authorization-code flow with an operator's browser.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::discovery::{self, Challenge};
use super::server_oauth::{pick_method, union, OAuth};
use super::store::{ClientReg, Saved};
use super::tokens;

/// How long the loopback listener waits for the browser's redirect.
const WAIT_FOR_REDIRECT: Duration = Duration::from_secs(300);

/// Remember (or forget, `None`) the scope a server asked for, for the next login.
pub(super) fn remember_scope(dir: &Path, server: &str, scope: Option<&str>) {
    let path = dir.join(format!("{server}.scope"));
    match scope {
        Some(s) => {
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(path, s);
        }
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn remembered_scope(dir: &Path, server: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(format!("{server}.scope")))
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// The server's challenge: the answer to `initialize`, or (when that is open) to `tools/list`.
async fn probe(url: &str) -> Challenge {
    let post = |body: serde_json::Value, session: Option<String>| {
        let mut b = http::Request::post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = session {
            b = b.header("mcp-session-id", s);
        }
        b.body(serde_json::to_vec(&body).unwrap_or_default())
    };
    let challenge_of = |r: &http::Response<Vec<u8>>| {
        matches!(r.status().as_u16(), 401 | 403)
            .then(|| r.headers().get("www-authenticate"))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .map(discovery::parse_challenge)
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "turnstile", "version": env!("CARGO_PKG_VERSION")}}});
    let Ok(req) = post(init, None) else {
        return Challenge::default();
    };
    let Ok(resp) = super::web::send(req).await else {
        return Challenge::default();
    };
    if let Some(c) = challenge_of(&resp) {
        return c;
    }
    let session = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    if let Ok(req) = post(note, session.clone()) {
        let _ = super::web::send(req).await;
    }
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    match post(list, session) {
        Ok(req) => match super::web::send(req).await {
            Ok(resp) => challenge_of(&resp).unwrap_or_default(),
            Err(_) => Challenge::default(),
        },
        Err(_) => Challenge::default(),
    }
}

/// Register this client, or use the configured one.
async fn register(
    o: &OAuth,
    auth_server: &discovery::AuthServer,
    redirect_uri: &str,
) -> Result<ClientReg, String> {
    let secret = o.secret();
    if let Some(id) = &o.cfg.client_id {
        return Ok(ClientReg {
            client_id: id.clone(),
            auth_method: pick_method(
                auth_server.token_endpoint_auth_methods_supported.as_ref(),
                secret.is_some(),
            ),
            client_secret: secret,
            redirect_uri: Some(redirect_uri.to_string()),
        });
    }
    if let (Some(url), Some(true)) = (
        &o.cfg.client_metadata_url,
        auth_server.client_id_metadata_document_supported,
    ) {
        return Ok(ClientReg {
            client_id: url.clone(),
            client_secret: None,
            auth_method: "none".into(),
            redirect_uri: Some(redirect_uri.to_string()),
        });
    }
    let Some(endpoint) = &auth_server.registration_endpoint else {
        return Err(format!(
            "the authorization server {} offers no dynamic registration: set [mcp_servers.{}.oauth] client_id (and client_secret_env) to a client registered there",
            auth_server.issuer, o.server
        ));
    };
    let method = pick_method(
        auth_server.token_endpoint_auth_methods_supported.as_ref(),
        true,
    );
    let body = serde_json::json!({
        "client_name": "turnstile",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
    });
    let (status, v) = super::web::post_json(endpoint, &body)
        .await
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "dynamic client registration at {endpoint} failed: {status} {v}"
        ));
    }
    let client_id = v
        .get("client_id")
        .and_then(|c| c.as_str())
        .ok_or("the registration answer has no client_id")?;
    let client_secret = v
        .get("client_secret")
        .and_then(|c| c.as_str())
        .map(str::to_string);
    let auth_method = v
        .get("token_endpoint_auth_method")
        .and_then(|c| c.as_str())
        .map(str::to_string)
        .unwrap_or(if client_secret.is_some() {
            method
        } else {
            "none".into()
        });
    Ok(ClientReg {
        client_id: client_id.to_string(),
        client_secret,
        auth_method,
        redirect_uri: Some(redirect_uri.to_string()),
    })
}

/// Discovery, registration, the authorization URL announced, the redirect received, the code
/// exchanged.
pub(super) async fn run(o: &OAuth, announce: &(dyn Fn(&str) + Sync)) -> Result<Saved, String> {
    let challenge = probe(&o.url).await;
    let found = discovery::discover(&o.url, &challenge)
        .await
        .map_err(|e| e.to_string())?;
    let a = &found.auth_server;
    if !a.fallback
        && !a
            .code_challenge_methods_supported
            .as_ref()
            .is_some_and(|m| m.iter().any(|m| m == "S256"))
    {
        return Err(format!(
            "the authorization server {} does not say it supports PKCE with S256; turnstile does not authorize without it",
            a.issuer
        ));
    }
    let configured = (!o.cfg.scopes.is_empty()).then(|| o.cfg.scopes.join(" "));
    let scope = union(
        challenge.scope.as_deref(),
        remembered_scope(&o.store.dir(), &o.server).as_deref(),
    )
    .or_else(|| found.scopes_supported.as_ref().map(|s| s.join(" ")))
    .or(configured)
    .filter(|s| !s.is_empty());
    let listener = TcpListener::bind(("127.0.0.1", o.cfg.redirect_port))
        .await
        .map_err(|e| {
            format!(
                "cannot listen on 127.0.0.1:{} for the redirect: {e}",
                o.cfg.redirect_port
            )
        })?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let client = register(o, a, &redirect_uri).await?;
    let (url, state, verifier) =
        tokens::authorization_url(a, &client, &redirect_uri, &found.resource, scope.as_deref())?;
    announce(&url);
    let code = tokio::time::timeout(WAIT_FOR_REDIRECT, receive(&listener, &state))
        .await
        .map_err(|_| format!("no redirect came within {} s", WAIT_FOR_REDIRECT.as_secs()))??;
    tokens::exchange_code(
        a,
        &client,
        &redirect_uri,
        &found.resource,
        code,
        verifier,
        scope.as_deref(),
    )
    .await
}

/// Accept connections until one brings the redirect with `code` and the expected `state`.
async fn receive(listener: &TcpListener, state: &str) -> Result<String, String> {
    loop {
        let (mut conn, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut n = 0;
        while n < buf.len() {
            match conn.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buf[..n]);
        let target = head.split_whitespace().nth(1).unwrap_or("");
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        let get = |k: &str| param(query, k);
        let (status, text, outcome) = match (get("code"), get("state"), get("error")) {
            (_, _, Some(err)) => (
                "400 Bad Request",
                format!("Authorization failed: {err}"),
                Some(Err(format!("the authorization server answered {err}"))),
            ),
            (Some(code), Some(s), None) if s == state => (
                "200 OK",
                "turnstile is authorized; you may close this tab.".to_string(),
                Some(Ok(code)),
            ),
            (Some(_), _, None) => (
                "400 Bad Request",
                "The state does not match this login.".to_string(),
                None,
            ),
            _ => ("404 Not Found", "Not the redirect.".to_string(), None),
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
        let _ = conn.write_all(reply.as_bytes()).await;
        if let Some(outcome) = outcome {
            return outcome;
        }
    }
}

/// The first value of `name` in a query string, decoded (`+` is a space, then `%XX`).
fn param(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_decoding() {
        assert_eq!(
            super::param("code=a%20b+c%2F", "code").as_deref(),
            Some("a b c/")
        );
        assert_eq!(
            super::param("x=1&state=%zz%4", "state").as_deref(),
            Some("%zz%4")
        );
        assert_eq!(super::param("error=denied", "code"), None);
    }
}
