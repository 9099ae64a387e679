//! The SQLite backend's reads of file records, and of the events that reference files.

use std::collections::HashSet;

use rusqlite::{params, Connection, OptionalExtension};

use crate::log::{FileRow, FileUsage, StoreError};

/// A file's metadata.
pub(super) fn file(c: &Connection, id: &str) -> Result<Option<FileRow>, StoreError> {
    Ok(c
        .query_row(
            "SELECT id, owner, filename, mime_type, size_bytes, sha256, created_at FROM files WHERE id = ?1",
            params![id],
            |r| {
                Ok(FileRow {
                    id: r.get(0)?,
                    owner: r.get(1)?,
                    filename: r.get(2)?,
                    mime_type: r.get(3)?,
                    size_bytes: r.get::<_, i64>(4)? as u64,
                    sha256: r.get(5)?,
                    created_at: r.get(6)?,
                })
            },
        )
        .optional()?)
}

/// Bytes of the stored files of this owner (`None`: files made without an API key).
pub(super) fn file_usage_of(
    c: &Connection,
    owner: Option<&str>,
    min_bytes: u64,
) -> Result<FileUsage, StoreError> {
    let min = i64::try_from(min_bytes).unwrap_or(i64::MAX);
    let (files, bytes): (i64, i64) = c.query_row(
        "SELECT COUNT(*), COALESCE(SUM(MAX(size_bytes, ?2)), 0) FROM files WHERE owner IS ?1",
        params![owner, min],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(FileUsage {
        files: files.max(0) as u64,
        bytes: bytes.max(0) as u64,
    })
}

/// Whether a file record names the blob with this SHA-256.
pub(super) fn blob_in_use(c: &Connection, sha256: &str) -> Result<bool, StoreError> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM files WHERE sha256 = ?1)",
        params![sha256],
        |r| r.get(0),
    )?)
}

/// The ids of the files a session's log references: attached to its user messages or
/// delivered in its tool results, in order of first mention.
pub(super) fn session_file_ids(c: &Connection, sid: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT json FROM events WHERE session_id = ?1
           AND type IN ('user.message', 'agent.tool_result') AND instr(json, '\"files\":[{') > 0
         ORDER BY seq",
    )?;
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    let mut rows = stmt.query(params![sid])?;
    while let Some(row) = rows.next()? {
        let json: String = row.get(0)?;
        for id in crate::log::backend::file_ids_in(&json) {
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// Which of these file ids a stored user message or tool result (of any session) references.
/// One scan over the events that carry files, however many ids.
pub(super) fn files_referenced(
    c: &Connection,
    ids: &[String],
) -> Result<HashSet<String>, StoreError> {
    let mut found = HashSet::new();
    let mut stmt = c.prepare(
        "SELECT json FROM events
          WHERE type IN ('user.message', 'agent.tool_result') AND instr(json, '\"files\":[{') > 0",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let json: String = row.get(0)?;
        let quick: Vec<&String> = ids
            .iter()
            .filter(|id| !found.contains(*id) && json.contains(id.as_str()))
            .collect();
        if quick.is_empty() {
            continue;
        }
        let named = crate::log::backend::file_ids_in(&json);
        for id in quick {
            if named.contains(id) {
                found.insert(id.clone());
            }
        }
        if found.len() == ids.len() {
            break;
        }
    }
    Ok(found)
}
