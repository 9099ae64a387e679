//! The HTTP edge: the accept loop, auth, bodies, ranges, errors and SSE. It serves whatever
//! handler it is given (the api module's `handle`) and imports no protocol and no route.

pub mod auth;
pub mod body;
pub mod browser;
pub mod conn;
pub mod detached;
pub mod error;
pub mod range;
pub mod server;
pub mod sse;

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

pub use error::ApiError;

/// Every response body: a full buffer or a stream (SSE).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;
pub type Response = http::Response<Body>;
pub type Request = http::Request<hyper::body::Incoming>;

/// A JSON response.
pub fn json_response<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Response {
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
pub fn empty_response(status: StatusCode) -> Response {
    let mut resp = http::Response::new(Empty::new().boxed_unsync());
    *resp.status_mut() = status;
    resp
}

/// A plain-text response.
pub fn text_response(status: StatusCode, content_type: &'static str, text: String) -> Response {
    let mut resp = http::Response::new(Full::new(Bytes::from(text)).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// The query parameter `name`, percent-decoded.
pub fn query_param(req: &Request, name: &str) -> Option<String> {
    let q = req.uri().query()?;
    q.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

/// Query-string decoding: `+` is a space, then `%XX` ([`crate::net::percent_decode`]).
fn percent_decode(s: &str) -> String {
    String::from_utf8_lossy(&crate::net::percent_decode(&s.replace('+', " "))).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_decoding() {
        assert_eq!(super::percent_decode("a%20b+c"), "a b c");
        assert_eq!(super::percent_decode("100%"), "100%");
        assert_eq!(super::percent_decode("%e4%b8%ad"), "中");
        assert_eq!(super::percent_decode("%zz"), "%zz");
    }
}
