//! One turn: the loop of model calls and tool calls, from `user.message` to its terminal event.
//!
//! A turn runs on a task of its own: one spawned for it, or the task of the request that started
//! it, which then runs it as it reads what it sends ([`Runner::Watcher`](super::types::Runner::Watcher)) and hands it
//! to a spawned task if it stops reading. Whoever started it only watches (through an optional
//! sink), so a client that goes away never cancels it. Every exit path ends in exactly one
//! terminal event, and every `agent.tool_use` gets exactly one `agent.tool_result` (a tool cut
//! short by a cancel, a timeout or a shutdown gets `"Cancelled."`).

mod attach;
mod compact;
mod end;
mod fragments;
mod model;
mod server_calls;
mod step;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::delivery::to_watcher;
use super::engine_handle::Inner;
use super::run_by_watcher::Driven;
use super::session::Session;
use super::session_record::{AskedCall, Pending};
use super::session_state::State;
use super::turn_job::{Job, RunSlot};
use super::turn_queue::Next;
use super::types::{Client, ShownText, TurnInput};
use crate::log::{Event, EventBody, FailReason};
use crate::message::{Message, Usage};
use crate::sync::lock;
use crate::tools::ToolOutput;

/// The result of a call the session waited on when a new message went on without its answer.
pub(super) const NOT_ANSWERED: &str = "Not answered: the session went on with a new message.";

/// How long an event of a turn may wait to be committed while the turn waits on a model call or
/// server tool calls: when it is due, what the turn has said is committed and published while
/// the calls go on. Calls that answer sooner have those events committed with what comes next
/// (their answer, their results: in the commit that comes next anyway, the next call's or the
/// turn's end). A turn whose upstream and tools answer at once commits once, not once per call
/// (a commit here costs ~30 µs of CPU; run beside a call, it slowed the call down by as much on
/// 2 cores). The price: an event is durable and visible to subscribers up to this much later
/// than it was said (the wait counts from the oldest event not committed, so a turn of many
/// short calls commits on time too). Nothing is shown to anyone before it is durable, either way.
pub(crate) const SYNC_AFTER: Duration = Duration::from_millis(1);

/// The `user.message` a turn input is logged as.
pub(crate) fn user_message(input: &TurnInput) -> EventBody {
    match input {
        TurnInput::User {
            content,
            files,
            skills,
        } => EventBody::UserMessage {
            content: content.clone(),
            files: files.clone(),
            skills: skills.clone(),
        },
        TurnInput::Resume {
            results,
            permissions,
        } => {
            let mut blocks = Vec::with_capacity(results.len() + permissions.len());
            for r in results {
                blocks.push(json!({"type": "tool_result", "tool_use_id": r.call_id,
                                   "content": r.content, "is_error": r.is_error}));
            }
            for p in permissions {
                let mut b = json!({"type": "tool_permission", "tool_use_id": p.call_id, "granted": p.granted});
                if let Some(reason) = &p.reason {
                    b["reason"] = Value::String(reason.clone());
                }
                blocks.push(b);
            }
            EventBody::UserMessage {
                content: Value::Array(blocks),
                files: vec![],
                skills: vec![],
            }
        }
    }
}

/// How a turn ended early.
enum End {
    Stopped,
    Failed(FailReason, String),
}

struct Turn {
    inner: Arc<Inner>,
    /// The configuration the turn started with (a reload does not change it midway).
    config: Arc<crate::config::Config>,
    /// The upstreams the turn started with.
    router: Arc<crate::upstream::router::Router>,
    session: Arc<Session>,
    turn_id: Arc<str>,
    sink: Option<super::delivery::channel::WatcherSink>,
    client: Client,
    usage: Usage,
    /// Whether a model call has answered (its usage counted).
    model_called: bool,
    /// Whether the turn has said anything (a non-empty `agent.message`).
    said: bool,
    /// `agent.tool_use` ids without a result yet.
    open: Vec<String>,
    /// The calls the turn stops on, when it stops with `tool_use`.
    stop_on: Vec<Pending>,
    /// What each server call it stops on is bound to (see `engine/approvals.rs`).
    asked: Vec<AskedCall>,
    /// Server calls waiting on questions to the client (see `engine/client_questions.rs`).
    flight: Option<super::client_questions::Flight>,
    /// Instructions for the model that are not history (plan mode), after the history.
    extra: Vec<Message>,
    /// The turn proposed a plan (which waits for a decision if the turn completes).
    proposed: bool,
    /// Text was streamed since the last stored event (a call cut off must retract it).
    streamed: std::sync::atomic::AtomicBool,
    /// Attached files as the model sees them, read once per turn.
    inlined: HashMap<String, Vec<crate::message::Block>>,
    /// The watcher shows streamed text as it comes and cannot take it back (AAP `delta`).
    irrevocable: bool,
    /// Pushes coalesced deltas whose 50 ms are up while the turn waits on the upstream; started
    /// with the first delta that has to wait.
    flusher: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When the oldest event not yet committed was emitted (`None`: all are committed).
    unsynced_since: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Whether a commit has made the turn's start (its `user.message`) durable: no tool call
    /// runs before (see [`Turn::run_tools`]).
    begun: std::sync::atomic::AtomicBool,
    /// The agent's turn metrics, and when the turn started (for them and its end's log line).
    metrics: (Arc<crate::metrics::TurnMetrics>, std::time::Instant),
    /// Model calls made (retries not counted), for its end's log line.
    steps: u32,
    /// Answers the sampling requests of MCP servers during the turn's tool calls (see
    /// `tools/mcp/sampling.rs`); its tally joins the turn's usage when the turn ends.
    sampler: Arc<crate::tools::mcp::sampling::UpstreamSampler>,
    /// How the turn's start is made durable: `row`, its row in the inbox goes in the commit of
    /// its `user.message`; with either, that commit is made before the model is called (see
    /// [`Job`]).
    start: (bool, bool),
}

