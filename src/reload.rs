//! Reloading `tools.toml` while serving (SIGHUP, or `turnstile reload`, which sends it).
//!
//! The file is validated in full first, by the start-up loader, and so are what start-up
//! builds from it (the upstreams with their headers, the keys): anything wrong and the reload
//! is refused, the running configuration stays, and the error is logged and shown by
//! `GET /status` under `"reload"`. A valid file takes effect at once for what comes next: the
//! tool host first (new MCP servers started, removed ones stopped once their calls in flight
//! end, changed ones restarted, unchanged ones untouched; the tools federated under the new
//! policy), then the engine's config and upstreams, then the keys. A turn already running
//! keeps the config and upstreams it started with; connections and streams are not touched.
//!
//! What is bound when the server starts cannot change live: the `[server]`, `[store]`,
//! `[telemetry]`, `[mcp_endpoint]` and `[files]` tables, and `[limits] disk_bytes_per_key`
//! and `files_per_key` (the file store's quotas). A reload that changes them applies the rest,
//! keeps their running values, and names them (log and `/status`) as needing a restart.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{self, Config};
use crate::engine::{Engine, ReloadReport};
use crate::http::auth::Keys;
use crate::sync::Swap;
use crate::upstream::router::Router;

/// What start-up builds from a configuration besides the engine, built again for a reload
/// (by `startup.rs`, the way it did at start): the upstreams' router and the keys, or why not.
pub(crate) type Build = Box<dyn Fn(&Config) -> Result<(Arc<Router>, Keys), String> + Send + Sync>;

/// What a reload needs of the running server: where the file is, what to put the new
/// configuration into, and how to build what start-up built from it.
pub struct Reloader {
    path: PathBuf,
    engine: Engine,
    keys: Arc<Swap<Keys>>,
    build: Build,
    /// One reload at a time; the count of those applied.
    applied: tokio::sync::Mutex<u64>,
}

impl Reloader {
    pub(crate) fn new(engine: Engine, keys: Arc<Swap<Keys>>, build: Build) -> Reloader {
        Reloader {
            path: engine.config().path.clone(),
            engine,
            keys,
            build,
            applied: tokio::sync::Mutex::new(0),
        }
    }

    /// Read the file again and apply it, or refuse it: what it came to is logged and kept for
    /// `GET /status`, and returned.
    pub async fn reload(&self) -> ReloadReport {
        let mut applied = self.applied.lock().await;
        tracing::info!(config = %self.path.display(), "reload: reading the configuration again");
        let report = match self.apply().await {
            Ok(needs_restart) => {
                *applied += 1;
                if needs_restart.is_empty() {
                    tracing::info!(
                        generation = *applied,
                        "reload: the new configuration is in effect"
                    );
                } else {
                    tracing::warn!(generation = *applied, keys = %needs_restart.join(", "), "reload: the new configuration is in effect, but these keys changed and keep their running values until a restart");
                }
                ReloadReport {
                    at: crate::clock::now(),
                    ok: true,
                    generation: *applied,
                    error: None,
                    needs_restart,
                }
            }
            Err(error) => {
                tracing::error!(%error, "reload refused: the running configuration stays");
                ReloadReport {
                    at: crate::clock::now(),
                    ok: false,
                    generation: *applied,
                    error: Some(error),
                    needs_restart: Vec::new(),
                }
            }
        };
        self.engine.set_reload_report(report.clone());
        report
    }

    /// Validate and apply the file: the keys that changed but need a restart, or why the file
    /// is refused.
    async fn apply(&self) -> Result<Vec<String>, String> {
        let old = self.engine.config();
        // The environment the server started with: the variables a file names are read from
        // it, as at start-up.
        let mut new = config::load(&self.path, &old.env).map_err(|e| e.to_string())?;
        let needs_restart = keep_restart_only(&old, &mut new);
        let (router, keys) = (self.build)(&new)?;
        let router = carry_over(router, &self.engine.inner.router(), &old, &new);
        if keys.is_empty() != self.keys.get().is_empty() {
            return Err(format!(
                "{}: serving with keys or without them is decided at start-up (the browser checks depend on it): a reload cannot add the first key or remove the last; restart turnstile for that",
                self.path.display()
            ));
        }
        let new = Arc::new(new);
        self.engine.reconfigure(new, router).await;
        self.keys.set(Arc::new(keys));
        Ok(needs_restart)
    }
}

