//! AAP v3: `/meta`, sessions, history and turns (spec 000 and the AAP endpoint pages).

pub mod idempotency;
pub mod render;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::config::{AgentConfig, Verdict};
use crate::engine::{
    AgentChoice, ClientResult, EngineError, Feed, NewSession, Permission, Runner, SessionUpdate,
    SessionView, ShownText, TurnHandle, TurnInput, TurnOrder,
};
use crate::http::routes::{App, Caller};
use crate::http::{body, json_response, query_param, sse, ApiError, Request, Response};
use crate::message::{Block, Content, Message};
use render::TurnRenderer;
use wire::StreamMode;

/// The AAP protocol version served.
pub const VERSION: u32 = 3;

/// `GET /meta`.
pub fn meta(app: &App) -> Response {
    let config = app.engine.config();
    let agents: Vec<Value> = config.agents.iter().map(|a| agent_info(app, a)).collect();
    json_response(
        StatusCode::OK,
        &json!({"version": VERSION, "agents": agents}),
    )
}

fn agent_info(app: &App, agent: &AgentConfig) -> Value {
    let tools: Vec<Value> = app
        .engine
        .exposed_tools(agent)
        .into_iter()
        .map(|t| serde_json::to_value(&t.spec).unwrap_or(Value::Null))
        .collect();
    let mut info = json!({
        "name": agent.name,
        "title": agent.title.clone().unwrap_or_else(|| agent.name.clone()),
        "version": agent.version,
        "tools": tools,
        "options": agent_options(app, agent),
        "capabilities": {
            "history": {"full": {}, "compacted": {}},
            "stream": {"delta": {}, "message": {}, "none": {}},
            "application": {"tools": {}},
            "image": {"http": {}, "data": {}}
        }
    });
    if let Some(d) = &agent.description {
        info["description"] = json!(d);
    }
    info
}

fn agent_options(app: &App, agent: &AgentConfig) -> Vec<Value> {
    let mut options = vec![json!({
        "name": "thinking",
        "title": "Thinking",
        "description": "Whether the model's reasoning is requested and shown (\"on\" or \"off\").",
        "type": "select",
        "options": ["on", "off"],
        "default": if agent.thinking { "on" } else { "off" },
    })];
    if !agent.models.is_empty() {
        let upstream_model = &app.engine.config().upstream.model;
        let default = if agent.models.contains(upstream_model) {
            upstream_model.clone()
        } else {
            agent.models[0].clone()
        };
        options.push(json!({
            "name": "model",
            "title": "Model",
            "description": "The upstream model this agent uses.",
            "type": "select",
            "options": agent.models,
            "default": default,
        }));
    }
    options
}

/// The effective options of a session: the agent's defaults with the session's values over them.
fn effective_options(app: &App, agent: &AgentConfig, set: &BTreeMap<String, String>) -> Value {
    let mut out = serde_json::Map::new();
    for opt in agent_options(app, agent) {
        if let (Some(name), Some(default)) = (opt["name"].as_str(), opt["default"].as_str()) {
            let v = set
                .get(name)
                .cloned()
                .unwrap_or_else(|| default.to_string());
            out.insert(name.to_string(), Value::String(v));
        }
    }
    Value::Object(out)
}

/// AAP `SessionInfo` plus `status`, the pending calls and the running turn.
fn session_info(app: &App, view: &SessionView) -> Value {
    let config = app.engine.config();
    let record = &view.record;
    let (tools, options) = match config.agent(&record.agent) {
        Some(agent) => {
            let tools: Vec<Value> = match &record.tools {
                Some(grants) => grants
                    .iter()
                    .map(|g| json!({"name": g.name, "trust": g.trust}))
                    .collect(),
                None => app
                    .engine
                    .exposed_tools(agent)
                    .iter()
                    .map(|t| json!({"name": t.spec.name, "trust": t.verdict == Verdict::Trust}))
                    .collect(),
            };
            (tools, effective_options(app, agent, &record.options))
        }
        None => (vec![], json!(record.options)),
    };
    let mut info = json!({
        "sessionId": view.id,
        "id": view.id,
        "created_at": view.created_at,
        "agent": {"name": record.agent, "tools": tools, "options": options},
        "tools": record.client_tools,
        "status": view.status,
        "pending": view.pending,
    });
    if let Some(turn) = &view.running_turn {
        info["turn_id"] = json!(turn);
    }
    if !view.queued.is_empty() {
        info["queued"] = json!(view.queued);
    }
    if let Some(plan) = &view.pending_plan {
        info["pending_plan"] = json!(plan);
    }
    info
}

