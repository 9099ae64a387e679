//! Reading request bodies: bounded, and JSON errors that say where and what.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The whole body, refusing more than `limit` bytes (413).
pub async fn read_limited(body: Incoming, limit: u64) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit as usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::new(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the request body is over the limit of {limit} bytes; send less, or raise [server] max_body_bytes"
                ),
            ))
        }
        Err(e) => Err(ApiError::bad_request(format!("could not read the request body: {e}"))),
    }
}

/// Parse a JSON body into `T`; an empty body parses as `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid here: {e}; see GET /meta and the AAP schema for the expected shape"
        ))
    })
}

/// Read and parse a JSON body.
pub async fn json<T: DeserializeOwned>(body: Incoming, limit: u64) -> Result<T, ApiError> {
    let bytes = read_limited(body, limit).await?;
    parse_json(&bytes)
}
