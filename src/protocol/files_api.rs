//! Files: `POST /files` (a raw body with `?filename=`, or `multipart/form-data`), metadata, and
//! downloads that stream from disk with `Content-Type`, `Content-Length`, RFC 6266
//! `Content-Disposition` and single `Range` requests.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::{header, HeaderValue, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Frame;
use tokio::io::AsyncReadExt;
use tokio_util::io::{ReaderStream, StreamReader};

use crate::files::{clean_name, to_ref, FileError};
use crate::http::range::parse_range;
use crate::http::{json_response, query_param, ApiError, Request, Response};
use crate::protocol::context::{App, Caller};

/// The request body could not be read to its end (the client went away, or it was cut off).
#[derive(Debug, thiserror::Error)]
#[error("the request body could not be read: {0}")]
struct BodyCut(String);

/// Bytes of a multipart body allowed outside its parts' data (preamble, boundaries, part
/// headers). Whatever the parser has read and not yet handed out as part data sits in its
/// buffer: past this, the body is refused rather than buffered (a body whose boundary never
/// comes would otherwise be held whole in memory).
const MULTIPART_OVERHEAD: u64 = 1024 * 1024;

/// Bytes handed to the multipart parser in one go: it reads its input until it would wait, so
/// an input that never waits (a fast client) is paused here to let it hand out what it has.
const MULTIPART_BURST: u64 = 64 * 1024;

/// More than [`MULTIPART_OVERHEAD`] bytes were read outside any part's data.
#[derive(Debug, thiserror::Error)]
#[error("more than {n} bytes of the multipart body lie outside its parts' data (preamble, boundaries, part headers): does the body use the boundary its Content-Type names? (limit: {n} bytes, fixed)", n = MULTIPART_OVERHEAD)]
struct OutsideParts;

/// The body as the multipart parser reads it: counted against the part data taken out of the
/// parser (`taken`), so that what the parser holds stays under [`MULTIPART_OVERHEAD`], and
/// paused every [`MULTIPART_BURST`] bytes. The parser's buffer stays under the overhead plus
/// one input chunk.
struct Metered<S> {
    inner: S,
    read: u64,
    /// The size of the last chunk read.
    last: u64,
    burst: u64,
    taken: Arc<AtomicU64>,
}

impl<S> Stream for Metered<S>
where
    S: Stream<Item = Result<Bytes, BodyCut>> + Unpin,
{
    type Item = Result<Bytes, Box<dyn std::error::Error + Send + Sync>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // What the parser holds, the last chunk aside (it may not have looked at it yet).
        let held = (self.read - self.last).saturating_sub(self.taken.load(Ordering::Relaxed));
        if held > MULTIPART_OVERHEAD {
            return Poll::Ready(Some(Err(Box::new(OutsideParts))));
        }
        if self.burst >= MULTIPART_BURST {
            // Let the parser work through what it has; come back at once.
            self.burst = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.read += b.len() as u64;
                self.last = b.len() as u64;
                self.burst += b.len() as u64;
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                self.burst = 0;
                Poll::Pending
            }
        }
    }
}

/// A multipart failure as an answer: 413 for a part or body over its limit, 400 otherwise.
fn multipart_error(e: &multer::Error, max_bytes: u64) -> ApiError {
    use multer::Error as M;
    match e {
        M::StreamSizeExceeded { .. } | M::FieldSizeExceeded { .. } => {
            FileError::TooLarge { limit: max_bytes }.into()
        }
        M::StreamReadFailed(inner) if inner.is::<OutsideParts>() => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "multipart_too_large",
            format!("{inner}; send multipart/form-data with the file part first, or the raw bytes with ?filename="),
        ),
        M::StreamReadFailed(inner) if inner.is::<BodyCut>() => ApiError::bad_request(format!(
            "the upload was cut short: {inner}"
        )),
        e => ApiError::bad_request(format!("malformed multipart body: {e}")),
    }
}

/// A storing failure as an answer: what the body's reader failed with, when it did.
fn put_error(e: FileError, max_bytes: u64) -> ApiError {
    if let FileError::Io(io) = &e {
        if let Some(inner) = io.get_ref() {
            if let Some(m) = inner.downcast_ref::<multer::Error>() {
                return multipart_error(m, max_bytes);
            }
            if let Some(cut) = inner.downcast_ref::<BodyCut>() {
                return ApiError::bad_request(format!("the upload was cut short: {cut}"));
            }
        }
    }
    e.into()
}