fn limit(app: &App) -> u64 {
    app.engine.config().server.max_body_bytes
}

/// `POST /sessions`.
pub async fn create_session(
    app: &App,
    caller: &Caller,
    req: Request,
) -> Result<Response, ApiError> {
    let body: wire::CreateSession = body::json(req.into_body(), limit(app)).await?;
    let agent = match body.agent {
        None => None,
        Some(a) => Some(AgentChoice {
            name: a.name.ok_or_else(|| {
                ApiError::bad_request("agent.name is required: name one of the agents GET /meta lists (or omit agent for the default)")
            })?,
            tools: a.tools,
            options: a.options.unwrap_or_default(),
        }),
    };
    for m in &body.messages {
        check_seed(m)?;
    }
    let view = app
        .engine
        .create_session(
            caller.owner.clone(),
            NewSession {
                agent,
                seed: body.messages,
                client_tools: body.tools,
            },
        )
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"sessionId": view.id, "id": view.id, "created_at": view.created_at}),
    ))
}

fn check_seed(m: &Message) -> Result<(), ApiError> {
    if let Message::User {
        content: Content::Blocks(blocks),
    } = m
    {
        check_user_blocks(blocks)?;
    }
    Ok(())
}

fn check_user_blocks(blocks: &[Block]) -> Result<(), ApiError> {
    for b in blocks {
        match b {
            Block::Text { .. } => {}
            Block::Image { url } => {
                if !(url.starts_with("https://")
                    || url.starts_with("http://")
                    || url.starts_with("data:"))
                {
                    return Err(ApiError::bad_request(format!(
                        "an image block's url must be an https:// URL or a data: URI, not {:?}",
                        url.chars().take(40).collect::<String>()
                    )));
                }
            }
            Block::Thinking { .. } | Block::ToolUse { .. } => {
                return Err(ApiError::bad_request(
                    "a user message may hold only text and image blocks",
                ))
            }
        }
    }
    Ok(())
}

/// `GET /sessions?after=`.
pub async fn list_sessions(
    app: &App,
    caller: &Caller,
    req: &Request,
) -> Result<Response, ApiError> {
    let after = query_param(req, "after");
    let (views, next) = app
        .engine
        .list_sessions(caller.owner.as_deref(), after.as_deref())
        .await?;
    // The pending calls are read from a session's log: GET /sessions/{id} shows them.
    let sessions: Vec<Value> = views
        .iter()
        .map(|v| {
            let mut info = session_info(app, v);
            if let Some(info) = info.as_object_mut() {
                info.remove("pending");
            }
            info
        })
        .collect();
    let mut out = json!({ "sessions": sessions });
    if let Some(next) = next {
        out["next"] = json!(next);
    }
    Ok(json_response(StatusCode::OK, &out))
}

/// `GET /sessions/{id}`.
pub async fn get_session(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.owner.as_deref(), id).await?;
    let view = app.engine.view(&session);
    Ok(json_response(StatusCode::OK, &session_info(app, &view)))
}

/// `DELETE /sessions/{id}`.
pub async fn delete_session(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    app.engine
        .delete_session(caller.owner.as_deref(), id)
        .await?;
    Ok(crate::http::empty_response(StatusCode::NO_CONTENT))
}

