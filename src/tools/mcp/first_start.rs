//! The federation's start: every configured server spawned (shared instances, and a probe of
//! each session-scoped one for its tool list), and their first attempts awaited.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reports::{ServerProgress, StartReport};
use super::supervisor::{Placement, Supervisor};
use super::{oauth, sandbox};
use crate::config::{Config, McpScope};

/// The probe instances of session-scoped servers, by server index.
pub(super) type Probes = Vec<(usize, Arc<Supervisor>)>;

/// Said once at start-up: servers with `sandbox = "landlock"` on a kernel that cannot (fully)
/// confine them.
pub(super) fn warn_at_start(config: &Config) {
    let confined: Vec<&str> = config
        .mcp_servers
        .iter()
        .filter(|s| s.sandbox == crate::config::SandboxKind::Landlock)
        .map(|s| s.name.as_str())
        .collect();
    if !confined.is_empty() && !sandbox::available() {
        tracing::error!(
            servers = %confined.join(", "),
            "this kernel does not enforce Landlock: servers with sandbox = \"landlock\" will not be started"
        );
    } else if !confined.is_empty() && !sandbox::restricts_tcp() {
        tracing::warn!(
            servers = %confined.join(", "),
            abi = sandbox::kernel_abi(),
            "this kernel's Landlock cannot restrict TCP (it needs ABI 4): servers with sandbox = \"landlock\" may open connections even with network = false"
        );
    }
}

/// Start every configured server that `wanted` picks (by index; a reload starts only the new
/// and changed ones): the shared instances, and a probe instance (in a scratch folder) of each
/// session-scoped server, for its tool list.
pub(super) fn spawn_servers(
    config: &Config,
    oauth: &HashMap<usize, Arc<oauth::OAuth>>,
    wanted: impl Fn(usize) -> bool,
) -> (HashMap<usize, Arc<Supervisor>>, Probes) {
    let private = sandbox::own_state(config);
    let mut shared = HashMap::new();
    let mut probes = Vec::new();
    for (i, cfg) in config.mcp_servers.iter().enumerate() {
        if !wanted(i) {
            continue;
        }
        match cfg.scope {
            McpScope::Shared => {
                let placement = Placement {
                    private: private.clone(),
                    oauth: oauth.get(&i).cloned(),
                    ..Placement::default()
                };
                shared.insert(i, Supervisor::start(cfg.clone(), placement));
            }
            McpScope::Session => {
                let scratch = config.server.data_dir.join("mcp-probe").join(&cfg.name);
                let _ = std::fs::create_dir_all(&scratch);
                let placement = Placement {
                    cwd: Some(scratch.clone()),
                    workspace: Some(scratch),
                    private: private.clone(),
                    oauth: oauth.get(&i).cloned(),
                };
                probes.push((i, Supervisor::start(cfg.clone(), placement)));
            }
        }
    }
    (shared, probes)
}

/// Wait for every server's first attempt (each bounded by its startup timeout), telling
/// `progress` as each ends; the servers that did not come up are reported.
pub(super) async fn first_attempts(
    config: &Config,
    shared: &HashMap<usize, Arc<Supervisor>>,
    probes: &Probes,
    progress: &(dyn Fn(ServerProgress) + Sync),
) -> StartReport {
    let begun = Instant::now();
    let waits = shared
        .iter()
        .map(|(i, s)| (*i, s.clone()))
        .chain(probes.iter().map(|(i, s)| (*i, s.clone())))
        .map(|(i, s)| {
            let within = config.mcp_servers[i].startup_timeout + Duration::from_secs(1);
            async move {
                let r = s.ready(within).await;
                progress(ServerProgress {
                    server: config.mcp_servers[i].name.clone(),
                    result: r.clone().map(|()| s.tools().len()),
                    elapsed: begun.elapsed(),
                });
                (i, r)
            }
        });
    let mut report = StartReport::default();
    for (i, r) in futures_util::future::join_all(waits).await {
        if let Err(why) = r {
            report
                .failed
                .push((config.mcp_servers[i].name.clone(), why));
        }
    }
    report
}
