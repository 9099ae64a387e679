//! The file store: uploads and delivered files. Bytes are content-addressed blobs under
//! `data_dir/files/` (named by their SHA-256, written once, then renamed into place); metadata
//! lives in the embedded store. Files belong to the API key that made them.

pub mod deliver;
pub mod mime;
pub mod safe_open;

use std::path::{Path, PathBuf};

use ring::digest::{Context, SHA256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::log::{FileRef, FileRow, Store};
use crate::{clock, ids};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("file {0} not found")]
    NotFound(String),
    #[error("the file is larger than the limit of {limit} bytes ([files] max_bytes)")]
    TooLarge { limit: u64 },
    #[error("file store error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::log::StoreError),
}

/// Handle to the file store; cheap to clone.
#[derive(Clone)]
pub struct FileStore {
    blobs: PathBuf,
    store: Store,
    pub max_bytes: u64,
}

/// A file name safe to store and to offer for download: its last path component, no control
/// characters, at most 255 bytes; `file` when nothing is left.
pub fn clean_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let mut out: String = base.chars().filter(|c| !c.is_control()).collect();
    out = out.trim().to_string();
    if out == "." || out == ".." {
        out.clear();
    }
    while out.len() > 255 {
        out.pop();
    }
    if out.is_empty() {
        "file".to_string()
    } else {
        out
    }
}

impl FileStore {
    pub fn open(data_dir: &Path, store: Store, max_bytes: u64) -> std::io::Result<FileStore> {
        let blobs = data_dir.join("files");
        std::fs::create_dir_all(blobs.join("tmp"))?;
        Ok(FileStore {
            blobs,
            store,
            max_bytes,
        })
    }

    fn blob(&self, sha: &str) -> PathBuf {
        self.blobs.join(sha)
    }

    /// Store what `reader` yields (at most `max_bytes`), streaming: never whole in memory.
    pub async fn put<R: AsyncRead + Unpin>(
        &self,
        owner: Option<String>,
        filename: &str,
        mut reader: R,
    ) -> Result<FileRef, FileError> {
        let filename = clean_name(filename);
        let tmp = self.blobs.join("tmp").join(ids::new("tmp"));
        let mut out = tokio::fs::File::create(&tmp).await?;
        let mut hash = Context::new(&SHA256);
        let mut head = Vec::with_capacity(8192);
        let mut size: u64 = 0;
        let mut buf = vec![0u8; 64 * 1024];
        let result: Result<(), FileError> = async {
            loop {
                let n = reader.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if size > self.max_bytes {
                    return Err(FileError::TooLarge {
                        limit: self.max_bytes,
                    });
                }
                if head.len() < 8192 {
                    let take = (8192 - head.len()).min(n);
                    head.extend_from_slice(&buf[..take]);
                }
                hash.update(&buf[..n]);
                out.write_all(&buf[..n]).await?;
            }
            out.flush().await?;
            out.sync_all().await?;
            Ok(())
        }
        .await;
        drop(out);
        if let Err(e) = result {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        let sha: String = hash
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let blob = self.blob(&sha);
        if tokio::fs::try_exists(&blob).await.unwrap_or(false) {
            let _ = tokio::fs::remove_file(&tmp).await;
        } else {
            tokio::fs::rename(&tmp, &blob).await?;
        }
        let row = FileRow {
            id: ids::new("file"),
            owner,
            mime_type: mime::detect(&filename, &head),
            filename,
            size_bytes: size,
            sha256: sha,
            created_at: clock::now(),
        };
        self.store.put_file(row.clone());
        self.store.flush().await?;
        Ok(to_ref(&row))
    }

    /// A file this owner may see.
    pub async fn get(&self, owner: Option<&str>, id: &str) -> Result<FileRow, FileError> {
        if !ids::is_valid("file", id) {
            return Err(FileError::NotFound(id.to_string()));
        }
        match self.store.file(id).await? {
            Some(row) if row.owner.as_deref() == owner => Ok(row),
            _ => Err(FileError::NotFound(id.to_string())),
        }
    }

    /// Open a file's bytes.
    pub async fn open_blob(&self, row: &FileRow) -> Result<tokio::fs::File, FileError> {
        Ok(tokio::fs::File::open(self.blob(&row.sha256)).await?)
    }

    /// Copy a stored file into a folder (a session's workspace) under a name not taken yet; the
    /// name used.
    pub async fn copy_into(&self, row: &FileRow, dir: &Path) -> Result<String, FileError> {
        tokio::fs::create_dir_all(dir).await?;
        let (stem, ext) = match row.filename.rsplit_once('.') {
            Some((s, e)) if !s.is_empty() => (s.to_string(), format!(".{e}")),
            _ => (row.filename.clone(), String::new()),
        };
        let mut name = row.filename.clone();
        let mut n = 1;
        loop {
            let target = dir.join(&name);
            match tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .await
            {
                Ok(mut out) => {
                    let mut src = self.open_blob(row).await?;
                    tokio::io::copy(&mut src, &mut out).await?;
                    return Ok(name);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    n += 1;
                    name = format!("{stem} ({n}){ext}");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The public shape of a file (`{"id", "filename", "mime_type", "size_bytes"}`).
pub fn to_ref(row: &FileRow) -> FileRef {
    FileRef {
        id: row.id.clone(),
        filename: row.filename.clone(),
        mime_type: row.mime_type.clone(),
        size_bytes: row.size_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned() {
        assert_eq!(clean_name("../../etc/passwd"), "passwd");
        assert_eq!(clean_name("a\u{0}b\nc.txt"), "abc.txt");
        assert_eq!(clean_name(".."), "file");
        assert_eq!(clean_name("C:\\x\\report.pdf"), "report.pdf");
        assert_eq!(clean_name("résumé.pdf"), "résumé.pdf");
    }

    #[tokio::test]
    async fn put_streams_hashes_dedupes_and_enforces_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), false).unwrap();
        let files = FileStore::open(dir.path(), store, 10).unwrap();
        let a = files.put(None, "a.txt", &b"hello"[..]).await.unwrap();
        let b = files.put(None, "b.txt", &b"hello"[..]).await.unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!((a.size_bytes, a.mime_type.as_str()), (5, "text/plain"));
        let blobs: Vec<_> = std::fs::read_dir(dir.path().join("files"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_file())
            .collect();
        assert_eq!(blobs.len(), 1, "same bytes, one blob");
        let err = files.put(None, "big", &[0u8; 11][..]).await.unwrap_err();
        assert!(matches!(err, FileError::TooLarge { limit: 10 }));
        assert_eq!(
            std::fs::read_dir(dir.path().join("files/tmp"))
                .unwrap()
                .count(),
            0,
            "no leftovers"
        );
        let row = files.get(None, &a.id).await.unwrap();
        assert_eq!(row.filename, "a.txt");
        assert!(matches!(
            files.get(Some("other"), &a.id).await,
            Err(FileError::NotFound(_))
        ));
    }
}
