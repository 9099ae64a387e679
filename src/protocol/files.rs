//! Files: `POST /files` (a raw body with `?filename=`, or `multipart/form-data`), metadata, and
//! downloads that stream from disk with `Content-Type`, `Content-Length`, RFC 6266
//! `Content-Disposition` and single `Range` requests.

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use http::{header, HeaderValue, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::{ReaderStream, StreamReader};

use crate::files::{to_ref, FileError};
use crate::http::routes::{App, Caller};
use crate::http::{json_response, query_param, ApiError, Request, Response};

impl From<FileError> for ApiError {
    fn from(e: FileError) -> ApiError {
        match e {
            FileError::NotFound(_) => ApiError::not_found(e.to_string()),
            FileError::TooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "file_too_large",
                format!("{e}; send a smaller file"),
            ),
            // What the body's reader failed with is the client's doing, not the store's.
            FileError::Io(ref io) if io.get_ref().is_some_and(|i| i.is::<BodyCut>()) => {
                ApiError::bad_request(format!(
                    "the upload could not be read to its end: {io}; send the whole body"
                ))
            }
            FileError::Io(_) | FileError::Store(_) => {
                tracing::error!(error = %e, "file store error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the file store failed; see the server log",
                )
            }
        }
    }
}

/// The request body could not be read to its end (the client went away or cut it short, or a
/// multipart body broke off mid-part).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BodyCut(String);

fn io_err<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(BodyCut(e.to_string()))
}

/// `POST /files`.
pub async fn upload(app: &App, caller: &Caller, req: Request) -> Result<Response, ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let filename_q = query_param(&req, "filename");
    let body = BodyStream::new(req.into_body())
        .try_filter_map(|frame| futures_util::future::ready(Ok(frame.into_data().ok())))
        .map_err(io_err);
    let stored = if let Ok(boundary) = multer::parse_boundary(&content_type) {
        let mut multipart = multer::Multipart::new(body, boundary);
        let mut stored = None;
        while let Some(field) = multipart
            .next_field()
            .await
            .map_err(|e| ApiError::bad_request(format!("malformed multipart body: {e}")))?
        {
            let Some(name) = field
                .file_name()
                .map(str::to_string)
                .or_else(|| filename_q.clone())
            else {
                continue;
            };
            let reader = StreamReader::new(field.map_err(io_err));
            stored = Some(app.files.put(caller.owner.clone(), &name, reader).await?);
            break;
        }
        stored.ok_or_else(|| ApiError::bad_request("the multipart body has no file part: send a part with a filename, e.g. curl -F file=@report.pdf"))?
    } else {
        let name = filename_q.ok_or_else(|| {
            ApiError::bad_request("name the file: POST /files?filename=<name> with the bytes as the body, or send multipart/form-data")
        })?;
        app.files
            .put(caller.owner.clone(), &name, StreamReader::new(body))
            .await?
    };
    Ok(json_response(StatusCode::CREATED, &stored))
}

/// `GET /files/{id}`.
pub async fn metadata(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let row = app.files.get(caller.owner.as_deref(), id).await?;
    let mut v = serde_json::to_value(to_ref(&row)).unwrap_or_default();
    v["created_at"] = serde_json::Value::String(row.created_at);
    Ok(json_response(StatusCode::OK, &v))
}

/// RFC 6266: an ASCII fallback and, for other names, `filename*` in UTF-8.
pub fn content_disposition(name: &str) -> String {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if ascii == name {
        return format!("attachment; filename=\"{ascii}\"");
    }
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

/// A `Range` that cannot be satisfied (416).
#[derive(Debug, PartialEq, Eq)]
pub struct Unsatisfiable;

/// A single `bytes=` range against `size`: `Ok(None)` for no (or an ignorable) Range header,
/// `Err(Unsatisfiable)` when it cannot be satisfied.
pub fn parse_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None); // multiple ranges: answer with the whole file
    }
    let (a, b) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", "") => return Err(Unsatisfiable),
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| Unsatisfiable)?;
            if n == 0 {
                return Err(Unsatisfiable);
            }
            (
                size.saturating_sub(n),
                size.checked_sub(1).ok_or(Unsatisfiable)?,
            )
        }
        (s, "") => (
            s.parse().map_err(|_| Unsatisfiable)?,
            size.checked_sub(1).ok_or(Unsatisfiable)?,
        ),
        (s, e) => {
            let s: u64 = s.parse().map_err(|_| Unsatisfiable)?;
            let e: u64 = e.parse().map_err(|_| Unsatisfiable)?;
            (s, e.min(size.saturating_sub(1)))
        }
    };
    if start >= size || start > end {
        return Err(Unsatisfiable);
    }
    Ok(Some((start, end)))
}

/// `GET /files/{id}/content`.
pub async fn content(
    app: &App,
    caller: &Caller,
    id: &str,
    req: &Request,
) -> Result<Response, ApiError> {
    let row = app.files.get(caller.owner.as_deref(), id).await?;
    let size = row.size_bytes;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok());
    let range = match parse_range(range, size) {
        Ok(r) => r,
        Err(Unsatisfiable) => {
            let mut resp = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the requested range is outside the file's {size} bytes"),
            )
            .into_response();
            resp.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{size}"))
                    .unwrap_or(HeaderValue::from_static("bytes */0")),
            );
            return Ok(resp);
        }
    };
    let mut file = app.files.open_blob(&row).await?;
    let (status, start, len) = match range {
        Some((s, e)) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        None => (StatusCode::OK, 0, size),
    };
    if start > 0 {
        file.seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(FileError::from)?;
    }
    // A read error mid-download cannot be reported in the body: the stream ends short, and the
    // client sees fewer bytes than Content-Length.
    let stream = ReaderStream::with_capacity(file.take(len), 64 * 1024)
        .scan((), |_, r: std::io::Result<Bytes>| {
            futures_util::future::ready(r.ok())
        })
        .map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b)));
    let mut resp = http::Response::new(StreamBody::new(stream).boxed_unsync());
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    let ct = HeaderValue::from_str(&row.mime_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_TYPE, ct);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&content_disposition(&row.filename)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {}-{}/{size}", start, start + len - 1))
        {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=-4"), 10), Ok(Some((6, 9))));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some((8, 9))));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=4-2"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=-0"), 10), Err(Unsatisfiable));
    }

    #[test]
    fn disposition() {
        assert_eq!(
            content_disposition("report.csv"),
            "attachment; filename=\"report.csv\""
        );
        assert_eq!(
            content_disposition("résumé 1.pdf"),
            "attachment; filename=\"r_sum_ 1.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.pdf"
        );
    }
}
