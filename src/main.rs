//! The `turnstile` command: `serve` and `check`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use turnstile::config::{self, Config, Env};
use turnstile::startup::{self, StartOptions};

/// mimalloc rather than glibc's malloc: a turn makes many small, short-lived allocations
/// (events, JSON, headers) across two or more worker threads. Measured with the bench on 2
/// cores: ~10 µs less added latency and CPU per turn, 7–16 % more turns/s; an idle event stream
/// holds ~25 KiB instead of ~16 KiB (with transparent huge pages; it asks for none since, see
/// `Cargo.toml`). The bench declares the same allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's own (in the `libmimalloc-sys` archive the `mimalloc` crate links): collect
    /// the calling thread's free pages and purge what the process no longer uses.
    fn mi_collect(force: bool);
}

/// mimalloc keeps freed pages for reuse and purges them when an allocating thread gets round
/// to it, which an idle server never does: stopped `/mcp` sessions (~100 KiB each) stayed in
/// RSS until more work came. Each runtime thread calls this when idle after the library asked
/// (see `turnstile::memory`).
fn trim() {
    // SAFETY: `mi_collect` takes no pointer and is safe to call from any thread at any time.
    unsafe { mi_collect(true) }
}

#[derive(Parser)]
#[command(
    name = "turnstile",
    version,
    about = "An MCP-bridging tool host and proxy serving AAP v3 in front of an LLM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The config file [default: $TURNSTILE_CONFIG, else ./tools.toml]
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen here instead of [server].listen.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Allow a non-loopback listen address without API keys.
        #[arg(long)]
        insecure: bool,
    },
    /// Validate the config, start every MCP server and print each federated tool with its
    /// verdict and the rule that decided it; exit 1 on any error.
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print the result as one JSON document on stdout (progress still goes to stderr).
        #[arg(long)]
        json: bool,
    },
    /// Make the running server read its config file again (SIGHUP to the process named by
    /// `data_dir/turnstile.pid`). GET /status shows the outcome under "reload".
    Reload {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Authorize turnstile at an OAuth-protected MCP server: prints the authorization URL to
    /// open, receives the redirect on a loopback port, stores the tokens encrypted.
    Login {
        /// The `[mcp_servers.NAME]` to log in to.
        server: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn config_path(flag: Option<PathBuf>, env: &Env) -> PathBuf {
    flag.or_else(|| env.var("TURNSTILE_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("tools.toml"))
}

fn main() -> ExitCode {
    turnstile::memory::set_trim(trim);
    let cli = Cli::parse();
    // The process's environment, read once here: everything after takes it from the config.
    let env = Env::process();
    // What turnstile writes (the log, files, workspaces, tokens; SQLite's own files, which take
    // no mode from us) is for its user alone: 0600 files, 0700 folders.
    turnstile::files::private_by_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(turnstile::memory::on_idle)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("turnstile: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = matches!(cli.log_format, LogFormat::Json);
    let result = match cli.command {
        Command::Serve {
            config,
            listen,
            insecure,
        } => load(&config_path(config, &env), &env).and_then(|config| {
            // Spans are exported only by `serve`, where the config says where.
            let otlp = turnstile::telemetry::OtlpTarget::resolve(&config.telemetry);
            let telemetry = turnstile::telemetry::init(json, otlp, runtime.handle())?;
            let result = runtime.block_on(serve(config, listen, insecure));
            telemetry.shutdown();
            result
        }),
        Command::Check {
            config,
            json: json_out,
        } => turnstile::telemetry::init(json, None, runtime.handle())
            .and_then(|_| runtime.block_on(check(config_path(config, &env), &env, json_out))),
        Command::Reload { config } => load(&config_path(config, &env), &env)
            .map_err(|e| format!("{e} (the server would refuse it too: fix the file first)"))
            .and_then(|config| signal_reload(&config)),
        Command::Login { server, config } => {
            turnstile::telemetry::init(json, None, runtime.handle())
                .and_then(|_| load(&config_path(config, &env), &env))
                .and_then(|config| runtime.block_on(login(config, &server)))
        }
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("turnstile: {message}");
            ExitCode::FAILURE
        }
    }
}

fn load(path: &std::path::Path, env: &Env) -> Result<Config, String> {
    config::load(path, env).map_err(|e| e.to_string())
}

/// `turnstile login SERVER`.
async fn login(config: Config, server: &str) -> Result<ExitCode, String> {
    let cfg = config
        .mcp_servers
        .iter()
        .find(|s| s.name == server)
        .ok_or_else(|| format!("{}: no [mcp_servers.{server}]", config.path.display()))?;
    let oauth = turnstile::tools::mcp::oauth::OAuth::for_server(cfg, &config.server).ok_or_else(|| {
        format!("[mcp_servers.{server}] is not an HTTP server without its own Authorization header: nothing to log in to")
    })?;
    let announce = |url: &str| {
        println!("Open this URL in a browser to authorize turnstile at {server}:");
        println!("{url}");
    };
    let scope = oauth.login(&announce).await?;
    println!("Logged in to {server} (scope: {scope:?}); tokens stored encrypted.");
    Ok(ExitCode::SUCCESS)
}

async fn serve(
    config: Config,
    listen: Option<SocketAddr>,
    insecure: bool,
) -> Result<ExitCode, String> {
    let addr = listen.unwrap_or(config.server.listen);
    let pid_file = pid_file(&config);
    // Before anything else: a SIGHUP from now on reloads rather than ends the process.
    let mut signals = Signals::new();
    let running = startup::start(config, addr, StartOptions { insecure })
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(addr = %running.addr, "turnstile listening on http://{}", running.addr);
    if let Err(e) = std::fs::write(&pid_file, format!("{}\n", std::process::id())) {
        tracing::warn!(path = %pid_file.display(), error = %e, "cannot write the pid file: `turnstile reload` will not find this server (SIGHUP still reloads)");
    }
    while signals.next().await == Signal::Reload {
        // On its own task: a stop signal is heard while a reload waits for new MCP servers.
        let reloader = running.reloader();
        tokio::spawn(async move { reloader.reload().await });
    }
    tracing::info!("shutting down: ending running turns (worker_shutdown)");
    running.stop().await;
    if std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim() == std::process::id().to_string())
    {
        let _ = std::fs::remove_file(&pid_file);
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Where `serve` writes its process id for `turnstile reload`: `data_dir/turnstile.pid` (each
/// instance has a data folder of its own).
fn pid_file(config: &Config) -> PathBuf {
    config.server.data_dir.join("turnstile.pid")
}

/// `turnstile reload`: SIGHUP to the server whose pid file the config's data folder holds.
fn signal_reload(config: &Config) -> Result<ExitCode, String> {
    let path = pid_file(config);
    let pid: i32 = std::fs::read_to_string(&path)
        .map_err(|e| {
            format!(
                "cannot read {}: {e} (is turnstile serving with this config?)",
                path.display()
            )
        })?
        .trim()
        .parse()
        .map_err(|_| format!("{} does not hold a process id", path.display()))?;
    // A pid file a crashed server left behind may name some other process by now.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"));
    if let Ok(cmdline) = &cmdline {
        if !String::from_utf8_lossy(cmdline).contains("turnstile") {
            return Err(format!(
                "{} names process {pid}, which is not turnstile (a stale pid file?)",
                path.display()
            ));
        }
    }
    #[cfg(unix)]
    {
        // SAFETY: kill only sends a signal.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot signal process {pid} (from {}): {e}",
                path.display()
            ));
        }
    }
    println!("sent SIGHUP to turnstile (pid {pid}): it reads {} again; GET /status shows the outcome under \"reload\", and the log says why a file is refused", config.path.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGHUP: read the config again.
    Reload,
    /// SIGINT or SIGTERM.
    Stop,
}

/// The signals `serve` heeds, registered once (a SIGHUP between two waits is not lost).
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                term: signal(SignalKind::terminate()).ok(),
                hup: signal(SignalKind::hangup()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        {
            let term = async {
                match &mut self.term {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let hup = async {
                match &mut self.hup {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => Signal::Stop,
                _ = term => Signal::Stop,
                Some(()) = hup => Signal::Reload,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }
}

/// `check --json` when the config cannot even be loaded: the error, exit 1.
fn check_failed_json(path: &std::path::Path, error: String) -> ExitCode {
    let doc = serde_json::json!({
        "config": path.display().to_string(),
        "ok": false,
        "tools": [],
        "servers": [],
        "unused_patterns": [],
        "errors": [error],
    });
    println!("{doc:#}");
    ExitCode::FAILURE
}

async fn check(path: PathBuf, env: &Env, json: bool) -> Result<ExitCode, String> {
    // With --json every failure is a document on stdout; without, a message on stderr.
    let fail = |e: String| {
        if json {
            Ok(check_failed_json(&path, e))
        } else {
            Err(e)
        }
    };
    let config = match load(&path, env) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if !json {
        print_check_header(&path, &config);
    }
    if let Err(e) = startup::router(&config) {
        return fail(e.to_string());
    }
    let config = std::sync::Arc::new(config);
    announce_servers(&config.mcp_servers);
    let started =
        turnstile::tools::toolbox::Toolbox::start_reporting(config.clone(), None, &print_progress)
            .await;
    let (host, report) = match started {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    let tools = host.listing();
    let names: Vec<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
    let checked = Checked {
        path: &path,
        config: &config,
        tools: &tools,
        unused: turnstile::tools::mcp::policy::unmatched(&config.policy, &names),
        failed: &report.failed,
    };
    if json {
        println!("{:#}", check_json(&checked));
    } else {
        print_check_text(&checked);
    }
    turnstile::tools::ToolHost::shutdown(&*host).await;
    if !report.failed.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// What `check` found once every server's first start-up attempt ended.
struct Checked<'a> {
    path: &'a std::path::Path,
    config: &'a Config,
    /// The federated tools.
    tools: &'a [turnstile::tools::ServerTool],
    /// Policy patterns that match no tool: (list, rule).
    unused: Vec<(&'static str, &'a config::PolicyRule)>,
    /// Servers that did not come up: (name, why).
    failed: &'a [(String, String)],
}

/// The line saying which MCP servers `check` starts and how long it may wait.
fn announce_servers(servers: &[config::McpServerConfig]) {
    if servers.is_empty() {
        return;
    }
    let longest = servers
        .iter()
        .map(|s| s.startup_timeout.as_secs())
        .max()
        .unwrap_or(0);
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    eprintln!(
        "starting {} MCP server{} (up to {longest} s): {}",
        servers.len(),
        if servers.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
}

/// A line per server as its first attempt ends: `check` is otherwise silent for up to
/// startup_timeout_s.
fn print_progress(p: turnstile::tools::mcp::ServerProgress) {
    match &p.result {
        Ok(n) => eprintln!(
            "  {}: up, {n} tool{} ({:.1} s)",
            p.server,
            if *n == 1 { "" } else { "s" },
            p.elapsed.as_secs_f64()
        ),
        Err(why) => eprintln!(
            "  {}: failed: {why} ({:.1} s)",
            p.server,
            p.elapsed.as_secs_f64()
        ),
    }
}

/// An upstream in `check --json`.
fn upstream_json(up: &turnstile::config::UpstreamConfig) -> serde_json::Value {
    serde_json::json!({
        "name": up.name,
        "provider": up.provider.as_str(),
        "base_url": up.base_url,
        "model": up.model,
        "models": up.models,
    })
}

/// `check --json`'s document.
fn check_json(c: &Checked<'_>) -> serde_json::Value {
    let config = c.config;
    serde_json::json!({
        "config": c.path.display().to_string(),
        "ok": c.failed.is_empty(),
        "upstream": upstream_json(&config.upstreams[0]),
        "upstreams": config.upstreams.iter().map(upstream_json).collect::<Vec<_>>(),
        "agents": config.agents.iter().map(|a| serde_json::json!({
            "name": a.name,
            "tools": a.tools,
            "max_steps": a.max_steps,
            "turn_timeout_s": a.turn_timeout.as_secs(),
        })).collect::<Vec<_>>(),
        "tools": c.tools.iter().map(|t| serde_json::json!({
            "name": t.spec.name,
            "server": t.server,
            "tool": t.tool,
            "verdict": t.verdict,
            "rule": t.rule,
        })).collect::<Vec<_>>(),
        "servers": config.mcp_servers.iter().map(|s| {
            let error = c.failed.iter().find(|(n, _)| *n == s.name).map(|(_, why)| why);
            serde_json::json!({
                "name": s.name,
                "scope": match s.scope { config::McpScope::Shared => "shared", config::McpScope::Session => "session" },
                "state": if error.is_some() { "failed" } else { "up" },
                "tools": c.tools.iter().filter(|t| t.server == s.name).count(),
                "error": error,
            })
        }).collect::<Vec<_>>(),
        "unused_patterns": c.unused.iter().map(|(list, rule)| serde_json::json!({
            "list": list,
            "pattern": rule.pattern,
            "line": rule.line,
        })).collect::<Vec<_>>(),
        "errors": c.failed.iter().map(|(server, why)| format!("MCP server {server}: {why}")).collect::<Vec<_>>(),
    })
}

/// `check`'s text report after the header: the tools, unused patterns, failed servers.
fn print_check_text(c: &Checked<'_>) {
    print_tools(c.tools);
    for (list, rule) in &c.unused {
        println!(
            "warning: {}:{}: policy.{list} pattern {:?} matches no tool",
            c.config.path.display(),
            rule.line,
            rule.pattern
        );
    }
    for (server, why) in c.failed {
        eprintln!("error: MCP server {server}: {why}");
    }
}

/// What `check` says about the file before starting any server.
fn print_check_header(path: &std::path::Path, config: &Config) {
    println!("{}: ok", path.display());
    for up in &config.upstreams {
        println!(
            "upstream {}: {:?} {} (model {}{})",
            up.name,
            up.provider,
            if up.base_url.is_empty() {
                "(built in)"
            } else {
                &up.base_url
            },
            up.model,
            if up.models.is_empty() {
                String::new()
            } else {
                format!(", serves {:?}", up.models)
            }
        );
    }
    for a in &config.agents {
        println!(
            "agent {}: tools {:?}, max_steps {}, turn_timeout_s {}",
            a.name,
            a.tools,
            a.max_steps,
            a.turn_timeout.as_secs()
        );
    }
}

/// The federated tools, one row each: name, verdict, rule, server.
fn print_tools(tools: &[turnstile::tools::ServerTool]) {
    let width = tools
        .iter()
        .map(|t| t.spec.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!();
    println!(
        "{:<width$}  {:<7}  {:<24}  SERVER",
        "TOOL", "VERDICT", "RULE"
    );
    for t in tools.iter() {
        let verdict = serde_json::to_value(t.verdict).ok();
        let verdict = verdict.as_ref().and_then(|v| v.as_str()).unwrap_or("?");
        println!(
            "{:<width$}  {:<7}  {:<24}  {}",
            t.spec.name, verdict, t.rule, t.server
        );
    }
    if tools.is_empty() {
        println!("(no server tools)");
    }
}