/// `GET /sessions/{id}/history?type=full|compacted`.
pub async fn history(
    app: &App,
    caller: &Caller,
    id: &str,
    req: &Request,
) -> Result<Response, ApiError> {
    let kind = match query_param(req, "type").as_deref() {
        Some("full") => "full",
        Some("compacted") => "compacted",
        // AAP: a history type the agent does not declare in its capabilities is not found.
        Some(other) => {
            return Err(ApiError::not_found(format!(
                "no history of type {other:?}: the capabilities declare \"full\" and \"compacted\""
            )))
        }
        None => {
            return Err(ApiError::bad_request(
                "the query parameter type is required: ?type=full or ?type=compacted",
            ))
        }
    };
    let session = app.engine.session(caller.owner.as_deref(), id).await?;
    // `compacted` is what the model is sent next: the last compaction's summary, then the
    // messages after it (the full history until a session first compacts).
    let messages = match kind {
        "compacted" => session.compacted_history(),
        _ => session.history(),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"history": { kind: messages }}),
    ))
}

/// Translate a turn request's messages into the engine's input.
fn turn_input(messages: Vec<wire::TurnMessage>) -> Result<TurnInput, ApiError> {
    use wire::TurnMessage as M;
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages is empty: send one user message, or the tool results and permissions the last turn stopped for",
        ));
    }
    let users = messages
        .iter()
        .filter(|m| matches!(m, M::User { .. }))
        .count();
    if users > 0 && users != messages.len() {
        return Err(ApiError::bad_request(
            "a turn carries either one user message or tool results and permissions, not both",
        ));
    }
    if users > 1 {
        return Err(ApiError::bad_request("send one user message per turn"));
    }
    let mut results = Vec::new();
    let mut permissions = Vec::new();
    for m in messages {
        match m {
            M::User { content } => {
                if let Content::Blocks(blocks) = &content {
                    check_user_blocks(blocks)?;
                }
                if content.is_empty() {
                    return Err(ApiError::bad_request("the user message is empty"));
                }
                return Ok(TurnInput::User {
                    content: serde_json::to_value(&content).unwrap_or(Value::Null),
                    files: vec![],
                    skills: vec![],
                });
            }
            M::Tool {
                tool_call_id,
                content,
                is_error,
            } => results.push(ClientResult {
                call_id: tool_call_id,
                content: serde_json::to_value(&content).unwrap_or(Value::Null),
                is_error,
            }),
            M::ToolPermission {
                tool_call_id,
                granted,
                reason,
            } => permissions.push(Permission {
                call_id: tool_call_id,
                granted,
                reason,
            }),
            M::System { .. } | M::Assistant { .. } => {
                return Err(ApiError::bad_request(
                    "a turn may carry only user, tool and tool_permission messages; seed system and assistant messages with POST /sessions",
                ))
            }
        }
    }
    Ok(TurnInput::Resume {
        results,
        permissions,
    })
}

/// `POST /sessions/{id}/turns`.
pub async fn turns(
    app: Arc<App>,
    caller: Caller,
    id: String,
    req: Request,
) -> Result<Response, ApiError> {
    let (reply, response) = oneshot::channel();
    let task = async move { turn_task(&app, &caller, &id, req, reply).await };
    tokio::spawn(tracing::Instrument::in_current_span(task));
    response.await.unwrap_or_else(|_| {
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "the turn's task ended before it answered; see the server log",
        ))
    })
}

/// A turn request, read and its turn started on a task of its own; the response handed to the
/// connection through `reply`. Read on the connection's own task, the request body would wake
/// that task as it is taken (hyper's body channel), and that task's reschedule would wake the
/// other worker: ~12 µs a turn on 2 cores.
///
/// A `none` turn runs here to its end (and on to it if the client goes away). A streamed turn
/// goes to the connection with its response: the SSE body runs it as the connection polls it
/// for frames, so that what the upstream sends is read, rendered and written out in one poll of
/// one task, with no hand-off between tasks per delta. A client that goes away drops the body,
/// or one that stops reading stops the polling, and the turn runs on by itself (see
/// [`TurnHandle`]).
async fn turn_task(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
    reply: oneshot::Sender<Result<Response, ApiError>>,
) {
    let (mut handle, mode) = match start_turn(app, caller, id, req).await {
        Ok(Started::Turn(handle, mode)) => (handle, mode),
        Ok(Started::Replayed(resp)) => {
            let _ = reply.send(Ok(resp));
            return;
        }
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    let mut renderer = TurnRenderer::default();
    if mode != StreamMode::None {
        let frames = turn_frames(handle, renderer, mode);
        let _ = reply.send(Ok(sse::response(frames, &app.streams)));
        return;
    }
    let mut reply = Some(reply);
    while let Some(item) = handle.recv().await {
        if let Some(resp) = renderer.collect(&item) {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Ok(json_response(StatusCode::OK, &resp)));
            }
        }
    }
    if let Some(reply) = reply {
        let _ = reply.send(Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!(
                "turn {} ended with nothing in the event log: it could not be written (a full disk?) or the session was deleted; see the server log",
                handle.turn_id
            ),
        )));
    }
}

