//! The PostgreSQL backend's `Idempotency-Key` rows (AAP turn requests), shared by the
//! instances: a first request reserves its key with one `INSERT ... ON CONFLICT` (so that two
//! instances given the same key at once cannot both start a turn), and its turn's row replaces
//! the reservation in the group commit that holds the turn's first event (`commit.rs`).
//!
//! The reservation is a transaction of its own with `synchronous_commit = off`, pipelined in
//! one round trip (`BEGIN`, the insert, `COMMIT`): it is visible to the other instances at
//! once, and needs no WAL flush, because losing it in a crash of the database loses nothing
//! (the row that matters, the started turn's, is written durably with the turn's events).

use deadpool_postgres::Pool;
use futures_util::future::join3;

use crate::log::rows::{KeyReserved, KeyRow};
use crate::log::StoreError;

/// A reservation older than this whose turn never started (its instance died meanwhile) is
/// taken over by the next request with its key.
const STALE_RESERVATION_MS: i64 = 60_000;

/// Tries of reserve-then-read when the row goes away in between (released meanwhile).
const TRIES: usize = 3;

/// Insert a reservation, or take over a row past its 24 h (`$5`) or a stale reservation
/// (`$6`); a row back when the key is this request's.
const RESERVE: &str =
    "INSERT INTO idempotency_keys (session_id, key, fingerprint, turn_id, after_seq, created_at)
     VALUES ($1, $2, $3, NULL, NULL, $4)
     ON CONFLICT (session_id, key) DO UPDATE SET fingerprint = excluded.fingerprint,
         turn_id = NULL, after_seq = NULL, created_at = excluded.created_at
     WHERE idempotency_keys.created_at < $5
        OR (idempotency_keys.turn_id IS NULL AND idempotency_keys.created_at < $6)
     RETURNING 1";
const FIND: &str = "SELECT fingerprint, turn_id, after_seq, created_at FROM idempotency_keys
     WHERE session_id = $1 AND key = $2";
const RELEASE: &str = "DELETE FROM idempotency_keys
     WHERE session_id = $1 AND key = $2 AND created_at = $3 AND turn_id IS NULL";

/// Reserve the key for this request, or the row of the request that has it (created at or
/// after `not_before_ms`).
pub(super) async fn reserve(
    pool: Pool,
    row: KeyRow,
    not_before_ms: i64,
) -> Result<KeyReserved, StoreError> {
    let c = pool.get().await?;
    let reserve = c.prepare_cached(RESERVE).await?;
    let find = c.prepare_cached(FIND).await?;
    let stale = row.created_at_ms - STALE_RESERVATION_MS;
    for _ in 0..TRIES {
        // Polled in order, so sent in order: one round trip.
        let (begin, inserted, commit) = join3(
            c.batch_execute("BEGIN; SET LOCAL synchronous_commit TO off"),
            c.query_opt(
                &reserve,
                &[
                    &row.session_id,
                    &row.key,
                    &row.fingerprint,
                    &row.created_at_ms,
                    &not_before_ms,
                    &stale,
                ],
            ),
            c.batch_execute("COMMIT"),
        )
        .await;
        begin?;
        let inserted = inserted?;
        commit?;
        if inserted.is_some() {
            return Ok(KeyReserved::New { in_store: true });
        }
        let found = c.query_opt(&find, &[&row.session_id, &row.key]).await?;
        let Some(r) = found else { continue };
        let created_at_ms: i64 = r.get(3);
        if created_at_ms < not_before_ms {
            continue;
        }
        let turn_id: Option<String> = r.get(1);
        let after_seq: Option<i64> = r.get(2);
        return Ok(KeyReserved::Taken(KeyRow {
            session_id: row.session_id,
            key: row.key,
            fingerprint: r.get(0),
            started: turn_id.zip(after_seq.map(|a| a as u64)),
            created_at_ms,
        }));
    }
    Err(StoreError::Postgres(format!(
        "idempotency key {:?} changed hands {TRIES} times while being reserved",
        row.key
    )))
}

/// Give back this request's reservation (`row`, as reserved), if its turn never started.
pub(super) async fn release(pool: Pool, row: KeyRow) -> Result<(), StoreError> {
    let c = pool.get().await?;
    let stmt = c.prepare_cached(RELEASE).await?;
    c.execute(&stmt, &[&row.session_id, &row.key, &row.created_at_ms])
        .await?;
    Ok(())
}
