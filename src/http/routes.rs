//! The route table: every path the server answers, in one list, apart from how the server is
//! assembled. Routes are public only when listed as such here.

use std::sync::Arc;

use http::{Method, StatusCode};
use tracing::Instrument;

use super::auth::Keys;
use super::{json_response, text_response, ApiError, Request, Response};
use crate::engine::Engine;
use crate::protocol::{aap, events, files, operator, runs};

/// What a handler gets: the engine, the keys and the caller's identity.
pub struct App {
    pub engine: Engine,
    pub keys: Keys,
    /// Whether `GET /meta` is served without a key.
    pub public_meta: bool,
    /// Cancelled at shutdown, after running turns have ended: ends every open event stream.
    pub streams: tokio_util::sync::CancellationToken,
    pub files: crate::files::FileStore,
    /// `/mcp` (`[mcp_endpoint]`).
    pub mcp: crate::protocol::mcp_endpoint::Endpoint,
}

/// Who is calling: the owner id of their key (`None` without keys).
#[derive(Debug, Clone)]
pub struct Caller {
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Healthz,
    Readyz,
    Status,
    Metrics,
    Meta,
    ListSessions,
    CreateSession,
    GetSession(String),
    DeleteSession(String),
    History(String),
    Turns(String),
    Tools,
    Messages(String),
    EventHistory(String),
    EventStream(String),
    Cancel(String),
    Run,
    SessionRun(String),
    RunEvents(String),
    PlanConfirm(String),
    PlanReject(String),
    Interrupt(String),
    Upload,
    File(String),
    DeleteFile(String),
    FileContent(String),
    /// `/mcp` (`None`) or `/mcp/<agent>`.
    Mcp(Option<String>),
}

impl Route {
    /// Routes that answer without a key.
    fn is_public(&self, app: &App) -> bool {
        match self {
            Route::Healthz | Route::Readyz => true,
            Route::Meta => app.public_meta,
            // Off, it is a 404 to everyone.
            Route::Mcp(_) => !app.mcp.enabled(),
            _ => false,
        }
    }

    /// The route's path with its ids as `{id}`: what logs and traces name a request by (one
    /// value per route, not per id).
    pub fn template(&self) -> &'static str {
        match self {
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Status => "/status",
            Route::Metrics => "/metrics",
            Route::Meta => "/meta",
            Route::ListSessions | Route::CreateSession => "/sessions",
            Route::GetSession(_) | Route::DeleteSession(_) => "/sessions/{id}",
            Route::History(_) => "/sessions/{id}/history",
            Route::Turns(_) => "/sessions/{id}/turns",
            Route::Tools => "/tools",
            Route::Messages(_) => "/sessions/{id}/messages",
            Route::EventHistory(_) => "/sessions/{id}/events/history",
            Route::EventStream(_) => "/sessions/{id}/events/stream",
            Route::Cancel(_) => "/sessions/{id}/cancel",
            Route::Run => "/run",
            Route::SessionRun(_) => "/sessions/{id}/run",
            Route::RunEvents(_) => "/sessions/{id}/events",
            Route::PlanConfirm(_) => "/sessions/{id}/plan/confirm",
            Route::PlanReject(_) => "/sessions/{id}/plan/reject",
            Route::Interrupt(_) => "/sessions/{id}/interrupt",
            Route::Upload => "/files",
            Route::File(_) | Route::DeleteFile(_) => "/files/{id}",
            Route::FileContent(_) => "/files/{id}/content",
            Route::Mcp(_) => "/mcp",
        }
    }

    /// The session the path names, if it names one.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Route::GetSession(id)
            | Route::DeleteSession(id)
            | Route::History(id)
            | Route::Turns(id)
            | Route::Messages(id)
            | Route::EventHistory(id)
            | Route::EventStream(id)
            | Route::Cancel(id)
            | Route::SessionRun(id)
            | Route::RunEvents(id)
            | Route::PlanConfirm(id)
            | Route::PlanReject(id)
            | Route::Interrupt(id) => Some(id),
            _ => None,
        }
    }
}

