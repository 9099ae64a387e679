//! What an upstream's errors say: a non-2xx answer read from its bounded body into a status,
//! its usual meaning, the upstream's error type (a short identifier, never its words) and its
//! `Retry-After`; the messages of error objects; how upstream bytes are quoted.

use std::error::Error as StdError;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::HeaderMap;
use serde_json::Value;

use super::{UpstreamError, UpstreamErrorKind};
use crate::outbound::http1::Body;

/// How much of an error body is read: enough for any API's error object, bounded against a
/// misbehaving server.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// An error and its sources, `: `-joined (hyper's own messages are terse, the cause is in the
/// sources).
pub(crate) fn error_chain(e: &dyn StdError) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

/// The first 500 bytes of `bytes`, lossily decoded: how upstream bytes are quoted in errors.
pub(crate) fn preview(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(500)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if bytes.len() > cut.len() {
        s.push('…');
    }
    s
}

/// `Retry-After` in seconds (the HTTP-date form is not used by model APIs and is ignored), so a
/// status error can tell the caller how long the upstream asked it to wait.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
}

/// The message of an error body: what `from_json` finds in it when it is JSON, else `(empty
/// body)` or the body's first 500 bytes. Each provider passes the reading of its own error
/// object.
pub(crate) fn body_message(body: &[u8], from_json: fn(&Value) -> Option<String>) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(m) = from_json(&v) {
            return m;
        }
    }
    if body.is_empty() {
        return "(empty body)".to_string();
    }
    preview(body)
}

/// The text of an error object met inside a stream: the string itself, or its `message`, or the
/// whole object as JSON.
pub(crate) fn error_text(err: &Value) -> String {
    match err {
        Value::String(s) => s.clone(),
        other => other
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| other.to_string()),
    }
}

/// The error for a non-2xx answer: for clients, the status, what it usually means and the
/// upstream's error type (`error.type`, else `error.code`); for the log, the upstream's own
/// message (read from the body by `error_message`, which is where the providers differ). And
/// its `Retry-After`.
pub(crate) async fn status_error(
    code: u16,
    headers: &HeaderMap,
    body: Body,
    error_message: fn(&[u8]) -> String,
) -> UpstreamError {
    let (kind, detail) = match read_capped(body, MAX_ERROR_BODY).await {
        Ok((bytes, _)) => (error_type(&bytes), error_message(&bytes)),
        Err(e) => (
            None,
            format!("(the error body broke off: {})", error_chain(&*e)),
        ),
    };
    let mut message = format!("the upstream answered HTTP {code}");
    if let Some(meaning) = status_meaning(code) {
        message.push_str(&format!(" ({meaning})"));
    }
    if let Some(kind) = kind {
        message.push_str(&format!(", error type {kind}"));
    }
    let mut err = UpstreamError::new(UpstreamErrorKind::Status(code), message).with_detail(detail);
    err.retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    err
}

/// What a status usually means for a model call, said to clients in place of the upstream's
/// own words (which may quote what the server sent, its key included).
fn status_meaning(code: u16) -> Option<&'static str> {
    Some(match code {
        400 => "the upstream refused the request",
        401 | 403 => "the upstream refused the server's credentials: see [upstream] api_key_env",
        404 => "unknown model or endpoint: see [upstream] model and base_url",
        408 | 504 => "the upstream timed out",
        413 => "the request is too large for the upstream",
        429 => "the upstream is rate limiting",
        500..=599 => "the upstream failed",
        _ => return None,
    })
}

/// The upstream's error type in an error body (`{"error": {"type"}}`, else `{"error":
/// {"code"}}`, else a top-level `type` other than `error`), when it is a short identifier:
/// anything else could be the upstream quoting input back, and is left to the log.
pub(crate) fn error_type(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    error_type_of(&v)
}

/// [`error_type`] of a parsed error object (or body).
pub(crate) fn error_type_of(v: &Value) -> Option<String> {
    let err = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
    let found = ["type", "code"].iter().find_map(|k| match err.get(*k) {
        Some(Value::String(s)) if s != "error" => Some(s.clone()),
        _ => None,
    })?;
    let short = found.len() <= 64
        && !found.is_empty()
        && found
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    short.then_some(found)
}

/// Reads up to `cap` bytes of a body, and whether it was cut there; `Err` when the body broke
/// before that. Error bodies and whole JSON answers are read through it, never unbounded.
pub(crate) async fn read_capped(
    mut body: Body,
    cap: usize,
) -> Result<(Vec<u8>, bool), Box<dyn StdError + Send + Sync>> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            let room = cap - out.len();
            if data.len() > room {
                out.extend_from_slice(&data[..room]);
                return Ok((out, true));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok((out, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_type_is_a_short_identifier_or_nothing() {
        let t = |body: &str| error_type(body.as_bytes());
        assert_eq!(
            t(r#"{"error":{"type":"invalid_request_error","message":"sk-secret"}}"#).as_deref(),
            Some("invalid_request_error")
        );
        assert_eq!(
            t(r#"{"error":{"code":"context_length_exceeded"}}"#).as_deref(),
            Some("context_length_exceeded")
        );
        // Anthropic's envelope: the inner type, not "error".
        assert_eq!(
            t(r#"{"type":"error","error":{"type":"overloaded_error"}}"#).as_deref(),
            Some("overloaded_error")
        );
        // A "type" that quotes input back is not an identifier: left to the log.
        assert_eq!(
            t(r#"{"error":{"type":"bad key sk-123 for http://x"}}"#),
            None
        );
        assert_eq!(t(r#"{"error":"plain"}"#), None);
        assert_eq!(t("<html>gateway</html>"), None);
        assert_eq!(t(r#"{"error":{"code":400}}"#), None);
    }
}
