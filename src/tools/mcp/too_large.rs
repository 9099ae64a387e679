//! MCP messages over the size one may have (16 MiB, rmcp's limit for a stdio line and an SSE
//! event): what is left of them once dropped, and the answer that ends their call at once.
//!
//! rmcp drops such a message silently, so the call it answered would wait for its whole
//! `timeout_s` and end "Cancelled." with no reason. The transports (the stdio reader in
//! `supervisor/line_limit.rs`, the SSE parser of `http_client/bounded_events.rs`, which is
//! `outbound/event_stream/strict.rs`) drop it themselves, keeping only its first and last
//! [`GLIMPSE`] bytes. [`outline`] reads its top-level members
//! from those two ends (the id comes first where Python's SDK writes it, last where the
//! TypeScript SDK does); when it was a response, [`error_line`] is the JSON-RPC error put in
//! its place, which completes the call with the reason. A message without an id of ours (a
//! notification, a request of the server's) is only logged.

use rmcp::model::{ErrorCode, ErrorData};
use serde_json::{json, Value};

/// The most bytes one message may have (a stdio line with its newline, an SSE event).
pub(crate) const MAX_MESSAGE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// Bytes kept of each end of a message that may turn out too large.
pub(crate) const GLIMPSE: usize = 256;

/// `data.reason` of the error put in place of a message too large.
pub(crate) const REASON: &str = "message_too_large";

/// What the two ends of a dropped message tell of its top-level members.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Outline {
    /// Its `id`, a number or a string.
    pub id: Option<Value>,
    /// It has a `result` or an `error`: a response.
    pub response: bool,
    /// It has a `method`: a request or a notification.
    pub method: bool,
}

impl Outline {
    /// The id of the call this message answered, when it was a response.
    pub(crate) fn answered(&self) -> Option<&Value> {
        self.id.as_ref().filter(|_| self.response && !self.method)
    }

    fn member(&mut self, key: &[u8], value: Option<&[u8]>) {
        match key {
            b"result" | b"error" => self.response = true,
            b"method" => self.method = true,
            b"id" => {
                let id = value.and_then(|v| serde_json::from_slice::<Value>(v).ok());
                if let Some(id @ (Value::Number(_) | Value::String(_))) = id {
                    self.id = Some(id);
                }
            }
            _ => {}
        }
    }
}

/// The top-level members readable from a message's first bytes (`head`) and its last bytes
/// (`tail`, without the line's newline): scalar members up to the first object or array from
/// the start, and from the end back.
pub(crate) fn outline(head: &[u8], tail: &[u8]) -> Outline {
    let mut o = Outline::default();
    forward(head, &mut o);
    backward(tail, &mut o);
    o
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Members from the start, as long as their values are scalars.
fn forward(s: &[u8], o: &mut Outline) {
    let s = s.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(s);
    let skip = |mut i: usize| {
        while s.get(i).copied().is_some_and(is_ws) {
            i += 1;
        }
        i
    };
    let mut i = skip(0);
    if s.get(i) != Some(&b'{') {
        return;
    }
    loop {
        i = skip(i + 1);
        let Some(key_end) = string_end(s, i) else {
            return;
        };
        let key = &s[i + 1..key_end - 1];
        i = skip(key_end);
        if s.get(i) != Some(&b':') {
            return;
        }
        i = skip(i + 1);
        let Some(value_end) = scalar_end(s, i) else {
            // An object or an array (or the end of what was kept): the key still tells.
            o.member(key, None);
            return;
        };
        o.member(key, Some(&s[i..value_end]));
        i = skip(value_end);
        if s.get(i) != Some(&b',') {
            return;
        }
    }
}

/// Where the string starting at `i` ends (after its closing quote).
fn string_end(s: &[u8], i: usize) -> Option<usize> {
    if s.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match s.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// Where the scalar (string, number, literal) starting at `i` ends; `None` for anything else.
fn scalar_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let n = s[i..]
                .iter()
                .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')))?;
            Some(i + n)
        }
        _ => None,
    }
}

