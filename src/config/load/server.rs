//! `[server]`: where turnstile listens and keeps its data, and its connection limits.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::resolve_path;
use crate::config::raw::RawServer;
use crate::config::ServerConfig;

/// Default `[server] listen`.
const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// Default `[server] max_body_bytes`: 4 MiB.
const DEFAULT_MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// Default `[server] header_timeout_s`.
const DEFAULT_HEADER_TIMEOUT_S: i64 = 10;
/// Default `[server] idle_timeout_s`.
const DEFAULT_IDLE_TIMEOUT_S: i64 = 60;
/// Default `[server] max_connections`.
const DEFAULT_MAX_CONNECTIONS: i64 = 4096;
/// Idle sessions kept in memory by default.
const DEFAULT_SESSION_CACHE: i64 = 1000;

/// `IP:PORT`, or `localhost:PORT` for 127.0.0.1.
fn parse_listen(s: &str) -> Option<SocketAddr> {
    if let Ok(addr) = s.parse() {
        return Some(addr);
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.eq_ignore_ascii_case("localhost") {
        let port: u16 = port.parse().ok()?;
        return Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    None
}

pub(super) fn server(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawServer>>,
    base_dir: &Path,
) -> Result<ServerConfig, ConfigError> {
    let default = RawServer::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&default);

    let dir = |v: Option<&Spanned<String>>, key: &str, default: &str| {
        folder(cx, base_dir, v, key, default)
    };
    Ok(ServerConfig {
        listen: listen(cx, t)?,
        data_dir: dir(t.data_dir.as_ref(), "server.data_dir", "data")?,
        sandboxes: dir(t.sandboxes.as_ref(), "server.sandboxes", "sandboxes")?,
        api_keys_env: cx.env_var_name(t.api_keys_env.as_ref(), "server.api_keys_env")?,
        secret_key_env: cx.env_var_name(t.secret_key_env.as_ref(), "server.secret_key_env")?,
        public_meta: t.public_meta.unwrap_or(true),
        fsync: t.fsync.unwrap_or(false),
        max_body_bytes: cx
            .int(
                t.max_body_bytes.as_ref(),
                "server.max_body_bytes",
                DEFAULT_MAX_BODY_BYTES as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
        session_cache: cx
            .int(
                t.session_cache.as_ref(),
                "server.session_cache",
                DEFAULT_SESSION_CACHE,
                0,
                i64::MAX,
            )?
            .unsigned_abs() as usize,
        drain: std::time::Duration::from_secs(
            cx.int(t.drain_s.as_ref(), "server.drain_s", 0, 0, 3600)?
                .unsigned_abs(),
        ),
        header_timeout: cx.secs(
            t.header_timeout_s.as_ref(),
            "server.header_timeout_s",
            DEFAULT_HEADER_TIMEOUT_S,
        )?,
        idle_timeout: cx.secs(
            t.idle_timeout_s.as_ref(),
            "server.idle_timeout_s",
            DEFAULT_IDLE_TIMEOUT_S,
        )?,
        max_connections: cx.int(
            t.max_connections.as_ref(),
            "server.max_connections",
            DEFAULT_MAX_CONNECTIONS,
            1,
            i64::from(u32::MAX),
        )? as usize,
        allowed_hosts: match &t.allowed_hosts {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|h| host_name(cx, h))
                    .collect::<Result<_, _>>()?,
            ),
        },
        metrics_listen: metrics_listen(cx, t)?,
    })
}

/// `[server] listen`, default [`DEFAULT_LISTEN`].
fn listen(cx: &Cx<'_>, t: &RawServer) -> Result<SocketAddr, ConfigError> {
    Ok(match &t.listen {
        None => {
            parse_listen(DEFAULT_LISTEN).unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 8787)))
        }
        Some(v) => socket_addr(
            cx,
            v,
            "server.listen",
            "\"127.0.0.1:8787\" or \"0.0.0.0:8787\"",
        )?,
    })
}

/// `[server] metrics_listen`, none by default.
fn metrics_listen(cx: &Cx<'_>, t: &RawServer) -> Result<Option<SocketAddr>, ConfigError> {
    t.metrics_listen
        .as_ref()
        .map(|v| socket_addr(cx, v, "server.metrics_listen", "\"127.0.0.1:9464\""))
        .transpose()
}

/// A host name of `[server] allowed_hosts`: a DNS name, an IPv4 address, `[IPv6]`, or `*`.
fn host_name(cx: &Cx<'_>, v: &Spanned<String>) -> Result<String, ConfigError> {
    let h = v.get_ref().trim().to_ascii_lowercase();
    let dns = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let v6 = h.starts_with('[')
        && h.ends_with(']')
        && h[1..h.len() - 1].parse::<std::net::Ipv6Addr>().is_ok();
    if dns || v6 || h == "*" {
        return Ok(h);
    }
    Err(cx.err(
        v.span(),
        "server.allowed_hosts",
        format!(
            "{:?} is not a host name: write a name without scheme or port, e.g. \"gw.example.com\", \"10.0.0.5\", \"[fd00::5]\", or \"*\" for any",
            v.get_ref()
        ),
    ))
}

/// A socket address for `key`; the error shows `example` (already quoted).
fn socket_addr(
    cx: &Cx<'_>,
    v: &Spanned<String>,
    key: &str,
    example: &str,
) -> Result<SocketAddr, ConfigError> {
    parse_listen(v.get_ref()).ok_or_else(|| {
        cx.err(
            v.span(),
            key,
            format!(
                "{:?} is not a socket address: write IP:PORT, e.g. {example}",
                v.get_ref()
            ),
        )
    })
}

/// A folder, `default` when absent, resolved against the config file's folder.
fn folder(
    cx: &Cx<'_>,
    base_dir: &Path,
    v: Option<&Spanned<String>>,
    key: &str,
    default: &str,
) -> Result<PathBuf, ConfigError> {
    let p = match v {
        None => default.to_string(),
        Some(v) => cx.non_empty(v, key, "the path")?,
    };
    Ok(resolve_path(base_dir, Path::new(&p)))
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
