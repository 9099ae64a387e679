//! A child's stderr, drained until EOF and logged with bounds, so a server can neither grow our
//! memory nor flood the log nor lose its stderr.
//!
//! - Read as bytes in fixed chunks: a line longer than [`MAX_LINE`] bytes is cut there (the rest
//!   is discarded up to the next newline), so 96 MiB without a newline costs one buffer.
//! - Lossy UTF-8: a line that is not UTF-8 is logged with replacement characters; the reader
//!   never stops before EOF (a closed pipe would kill the child's next stderr write: Node dies
//!   of EPIPE).
//! - Logged at DEBUG (target `turnstile::mcp::stderr`: the name the README documents, kept
//!   whatever this module's path) under a token bucket of
//!   [`LINES_PER_SECOND`] lines per second (bursts of [`BURST`]); the lines left out and the
//!   lines cut are counted and reported at INFO at most once per [`REPORT_EVERY`].

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

/// The longest line logged; the rest of a longer line is discarded and the line counted as cut.
pub const MAX_LINE: usize = 8 * 1024;
/// Lines logged per second per server instance, on average.
pub const LINES_PER_SECOND: f64 = 20.0;
/// Lines logged in a burst before the rate applies.
pub const BURST: f64 = 100.0;
/// How often at most the count of lines not logged is reported.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// One line of output, as the splitter hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The line's text (lossy UTF-8, no newline, no trailing `\r`), at most [`MAX_LINE`] bytes
    /// of the original.
    pub text: String,
    /// Whether the original line was longer and was cut.
    pub cut: bool,
}

/// Splits a byte stream into lines of at most `max` bytes, holding at most `max` bytes.
#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    /// The current line was cut: discard up to the next newline.
    discarding: bool,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max: max.max(1),
            buf: Vec::new(),
            discarding: false,
        }
    }

    /// Feed a chunk; `emit` gets every line it completes (or cuts).
    pub fn push(&mut self, mut chunk: &[u8], emit: &mut impl FnMut(Line)) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|&b| b == b'\n');
            let (part, rest, ends) = match newline {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &chunk[chunk.len()..], false),
            };
            chunk = rest;
            if self.discarding {
                if ends {
                    self.discarding = false;
                }
                continue;
            }
            let room = self.max - self.buf.len();
            if part.len() > room {
                // Over the limit: keep what fits, discard the rest up to the newline.
                self.buf.extend_from_slice(&part[..room]);
                emit(self.take(true));
                self.discarding = !ends;
                continue;
            }
            self.buf.extend_from_slice(part);
            if ends {
                emit(self.take(false));
            }
        }
    }

    /// The last line when the stream ends without a newline.
    pub fn finish(&mut self) -> Option<Line> {
        if self.buf.is_empty() {
            self.discarding = false;
            return None;
        }
        Some(self.take(false))
    }

    fn take(&mut self, cut: bool) -> Line {
        let end = self.buf.len() - usize::from(self.buf.last() == Some(&b'\r'));
        let text = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.clear();
        Line { text, cut }
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Bucket {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Take one token if there is one.
    pub fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Lines not logged since the last report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Left out by the rate limit.
    pub limited: u64,
    /// Cut at [`MAX_LINE`] (their first part was logged, or counted in `limited`).
    pub cut: u64,
}

/// The log side of one server's stderr: rate limit and counts (per server instance, kept
/// across restarts of its child).
#[derive(Debug)]
pub struct StderrLog {
    name: String,
    bucket: Bucket,
    dropped: Dropped,
    reported: Instant,
}

impl StderrLog {
    pub fn new(name: String) -> Self {
        let now = Instant::now();
        StderrLog {
            name,
            bucket: Bucket::new(LINES_PER_SECOND, BURST, now),
            dropped: Dropped::default(),
            reported: now,
        }
    }

    fn line(&mut self, line: Line) {
        if line.cut {
            self.dropped.cut += 1;
        }
        if self.bucket.allow(Instant::now()) {
            let text = printable(&line.text);
            if line.cut {
                tracing::debug!(target: "turnstile::mcp::stderr", server = %self.name, cut = true, "{text}");
            } else {
                tracing::debug!(target: "turnstile::mcp::stderr", server = %self.name, "{text}");
            }
        } else {
            self.dropped.limited += 1;
        }
        self.report(false);
    }

    /// Report the counts at INFO when there are some and the last report is old enough (or
    /// `now` is set: the stream ended).
    fn report(&mut self, now: bool) {
        if self.dropped == Dropped::default() || (!now && self.reported.elapsed() < REPORT_EVERY) {
            return;
        }
        let Dropped { limited, cut } = std::mem::take(&mut self.dropped);
        self.reported = Instant::now();
        tracing::info!(
            server = %self.name,
            not_logged = limited,
            cut,
            "MCP server stderr: {limited} lines not logged (over {LINES_PER_SECOND} lines/s), {cut} lines cut at {MAX_LINE} bytes"
        );
    }
}

/// Control characters (escape sequences, bells) shown escaped, so a child cannot drive the
/// operator's terminal through the log.
fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Drain `stderr` until EOF into `log`. Never stops early: a read error other than EOF is
/// logged and ends the loop only because the pipe is then unusable.
pub async fn drain(
    mut stderr: impl AsyncRead + Unpin,
    log: std::sync::Arc<std::sync::Mutex<StderrLog>>,
) {
    let mut splitter = LineSplitter::new(MAX_LINE);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            read = stderr.read(&mut chunk) => match read {
                Ok(0) => break,
                Ok(n) => {
                    let mut log = crate::sync::lock(&log);
                    splitter.push(&chunk[..n], &mut |line| log.line(line));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let log = crate::sync::lock(&log);
                    tracing::warn!(server = %log.name, error = %e, "reading the MCP server's stderr failed");
                    break;
                }
            },
            _ = tick.tick() => crate::sync::lock(&log).report(false),
        }
    }
    let mut log = crate::sync::lock(&log);
    if let Some(line) = splitter.finish() {
        log.line(line);
    }
    log.report(true);
}

#[cfg(test)]
mod tests;
