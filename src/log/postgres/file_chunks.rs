//! Stored files' bytes in the database, so that a file uploaded on one instance downloads on
//! any: `file_chunks` holds each blob (named by its SHA-256, as on disk with SQLite) as rows of
//! [`CHUNK_BYTES`] (`bytea` stored uncompressed, so that a range reads only the pages it
//! needs). Bytes go in and out one chunk at a time: memory stays a few chunks whatever the
//! file's size.
//!
//! Records share blobs (same bytes, one blob), across instances: a blob is written, or
//! deleted, under a PostgreSQL advisory lock on its SHA-256 ([`BlobLock`]), held by the
//! instance until the commit of the record that names it (or its removal). So a blob is never
//! deleted while another instance records a file of the same bytes, wherever it runs.
//!
//! Also here: the database's size for `/status` ([`PgStore::db_bytes`]).

use std::io;

use bytes::Bytes;
use deadpool_postgres::Object;
use tokio::io::AsyncReadExt;

use super::pg_store::PgStore;
use crate::log::StoreError;

/// Bytes per chunk row.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;

/// The tables turnstile makes (its size in `/status` is theirs, indexes and TOAST included).
const TABLES: &[&str] = &[
    "turnstile_schema",
    "sessions",
    "events",
    "files",
    "leases",
    "inbox",
    "file_chunks",
    "delta_watchers",
];

/// A blob's bytes as they are read from the database, one chunk at a time.
pub(crate) type ChunkStream = futures_util::stream::BoxStream<'static, io::Result<Bytes>>;

/// The advisory lock of one blob, on a connection of its own, until [`BlobLock::release`]
/// (or, dropped without it, until that connection is closed).
pub(crate) struct BlobLock {
    conn: Option<Object>,
    key: i64,
    sha256: String,
}

impl PgStore {
    /// Wait for, and take, the lock of the blob with this SHA-256 (see the module
    /// documentation).
    pub(crate) async fn lock_blob(&self, sha256: &str) -> Result<BlobLock, StoreError> {
        let sha = sha256.to_string();
        self.run(move |pool| async move {
            let c = pool.get().await?;
            let key: i64 = c
                .query_one("SELECT hashtextextended($1, 0)", &[&sha])
                .await?
                .get(0);
            c.execute("SELECT pg_advisory_lock($1)", &[&key]).await?;
            Ok(BlobLock {
                conn: Some(c),
                key,
                sha256: sha,
            })
        })
        .await
    }

    /// A blob's bytes from `start`, `len` of them; an error (`NotFound`) if the blob is not
    /// there. Reads one chunk ahead of the reader, on the store's runtime.
    pub(crate) async fn blob_bytes(
        &self,
        sha256: &str,
        start: u64,
        len: u64,
    ) -> Result<ChunkStream, io::Error> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(1);
        let pool = self.shared.pool.clone();
        let sha = sha256.to_string();
        self.shared
            .rt
            .handle()
            .spawn(produce(pool, sha, start, len, tx));
        // The first chunk before the answer: a missing blob is an error, not a short body.
        let first = rx
            .recv()
            .await
            .unwrap_or_else(|| Err(io::Error::other("the store's reader ended early")))?;
        let rest = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        use futures_util::StreamExt;
        Ok(futures_util::stream::iter([Ok(first)]).chain(rest).boxed())
    }

    /// The bytes of turnstile's tables (with their indexes and TOAST): what the store takes
    /// in the database, and not what else shares it (`pg_database_size` would count other
    /// applications' tables and the system catalogs, some 7 MB on an empty database).
    pub(crate) async fn db_bytes(&self) -> Result<u64, StoreError> {
        self.run(|pool| async move {
            let c = pool.get().await?;
            let tables: Vec<&str> = TABLES.to_vec();
            let n: i64 = c
                .query_one(
                    "SELECT coalesce(sum(pg_total_relation_size(r)), 0)::int8
                       FROM unnest($1::text[]) AS t(name), to_regclass(t.name) AS r
                      WHERE r IS NOT NULL",
                    &[&tables],
                )
                .await?
                .get(0);
            Ok(n.max(0) as u64)
        })
        .await
    }
}