/// Members from the end back, as long as their values are scalars.
fn backward(s: &[u8], o: &mut Outline) {
    let skip = |mut i: usize| {
        while i > 0 && is_ws(s[i - 1]) {
            i -= 1;
        }
        i
    };
    // `i` is an exclusive end: the byte before it is the next one to read.
    let mut i = skip(s.len());
    if i == 0 || s[i - 1] != b'}' {
        return;
    }
    i -= 1;
    loop {
        i = skip(i);
        let Some(value_start) = scalar_start(s, i) else {
            return;
        };
        let value = &s[value_start..i];
        i = skip(value_start);
        if i == 0 || s[i - 1] != b':' {
            return;
        }
        i = skip(i - 1);
        let Some(key_start) = string_start(s, i) else {
            return;
        };
        let key = &s[key_start + 1..i - 1];
        // A key is taken only with what comes before it: a kept tail may begin inside one.
        i = skip(key_start);
        match i.checked_sub(1).map(|j| s[j]) {
            Some(b',') => o.member(key, Some(value)),
            Some(b'{') => return o.member(key, Some(value)),
            _ => return,
        }
        i -= 1;
    }
}

/// Where the string ending just before `end` starts (at its opening quote).
fn string_start(s: &[u8], end: usize) -> Option<usize> {
    if end < 2 || s[end - 1] != b'"' {
        return None;
    }
    let mut j = end - 1;
    loop {
        j = s[..j].iter().rposition(|b| *b == b'"')?;
        let backslashes = s[..j].iter().rev().take_while(|b| **b == b'\\').count();
        if backslashes % 2 == 0 {
            return Some(j);
        }
    }
}

/// Where the scalar ending just before `end` starts; `None` for an object, an array or a cut.
fn scalar_start(s: &[u8], end: usize) -> Option<usize> {
    match s.get(end.checked_sub(1)?)? {
        b'"' => string_start(s, end),
        b if b.is_ascii_alphanumeric() => {
            let n = s[..end]
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
                .count();
            // A number or a literal is preceded by its member's colon (after blanks): a cut
            // through the middle of one is not taken for it.
            let start = end - n;
            let before = s[..start].iter().rev().find(|b| !is_ws(**b));
            (before == Some(&b':')).then_some(start)
        }
        _ => None,
    }
}

/// Bytes as MiB with one decimal ("23.4 MiB"); whole MiB without one ("16 MiB").
pub(crate) fn mib(bytes: u64) -> String {
    let tenths = (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() as u64;
    if tenths % 10 == 0 {
        format!("{} MiB", tenths / 10)
    } else {
        format!("{}.{} MiB", tenths / 10, tenths % 10)
    }
}

/// Why a message of `size` bytes (when known) from `who` ("MCP server shop") was dropped.
pub(crate) fn reason(who: &str, size: Option<u64>) -> String {
    let max = mib(MAX_MESSAGE as u64);
    match size {
        Some(size) => format!(
            "the answer of {who} was {}, over the {max} an MCP message may have",
            mib(size)
        ),
        None => format!("the answer of {who} was over the {max} an MCP message may have"),
    }
}

/// The JSON-RPC error put in place of a dropped response.
pub(crate) fn error_data(who: &str, size: Option<u64>) -> ErrorData {
    let mut data = json!({"reason": REASON, "max_bytes": MAX_MESSAGE});
    if let Some(size) = size {
        data["size_bytes"] = json!(size);
    }
    ErrorData::new(ErrorCode::INTERNAL_ERROR, reason(who, size), Some(data))
}

/// [`error_data`] as a JSON-RPC error response to `id`, one line (its newline included).
pub(crate) fn error_line(id: &Value, who: &str, size: Option<u64>) -> Vec<u8> {
    let message = json!({"jsonrpc": "2.0", "id": id, "error": error_data(who, size)});
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// Log a dropped message that answered nothing of ours.
pub(crate) fn warn_unanswerable(server: &str, size: Option<u64>, o: &Outline) {
    let kind = match (o.method, o.id.is_some()) {
        (true, true) => "a request",
        (true, false) => "a notification",
        _ => "a message without a readable id",
    };
    tracing::warn!(
        server,
        size_bytes = size,
        max_bytes = MAX_MESSAGE,
        "the MCP server sent {kind} over the size an MCP message may have: dropped"
    );
}

#[cfg(test)]
mod tests;
