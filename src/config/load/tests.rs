use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::test_support::*;
use super::*;
use crate::config::{McpScope, McpTransport, PolicyRule, ProviderKind, SandboxKind, Verdict};

/// The example of CONTRACT.md, verbatim.
const CONTRACT_EXAMPLE: &str = r#"[server]
listen    = "127.0.0.1:8787"
data_dir  = "data"        # the event log and delivered files (embedded store, created on demand)
sandboxes = "sandboxes"   # one workspace folder per session: sandboxes/<session id>/
# api_keys_env = "TURNSTILE_API_KEYS"   # comma-separated bearer keys; see Security

[upstream]
provider    = "openai"    # "openai" (chat completions), "anthropic" (messages), "echo" (built-in)
base_url    = "http://127.0.0.1:11434/v1"
api_key_env = "OPENAI_API_KEY"
model       = "qwen3:8b"
# max_tokens = 4096
# timeout_s  = 600        # whole upstream call
# retries    = 2          # on connect errors, 429 and 5xx (and a stream broken midway)

[agents.assistant]        # each table is one AAP agent in GET /meta; the first is the default
title          = "Assistant"
system_prompt  = "You are a helpful assistant."
tools          = ["*"]    # globs over federated names: which tools this agent may use
max_steps      = 32       # model calls per turn
turn_timeout_s = 3600     # then turn.failed reason "timeout"
thinking       = false    # default of the AAP option "thinking" ("on" / "off"): agent.thinking events only when on
# models = ["a", "b"]     # offered to clients as the AAP select option "model"

[mcp_servers.time]        # a stdio server, launched as a child process
command = "python3"
args    = ["-m", "mcp_server_time"]
env     = { TZ = "UTC" }  # children inherit no secrets: only a minimal environment plus this table
# scope   = "shared"      # "shared": one process for all sessions (default)
#                         # "session": one process per session, cwd = its workspace, "{workspace}" in args replaced
# timeout_s = 60          # per tool call

[mcp_servers.shop]        # a remote server over streamable HTTP
url = "http://127.0.0.1:9000/mcp"
# headers = { Authorization = "Bearer ${SHOP_TOKEN}" }

[policy]                  # globs over the federated tool names (globset syntax)
trust   = ["mcp__time__*", "deliver_file"]   # may run inline (trust: true)
ask     = ["mcp__fs__write_*"]               # every call pauses for the client's permission
deny    = ["mcp__fs__move_file"]             # never offered to the model, refused if called
default = "ask"                              # for a tool that no pattern names
"#;

#[test]
fn contract_example_loads_with_its_values() {
    let c = ok(CONTRACT_EXAMPLE);
    assert_eq!(c.path, path());
    assert_eq!(
        c.server.listen,
        "127.0.0.1:8787".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(c.server.data_dir, Path::new("/etc/turnstile/data"));
    assert_eq!(c.server.sandboxes, Path::new("/etc/turnstile/sandboxes"));
    assert_eq!(c.server.api_keys_env, None);

    assert_eq!(c.upstreams[0].provider, ProviderKind::OpenAi);
    assert_eq!(c.upstreams[0].base_url, "http://127.0.0.1:11434/v1");
    assert_eq!(
        c.upstreams[0].api_key_env.as_deref(),
        Some("OPENAI_API_KEY")
    );
    assert_eq!(c.upstreams[0].model, "qwen3:8b");
    assert_eq!(c.upstreams[0].max_tokens, None);
    assert_eq!(c.upstreams[0].timeout, Duration::from_secs(600));
    assert_eq!(c.upstreams[0].retries, 2);

    assert_eq!(c.agents.len(), 1);
    let a = c.default_agent();
    assert_eq!(a.name, "assistant");
    assert_eq!(a.title.as_deref(), Some("Assistant"));
    assert_eq!(a.system_prompt, "You are a helpful assistant.");
    assert_eq!(a.tools, vec!["*"]);
    assert!(a.tool_globs.is_match("mcp__time__get_current_time"));
    assert!(a.tool_globs.is_match("deliver_file"));
    assert_eq!(a.max_steps, 32);
    assert_eq!(a.turn_timeout, Duration::from_secs(3600));
    assert!(!a.thinking);
    assert!(a.models.is_empty());

    assert_eq!(c.mcp_servers.len(), 2);
    let time = &c.mcp_servers[0];
    assert_eq!(time.name, "time");
    assert_eq!(time.line, 25);
    assert_eq!(time.scope, McpScope::Shared);
    assert_eq!(time.sandbox, SandboxKind::None);
    assert_eq!(time.timeout, Duration::from_secs(60));
    assert_eq!(time.startup_timeout, Duration::from_secs(30));
    match &time.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            assert_eq!(command, "python3");
            assert_eq!(args, &vec!["-m".to_string(), "mcp_server_time".to_string()]);
            assert_eq!(env.get("TZ").map(String::as_str), Some("UTC"));
            assert_eq!(env.len(), 1);
            assert_eq!(cwd, &None);
        }
        other => panic!("expected stdio, got {other:?}"),
    }
    let shop = &c.mcp_servers[1];
    assert_eq!(shop.name, "shop");
    assert_eq!(shop.line, 33);
    match &shop.transport {
        McpTransport::Http { url, headers } => {
            assert_eq!(url, "http://127.0.0.1:9000/mcp");
            assert!(headers.is_empty());
        }
        other => panic!("expected http, got {other:?}"),
    }

    let p = &c.policy;
    let patterns =
        |rules: &[PolicyRule]| rules.iter().map(|r| r.pattern.clone()).collect::<Vec<_>>();
    assert_eq!(patterns(&p.trust), vec!["mcp__time__*", "deliver_file"]);
    assert_eq!(p.trust[0].line, 38);
    assert_eq!(p.trust[1].line, 38);
    assert!(p.trust[0].glob.is_match("mcp__time__get_current_time"));
    assert!(!p.trust[0].glob.is_match("mcp__shop__buy"));
    assert_eq!(patterns(&p.ask), vec!["mcp__fs__write_*"]);
    assert_eq!(p.ask[0].line, 39);
    assert_eq!(patterns(&p.deny), vec!["mcp__fs__move_file"]);
    assert_eq!(p.deny[0].line, 40);
    assert_eq!(p.default, Verdict::Ask);

    assert_eq!(c.files.max_bytes, 100 * 1024 * 1024);
    assert_eq!(c.server.max_body_bytes, 4 * 1024 * 1024);
    assert!(c.server.public_meta);
}

