//! Attached files as the model sees them: read once per turn, inlined when small enough.

use super::Turn;

impl Turn {
    /// Read the session's attached files once, as the model will see them.
    pub(super) async fn prepare_attachments(&mut self) {
        let Some(files) = self.inner.files.clone() else {
            return;
        };
        for f in self.session.attached_files() {
            if !self.inlined.contains_key(&f.id) {
                let blocks = inline_file(&files, &f, self.session.owner.as_deref()).await;
                self.inlined.insert(f.id.clone(), blocks);
            }
        }
    }
}

/// Text files up to this size are given to the model inline.
const INLINE_TEXT_BYTES: u64 = 64 * 1024;
/// Images up to this size are given to the model as image blocks.
const INLINE_IMAGE_BYTES: u64 = 4 * 1024 * 1024;

/// An attached file as the model sees it: its line, and its text or image when small enough.
async fn inline_file(
    files: &crate::files::FileStore,
    f: &crate::log::FileRef,
    owner: Option<&str>,
) -> Vec<crate::message::Block> {
    use crate::message::Block;
    use tokio::io::AsyncReadExt;
    let line = crate::engine::history::attachment_line(f);
    let textual = f.mime_type.starts_with("text/")
        || matches!(
            f.mime_type.as_str(),
            "application/json" | "application/xml" | "application/x-yaml"
        );
    let image = f.mime_type.starts_with("image/");
    let fits = (textual && f.size_bytes <= INLINE_TEXT_BYTES)
        || (image && f.size_bytes <= INLINE_IMAGE_BYTES);
    if !fits {
        return vec![Block::Text { text: line }];
    }
    let mut bytes = Vec::new();
    let read = async {
        let row = files.get(owner, &f.id).await.ok()?;
        let file = files.open_blob(&row).await.ok()?;
        file.take(f.size_bytes).read_to_end(&mut bytes).await.ok()
    }
    .await;
    if read.is_none() {
        return vec![Block::Text { text: line }];
    }
    if image {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return vec![
            Block::Text { text: line },
            Block::Image {
                url: format!("data:{};base64,{data}", f.mime_type),
            },
        ];
    }
    match String::from_utf8(bytes) {
        Ok(text) => vec![Block::Text {
            text: format!("{line}\n<file name=\"{}\">\n{text}\n</file>", f.filename),
        }],
        Err(_) => vec![Block::Text { text: line }],
    }
}
