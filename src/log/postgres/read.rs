//! The PostgreSQL backend's reads: the log by cursor, the session table and file records.
//! Each runs on the store's runtime with a pooled connection (statements prepared once per
//! connection).

use std::collections::HashSet;

use deadpool_postgres::Pool;

use crate::log::backend::file_ids_in;
use crate::log::{Event, FileRow, FileUsage, Owners, SessionRow, StoreError};

/// A session's events with `seq > after_seq`, at most `limit`, in order.
pub(super) async fn events(
    pool: Pool,
    sid: String,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Event>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT seq, json FROM events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = c.query(&stmt, &[&sid, &(after_seq as i64), &limit]).await?;
    rows.iter()
        .map(|r| {
            let seq: i64 = r.get(0);
            Event::parse(seq as u64, r.get(1))
                .map_err(|e| StoreError::Corrupt(format!("{sid} #{seq}: {e}")))
        })
        .collect()
}

/// The turn of the session's last event unless that event ended it: one row from the end of
/// the primary key.
pub(super) async fn open_turn_id(pool: Pool, sid: String) -> Result<Option<String>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT last.turn_id FROM (SELECT turn_id, type FROM events WHERE session_id = $1
                                       ORDER BY seq DESC LIMIT 1) last
              WHERE last.type NOT IN ('turn.completed', 'turn.failed', 'turn.cancelled')",
        )
        .await?;
    Ok(c.query_opt(&stmt, &[&sid]).await?.map(|r| r.get(0)))
}

/// The `seq` of the event with this id in this session.
pub(super) async fn seq_of(
    pool: Pool,
    sid: String,
    eid: String,
) -> Result<Option<u64>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached("SELECT seq FROM events WHERE session_id = $1 AND id = $2")
        .await?;
    Ok(c.query_opt(&stmt, &[&sid, &eid])
        .await?
        .map(|r| r.get::<_, i64>(0) as u64))
}

/// Sessions whose last event is not terminal: turns a previous process left running. Not
/// those whose lease another live instance holds: that one is running them.
pub(super) async fn unfinished_sessions(
    pool: Pool,
    instance: String,
) -> Result<Vec<String>, StoreError> {
    let c = pool.get().await?;
    let rows = c
        .query(
            "SELECT s.id FROM sessions s
               JOIN LATERAL (SELECT type FROM events e WHERE e.session_id = s.id
                              ORDER BY seq DESC LIMIT 1) last ON true
              WHERE last.type NOT IN ('turn.completed', 'turn.failed', 'turn.cancelled')
                AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.session_id = s.id
                                   AND l.holder <> $1 AND l.expires_at > now())",
            &[&instance],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// For each session, whether its last event is a `turn.completed` with `stop_reason: tool_use`.
pub(super) async fn awaiting_client(pool: Pool, ids: Vec<String>) -> Result<Vec<bool>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT type, json FROM events WHERE session_id = $1 ORDER BY seq DESC LIMIT 1",
        )
        .await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in &ids {
        let last = c.query_opt(&stmt, &[id]).await?;
        out.push(last.is_some_and(|r| {
            r.get::<_, &str>(0) == "turn.completed"
                && serde_json::from_str::<serde_json::Value>(r.get(1))
                    .is_ok_and(|v| v["stop_reason"] == "tool_use")
        }));
    }
    Ok(out)
}

fn row_to_session(r: &tokio_postgres::Row) -> SessionRow {
    SessionRow {
        id: r.get(0),
        owner: r.get(1),
        created_at: r.get(2),
        record: r.get(3),
    }
}

/// One session row.
pub(super) async fn session(pool: Pool, id: String) -> Result<Option<SessionRow>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached("SELECT id, owner, created_at, record FROM sessions WHERE id = $1")
        .await?;
    Ok(c.query_opt(&stmt, &[&id])
        .await?
        .as_ref()
        .map(row_to_session))
}