/// Reads the chunks of `sha` covering `start..start + len` into `tx`, one at a time.
async fn produce(
    pool: deadpool_postgres::Pool,
    sha: String,
    start: u64,
    len: u64,
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
) {
    let read = async {
        let c = pool.get().await.map_err(io::Error::other)?;
        let stmt = c
            .prepare_cached(
                "SELECT substring(data FROM $3 FOR $4) FROM file_chunks
                  WHERE sha256 = $1 AND n = $2",
            )
            .await
            .map_err(io::Error::other)?;
        let (mut n, mut off, mut left) = (start / CHUNK_BYTES, start % CHUNK_BYTES, len);
        loop {
            let want = left.min(CHUNK_BYTES - off);
            let row = c
                .query_opt(
                    &stmt,
                    &[&sha, &(n as i32), &(off as i32 + 1), &(want as i32)],
                )
                .await
                .map_err(io::Error::other)?;
            let Some(row) = row else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("chunk {n} of blob {sha} is not in the store"),
                ));
            };
            let bytes: Vec<u8> = row.get(0);
            if bytes.len() as u64 != want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("chunk {n} of blob {sha} is short"),
                ));
            }
            if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                return Ok(()); // the reader has gone
            }
            left -= want;
            if left == 0 {
                return Ok(());
            }
            n += 1;
            off = 0;
        }
    };
    if let Err(e) = read.await {
        let _ = tx.send(Err(e)).await;
    }
}

impl BlobLock {
    #[expect(
        clippy::expect_used,
        reason = "the connection is taken only by release(self)"
    )]
    fn conn(&self) -> &Object {
        self.conn.as_ref().expect("held until released")
    }

    /// Whether the blob is in the store.
    pub(crate) async fn exists(&self) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_opt(
                "SELECT 1 FROM file_chunks WHERE sha256 = $1 AND n = 0",
                &[&self.sha256],
            )
            .await?
            .is_some())
    }

    /// Write the blob from the file at `path`, chunk by chunk, in one transaction (a blob is
    /// there whole or not at all). A file of no bytes has one empty chunk.
    pub(crate) async fn put_from(&self, path: &std::path::Path) -> Result<(), StoreError> {
        let io_err = |e: io::Error| StoreError::WriteFailed(format!("reading the upload: {e}"));
        let mut file = tokio::fs::File::open(path).await.map_err(io_err)?;
        let c = self.conn();
        c.batch_execute("BEGIN").await?;
        let written = async {
            let stmt = c
                .prepare_cached(
                    "INSERT INTO file_chunks (sha256, n, data) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .await?;
            let mut buf = Vec::with_capacity(CHUNK_BYTES as usize);
            for n in 0i32.. {
                buf.clear();
                (&mut file)
                    .take(CHUNK_BYTES)
                    .read_to_end(&mut buf)
                    .await
                    .map_err(io_err)?;
                if buf.is_empty() && n > 0 {
                    break;
                }
                c.execute(&stmt, &[&self.sha256, &n, &buf]).await?;
                if (buf.len() as u64) < CHUNK_BYTES {
                    break;
                }
            }
            c.batch_execute("COMMIT").await?;
            Ok::<_, StoreError>(())
        }
        .await;
        if written.is_err() && !c.is_closed() {
            let _ = c.batch_execute("ROLLBACK").await;
        }
        written
    }

    /// Delete the blob.
    pub(crate) async fn delete(&self) -> Result<(), StoreError> {
        self.conn()
            .execute("DELETE FROM file_chunks WHERE sha256 = $1", &[&self.sha256])
            .await?;
        Ok(())
    }

    /// Let go of the lock (the connection goes back to the pool).
    pub(crate) async fn release(mut self) {
        let Some(c) = self.conn.take() else { return };
        if c.execute("SELECT pg_advisory_unlock($1)", &[&self.key])
            .await
            .is_err()
        {
            // Not known to be unlocked: the connection is closed instead, which unlocks it.
            drop(Object::take(c));
        }
    }
}

impl Drop for BlobLock {
    fn drop(&mut self) {
        // Dropped without `release` (a request cut short): close the connection, which
        // releases its lock, rather than pool it locked.
        if let Some(c) = self.conn.take() {
            drop(Object::take(c));
        }
    }
}