/// Start `job` on a task spawned for it.
pub(crate) fn spawn(inner: &Arc<Inner>, session: Arc<Session>, job: Job) {
    crate::metrics::inc(&crate::metrics::TURNS_STARTED);
    let span = span(&session, &job);
    let turn = run(inner.clone(), session, job);
    inner
        .tracker
        .spawn(tracing::Instrument::instrument(turn, span));
}

/// `job` for its watcher to run (see [`Runner::Watcher`](crate::engine::types::Runner::Watcher)).
pub(crate) fn drive(inner: &Arc<Inner>, session: Arc<Session>, job: Job) -> Driven {
    crate::metrics::inc(&crate::metrics::TURNS_STARTED);
    let span = span(&session, &job);
    let turn = run(inner.clone(), session, job);
    let turn = Box::pin(tracing::Instrument::instrument(turn, span));
    Driven::new(&inner.sweeper, &inner.tracker, turn)
}

/// The turn's span (see `telemetry.rs`), made when it starts to run.
fn span(session: &Session, job: &Job) -> tracing::Span {
    let agent = &session.record().agent;
    let owner = session.owner.as_deref();
    let (session, turn) = (&*session.id, &*job.control.turn_id);
    crate::telemetry::turn_span(&job.parent, session, turn, agent, owner)
}

async fn run(inner: Arc<Inner>, session: Arc<Session>, job: Job) {
    let Job {
        control,
        input,
        answering,
        sink,
        client,
        plan,
        max_steps,
        text,
        slot,
        parent: _,
        row,
        confirm,
    } = job;
    // Counted among the running turns until this task ends.
    let _slot = slot.unwrap_or_else(|| RunSlot::take(inner.running_turns()));
    let session_agent = session.record().agent.clone();
    // The turn keeps the configuration and upstreams of its start to its end, whatever a
    // reload puts in place meanwhile.
    let (config, router) = (inner.config(), inner.router());
    let (timeout, wrap_up) = time_limits(&config, &session_agent);
    let sampler = Arc::new(crate::tools::mcp::sampling::UpstreamSampler::new(
        router.clone(),
        upstreams_of(&config, &session_agent).to_vec(),
        model_of(&config, &session),
    ));
    let mut turn = Turn {
        inner,
        config,
        router,
        session,
        turn_id: control.turn_id.as_str().into(),
        sink,
        client,
        usage: Usage::default(),
        model_called: false,
        said: false,
        open: Vec::new(),
        stop_on: Vec::new(),
        asked: Vec::new(),
        flight: None,
        extra: Vec::new(),
        proposed: false,
        streamed: Default::default(),
        inlined: HashMap::new(),
        irrevocable: text == ShownText::Irrevocable,
        flusher: Default::default(),
        unsynced_since: Default::default(),
        begun: Default::default(),
        metrics: (
            crate::metrics::turns(&session_agent),
            std::time::Instant::now(),
        ),
        steps: 0,
        sampler,
        start: (row, confirm),
    };
    let timed_out = Err(End::Failed(FailReason::Timeout, String::new()));
    // Biased, the body first: a turn cancelled before its task first ran still begins (its
    // `user.message` is logged) before it stops; unbiased, it could stop first and log a
    // `turn.cancelled` that no `user.message` starts.
    let mut result = tokio::select! {
        biased;
        r = turn.body(input, answering, plan, max_steps) => r,
        _ = control.token.cancelled() => Err(End::Stopped),
        _ = tokio::time::sleep(timeout) => timed_out,
    };
    if matches!(result, Err(End::Failed(FailReason::Timeout, ref m)) if m.is_empty()) {
        // Spec 003: a turn that can stop normally when its time is up does.
        result = tokio::select! {
            r = turn.wrap_up(timeout, wrap_up) => r,
            _ = control.token.cancelled() => Err(End::Stopped),
        };
    }
    if let Some(flusher) = lock(&turn.flusher).take() {
        flusher.abort();
    }
    turn.finish(result, &control).await;
}

