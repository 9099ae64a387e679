//! The OAuth side's HTTP: small JSON and form requests to authorization servers over
//! [`crate::outbound`], bounded, as the `oauth2` crate's async HTTP client too.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;

/// Largest metadata, registration or token response read.
const MAX_BODY: usize = 1 << 20;
/// One request to an authorization server, whole.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request to an authorization server failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WebError(pub String);

fn client() -> &'static crate::outbound::HttpsClient {
    static CLIENT: std::sync::OnceLock<crate::outbound::HttpsClient> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| crate::outbound::https_client(Some(Duration::from_secs(10))))
}

/// Send a request; the whole response, its body bounded.
pub async fn send(req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, WebError> {
    let uri = req.uri().clone();
    let (parts, body) = req.into_parts();
    let req = http::Request::from_parts(parts, Full::new(Bytes::from(body)));
    let go = async {
        let resp = client()
            .request(req)
            .await
            .map_err(|e| WebError(format!("{uri}: {e}")))?;
        let (parts, mut body) = resp.into_parts();
        if body.size_hint().lower() > MAX_BODY as u64 {
            return Err(WebError(format!("{uri}: response over {MAX_BODY} bytes")));
        }
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| WebError(format!("{uri}: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > MAX_BODY {
                    return Err(WebError(format!("{uri}: response over {MAX_BODY} bytes")));
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(http::Response::from_parts(parts, out))
    };
    tokio::time::timeout(TIMEOUT, go)
        .await
        .map_err(|_| WebError(format!("{uri}: no answer within {} s", TIMEOUT.as_secs())))?
}

/// GET a JSON document: `None` on a 4xx (not there), an error on anything else that is not
/// a JSON object.
pub async fn get_json(url: &str) -> Result<Option<serde_json::Value>, WebError> {
    let req = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .map_err(|e| WebError(format!("{url}: {e}")))?;
    let resp = send(req).await?;
    if resp.status().is_client_error() {
        return Ok(None);
    }
    if !resp.status().is_success() {
        return Err(WebError(format!("{url}: {}", resp.status())));
    }
    match serde_json::from_slice::<serde_json::Value>(resp.body()) {
        Ok(v) if v.is_object() => Ok(Some(v)),
        _ => Err(WebError(format!("{url}: not a JSON object"))),
    }
}

/// POST a JSON body; the answer's status and JSON.
pub async fn post_json(
    url: &str,
    body: &serde_json::Value,
) -> Result<(http::StatusCode, serde_json::Value), WebError> {
    let req = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(serde_json::to_vec(body).unwrap_or_default())
        .map_err(|e| WebError(format!("{url}: {e}")))?;
    let resp = send(req).await?;
    let v = serde_json::from_slice(resp.body()).unwrap_or(serde_json::Value::Null);
    Ok((resp.status(), v))
}
