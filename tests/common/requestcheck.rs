//! Checks what turnstile sent the model: no request carries a tool call without its answer.
//! An OpenAI-compatible upstream refuses a request whose assistant `tool_calls` are not each
//! answered by a `tool` message right after it (before any other message), or a `tool` message
//! that answers no call.

use serde_json::Value;

/// Check every recorded request (`FakeOpenAi::requests()`); panics naming the request and the
/// call.
pub fn check_requests(requests: &[Value]) {
    for (i, req) in requests.iter().enumerate() {
        check_request(req).unwrap_or_else(|e| panic!("model request #{}: {e}\n{req}", i + 1));
    }
}

/// One chat completions request: `Err` says what is wrong.
pub fn check_request(req: &Value) -> Result<(), String> {
    let empty = Vec::new();
    let messages = req["messages"].as_array().unwrap_or(&empty);
    // Calls of the last assistant message not answered yet.
    let mut open: Vec<String> = Vec::new();
    for (j, m) in messages.iter().enumerate() {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or_default();
                match open.iter().position(|c| c == id) {
                    Some(pos) => {
                        open.remove(pos);
                    }
                    None => {
                        return Err(format!(
                            "message {j}: a tool message for {id:?}, which answers no open call"
                        ))
                    }
                }
            }
            _ if !open.is_empty() => {
                return Err(format!(
                    "message {j} ({}) comes before the answers to calls {open:?}",
                    m["role"]
                ))
            }
            Some("assistant") => {
                for c in m["tool_calls"].as_array().unwrap_or(&empty) {
                    open.push(c["id"].as_str().unwrap_or_default().to_string());
                }
            }
            _ => {}
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("calls {open:?} are sent without their answers"))
    }
}
