//! The SQLite schema, its migrations and how a connection is opened.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use crate::log::StoreError;

/// Schema version 5 (`PRAGMA user_version`), reached one step per version ([`STEPS`]).
///
/// 2: events sit in a rowid table in the order they were written, so a commit appends to its
/// last page; `(session_id, seq)` is a small index beside it. Version 1 kept events in a
/// `WITHOUT ROWID` table keyed by `(session_id, seq)`, whose large rows split pages on most
/// commits (several pages written per commit); it is migrated on open.
/// 3: the `Idempotency-Key`s of AAP turn requests (`idempotency_keys`, kept 24 h).
/// 4: the inbox: the turns accepted but not begun (`WriteOp::InboxPut`), carried out at the
/// next start if the process stops before they begin.
/// 5: usage, a row per principal, UTC day, agent, upstream and model (`usage.rs`).
/// 6: a commit's usage rides on its last event (`events.usage`), folded into `usage` later
/// (`usage_fold` marks how far): no page of its own in every commit.
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    owner TEXT,
    created_at TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    n INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    type TEXT NOT NULL,
    json TEXT NOT NULL
);
-- No index on (session_id, id): ids sort like seqs within a session, so `seq_of` finds an id by
-- bisection on this one, and every commit writes one page less.
CREATE UNIQUE INDEX IF NOT EXISTS events_by_seq ON events (session_id, seq);
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    owner TEXT,
    filename TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL
);
";

/// The migration steps: step `i` brings the schema from version `i + 1` to `i + 2` (a fresh
/// store starts at step 0, which makes the version 2 schema). Each is one function.
const STEPS: &[fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>] =
    &[to_v2, to_v3, to_v4, to_v5, to_v6];

/// Bring a store of an older schema to [`SCHEMA_VERSION`], in one transaction.
pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction()?;
    // Versions 0 (a new file) and 1 both take the step to 2.
    for step in STEPS.iter().skip((version - 1).max(0) as usize) {
        step(&tx)?;
    }
    tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
    tx.commit()
}

/// 2: the base schema; version 1's `WITHOUT ROWID` events moved into the rowid table.
fn to_v2(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let old_events: Option<String> = tx
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if old_events.is_some_and(|sql| sql.contains("WITHOUT ROWID")) {
        tx.execute_batch(
            "ALTER TABLE events RENAME TO events_v1;
             DROP INDEX IF EXISTS events_by_id;",
        )?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(
            "INSERT INTO events (session_id, seq, id, turn_id, type, json)
                 SELECT session_id, seq, id, turn_id, type, json FROM events_v1
                 ORDER BY session_id, seq;
             DROP TABLE events_v1;",
        )
    } else {
        tx.execute_batch(SCHEMA)
    }
}

/// 3: each session's `Idempotency-Key`s (AAP turn requests): the body's SHA-256 and the turn
/// its first request started (the events of `turn_id` come after `after_seq`); `created_at` in
/// ms since the Unix epoch, indexed for the purge of keys past 24 h.
fn to_v3(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS idempotency_keys (
             session_id TEXT NOT NULL,
             key TEXT NOT NULL,
             fingerprint TEXT NOT NULL,
             turn_id TEXT,
             after_seq INTEGER,
             created_at INTEGER NOT NULL,
             PRIMARY KEY (session_id, key)
         );
         CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (created_at);",
    )
}

/// 4: the inbox: a row per turn accepted but not begun (queued), removed by the commit that
/// holds the turn's `user.message`; rows left by a process that stopped are carried out at start.
fn to_v4(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS inbox (
             seq INTEGER PRIMARY KEY AUTOINCREMENT,
             session_id TEXT NOT NULL,
             kind TEXT NOT NULL,
             body TEXT NOT NULL,
             turn_id TEXT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS inbox_by_session ON inbox (session_id, turn_id);",
    )
}

/// 5: usage (`crate::usage`): counts added to by each model and tool call, by principal (owner
/// id, empty without keys), UTC day, agent, upstream and model; read by owner and day range.
/// Upserted into from the usage that rides on events (version 6).
fn to_v5(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS usage (
             owner TEXT NOT NULL,
             day TEXT NOT NULL,
             agent TEXT NOT NULL,
             upstream TEXT NOT NULL,
             model TEXT NOT NULL,
             input_tokens INTEGER NOT NULL DEFAULT 0,
             output_tokens INTEGER NOT NULL DEFAULT 0,
             cached_tokens INTEGER NOT NULL DEFAULT 0,
             usd REAL NOT NULL DEFAULT 0,
             calls INTEGER NOT NULL DEFAULT 0,
             tool_calls INTEGER NOT NULL DEFAULT 0,
             PRIMARY KEY (owner, day, agent, upstream, model)
         );
         CREATE INDEX IF NOT EXISTS usage_by_day ON usage (day);",
    )
}

/// 6: usage that rides on events (see `usage_rows.rs`): `events.usage` holds the usage rows
/// of the commit that wrote that event (JSON), until they are folded into `usage`;
/// `usage_fold.n` is the last event folded (every event up to it is). Every row of version
/// 5 is in `usage` already: folded up to the last event.
fn to_v6(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE events ADD COLUMN usage TEXT;
         CREATE TABLE IF NOT EXISTS usage_fold (
             id INTEGER PRIMARY KEY CHECK (id = 1),
             n INTEGER NOT NULL
         );
         INSERT OR IGNORE INTO usage_fold (id, n) SELECT 1, coalesce(max(n), 0) FROM events;",
    )
}

pub(super) fn open_conn(path: &Path, fsync: bool) -> Result<Connection, StoreError> {
    let open_err = |source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(open_err)?;
    conn.pragma_update(None, "synchronous", if fsync { "FULL" } else { "NORMAL" })
        .map_err(open_err)?;
    Ok(conn)
}