#[test]
fn empty_file_gets_echo_default_agent_and_every_default() {
    let c = load_str(Path::new("tools.toml"), "", &Env::default()).unwrap();
    assert_eq!(
        c.server.listen,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 8787))
    );
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(c.server.data_dir, cwd.join("data"));
    assert_eq!(c.server.sandboxes, cwd.join("sandboxes"));
    assert_eq!(c.server.api_keys_env, None);
    assert!(c.server.public_meta);
    assert_eq!(c.server.max_body_bytes, 4_194_304);

    assert_eq!(c.upstreams[0].provider, ProviderKind::Echo);
    assert_eq!(c.upstreams[0].model, "echo");
    assert_eq!(c.upstreams[0].base_url, "");
    assert_eq!(c.upstreams[0].api_key_env, None);
    assert_eq!(c.upstreams[0].max_tokens, None);
    assert_eq!(c.upstreams[0].timeout, Duration::from_secs(600));
    assert_eq!(c.upstreams[0].retries, 2);

    assert_eq!(c.agents.len(), 1);
    let a = c.default_agent();
    assert_eq!(a.name, "assistant");
    assert_eq!(a.title.as_deref(), Some("Assistant"));
    assert_eq!(a.description, None);
    assert_eq!(a.version, "0.1.0");
    assert_eq!(a.system_prompt, "You are a helpful assistant.");
    assert_eq!(a.tools, vec!["*"]);
    assert!(a.tool_globs.is_match("mcp__fs__read_file"));
    assert_eq!(a.max_steps, 32);
    assert_eq!(a.turn_timeout, Duration::from_secs(3600));
    assert!(!a.thinking);
    assert!(a.models.is_empty());

    assert!(c.mcp_servers.is_empty());
    assert!(c.policy.trust.is_empty() && c.policy.ask.is_empty() && c.policy.deny.is_empty());
    assert_eq!(c.policy.default, Verdict::Ask);
    assert_eq!(c.files.max_bytes, 104_857_600);
}

