//! API errors and their one mapping to HTTP: a status and
//! `{"error": {"type": "<snake_case>", "message": "<what is wrong and how to fix it>"}}`.
//! Every `From<ModuleError> for ApiError` lives here; no handler builds an error response.

use http::StatusCode;
use serde_json::json;

use super::range::Unsatisfiable;
use super::{json_response, Response};
use crate::engine::EngineError;
use crate::files::FileError;

/// Seconds a client is asked to wait before trying a write the store refused again.
const STORE_RETRY_AFTER: u16 = 5;

#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Extra fields for the error object (e.g. the running turn's id); boxed, as they are rare,
    /// to keep errors (and every `Result` that may hold one) small.
    pub extra: Option<Box<serde_json::Value>>,
    /// Seconds for the `Retry-After` header of a 429 or 503 (1 when not set).
    pub retry_after: Option<u16>,
    /// Headers of the response besides `Content-Type` (e.g. a 416's `Content-Range`); boxed,
    /// as they are rare, to keep errors small.
    pub headers: Option<Box<http::HeaderMap>>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: None,
            retry_after: None,
            headers: None,
        }
    }

    /// A 500: `message` says what failed and points at the server log (where the cause is).
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// A 503 `store_unavailable` with `Retry-After`: the event log cannot be written now (a
    /// full disk, an I/O error, the database unreachable); `message` says what was refused.
    pub(crate) fn store_unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(STORE_RETRY_AFTER),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                message,
            )
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A 403 `forbidden`: the caller's key may not do this (`[keys.NAME]` in tools.toml).
    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub(crate) fn into_response(self) -> Response {
        let mut error = json!({"type": self.kind, "message": self.message});
        if let Some(serde_json::Value::Object(extra)) = self.extra.map(|e| *e) {
            for (k, v) in extra {
                error[k] = v;
            }
        }
        let mut resp = json_response(self.status, &json!({ "error": error }));
        if let Some(headers) = self.headers {
            resp.headers_mut().extend(*headers);
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from(self.retry_after.unwrap_or(1)),
            );
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let message = e.to_string();
        match e {
            EngineError::NotFound { .. } => ApiError::not_found(message),
            EngineError::Busy { turn_id } => ApiError {
                extra: Some(Box::new(json!({ "turn_id": turn_id }))),
                ..ApiError::new(StatusCode::CONFLICT, "session_busy", message)
            },
            EngineError::Conflict(_) => ApiError::conflict(message),
            EngineError::Invalid(_) => ApiError::bad_request(message),
            EngineError::Forbidden(_) => ApiError::forbidden(message),
            EngineError::OverLimit {
                kind,
                server_wide,
                retry_after,
                ..
            } => {
                let status = if server_wide {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                };
                ApiError {
                    retry_after: Some(retry_after.min(u16::MAX as u64) as u16),
                    ..ApiError::new(status, kind, message)
                }
            }
            EngineError::Refused(r) => ApiError {
                extra: Some(Box::new(r.fields())),
                retry_after: Some(r.retry_after.min(u16::MAX as u64) as u16),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, r.kind, message)
            },
            EngineError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
            EngineError::Store(err) if err.is_unavailable() => {
                tracing::error!(error = %err, "the store is unavailable to a request");
                ApiError::store_unavailable(format!(
                    "the store cannot be used now ({err}); try again shortly"
                ))
            }
            EngineError::Store(err) => {
                tracing::error!(error = %err, "store error while serving a request");
                ApiError::internal("the server could not read or write its store; see its log")
            }
        }
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> ApiError {
        match e {
            FileError::NotFound(_) => ApiError::not_found(e.to_string()),
            FileError::TooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "file_too_large",
                format!("{e}; send a smaller file"),
            ),
            FileError::QuotaExceeded { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "disk_quota_exceeded",
                e.to_string(),
            ),
            FileError::TooManyFiles { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_many_files",
                e.to_string(),
            ),
            FileError::Io(_) | FileError::Store(_) => {
                tracing::error!(error = %e, "file store error");
                ApiError::internal("the file store failed; see the server log")
            }
        }
    }
}

/// A 416 with the `Content-Range: bytes */{size}` that says why.
impl From<Unsatisfiable> for ApiError {
    fn from(Unsatisfiable { size }: Unsatisfiable) -> ApiError {
        let range = http::HeaderValue::from_str(&format!("bytes */{size}"))
            .unwrap_or(http::HeaderValue::from_static("bytes */0"));
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_RANGE, range);
        ApiError {
            headers: Some(Box::new(headers)),
            ..ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the requested range is outside the file's {size} bytes"),
            )
        }
    }
}
