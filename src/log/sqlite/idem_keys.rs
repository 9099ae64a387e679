//! The SQLite backend's `Idempotency-Key` rows (AAP turn requests): written in the group
//! commit with the turn's first event, read back by a repeat the memory does not know (after a
//! restart, or once its session left memory). One process: its memory reserves a key, so the
//! store is only looked at.

use rusqlite::{params, Connection, OptionalExtension};

use crate::log::rows::{KeyReserved, KeyRow, PURGE_KEYS_AT_MOST};
use crate::log::StoreError;

/// Insert or replace a key's row (in a commit).
pub(super) fn put(tx: &Connection, k: &KeyRow) -> rusqlite::Result<()> {
    let (turn_id, after_seq) = match &k.started {
        Some((t, a)) => (Some(t.as_str()), Some(*a as i64)),
        None => (None, None),
    };
    tx.prepare_cached(
        "INSERT INTO idempotency_keys (session_id, key, fingerprint, turn_id, after_seq, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (session_id, key) DO UPDATE SET fingerprint = excluded.fingerprint,
             turn_id = excluded.turn_id, after_seq = excluded.after_seq,
             created_at = excluded.created_at",
    )?
    .execute(params![
        k.session_id,
        k.key,
        k.fingerprint,
        turn_id,
        after_seq,
        k.created_at_ms
    ])?;
    Ok(())
}

/// Delete the oldest keys created before `before_ms`, a bounded number (in a commit).
pub(super) fn purge(tx: &Connection, before_ms: i64) -> rusqlite::Result<()> {
    let n = tx
        .prepare_cached(
            "DELETE FROM idempotency_keys WHERE rowid IN
                 (SELECT rowid FROM idempotency_keys WHERE created_at < ?1 LIMIT ?2)",
        )?
        .execute(params![before_ms, PURGE_KEYS_AT_MOST])?;
    if n > 0 {
        tracing::debug!(keys = n, "store: expired idempotency keys purged");
    }
    Ok(())
}

/// The key's row if it was created at or after `not_before_ms`; otherwise the key is free
/// (this process's memory holds the reservation).
pub(super) fn reserve(
    c: &Connection,
    row: &KeyRow,
    not_before_ms: i64,
) -> Result<KeyReserved, StoreError> {
    let found = c
        .prepare_cached(
            "SELECT fingerprint, turn_id, after_seq, created_at FROM idempotency_keys
             WHERE session_id = ?1 AND key = ?2 AND created_at >= ?3",
        )?
        .query_row(params![row.session_id, row.key, not_before_ms], |r| {
            let turn_id: Option<String> = r.get(1)?;
            let after_seq: Option<i64> = r.get(2)?;
            Ok(KeyRow {
                session_id: row.session_id.clone(),
                key: row.key.clone(),
                fingerprint: r.get(0)?,
                started: turn_id.zip(after_seq.map(|a| a as u64)),
                created_at_ms: r.get(3)?,
            })
        })
        .optional()?;
    Ok(match found {
        Some(k) => KeyReserved::Taken(k),
        None => KeyReserved::New { in_store: false },
    })
}
