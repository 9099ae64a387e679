//! Assembling a running server from a validated config: store, provider, tool host, engine,
//! listener. `main` and the integration tests start turnstile the same way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProviderKind, UpstreamConfig};
use crate::engine::Engine;
use crate::files::FileStore;
use crate::http::auth::Keys;
use crate::log::Store;
use crate::protocol::context::App;
use crate::protocol::mcp_endpoint::Endpoint as McpEndpoint;
use crate::tools::toolbox::Toolbox;
use crate::tools::ToolHost;
use crate::upstream::router::{Router, Upstream};
use crate::upstream::{anthropic::Anthropic, echo::Echo, openai::OpenAi, Provider};

/// How long running turns and open connections get to finish on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::log::StoreError),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    #[error(transparent)]
    Federation(#[from] crate::tools::mcp::FederationError),
}

/// Options that are not in the config file.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Allow a non-loopback address without API keys.
    pub insecure: bool,
}

/// A running server.
pub struct Running {
    pub addr: SocketAddr,
    /// Where `[server] metrics_listen` serves `GET /metrics` without keys (port 0 resolved).
    pub metrics_addr: Option<SocketAddr>,
    pub engine: Engine,
    /// Reads `tools.toml` again (SIGHUP, `turnstile reload`).
    reloader: Arc<crate::reload::Reloader>,
    shutdown: CancellationToken,
    streams: CancellationToken,
    server: JoinHandle<()>,
    metrics: Option<JoinHandle<()>>,
}

impl Running {
    /// Read the config file again and apply it, or refuse it (see `reload.rs`).
    pub async fn reload(&self) -> crate::engine::ReloadReport {
        self.reloader.reload().await
    }

    /// What reloads the config, for a task of its own.
    pub fn reloader(&self) -> Arc<crate::reload::Reloader> {
        self.reloader.clone()
    }

    /// Stop accepting, end running turns with `worker_shutdown`, wait for them and for open
    /// connections (bounded), flush the store.
    pub async fn stop(self) {
        // No turn starts from here on, then the listener closes: a client that finds it closed
        // knows that nothing it sent from now on runs here.
        self.engine.stop_accepting();
        self.shutdown.cancel();
        self.engine.shutdown(SHUTDOWN_GRACE).await;
        // Turns have ended and subscribers have their terminal events: close the streams.
        self.streams.cancel();
        let _ = self.server.await;
        if let Some(metrics) = self.metrics {
            let _ = metrics.await;
        }
    }
}

/// The upstreams the config names, each with its provider, behind one router.
pub fn router(config: &Config) -> Result<Arc<Router>, StartError> {
    let mut upstreams = Vec::with_capacity(config.upstreams.len());
    for up in &config.upstreams {
        upstreams.push(Upstream::new(up, provider(config, up)?));
    }
    Ok(Arc::new(Router::new(upstreams)))
}

/// The provider of one upstream.
fn provider(config: &Config, up: &UpstreamConfig) -> Result<Arc<dyn Provider>, StartError> {
    let key = match &up.api_key_env {
        Some(var) => match config.env.var(var) {
            Some(v) if !v.is_empty() => Some(v.to_string()),
            _ => {
                tracing::warn!(upstream = %up.name, variable = %var, "the upstream's api_key_env names a variable that is not set; calling the upstream without a key");
                None
            }
        },
        None => None,
    };
    let headers = upstream_headers(config, up)?;
    Ok(match up.provider {
        ProviderKind::Echo if config.upstreams.len() == 1 => {
            tracing::info!("no upstream configured: using the built-in echo provider (it answers \"Echo: <your text>\"); add an [upstream] table to {} for a real model", config.path.display());
            Arc::new(Echo)
        }
        ProviderKind::Echo => {
            tracing::info!(upstream = %up.name, "upstream: the built-in echo provider");
            Arc::new(Echo)
        }
        ProviderKind::OpenAi => {
            tracing::info!(upstream = %up.name, base_url = %up.base_url, model = %up.model, "upstream: OpenAI-compatible chat completions");
            Arc::new(OpenAi::new(up.base_url.clone(), key, up.timeout).with_headers(headers))
        }
        ProviderKind::Anthropic => {
            tracing::info!(upstream = %up.name, base_url = %up.base_url, model = %up.model, "upstream: Anthropic Messages");
            Arc::new(
                Anthropic::new(
                    up.base_url.clone(),
                    key,
                    up.timeout,
                    up.max_tokens
                        .unwrap_or(crate::upstream::anthropic::DEFAULT_MAX_TOKENS),
                )
                .with_headers(headers),
            )
        }
    })
}

