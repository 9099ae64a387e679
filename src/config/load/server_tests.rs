use super::super::test_support::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

#[test]
fn allowed_hosts_are_host_names() {
    let c = ok("[server]\nallowed_hosts = [\"GW.example.com\", \"10.0.0.5\", \"[fd00::5]\"]\n");
    assert_eq!(
        c.server.allowed_hosts.as_deref(),
        Some(
            &[
                "gw.example.com".to_string(),
                "10.0.0.5".into(),
                "[fd00::5]".into()
            ][..]
        )
    );
    assert_eq!(ok("").server.allowed_hosts, None);
    let c = ok_env("", &[("TURNSTILE_ALLOWED_HOSTS", "a.example, b.example")]);
    assert_eq!(
        c.server.allowed_hosts.as_deref(),
        Some(&["a.example".to_string(), "b.example".into()][..])
    );
    for bad_host in ["https://gw.example.com", "gw.example.com:443", "", "a b"] {
        let e = bad(&format!(
            "[server]\nallowed_hosts = [\n  {bad_host:?},\n]\n"
        ));
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("server.allowed_hosts"));
        assert!(e.message.contains("is not a host name"), "{e}");
    }
}

#[test]
fn server_keys_come_from_turnstile_variables_over_the_file() {
    let file = "[server]\nlisten = \"127.0.0.1:1111\"\nmax_body_bytes = 10\n";
    let c = ok_env(
        file,
        &[
            ("TURNSTILE_LISTEN", "127.0.0.1:2222"),
            ("TURNSTILE_MAX_BODY_BYTES", "2048"),
            ("TURNSTILE_FSYNC", "true"),
            ("TURNSTILE_IDLE_TIMEOUT_S", "7"),
            ("TURNSTILE_DATA_DIR", "/var/lib/turnstile"),
            ("TURNSTILE_SESSION_CACHE", ""),
        ],
    );
    assert_eq!(c.server.listen.port(), 2222);
    assert_eq!(c.server.max_body_bytes, 2048);
    assert!(c.server.fsync);
    assert_eq!(c.server.idle_timeout, Duration::from_secs(7));
    assert_eq!(c.server.data_dir, Path::new("/var/lib/turnstile"));
    assert_eq!(c.server.session_cache, 1000, "an empty variable is unset");
    // With no [server] table at all.
    let c = ok_env("", &[("TURNSTILE_MAX_CONNECTIONS", "3")]);
    assert_eq!(c.server.max_connections, 3);

    let e = bad_env(file, &[("TURNSTILE_MAX_BODY_BYTES", "lots")]);
    assert_eq!(e.key.as_deref(), Some("TURNSTILE_MAX_BODY_BYTES"));
    assert!(e.message.contains("\"lots\" is not a whole number"), "{e}");
    let e = bad_env(file, &[("TURNSTILE_MAX_CONNECTIONS", "0")]);
    assert_eq!(e.line, None);
    assert_eq!(e.key.as_deref(), Some("server.max_connections"));
    assert!(
        e.message.contains("out of range") && e.message.contains("TURNSTILE_MAX_CONNECTIONS"),
        "{e}"
    );
    let e = bad_env(file, &[("TURNSTILE_LISTEN", "nowhere")]);
    assert!(e.to_string().contains("TURNSTILE_LISTEN"), "{e}");
    let e = bad_env(file, &[("TURNSTILE_PUBLIC_META", "maybe")]);
    assert!(e.to_string().contains("TURNSTILE_PUBLIC_META"), "{e}");
}

#[test]
fn listen_accepts_localhost_and_rejects_junk() {
    let c = ok("[server]\nlisten = \"localhost:9000\"\n");
    assert_eq!(
        c.server.listen,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 9000))
    );
    let c = ok("[server]\nlisten = \"[::1]:9000\"\n");
    assert_eq!(c.server.listen.port(), 9000);
    let e = bad("[server]\nlisten = \"localhost\"\n");
    assert_eq!(e.line, Some(2));
    assert_eq!(e.key.as_deref(), Some("server.listen"));
}
