//! The event log API (spec 003): send messages, read the history, follow the stream, cancel.
//!
//! Every event goes out as the exact bytes it was stored with. The stream sends `id:`, `event:`
//! and `data:` for stored events, and `event:`/`data:` (no id) for coalesced deltas.

use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::log_follower::Follow;
use crate::engine::{DeltaKind, Feed, TurnInput, TurnOrder};
use crate::http::{body, json_response, query_param, sse, ApiError, Request, Response};
use crate::message::Content;
use crate::protocol::context::{App, Caller};

/// Where a client can attend a turn (run client tools, answer permissions): named in the error
/// result of such a call in a turn started here, which no client attends.
const ATTEND_AT: &str = "POST /sessions/{id}/turns";

/// The spec 003 event type of a delta of this kind.
fn delta_type(kind: DeltaKind) -> &'static str {
    match kind {
        DeltaKind::Message => "agent.message.delta",
        DeltaKind::Thinking => "agent.thinking.delta",
    }
}

/// Events per page of `events/history` by default, and at most.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendMessage {
    content: Content,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    skills: Vec<Value>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Cancel {
    turn_id: Option<String>,
}

/// `POST /sessions/{id}/messages`: queue a turn; `202 {"turn_id"}`. Several instances on one
/// store: queued on the one that runs the session (see `engine/scaleout/`).
pub(crate) async fn send_message(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let limit = app.max_body();
    let msg: SendMessage = body::json(req.into_body(), limit).await?;
    if msg.content.is_empty() {
        return Err(ApiError::bad_request(
            "content is empty: send the message's text or content blocks",
        ));
    }
    for s in &msg.skills {
        if !s.is_object() {
            return Err(ApiError::bad_request(
                "each skill is an object such as {\"id\", \"name\"}",
            ));
        }
    }
    let rows = attachments(app, caller, &msg.files).await?;
    // Attached files are copied into the session's workspace, so tools can use them too.
    let workspace = app.engine.workspace(&session.id);
    let names = app.files.copy_all_into(&rows, &workspace).await?;
    let files: Vec<_> = rows
        .iter()
        .zip(names)
        .map(|(row, name)| {
            let mut f = crate::files::to_ref(row);
            f.filename = name;
            f
        })
        .collect();
    let copied: Vec<std::path::PathBuf> =
        files.iter().map(|f| workspace.join(&f.filename)).collect();
    let input = TurnInput::User {
        content: serde_json::to_value(&msg.content).unwrap_or(Value::Null),
        files,
        skills: msg.skills,
    };
    let order = TurnOrder::unattended(input, ATTEND_AT);
    let started = app.engine.queue_message(&session, order).await;
    let turn_id = match started {
        Ok(h) => h,
        Err(e) => {
            for path in copied {
                let _ = tokio::fs::remove_file(path).await;
            }
            return Err(e.into());
        }
    };
    Ok(json_response(
        StatusCode::ACCEPTED,
        &json!({ "turn_id": turn_id }),
    ))
}

/// The files a message names, each once, all checked before any is copied: a refused message
/// leaves the workspace as it was.
async fn attachments(
    app: &App,
    caller: &Caller,
    named: &[String],
) -> Result<Vec<crate::log::FileRow>, ApiError> {
    // A repeated id is one attachment, copied once.
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<&String> = named.iter().filter(|id| seen.insert(*id)).collect();
    let max = app.engine.config().limits.files_per_message;
    if ids.len() > max {
        return Err(ApiError::bad_request(format!(
            "this message names {} files (limit: [limits] files_per_message in tools.toml, {max}); send fewer, or in several messages",
            ids.len()
        )));
    }
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        let row = app.files.get(caller.owner(), id).await;
        rows.push(row.map_err(|e| match e {
            crate::files::FileError::NotFound(_) => ApiError::not_found(format!(
                "files names {id}, which is not a file of yours: upload it with POST /files first"
            )),
            e => e.into(),
        })?);
    }
    Ok(rows)
}

/// `GET /sessions/{id}/events/history?after=&limit=`.
pub(crate) async fn history(
    app: &App,
    caller: &Caller,
    id: &str,
    req: &Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let limit = match query_param(req, "limit") {
        None => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be a whole number from 1 to {MAX_LIMIT}, not {l:?}"
                )))
            }
        },
    };
    let after = query_param(req, "after").filter(|a| !a.is_empty());
    let (events, more) = app
        .engine
        .events_after(&session, after.as_deref(), limit)
        .await?;
    // The stored bytes, as they are: the same event is byte-identical here and in the stream.
    let mut out =
        String::with_capacity(64 + events.iter().map(|e| e.json.len() + 1).sum::<usize>());
    out.push_str("{\"events\":[");
    for (i, ev) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&ev.json);
    }
    out.push_str("],\"has_more\":");
    out.push_str(if more { "true" } else { "false" });
    out.push('}');
    Ok(crate::http::text_response(
        StatusCode::OK,
        "application/json",
        out,
    ))
}

/// `GET /sessions/{id}/events/stream`: replay after `Last-Event-ID` (or `?after=`), then live.
pub(crate) async fn stream(
    app: &App,
    caller: &Caller,
    id: &str,
    req: &Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    // A header that is no text is no event id either: refused like an unknown one, never read
    // as no cursor (which would replay the whole log).
    let header = match req.headers().get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().map(str::to_string).map_err(|_| {
            ApiError::bad_request(
                "Last-Event-ID holds bytes outside visible ASCII, so it is no event id; send the id of an event you received, or none to start from the beginning",
            )
        })?),
    };
    let cursor = header
        .or_else(|| query_param(req, "after"))
        .filter(|c| !c.is_empty());
    let after_seq = match &cursor {
        Some(c) => app.engine.seq_of(&session, c).await?,
        None => 0,
    };
    let follow = Follow::stream(&app.engine, session, after_seq).await?;
    let events = futures_util::stream::unfold(follow, |mut follow| async move {
        loop {
            let wire = match follow.next().await? {
                Feed::Event(ev) => sse::format_event(ev.body.type_name(), &ev.json, Some(&ev.id)),
                Feed::Delta {
                    turn_id,
                    kind,
                    text,
                } => {
                    let data =
                        json!({"type": delta_type(kind), "turn_id": &*turn_id, "content": &*text});
                    sse::format_event(delta_type(kind), &data.to_string(), None)
                }
                Feed::Fragment { .. } => continue,
            };
            return Some((wire, follow));
        }
    });
    Ok(sse::response(events, &app.streams))
}

/// `POST /sessions/{id}/cancel` (`{"turn_id"}` optional): `200 {"cancelled": [turn ids]}`.
pub(crate) async fn cancel(
    app: &App,
    caller: &Caller,
    id: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let session = app.engine.session(caller.reach(), id).await?;
    let limit = app.max_body();
    let c: Cancel = body::json(req.into_body(), limit).await?;
    let cancelled = app.engine.cancel(&session, c.turn_id.as_deref()).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "cancelled": cancelled }),
    ))
}