/// The sessions of `owners` in id order after `after` (exclusive), at most `limit`.
pub(super) async fn list_sessions(
    pool: Pool,
    owners: Owners,
    after: String,
    limit: usize,
) -> Result<Vec<SessionRow>, StoreError> {
    let c = pool.get().await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = match owners {
        Owners::One(owner) => {
            let stmt = c
                .prepare_cached(
                    "SELECT id, owner, created_at, record FROM sessions
                      WHERE id > $1 AND owner IS NOT DISTINCT FROM $2 ORDER BY id LIMIT $3",
                )
                .await?;
            c.query(&stmt, &[&after, &owner, &limit]).await?
        }
        Owners::Every => {
            let stmt = c
                .prepare_cached(
                    "SELECT id, owner, created_at, record FROM sessions
                      WHERE id > $1 ORDER BY id LIMIT $2",
                )
                .await?;
            c.query(&stmt, &[&after, &limit]).await?
        }
    };
    Ok(rows.iter().map(row_to_session).collect())
}

/// How many sessions an owner has.
pub(super) async fn count_sessions(pool: Pool, owner: Option<String>) -> Result<usize, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached("SELECT COUNT(*) FROM sessions WHERE owner IS NOT DISTINCT FROM $1")
        .await?;
    Ok(c.query_one(&stmt, &[&owner]).await?.get::<_, i64>(0) as usize)
}

/// A file's metadata.
pub(super) async fn file(pool: Pool, id: String) -> Result<Option<FileRow>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT id, owner, filename, mime_type, size_bytes, sha256, created_at
               FROM files WHERE id = $1",
        )
        .await?;
    Ok(c.query_opt(&stmt, &[&id]).await?.map(|r| FileRow {
        id: r.get(0),
        owner: r.get(1),
        filename: r.get(2),
        mime_type: r.get(3),
        size_bytes: r.get::<_, i64>(4).max(0) as u64,
        sha256: r.get(5),
        created_at: r.get(6),
    }))
}

/// How many files this owner has stored, and their bytes, each counted as at least `min_bytes`.
pub(super) async fn file_usage_of(
    pool: Pool,
    owner: Option<String>,
    min_bytes: u64,
) -> Result<FileUsage, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT COUNT(*)::int8, COALESCE(SUM(GREATEST(size_bytes, $2)), 0)::int8 FROM files
              WHERE owner IS NOT DISTINCT FROM $1",
        )
        .await?;
    let min = i64::try_from(min_bytes).unwrap_or(i64::MAX);
    let row = c.query_one(&stmt, &[&owner, &min]).await?;
    Ok(FileUsage {
        files: row.get::<_, i64>(0).max(0) as u64,
        bytes: row.get::<_, i64>(1).max(0) as u64,
    })
}

/// Whether a file record names the blob with this SHA-256.
pub(super) async fn blob_in_use(pool: Pool, sha: String) -> Result<bool, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM files WHERE sha256 = $1)")
        .await?;
    Ok(c.query_one(&stmt, &[&sha]).await?.get(0))
}

/// The events that may carry files: user messages and tool results with a non-empty `files`.
const WITH_FILES: &str = "type IN ('user.message', 'agent.tool_result')
     AND strpos(json, '\"files\":[{') > 0";

/// The ids of the files a session's log references, in order of first mention.
pub(super) async fn session_file_ids(pool: Pool, sid: String) -> Result<Vec<String>, StoreError> {
    let c = pool.get().await?;
    let rows = c
        .query(
            &format!("SELECT json FROM events WHERE session_id = $1 AND {WITH_FILES} ORDER BY seq"),
            &[&sid],
        )
        .await?;
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    for r in &rows {
        for id in file_ids_in(r.get(0)) {
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// Which of these file ids a stored user message or tool result (of any session) references.
pub(super) async fn files_referenced(
    pool: Pool,
    ids: Vec<String>,
) -> Result<HashSet<String>, StoreError> {
    let c = pool.get().await?;
    let mut found = HashSet::new();
    for id in &ids {
        // A cheap text match narrows the rows; the parse confirms the id is in `files`.
        let rows = c
            .query(
                &format!("SELECT json FROM events WHERE {WITH_FILES} AND strpos(json, $1) > 0"),
                &[id],
            )
            .await?;
        if rows.iter().any(|r| file_ids_in(r.get(0)).contains(id)) {
            found.insert(id.clone());
        }
    }
    Ok(found)
}