/// The agent's `turn_timeout_s` and `wrap_up_s` (the defaults when the agent is gone).
fn time_limits(config: &crate::config::Config, agent: &str) -> (Duration, Duration) {
    config
        .agent(agent)
        .map_or((Duration::from_secs(3600), Duration::from_secs(60)), |a| {
            (a.turn_timeout, a.wrap_up)
        })
}

/// The model the session's calls go to: its `model` option, else its agent's first upstream's.
fn model_of(config: &crate::config::Config, session: &Session) -> String {
    let record = session.record();
    if let Some(model) = record.options.get("model") {
        return model.clone();
    }
    let agent = config
        .agent(&record.agent)
        .unwrap_or(config.default_agent());
    config.default_model(agent).to_string()
}

/// The upstreams an agent's calls may go to, in order (empty: all).
pub(super) fn upstreams_of<'c>(config: &'c crate::config::Config, agent: &str) -> &'c [String] {
    config.agent(agent).map_or(&[], |a| a.upstreams.as_slice())
}

impl Turn {
    fn emit(&mut self, body: EventBody) -> Option<Arc<Event>> {
        self.streamed
            .store(false, std::sync::atomic::Ordering::Relaxed);
        match &body {
            EventBody::ToolUse { tool_use_id, .. } => self.open.push(tool_use_id.clone()),
            EventBody::ToolResult { tool_use_id, .. } => self.open.retain(|id| id != tool_use_id),
            EventBody::AgentMessage {
                content,
                compaction: false,
                ..
            } if !content.is_empty() => self.said = true,
            _ => {}
        }
        let unsynced = self.unsynced_since.get_mut();
        let unsynced = unsynced.unwrap_or_else(|p| p.into_inner());
        unsynced.get_or_insert_with(tokio::time::Instant::now);
        self.session.append(&self.inner.store, &self.turn_id, body)
    }

    /// How long the turn may go on before what it has said must be committed: [`SYNC_AFTER`]
    /// after the oldest event not yet committed. `None` when there is none.
    fn sync_due(&self) -> Option<Duration> {
        let since = *lock(&self.unsynced_since);
        let due = since? + self.inner.sync_after();
        Some(due.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// Make the events emitted so far durable, then let the watcher and the session's
    /// subscribers see them. Called before the turn waits on the client or a backoff, and when
    /// a commit is due ([`Turn::sync_due`]) while it waits on a model or tool call, so nothing it
    /// has said is lost to a crash or held back for longer than [`SYNC_AFTER`].
    async fn sync(&self) -> Result<(), End> {
        if let Err(e) = self.inner.store.flush().await {
            return Err(End::Failed(
                FailReason::InternalError,
                format!("the log could not be written: {e}"),
            ));
        }
        *lock(&self.unsynced_since) = None;
        self.begun.store(true, std::sync::atomic::Ordering::Relaxed);
        let published = self.session.publish_durable(&self.inner.store);
        to_watcher(self.sink.as_ref(), published);
        Ok(())
    }

    fn emit_result(&mut self, call_id: &str, out: ToolOutput) {
        self.emit(EventBody::ToolResult {
            tool_use_id: call_id.to_string(),
            content: out.content,
            is_error: out.is_error,
            files: out.files,
        });
    }
}

/// Logs a turn cancelled before it started (with the session's lock held): its `user.message`
/// then `turn.cancelled` with no usage. It never reaches the model. The events published.
pub(crate) fn log_unstarted(
    session: &Session,
    st: &mut State,
    store: &crate::log::Store,
    job: &Job,
) -> Vec<Arc<Event>> {
    let turn_id = &job.control.turn_id;
    for body in [
        user_message(&job.input),
        EventBody::TurnCancelled { usage: None },
    ] {
        session.append_locked(st, store, turn_id, body);
    }
    if job.row {
        store.inbox_row_done(&session.id, turn_id);
    }
    // Rare enough to commit here, under the session's lock, so that the events are published
    // in their place.
    if let Err(e) = store.commit() {
        tracing::error!(turn = %turn_id, error = %e, "a turn cancelled before it started could not be logged");
    }
    // `st` is the session's state under its lock: read the agent from it, not through
    // `session.record()` (which takes the lock again).
    crate::metrics::turns(&st.record().agent).ended(crate::metrics::TurnOutcome::Cancelled, None);
    session.publish_durable_locked(st, store)
}

/// Take the next queued turn for the session (with its lock held). Queued turns cancelled
/// while they waited are logged now, `user.message` then `turn.cancelled` with no usage, and
/// never reach the model.
pub(crate) fn next_queued(
    session: &Session,
    st: &mut State,
    store: &crate::log::Store,
) -> Option<Job> {
    while let Some(next) = st.next_turn() {
        match next {
            Next::Run(job) => return Some(job),
            Next::Unstarted(q) => {
                let published = log_unstarted(session, st, store, &q);
                to_watcher(q.sink.as_ref(), published);
            }
        }
    }
    None
}
