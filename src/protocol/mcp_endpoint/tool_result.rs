//! A built-in tool's output (or a refusal) as an MCP `CallToolResult`; an MCP server's own
//! result needs none of this (it is passed on as it came). A string is one text block; AAP
//! blocks map back (`text` to text, an `image` with a `data:` URL to an MCP image),
//! anything else is kept as its JSON text; a delivered file (`deliver_file`) is a `resource_link`
//! to its download URL under `base` (`GET /files/{id}/content`, with the caller's key).

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde_json::Value;

use crate::tools::ToolOutput;

pub(crate) fn to_result(out: ToolOutput, base: &str) -> CallToolResult {
    let mut blocks: Vec<ContentBlock> = match out.content {
        Value::String(s) => vec![ContentBlock::text(s)],
        Value::Array(items) => items.iter().map(block).collect(),
        other => vec![ContentBlock::text(other.to_string())],
    };
    for f in &out.files {
        let mut link = Resource::new(format!("{base}/files/{}/content", f.id), &f.filename);
        link.mime_type = Some(f.mime_type.clone());
        link.size = Some(f.size_bytes);
        blocks.push(ContentBlock::resource_link(link));
    }
    if out.is_error {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    }
}

/// An error result with one text block (a refusal, a denial).
pub(crate) fn refused(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

fn block(item: &Value) -> ContentBlock {
    match item.get("type").and_then(Value::as_str) {
        Some("text") => ContentBlock::text(item["text"].as_str().unwrap_or_default()),
        Some("image") => {
            let url = item
                .get("url")
                .or_else(|| item.get("source").and_then(|s| s.get("url")))
                .and_then(Value::as_str)
                .unwrap_or_default();
            match url
                .strip_prefix("data:")
                .and_then(|rest| rest.split_once(";base64,"))
            {
                Some((mime, data)) => ContentBlock::image(data, mime),
                None => ContentBlock::text(item.to_string()),
            }
        }
        _ => ContentBlock::text(item.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_blocks_and_errors() {
        let r = serde_json::to_value(to_result(ToolOutput::text("hi"), "")).unwrap();
        assert_eq!(r["content"], json!([{"type": "text", "text": "hi"}]));
        assert_eq!(r["isError"], json!(false));
        let out = ToolOutput {
            content: json!([
                {"type": "text", "text": "a red pixel"},
                {"type": "image", "url": "data:image/png;base64,AAAA"},
                {"type": "other", "x": 1}
            ]),
            is_error: true,
            files: vec![],
        };
        let r = serde_json::to_value(to_result(out, "")).unwrap();
        assert_eq!(r["isError"], json!(true));
        assert_eq!(r["content"][0]["text"], "a red pixel");
        assert_eq!(
            r["content"][1],
            json!({"type": "image", "data": "AAAA", "mimeType": "image/png"})
        );
        assert_eq!(r["content"][2]["type"], "text");
    }

    #[test]
    fn delivered_files_are_resource_links() {
        let out = ToolOutput {
            files: vec![crate::log::FileRef {
                id: "file_1".into(),
                filename: "a.txt".into(),
                mime_type: "text/plain".into(),
                size_bytes: 5,
            }],
            ..ToolOutput::text("File delivered: a.txt (5 bytes)")
        };
        let r = serde_json::to_value(to_result(out, "http://h:1")).unwrap();
        assert_eq!(
            r["content"][1],
            json!({"type": "resource_link", "uri": "http://h:1/files/file_1/content",
                   "name": "a.txt", "mimeType": "text/plain", "size": 5})
        );
    }
}
