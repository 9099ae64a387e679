//! MCP elicitation (`elicitation/create`): a server asks the person behind the session a
//! question in the middle of a tool call.
//!
//! Who can answer is an [`Elicitor`] the caller of a tool puts in its
//! [`CallContext`](crate::tools::CallContext) (an AAP client that declared the agent's
//! `elicitation_tool`); where there is none, or `[mcp_servers.X] elicitation = "decline"`, the
//! question is declined with a logged reason. An accepted answer gets the schema's defaults
//! for the fields it left out (SEP-1034) and is validated against the requested schema before
//! it goes back to the server.

use std::sync::Arc;

use serde_json::{Map, Value};

pub use crate::tools::call::{Answer, Elicitor, Question};

/// The answerer of a call: the session it belongs to and who can answer for it, if anyone.
#[derive(Clone, Default)]
pub struct Asker {
    pub session_id: String,
    pub elicitor: Option<Arc<dyn Elicitor>>,
    /// Who answers the call's sampling requests (see [`super::sampling`]).
    pub sampler: Option<Arc<dyn super::sampling::Sampler>>,
    /// The call's time spent waiting on answers, which its timeout does not count.
    pub paused: Arc<Paused>,
}

/// How long a call has waited on a person's answers: its `timeout_s` is paused meanwhile (a
/// question's own wait is bounded where it is asked: the agent's `approval_ttl_s`).
#[derive(Default)]
pub struct Paused {
    /// Questions open, since when, and the time paused before.
    state: std::sync::Mutex<(u32, Option<tokio::time::Instant>, std::time::Duration)>,
    changed: tokio::sync::Notify,
}

/// A question open on a call: its timeout is paused until this is dropped.
pub struct PauseGuard(Arc<Paused>);

impl Drop for PauseGuard {
    fn drop(&mut self) {
        {
            let mut st = crate::sync::lock(&self.0.state);
            st.0 = st.0.saturating_sub(1);
            if st.0 == 0 {
                if let Some(since) = st.1.take() {
                    st.2 += since.elapsed();
                }
            }
        }
        self.0.changed.notify_waiters();
    }
}

impl Paused {
    /// A question is asked: the call's timeout stops until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> PauseGuard {
        let mut st = crate::sync::lock(&self.state);
        if st.0 == 0 {
            st.1 = Some(tokio::time::Instant::now());
        }
        st.0 += 1;
        PauseGuard(self.clone())
    }

    /// Whether a question is open, and the time paused by those answered.
    fn now(&self) -> (bool, std::time::Duration) {
        let st = crate::sync::lock(&self.state);
        (st.0 > 0, st.2)
    }
}

/// Run `call` until `deadline`, pushed back by the time spent waiting on answers (`None`:
/// timed out).
pub async fn within<F: std::future::Future>(
    deadline: tokio::time::Instant,
    paused: &Paused,
    call: F,
) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    loop {
        let mut changed = std::pin::pin!(paused.changed.notified());
        changed.as_mut().enable();
        let (asking, before) = paused.now();
        if asking {
            tokio::select! {
                r = &mut call => return Some(r),
                _ = changed => continue,
            }
        }
        tokio::select! {
            r = &mut call => return Some(r),
            _ = tokio::time::sleep_until(deadline + before) => {
                if paused.now() == (false, before) {
                    return None;
                }
            }
        }
    }
}

/// A client's answer, from its tool result: `{"action": "accept", "content": {...}}`,
/// `{"action": "decline"}` or `{"action": "cancel"}`, as a JSON object or as a string holding
/// one. A bare object without `action` is taken as accepted content.
pub fn parse_answer(v: &Value) -> Result<Answer, String> {
    let parsed;
    let v = match v {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s).map_err(|_| {
                "the answer must be a JSON object: {\"action\": \"accept\" | \"decline\" | \"cancel\", \"content\": {...}}".to_string()
            })?;
            &parsed
        }
        v => v,
    };
    let Value::Object(o) = v else {
        return Err("the answer must be a JSON object with an \"action\"".into());
    };
    match o.get("action").and_then(Value::as_str) {
        Some("accept") => match o.get("content") {
            None | Some(Value::Null) => Ok(Answer::Accept(Map::new())),
            Some(Value::Object(c)) => Ok(Answer::Accept(c.clone())),
            Some(_) => Err("content: must be an object of the requested fields".into()),
        },
        Some("decline") => Ok(Answer::Decline),
        Some("cancel") => Ok(Answer::Cancel),
        Some(other) => Err(format!(
            "action: {other:?} is not one of \"accept\", \"decline\", \"cancel\""
        )),
        None if !o.contains_key("action") => Ok(Answer::Accept(o.clone())),
        None => Err("action: must be \"accept\", \"decline\" or \"cancel\"".into()),
    }
}

