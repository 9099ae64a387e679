//! Operator surfaces: `GET /tools`, the federated tools with their verdicts and deciding rules
//! (what `turnstile check` prints).

use http::StatusCode;
use serde_json::json;

use crate::http::routes::App;
use crate::http::{json_response, Response};
use crate::tools::ServerTool;

/// One tool as `GET /tools` and `check` show it.
pub fn tool_json(t: &ServerTool) -> serde_json::Value {
    json!({
        "name": t.spec.name,
        "server": t.server,
        "tool": t.tool,
        "verdict": t.verdict,
        "rule": t.rule,
        "description": t.spec.description,
    })
}

/// `GET /tools`.
pub fn tools(app: &App) -> Response {
    let tools: Vec<_> = app.engine.host_tools().iter().map(tool_json).collect();
    json_response(StatusCode::OK, &json!({ "tools": tools }))
}
