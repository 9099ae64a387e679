//! A stdio server's stdout with each line (one message) bounded by [`MAX_MESSAGE`], as rmcp
//! reads it. rmcp drops a longer line silently, and the call it answered then waits out its
//! `timeout_s`; here such a line ends its call at once, with the reason
//! ([`crate::tools::mcp::too_large`]).
//!
//! Bytes pass through in place (a `memchr` for the newline; the first [`GLIMPSE`] bytes of
//! each line copied aside, and its last ones once it nears the limit). A line that reaches the
//! limit is cut there: what was passed on is ended with a newline (rmcp discards it as JSON
//! that does not parse) and the rest is dropped up to its own newline. Then, when its two ends
//! show a response, a JSON-RPC error for its id is handed on in its place; anything else is
//! logged as dropped.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::tools::mcp::too_large::{self, GLIMPSE, MAX_MESSAGE};

/// The longest a line may be before its newline.
const MAX_CONTENT: u64 = MAX_MESSAGE as u64 - 1;
/// From this length on, a line's last bytes are kept.
const TAIL_FROM: u64 = MAX_CONTENT - GLIMPSE as u64;

pub(super) struct LineLimit<R> {
    inner: R,
    /// The server, for the log.
    server: String,
    /// Bytes of the current line so far (passed on or dropped), its newline excluded.
    len: u64,
    /// The current line is over the limit: its bytes are dropped up to its newline.
    dropping: bool,
    /// Its first [`GLIMPSE`] bytes.
    head: Vec<u8>,
    /// Its last [`GLIMPSE`] bytes (once it has reached [`TAIL_FROM`]).
    tail: Vec<u8>,
    /// An error answer to hand on before anything else, and how much of it has been.
    answer: Vec<u8>,
    answer_at: usize,
    /// Bytes read past a dropped line's end, still to be looked at.
    after: Vec<u8>,
    after_at: usize,
}

impl<R> LineLimit<R> {
    pub(super) fn new(inner: R, server: &str) -> LineLimit<R> {
        LineLimit {
            inner,
            server: server.to_string(),
            len: 0,
            dropping: false,
            head: Vec::with_capacity(GLIMPSE),
            tail: Vec::new(),
            answer: Vec::new(),
            answer_at: 0,
            after: Vec::new(),
            after_at: 0,
        }
    }

    /// Note `part` of the current line: its length, and what is kept of its ends.
    fn glimpse(&mut self, part: &[u8]) {
        if self.head.len() < GLIMPSE {
            let take = part.len().min(GLIMPSE - self.head.len());
            self.head.extend_from_slice(&part[..take]);
        }
        self.len += part.len() as u64;
        if self.len > TAIL_FROM {
            let part = &part[part.len().saturating_sub(GLIMPSE)..];
            self.tail.extend_from_slice(part);
            let extra = self.tail.len().saturating_sub(GLIMPSE);
            self.tail.drain(..extra);
        }
    }

    /// The current line has ended (fitting, or dropped); a dropped line's error answer.
    fn line_end(&mut self) -> Option<Vec<u8>> {
        let dropped = std::mem::take(&mut self.dropping);
        let answer = if dropped { self.dropped() } else { None };
        self.len = 0;
        self.head.clear();
        self.tail.clear();
        answer
    }

    /// What a dropped line's ends tell: the error answer when it was a response.
    fn dropped(&self) -> Option<Vec<u8>> {
        let size = Some(self.len + 1);
        let outline = too_large::outline(&self.head, &self.tail);
        let Some(id) = outline.answered() else {
            too_large::warn_unanswerable(&self.server, size, &outline);
            return None;
        };
        tracing::warn!(
            server = %self.server,
            size_bytes = self.len + 1,
            max_bytes = MAX_MESSAGE,
            id = %id,
            "an MCP server's answer was over the size an MCP message may have: dropped, its call ended with the reason"
        );
        let who = format!("MCP server {}", self.server);
        Some(too_large::error_line(id, &who, size))
    }

    /// Filter `data` in place: what passes on is moved to its front. Returns how many bytes
    /// pass and how many were looked at (fewer than all when a dropped line ended with an
    /// answer, which goes first).
    fn filter(&mut self, data: &mut [u8]) -> (usize, usize) {
        let (mut r, mut w) = (0, 0);
        while r < data.len() {
            let newline = memchr::memchr(b'\n', &data[r..]).map(|i| r + i);
            let end = newline.unwrap_or(data.len());
            let part = end - r;
            if !self.dropping {
                let room = (MAX_CONTENT - self.len) as usize;
                if part <= room {
                    let through = newline.map_or(end, |n| n + 1);
                    self.glimpse(&data[r..end]);
                    data.copy_within(r..through, w);
                    w += through - r;
                    r = through;
                    if newline.is_some() {
                        self.line_end();
                    }
                    continue;
                }
                // Over the limit: pass what fits, end it with a newline, drop the rest.
                self.glimpse(&data[r..end]);
                data.copy_within(r..r + room, w);
                w += room;
                data[w] = b'\n';
                w += 1;
                self.dropping = true;
            } else {
                self.glimpse(&data[r..end]);
            }
            let Some(newline) = newline else {
                return (w, data.len());
            };
            r = newline + 1;
            if let Some(answer) = self.line_end() {
                self.answer = answer;
                self.answer_at = 0;
                return (w, r);
            }
        }
        (w, data.len())
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineLimit<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.answer_at < this.answer.len() {
                let n = buf.remaining().min(this.answer.len() - this.answer_at);
                buf.put_slice(&this.answer[this.answer_at..this.answer_at + n]);
                this.answer_at += n;
                return Poll::Ready(Ok(()));
            }
            let start = buf.filled().len();
            let from_after = this.after_at < this.after.len();
            if from_after {
                let n = buf.remaining().min(this.after.len() - this.after_at);
                buf.put_slice(&this.after[this.after_at..this.after_at + n]);
            } else {
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                if buf.filled().len() == start {
                    if this.dropping {
                        tracing::warn!(
                            server = %this.server,
                            size_bytes = this.len,
                            "an MCP server's output ended inside a message over the size an MCP message may have"
                        );
                    }
                    return Poll::Ready(Ok(()));
                }
            }
            let end = buf.filled().len();
            let (kept, seen) = this.filter(&mut buf.filled_mut()[start..end]);
            if from_after {
                this.after_at += seen;
            } else if seen < end - start {
                this.after.clear();
                this.after
                    .extend_from_slice(&buf.filled()[start + seen..end]);
                this.after_at = 0;
            }
            if this.after_at >= this.after.len() {
                this.after.clear();
                this.after_at = 0;
            }
            buf.set_filled(start + kept);
            if kept > 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