/// SEP-1034: a field the answer leaves out that has a `default` in the schema gets it.
pub fn apply_defaults(schema: &Value, content: &mut Map<String, Value>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, prop) in props {
        if let Some(d) = prop.get("default") {
            if !content.contains_key(name) {
                content.insert(name.clone(), d.clone());
            }
        }
    }
}

/// Check accepted content against the requested schema (required fields, primitive types,
/// enums, string lengths and formats' bounds, number ranges). The error names the field.
pub fn validate(schema: &Value, content: &Map<String, Value>) -> Result<(), String> {
    let empty = Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !content.contains_key(r) {
            return Err(format!("{r}: required by the requested schema, missing"));
        }
    }
    for (name, value) in content {
        let Some(prop) = props.get(name) else {
            return Err(format!("{name}: not a field of the requested schema"));
        };
        check_field(prop, value).map_err(|why| format!("{name}: {why}"))?;
    }
    Ok(())
}

fn check_field(prop: &Value, value: &Value) -> Result<(), String> {
    let ty = prop.get("type").and_then(Value::as_str);
    let ok = match ty {
        Some("string") => value.is_string(),
        Some("number") => value.is_number(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        _ => true,
    };
    if !ok {
        return Err(format!("expected a {}, got {value}", ty.unwrap_or("value")));
    }
    let allowed = allowed_values(prop);
    if let Some(allowed) = &allowed {
        let items: Vec<&Value> = match value {
            Value::Array(a) => a.iter().collect(),
            v => vec![v],
        };
        if let Some(bad) = items.iter().find(|v| !allowed.contains(v)) {
            return Err(format!("{bad} is not one of the allowed values"));
        }
    }
    if let Some(s) = value.as_str() {
        let n = s.chars().count() as u64;
        if let Some(min) = prop.get("minLength").and_then(Value::as_u64) {
            if n < min {
                return Err(format!("shorter than {min} characters"));
            }
        }
        if let Some(max) = prop.get("maxLength").and_then(Value::as_u64) {
            if n > max {
                return Err(format!("longer than {max} characters"));
            }
        }
    }
    if let Some(x) = value.as_f64() {
        if let Some(min) = prop.get("minimum").and_then(Value::as_f64) {
            if x < min {
                return Err(format!("{x} is below the minimum {min}"));
            }
        }
        if let Some(max) = prop.get("maximum").and_then(Value::as_f64) {
            if x > max {
                return Err(format!("{x} is above the maximum {max}"));
            }
        }
    }
    Ok(())
}

/// The values an enum field allows: `enum`, titled `oneOf`/`anyOf` consts (SEP-1330), or the
/// same under `items` for a multi-select.
fn allowed_values(prop: &Value) -> Option<Vec<&Value>> {
    enum_of(prop).or_else(|| prop.get("items").and_then(enum_of))
}

fn enum_of(p: &Value) -> Option<Vec<&Value>> {
    if let Some(e) = p.get("enum").and_then(Value::as_array) {
        return Some(e.iter().collect());
    }
    let alts = p
        .get("oneOf")
        .or_else(|| p.get("anyOf"))
        .and_then(Value::as_array)?;
    Some(alts.iter().filter_map(|a| a.get("const")).collect())
}

/// The answer an accepted content makes, defaults applied and validated.
pub fn complete(schema: &Value, answer: Answer) -> Result<Answer, String> {
    match answer {
        Answer::Accept(mut content) => {
            apply_defaults(schema, &mut content);
            validate(schema, &content)?;
            Ok(Answer::Accept(content))
        }
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests;