/// `POST /files`: the bytes go to disk as they come (never more than a small buffer in memory),
/// at most `[files] max_bytes` of them, within the key's `[limits] disk_bytes_per_key`.
pub(crate) async fn upload(app: &App, caller: &Caller, req: Request) -> Result<Response, ApiError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let filename_q = query_param(&req, "filename");
    let max_bytes = app.files.max_bytes;
    let body = BodyStream::new(crate::http::body::patient(req.into_body()))
        .try_filter_map(|frame| futures_util::future::ready(Ok(frame.into_data().ok())))
        .map_err(|e| BodyCut(e.to_string()));
    let stored = if let Ok(boundary) = multer::parse_boundary(&content_type) {
        let taken = Arc::new(AtomicU64::new(0));
        let metered = Metered {
            inner: body,
            read: 0,
            last: 0,
            burst: 0,
            taken: taken.clone(),
        };
        let limits = multer::SizeLimit::new()
            .whole_stream(max_bytes.saturating_add(MULTIPART_OVERHEAD))
            .per_field(max_bytes);
        let mut multipart = multer::Multipart::with_constraints(
            metered,
            boundary,
            multer::Constraints::new().size_limit(limits),
        );
        let mut stored = None;
        while let Some(mut field) = multipart
            .next_field()
            .await
            .map_err(|e| multipart_error(&e, max_bytes))?
        {
            let Some(name) = field
                .file_name()
                .map(str::to_string)
                .or_else(|| filename_q.clone())
            else {
                // Not a file: read through it (its bytes count as taken, not as held).
                while let Some(chunk) = field
                    .chunk()
                    .await
                    .map_err(|e| multipart_error(&e, max_bytes))?
                {
                    taken.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                continue;
            };
            let counted = taken.clone();
            let data = field
                .inspect_ok(move |chunk| {
                    counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                })
                .map_err(std::io::Error::other);
            let put = app
                .files
                .put(caller.owned(), &name, StreamReader::new(data))
                .await;
            stored = Some(put.map_err(|e| put_error(e, max_bytes))?);
            break;
        }
        stored.ok_or_else(|| ApiError::bad_request("the multipart body has no file part: send a part with a filename, e.g. curl -F file=@report.pdf"))?
    } else {
        let name = filename_q.ok_or_else(|| {
            ApiError::bad_request("name the file: POST /files?filename=<name> with the bytes as the body, or send multipart/form-data")
        })?;
        let data = body.map_err(std::io::Error::other);
        app.files
            .put(caller.owned(), &name, StreamReader::new(data))
            .await
            .map_err(|e| put_error(e, max_bytes))?
    };
    Ok(json_response(StatusCode::CREATED, &stored))
}

/// `DELETE /files/{id}`: the owner's file, its record and (unless another record shares them)
/// its bytes. Copies already in session workspaces stay.
pub(crate) async fn delete(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    app.files.delete(caller.owner(), id).await?;
    Ok(crate::http::empty_response(StatusCode::NO_CONTENT))
}

/// `GET /files/{id}`.
pub(crate) async fn metadata(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let row = app.files.get(caller.owner(), id).await?;
    let mut v = serde_json::to_value(to_ref(&row)).unwrap_or_default();
    v["created_at"] = serde_json::Value::String(row.created_at);
    Ok(json_response(StatusCode::OK, &v))
}

/// Types a browser would run or render with scripts (HTML, SVG, XML, JavaScript): always
/// downloaded as attachments, never shown inline, and sandboxed should a browser open them.
pub(crate) fn is_active(mime_type: &str) -> bool {
    let essence = mime_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "text/html"
            | "application/xhtml+xml"
            | "image/svg+xml"
            | "text/xml"
            | "application/xml"
            | "text/javascript"
            | "application/javascript"
            | "application/x-javascript"
            | "application/ecmascript"
            | "text/ecmascript"
            | "text/xsl"
            | "application/xslt+xml"
    ) || essence.ends_with("+xml")
}

/// RFC 6266 (every download is an attachment, whatever its type): an ASCII fallback and, for other names, `filename*` in UTF-8.
pub(crate) fn content_disposition(name: &str) -> String {
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

/// `GET /files/{id}/content`.
pub(crate) async fn content(
    app: &App,
    caller: &Caller,
    id: &str,
    req: &Request,
) -> Result<Response, ApiError> {
    let row = app.files.get(caller.owner(), id).await?;
    let size = row.size_bytes;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok());
    let range = parse_range(range, size)?;
    let (status, start, len) = match range {
        Some((s, e)) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        None => (StatusCode::OK, 0, size),
    };
    let file = app.files.open_blob_at(&row, start).await?;
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
    // Names stored before bidi controls were cleaned lose them here.
    if let Ok(v) = HeaderValue::from_str(&content_disposition(&clean_name(&row.filename))) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if is_active(&row.mime_type) {
        // A browser that opens it anyway runs no script and loads nothing.
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; sandbox"),
        );
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
mod tests;
