//! The store a test server's config names, opened beside (or after) the server: the embedded
//! SQLite file under its `data_dir`, or the PostgreSQL database of `[store] url_env` (set by
//! `TURNSTILE_TEST_STORE=postgres`, see `postgres.rs`). For a test that reads the log of a
//! process it spawned (or killed), on either backend.

use std::path::Path;

use turnstile::config::StoreBackendKind;
use turnstile::log::{Event, Store};

/// The store of the config file `config` (a `tools.toml`), as the server opens it (but without
/// fsync, lease or instance name: a reader, never the writer of a session).
pub fn open(config: &Path) -> Store {
    let cfg =
        turnstile::config::load(config, &super::env(&[])).unwrap_or_else(|e| panic!("config: {e}"));
    match (cfg.store.backend, &cfg.store.url_env) {
        (StoreBackendKind::Postgres, Some(var)) => {
            let url = cfg
                .env
                .var(var)
                .unwrap_or_else(|| panic!("{var} is not set"));
            Store::open_postgres(url, false, cfg.store.lease, None)
                .unwrap_or_else(|e| panic!("open the PostgreSQL store: {e}"))
        }
        _ => Store::open(&cfg.server.data_dir, false)
            .unwrap_or_else(|e| panic!("open the SQLite store: {e}")),
    }
}

/// Every stored event of a session, oldest first, from the store of the config file `config`.
pub async fn events(config: &Path, session_id: &str) -> Vec<Event> {
    open(config)
        .events(session_id, 0, 1 << 20)
        .await
        .expect("read the session's events")
}

/// `config` with the `[store]` table of the config already in `dir/tools.toml` in place of its
/// own: a restart on new settings keeps its store (with `TURNSTILE_TEST_STORE=postgres`, each
/// `config_text` names a fresh database; the embedded store has no table and stays under
/// `data_dir`).
pub fn keep_store(dir: &Path, config: &str) -> String {
    let old = std::fs::read_to_string(dir.join("tools.toml")).expect("the previous config");
    let mut out = without_store(config);
    out.push('\n');
    out.push_str(&store_table(&old));
    out
}

/// The lines of the `[store]` table of a config text (empty if it has none).
fn store_table(config: &str) -> String {
    let mut table = String::new();
    let mut inside = false;
    for line in config.lines() {
        if line.trim_start().starts_with('[') {
            inside = line.trim() == "[store]";
        }
        if inside {
            table.push_str(line);
            table.push('\n');
        }
    }
    table
}

/// A config text without its `[store]` table.
fn without_store(config: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in config.lines() {
        if line.trim_start().starts_with('[') {
            inside = line.trim() == "[store]";
        }
        if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// How many distinct files' bytes the store of the config file `config` keeps: the blobs under
/// `data_dir/files` (SQLite), or the SHA-256s in the database's `file_chunks` (PostgreSQL).
pub fn blob_count(config: &Path) -> usize {
    let cfg =
        turnstile::config::load(config, &super::env(&[])).unwrap_or_else(|e| panic!("config: {e}"));
    match (cfg.store.backend, &cfg.store.url_env) {
        (StoreBackendKind::Postgres, Some(var)) => {
            let url = cfg
                .env
                .var(var)
                .unwrap_or_else(|| panic!("{var} is not set"));
            let db = url.rsplit('/').next().expect("a database in the URL");
            crate::common::postgres::shared()
                .psql(db, "SELECT count(DISTINCT sha256) FROM file_chunks")
                .parse()
                .expect("a count")
        }
        _ => std::fs::read_dir(cfg.server.data_dir.join("files"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().is_file())
                    .count()
            })
            .unwrap_or(0),
    }
}
