//! Tool results over `[limits] tool_result_bytes`: the model gets the first part (cut on a UTF-8
//! boundary) and a note naming a file in the session's workspace that holds the whole result, so
//! the agent can read the rest with its tools or hand it to the user with `deliver_file`. The
//! log keeps what the model was given; the whole result lives in the workspace only.
//!
//! A result is measured by its text: a string, or its text blocks. A result with other blocks
//! (images) that is over the limit is kept whole in the file as its JSON.

use std::path::Path;

use serde_json::Value;

use crate::tools::ToolOutput;

/// The workspace folder that holds whole results.
pub const FOLDER: &str = "tool_results";

/// What is kept of a result over the limit, and the file to write the whole into.
#[derive(Debug, PartialEq)]
pub struct Cut {
    /// The content the model is given: the first part, then the note.
    pub content: String,
    /// The file's path, relative to the workspace.
    pub file: String,
    /// The file's content: the whole result.
    pub whole: String,
}

/// The result's size as measured against the limit: its text's bytes (for blocks, the text
/// blocks' and, for any other block, its JSON's).
fn size(content: &Value) -> usize {
    match content {
        Value::String(s) => s.len(),
        Value::Array(blocks) => blocks.iter().map(block_size).sum(),
        other => other.to_string().len(),
    }
}

fn block_size(b: &Value) -> usize {
    match (b.get("type").and_then(Value::as_str), b.get("text")) {
        (Some("text"), Some(Value::String(t))) => t.len(),
        _ => b.to_string().len(),
    }
}

/// The whole result as a file: its text (text blocks joined by newlines), or its JSON when it
/// holds other blocks. And the file's extension.
fn whole(content: &Value) -> (String, &'static str) {
    match content {
        Value::String(s) => (s.clone(), "txt"),
        Value::Array(blocks) => {
            let texts: Option<Vec<&str>> = blocks
                .iter()
                .map(
                    |b| match (b.get("type").and_then(Value::as_str), b.get("text")) {
                        (Some("text"), Some(Value::String(t))) => Some(t.as_str()),
                        _ => None,
                    },
                )
                .collect();
            match texts {
                Some(texts) => (texts.join("\n"), "txt"),
                None => (content.to_string(), "json"),
            }
        }
        other => (other.to_string(), "json"),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A call id as a file name: `[A-Za-z0-9_-]` kept, anything else `_`, at most 100 characters
/// (ids come from the upstream: never a path).
fn file_stem(call_id: &str) -> String {
    let stem: String = call_id
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() {
        "result".into()
    } else {
        stem
    }
}

/// How a result over `limit` bytes is cut, or `None` when it fits.
pub fn cut(call_id: &str, content: &Value, limit: usize) -> Option<Cut> {
    let total = size(content);
    if total <= limit {
        return None;
    }
    let (whole, ext) = whole(content);
    let file = format!("{FOLDER}/{}.{ext}", file_stem(call_id));
    let first = prefix(&whole, limit);
    let content = format!(
        "{first}\n\n[This tool result is {} bytes, over the limit of {} bytes ([limits] tool_result_bytes): above are its first {} bytes. The whole result is in the workspace file {file}: read the rest from it with your tools, or hand it to the user with deliver_file.]",
        group(whole.len()),
        group(limit),
        group(first.len()),
    );
    Some(Cut {
        content,
        file,
        whole,
    })
}

/// A count with thousands separators.
fn group(n: usize) -> String {
    crate::tools::deliver::thousands(n as u64)
}

/// `out` as the model may be given it: unchanged when it fits, else cut, with the whole written
/// into the workspace (if that fails, the note says the whole could not be kept).
pub async fn bound(workspace: &Path, call_id: &str, out: ToolOutput, limit: usize) -> ToolOutput {
    let Some(cut) = cut(call_id, &out.content, limit) else {
        return out;
    };
    let path = workspace.join(&cut.file);
    let written = async {
        tokio::fs::create_dir_all(workspace.join(FOLDER)).await?;
        tokio::fs::write(&path, cut.whole.as_bytes()).await
    }
    .await;
    let content = match written {
        Ok(()) => cut.content,
        Err(e) => {
            tracing::warn!(call = %call_id, path = %path.display(), error = %e, "could not keep an oversized tool result in the workspace");
            let first = prefix(&cut.whole, limit);
            format!(
                "{first}\n\n[This tool result is {} bytes, over the limit of {} bytes ([limits] tool_result_bytes): above are its first {} bytes; the rest could not be kept.]",
                group(cut.whole.len()),
                group(limit),
                group(first.len()),
            )
        }
    };
    ToolOutput {
        content: Value::String(content),
        ..out
    }
}

#[cfg(test)]
mod tests;
