//! The file store: uploads and delivered files. Bytes are content-addressed blobs (named by
//! their SHA-256, written once): under `data_dir/files/` with the embedded store, in the
//! database with PostgreSQL (`log/postgres/file_chunks.rs`), so that any instance serves them.
//! Uploads are staged under `data_dir/files/tmp` either way. Metadata lives in the store.
//! Files belong to the API key that made them.

pub mod mime;
pub mod safe_open;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ring::digest::{Context, SHA256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::log::{FileRef, FileRow, FileUsage, Store};
use crate::sync::lock;
use crate::{clock, ids};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("file {0} not found")]
    NotFound(String),
    #[error("the file is larger than the limit of {limit} bytes (limit: [files] max_bytes in tools.toml)")]
    TooLarge { limit: u64 },
    #[error("this key's stored files would pass {limit} bytes, each file counted as at least {MIN_ACCOUNTED_BYTES} (limit: [limits] disk_bytes_per_key in tools.toml); delete files it no longer needs with DELETE /files/{{id}}")]
    QuotaExceeded { limit: u64 },
    #[error("this key already has {limit} stored files (limit: [limits] files_per_key in tools.toml); delete files it no longer needs with DELETE /files/{{id}}")]
    TooManyFiles { limit: u64 },
    #[error("file store error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::log::StoreError),
}

/// From now on, files and folders this process (and any child it starts) creates are its user's
/// alone: 0600 and 0700 (a umask of 077). Called first thing by the binary.
pub fn private_by_default() {
    // SAFETY: umask only swaps the process's file mode mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

/// Make `dir` (made before, perhaps by an older version, with looser modes) its user's alone.
pub fn make_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(dir) {
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() && mode & 0o077 != 0 {
            match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), old = format!("{mode:o}"), "made the folder its user's alone (0700)")
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot make the folder its user's alone (0700)")
                }
            }
        }
    }
}

/// The least a stored file counts against its owner's `[limits] disk_bytes_per_key`: an empty
/// file still costs a record (and a file system block), so a key cannot store files without end
/// by making them small.
pub const MIN_ACCOUNTED_BYTES: u64 = 4096;

/// What a file of `size` bytes counts against its owner's quota.
fn accounted(size: u64) -> u64 {
    size.max(MIN_ACCOUNTED_BYTES)
}

/// A stored file's bytes, being read.
pub type Blob = Box<dyn AsyncRead + Send + Unpin>;

/// Handle to the file store; cheap to clone.
#[derive(Clone)]
pub struct FileStore {
    blobs: PathBuf,
    store: Store,
    pub max_bytes: u64,
    /// Bytes of stored files one key may own (`[limits] disk_bytes_per_key`).
    pub disk_bytes_per_key: u64,
    /// Stored files one key may own (`[limits] files_per_key`).
    pub files_per_key: u64,
    shared: Arc<Shared>,
}

struct Shared {
    /// Per owner: its stored files and their accounted bytes, plus its uploads under way. An
    /// owner's entry is read from the store (a sum over its records) the first time it is needed.
    usage: Mutex<HashMap<Option<String>, FileUsage>>,
    /// Held while a blob is put in place or removed together with the commit of its record:
    /// records share blobs (same bytes, one blob), so a blob is removed only when no record is
    /// left that names it, and never while an upload of the same bytes is being recorded.
    blob_lock: tokio::sync::Mutex<()>,
}

/// Bidirectional-text controls: they make a name read differently from what it is
/// (`invoice\u{202E}fdp.exe` shows as `invoiceexe.pdf`).
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// A file name safe to store and to offer for download: its last path component, no control
/// characters and no bidirectional-text controls, at most 255 bytes; `file` when nothing is left.
pub fn clean_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let mut out: String = base
        .chars()
        .filter(|c| !c.is_control() && !is_bidi_control(*c))
        .collect();
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

