//! AAP v3 (spec 000 and the AAP endpoint pages): turns here; `/meta`, sessions and history in
//! [`sessions`].

pub(crate) mod idempotency;
pub(crate) mod render;
pub(crate) mod request;
pub(crate) mod sessions;

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use http::StatusCode;
use serde_json::Value;

use crate::engine::{
    ClientResult, EngineError, Feed, Permission, Runner, SessionUpdate, ShownText, TurnHandle,
    TurnInput, TurnOrder,
};
use crate::http::detached::{detached, Reply};
use crate::http::{body, json_response, sse, ApiError, Request, Response};
use crate::message::Content;
use crate::protocol::context::{App, Caller};
use render::TurnRenderer;
use request::StreamMode;

/// Translate a turn request's messages into the engine's input.
fn turn_input(messages: Vec<request::TurnMessage>) -> Result<TurnInput, ApiError> {
    use request::TurnMessage as M;
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
                    sessions::check_user_blocks(blocks)?;
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
pub(crate) async fn turns(
    app: Arc<App>,
    caller: Caller,
    id: String,
    req: Request,
) -> Result<Response, ApiError> {
    detached("the turn", move |reply| async move {
        turn_task(&app, &caller, &id, req, reply).await
    })
    .await
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
async fn turn_task(app: &App, caller: &Caller, id: &str, req: Request, reply: Reply) {
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
        // The stream's first byte says the turn is accepted: not before its start is durable
        // (nothing of it is shown before that anyway, so the first delta waits no longer).
        if let Err(e) = handle.accepted().await {
            let _ = reply.send(Err(e.into()));
            return;
        }
        let frames = turn_frames(handle, renderer, mode);
        let _ = reply.send(Ok(sse::response(frames, &app.streams)));
        return;
    }
    let mut reply = Some(reply);
    let mut began = false;
    while let Some(item) = handle.recv().await {
        began |= matches!(item, Feed::Event(_));
        if let Some(resp) = renderer.collect(&item) {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Ok(json_response(StatusCode::OK, &resp)));
            }
        }
    }
    let Some(reply) = reply else { return };
    // A turn that began (its start is durable) may have run tools: no `Retry-After` that
    // would invite the same turn again.
    let error = if began {
        ApiError::internal(format!(
            "turn {} began (and may have run tools) but its end could not be written to the event log: the store is unavailable (a full disk, an I/O error, the database down); it is closed in the log once the store is back: read GET /sessions/{id}/events/history before sending it again",
            handle.turn_id
        ))
    } else {
        ApiError::store_unavailable(format!(
            "turn {} could not be written to the event log: the store is unavailable (a full disk, an I/O error, the database down) or the session was deleted; see the server log",
            handle.turn_id
        ))
    };
    let _ = reply.send(Err(error));
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
    let session = app.engine.session(caller.reach(), id).await?;
    let key = idempotency::key_of(req.headers())?;
    let bytes = body::read_limited(req.into_body(), app.max_body()).await?;
    let body: request::StartTurn = body::parse_json(&bytes)?;
    let mode = body.stream;
    let mut ticket = None;
    if let Some(key) = key {
        let keys = session.extension::<idempotency::Keys>();
        let fingerprint = idempotency::fingerprint(&bytes);
        let store = app.engine.store();
        match idempotency::claim(&keys, store, &session.id, &key, &fingerprint).await? {
            idempotency::Keyed::First(t) => ticket = Some(t),
            idempotency::Keyed::Replay(turn_id, after_seq) => {
                let resp = replay(app, &session, &turn_id, after_seq, mode).await?;
                return Ok(Started::Replayed(resp));
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
    let handle = app.engine.start_turn(&session, req).await?;
    // Before the turn runs (its watcher polls the handle): the key's row is queued before the
    // turn's first event, so no commit holds that event without it.
    if let Some(ticket) = ticket {
        ticket.started(&handle.turn_id, handle.after_seq);
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
        return Err(ApiError::internal(format!(
            "turn {turn_id} has no end in the event log; see the server log"
        )));
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