#[test]
fn unknown_key_names_line_and_key() {
    let e = bad("[server]\nlisten = \"127.0.0.1:1\"\n\n[agents.a]\ntitle = \"A\"\nmax_step = 3\n");
    assert_eq!(e.line, Some(6));
    assert_eq!(e.key.as_deref(), Some("agents.a.max_step"));
    assert!(
        e.message.contains("unknown field `max_step`"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("`max_steps`"),
        "lists the expected keys: {}",
        e.message
    );
    assert!(e
        .to_string()
        .starts_with("tools.toml:6: agents.a.max_step: unknown field `max_step`"));

    let e = bad("# hi\nbogus = 1\n");
    assert_eq!(e.line, Some(2));
    assert_eq!(e.key.as_deref(), Some("bogus"));
    assert!(e.message.contains("`mcp_servers`"), "{}", e.message);
}

#[test]
fn wrong_type_and_syntax_errors_are_one_line_with_a_line() {
    let e = bad("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nretries = \"two\"\n");
    assert_eq!(e.line, Some(4));
    assert_eq!(e.key.as_deref(), Some("upstream.retries"));
    assert!(e.message.contains("expected an integer"), "{}", e.message);

    let e = bad("[server]\nlisten = \"127.0.0.1:1\"\n[agents\n");
    assert_eq!(e.line, Some(3));
    assert!(e.message.starts_with("invalid TOML:"), "{}", e.message);

    let e = bad("[server]\nlisten = \"a:1\"\nlisten = \"b:2\"\n");
    assert_eq!(e.line, Some(3));
}

#[test]
fn relative_paths_resolve_against_the_file_folder() {
    let c = ok("[server]\ndata_dir = \"var/data\"\nsandboxes = \"/srv/sb\"\n");
    assert_eq!(c.server.data_dir, Path::new("/etc/turnstile/var/data"));
    assert_eq!(c.server.sandboxes, Path::new("/srv/sb"));
    assert_eq!(
        resolve_path(Path::new("/a/b"), Path::new("c")),
        Path::new("/a/b/c")
    );
    assert_eq!(
        resolve_path(Path::new("/a/b"), Path::new("/c")),
        Path::new("/c")
    );
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(resolve_path(Path::new(""), Path::new("c")), cwd.join("c"));
    assert_eq!(
        resolve_path(Path::new("conf"), Path::new("data")),
        cwd.join("conf/data")
    );
    let rel = load_str(Path::new("tools.toml"), "", &Env::default()).unwrap();
    assert!(rel.server.data_dir.is_absolute() && rel.server.sandboxes.is_absolute());
}

#[test]
fn other_sections_and_policy_default() {
    let c = ok("[server]\npublic_meta = false\nmax_body_bytes = 1024\napi_keys_env = \"KEYS\"\nfsync = true\nsession_cache = 0\n[files]\nmax_bytes = 10\n[policy]\ndefault = \"deny\"\n");
    assert!(c.server.fsync);
    assert_eq!(c.server.session_cache, 0);
    assert_eq!(ok("").server.session_cache, 1000);
    assert!(!c.server.public_meta);
    assert_eq!(c.server.max_body_bytes, 1024);
    assert_eq!(c.server.api_keys_env.as_deref(), Some("KEYS"));
    assert_eq!(c.files.max_bytes, 10);
    assert_eq!(c.policy.default, Verdict::Deny);
    let e = bad("[policy]\ndefault = \"allow\"\n");
    assert_eq!(e.key.as_deref(), Some("policy.default"));
    assert!(e
        .message
        .contains("(expected \"trust\", \"ask\" or \"deny\")"));
    let e = bad("[server]\nsession_cache = -1\n");
    assert_eq!(e.key.as_deref(), Some("server.session_cache"));
    assert_eq!(ok("").server.drain, std::time::Duration::ZERO);
    assert_eq!(
        ok("[server]\ndrain_s = 20\n").server.drain,
        std::time::Duration::from_secs(20)
    );
    let e = bad("[server]\ndrain_s = 4000\n");
    assert_eq!(e.key.as_deref(), Some("server.drain_s"));
    assert_eq!(c.limits.queued_turns, 32);
    let c = ok("[server]\nheader_timeout_s = 3\nidle_timeout_s = 5\nmax_connections = 7\n[limits]\nqueued_turns = 2\nrunning_turns = 3\nsessions_per_key = 4\nsubscribers_per_session = 5\nfiles_per_message = 6\nsession_servers = 7\ndisk_bytes_per_key = 8\ntool_result_bytes = 9\n[agents.a]\nclient_system_prompt = false\napproval_ttl_s = 11\n[mcp_servers.m]\ncommand = \"x\"\nsandbox = \"landlock\"\nnetwork = true\n");
    assert_eq!(c.server.header_timeout, Duration::from_secs(3));
    assert_eq!(c.server.idle_timeout, Duration::from_secs(5));
    assert_eq!(c.server.max_connections, 7);
    let l = &c.limits;
    assert_eq!(
        (
            l.queued_turns,
            l.running_turns,
            l.sessions_per_key,
            l.subscribers_per_session
        ),
        (2, 3, 4, 5)
    );
    assert_eq!(
        (
            l.files_per_message,
            l.session_servers,
            l.disk_bytes_per_key,
            l.tool_result_bytes
        ),
        (6, 7, 8, 9)
    );
    assert!(!c.agents[0].client_system_prompt);
    assert_eq!(c.agents[0].approval_ttl, Duration::from_secs(11));
    assert!(c.mcp_servers[0].network);
    let d = ok("");
    assert_eq!(d.server.header_timeout, Duration::from_secs(10));
    assert_eq!(d.server.idle_timeout, Duration::from_secs(60));
    assert_eq!(d.server.max_connections, 4096);
    assert!(d.agents[0].client_system_prompt);
    assert_eq!(d.agents[0].approval_ttl, Duration::from_secs(3600));
    assert_eq!(d.limits.disk_bytes_per_key, 10 << 30);
    assert_eq!(d.limits.tool_result_bytes, 262_144);
    let c = ok("[server]\nmetrics_listen = \"127.0.0.1:9464\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4317\"\n[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { X-Org = \"${ORG}\" }\n[agents.a]\nwrap_up_s = 5\ncontext_tokens = 32000\ncompact_at = 0.5\n");
    assert_eq!(
        c.server.metrics_listen,
        Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 9464)))
    );
    assert_eq!(
        c.telemetry.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4317")
    );
    assert_eq!(c.upstreams[0].headers["X-Org"], "${ORG}", "kept as written");
    assert_eq!(c.agents[0].wrap_up, Duration::from_secs(5));
    assert_eq!(c.agents[0].context_tokens, Some(32000));
    assert_eq!(c.agents[0].compact_at, 0.5);
    assert_eq!(d.agents[0].wrap_up, Duration::from_secs(60));
    assert_eq!(
        (d.agents[0].context_tokens, d.agents[0].compact_at),
        (None, 0.8)
    );
    assert_eq!(d.server.metrics_listen, None);
    let e = bad("[agents.a]\ncompact_at = 1.5\n");
    assert_eq!(e.key.as_deref(), Some("agents.a.compact_at"));
    let e = bad(
        "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { \"Bad Name\" = \"x\" }\n",
    );
    assert_eq!(e.key.as_deref(), Some("upstream.headers"));
    let e = bad("[limits]\nqueued_turns = 0\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(2), Some("limits.queued_turns"))
    );
    let e = bad("[limits]\nbogus = 1\n");
    assert!(e.to_string().contains("bogus"), "{e}");
    let e = bad("[files]\nmax_bytes = -5\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(2), Some("files.max_bytes"))
    );
}

