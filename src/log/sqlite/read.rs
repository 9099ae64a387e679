//! The SQLite backend's reads of the log and the session table: plain functions over the
//! reader connection (the backend runs them on a blocking thread, see `SqliteStore::read`).

use rusqlite::{params, Connection, OptionalExtension};

use crate::log::{Event, InboxRow, Owners, SessionRow, StoreError};

/// A session's events with `seq > after_seq`, at most `limit`, in order.
pub(super) fn events(
    c: &Connection,
    sid: &str,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Event>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, json FROM events WHERE session_id = ?1 AND seq > ?2
         ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![sid, after_seq as i64, limit as i64], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, json) = row?;
        out.push(
            Event::parse(seq as u64, &json)
                .map_err(|e| StoreError::Corrupt(format!("{sid} #{seq}: {e}")))?,
        );
    }
    Ok(out)
}

/// The turn of the session's last event, unless that event ended it: one row from the end of
/// the `(session_id, seq)` index.
pub(super) fn open_turn_id(c: &Connection, sid: &str) -> Result<Option<String>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT turn_id FROM events WHERE session_id = ?1
            AND seq = (SELECT max(seq) FROM events WHERE session_id = ?1)
            AND type NOT IN ('turn.completed', 'turn.failed', 'turn.cancelled')",
    )?
    .query_row(params![sid], |r| r.get(0))
    .optional()?)
}

/// The `seq` of the event with this id in this session.
///
/// Event ids sort in creation order within a session, as seqs do, so this bisects the
/// session's seqs on the primary key: about log2(events) point reads, no index to keep.
pub(super) fn seq_of(c: &Connection, sid: &str, eid: &str) -> Result<Option<u64>, StoreError> {
    let id_at = |seq: i64| -> rusqlite::Result<Option<String>> {
        c.prepare_cached("SELECT id FROM events WHERE session_id = ?1 AND seq = ?2")?
            .query_row(params![sid, seq], |r| r.get(0))
            .optional()
    };
    let bounds: Option<(i64, i64)> = c
        .prepare_cached(
            "SELECT MIN(seq), MAX(seq) FROM events WHERE session_id = ?1 HAVING COUNT(*) > 0",
        )?
        .query_row(params![sid], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((mut lo, mut hi)) = bounds else {
        return Ok(None);
    };
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        let Some(id) = id_at(mid)? else {
            // A hole (a commit that failed): scan the session instead.
            return Ok(c
                .query_row(
                    "SELECT seq FROM events WHERE session_id = ?1 AND id = ?2",
                    params![sid, eid],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?
                .map(|s| s as u64));
        };
        match id.as_str().cmp(eid) {
            std::cmp::Ordering::Equal => return Ok(Some(mid as u64)),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid - 1,
        }
    }
    Ok(None)
}

/// Sessions with turns accepted but not begun (rows in the inbox), in the order of their first.
pub(super) fn inbox_sessions(c: &Connection) -> Result<Vec<String>, StoreError> {
    let mut stmt =
        c.prepare("SELECT session_id FROM inbox GROUP BY session_id ORDER BY MIN(seq)")?;
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ids)
}

/// A session's rows in the inbox, in order.
pub(super) fn inbox_rows(c: &Connection, session_id: &str) -> Result<Vec<InboxRow>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, kind, body, turn_id FROM inbox WHERE session_id = ?1 ORDER BY seq",
    )?;
    let rows = stmt
        .query_map([session_id], |r| {
            Ok(InboxRow {
                seq: r.get(0)?,
                kind: r.get(1)?,
                body: r.get(2)?,
                turn_id: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Sessions whose last event is not a terminal one: turns that were running when the
/// process stopped.
pub(super) fn unfinished_sessions(c: &Connection) -> Result<Vec<String>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT s.id FROM sessions s JOIN events e
           ON e.session_id = s.id
          AND e.seq = (SELECT MAX(seq) FROM events WHERE session_id = s.id)
         WHERE e.type NOT IN ('turn.completed', 'turn.failed', 'turn.cancelled')",
    )?;
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ids)
}

/// For each session, whether its last turn stopped for the client (its last event is a
/// `turn.completed` with `stop_reason: tool_use`): one point read per session, its last
/// event only (`GET /sessions` reads nothing else of a session's log).
pub(super) fn awaiting_client(c: &Connection, ids: &[String]) -> Result<Vec<bool>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT type, json FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1",
    )?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let last: Option<(String, String)> = stmt
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        out.push(last.is_some_and(|(kind, json)| {
            kind == "turn.completed"
                && serde_json::from_str::<serde_json::Value>(&json)
                    .is_ok_and(|v| v["stop_reason"] == "tool_use")
        }));
    }
    Ok(out)
}

/// One session row.
pub(super) fn session(c: &Connection, id: &str) -> Result<Option<SessionRow>, StoreError> {
    Ok(c.query_row(
        "SELECT id, owner, created_at, record FROM sessions WHERE id = ?1",
        params![id],
        row_to_session,
    )
    .optional()?)
}

/// Sessions in creation order after `after` (exclusive), at most `limit`, of `owners`.
pub(super) fn list_sessions(
    c: &Connection,
    owners: &Owners,
    after: &str,
    limit: usize,
) -> Result<Vec<SessionRow>, StoreError> {
    let rows = match owners {
        Owners::One(owner) => c
            .prepare_cached(
                "SELECT id, owner, created_at, record FROM sessions
                 WHERE id > ?1 AND owner IS ?2 ORDER BY id LIMIT ?3",
            )?
            .query_map(params![after, owner, limit as i64], row_to_session)?
            .collect::<Result<Vec<_>, _>>()?,
        Owners::Every => c
            .prepare_cached(
                "SELECT id, owner, created_at, record FROM sessions
                 WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?
            .query_map(params![after, limit as i64], row_to_session)?
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(rows)
}

/// How many sessions an owner has (`None`: the sessions of a server without keys).
pub(super) fn count_sessions(c: &Connection, owner: Option<&str>) -> Result<usize, StoreError> {
    let n: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM sessions WHERE owner IS ?1")?
        .query_row(params![owner], |r| r.get(0))?;
    Ok(n as usize)
}

fn row_to_session(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get(0)?,
        owner: r.get(1)?,
        created_at: r.get(2)?,
        record: r.get(3)?,
    })
}