/// A file and its bytes counted against an owner's quota while an upload is under way: given
/// back when dropped, unless kept (the file was stored).
struct Reservation<'a> {
    files: &'a FileStore,
    owner: Option<String>,
    taken: FileUsage,
}

impl<'a> Reservation<'a> {
    /// One more file of the owner's, counted as [`MIN_ACCOUNTED_BYTES`] until it grows.
    fn start(files: &'a FileStore, owner: Option<String>) -> Result<Self, FileError> {
        let limit = files.files_per_key;
        {
            let mut usage = lock(&files.shared.usage);
            let used = usage.entry(owner.clone()).or_default();
            if used.files >= limit {
                return Err(FileError::TooManyFiles { limit });
            }
            used.files += 1;
        }
        let mut r = Reservation {
            files,
            owner,
            taken: FileUsage { files: 1, bytes: 0 },
        };
        r.grow_to(0)?;
        Ok(r)
    }

    /// The file has `size` bytes so far.
    fn grow_to(&mut self, size: u64) -> Result<(), FileError> {
        let n = accounted(size).saturating_sub(self.taken.bytes);
        if n == 0 {
            return Ok(());
        }
        let limit = self.files.disk_bytes_per_key;
        let mut usage = lock(&self.files.shared.usage);
        let used = usage.entry(self.owner.clone()).or_default();
        if used.bytes.saturating_add(n) > limit {
            return Err(FileError::QuotaExceeded { limit });
        }
        used.bytes += n;
        self.taken.bytes += n;
        Ok(())
    }

    fn keep(mut self) {
        self.taken = FileUsage::default();
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.taken != FileUsage::default() {
            let mut usage = lock(&self.files.shared.usage);
            if let Some(used) = usage.get_mut(&self.owner) {
                used.bytes = used.bytes.saturating_sub(self.taken.bytes);
                used.files = used.files.saturating_sub(self.taken.files);
            }
        }
    }
}

/// `report.csv` → (`report`, `.csv`); a name without a stem keeps its dot (`.env` → (`.env`, ``)).
fn split_ext(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(i) if i > 0 => (&name[..i], &name[i..]),
        _ => (name, ""),
    }
}

/// The first of `name`, `stem (2).ext`, `stem (3).ext`, ... not in `taken`; `next` remembers
/// where each name's count stopped, so naming many copies of one name is linear, not quadratic.
fn free_name(name: &str, taken: &HashSet<String>, next: &mut HashMap<String, u64>) -> String {
    if !taken.contains(name) {
        return name.to_string();
    }
    let (stem, ext) = split_ext(name);
    let n = next.entry(name.to_string()).or_insert(2);
    loop {
        let candidate = format!("{stem} ({n}){ext}");
        *n += 1;
        if !taken.contains(&candidate) {
            return candidate;
        }
    }
}

