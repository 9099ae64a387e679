use super::super::test_support::*;
use crate::config::{McpScope, McpTransport, SandboxKind};
use std::path::Path;
use std::time::Duration;

#[test]
fn stdio_args_and_env_may_use_set_variables_and_an_unset_one_is_an_error_naming_it() {
    let c = ok_env(
            "[mcp_servers.gh]\ncommand = \"srv\"\nargs = [\"--token=${TOKEN}\", \"$${LITERAL}\"]\nenv = { ORG = \"${ORG}\" }\n",
            &[],
        );
    match &c.mcp_servers[0].transport {
        McpTransport::Stdio { args, env, .. } => {
            // Kept as written: expanded when the child is spawned.
            assert_eq!(args[0], "--token=${TOKEN}");
            assert_eq!(env["ORG"], "${ORG}");
        }
        McpTransport::Http { .. } => panic!("stdio expected"),
    }
    let e = bad_env(
        "[mcp_servers.gh]\ncommand = \"srv\"\nargs = [\"--token=${GH_TOKEN}\"]\n",
        &[],
    );
    assert_eq!(e.key.as_deref(), Some("mcp_servers.gh.args"));
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("${GH_TOKEN} is not set"), "{e}");
    let e = bad_env(
        "[mcp_servers.gh]\ncommand = \"srv\"\nenv = { KEY = \"${GH_KEY}\" }\n",
        &[],
    );
    assert_eq!(e.key.as_deref(), Some("mcp_servers.gh.env.KEY"));
    assert!(e.message.contains("GH_KEY"), "{e}");
    let e = bad_env(
        "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { X-Org = \"${NO_ORG}\" }\n",
        &[],
    );
    assert_eq!(e.key.as_deref(), Some("upstream.headers.X-Org"));
    assert!(e.message.contains("NO_ORG"), "{e}");
}

#[test]
fn mcp_server_needs_exactly_one_of_command_and_url() {
    let e = bad("[server]\n\n[mcp_servers.fs]\nargs = [\"x\"]\n");
    assert_eq!(e.line, Some(3));
    assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.command"));
    assert!(
        e.message.starts_with("missing command (or url)"),
        "{}",
        e.message
    );

    let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nurl = \"http://h/mcp\"\n");
    assert_eq!(e.line, Some(3));
    assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.url"));
    assert!(
        e.message.starts_with("both command and url"),
        "{}",
        e.message
    );

    let e = bad("[mcp_servers.web]\nurl = \"http://h/mcp\"\nargs = [\"x\"]\n");
    assert_eq!(e.key.as_deref(), Some("mcp_servers.web.args"));
    assert_eq!(e.line, Some(3));
    let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nheaders = { A = \"b\" }\n");
    assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.headers"));
    let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nscope = \"global\"\n");
    assert_eq!(e.line, Some(3));
    assert!(
        e.message.contains("(expected \"shared\" or \"session\")"),
        "{}",
        e.message
    );
    let e = bad("[mcp_servers.a__b]\ncommand = \"x\"\n");
    assert_eq!(e.key.as_deref(), Some("mcp_servers.a__b"));
    let e = bad("[mcp_servers.\"a b\"]\ncommand = \"x\"\n");
    assert_eq!(e.key.as_deref(), Some("mcp_servers.\"a b\""));
    let e = bad("[mcp_servers.fs]\ncommand = \"x\"\ntimeout_s = 0\n");
    assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.timeout_s"));
    assert_eq!(e.line, Some(3));
}

#[test]
fn mcp_server_values_and_defaults() {
    let c = ok("[mcp_servers.fs]\ncommand = \"npx\"\nargs = [\"{workspace}\"]\nscope = \"session\"\nsandbox = \"landlock\"\ntimeout_s = 5\nstartup_timeout_s = 7\n\n[mcp_servers.rel]\ncommand = \"./srv\"\ncwd = \"tools\"\n\n[mcp_servers.web]\nurl = \"https://h.example/mcp\"\nheaders = { Authorization = \"Bearer ${T}\" }\n");
    let names: Vec<&str> = c.mcp_servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["fs", "rel", "web"]);
    let fs = &c.mcp_servers[0];
    assert_eq!(
        (fs.scope, fs.sandbox, fs.line),
        (McpScope::Session, SandboxKind::Landlock, 1)
    );
    assert_eq!(fs.timeout, Duration::from_secs(5));
    assert_eq!(fs.startup_timeout, Duration::from_secs(7));
    match &c.mcp_servers[1].transport {
        McpTransport::Stdio { cwd, .. } => {
            assert_eq!(cwd.as_deref(), Some(Path::new("/etc/turnstile/tools")))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.mcp_servers[1].line, 9);
    match &c.mcp_servers[2].transport {
        McpTransport::Http { url, headers } => {
            assert_eq!(url, "https://h.example/mcp");
            assert_eq!(
                headers.get("Authorization").map(String::as_str),
                Some("Bearer ${T}")
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.mcp_servers[2].line, 13);
}
