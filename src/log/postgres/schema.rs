//! The PostgreSQL schema and its versioned migrations, run at start.
//!
//! `turnstile_schema` holds one row: the version the database is at. Migrations run in one
//! transaction under an advisory lock, so that instances starting together migrate once; an
//! instance whose build knows an older version than the database's refuses to start (it would
//! write rows a newer schema does not expect).

use tokio_postgres::Client;

use crate::log::backend::pg_error_text;
use crate::log::StoreError;

/// The advisory lock key migrations hold (any constant; "turnstile" in ASCII, truncated).
const MIGRATION_LOCK: i64 = 0x7475_726e_7374_696c;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: sessions, events, files, and the lease of each session's writer (used by scale-out).
    // Events keep their JSON as text: byte-identical in history and stream (jsonb would
    // reorder keys).
    "CREATE TABLE sessions (
        id text PRIMARY KEY,
        owner text,
        created_at text NOT NULL,
        record text NOT NULL
    );
    CREATE INDEX sessions_by_owner ON sessions (owner, id);
    CREATE TABLE events (
        session_id text NOT NULL,
        seq bigint NOT NULL,
        id text NOT NULL,
        turn_id text NOT NULL,
        type text NOT NULL,
        json text NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE files (
        id text PRIMARY KEY,
        owner text,
        filename text NOT NULL,
        mime_type text NOT NULL,
        size_bytes bigint NOT NULL,
        sha256 text NOT NULL,
        created_at text NOT NULL
    );
    CREATE INDEX files_by_owner ON files (owner);
    CREATE INDEX files_by_sha256 ON files (sha256);
    CREATE TABLE leases (
        session_id text PRIMARY KEY,
        holder text NOT NULL,
        expires_at timestamptz NOT NULL
    );",
    // 2: the inbox: requests for a session posted on an instance while another holds its
    // lease (queued messages, cancels, interrupts, plan decisions), taken by the holder in
    // `seq` order (`inbox.rs`).
    "CREATE TABLE inbox (
        seq bigserial PRIMARY KEY,
        session_id text NOT NULL,
        kind text NOT NULL,
        body text NOT NULL,
        turn_id text,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX inbox_by_session ON inbox (session_id, seq);",
    // 3: stored files' bytes, chunked (`file_chunks.rs`: one row per 1 MiB of a blob, named by its
    // SHA-256 as on disk), and which instances watch which sessions' deltas (`deltas.rs`: an
    // instance starting learns the watches already under way).
    "CREATE TABLE file_chunks (
        sha256 text NOT NULL,
        n integer NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (sha256, n)
    );
    ALTER TABLE file_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
    CREATE TABLE delta_watchers (
        session_id text NOT NULL,
        instance text NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (session_id, instance)
    );",
    // 4: each session's `Idempotency-Key`s (AAP turn requests), shared by the instances: the
    // body's SHA-256 and the turn its first request started (`turn_id` null while an instance
    // holds the key reserved, its turn not started yet); `created_at` in ms since the Unix
    // epoch, indexed for the purge of keys past 24 h (`idem_keys.rs`).
    "CREATE TABLE idempotency_keys (
        session_id text NOT NULL,
        key text NOT NULL,
        fingerprint text NOT NULL,
        turn_id text,
        after_seq bigint,
        created_at bigint NOT NULL,
        PRIMARY KEY (session_id, key)
    );
    CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);",
    // 5: a queued turn's row stays in the inbox until the turn begins (the commit of its
    // `user.message` removes it), marked with the process that holds it in its queue; rows of
    // a process that is gone are taken again. Local queued turns are rows too (`WriteOp::InboxPut`).
    "ALTER TABLE inbox ADD COLUMN taken text;
    CREATE INDEX inbox_by_turn ON inbox (session_id, turn_id);",
    // 6: the fence of a commit (`commit.rs`): events are written only by the holder of their
    // session's lease, and never after a hole. The lease rows are locked (shared) to the
    // commit's end, so a take-over waits for the commit and then reads what it wrote; a writer
    // whose lease was taken over (it stalled past `lease_s`, or the database was away that
    // long) is refused with SQLSTATE `TSL01`, and one whose earlier events did not go in (a
    // failed commit) with `TSL02`: it reads the session back.
    "CREATE FUNCTION turnstile_fence(sessions text[], firsts int8[], me text) RETURNS void
     LANGUAGE plpgsql AS $$
     DECLARE lost text; first int8;
     BEGIN
       PERFORM 1 FROM leases WHERE session_id = ANY(sessions) AND holder = me
         ORDER BY session_id FOR SHARE;
       SELECT s INTO lost FROM unnest(sessions) AS s
        WHERE NOT EXISTS (SELECT 1 FROM leases l WHERE l.session_id = s AND l.holder = me)
        LIMIT 1;
       IF lost IS NOT NULL THEN
         RAISE EXCEPTION 'this instance no longer holds the lease of session %', lost
           USING ERRCODE = 'TSL01';
       END IF;
       SELECT s, f INTO lost, first FROM unnest(sessions, firsts) AS t(s, f)
        WHERE f > 1 AND NOT EXISTS
          (SELECT 1 FROM events e WHERE e.session_id = t.s AND e.seq = t.f - 1)
        LIMIT 1;
       IF lost IS NOT NULL THEN
         RAISE EXCEPTION 'session % has no event %: its event % would leave a hole',
           lost, first - 1, first USING ERRCODE = 'TSL02';
       END IF;
     END $$;",
    // 7: usage (`crate::usage`), shared by the instances: counts each model and tool call adds
    // to (`usage_rows.rs`), by principal (owner id, empty without keys), UTC day, agent,
    // upstream and model.
    "CREATE TABLE usage (
        owner text NOT NULL,
        day text NOT NULL,
        agent text NOT NULL,
        upstream text NOT NULL,
        model text NOT NULL,
        input_tokens bigint NOT NULL DEFAULT 0,
        output_tokens bigint NOT NULL DEFAULT 0,
        cached_tokens bigint NOT NULL DEFAULT 0,
        usd double precision NOT NULL DEFAULT 0,
        calls bigint NOT NULL DEFAULT 0,
        tool_calls bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (owner, day, agent, upstream, model)
    );
    CREATE INDEX usage_by_day ON usage (day);",
];

/// The version this build writes.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Bring the database to [`SCHEMA_VERSION`]; refuse one that is newer.
pub(super) async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let open = |e: tokio_postgres::Error| StoreError::OpenPostgres(pg_error_text(&e));
    let tx = client.transaction().await.map_err(open)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(open)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS turnstile_schema (version bigint NOT NULL);
         INSERT INTO turnstile_schema (version)
             SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM turnstile_schema);",
    )
    .await
    .map_err(open)?;
    let version: i64 = tx
        .query_one("SELECT version FROM turnstile_schema", &[])
        .await
        .map_err(open)?
        .get(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::OpenPostgres(format!(
            "the database's schema is version {version}, newer than this turnstile knows \
             ({SCHEMA_VERSION}): run a turnstile at least as new as the one that migrated it"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql).await.map_err(open)?;
        tracing::info!(version = i + 1, "store: postgres schema migrated");
    }
    tx.execute(
        "UPDATE turnstile_schema SET version = $1",
        &[&SCHEMA_VERSION],
    )
    .await
    .map_err(open)?;
    tx.commit().await.map_err(open)
}
