//! Reading a server-sent event stream frame by frame, as it arrives, from a hyper response body:
//! the raw `id:`, `event:` and `data:` of each frame (the `data:` text exactly as sent, so tests
//! can compare bytes). Every wait is bounded, so a missing frame fails the test instead of
//! hanging it.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// How long a test waits for the next frame before it fails.
pub const FRAME_WAIT: Duration = Duration::from_secs(30);

/// One SSE frame, its fields as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: String,
    /// The `data:` line's text, byte for byte.
    pub data: String,
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {}", self.data))
    }

    /// The `type` of a spec 003 event.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.event.as_str(),
            "turn.completed" | "turn.failed" | "turn.cancelled"
        )
    }

    pub fn is_delta(&self) -> bool {
        self.event.ends_with(".delta")
    }
}

/// An open response whose body is read incrementally.
pub struct SseStream {
    pub status: u16,
    pub headers: HeaderMap,
    body: Incoming,
    buf: Vec<u8>,
    ended: bool,
}

/// Send a request and return as soon as the response head has arrived.
pub async fn open(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> SseStream {
    open_with(base, method, path, headers, body, None).await
}

/// `GET path` on a connection whose socket receive buffer is `recv_buffer` bytes: a reader
/// that does not read makes the server's writes back up soon.
pub async fn get_small_buffer(base: &str, path: &str, recv_buffer: usize) -> SseStream {
    open_with(base, "GET", path, &[], None, Some(recv_buffer)).await
}

async fn open_with(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
    recv_buffer: Option<usize>,
) -> SseStream {
    let mut connector = HttpConnector::new();
    connector.set_recv_buffer_size(recv_buffer);
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = tokio::time::timeout(FRAME_WAIT, client.request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no response head within {FRAME_WAIT:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    SseStream {
        status,
        headers,
        body: resp.into_body(),
        buf: Vec::new(),
        ended: false,
    }
}

/// `GET path` with these headers.
pub async fn get(base: &str, path: &str, headers: &[(&str, &str)]) -> SseStream {
    open(base, "GET", path, headers, None).await
}

impl SseStream {
    /// Asserts a 200 `text/event-stream` response.
    pub fn ok(self) -> SseStream {
        assert_eq!(self.status, 200, "SSE status");
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("text/event-stream"),
            "SSE content type"
        );
        self
    }

    /// The rest of the body as text (for error responses).
    pub async fn text(self) -> String {
        let bytes = tokio::time::timeout(FRAME_WAIT, self.body.collect())
            .await
            .expect("body within the wait")
            .expect("body")
            .to_bytes();
        let mut all = self.buf;
        all.extend_from_slice(&bytes);
        String::from_utf8(all).expect("utf-8")
    }

    /// The next frame (comments skipped); `None` when the stream ended. Fails the test when
    /// nothing comes within [`FRAME_WAIT`].
    pub async fn next(&mut self) -> Option<Frame> {
        match tokio::time::timeout(FRAME_WAIT, self.next_unbounded()).await {
            Ok(f) => f,
            Err(_) => panic!("no SSE frame within {FRAME_WAIT:?}"),
        }
    }

    /// The next frame, which must exist.
    pub async fn frame(&mut self) -> Frame {
        self.next().await.expect("the stream ended early")
    }

    async fn next_unbounded(&mut self) -> Option<Frame> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let block = String::from_utf8(block).expect("SSE frame is UTF-8");
                if let Some(frame) = parse_block(&block) {
                    return Some(frame);
                }
                continue;
            }
            if self.ended {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => panic!("SSE body: {e}"),
                None => self.ended = true,
            }
        }
    }

    /// Frames up to and including the first for which `stop` holds.
    pub async fn until(&mut self, mut stop: impl FnMut(&Frame) -> bool) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            let f = self.frame().await;
            let done = stop(&f);
            out.push(f);
            if done {
                return out;
            }
        }
    }

    /// Exactly `n` frames.
    pub async fn take(&mut self, n: usize) -> Vec<Frame> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.frame().await);
        }
        out
    }
}

/// One frame from a block of lines; `None` for a comment-only block.
fn parse_block(block: &str) -> Option<Frame> {
    let mut id = None;
    let mut event = None;
    let mut data: Option<String> = None;
    for line in block.lines() {
        if line.starts_with(':') || line.is_empty() {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_string()),
            "event" => event = Some(value.to_string()),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            },
            other => panic!("unexpected SSE field {other:?} in {block:?}"),
        }
    }
    if event.is_none() && data.is_none() && id.is_none() {
        return None;
    }
    Some(Frame {
        id,
        event: event.unwrap_or_else(|| "message".into()),
        data: data.unwrap_or_default(),
    })
}

/// The raw JSON text of each element of the top-level array `key` in a JSON object text: the
/// bytes exactly as the server wrote them.
pub fn raw_array_elements(text: &str, key: &str) -> Vec<String> {
    let needle = format!("\"{key}\":");
    let start = text
        .find(&needle)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + needle.len();
    let bytes = text.as_bytes();
    let mut i = start;
    while bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    assert_eq!(bytes[i], b'[', "{key} is not an array");
    i += 1;
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    let mut elem_start: Option<usize> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => {
                in_str = true;
                elem_start.get_or_insert(i);
            }
            b'{' | b'[' => {
                depth += 1;
                elem_start.get_or_insert(i);
            }
            b'}' => depth -= 1,
            b']' if depth == 0 => {
                if let Some(s) = elem_start.take() {
                    out.push(text[s..i].trim_end().to_string());
                }
                return out;
            }
            b']' => depth -= 1,
            b',' if depth == 0 => {
                let s = elem_start.take().expect("an element before ','");
                out.push(text[s..i].trim_end().to_string());
            }
            c if c.is_ascii_whitespace() => {}
            _ => {
                elem_start.get_or_insert(i);
            }
        }
        i += 1;
    }
    panic!("unterminated array {key:?}")
}

#[test]
fn raw_array_elements_keeps_bytes() {
    let text = r#"{"events":[{"a":"x,]}"},{"b":[1,2]} , 3],"has_more":false}"#;
    assert_eq!(
        raw_array_elements(text, "events"),
        vec![r#"{"a":"x,]}"}"#, r#"{"b":[1,2]}"#, "3"]
    );
    assert!(raw_array_elements(r#"{"events":[]}"#, "events").is_empty());
}

#[test]
fn parse_block_reads_fields() {
    assert_eq!(parse_block(": keep-alive\n\n"), None);
    assert_eq!(
        parse_block("id: evt_1\nevent: x\ndata: {\"a\":1}\n\n"),
        Some(Frame {
            id: Some("evt_1".into()),
            event: "x".into(),
            data: "{\"a\":1}".into()
        })
    );
}