/// Map a method and path to a route: 404 for an unknown path, 405 for a known path with
/// another method.
pub fn resolve(method: &Method, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let m = method.clone();
    let (route, allowed): (Option<Route>, &'static str) = match segs.as_slice() {
        ["healthz"] => (
            matches!(m, Method::GET | Method::HEAD).then_some(Route::Healthz),
            "GET",
        ),
        ["readyz"] => (
            matches!(m, Method::GET | Method::HEAD).then_some(Route::Readyz),
            "GET",
        ),
        ["status"] => ((m == Method::GET).then_some(Route::Status), "GET"),
        ["metrics"] => ((m == Method::GET).then_some(Route::Metrics), "GET"),
        ["meta"] => ((m == Method::GET).then_some(Route::Meta), "GET"),
        ["tools"] => ((m == Method::GET).then_some(Route::Tools), "GET"),
        ["sessions"] => (
            match m {
                Method::GET => Some(Route::ListSessions),
                Method::POST => Some(Route::CreateSession),
                _ => None,
            },
            "GET, POST",
        ),
        ["sessions", id] => (
            match m {
                Method::GET => Some(Route::GetSession(id.to_string())),
                Method::DELETE => Some(Route::DeleteSession(id.to_string())),
                _ => None,
            },
            "GET, DELETE",
        ),
        ["sessions", id, "history"] => (
            (m == Method::GET).then(|| Route::History(id.to_string())),
            "GET",
        ),
        ["sessions", id, "turns"] => (
            (m == Method::POST).then(|| Route::Turns(id.to_string())),
            "POST",
        ),
        ["sessions", id, "messages"] => (
            (m == Method::POST).then(|| Route::Messages(id.to_string())),
            "POST",
        ),
        ["sessions", id, "events", "history"] => (
            (m == Method::GET).then(|| Route::EventHistory(id.to_string())),
            "GET",
        ),
        ["sessions", id, "events", "stream"] => (
            (m == Method::GET).then(|| Route::EventStream(id.to_string())),
            "GET",
        ),
        ["sessions", id, "events"] => (
            (m == Method::GET).then(|| Route::RunEvents(id.to_string())),
            "GET",
        ),
        ["sessions", id, "cancel"] => (
            (m == Method::POST).then(|| Route::Cancel(id.to_string())),
            "POST",
        ),
        ["sessions", id, "run"] => (
            (m == Method::POST).then(|| Route::SessionRun(id.to_string())),
            "POST",
        ),
        ["sessions", id, "plan", "confirm"] => (
            (m == Method::POST).then(|| Route::PlanConfirm(id.to_string())),
            "POST",
        ),
        ["sessions", id, "plan", "reject"] => (
            (m == Method::POST).then(|| Route::PlanReject(id.to_string())),
            "POST",
        ),
        ["sessions", id, "interrupt"] => (
            (m == Method::POST).then(|| Route::Interrupt(id.to_string())),
            "POST",
        ),
        ["run"] => ((m == Method::POST).then_some(Route::Run), "POST"),
        ["files"] => ((m == Method::POST).then_some(Route::Upload), "POST"),
        ["files", id] => (
            match m {
                Method::GET => Some(Route::File(id.to_string())),
                Method::DELETE => Some(Route::DeleteFile(id.to_string())),
                _ => None,
            },
            "GET, DELETE",
        ),
        ["files", id, "content"] => (
            (m == Method::GET).then(|| Route::FileContent(id.to_string())),
            "GET",
        ),
        ["mcp"] | ["mcp", _] => (
            matches!(m, Method::GET | Method::POST | Method::DELETE)
                .then(|| Route::Mcp(segs.get(1).map(|s| s.to_string()))),
            "GET, POST, DELETE",
        ),
        _ => {
            return Err(ApiError::not_found(format!(
                "no route {method} {path}; see the README for the API"
            )))
        }
    };
    route.ok_or_else(|| ApiError {
        extra: Some(serde_json::json!({ "allow": allowed })),
        ..ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}; allowed: {allowed}"),
        )
    })
}