/// A streamed turn's SSE frames, the turn run as they are asked for: `turn_start`, then its
/// events rendered for `mode`, ending with its terminal event.
fn turn_frames(
    handle: TurnHandle,
    renderer: TurnRenderer,
    mode: StreamMode,
) -> impl Stream<Item = bytes::Bytes> + Send + 'static {
    let start = sse::format_event("turn_start", "{}", None);
    let rest = futures_util::stream::unfold(Some((handle, renderer)), move |state| async move {
        let (mut handle, mut renderer) = state?;
        loop {
            let item = handle.recv().await?;
            renderer.fragments_lost = handle.fragments_lost();
            let terminal = matches!(&item, Feed::Event(ev) if ev.body.is_terminal());
            let frame = renderer
                .sse(mode, &item)
                .map(|(name, data)| sse::format_event(name, &data, None));
            match (frame, terminal) {
                // The stream ends with the turn's terminal event.
                (Some(frame), true) => return Some((frame, None)),
                (None, true) => return None,
                (Some(frame), false) => return Some((frame, Some((handle, renderer)))),
                (None, false) => {}
            }
        }
    });
    futures_util::stream::once(std::future::ready(start)).chain(rest)
}

/// A turn request's outcome: a turn started, or (a repeat of an `Idempotency-Key`) the first
/// request's response again.
enum Started {
    Turn(TurnHandle, StreamMode),
    Replayed(Response),
}

