//! The response and request types every handler speaks, and the few ways to build a response.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Every response body: a full buffer or a stream (SSE).
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;
pub(crate) type Response = http::Response<Body>;
pub(crate) type Request = http::Request<hyper::body::Incoming>;

/// A JSON response.
pub(crate) fn json_response<T: serde::Serialize + ?Sized>(
    status: StatusCode,
    value: &T,
) -> Response {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = http::Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A response with no body.
pub(crate) fn empty_response(status: StatusCode) -> Response {
    let mut resp = http::Response::new(Empty::new().boxed_unsync());
    *resp.status_mut() = status;
    resp
}

/// A plain-text response.
pub(crate) fn text_response(
    status: StatusCode,
    content_type: &'static str,
    text: String,
) -> Response {
    let mut resp = http::Response::new(Full::new(Bytes::from(text)).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