/// Serve one request, in a span of its own (see [`crate::telemetry::request_span`]) that ends
/// with one log line.
pub async fn handle(app: Arc<App>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let route = resolve(&method, req.uri().path());
    let (template, session) = match &route {
        Ok(r) => (r.template(), r.session_id()),
        Err(_) => ("(no route)", None),
    };
    let span = crate::telemetry::request_span(method.as_str(), template, session);
    let quiet = matches!(route, Ok(Route::Healthz | Route::Readyz | Route::Metrics));
    let result = async {
        let route = route?;
        let caller = Caller {
            owner: if route.is_public(&app) {
                None
            } else {
                app.keys.owner(&req)?
            },
        };
        let (limit, key, kind) = body_limit(&app, &route);
        super::body::check_declared_length(req.headers(), limit, key, kind)?;
        dispatch(&app, route, caller, req).await
    }
    .instrument(span.clone())
    .await;
    let resp = result.unwrap_or_else(ApiError::into_response);
    crate::telemetry::request_done(&span, quiet, resp.status().as_u16(), started.elapsed());
    resp
}

/// The largest body a route takes, the config key that sets it and the error type past it.
fn body_limit(app: &App, route: &Route) -> (u64, &'static str, &'static str) {
    match route {
        Route::Upload => (app.files.max_bytes, "[files] max_bytes", "file_too_large"),
        _ => (
            app.engine.config().server.max_body_bytes,
            "[server] max_body_bytes",
            "body_too_large",
        ),
    }
}

async fn dispatch(
    app: &Arc<App>,
    route: Route,
    caller: Caller,
    req: Request,
) -> Result<Response, ApiError> {
    match route {
        Route::Healthz => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok"}),
        )),
        Route::Readyz => operator::readyz(app).await,
        Route::Status => operator::status(app).await,
        Route::Metrics => Ok(text_response(
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            crate::metrics::render(&app.engine),
        )),
        Route::Meta => Ok(aap::meta(app)),
        Route::Tools => Ok(operator::tools(app)),
        Route::ListSessions => aap::list_sessions(app, &caller, &req).await,
        Route::CreateSession => aap::create_session(app, &caller, req).await,
        Route::GetSession(id) => aap::get_session(app, &caller, &id).await,
        Route::DeleteSession(id) => aap::delete_session(app, &caller, &id).await,
        Route::History(id) => aap::history(app, &caller, &id, &req).await,
        Route::Turns(id) => aap::turns(app.clone(), caller, id, req).await,
        Route::Messages(id) => events::send_message(app, &caller, &id, req).await,
        Route::EventHistory(id) => events::history(app, &caller, &id, &req).await,
        Route::EventStream(id) => events::stream(app, &caller, &id, &req).await,
        Route::Cancel(id) => events::cancel(app, &caller, &id, req).await,
        Route::Run => {
            // On a task of its own, like a turn request (see `aap::turns`): a client that goes
            // away must not cut the run short of deleting its session.
            let app = app.clone();
            let run = async move { runs::run(&app, &caller, req).await };
            tokio::spawn(run.instrument(tracing::Span::current()))
                .await
                .unwrap_or_else(|_| {
                    Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal_error",
                        "the run's task ended before it answered; see the server log",
                    ))
                })
        }
        Route::SessionRun(id) => runs::session_run(app, &caller, &id, req).await,
        Route::RunEvents(id) => runs::events(app, &caller, &id).await,
        Route::PlanConfirm(id) => runs::confirm(app, &caller, &id, req).await,
        Route::PlanReject(id) => runs::reject(app, &caller, &id, req).await,
        Route::Interrupt(id) => runs::interrupt(app, &caller, &id).await,
        Route::Upload => files::upload(app, &caller, req).await,
        Route::File(id) => files::metadata(app, &caller, &id).await,
        Route::DeleteFile(id) => files::delete(app, &caller, &id).await,
        Route::FileContent(id) => files::content(app, &caller, &id, &req).await,
        Route::Mcp(agent) => app.mcp.handle(agent.as_deref(), caller.owner, req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_table() {
        assert_eq!(resolve(&Method::GET, "/meta").unwrap(), Route::Meta);
        assert_eq!(
            resolve(&Method::POST, "/sessions/sess_1/turns").unwrap(),
            Route::Turns("sess_1".into())
        );
        assert_eq!(
            resolve(&Method::PUT, "/sessions").unwrap_err().status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            resolve(&Method::GET, "/nope").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }
}
