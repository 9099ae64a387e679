//! The process's one tracing subscriber, installed on first use: every span and event of
//! turnstile recorded in memory (for `ops::traces`) and every INFO log line as text (for
//! `mcp::elicitation`). The tests share the process, so they share it: each looks only at what
//! names its own session.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// What the subscriber keeps.
struct Captured {
    recorder: Recorder,
    log: Arc<Mutex<Vec<u8>>>,
}

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let recorder = Recorder::default();
        let only_turnstile = tracing_subscriber::filter::Targets::new()
            .with_target("turnstile", tracing::Level::DEBUG);
        let log = Arc::new(Mutex::new(Vec::new()));
        let writer = LogText(log.clone());
        tracing_subscriber::registry()
            .with(recorder.clone().with_filter(only_turnstile))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            )
            .init();
        Captured { recorder, log }
    })
}

/// The recorder of turnstile's spans and events (DEBUG and up).
pub fn recorder() -> &'static Recorder {
    &captured().recorder
}

/// What was logged (tracing, INFO and up, every target), as text.
pub fn log_lines() -> Arc<Mutex<Vec<u8>>> {
    captured().log.clone()
}

#[derive(Clone)]
struct LogText(Arc<Mutex<Vec<u8>>>);

impl Write for LogText {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A span as the recorder saw it: its own number (span ids are reused, these are not), its
/// parent's, its name and fields, and whether it has closed.
#[derive(Debug, Clone)]
pub struct SpanRec {
    pub seq: u64,
    pub parent: Option<u64>,
    pub name: String,
    pub fields: HashMap<String, String>,
    pub closed: bool,
}

/// An event (a log line): its level, message, fields and the span it was in.
#[derive(Debug, Clone)]
pub struct EventRec {
    pub level: tracing::Level,
    pub span: Option<u64>,
    pub fields: HashMap<String, String>,
}

#[derive(Default)]
pub struct Recorded {
    pub spans: HashMap<u64, SpanRec>,
    pub events: Vec<EventRec>,
    pub next: u64,
}

/// Records every span and event of turnstile in memory.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Recorded>>);

struct Seq(u64);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Recorder
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Seq>().map(|s| s.0));
        let mut rec = self.0.lock().unwrap();
        rec.next += 1;
        let seq = rec.next;
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        rec.spans.insert(
            seq,
            SpanRec {
                seq,
                parent,
                name: attrs.metadata().name().to_string(),
                fields,
                closed: false,
            },
        );
        span.extensions_mut().insert(Seq(seq));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(seq) = ctx
            .span(id)
            .and_then(|s| s.extensions().get::<Seq>().map(|s| s.0))
        else {
            return;
        };
        if let Some(span) = self.0.lock().unwrap().spans.get_mut(&seq) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .and_then(|s| s.extensions().get::<Seq>().map(|s| s.0));
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().events.push(EventRec {
            level: *event.metadata().level(),
            span,
            fields,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(seq) = ctx
            .span(&id)
            .and_then(|s| s.extensions().get::<Seq>().map(|s| s.0))
        else {
            return;
        };
        if let Some(span) = self.0.lock().unwrap().spans.get_mut(&seq) {
            span.closed = true;
        }
    }
}

impl Recorder {
    /// The closed `request` span of `route` for session `sid`, once it has closed (it closes
    /// after its turn's span), with everything recorded then; panics after 10 s.
    pub async fn request(&self, route: &str, sid: &str) -> SpanRec {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.0.lock().unwrap().spans.values().find_map(|s| {
                (s.name == "request"
                    && s.closed
                    && s.fields.get("route").map(String::as_str) == Some(route)
                    && s.fields.get("session").map(String::as_str) == Some(sid))
                .then(|| s.clone())
            });
            if let Some(s) = found {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no closed request span for {route} of {sid}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn children(&self, parent: u64, name: &str) -> Vec<SpanRec> {
        let mut out: Vec<SpanRec> = (self.0.lock().unwrap().spans.values())
            .filter(|s| s.parent == Some(parent) && s.name == name)
            .cloned()
            .collect();
        out.sort_by_key(|s| s.seq);
        out
    }

    /// The events logged in span `seq` with this message.
    pub fn events_in(&self, seq: u64, message: &str) -> Vec<EventRec> {
        (self.0.lock().unwrap().events.iter())
            .filter(|e| {
                e.span == Some(seq) && e.fields.get("message").map(String::as_str) == Some(message)
            })
            .cloned()
            .collect()
    }
}
