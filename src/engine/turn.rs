//! One turn: the loop of model calls and tool calls, from `user.message` to its terminal event.
//!
//! A turn runs on a task of its own: one spawned for it, or the task of the request that started
//! it, which then runs it as it reads what it sends ([`super::TurnRequest::drive`]) and hands it
//! to a spawned task if it stops reading. Whoever started it only watches (through an optional
//! sink), so a client that goes away never cancels it. Every exit path ends in exactly one
//! terminal event, and every `agent.tool_use` gets exactly one `agent.tool_result` (a tool cut
//! short by a cancel, a timeout or a shutdown gets `"Cancelled."`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::catalog::{Catalog, Route};
use super::session::{DeltaKind, Pending, PendingKind, Session, StopCause, TurnControl};
use super::Inner;
use crate::log::{Event, EventBody, FailReason, FileRef, StopReason};
use crate::message::{Message, ToolCall, Usage};
use crate::metrics::NotRun;
use crate::sync::lock;
use crate::tools::{CallContext, ToolOutput};
use crate::upstream::{DeltaSink, ModelOutput, ModelRequest};

/// The result of a call the session waited on when a new message went on without its answer.
pub const NOT_ANSWERED: &str = "Not answered: the session went on with a new message.";

/// What the model is told when `turn_timeout_s` has passed (its last call has no tools).
const WRAP_UP: &str = "The time for this task is up. Do not call tools. Conclude now: say briefly what was done, what was found, and what is left undone.";

/// How many server tool calls of one step run at once.
const TOOL_PARALLELISM: usize = 8;

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

/// What starts a turn.
#[derive(Debug, Clone)]
pub enum TurnInput {
    /// A new user message.
    User {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
    },
    /// Answers to the calls the last turn stopped on: one per pending call.
    Resume {
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
    },
}

/// A client tool's result.
#[derive(Debug, Clone)]
pub struct ClientResult {
    pub call_id: String,
    /// A string or content blocks.
    pub content: Value,
    pub is_error: bool,
}

/// The client's decision on a server tool call.
#[derive(Debug, Clone)]
pub struct Permission {
    pub call_id: String,
    pub granted: bool,
    pub reason: Option<String>,
}

pub(crate) struct TurnJob {
    pub session: Arc<Session>,
    pub control: Arc<TurnControl>,
    pub input: TurnInput,
    /// The calls being answered (for `Resume`), taken from the session when the turn started.
    pub answering: Vec<Pending>,
    pub sink: Option<super::watch::WatcherSink>,
    pub interactive: bool,
    /// Plan mode (runs API): propose a plan without tools and wait for its approval first.
    pub plan: bool,
    pub max_steps: Option<u32>,
    pub irrevocable: bool,
    /// Its place among the running turns; `None` for a queued turn until it runs.
    pub slot: Option<super::RunSlot>,
    /// The span current when it was started (its request's): its own span's parent, wherever
    /// and whenever it runs.
    pub parent: tracing::Span,
}

impl TurnJob {
    /// The turn's span (see `telemetry.rs`), made when it starts to run.
    pub(crate) fn span(&self) -> tracing::Span {
        let agent = &self.session.record().agent;
        let (session, turn) = (&*self.session.id, &*self.control.turn_id);
        crate::telemetry::turn_span(&self.parent, session, turn, agent)
    }
}

/// A turn waiting for the running one to end.
pub(crate) struct Queued {
    pub control: Arc<TurnControl>,
    pub job: TurnJob,
}

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
    session: Arc<Session>,
    turn_id: Arc<str>,
    sink: Option<super::watch::WatcherSink>,
    interactive: bool,
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
    asked: Vec<super::session::AskedCall>,
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
    /// The agent's turn metrics, and when the turn started.
    metrics: (Arc<crate::metrics::TurnMetrics>, std::time::Instant),
    /// Model calls made (retries not counted) and when the turn started, for its end's log line.
    steps: u32,
    started: std::time::Instant,
}

