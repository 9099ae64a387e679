//! The API: the route table ([`routes`]) and the dispatch of each endpoint to its protocol's
//! handler, with auth and the body limit checked first. The arrows run one way: `api` imports
//! the protocols and `http`; the protocols import `http` and the engine; `http` imports neither.

pub(crate) mod prometheus;
pub(crate) mod routes;

use std::sync::Arc;

use http::{header, StatusCode};
use tracing::Instrument;

use crate::http::{json_response, ApiError, Request, Response};
use crate::protocol::context::{App, Caller};
use crate::protocol::{aap, console, events, files_api, operator, runs, usage_api};
use routes::{resolve, Endpoint};

/// Serve one request, in a span of its own (see [`crate::telemetry::request_span`]) that ends
/// with one log line.
pub(crate) async fn handle(app: Arc<App>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let route = resolve(&method, req.uri().path());
    let (template, session) = match &route {
        Ok(r) => (r.template(), r.session_id()),
        Err(_) => ("(no route)", None),
    };
    let span = crate::telemetry::request_span(method.as_str(), template, session);
    let quiet = matches!(
        route,
        Ok(Endpoint::Healthz | Endpoint::Readyz | Endpoint::Metrics | Endpoint::Console(_))
    );
    let result = async {
        let route = route?;
        // Before anything else: what a web page could have sent is refused unread.
        app.browser
            .check(&req, matches!(route, Endpoint::Console(_)))?;
        if !matches!(route, Endpoint::Upload) {
            crate::http::browser::require_json(&req)?;
        }
        let caller = Caller {
            principal: if !route.is_public(app.public_meta, app.mcp.enabled()) {
                app.keys.get().principal(req.headers())?
            } else if route == Endpoint::Meta && req.headers().contains_key(header::AUTHORIZATION) {
                // A public `/meta` shows a key's own agents to a client that sends it (and, as
                // before principals, the public view to one whose key is not valid).
                app.keys.get().principal(req.headers()).unwrap_or(None)
            } else {
                None
            },
        };
        crate::telemetry::note_principal(caller.owner());
        let (limit, key, kind) = body_limit(&app, &route);
        crate::http::body::check_declared_length(req.headers(), limit, key, kind)?;
        dispatch(&app, route, caller, req).await
    }
    .instrument(span.clone())
    .await;
    let resp = result.unwrap_or_else(ApiError::into_response);
    crate::telemetry::request_done(&span, quiet, resp.status().as_u16(), started.elapsed());
    resp
}

/// The largest body a route takes, the config key that sets it and the error type past it.
fn body_limit(app: &App, route: &Endpoint) -> (u64, &'static str, &'static str) {
    match route {
        Endpoint::Upload => (app.files.max_bytes, "[files] max_bytes", "file_too_large"),
        _ => (app.max_body(), "[server] max_body_bytes", "body_too_large"),
    }
}

async fn dispatch(
    app: &Arc<App>,
    route: Endpoint,
    caller: Caller,
    req: Request,
) -> Result<Response, ApiError> {
    match route {
        Endpoint::Healthz => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ok"}),
        )),
        Endpoint::Readyz => operator::readyz(app).await,
        Endpoint::Status => operator::status(app, &caller).await,
        Endpoint::Metrics => Ok(prometheus::response(&app.engine)),
        Endpoint::Meta => Ok(aap::sessions::meta(app, &caller)),
        Endpoint::Tools => Ok(operator::tools(app, &caller)),
        Endpoint::Usage => usage_api::usage(app, &caller, &req).await,
        Endpoint::ListSessions => aap::sessions::list(app, &caller, &req).await,
        Endpoint::CreateSession => aap::sessions::create(app, &caller, req).await,
        Endpoint::GetSession(id) => aap::sessions::get(app, &caller, &id).await,
        Endpoint::DeleteSession(id) => aap::sessions::delete(app, &caller, &id).await,
        Endpoint::History(id) => aap::sessions::history(app, &caller, &id, &req).await,
        Endpoint::Turns(id) => aap::turns(app.clone(), caller, id, req).await,
        Endpoint::Messages(id) => events::send_message(app, &caller, &id, req).await,
        Endpoint::EventHistory(id) => events::history(app, &caller, &id, &req).await,
        Endpoint::EventStream(id) => events::stream(app, &caller, &id, &req).await,
        Endpoint::Cancel(id) => events::cancel(app, &caller, &id, req).await,
        Endpoint::Run => runs::run(app.clone(), caller, req).await,
        Endpoint::SessionRun(id) => runs::session_run(app, &caller, &id, req).await,
        Endpoint::RunEvents(id) => runs::events(app, &caller, &id).await,
        Endpoint::PlanConfirm(id) => runs::confirm(app, &caller, &id, req).await,
        Endpoint::PlanReject(id) => runs::reject(app, &caller, &id, req).await,
        Endpoint::Interrupt(id) => runs::interrupt(app, &caller, &id).await,
        Endpoint::Upload => files_api::upload(app, &caller, req).await,
        Endpoint::File(id) => files_api::metadata(app, &caller, &id).await,
        Endpoint::DeleteFile(id) => files_api::delete(app, &caller, &id).await,
        Endpoint::FileContent(id) => files_api::content(app, &caller, &id, &req).await,
        Endpoint::Console(asset) => console::asset(&asset, &req),
        Endpoint::ConsolePending => console::pending(app, &caller, &req).await,
        Endpoint::Mcp(agent) => {
            let caller = (caller.owned(), caller.scope());
            app.mcp.handle(agent.as_deref(), caller, req).await
        }
    }
}