#[test]
fn missing_file_names_it() {
    let e = load(Path::new("/nonexistent/dir/tools.toml"), &Env::default()).unwrap_err();
    assert_eq!(e.path, Path::new("/nonexistent/dir/tools.toml"));
    assert_eq!(e.line, None);
    assert!(e
        .to_string()
        .starts_with("/nonexistent/dir/tools.toml: config file not found"));
}

#[test]
fn never_panics_on_odd_input() {
    for text in [
        "\u{feff}",
        "[server]\nlisten = \"",
        "agents = 5",
        "[agents]\nx = 1",
        "mcp_servers.fs.command = 3",
        "[[agents]]\n",
        "[policy]\ntrust = [1]",
        "[policy]\ntrust = \"x\"",
        "[upstream]\ntimeout_s = 99999999999999999",
        "\0\0\0",
        "[mcp_servers.x]\nurl = \"http://h\"\nheaders = { \"bad name\" = \"v\" }",
        "[mcp_servers.x]\ncommand = \"c\"\nenv = { \"A=B\" = \"v\" }",
    ] {
        let r = load_str(Path::new("t.toml"), text, &Env::default());
        if let Err(e) = r {
            let shown = e.to_string();
            assert!(!shown.contains('\n'), "{shown}");
            println!("{shown}");
        }
    }
}

#[test]
fn repository_example_is_valid_and_uses_echo() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tools.toml"));
    let c = load(path, &Env::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.upstreams[0].provider, ProviderKind::Echo);
    assert_eq!(
        c.server.listen,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 8787))
    );
    assert_eq!(
        c.server.data_dir,
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
    );
    assert_eq!(c.default_agent().name, "assistant");
    assert!(c.mcp_servers.is_empty());
    assert_eq!(c.policy.trust.len(), 1);
    assert_eq!(c.policy.trust[0].pattern, "deliver_file");
    assert_eq!(c.policy.default, Verdict::Ask);
}