pub(crate) async fn run(inner: Arc<Inner>, job: TurnJob) {
    let TurnJob {
        session,
        control,
        input,
        answering,
        sink,
        interactive,
        plan,
        max_steps,
        irrevocable,
        slot,
        parent: _,
    } = job;
    // Counted among the running turns until this task ends.
    let _slot = slot.unwrap_or_else(|| super::RunSlot::take(inner.running_turns()));
    let session_agent = session.record().agent.clone();
    let (timeout, wrap_up) = inner
        .config
        .agent(&session_agent)
        .map_or((Duration::from_secs(3600), Duration::from_secs(60)), |a| {
            (a.turn_timeout, a.wrap_up)
        });
    let mut turn = Turn {
        inner,
        session,
        turn_id: control.turn_id.as_str().into(),
        sink,
        interactive,
        usage: Usage::default(),
        model_called: false,
        said: false,
        open: Vec::new(),
        stop_on: Vec::new(),
        asked: Vec::new(),
        extra: Vec::new(),
        proposed: false,
        streamed: Default::default(),
        inlined: HashMap::new(),
        irrevocable,
        flusher: Default::default(),
        unsynced_since: Default::default(),
        metrics: (
            crate::metrics::turns(&session_agent),
            std::time::Instant::now(),
        ),
        steps: 0,
        started: std::time::Instant::now(),
    };
    let timed_out = Err(End::Failed(FailReason::Timeout, String::new()));
    let mut result = tokio::select! {
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

impl Turn {
    /// `turn_timeout_s` has passed: the calls still running are answered `Cancelled.`, text
    /// streamed by a model call cut off is retracted, and the model gets one last call, with no
    /// tools, asked to conclude, within `wrap_up_s`. The turn then ends as that call does; it
    /// fails `timeout` only if the call fails or does not answer in time.
    async fn wrap_up(&mut self, timeout: Duration, within: Duration) -> Result<StopReason, End> {
        let failed = |why: String| {
            End::Failed(
                FailReason::Timeout,
                format!(
                    "the turn ran longer than turn_timeout_s ({} s) and could not wrap up: {why}",
                    timeout.as_secs()
                ),
            )
        };
        tracing::info!(turn = %self.turn_id, timeout_s = timeout.as_secs(), "turn_timeout_s passed: the turn wraps up");
        if self
            .streamed
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            self.emit(EventBody::AgentMessage {
                content: String::new(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
        for id in std::mem::take(&mut self.open) {
            self.emit_result(&id, ToolOutput::error("Cancelled."));
        }
        // What the turn stopped on (calls for the client) stays for the client: only a turn
        // that was still running reaches here, with none.
        self.stop_on.clear();
        self.asked.clear();
        let record = self.session.record();
        let config = self.inner.config.clone();
        let Some(agent) = config.agent(&record.agent) else {
            return Err(failed("the session's agent is no longer configured".into()));
        };
        self.extra = vec![Message::User {
            content: crate::message::Content::Text(WRAP_UP.into()),
        }];
        let req = self.request(agent, &record, Vec::new(), false);
        let out = match tokio::time::timeout(within, self.call_model(&req, false)).await {
            Ok(Ok(out)) => out,
            Ok(Err(End::Failed(_, why))) => return Err(failed(why)),
            Ok(Err(end)) => return Err(end),
            Err(_) => {
                if self
                    .streamed
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    self.emit(EventBody::AgentMessage {
                        content: String::new(),
                        plan: false,
                        compaction: false,
                        replaces: None,
                    });
                }
                return Err(failed(format!(
                    "the last model call did not answer within wrap_up_s ({} s)",
                    within.as_secs()
                )));
            }
        };
        self.usage.add(out.usage);
        if !out.text.is_empty() {
            self.emit(EventBody::AgentMessage {
                content: out.text.clone(),
                plan: false,
                compaction: false,
                replaces: None,
            });
        }
        match out.stop {
            crate::upstream::ModelStop::MaxTokens => Ok(StopReason::MaxTokens),
            crate::upstream::ModelStop::Refusal => Ok(StopReason::Refusal),
            _ if out.text.trim().is_empty() => {
                Err(failed("the model's last call said nothing".into()))
            }
            _ => Ok(StopReason::EndTurn),
        }
    }

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
        let published = self.session.publish_durable(&self.inner.store);
        to_watcher(self.sink.as_ref(), published);
        Ok(())
    }

    /// A tool's result as the model may be given it: over `[limits] tool_result_bytes`, its
    /// first part and a note naming the workspace file that holds the whole (see `oversize.rs`).
    async fn bounded(&self, call_id: &str, out: ToolOutput) -> ToolOutput {
        let workspace = self.inner.config.server.sandboxes.join(&*self.session.id);
        let limit = self.inner.config.limits.tool_result_bytes;
        super::oversize::bound(&workspace, call_id, out, limit).await
    }

    fn emit_result(&mut self, call_id: &str, out: ToolOutput) {
        self.emit(EventBody::ToolResult {
            tool_use_id: call_id.to_string(),
            content: out.content,
            is_error: out.is_error,
            files: out.files,
        });
    }

    async fn body(
        &mut self,
        input: TurnInput,
        answering: Vec<Pending>,
        plan: bool,
        max_steps: Option<u32>,
    ) -> Result<StopReason, End> {
        {
            // A turn the log still has open (its closing could not be written) is closed
            // first, in the same commit as this turn's start.
            let mut st = self.session.lock();
            let why = "the event log could not be written when the turn ended";
            let store = &self.inner.store;
            let reason = FailReason::InternalError;
            self.session.close_open_locked(&mut st, store, reason, why);
        }
        self.emit(user_message(&input));
        let input_kind = match &input {
            TurnInput::User { content, .. } => super::session::PlanDecision::of_content(content),
            TurnInput::Resume { .. } => None,
        };
        if let TurnInput::User { .. } = &input {
            // Calls the session still waits on (the last turn stopped on them, before or after
            // this message was sent): the session went on without their answers.
            let open = std::mem::take(&mut self.session.lock().pending);
            for p in open {
                self.emit_result(&p.call_id, ToolOutput::error(NOT_ANSWERED));
            }
        }
        if let TurnInput::Resume {
            results,
            permissions,
        } = input
        {
            self.resume(answering, results, permissions).await?;
        }

        let record = self.session.record();
        let config = self.inner.config.clone();
        let agent = config.agent(&record.agent).ok_or_else(|| {
            End::Failed(
                FailReason::InternalError,
                format!(
                    "the session's agent {:?} is no longer configured",
                    record.agent
                ),
            )
        })?;
        // The operator's budget is a ceiling: a request may ask for fewer steps, never more.
        let max_steps = max_steps.map_or(agent.max_steps, |m| m.min(agent.max_steps));
        if plan {
            // A plan turn (a run's first, or after a rejection) ends with its plan.
            let rejected = matches!(
                &input_kind,
                Some(super::session::PlanDecision::Reject { .. })
            );
            return self.plan(agent, !rejected).await;
        }
        let mut step = 0;
        while step < max_steps {
            step += 1;
            let record = self.session.record();
            let host_tools = self.inner.tools.tools();
            let catalog = Catalog::new(agent, &host_tools, &record, self.interactive);
            let thinking = match record.options.get("thinking").map(String::as_str) {
                Some("on") => true,
                Some("off") => false,
                _ => agent.thinking,
            };
            self.prepare_attachments().await;
            let req = self.request(agent, &record, catalog.offered(), thinking);
            let rebuild = |t: &Turn| t.request(agent, &record, catalog.offered(), thinking);
            let (req, bytes) = self.fit(agent, req, rebuild).await?;
            let out = self.call_model(&req, thinking).await?;
            self.calibration().observe(bytes, out.usage.input_tokens);
            self.usage.add(out.usage);

            if let Some(ev) = EventBody::thinking(&out.thinking, &out.signed_thinking) {
                if thinking {
                    self.emit(ev);
                }
            }
            if !out.text.is_empty() {
                self.emit(EventBody::AgentMessage {
                    content: out.text.clone(),
                    plan: false,
                    compaction: false,
                    replaces: None,
                });
            }
            let ModelOutput {
                tool_calls, stop, ..
            } = out;
            if tool_calls.is_empty() {
                return match stop {
                    crate::upstream::ModelStop::MaxTokens => Ok(StopReason::MaxTokens),
                    crate::upstream::ModelStop::Refusal => Ok(StopReason::Refusal),
                    _ if !self.said => Err(End::Failed(
                        FailReason::EmptyOutput,
                        "the model finished without a reply".into(),
                    )),
                    _ => Ok(StopReason::EndTurn),
                };
            }
            let mut asked_at = HashMap::new();
            for call in &tool_calls {
                let logged = self.emit(EventBody::ToolUse {
                    tool_use_id: call.id.clone(),
                    name: call.name.clone(),
                    input: call.input.clone(),
                });
                if let Some(ev) = logged {
                    asked_at.insert(call.id.clone(), ev.created_at.clone());
                }
            }
            if step == max_steps {
                for call in &tool_calls {
                    self.emit_result(
                        &call.id,
                        ToolOutput::error("not run: the turn's step budget is spent"),
                    );
                }
                return Ok(StopReason::MaxSteps);
            }
            let mut inline = Vec::new();
            let mut stop_on = Vec::new();
            let mut asked = Vec::new();
            for call in tool_calls {
                let kind = match catalog.route(&call.name) {
                    Route::Client => PendingKind::Client,
                    Route::Ask => {
                        let binding =
                            super::approvals::bind(&call.id, &call.name, &call.input, &host_tools);
                        asked.push(binding);
                        PendingKind::Permission
                    }
                    Route::Inline => {
                        inline.push(call);
                        continue;
                    }
                    Route::Refuse(msg) => {
                        crate::metrics::tool(&*self.inner.tools, &call.name)
                            .not_run(NotRun::Refused);
                        self.emit_result(&call.id, ToolOutput::error(msg));
                        continue;
                    }
                };
                stop_on.push(Pending {
                    asked_at: asked_at.remove(&call.id).unwrap_or_default(),
                    call_id: call.id,
                    name: call.name,
                    input: call.input,
                    kind,
                    expires_at: None,
                    expired: false,
                });
            }
            self.run_tools(inline).await?;
            if !stop_on.is_empty() {
                self.open
                    .retain(|id| !stop_on.iter().any(|p| &p.call_id == id));
                self.stop_on = stop_on;
                self.asked = asked;
                return Ok(StopReason::ToolUse);
            }
        }
        // Only reached with a budget of no steps.
        Ok(StopReason::MaxSteps)
    }

    /// Plan mode: ask for a plan with no tools offered and log it (`agent.message`, `plan:
    /// true`); the turn then ends (`end_turn`) and the session waits for the decision, which
    /// starts the next turn (see `Engine::decide_plan`). The history then carries the decision:
    /// a confirmation (its edits replacing the plan), or a rejection with its reason, which asks
    /// for another plan. `first`: the run's first plan (asked for here; a rejection asks itself).
    async fn plan(
        &mut self,
        agent: &crate::config::AgentConfig,
        first: bool,
    ) -> Result<StopReason, End> {
        if first {
            self.extra = vec![Message::User {
                content: crate::message::Content::Text(
                    "Before doing anything, propose a short, numbered plan for this goal. Do not call tools yet; the plan will be reviewed first.".into(),
                ),
            }];
        }
        let record = self.session.record();
        self.prepare_attachments().await;
        let req = self.request(agent, &record, Vec::new(), false);
        let out = self.call_model(&req, false).await?;
        self.usage.add(out.usage);
        if out.text.trim().is_empty() {
            return Err(End::Failed(
                FailReason::EmptyOutput,
                "the model proposed no plan".into(),
            ));
        }
        // The plan waits before anyone can see it, so a client that answers `plan_proposed`
        // at once finds it (its decision's turn then queues behind the end of this one).
        self.session.lock().plan = Some(super::session::PlanWait {
            plan: out.text.clone(),
        });
        self.proposed = true;
        self.emit(EventBody::AgentMessage {
            content: out.text,
            plan: true,
            compaction: false,
            replaces: None,
        });
        Ok(StopReason::EndTurn)
    }

    /// Log the result of every call the last turn stopped on: the client's results, the
    /// denials, and the granted calls run here.
    async fn resume(
        &mut self,
        answering: Vec<Pending>,
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
    ) -> Result<(), End> {
        self.open = answering.iter().map(|p| p.call_id.clone()).collect();

        let mut results: HashMap<String, ClientResult> = results
            .into_iter()
            .map(|r| (r.call_id.clone(), r))
            .collect();
        let mut permissions: HashMap<String, Permission> = permissions
            .into_iter()
            .map(|p| (p.call_id.clone(), p))
            .collect();
        let record = self.session.record();
        let config = self.inner.config.clone();
        let host_tools = self.inner.tools.tools();
        let mut granted = Vec::new();
        for p in answering {
            if let Some(r) = results.remove(&p.call_id) {
                let out = ToolOutput {
                    content: r.content,
                    is_error: r.is_error,
                    files: vec![],
                };
                let out = self.bounded(&p.call_id, out).await;
                self.emit_result(&p.call_id, out);
            } else if p.expired {
                // Its permission expired before the client answered (a grant was refused).
                let text = super::approvals::expired_result();
                crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Expired);
                self.emit_result(&p.call_id, ToolOutput::error(text));
            } else if let Some(perm) = permissions.remove(&p.call_id) {
                if !perm.granted {
                    let text = match perm.reason.as_deref().map(str::trim) {
                        Some(reason) if !reason.is_empty() => format!("Tool call denied: {reason}"),
                        _ => "Tool call denied".to_string(),
                    };
                    crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Denied);
                    self.emit_result(&p.call_id, ToolOutput::error(text));
                    continue;
                }
                use super::approvals::{regrant, Regrant};
                let decided = match config.agent(&record.agent) {
                    Some(agent) => regrant(agent, &host_tools, &record, &p, &self.session.id),
                    None => Regrant::Refuse("The session's agent is gone.".into()),
                };
                match decided {
                    Regrant::Refuse(msg) => {
                        crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Refused);
                        self.emit_result(&p.call_id, ToolOutput::error(msg))
                    }
                    Regrant::Run => granted.push(p.call()),
                }
            }
        }
        self.run_tools(granted).await
    }

    /// Read the session's attached files once, as the model will see them.
    async fn prepare_attachments(&mut self) {
        let Some(files) = self.inner.files.clone() else {
            return;
        };
        for f in self.session.attached_files() {
            if !self.inlined.contains_key(&f.id) {
                let blocks = inline_file(&files, &f, self.session.owner.as_deref()).await;
                self.inlined.insert(f.id.clone(), blocks);
            }
        }
    }

    /// Run server tool calls in parallel (bounded), logging each result as it completes.
    async fn run_tools(&mut self, calls: Vec<ToolCall>) -> Result<(), End> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut left = calls.len();
        let host = self.inner.tools.clone();
        let ctx = CallContext {
            session_id: self.session.id.to_string(),
            workspace: self.inner.config.server.sandboxes.join(&*self.session.id),
            owner: self.session.owner.clone(),
            elicitor: None,
        };
        let ctx = &ctx;
        let listing = host.tools();
        let mut done = futures_util::stream::iter(calls)
            .map(|call| {
                let host = host.clone();
                let span = match listing.iter().find(|t| t.spec.name == call.name) {
                    Some(t) => {
                        let verdict = crate::telemetry::snake(&t.verdict);
                        crate::telemetry::tool_span(&t.server, &t.tool, &verdict)
                    }
                    None => crate::telemetry::tool_span("unknown", &call.name, "unknown"),
                };
                let call = async move {
                    let timer = crate::metrics::tool(&*host, &call.name).start();
                    let out = host.call(ctx, &call.name, call.input).await;
                    timer.done(out.is_error);
                    let outcome = if out.is_error { "error" } else { "ok" };
                    tracing::Span::current().record("outcome", tracing::field::display(outcome));
                    (call.id, out)
                };
                tracing::Instrument::instrument(call, span)
            })
            .buffer_unordered(TOOL_PARALLELISM);
        // What the turn said before the calls (its tool uses) is committed and published with
        // the first result if one comes before it is due (see `sync_due`), else then, while the
        // calls go on.
        let mut next = {
            let mut first = std::pin::pin!(done.next());
            match self.sync_due() {
                None => first.await,
                Some(due) => match tokio::time::timeout(due, first.as_mut()).await {
                    Ok(next) => next,
                    Err(_) => {
                        self.sync().await?;
                        first.await
                    }
                },
            }
        };
        while let Some((id, out)) = next {
            let out = self.bounded(&id, out).await;
            self.emit_result(&id, out);
            left -= 1;
            if left == 0 {
                // The last result goes out with the next commit, which comes at once: the next
                // model call's, or the terminal event's.
                break;
            }
            // Each result is published as its call completes.
            self.sync().await?;
            next = done.next().await;
        }
        Ok(())
    }

    fn request(
        &self,
        agent: &crate::config::AgentConfig,
        record: &super::session::SessionRecord,
        tools: Vec<crate::upstream::ToolDef>,
        thinking: bool,
    ) -> ModelRequest {
        let inlined = &self.inlined;
        let history = self.session.model_history(&|f| inlined.get(&f.id).cloned());
        let mut system = (!agent.system_prompt.is_empty()).then(|| agent.system_prompt.clone());
        let mut messages = Vec::with_capacity(history.len());
        for m in history {
            match m {
                // A seed system message replaces the agent's prompt for this session.
                Message::System { content } => system = Some(content),
                other => messages.push(other),
            }
        }
        messages.extend(self.extra.iter().cloned());
        let upstream = &self.inner.config.upstream;
        ModelRequest {
            model: record
                .options
                .get("model")
                .cloned()
                .unwrap_or_else(|| upstream.model.clone()),
            system,
            messages,
            tools,
            max_tokens: upstream.max_tokens,
            thinking,
        }
    }

    fn calibration(&self) -> Arc<super::context::Calibration> {
        self.session.extension::<super::context::Calibration>()
    }

    /// Make `req` fit the model's context window (see `context.rs`): past `compact_at` of it,
    /// compact the oldest turns first and build the request again with `rebuild`. A request
    /// still over the window fails the turn, with what to do. Returns the request and its size
    /// in bytes (for calibration).
    async fn fit(
        &mut self,
        agent: &crate::config::AgentConfig,
        req: ModelRequest,
        rebuild: impl Fn(&Turn) -> ModelRequest,
    ) -> Result<(ModelRequest, usize), End> {
        let (window, known) = super::context::window(agent.context_tokens, &req.model);
        let threshold = (window as f64 * agent.compact_at) as u64;
        let cal = self.calibration();
        let bytes = super::context::request_bytes(&req);
        if cal.tokens(bytes) <= threshold {
            return Ok((req, bytes));
        }
        let (req, bytes) = if self.compact(agent, &req, window, known, threshold).await? {
            let req = rebuild(self);
            let bytes = super::context::request_bytes(&req);
            (req, bytes)
        } else {
            (req, bytes)
        };
        let tokens = cal.tokens(bytes);
        if known && tokens > window {
            return Err(self.too_big(tokens, window));
        }
        Ok((req, bytes))
    }

    /// The failure of a request that cannot fit the window, whatever is compacted.
    fn too_big(&self, tokens: u64, window: u64) -> End {
        End::Failed(
            FailReason::ModelError,
            format!(
                "the request would be about {tokens} tokens, more than the model's context window of {window} tokens ([agents.{}] context_tokens in tools.toml), even with the earlier conversation compacted: the latest message or tool result is too large. Send a shorter message, or attach long text as a file",
                self.session.record().agent
            ),
        )
    }

    /// Compact the oldest messages into a summary (a model call of its own, without tools),
    /// logged as an `agent.message` with `compaction: true`. Returns whether it did.
    async fn compact(
        &mut self,
        agent: &crate::config::AgentConfig,
        req: &ModelRequest,
        window: u64,
        known: bool,
        threshold: u64,
    ) -> Result<bool, End> {
        use super::context;
        let cal = self.calibration();
        let now = self.session.compactable();
        let sizes: Vec<usize> = now.messages.iter().map(context::message_bytes).collect();
        let shown: usize = req.messages.iter().map(context::message_bytes).sum();
        let fixed = context::request_bytes(req).saturating_sub(shown);
        // Room for the summary: a tenth of the window.
        let reserve = cal.bytes(window / 10);
        let cuts: Vec<(usize, bool)> = now.cuts.iter().map(|(at, user, _)| (*at, *user)).collect();
        // What no compaction can take away: over the window, a summary call would be wasted.
        let least = cuts.last().map_or(0, |&(at, _)| at);
        let least = cal.tokens(fixed + sizes[least.min(sizes.len())..].iter().sum::<usize>());
        if known && least > window {
            return Err(self.too_big(least, window));
        }
        let target = cal.bytes(threshold / 2);
        let Some(cut) = context::choose_cut(&sizes, &cuts, fixed + reserve, target) else {
            return Ok(false);
        };
        let (Some(first), Some((_, _, last))) = (
            now.first_id.clone(),
            now.cuts.iter().find(|(at, _, _)| *at == cut),
        ) else {
            return Ok(false);
        };
        let budget = cal.bytes(threshold.saturating_sub(window / 10));
        let text =
            context::summary_request_text(now.summary.as_deref(), &now.messages[..cut], budget);
        let summary_req = ModelRequest {
            model: req.model.clone(),
            system: Some(context::SUMMARY_SYSTEM.into()),
            messages: vec![Message::User {
                content: crate::message::Content::Text(text),
            }],
            tools: Vec::new(),
            max_tokens: req.max_tokens,
            thinking: false,
        };
        tracing::info!(turn = %self.turn_id, agent = %agent.name, messages = cut, "compacting the oldest messages of the session");
        // What the turn has said is durable before the wait.
        self.sync().await?;
        let out = self.summarise(&summary_req).await?;
        cal.observe(context::request_bytes(&summary_req), out.usage.input_tokens);
        self.usage.add(out.usage);
        let summary = out.text.trim();
        if summary.is_empty() {
            tracing::warn!(turn = %self.turn_id, "the model gave an empty summary: not compacted");
            return Ok(false);
        }
        self.emit(EventBody::AgentMessage {
            content: summary.to_string(),
            plan: false,
            compaction: true,
            replaces: Some([first, last.clone()]),
        });
        Ok(true)
    }

    /// A summary call: nothing is streamed, failures are retried like any model call.
    async fn summarise(&mut self, req: &ModelRequest) -> Result<ModelOutput, End> {
        let retries = self.inner.config.upstream.retries;
        let mut attempt = 0;
        loop {
            let metered = crate::metrics::upstream(self.inner.provider.name(), &req.model);
            let sent = std::time::Instant::now();
            let result = self
                .inner
                .provider
                .complete(req, &mut crate::upstream::NoDeltas)
                .await;
            metered.call(sent, None, result.as_ref().ok().map(|o| o.usage));
            match result {
                Ok(out) => {
                    self.model_called = true;
                    return Ok(out);
                }
                Err(e) if !e.retryable || attempt >= retries => {
                    tracing::warn!(turn = %self.turn_id, error = %e, "the summary call failed");
                    return Err(End::Failed(
                        FailReason::ModelError,
                        format!("compacting the conversation failed: {}", e.message),
                    ));
                }
                Err(e) => {
                    attempt += 1;
                    let backoff = e
                        .retry_after
                        .unwrap_or(Duration::from_millis(250 << attempt.min(5)))
                        .min(Duration::from_secs(30));
                    tracing::info!(turn = %self.turn_id, attempt, error = %e, ?backoff, "retrying the summary call");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// One model call, retried on retryable failures. Text streamed by an attempt that then
    /// fails is retracted with an empty `agent.message`.
    async fn call_model(&mut self, req: &ModelRequest, thinking: bool) -> Result<ModelOutput, End> {
        let retries = self.inner.config.upstream.retries;
        let mut attempt = 0;
        self.steps += 1;
        loop {
            let metered = crate::metrics::upstream(self.inner.provider.name(), &req.model);
            let sent = std::time::Instant::now();
            let feed = FragmentFeed {
                session: &self.session,
                turn_id: &self.turn_id,
                flusher: &self.flusher,
                held: std::sync::Mutex::new(Some(Vec::new())),
            };
            let mut deltas = Deltas {
                sink: self.sink.as_ref(),
                streamed: &self.streamed,
                feed: &feed,
                thinking,
                streamed_text: false,
                kept: self.irrevocable.then(String::new),
                first_at: None,
            };
            // What the turn has said so far (its `user.message` first of all) is committed while
            // the upstream works on the request if it has not answered when that is due, and
            // published before anything the model says.
            let provider = &self.inner.provider;
            let span = crate::telemetry::model_span(provider.name(), &req.model, attempt + 1);
            let call =
                tracing::Instrument::instrument(provider.complete(req, &mut deltas), span.clone());
            let (result, synced) = overlapped(call, self.sync(), self.sync_due(), &feed).await?;
            if !synced {
                // The upstream answered before a commit was due. What the turn said is
                // committed with what comes next, unless the turn is to wait (a retry's
                // backoff) or live subscribers are owed the fragments they would have seen
                // (they may follow only the events before them).
                if result.is_err() || (feed.holds_any() && self.session.watched()) {
                    self.sync().await?;
                    feed.release();
                } else {
                    feed.discard();
                }
            }
            crate::telemetry::model_done(
                &span,
                result
                    .as_ref()
                    .map(|o| o.usage)
                    .map_err(|e| e.message.as_str()),
            );
            let streamed = deltas.streamed_text;
            metered.call(sent, deltas.first_at, result.as_ref().ok().map(|o| o.usage));
            let kept = deltas.kept.take().filter(|t| !t.is_empty());
            match result {
                Ok(out) => {
                    // A terminal event's usage is `null` until a model call has answered.
                    self.model_called = true;
                    return Ok(out);
                }
                Err(e) => {
                    if let Some(text) = kept {
                        // The watcher already shows this text and cannot take it back: the log
                        // keeps it too, and the turn ends here rather than retrying.
                        self.emit(EventBody::AgentMessage {
                            content: text,
                            plan: false,
                            compaction: false,
                            replaces: None,
                        });
                        tracing::warn!(turn = %self.turn_id, error = %e, "upstream call failed after text was streamed to a client that cannot retract it");
                        return Err(End::Failed(FailReason::ModelError, e.message));
                    }
                    if streamed {
                        self.emit(EventBody::AgentMessage {
                            content: String::new(),
                            plan: false,
                            compaction: false,
                            replaces: None,
                        });
                    }
                    if !e.retryable || attempt >= retries {
                        tracing::warn!(turn = %self.turn_id, error = %e, "upstream call failed");
                        return Err(End::Failed(FailReason::ModelError, e.message));
                    }
                    attempt += 1;
                    let backoff = e
                        .retry_after
                        .unwrap_or(Duration::from_millis(250 << attempt.min(5)))
                        .min(Duration::from_secs(30));
                    tracing::info!(turn = %self.turn_id, attempt, error = %e, ?backoff, "retrying the upstream call");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// Write the terminal event, make it durable, then let everyone see it.
    async fn finish(mut self, result: Result<StopReason, End>, control: &TurnControl) {
        let usage = self.model_called.then_some(self.usage);
        let terminal = match result {
            Ok(stop_reason) => EventBody::TurnCompleted { usage, stop_reason },
            Err(end) => {
                for id in std::mem::take(&mut self.open) {
                    self.emit_result(&id, ToolOutput::error("Cancelled."));
                }
                match end {
                    End::Stopped if control.cause() == Some(StopCause::Shutdown) => {
                        EventBody::TurnFailed {
                            reason: FailReason::WorkerShutdown,
                            usage,
                            message: Some("the server is shutting down".into()),
                        }
                    }
                    End::Stopped => EventBody::TurnCancelled { usage },
                    End::Failed(reason, message) => EventBody::TurnFailed {
                        reason,
                        usage,
                        message: Some(message),
                    },
                }
            }
        };
        use crate::metrics::TurnOutcome;
        let outcome = match terminal {
            EventBody::TurnCompleted { .. } => TurnOutcome::Completed,
            EventBody::TurnCancelled { .. } => TurnOutcome::Cancelled,
            _ => TurnOutcome::Failed,
        };
        self.metrics
            .0
            .ended(outcome, Some(self.metrics.1.elapsed()));
        let (outcome, reason) = match &terminal {
            EventBody::TurnCompleted { stop_reason, .. } => {
                ("completed", crate::telemetry::snake(stop_reason))
            }
            EventBody::TurnFailed { reason, .. } => ("failed", crate::telemetry::snake(reason)),
            _ => ("cancelled", String::new()),
        };
        crate::telemetry::turn_done(&crate::telemetry::TurnEnd {
            outcome,
            reason: &reason,
            steps: self.steps,
            tokens_in: self.usage.input_tokens,
            tokens_out: self.usage.output_tokens,
            took: self.started.elapsed(),
        });
        let mut stop_on = std::mem::take(&mut self.stop_on);
        let asked = std::mem::take(&mut self.asked);
        let store = &self.inner.store;
        // After a failed commit the terminal event is not written with the rest: it would go
        // into the log after a hole, perhaps with no start of its turn before it.
        let completed = matches!(terminal, EventBody::TurnCompleted { .. });
        let lost = self.session.lost_writes(store);
        if !lost {
            let mut st = self.session.lock();
            let stopped = matches!(terminal, EventBody::TurnCompleted { .. });
            self.session
                .append_locked(&mut st, store, &self.turn_id, terminal);
            if stopped && !stop_on.is_empty() {
                let session = &self.session;
                super::approvals::paused(&self.inner, session, &mut st, &mut stop_on, asked);
            }
            st.pending = stop_on;
        }
        let flushed = store.flush().await;
        if let Err(e) = &flushed {
            tracing::error!(turn = %self.turn_id, error = %e, "the turn's events could not be made durable");
        }
        // A failed commit: the session is rebuilt from the log, read now that every write of
        // the turn has been through a commit, and the turn closed there if it is open.
        let copy = if lost || self.session.lost_writes(store) {
            self.session.read_back(store).await
        } else {
            None
        };
        // Under one lock: the terminal event reaches subscribers before anything of the next
        // turn, and the next queued turn takes the session.
        let (published, next) = {
            let mut st = self.session.lock();
            if st
                .running
                .as_ref()
                .is_some_and(|r| r.turn_id == *self.turn_id)
            {
                st.running = None;
            }
            st.coalescer = None;
            if self.proposed && !completed {
                // A plan whose turn did not complete waits for nothing.
                st.plan = None;
            }
            let mut published = self.session.publish_durable_locked(&mut st, store);
            if let Some(copy) = copy {
                let why = flushed.err().map_or_else(
                    || "the event log could not be written".to_string(),
                    |e| format!("the event log could not be written: {e}"),
                );
                published.extend(self.session.rebuild_locked(
                    &mut st,
                    store,
                    &copy,
                    &self.turn_id,
                    &why,
                ));
            }
            (
                published,
                next_queued(&self.session, &mut st, &self.inner.store),
            )
        };
        to_watcher(self.sink.as_ref(), published);
        if let Some(job) = next {
            self.inner.spawn_turn(job);
        }
        // Paused on permissions: their expiry is timed from now on.
        super::approvals::settle(&self.inner, &self.session);
    }
}

/// Text files up to this size are given to the model inline.
const INLINE_TEXT_BYTES: u64 = 64 * 1024;
/// Images up to this size are given to the model as image blocks.
const INLINE_IMAGE_BYTES: u64 = 4 * 1024 * 1024;

/// An attached file as the model sees it: its line, and its text or image when small enough.
async fn inline_file(
    files: &crate::files::FileStore,
    f: &crate::log::FileRef,
    owner: Option<&str>,
) -> Vec<crate::message::Block> {
    use crate::message::Block;
    use tokio::io::AsyncReadExt;
    let line = super::history::attachment_line(f);
    let textual = f.mime_type.starts_with("text/")
        || matches!(
            f.mime_type.as_str(),
            "application/json" | "application/xml" | "application/x-yaml"
        );
    let image = f.mime_type.starts_with("image/");
    let fits = (textual && f.size_bytes <= INLINE_TEXT_BYTES)
        || (image && f.size_bytes <= INLINE_IMAGE_BYTES);
    if !fits {
        return vec![Block::Text { text: line }];
    }
    let mut bytes = Vec::new();
    let read = async {
        let row = files.get(owner, &f.id).await.ok()?;
        let file = files.open_blob(&row).await.ok()?;
        file.take(f.size_bytes).read_to_end(&mut bytes).await.ok()
    }
    .await;
    if read.is_none() {
        return vec![Block::Text { text: line }];
    }
    if image {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return vec![
            Block::Text { text: line },
            Block::Image {
                url: format!("data:{};base64,{data}", f.mime_type),
            },
        ];
    }
    match String::from_utf8(bytes) {
        Ok(text) => vec![Block::Text {
            text: format!("{line}\n<file name=\"{}\">\n{text}\n</file>", f.filename),
        }],
        Err(_) => vec![Block::Text { text: line }],
    }
}

/// Hand published events to the turn's watcher, if it has one.
fn to_watcher(sink: Option<&super::watch::WatcherSink>, events: Vec<Arc<Event>>) {
    if let Some(sink) = sink {
        for ev in events {
            sink.event(ev);
        }
    }
}

/// Take the next queued turn for the session (with its lock held). Queued turns cancelled
/// while they waited are logged now, `user.message` then `turn.cancelled` with no usage, and
/// never reach the model.
pub(crate) fn next_queued(
    session: &Session,
    st: &mut super::session::State,
    store: &crate::log::Store,
) -> Option<TurnJob> {
    if st.running.is_some() {
        return None;
    }
    while let Some(q) = st.queue.pop_front() {
        if q.control.token.is_cancelled() {
            let turn_id = q.control.turn_id.clone();
            for body in [
                user_message(&q.job.input),
                EventBody::TurnCancelled { usage: None },
            ] {
                session.append_locked(st, store, &turn_id, body);
            }
            // Rare enough to commit here, under the session's lock, so that the events are
            // published in their place.
            if let Err(e) = store.commit() {
                tracing::error!(turn = %turn_id, error = %e, "a cancelled queued turn could not be logged");
            }
            to_watcher(
                q.job.sink.as_ref(),
                session.publish_durable_locked(st, store),
            );
            // `st` is the session's state under its lock: read the agent from it, not through
            // `session.record()` (which takes the lock again).
            crate::metrics::turns(&st.record.agent)
                .ended(crate::metrics::TurnOutcome::Cancelled, None);
            continue;
        }
        st.running = Some(q.control.clone());
        return Some(q.job);
    }
    None
}

/// Runs `call` (a model call) and `sync` (making the turn's events durable) side by side: if
/// `call` has not answered when a commit is `due` (its request went out in its first poll),
/// `sync` runs (committing on this thread) while the other side works, then `call` goes on.
/// `due`: `None` when everything is committed already. Returns whether everything said before
/// the call is now committed and published; if so, the fragments `feed` held back (they may not
/// pass the events before them) have gone to subscribers, and the next go at once.
async fn overlapped<T>(
    call: impl std::future::Future<Output = T>,
    sync: impl std::future::Future<Output = Result<(), End>>,
    due: Option<Duration>,
    feed: &FragmentFeed<'_>,
) -> Result<(T, bool), End> {
    let Some(due) = due else {
        feed.release();
        return Ok((call.await, true));
    };
    let mut call = std::pin::pin!(call);
    if let Ok(out) = tokio::time::timeout(due, call.as_mut()).await {
        return Ok((out, false));
    }
    sync.await?;
    feed.release();
    Ok((call.await, true))
}

/// Forwards a model call's streamed fragments to the turn's watcher and the session's live
/// subscribers.
struct Deltas<'a> {
    sink: Option<&'a super::watch::WatcherSink>,
    /// Set when text is streamed (the turn's [`Turn::streamed`]).
    streamed: &'a std::sync::atomic::AtomicBool,
    feed: &'a FragmentFeed<'a>,
    thinking: bool,
    streamed_text: bool,
    /// The attempt's text, kept when the watcher cannot retract what it was sent.
    kept: Option<String>,
    /// When the attempt's first fragment came.
    first_at: Option<std::time::Instant>,
}

/// A model call's fragments on their way to the session's live subscribers, who may see them
/// only after the turn's earlier events: until those are published, fragments are held back, in
/// order.
struct FragmentFeed<'a> {
    session: &'a Arc<Session>,
    turn_id: &'a Arc<str>,
    flusher: &'a std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The fragments held back; `None` once released (or discarded).
    held: std::sync::Mutex<Option<Vec<(DeltaKind, String)>>>,
}

/// Pushes the session's coalesced deltas when their 50 ms are up, until aborted.
async fn flush_deltas_on_time(session: Arc<Session>) {
    let mut tick = tokio::time::interval(super::session::DELTA_WAIT / 5);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match session.flush_due() {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => {
                tick.tick().await;
            }
        }
    }
}

impl FragmentFeed<'_> {
    fn held(&self) -> std::sync::MutexGuard<'_, Option<Vec<(DeltaKind, String)>>> {
        lock(&self.held)
    }

    fn push(&self, kind: DeltaKind, fragment: &str) {
        if let Some(held) = self.held().as_mut() {
            held.push((kind, fragment.to_string()));
            return;
        }
        self.to_feed(kind, fragment);
    }

    /// The earlier events are out: send the fragments held back, and the next ones at once.
    fn release(&self) {
        for (kind, text) in self.held().take().unwrap_or_default() {
            self.to_feed(kind, &text);
        }
    }

    /// Whether fragments are held back.
    fn holds_any(&self) -> bool {
        self.held().as_ref().is_some_and(|h| !h.is_empty())
    }

    /// Drop the fragments held back: the call is over, and the message they make up follows.
    fn discard(&self) {
        self.held().take();
    }

    /// Into the session's coalescer, for its live subscribers.
    fn to_feed(&self, kind: DeltaKind, fragment: &str) {
        if self.session.push_fragment(self.turn_id, kind, fragment) {
            let mut flusher = lock(self.flusher);
            if flusher.is_none() {
                *flusher = Some(tokio::spawn(flush_deltas_on_time(self.session.clone())));
            }
        }
    }
}

impl Deltas<'_> {
    fn send(&mut self, kind: DeltaKind, fragment: &str) {
        self.first_at.get_or_insert_with(std::time::Instant::now);
        // The watcher gets fragments at once: it renders them only in AAP `delta` mode, which
        // shows no event of the turn before its text (and never retracts, so no retry's
        // fragments can pass a retraction).
        if let Some(sink) = self.sink {
            sink.fragment(kind, fragment);
        }
        self.feed.push(kind, fragment);
    }
}

impl DeltaSink for Deltas<'_> {
    fn text(&mut self, fragment: &str) {
        if !fragment.is_empty() {
            self.streamed_text = true;
            self.streamed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(kept) = self.kept.as_mut() {
                kept.push_str(fragment);
            }
            self.send(DeltaKind::Message, fragment);
        }
    }

    fn thinking(&mut self, fragment: &str) {
        if self.thinking && !fragment.is_empty() {
            self.send(DeltaKind::Thinking, fragment);
        }
    }
}
