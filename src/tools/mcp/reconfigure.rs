//! A reload's part in the federation: the servers of a new configuration diffed by name
//! against the running ones. A server whose definition is unchanged keeps its instances (its
//! shared one, and every session's own: no session loses its session-scoped server); one that
//! was added starts; one that was removed stops once its calls in flight have ended; one that
//! changed does both (its new instance serves new calls at once). The tools are then
//! federated again under the new policy, which tells `/mcp` clients `list_changed`.

use std::collections::HashMap;
use std::sync::Arc;

use super::federation::{take_probes, McpHost, Servers};
use super::first_start::{first_attempts, spawn_servers};
use super::oauth;
use super::supervisor::Supervisor;
use crate::config::{Config, McpServerConfig};
use crate::sync::lock;

/// Whether two definitions of a server would run the same thing (where its table sits in the
/// file does not count). The config types hold only ordered maps, so their `Debug` text is a
/// faithful, stable rendering of every field.
pub(super) fn same_definition(a: &McpServerConfig, b: &McpServerConfig) -> bool {
    let (mut a, mut b) = (a.clone(), b.clone());
    (a.line, b.line) = (0, 0);
    format!("{a:?}") == format!("{b:?}")
}

/// New index → old index, for the servers of `new` whose definition in `old` is the same.
fn kept(old: &Config, new: &Config) -> HashMap<usize, usize> {
    new.mcp_servers
        .iter()
        .enumerate()
        .filter_map(|(i, cfg)| {
            let j = old.mcp_servers.iter().position(|o| o.name == cfg.name)?;
            same_definition(&old.mcp_servers[j], cfg).then_some((i, j))
        })
        .collect()
}

/// A line per server that a reload adds, changes or removes.
fn log_changes(old: &Config, new: &Config, kept: &HashMap<usize, usize>) {
    for (i, cfg) in new.mcp_servers.iter().enumerate() {
        let change = match old.mcp_servers.iter().find(|o| o.name == cfg.name) {
            None => "added: starting it",
            Some(_) if kept.contains_key(&i) => continue,
            Some(_) => "changed: restarting it",
        };
        tracing::info!(server = %cfg.name, "reload: MCP server {change}");
    }
    for o in &old.mcp_servers {
        if !new.mcp_servers.iter().any(|c| c.name == o.name) {
            tracing::info!(server = %o.name, "reload: MCP server removed: stopping it once its calls in flight end");
        }
    }
}

impl McpHost {
    /// Serve the servers of `config` from now on (see the module's doc). Waits for the first
    /// attempt of each new server (within its `startup_timeout_s`), as start-up does; one that
    /// does not come up keeps retrying in the background, as at start-up.
    pub async fn reconfigure(self: &Arc<Self>, config: Arc<Config>) {
        let _one = self.reconfiguring.lock().await;
        let old = self.servers.get();
        let kept = kept(&old.config, &config);
        log_changes(&old.config, &config, &kept);
        let mut oauth_of: HashMap<usize, Arc<oauth::OAuth>> = HashMap::new();
        for (i, cfg) in config.mcp_servers.iter().enumerate() {
            let found = match kept.get(&i) {
                Some(j) => old.oauth.get(j).cloned(),
                None => oauth::OAuth::for_server(cfg, &config.server),
            };
            if let Some(o) = found {
                oauth_of.insert(i, o);
            }
        }
        let (mut shared, probes) = spawn_servers(&config, &oauth_of, |i| !kept.contains_key(&i));
        let started: Vec<Arc<Supervisor>> = shared.values().cloned().collect();
        let report = first_attempts(&config, &shared, &probes, &|_| {}).await;
        for (server, why) in &report.failed {
            tracing::warn!(%server, error = %why, "reload: MCP server is not available yet; retrying in the background");
        }
        let (mut probed, mut probed_caps) = take_probes(probes).await;
        for (&i, &j) in &kept {
            if let Some(s) = old.shared.get(&j) {
                shared.insert(i, s.clone());
            }
            if let Some(t) = old.probed.get(&j) {
                probed.insert(i, t.clone());
            }
            if let Some(c) = old.probed_caps.get(&j) {
                probed_caps.insert(i, c.clone());
            }
        }
        let unchanged: Vec<&str> = kept
            .keys()
            .map(|&i| config.mcp_servers[i].name.as_str())
            .collect();
        let gone_shared: Vec<Arc<Supervisor>> = old
            .shared
            .iter()
            .filter(|(j, _)| !kept.values().any(|k| k == *j))
            .map(|(_, s)| s.clone())
            .collect();
        // Swapped with the session instances locked: none starts from an old definition after
        // this, and those of removed or changed servers are taken out here.
        let gone_sessions: Vec<Arc<Supervisor>> = {
            let mut map = lock(&self.sessions);
            self.servers.set(Arc::new(Servers {
                config: config.clone(),
                shared,
                probed,
                probed_caps,
                oauth: oauth_of,
            }));
            let keys: Vec<_> = map
                .keys()
                .filter(|(_, server)| !unchanged.contains(&server.as_str()))
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| map.remove(&k))
                .map(|inst| inst.sup)
                .collect()
        };
        if let Err(e) = self.refederate(false) {
            tracing::error!(error = %e, "reload: the tools could not be federated");
        }
        self.follow_tool_lists(&started);
        for s in gone_shared.into_iter().chain(gone_sessions) {
            tokio::spawn(async move { s.stop_after_calls().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: &str) -> McpServerConfig {
        let path = std::path::Path::new("tools.toml");
        match crate::config::load_str(path, text, &crate::config::Env::default()) {
            Ok(c) => c.mcp_servers[0].clone(),
            Err(e) => panic!("expected a valid config, got: {e}"),
        }
    }

    #[test]
    fn where_a_table_sits_does_not_change_a_server() {
        let a = server("[mcp_servers.a]\ncommand = \"python3\"\n");
        let b = server("\n\n[mcp_servers.a]\ncommand = \"python3\"\n");
        assert_ne!(a.line, b.line);
        assert!(same_definition(&a, &b));
    }

    #[test]
    fn another_argument_changes_a_server() {
        let a = server("[mcp_servers.a]\ncommand = \"python3\"\n");
        let b = server("[mcp_servers.a]\ncommand = \"python3\"\nargs = [\"-v\"]\n");
        assert!(!same_definition(&a, &b));
    }
}