/// `router` (just built for `new`) with the breakers and in-flight counts of the upstreams
/// that `old` defined the same way.
fn carry_over(router: Arc<Router>, running: &Router, old: &Config, new: &Config) -> Arc<Router> {
    let same = |name: &str| {
        let def = |c: &Config| {
            c.upstreams
                .iter()
                .find(|u| u.name == name)
                .map(|u| format!("{u:?}"))
        };
        def(old).is_some_and(|o| Some(o) == def(new))
    };
    match Arc::try_unwrap(router) {
        Ok(router) => Arc::new(router.carry_over(running, same)),
        Err(shared) => shared,
    }
}

/// Put the running values of what cannot change live into `new`; the keys among them that
/// `new` had changed.
fn keep_restart_only(old: &Config, new: &mut Config) -> Vec<String> {
    let mut changed = Vec::new();
    let mut check = |key: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
        if format!("{a:?}") != format!("{b:?}") {
            changed.push(key.to_string());
        }
    };
    let (o, n) = (&old.server, &new.server);
    check("server.listen", &o.listen, &n.listen);
    check("server.data_dir", &o.data_dir, &n.data_dir);
    check("server.sandboxes", &o.sandboxes, &n.sandboxes);
    check("server.api_keys_env", &o.api_keys_env, &n.api_keys_env);
    check("server.public_meta", &o.public_meta, &n.public_meta);
    check(
        "server.max_body_bytes",
        &o.max_body_bytes,
        &n.max_body_bytes,
    );
    check("server.fsync", &o.fsync, &n.fsync);
    check("server.session_cache", &o.session_cache, &n.session_cache);
    check("server.drain_s", &o.drain, &n.drain);
    check(
        "server.header_timeout_s",
        &o.header_timeout,
        &n.header_timeout,
    );
    check("server.idle_timeout_s", &o.idle_timeout, &n.idle_timeout);
    check(
        "server.max_connections",
        &o.max_connections,
        &n.max_connections,
    );
    check(
        "server.metrics_listen",
        &o.metrics_listen,
        &n.metrics_listen,
    );
    check("server.allowed_hosts", &o.allowed_hosts, &n.allowed_hosts);
    check(
        "server.secret_key_env",
        &o.secret_key_env,
        &n.secret_key_env,
    );
    check("store", &old.store, &new.store);
    check("telemetry", &old.telemetry, &new.telemetry);
    check("mcp_endpoint", &old.mcp_endpoint, &new.mcp_endpoint);
    check("files", &old.files, &new.files);
    let (o, n) = (&old.limits, &new.limits);
    check(
        "limits.disk_bytes_per_key",
        &o.disk_bytes_per_key,
        &n.disk_bytes_per_key,
    );
    check("limits.files_per_key", &o.files_per_key, &n.files_per_key);
    new.server = old.server.clone();
    new.store = old.store.clone();
    new.telemetry = old.telemetry.clone();
    new.mcp_endpoint = old.mcp_endpoint.clone();
    new.files = old.files.clone();
    new.limits.disk_bytes_per_key = old.limits.disk_bytes_per_key;
    new.limits.files_per_key = old.limits.files_per_key;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Config {
        let path = std::path::Path::new("tools.toml");
        match config::load_str(path, text, &config::Env::default()) {
            Ok(c) => c,
            Err(e) => panic!("expected a valid config, got: {e}"),
        }
    }

    #[test]
    fn what_is_bound_at_start_keeps_its_running_value_and_is_named() {
        let old = load("[server]\nlisten = \"127.0.0.1:1000\"\n[limits]\nqueued_turns = 3\n");
        let mut new = load("[server]\nlisten = \"127.0.0.1:2000\"\n[limits]\nqueued_turns = 5\n");
        let named = keep_restart_only(&old, &mut new);
        assert_eq!(named, vec!["server.listen".to_string()]);
        assert_eq!(new.server.listen, old.server.listen);
        // The rest of the new file applies.
        assert_eq!(new.limits.queued_turns, 5);
    }

    #[test]
    fn an_unchanged_file_names_nothing() {
        let old = load("[policy]\ntrust = [\"*\"]\n");
        let mut new = load("\n[policy]\ntrust = [\"*\"]\n");
        assert!(keep_restart_only(&old, &mut new).is_empty());
    }
}
