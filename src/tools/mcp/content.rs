//! MCP tool results as AAP tool results: text stays text, images become `image` blocks with a
//! `data:` URL, embedded text resources become text, binary resources and audio a line naming
//! them, structured content is kept as its JSON text, `isError` is the error flag.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};

use crate::tools::ToolOutput;

/// Map one MCP result.
pub fn to_output(result: CallToolResult) -> ToolOutput {
    let is_error = result.is_error.unwrap_or(false);
    let structured = result.structured_content;
    let mut items = result.content;
    // The common answer, one text block and nothing structured: its text as it is.
    if structured.is_none() && matches!(items.as_slice(), [ContentBlock::Text(_)]) {
        if let Some(ContentBlock::Text(t)) = items.pop() {
            return ToolOutput {
                content: Value::String(t.text),
                is_error,
                files: vec![],
            };
        }
    }
    // Text blocks are mapped as they are; the other kinds through their JSON form.
    let mut blocks: Vec<Value> = Vec::with_capacity(items.len() + 1);
    for item in items {
        let mapped = match item {
            ContentBlock::Text(t) => Some(text(t.text)),
            other => serde_json::to_value(&other).ok().and_then(|v| block(&v)),
        };
        blocks.extend(mapped);
    }
    if let Some(structured) = &structured {
        if !mirrored(&blocks, structured) {
            blocks.push(json!({"type": "text", "text": structured.to_string()}));
        }
    }
    let content = match blocks.as_slice() {
        [] => Value::String(String::new()),
        [one] if one["type"] == "text" => one["text"].clone(),
        _ => Value::Array(blocks),
    };
    ToolOutput {
        content,
        is_error,
        files: vec![],
    }
}

/// Whether the text blocks already say what `structured` says, so that the model need not be
/// sent it twice (MCP asks servers to put the serialization of their structured content in a
/// text block, for clients that read only text). They do when the text blocks, joined, parse
/// as JSON equal to it (one block, or a serialization split over several), or when one block
/// does; and when `structured` is `{"result": x}` (the wrapping SDKs such as FastMCP give a
/// tool that returns a plain value) and the joined text is `x` itself or parses as it.
fn mirrored(blocks: &[Value], structured: &Value) -> bool {
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    if texts.is_empty() {
        return false;
    }
    let joined = texts.concat();
    let parsed = serde_json::from_str::<Value>(joined.trim()).ok();
    if parsed.as_ref() == Some(structured) {
        return true;
    }
    if texts
        .iter()
        .any(|t| serde_json::from_str::<Value>(t.trim()).ok().as_ref() == Some(structured))
    {
        return true;
    }
    match structured.as_object() {
        Some(obj) if obj.len() == 1 => match obj.get("result") {
            Some(Value::String(s)) => *s == joined,
            Some(v) => parsed.as_ref() == Some(v),
            None => false,
        },
        _ => false,
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
mod tests;