/// An upstream's `headers` with `${VAR}` expanded (values marked sensitive: they often hold
/// tokens); a variable that is not set is an error naming it.
fn upstream_headers(
    config: &Config,
    up: &UpstreamConfig,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, StartError> {
    let table = if config.upstreams.len() == 1 && up.name == "default" {
        "upstream".to_string()
    } else {
        format!("upstreams.{}", up.name)
    };
    let mut out = Vec::new();
    for (name, value) in &up.headers {
        let value = config.env.expand(value).map_err(|var| {
            StartError::Config(format!(
                "{}: {table}.headers.{name} uses ${{{var}}}, which is not set in turnstile's environment: set {var}",
                config.path.display()
            ))
        })?;
        let bad = |e: &dyn std::fmt::Display| {
            StartError::Config(format!(
                "{}: {table}.headers.{name}: {e}",
                config.path.display()
            ))
        };
        let name = http::HeaderName::try_from(name.as_str()).map_err(|e| bad(&e))?;
        let mut value = http::HeaderValue::try_from(value).map_err(|e| bad(&e))?;
        value.set_sensitive(true);
        out.push((name, value));
    }
    Ok(out)
}

/// The API keys from `[server] api_keys_env` and `[keys.*]`, and the loopback rule without
/// them. A variable that is named but yields no key stops the server: failing open would serve
/// everything to anyone.
fn keys(config: &Config, addr: SocketAddr, opts: &StartOptions) -> Result<Keys, StartError> {
    let mut keys = match &config.server.api_keys_env {
        Some(var) => {
            let keys = Keys::parse(config.env.var(var).unwrap_or_default());
            if keys.is_empty() {
                return Err(StartError::Config(format!(
                    "[server] api_keys_env names {var}, which is unset or holds no key: set {var} to comma-separated API keys, or remove api_keys_env to serve loopback without keys"
                )));
            }
            keys
        }
        None => Keys::default(),
    };
    keys.add_principals(config)
        .map_err(|e| StartError::Config(format!("{}: {e}", config.path.display())))?;
    if keys.is_empty() && !addr.ip().is_loopback() && !opts.insecure {
        return Err(StartError::Config(format!(
            "refusing to listen on {addr} without API keys: add [keys.NAME] tables or set [server] api_keys_env to a variable holding comma-separated keys, listen on a loopback address, or pass --insecure"
        )));
    }
    Ok(keys)
}

/// The store `[store]` names: the embedded SQLite file under `data_dir`, or the PostgreSQL
/// database whose connection string is in the variable `url_env` names (unset or empty: one
/// line naming it).
fn open_store(config: &Config) -> Result<Store, StartError> {
    let store = &config.store;
    match (store.backend, &store.url_env) {
        (crate::config::StoreBackendKind::Postgres, Some(var)) => {
            let url = config.env.var(var).unwrap_or_default();
            if url.trim().is_empty() {
                return Err(StartError::Config(format!(
                    "{}: [store] url_env names {var}, which is unset or empty: set {var} to the PostgreSQL connection string (e.g. postgres://user:password@host/db)",
                    config.path.display()
                )));
            }
            tracing::info!(lease_s = store.lease.as_secs(), "store: postgres");
            Ok(Store::open_postgres(
                url.trim(),
                config.server.fsync,
                store.lease,
                Some(instance_name(&config.server.data_dir)?),
            )?)
        }
        _ => Ok(Store::open(&config.server.data_dir, config.server.fsync)?),
    }
}

/// This instance's name in the shared store's lease rows: kept in `data_dir/instance`, so that
/// a restart recognizes the leases its previous life held (and closes their turns at once).
/// Each instance needs a data folder of its own.
fn instance_name(data_dir: &std::path::Path) -> Result<String, StartError> {
    let path = data_dir.join("instance");
    let bad =
        |e: std::io::Error| StartError::Config(format!("cannot keep {}: {e}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(s) if crate::ids::is_valid("inst", s.trim()) => Ok(s.trim().to_string()),
        Ok(_) | Err(_) => {
            std::fs::create_dir_all(data_dir).map_err(bad)?;
            let name = crate::ids::new("inst");
            std::fs::write(&path, &name).map_err(bad)?;
            Ok(name)
        }
    }
}

/// The file store under `data_dir`, with the per-key quotas of `[limits]`.
fn open_files(config: &Config, store: &Store) -> Result<FileStore, StartError> {
    FileStore::open(
        &config.server.data_dir,
        store.clone(),
        config.files.max_bytes,
    )
    .map(|f| {
        f.with_quota(
            config.limits.disk_bytes_per_key,
            config.limits.files_per_key,
        )
    })
    .map_err(|e| {
        StartError::Config(format!(
            "cannot open the file store in {}: {e}",
            config.server.data_dir.display()
        ))
    })
}

/// `GET /metrics` without keys on `at` (`[server] metrics_listen`): the address bound and the
/// serving task.
async fn serve_metrics(
    at: SocketAddr,
    engine: &Engine,
    shutdown: &CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), StartError> {
    let l = TcpListener::bind(at)
        .await
        .map_err(|source| StartError::Listen { addr: at, source })?;
    let bound = l
        .local_addr()
        .map_err(|source| StartError::Listen { addr: at, source })?;
    tracing::info!(addr = %bound, "metrics on http://{bound}/metrics (no API key)");
    // No keys there: a keyless guard of its own address.
    let guard = crate::http::browser::Guard::new(
        engine.config().server.allowed_hosts.as_deref(),
        bound,
        false,
    );
    let task = crate::api::prometheus::serve(l, engine.clone(), guard, shutdown.clone());
    Ok((bound, tokio::spawn(task)))
}

/// The router of `config`'s upstreams; `provider` (tests) stands for the first upstream alone.
fn router_with(
    config: &Config,
    provider: Option<&Arc<dyn Provider>>,
) -> Result<Arc<Router>, StartError> {
    match provider {
        Some(p) => Ok(Arc::new(Router::new(vec![Upstream::new(
            &config.upstreams[0],
            p.clone(),
        )]))),
        None => router(config),
    }
}

/// What reloads the config of this server: it builds the router and the keys as start-up did.
fn reloader(
    engine: &Engine,
    cell: &Arc<crate::sync::Swap<Keys>>,
    addr: SocketAddr,
    opts: StartOptions,
    provider: Option<Arc<dyn Provider>>,
) -> Arc<crate::reload::Reloader> {
    let build: crate::reload::Build = Box::new(move |config: &Config| {
        let router = router_with(config, provider.as_ref()).map_err(|e| e.to_string())?;
        let keys = keys(config, addr, &opts).map_err(|e| e.to_string())?;
        Ok((router, keys))
    });
    Arc::new(crate::reload::Reloader::new(
        engine.clone(),
        cell.clone(),
        build,
    ))
}

/// Start serving on `addr` (port 0 picks a free port).
pub async fn start(
    config: Config,
    addr: SocketAddr,
    opts: StartOptions,
) -> Result<Running, StartError> {
    start_with(config, addr, opts, None, None).await
}

/// Start the tool host: every MCP server of the config (and the builtin tools). Servers that
/// fail to start are logged and keep retrying in the background.
pub async fn tool_host(
    config: &Arc<Config>,
    files: Option<FileStore>,
) -> Result<Arc<Toolbox>, StartError> {
    let (host, report) = Toolbox::start(config.clone(), files).await?;
    for (server, why) in &report.failed {
        tracing::warn!(%server, error = %why, "MCP server is not available yet; retrying in the background");
    }
    Ok(host)
}

/// Start serving with a given provider (tests, benchmarks: it stands for the first upstream
/// alone) and tool host.
pub async fn start_with(
    config: Config,
    addr: SocketAddr,
    opts: StartOptions,
    provider_override: Option<Arc<dyn Provider>>,
    tools: Option<Arc<dyn ToolHost>>,
) -> Result<Running, StartError> {
    let keys = keys(&config, addr, &opts)?;
    let router = router_with(&config, provider_override.as_ref())?;
    let store = open_store(&config)?;
    let files = open_files(&config, &store)?;
    // Made by an older version, or by hand, perhaps with looser modes.
    crate::files::make_private(&config.server.data_dir);
    crate::files::make_private(&config.server.sandboxes);
    let public_meta = config.server.public_meta;
    let config = Arc::new(config);
    let tools: Arc<dyn ToolHost> = match tools {
        Some(t) => t,
        None => tool_host(&config, Some(files.clone())).await?,
    };
    let streams = CancellationToken::new();
    let engine = Engine::open(
        config.clone(),
        store,
        router,
        tools.clone(),
        Some(files.clone()),
    )
    .await?;
    let mcp = McpEndpoint::new(&config, &engine.config_cell(), &tools, &streams);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    let shutdown = CancellationToken::new();
    let (metrics_addr, metrics) = match engine.config().server.metrics_listen {
        Some(at) => {
            let (bound, task) = serve_metrics(at, &engine, &shutdown).await?;
            (Some(bound), Some(task))
        }
        None => (None, None),
    };
    let browser = crate::http::browser::Guard::new(
        engine.config().server.allowed_hosts.as_deref(),
        addr,
        !keys.is_empty(),
    );
    let keys = Arc::new(crate::sync::Swap::new(Arc::new(keys)));
    let reloader = reloader(&engine, &keys, addr, opts, provider_override);
    let app = Arc::new(App {
        engine: engine.clone(),
        keys,
        public_meta,
        streams: streams.clone(),
        files,
        mcp,
        browser,
    });
    let server = tokio::spawn(crate::http::server::serve(
        listener,
        engine.config().server.clone(),
        move |req| crate::api::handle(app.clone(), req),
        shutdown.clone(),
        SHUTDOWN_GRACE,
    ));
    Ok(Running {
        addr,
        metrics_addr,
        engine,
        reloader,
        shutdown,
        streams,
        server,
        metrics,
    })
}
