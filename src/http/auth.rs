//! Bearer keys. With keys set, every route but the public ones needs `Authorization: Bearer
//! <key>`; a valid key names its principal (see [`crate::config::Principal`]), which owns what
//! its requests create. Keys are kept as digests, so no key is ever stored, and a request's key
//! is compared with every one of them, so that timing says nothing about which matched.

use std::sync::Arc;

use ring::digest::{digest, SHA256};

use super::ApiError;
use crate::config::{Config, KeySecret, Principal, Scope, KEY_OWNER_PREFIX};

/// The configured keys, as digests, each with its principal.
#[derive(Clone, Default)]
pub(crate) struct Keys {
    entries: Vec<([u8; 32], Arc<Principal>)>,
}

fn sha256(s: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, s.as_bytes()).as_ref());
    out
}

/// The owner id of a key of `[server] api_keys_env`: its digest's first 16 bytes in hex.
fn digest_owner(d: &[u8; 32]) -> String {
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

impl Keys {
    /// Keys from a comma-separated list (blank entries ignored), each its own principal.
    pub(crate) fn parse(list: &str) -> Keys {
        let mut keys = Keys::default();
        for d in list
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(sha256)
        {
            let principal = Principal {
                owner: digest_owner(&d),
                scope: Scope::default(),
            };
            keys.entries.push((d, Arc::new(principal)));
        }
        keys
    }

    /// Add the key whose digest is `d` for `principal`; `Err` with the owner id of the
    /// principal that has it already (one key, two principals: which one a request is would
    /// be a guess).
    fn add(&mut self, d: [u8; 32], principal: Arc<Principal>) -> Result<(), String> {
        match self.entries.iter().find(|(k, _)| *k == d) {
            Some((_, p)) if p.owner != principal.owner => Err(p.owner.clone()),
            Some(_) => Ok(()),
            None => {
                self.entries.push((d, principal));
                Ok(())
            }
        }
    }

    /// Add the keys of every `[keys.NAME]` of `config`, read from the variables they name.
    /// `Err`: one line naming the table and key of a variable that is unset or empty, or of a
    /// key another principal has too.
    pub(crate) fn add_principals(&mut self, config: &Config) -> Result<(), String> {
        for k in &config.keys {
            let principal = Arc::new(Principal {
                owner: k.owner_id(),
                scope: k.scope.clone(),
            });
            for (field, secret) in &k.secrets {
                let d = match secret {
                    KeySecret::Sha256(d) => *d,
                    KeySecret::Env(var) => match config.env.var(var).map(str::trim) {
                        Some(key) if !key.is_empty() => sha256(key),
                        _ => {
                            return Err(format!(
                                "[keys.{}] {field} names {var}, which is unset or empty: set {var} to the key, or remove {field}",
                                k.name
                            ))
                        }
                    },
                };
                self.add(d, principal.clone()).map_err(|other| {
                    let other = match other.strip_prefix(KEY_OWNER_PREFIX) {
                        Some(name) => format!("[keys.{name}]"),
                        None => "a key of [server] api_keys_env".to_string(),
                    };
                    format!(
                        "[keys.{}] {field}: the same key as {other}; give each principal a key of its own",
                        k.name
                    )
                })?;
            }
        }
        Ok(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal of the request's key; `None` when no keys are configured.
    pub(crate) fn principal(
        &self,
        headers: &http::HeaderMap,
    ) -> Result<Option<Arc<Principal>>, ApiError> {
        if self.entries.is_empty() {
            return Ok(None);
        }
        let unauthorized =
            |msg: &str| ApiError::new(http::StatusCode::UNAUTHORIZED, "unauthorized", msg);
        let header = headers.get(http::header::AUTHORIZATION).ok_or_else(|| {
            unauthorized("this server needs an API key: send Authorization: Bearer <key>")
        })?;
        let key = header
            .to_str()
            .ok()
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| unauthorized("the Authorization header must be Bearer <key>"))?;
        let d = sha256(key);
        // Compare digests, all of them, so timing says nothing about the keys.
        let mut found = usize::MAX;
        for (i, (k, _)) in self.entries.iter().enumerate() {
            // (Keys are distinct: at most one matches.)
            found = found.min(i | (usize::from(!ring_eq(k, &d)) * usize::MAX));
        }
        match self.entries.get(found) {
            Some((_, principal)) => Ok(Some(principal.clone())),
            None => Err(unauthorized("the API key is not valid")),
        }
    }
}

fn ring_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str, vars: &[(&str, &str)]) -> Config {
        let env = crate::config::Env::from_vars(vars.iter().copied());
        crate::config::load_str(std::path::Path::new("tools.toml"), text, &env).unwrap()
    }

    fn bearer(key: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        h
    }

    const TWO: &str = "[agents.a]\n[keys.alice]\nkey_env = \"A\"\nkey_env_next = \"A2\"\nadmin = true\n[keys.bob]\nkey_env = \"B\"\n";

    #[test]
    fn each_key_names_its_principal_and_an_env_key_keeps_its_digest_owner() {
        let c = config(TWO, &[("A", "a-old"), ("A2", "a-new"), ("B", "b")]);
        let mut keys = Keys::parse("legacy");
        keys.add_principals(&c).unwrap();
        let who = |k: &str| keys.principal(&bearer(k)).unwrap().unwrap();
        assert_eq!(who("a-old").owner, "key:alice");
        assert_eq!(who("a-new").owner, "key:alice");
        assert!(who("a-new").scope.admin);
        assert_eq!(who("b").owner, "key:bob");
        assert!(!who("b").scope.admin);
        // The owner id stores held before principals: the digest's first 16 bytes in hex.
        // (`printf %s legacy | sha256sum | cut -c1-32`)
        assert_eq!(who("legacy").owner, "c49fea7425fa7f8699897a97c159c669");
        let err = keys.principal(&bearer("nope")).unwrap_err();
        assert_eq!(err.status, http::StatusCode::UNAUTHORIZED);
        let err = keys.principal(&http::HeaderMap::new()).unwrap_err();
        assert_eq!(err.status, http::StatusCode::UNAUTHORIZED);
        assert!(Keys::default().principal(&bearer("x")).unwrap().is_none());
    }

    #[test]
    fn an_unset_or_empty_variable_and_a_shared_key_are_one_line_errors() {
        let c = config(TWO, &[("A", "a"), ("A2", " "), ("B", "b")]);
        let e = Keys::default().add_principals(&c).unwrap_err();
        assert_eq!(
            e,
            "[keys.alice] key_env_next names A2, which is unset or empty: set A2 to the key, or remove key_env_next"
        );
        let c = config(TWO, &[("A", "a"), ("A2", "same"), ("B", "same")]);
        let e = Keys::default().add_principals(&c).unwrap_err();
        assert!(
            e.starts_with("[keys.bob] key_env: the same key as [keys.alice]"),
            "{e}"
        );
        let c = config(TWO, &[("A", "a"), ("A2", "a2"), ("B", "legacy")]);
        let e = Keys::parse("legacy").add_principals(&c).unwrap_err();
        assert!(
            e.contains("the same key as a key of [server] api_keys_env"),
            "{e}"
        );
    }
}
