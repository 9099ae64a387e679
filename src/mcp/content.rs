//! MCP tool results as AAP tool results: text stays text, images become `image` blocks with a
//! `data:` URL, embedded text resources become text, binary resources and audio a line naming
//! them, structured content is kept as its JSON text, `isError` is the error flag.

use rmcp::model::CallToolResult;
use serde_json::{json, Value};

use crate::tools::ToolOutput;

/// Map one MCP result.
pub fn to_output(result: CallToolResult) -> ToolOutput {
    let items = serde_json::to_value(&result.content).unwrap_or(Value::Array(vec![]));
    let mut blocks: Vec<Value> = Vec::new();
    for item in items.as_array().into_iter().flatten() {
        if let Some(b) = block(item) {
            blocks.push(b);
        }
    }
    if let Some(structured) = &result.structured_content {
        let text = structured.to_string();
        let already = blocks.iter().any(|b| {
            b["type"] == "text"
                && b["text"]
                    .as_str()
                    .and_then(|t| serde_json::from_str::<Value>(t).ok())
                    .is_some_and(|v| &v == structured)
        });
        if !already {
            blocks.push(json!({"type": "text", "text": text}));
        }
    }
    let content = match blocks.as_slice() {
        [] => Value::String(String::new()),
        [one] if one["type"] == "text" => one["text"].clone(),
        _ => Value::Array(blocks),
    };
    ToolOutput {
        content,
        is_error: result.is_error.unwrap_or(false),
        files: vec![],
    }
}

fn text(s: impl Into<String>) -> Value {
    json!({"type": "text", "text": s.into()})
}

fn block(item: &Value) -> Option<Value> {
    let kind = item.get("type").and_then(Value::as_str)?;
    let s = |k: &str| {
        item.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some(match kind {
        "text" => text(s("text")),
        "image" => {
            json!({"type": "image", "url": format!("data:{};base64,{}", s("mimeType"), s("data"))})
        }
        "audio" => text(format!(
            "[audio: {}, {} bytes of base64]",
            s("mimeType"),
            s("data").len()
        )),
        "resource" => {
            let r = item.get("resource")?;
            let rs = |k: &str| {
                r.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            match r.get("text").and_then(Value::as_str) {
                Some(t) => text(t),
                None => text(format!(
                    "[resource {} ({}), {} bytes of base64]",
                    rs("uri"),
                    rs("mimeType"),
                    rs("blob").len()
                )),
            }
        }
        "resource_link" => text(format!("[resource {}: {}]", s("name"), s("uri"))),
        _ => text(item.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn one_text_is_a_string_and_is_error_is_kept() {
        let out = to_output(result(
            json!({"content": [{"type": "text", "text": "5"}], "isError": true}),
        ));
        assert_eq!(out.content, json!("5"));
        assert!(out.is_error);
    }

    #[test]
    fn images_resources_and_structured_content_become_blocks() {
        let out = to_output(result(json!({
            "content": [
                {"type": "image", "data": "iVBOR", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}}
            ],
            "structuredContent": {"sum": 5}
        })));
        assert_eq!(
            out.content,
            json!([
                {"type": "image", "url": "data:image/png;base64,iVBOR"},
                {"type": "text", "text": "hello"},
                {"type": "text", "text": "{\"sum\":5}"}
            ])
        );
        assert!(!out.is_error);
    }

    #[test]
    fn structured_content_mirrored_in_text_is_not_repeated() {
        let out = to_output(result(json!({
            "content": [{"type": "text", "text": "{\"sum\": 5}"}],
            "structuredContent": {"sum": 5}
        })));
        assert_eq!(out.content, json!("{\"sum\": 5}"));
    }
}
