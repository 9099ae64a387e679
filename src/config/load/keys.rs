//! `[keys.*]`: the principals (see [`crate::config::KeyConfig`]). Where each one's secret comes
//! from is checked here; a `key_env` variable is read at start-up, where an unset one stops the
//! server (as `[server] api_keys_env` does).

use indexmap::IndexMap;
use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::{is_name, key_path};
use crate::config::raw::RawKey;
use crate::config::{AgentConfig, KeyConfig, KeySecret, Scope};

pub(super) fn keys(
    cx: &Cx<'_>,
    raw: Option<&IndexMap<String, Spanned<RawKey>>>,
    agents: &[AgentConfig],
) -> Result<Vec<KeyConfig>, ConfigError> {
    let mut out: Vec<KeyConfig> = Vec::new();
    for (name, table) in raw.into_iter().flatten() {
        let key = key(cx, name, table, agents)?;
        // The same digest for two principals: which one a request is would be a guess (the
        // keys of `key_env` variables are compared at start-up).
        let digests = key
            .secrets
            .iter()
            .filter(|(_, s)| matches!(s, KeySecret::Sha256(_)));
        for (field, secret) in digests {
            if let Some(other) = out
                .iter()
                .find(|k| k.secrets.iter().any(|(_, s)| s == secret))
            {
                return Err(cx.err(
                    table.span(),
                    &key_path(&["keys", name, field]),
                    format!(
                        "the same key as [keys.{}]: give each principal a key of its own",
                        other.name
                    ),
                ));
            }
        }
        out.push(key);
    }
    Ok(out)
}

fn key(
    cx: &Cx<'_>,
    name: &str,
    table: &Spanned<RawKey>,
    agents: &[AgentConfig],
) -> Result<KeyConfig, ConfigError> {
    let at = |k: &str| key_path(&["keys", name, k]);
    if !is_name(name) || name.len() > 64 {
        return Err(cx.err(
            table.span(),
            &key_path(&["keys", name]),
            format!("invalid principal name {name:?}: use at most 64 letters, digits, '_' and '-' (it names the principal in logs and in what it owns)"),
        ));
    }
    let t = table.get_ref();
    let mut secrets = Vec::new();
    let first = secret(
        cx,
        table,
        name,
        ("key_env", &t.key_env),
        ("key_sha256", &t.key_sha256),
    )?;
    let Some(first) = first else {
        return Err(cx.err(
            table.span(),
            &key_path(&["keys", name]),
            "no key: give key_env (the environment variable holding the key) or key_sha256 (the key's SHA-256 digest in hex)",
        ));
    };
    secrets.push(first);
    let next = (
        ("key_env_next", &t.key_env_next),
        ("key_sha256_next", &t.key_sha256_next),
    );
    secrets.extend(secret(cx, table, name, next.0, next.1)?);
    Ok(KeyConfig {
        name: name.to_string(),
        secrets,
        scope: Scope {
            agents: scope_agents(cx, table, &at("agents"), agents)?,
            tools: scope_tools(cx, table, &at("tools"))?,
            admin: t.admin.unwrap_or(false),
        },
        budgets: super::budget_keys::budgets(
            cx,
            &key_path(&["keys", name]),
            super::budget_keys::RawBudgets {
                requests_per_minute: t.requests_per_minute.as_ref(),
                tokens_per_day: t.tokens_per_day.as_ref(),
                tool_calls_per_day: t.tool_calls_per_day.as_ref(),
                usd_per_month: t.usd_per_month.as_ref(),
            },
        )?,
    })
}

type Field<'a> = (&'static str, &'a Option<Spanned<String>>);

/// One secret, from an `_env` key or a `_sha256` one (never both).
fn secret(
    cx: &Cx<'_>,
    table: &Spanned<RawKey>,
    name: &str,
    (env_key, env): Field<'_>,
    (sha_key, sha): Field<'_>,
) -> Result<Option<(&'static str, KeySecret)>, ConfigError> {
    match (env, sha) {
        (Some(_), Some(_)) => Err(cx.err(
            table.span(),
            &key_path(&["keys", name]),
            format!("both {env_key} and {sha_key}: give one of them (where the key is, or its SHA-256 digest)"),
        )),
        (Some(v), None) => {
            let var = cx.env_var_name(Some(v), &key_path(&["keys", name, env_key]))?;
            Ok(var.map(|var| (env_key, KeySecret::Env(var))))
        }
        (None, Some(v)) => {
            let digest = hex_digest(v.get_ref()).ok_or_else(|| {
                cx.err(
                    v.span(),
                    &key_path(&["keys", name, sha_key]),
                    "not a SHA-256 digest: give 64 hex digits, e.g. the output of `printf %s \"$KEY\" | sha256sum`",
                )
            })?;
            Ok(Some((sha_key, KeySecret::Sha256(digest))))
        }
        (None, None) => Ok(None),
    }
}

/// 64 hex digits (either case) as 32 bytes.
fn hex_digest(s: &str) -> Option<[u8; 32]> {
    let s = s.trim().as_bytes();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(out)
}

/// `agents`: each a configured agent, once; `None` when absent (every agent).
fn scope_agents(
    cx: &Cx<'_>,
    table: &Spanned<RawKey>,
    key: &str,
    agents: &[AgentConfig],
) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(list) = &table.get_ref().agents else {
        return Ok(None);
    };
    let known = || {
        let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
        names.join(", ")
    };
    if list.is_empty() {
        return Err(cx.err(
            table.span(),
            key,
            format!(
                "names no agent; list the agents this key may use (the agents are: {}), or leave the key out for every agent",
                known()
            ),
        ));
    }
    let mut names: Vec<String> = Vec::new();
    for v in list {
        let name = v.get_ref();
        if !agents.iter().any(|a| &a.name == name) {
            return Err(cx.err(
                v.span(),
                key,
                format!(
                    "no agent named {name:?}; the agents are: {} (each needs an [agents.NAME] table)",
                    known()
                ),
            ));
        }
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    Ok(Some(names))
}

/// `tools`: globs over federated tool names; `None` when absent (no narrowing).
fn scope_tools(
    cx: &Cx<'_>,
    table: &Spanned<RawKey>,
    key: &str,
) -> Result<Option<std::sync::Arc<globset::GlobSet>>, ConfigError> {
    let Some(patterns) = &table.get_ref().tools else {
        return Ok(None);
    };
    let set = cx.glob_set(patterns, table.span(), key)?;
    Ok(Some(std::sync::Arc::new(set)))
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
