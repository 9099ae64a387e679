//! `deliver_file {"path"}`: a built-in server tool that copies a file from the session's
//! workspace into the file store and hands the client a download id.

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::{CallContext, ToolOutput};
use crate::files::safe_open::{open_in_workspace, OpenError};
use crate::files::FileStore;
use crate::message::ToolSpec;

pub const NAME: &str = "deliver_file";

/// The tool's spec, as `/meta` lists it.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.to_string(),
        title: Some("Deliver file".to_string()),
        description: "Deliver a file from the workspace to the user: it is stored and the user gets a download. `path` is relative to the workspace (/workspace/x means x in it).".to_string(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "The file's path in the workspace, e.g. report.csv or /workspace/out/report.csv"}},
            "required": ["path"],
            "additionalProperties": false
        })
        .into(),
    }
}

/// `1532` → `1,532`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Run the tool.
pub fn call<'a>(
    files: &'a FileStore,
    ctx: &'a CallContext,
    input: Value,
) -> BoxFuture<'a, ToolOutput> {
    Box::pin(async move {
        let Some(path) = input
            .get("path")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return ToolOutput::error("deliver_file needs {\"path\": \"<file in the workspace>\"}");
        };
        let workspace = ctx.workspace.clone();
        let opened = tokio::task::spawn_blocking(move || {
            open_in_workspace(&workspace, &path).map(|o| (o, path))
        })
        .await;
        let ((file, size, name), path) = match opened {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return ToolOutput::error(message(&e)),
            Err(e) => return ToolOutput::error(format!("deliver_file failed: {e}")),
        };
        if size > files.max_bytes {
            return ToolOutput::error(format!(
                "{path} is {} bytes, over the limit of {} bytes ([files] max_bytes)",
                thousands(size),
                thousands(files.max_bytes)
            ));
        }
        // Read at most the limit plus one byte, so a file that grows meanwhile is caught too.
        let reader = tokio::fs::File::from_std(file).take(files.max_bytes + 1);
        match files.put(ctx.owner.clone(), &name, reader).await {
            Ok(f) => ToolOutput {
                content: Value::String(format!(
                    "File delivered: {} ({} bytes)",
                    f.filename,
                    thousands(f.size_bytes)
                )),
                is_error: false,
                files: vec![f],
            },
            Err(e) => ToolOutput::error(format!("{path}: {e}")),
        }
    })
}

fn message(e: &OpenError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1532), "1,532");
        assert_eq!(super::thousands(1234567), "1,234,567");
    }
}
