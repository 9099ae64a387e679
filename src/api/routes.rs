//! The route table: every path the server answers, in one list, apart from how a request is
//! served (`super::handle`). Endpoints are public only when listed as such here.

use http::{Method, StatusCode};

use crate::http::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
/// One thing the server answers: a method on a path, with the ids the path names.
pub(crate) enum Endpoint {
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
    /// `GET /usage`: principals' spend.
    Usage,
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
    /// A web console asset (`index.html` for `/console`).
    Console(String),
    ConsolePending,
    /// `/mcp` (`None`) or `/mcp/<agent>`: MCP streamable HTTP.
    Mcp(Option<String>),
}

impl Endpoint {
    /// Endpoints that answer without a key.
    pub(crate) fn is_public(&self, public_meta: bool, mcp_enabled: bool) -> bool {
        match self {
            Endpoint::Healthz | Endpoint::Readyz | Endpoint::Console(_) => true,
            Endpoint::Meta => public_meta,
            // Off, it is a 404 to everyone.
            Endpoint::Mcp(_) => !mcp_enabled,
            _ => false,
        }
    }

    /// The route's path with its ids as `{id}`: what logs and traces name a request by (one
    /// value per route, not per id).
    pub(crate) fn template(&self) -> &'static str {
        match self {
            Endpoint::Healthz => "/healthz",
            Endpoint::Readyz => "/readyz",
            Endpoint::Status => "/status",
            Endpoint::Metrics => "/metrics",
            Endpoint::Meta => "/meta",
            Endpoint::ListSessions | Endpoint::CreateSession => "/sessions",
            Endpoint::GetSession(_) | Endpoint::DeleteSession(_) => "/sessions/{id}",
            Endpoint::History(_) => "/sessions/{id}/history",
            Endpoint::Turns(_) => "/sessions/{id}/turns",
            Endpoint::Tools => "/tools",
            Endpoint::Usage => "/usage",
            Endpoint::Messages(_) => "/sessions/{id}/messages",
            Endpoint::EventHistory(_) => "/sessions/{id}/events/history",
            Endpoint::EventStream(_) => "/sessions/{id}/events/stream",
            Endpoint::Cancel(_) => "/sessions/{id}/cancel",
            Endpoint::Run => "/run",
            Endpoint::SessionRun(_) => "/sessions/{id}/run",
            Endpoint::RunEvents(_) => "/sessions/{id}/events",
            Endpoint::PlanConfirm(_) => "/sessions/{id}/plan/confirm",
            Endpoint::PlanReject(_) => "/sessions/{id}/plan/reject",
            Endpoint::Interrupt(_) => "/sessions/{id}/interrupt",
            Endpoint::Upload => "/files",
            Endpoint::File(_) | Endpoint::DeleteFile(_) => "/files/{id}",
            Endpoint::FileContent(_) => "/files/{id}/content",
            Endpoint::Console(_) => "/console/{asset}",
            Endpoint::ConsolePending => "/console/pending",
            Endpoint::Mcp(_) => "/mcp",
        }
    }

    /// The session the path names, if it names one.
    pub(crate) fn session_id(&self) -> Option<&str> {
        match self {
            Endpoint::GetSession(id)
            | Endpoint::DeleteSession(id)
            | Endpoint::History(id)
            | Endpoint::Turns(id)
            | Endpoint::Messages(id)
            | Endpoint::EventHistory(id)
            | Endpoint::EventStream(id)
            | Endpoint::Cancel(id)
            | Endpoint::SessionRun(id)
            | Endpoint::RunEvents(id)
            | Endpoint::PlanConfirm(id)
            | Endpoint::PlanReject(id)
            | Endpoint::Interrupt(id) => Some(id),
            _ => None,
        }
    }
}

/// Map a method and path to an endpoint: 404 for an unknown path, 405 for a known path with
/// another method.
pub(crate) fn resolve(method: &Method, path: &str) -> Result<Endpoint, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some((endpoint, allowed)) = top_level(method, &segs) else {
        return Err(ApiError::not_found(format!(
            "no route {method} {path}; see the README for the API"
        )));
    };
    endpoint.ok_or_else(|| ApiError {
        extra: Some(Box::new(serde_json::json!({ "allow": allowed }))),
        ..ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}; allowed: {allowed}"),
        )
    })
}

