//! AAP v3 sessions: `/meta`, creating, listing, reading and deleting sessions, and their
//! history.

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::{json, Value};

use super::request::{self, VERSION};
use crate::config::{AgentConfig, Verdict};
use crate::engine::{AgentChoice, NewSession, SessionView};
use crate::http::{body, json_response, query_param, ApiError, Request, Response};
use crate::message::{Block, Content, Message};
use crate::protocol::context::{App, Caller};

/// `GET /meta`: the agents the caller's principal may use, each with its tools as narrowed
/// for it (`[keys.NAME] agents` and `tools`).
pub(crate) fn meta(app: &App, caller: &Caller) -> Response {
    let config = app.engine.config();
    let scope = caller.scope();
    let agents: Vec<Value> = config
        .agents
        .iter()
        .filter(|a| scope.may_use(&a.name))
        .map(|a| agent_info(app, &a.narrowed(&scope)))
        .collect();
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
        let config = app.engine.config();
        let upstream_model = config.default_model(agent);
        let default = if agent.models.iter().any(|m| m == upstream_model) {
            upstream_model.to_string()
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
    // Its tools as its owner's principal sees them (an admin may be reading another's).
    let (tools, options) = match config.agent(&record.agent) {
        Some(agent) => {
            let agent = &*agent.narrowed(&config.scope_of(view.owner.as_deref()));
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

/// `POST /sessions`.
pub(crate) async fn create(app: &App, caller: &Caller, req: Request) -> Result<Response, ApiError> {
    let body: request::CreateSession = body::json(req.into_body(), app.max_body()).await?;
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
            caller.owned(),
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

pub(super) fn check_user_blocks(blocks: &[Block]) -> Result<(), ApiError> {
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
pub(crate) async fn list(app: &App, caller: &Caller, req: &Request) -> Result<Response, ApiError> {
    let after = query_param(req, "after");
    let (views, next) = app
        .engine
        .list_sessions(caller.reach(), after.as_deref())
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
pub(crate) async fn get(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    let session = app.engine.session_now(caller.reach(), id).await?;
    let view = app.engine.view_now(&session).await;
    Ok(json_response(StatusCode::OK, &session_info(app, &view)))
}

/// `DELETE /sessions/{id}`.
pub(crate) async fn delete(app: &App, caller: &Caller, id: &str) -> Result<Response, ApiError> {
    app.engine.delete_session(caller.reach(), id).await?;
    Ok(crate::http::empty_response(StatusCode::NO_CONTENT))
}

/// `GET /sessions/{id}/history?type=full|compacted`.
pub(crate) async fn history(
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
    let session = app.engine.session_now(caller.reach(), id).await?;
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
