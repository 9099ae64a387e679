//! Reading a remote server's answers: statuses as rmcp's errors, bodies read within bounds.

use std::borrow::Cow;

use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};

use super::wire::{Error, HyperMcpError, SESSION_ID};

/// Whether a `Content-Type` names `mime`, ignoring case and parameters such as `charset`.
pub(super) fn media_type_is(value: &HeaderValue, mime: &str) -> bool {
    let essence = value
        .as_bytes()
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    std::str::from_utf8(essence).is_ok_and(|e| e.trim().eq_ignore_ascii_case(mime))
}

/// A 401 or 403 carrying a `WWW-Authenticate` challenge, as the error rmcp's auth layer expects.
pub(super) fn auth_error(response: &Response<Incoming>) -> Option<Error> {
    let status = response.status();
    if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        return None;
    }
    let challenge = response.headers().get(WWW_AUTHENTICATE)?;
    let Ok(challenge) = challenge.to_str() else {
        return Some(Error::UnexpectedServerResponse(Cow::Borrowed(
            "invalid www-authenticate header value",
        )));
    };
    Some(if status == StatusCode::UNAUTHORIZED {
        Error::AuthRequired(AuthRequiredError::new(challenge.to_owned()))
    } else {
        let scope = challenge_scope(challenge);
        Error::InsufficientScope(InsufficientScopeError::new(challenge.to_owned(), scope))
    })
}

/// The `scope=` parameter of a challenge, quoted or not.
pub(super) fn challenge_scope(challenge: &str) -> Option<String> {
    let start = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let rest = &challenge[start..];
    let scope = match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest
            .split(|c: char| c == ',' || c == ';' || c.is_whitespace())
            .next()
            .unwrap_or_default(),
    };
    (!scope.is_empty()).then(|| scope.to_owned())
}

/// 429 and 5xx: the status and `Retry-After`, so callers can decide about retrying.
pub(super) fn status_error(response: &Response<Incoming>) -> Option<Error> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    Some(Error::HttpStatus(HttpStatusError::new(
        status.as_u16(),
        retry_after(response.headers()),
    )))
}

pub(super) fn retry_after(headers: &HeaderMap) -> Option<String> {
    headers.get(RETRY_AFTER)?.to_str().ok().map(str::to_owned)
}

/// A non-2xx answer to a POST: a JSON-RPC error in the body is the answer to the request;
/// otherwise an error with the status and (for diagnostics) a bounded prefix of the body.
pub(super) async fn post_failure(
    response: Response<Incoming>,
    message: &ClientJsonRpcMessage,
    had_session: bool,
    is_json: bool,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Error> {
    let status = response.status();
    // A 429, or a 5xx without a JSON body, is worth only its status: the body stays unread.
    let status_failure = match status_error(&response) {
        Some(error) if !is_json || status == StatusCode::TOO_MANY_REQUESTS => return Err(error),
        other => other,
    };
    let session = response
        .headers()
        .get(SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let is_auth = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    let body = if is_json && !is_auth {
        match read_bounded(response.into_body(), limits.max_json_response_size).await {
            Ok(body) => {
                if let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_slice(&body) {
                    return Ok(discover_rejection(message, had_session, status, &body)
                        .unwrap_or(StreamableHttpPostResponse::Json(error, session)));
                }
                body
            }
            Err(e @ Error::ResponseBodyTooLarge { .. }) => return Err(status_failure.unwrap_or(e)),
            Err(_) => b"<failed to read response body>".to_vec(),
        }
    } else {
        read_prefix(response.into_body(), limits.max_error_response_size).await
    };
    if let Some(rejection) = discover_rejection(message, had_session, status, &body) {
        return Ok(rejection);
    }
    if let Some(error) = status_failure {
        return Err(error);
    }
    Err(Error::Client(HyperMcpError::Status {
        status,
        body: preview(&body, limits.max_error_response_size),
    }))
}

/// A sessionless `server/discover` refused with a 4xx (other than 401/403) means a server
/// from before discovery: answer it as a JSON-RPC error with the request's id, so rmcp's
/// lifecycle can fall back to `initialize` (as rmcp's own clients do).
pub(super) fn discover_rejection(
    message: &ClientJsonRpcMessage,
    had_session: bool,
    status: StatusCode,
    body: &[u8],
) -> Option<StreamableHttpPostResponse> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if had_session
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
        || !matches!(request.request, ClientRequest::DiscoverRequest(_))
    {
        return None;
    }
    let error = match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!(
                "server/discover rejected with HTTP {status}: {}",
                preview(body, body.len())
            ),
            None,
        ),
    };
    let reply = ServerJsonRpcMessage::error(error, Some(request.id.clone()));
    Some(StreamableHttpPostResponse::Json(reply, None))
}

/// The whole body, failing once it passes `max` bytes (never truncating: it is parsed whole).
pub(super) async fn read_bounded(mut body: Incoming, max: usize) -> Result<Vec<u8>, Error> {
    if body.size_hint().lower() > max as u64 {
        return Err(Error::ResponseBodyTooLarge { max_size: max });
    }
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::Client(e.into()))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > max - out.len() {
                return Err(Error::ResponseBodyTooLarge { max_size: max });
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// At most `max` bytes of the body, for a diagnostic; the rest is never read.
pub(super) async fn read_prefix(mut body: Incoming, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data[..data.len().min(max - out.len())]);
                }
            }
            Some(Err(_)) => {
                out.extend_from_slice(b"<failed to read response body>");
                break;
            }
            None => break,
        }
    }
    out.truncate(max);
    out
}

/// At most `max` bytes of `body` as text, cut at a character boundary.
pub(super) fn preview(body: &[u8], max: usize) -> String {
    if body.is_empty() {
        return "<empty>".to_owned();
    }
    let mut text = String::from_utf8_lossy(&body[..body.len().min(max)]).into_owned();
    if text.ends_with(char::REPLACEMENT_CHARACTER) && body.len() > max {
        text.pop();
    }
    text
}