/// A known path: the endpoint when the method is allowed on it, and the methods that are.
type Found = Option<(Option<Endpoint>, &'static str)>;

fn get(m: &Method, e: Endpoint) -> (Option<Endpoint>, &'static str) {
    ((*m == Method::GET).then_some(e), "GET")
}

fn post(m: &Method, e: Endpoint) -> (Option<Endpoint>, &'static str) {
    ((*m == Method::POST).then_some(e), "POST")
}

/// Probes answer HEAD as well.
fn probe(m: &Method, e: Endpoint) -> (Option<Endpoint>, &'static str) {
    (matches!(*m, Method::GET | Method::HEAD).then_some(e), "GET")
}

fn top_level(m: &Method, segs: &[&str]) -> Found {
    Some(match segs {
        ["healthz"] => probe(m, Endpoint::Healthz),
        ["readyz"] => probe(m, Endpoint::Readyz),
        ["status"] => get(m, Endpoint::Status),
        ["metrics"] => get(m, Endpoint::Metrics),
        ["meta"] => get(m, Endpoint::Meta),
        ["tools"] => get(m, Endpoint::Tools),
        ["usage"] => get(m, Endpoint::Usage),
        ["sessions"] => (
            match *m {
                Method::GET => Some(Endpoint::ListSessions),
                Method::POST => Some(Endpoint::CreateSession),
                _ => None,
            },
            "GET, POST",
        ),
        ["sessions", id, rest @ ..] => return session(m, id, rest),
        ["run"] => post(m, Endpoint::Run),
        ["files"] => post(m, Endpoint::Upload),
        ["files", id] => (
            match *m {
                Method::GET => Some(Endpoint::File(id.to_string())),
                Method::DELETE => Some(Endpoint::DeleteFile(id.to_string())),
                _ => None,
            },
            "GET, DELETE",
        ),
        ["files", id, "content"] => get(m, Endpoint::FileContent(id.to_string())),
        ["console"] => probe(m, Endpoint::Console("index.html".into())),
        ["console", "pending"] => get(m, Endpoint::ConsolePending),
        ["console", asset] => probe(m, Endpoint::Console(asset.to_string())),
        ["mcp"] | ["mcp", _] => (
            matches!(*m, Method::GET | Method::POST | Method::DELETE)
                .then(|| Endpoint::Mcp(segs.get(1).map(|s| s.to_string()))),
            "GET, POST, DELETE",
        ),
        _ => return None,
    })
}

/// The paths under `/sessions/{id}`.
fn session(m: &Method, id: &str, rest: &[&str]) -> Found {
    let id = id.to_string();
    Some(match rest {
        [] => (
            match *m {
                Method::GET => Some(Endpoint::GetSession(id)),
                Method::DELETE => Some(Endpoint::DeleteSession(id)),
                _ => None,
            },
            "GET, DELETE",
        ),
        ["history"] => get(m, Endpoint::History(id)),
        ["turns"] => post(m, Endpoint::Turns(id)),
        ["messages"] => post(m, Endpoint::Messages(id)),
        ["events", "history"] => get(m, Endpoint::EventHistory(id)),
        ["events", "stream"] => get(m, Endpoint::EventStream(id)),
        ["events"] => get(m, Endpoint::RunEvents(id)),
        ["cancel"] => post(m, Endpoint::Cancel(id)),
        ["run"] => post(m, Endpoint::SessionRun(id)),
        ["plan", "confirm"] => post(m, Endpoint::PlanConfirm(id)),
        ["plan", "reject"] => post(m, Endpoint::PlanReject(id)),
        ["interrupt"] => post(m, Endpoint::Interrupt(id)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_table() {
        assert_eq!(resolve(&Method::GET, "/meta").unwrap(), Endpoint::Meta);
        assert_eq!(
            resolve(&Method::POST, "/sessions/sess_1/turns").unwrap(),
            Endpoint::Turns("sess_1".into())
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