impl FileStore {
    /// Open the store's folder under `data_dir`, emptying `files/tmp` (uploads cut short by a
    /// stop). No quota per key until [`FileStore::with_disk_quota`].
    pub fn open(data_dir: &Path, store: Store, max_bytes: u64) -> std::io::Result<FileStore> {
        let blobs = data_dir.join("files");
        let tmp = blobs.join("tmp");
        match std::fs::remove_dir_all(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&tmp)?;
        Ok(FileStore {
            blobs,
            store,
            max_bytes,
            disk_bytes_per_key: u64::MAX,
            files_per_key: u64::MAX,
            shared: Arc::new(Shared {
                usage: Mutex::new(HashMap::new()),
                blob_lock: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Limit the bytes (each file counted as at least [`MIN_ACCOUNTED_BYTES`]) and the number
    /// of stored files per key (`[limits] disk_bytes_per_key`, `files_per_key`).
    pub fn with_quota(mut self, bytes: u64, files: u64) -> FileStore {
        self.disk_bytes_per_key = bytes;
        self.files_per_key = files;
        self
    }

    fn blob(&self, sha: &str) -> PathBuf {
        self.blobs.join(sha)
    }

    /// Make sure the owner's usage is counted in memory (read from the store the first time).
    async fn load_usage(&self, owner: &Option<String>) -> Result<(), FileError> {
        if lock(&self.shared.usage).contains_key(owner) {
            return Ok(());
        }
        let stored = self
            .store
            .file_usage_of(owner.clone(), MIN_ACCOUNTED_BYTES)
            .await?;
        // Another caller may have loaded it meanwhile, and counted more since: theirs stands.
        lock(&self.shared.usage)
            .entry(owner.clone())
            .or_insert(stored);
        Ok(())
    }

    /// The stored files (and uploads under way) of this owner, and their accounted bytes.
    pub async fn usage(&self, owner: Option<&str>) -> Result<FileUsage, FileError> {
        let owner = owner.map(str::to_string);
        self.load_usage(&owner).await?;
        Ok(lock(&self.shared.usage)
            .get(&owner)
            .copied()
            .unwrap_or_default())
    }

    /// Store what `reader` yields (at most `max_bytes`, and within the owner's quota),
    /// streaming: never whole in memory.
    pub async fn put<R: AsyncRead + Unpin>(
        &self,
        owner: Option<String>,
        filename: &str,
        mut reader: R,
    ) -> Result<FileRef, FileError> {
        let filename = clean_name(filename);
        self.load_usage(&owner).await?;
        let mut reserved = Reservation::start(self, owner.clone())?;
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
                reserved.grow_to(size)?;
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
        let row = FileRow {
            id: ids::new("file"),
            owner,
            mime_type: mime::detect(&filename, &head),
            filename,
            size_bytes: size,
            sha256: sha,
            created_at: clock::now(),
        };
        if let Some(db) = self.store.blob_db() {
            let placed = self.place_in_db(db, &row, &tmp).await;
            let _ = tokio::fs::remove_file(&tmp).await;
            placed?;
        } else {
            self.place_on_disk(&row, &tmp).await?;
        }
        reserved.keep();
        Ok(to_ref(&row))
    }

    /// The bytes stay on disk: move the staged upload into place unless the same bytes are
    /// there already, and commit its record, under the blob lock.
    async fn place_on_disk(&self, row: &FileRow, staged: &Path) -> Result<(), FileError> {
        let _placing = self.shared.blob_lock.lock().await;
        let blob = self.blob(&row.sha256);
        if tokio::fs::try_exists(&blob).await.unwrap_or(false) {
            let _ = tokio::fs::remove_file(staged).await;
        } else if let Err(e) = tokio::fs::rename(staged, &blob).await {
            let _ = tokio::fs::remove_file(staged).await;
            return Err(e.into());
        }
        self.store.put_file(row.clone());
        self.store.flush().await?;
        Ok(())
    }

    /// The database holds the bytes: write the staged upload there unless the same bytes are
    /// there already, and commit its record, under the blob's lock (shared by the instances).
    async fn place_in_db(
        &self,
        db: &crate::log::postgres::PgStore,
        row: &FileRow,
        staged: &Path,
    ) -> Result<(), FileError> {
        let blob = db.lock_blob(&row.sha256).await?;
        let placed = async {
            if !blob.exists().await? {
                blob.put_from(staged).await?;
            }
            self.store.put_file(row.clone());
            self.store.flush().await?;
            Ok(())
        }
        .await;
        blob.release().await;
        placed
    }

    /// The database holds the bytes: remove the record, and the bytes unless another record
    /// shares them, under the blob's lock.
    async fn delete_in_db(
        &self,
        db: &crate::log::postgres::PgStore,
        row: &FileRow,
    ) -> Result<(), FileError> {
        let blob = db.lock_blob(&row.sha256).await?;
        let deleted = async {
            self.store.delete_file(&row.id);
            self.store.flush().await?;
            if !self.store.blob_in_use(&row.sha256).await? {
                blob.delete().await?;
            }
            Ok(())
        }
        .await;
        blob.release().await;
        deleted
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

    /// Delete a file of this owner: its record, and its bytes unless another record shares them.
    pub async fn delete(&self, owner: Option<&str>, id: &str) -> Result<(), FileError> {
        let row = self.get(owner, id).await?;
        let owner = row.owner.clone();
        self.load_usage(&owner).await?;
        if let Some(db) = self.store.blob_db() {
            self.delete_in_db(db, &row).await?;
        } else {
            let _removing = self.shared.blob_lock.lock().await;
            self.store.delete_file(&row.id);
            self.store.flush().await?;
            if !self.store.blob_in_use(&row.sha256).await? {
                match tokio::fs::remove_file(self.blob(&row.sha256)).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if let Some(used) = lock(&self.shared.usage).get_mut(&owner) {
            used.bytes = used.bytes.saturating_sub(accounted(row.size_bytes));
            used.files = used.files.saturating_sub(1);
        }
        Ok(())
    }

    /// Delete the files a deleted session referenced (attached to its messages, delivered by
    /// its tools) that no message or tool result of another session references. Call it once the
    /// session's log is deleted. The ids deleted.
    pub async fn delete_unreferenced(
        &self,
        owner: Option<&str>,
        ids: Vec<String>,
    ) -> Result<Vec<String>, FileError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let still = self.store.files_referenced(ids.clone()).await?;
        let mut deleted = Vec::new();
        for id in ids.into_iter().filter(|id| !still.contains(id)) {
            match self.delete(owner, &id).await {
                Ok(()) => deleted.push(id),
                Err(FileError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// Open a file's bytes.
    pub async fn open_blob(&self, row: &FileRow) -> Result<Blob, FileError> {
        self.open_blob_at(row, 0).await
    }

    /// Open a file's bytes from `start` on (a `Range` request).
    pub async fn open_blob_at(&self, row: &FileRow, start: u64) -> Result<Blob, FileError> {
        if let Some(db) = self.store.blob_db() {
            let len = row.size_bytes.saturating_sub(start);
            let chunks = db.blob_bytes(&row.sha256, start, len).await?;
            return Ok(Box::new(tokio_util::io::StreamReader::new(chunks)));
        }
        let mut file = tokio::fs::File::open(self.blob(&row.sha256)).await?;
        if start > 0 {
            file.seek(std::io::SeekFrom::Start(start)).await?;
        }
        Ok(Box::new(file))
    }

    /// Copy stored files into a folder (a session's workspace), each under a name not taken yet
    /// (`report (2).csv` beside `report.csv`); the names used, in order. The folder is listed
    /// once, so the names are found in linear time however many share one. On an error, the
    /// copies made so far are removed.
    pub async fn copy_all_into(
        &self,
        rows: &[FileRow],
        dir: &Path,
    ) -> Result<Vec<String>, FileError> {
        tokio::fs::create_dir_all(dir).await?;
        let mut taken = HashSet::new();
        let mut entries = tokio::fs::read_dir(dir).await?;
        while let Some(e) = entries.next_entry().await? {
            taken.insert(e.file_name().to_string_lossy().into_owned());
        }
        let mut next = HashMap::new();
        let mut names: Vec<String> = Vec::with_capacity(rows.len());
        let result: Result<(), FileError> = async {
            for row in rows {
                loop {
                    let name = free_name(&row.filename, &taken, &mut next);
                    taken.insert(name.clone());
                    match tokio::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(dir.join(&name))
                        .await
                    {
                        Ok(mut out) => {
                            names.push(name);
                            let mut src = self.open_blob(row).await?;
                            tokio::io::copy(&mut src, &mut out).await?;
                            break;
                        }
                        // Made meanwhile by a tool: try the next name.
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            for name in &names {
                let _ = tokio::fs::remove_file(dir.join(name)).await;
            }
            return Err(e);
        }
        Ok(names)
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
mod tests;