/// Parse a turn request and start its turn, for its task to run; or, for a repeat of a keyed
/// request, replay the first one's turn (see `idempotency.rs`).
async fn start_turn(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Started, ApiError> {
    let session = app.engine.session(caller.owner.as_deref(), id).await?;
    let key = idempotency::key_of(req.headers())?;
    let bytes = body::read_limited(req.into_body(), limit(app)).await?;
    let body: wire::TurnRequest = body::parse_json(&bytes)?;
    let mode = body.stream;
    let mut ticket = None;
    if let Some(key) = key {
        let keys = session.extension::<idempotency::Keys>();
        let fingerprint = idempotency::fingerprint(&bytes);
        loop {
            match keys.claim(&key, &fingerprint)? {
                idempotency::Claim::First(t) => {
                    ticket = Some(t);
                    break;
                }
                idempotency::Claim::Repeat(rx) => {
                    // The first was refused before it started a turn: this one goes on afresh.
                    let Some((turn_id, after_seq)) = idempotency::wait_started(rx).await else {
                        continue;
                    };
                    let resp = replay(app, &session, &turn_id, after_seq, mode).await?;
                    return Ok(Started::Replayed(resp));
                }
            }
        }
    }
    let mut update = SessionUpdate {
        client_tools: body.tools,
        ..SessionUpdate::default()
    };
    if let Some(agent) = body.agent {
        let current = session.record().agent.clone();
        if agent.name.as_ref().is_some_and(|n| *n != current) {
            return Err(ApiError::bad_request(format!(
                "agent.name cannot change after the session is created (it is {current:?}); create another session for another agent"
            )));
        }
        update.tools = agent.tools;
        update.options = agent.options;
    }
    let input = turn_input(body.messages)?;
    let mut req = TurnOrder::attended(input, update);
    // Delta mode shows text as it streams and the AAP wire cannot take it back.
    if body.stream == StreamMode::Delta {
        req.delivery.text = ShownText::Irrevocable;
    }
    req.delivery.runner = Runner::Watcher;
    let after_seq = session.tail().last().map_or(0, |e| e.seq);
    let handle = app.engine.start_turn(&session, req)?;
    if let Some(ticket) = ticket {
        ticket.started(&handle.turn_id, after_seq);
    }
    Ok(Started::Turn(handle, mode))
}

/// The response of the keyed request that started `turn_id`, rendered again from the log (what
/// it was rendered from the first time). A `none` repeat waits for the turn to end; a streamed
/// one of a turn still running is a 409 naming it.
async fn replay(
    app: &App,
    session: &Arc<crate::engine::Session>,
    turn_id: &str,
    after_seq: u64,
    mode: StreamMode,
) -> Result<Response, ApiError> {
    let ended =
        |events: &[Arc<crate::log::Event>]| events.last().is_some_and(|e| e.body.is_terminal());
    let mut events = turn_events(app, session, turn_id, after_seq).await?;
    if !ended(&events) {
        if mode != StreamMode::None {
            return Err(idempotency::in_progress(turn_id));
        }
        // Subscribed before the log is read again, so that its end cannot fall between.
        let (_, mut rx) = session.subscribe();
        loop {
            events = turn_events(app, session, turn_id, after_seq).await?;
            if ended(&events) {
                break;
            }
            if !next_end(&mut rx, turn_id).await {
                return Err(EngineError::NotFound {
                    what: "session",
                    id: session.id.to_string(),
                }
                .into());
            }
        }
    }
    let mut renderer = TurnRenderer::default();
    if mode == StreamMode::None {
        for ev in events {
            if let Some(resp) = renderer.collect(&Feed::Event(ev)) {
                return Ok(json_response(StatusCode::OK, &resp));
            }
        }
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("turn {turn_id} has no end in the event log; see the server log"),
        ));
    }
    let mut frames = vec![sse::format_event("turn_start", "{}", None)];
    for ev in events {
        // Deltas are not stored: in `delta` mode each text goes out as one delta.
        let text = match &ev.body {
            crate::log::EventBody::AgentMessage {
                content,
                compaction: false,
                ..
            } if !content.is_empty() => Some((crate::engine::DeltaKind::Message, content.clone())),
            crate::log::EventBody::AgentThinking { content, .. } => {
                Some((crate::engine::DeltaKind::Thinking, content.clone()))
            }
            _ => None,
        };
        if let (Some((kind, text)), StreamMode::Delta) = (text, mode) {
            let item = Feed::Fragment { kind, text };
            if let Some((name, data)) = renderer.sse(mode, &item) {
                frames.push(sse::format_event(name, &data, None));
            }
        }
        if let Some((name, data)) = renderer.sse(mode, &Feed::Event(ev)) {
            frames.push(sse::format_event(name, &data, None));
        }
    }
    Ok(sse::response(
        futures_util::stream::iter(frames),
        &app.streams,
    ))
}

/// The events of `turn_id` so far (it starts after `after_seq`), up to its terminal event.
async fn turn_events(
    app: &App,
    session: &crate::engine::Session,
    turn_id: &str,
    mut after_seq: u64,
) -> Result<Vec<Arc<crate::log::Event>>, ApiError> {
    const PAGE: usize = 1000;
    let mut out = Vec::new();
    loop {
        let (page, more) = app
            .engine
            .events_after_seq(session, after_seq, PAGE)
            .await?;
        after_seq = page.last().map_or(after_seq, |e| e.seq);
        for ev in page.into_iter().filter(|e| e.turn_id == turn_id) {
            let end = ev.body.is_terminal();
            out.push(ev);
            if end {
                return Ok(out);
            }
        }
        if !more {
            return Ok(out);
        }
    }
}

/// Waits for the end of `turn_id` on a session's feed: `true` when it may have ended (its
/// terminal event, or items were missed), `false` when the feed closed (the session is gone).
async fn next_end(rx: &mut tokio::sync::broadcast::Receiver<Feed>, turn_id: &str) -> bool {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(Feed::Event(ev)) if ev.turn_id == turn_id && ev.body.is_terminal() => return true,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return true,
            Err(RecvError::Closed) => return false,
        }
    }
}
