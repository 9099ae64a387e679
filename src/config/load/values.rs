//! Checks on single values that every table shares: integers, durations, URLs, globs, names.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use toml::Spanned;

use std::path::{Path, PathBuf};

use super::error::{ConfigError, Cx};

/// Longest accepted `*_s` duration (one year), so that `Instant::now() + d` can never overflow.
const MAX_SECONDS: i64 = 365 * 24 * 3600;

impl Cx<'_> {
    /// HTTP headers as written (values may hold `${VAR}`, expanded when connecting).
    pub(super) fn headers(
        &self,
        h: Option<&Spanned<indexmap::IndexMap<String, String>>>,
        key: &str,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let mut headers = BTreeMap::new();
        let Some(h) = h else { return Ok(headers) };
        for (name, value) in h.get_ref() {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(self.err(
                    h.span(),
                    key,
                    format!("invalid header name {name:?}: use letters, digits and '-', e.g. \"Authorization\""),
                ));
            }
            if http::HeaderValue::from_str(value).is_err() {
                return Err(self.err(
                    h.span(),
                    key,
                    format!(
                        "invalid value for header {name:?}: no line breaks or control characters"
                    ),
                ));
            }
            headers.insert(name.clone(), value.clone());
        }
        Ok(headers)
    }

    /// Every `${VAR}` in `value` names a variable that is set (the value is expanded later,
    /// where it is used).
    pub(super) fn vars_set(
        &self,
        value: &str,
        span: Range<usize>,
        key: &str,
    ) -> Result<(), ConfigError> {
        self.env.expand(value)
            .map(drop)
            .map_err(|var| {
                self.err(
                    span,
                    key,
                    format!(
                        "${{{var}}} is not set in turnstile's environment: set {var}, or write $${{ for a literal ${{"
                    ),
                )
            })
    }

    /// A non-negative integer in `min..=max`, or `default` when absent.
    pub(super) fn int(
        &self,
        v: Option<&Spanned<i64>>,
        key: &str,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<i64, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        let n = *v.get_ref();
        if n < min || n > max {
            let range = if max == i64::MAX {
                format!("of at least {min}")
            } else {
                format!("from {min} to {max}")
            };
            return Err(self.err(
                v.span(),
                key,
                format!("{n} is out of range: use a whole number {range}"),
            ));
        }
        Ok(n)
    }

    /// An optional integer in `min..=max`: `None` when absent.
    pub(super) fn opt_int(
        &self,
        v: Option<&Spanned<i64>>,
        key: &str,
        min: i64,
        max: i64,
    ) -> Result<Option<i64>, ConfigError> {
        match v {
            None => Ok(None),
            v => self.int(v, key, 0, min, max).map(Some),
        }
    }

    /// A duration from integer seconds (> 0), or `default_s` when absent.
    pub(super) fn secs(
        &self,
        v: Option<&Spanned<i64>>,
        key: &str,
        default_s: i64,
    ) -> Result<Duration, ConfigError> {
        if let Some(v) = v {
            let n = *v.get_ref();
            if n <= 0 || n > MAX_SECONDS {
                return Err(self.err(
                    v.span(),
                    key,
                    format!(
                        "{n} is not a valid duration: give whole seconds from 1 to {MAX_SECONDS} (one year)"
                    ),
                ));
            }
        }
        let n = v.map_or(default_s, |v| *v.get_ref());
        Ok(Duration::from_secs(n.unsigned_abs()))
    }

    /// The name of an environment variable.
    pub(super) fn env_var_name(
        &self,
        v: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<String>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let s = v.get_ref();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(self.err(
                v.span(),
                key,
                format!(
                    "{s:?} is not an environment variable name: use letters, digits and '_', e.g. \"OPENAI_API_KEY\""
                ),
            ));
        }
        Ok(Some(s.clone()))
    }

    /// A non-empty string.
    pub(super) fn non_empty(
        &self,
        v: &Spanned<String>,
        key: &str,
        what: &str,
    ) -> Result<String, ConfigError> {
        if v.get_ref().trim().is_empty() {
            return Err(self.err(
                v.span(),
                key,
                format!("{what} is empty: give a value or remove the key"),
            ));
        }
        Ok(v.get_ref().clone())
    }

    /// An absolute `http://` or `https://` URL.
    pub(super) fn http_url(
        &self,
        v: &Spanned<String>,
        key: &str,
        example: &str,
    ) -> Result<String, ConfigError> {
        let s = v.get_ref();
        let ok = s
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some())
            .is_some();
        if !ok {
            return Err(self.err(
                v.span(),
                key,
                format!(
                    "invalid URL {s:?}: it must start with http:// or https://, e.g. \"{example}\""
                ),
            ));
        }
        Ok(s.clone())
    }

    /// A globset glob over tool names (`*` also crosses `/`).
    pub(super) fn glob(&self, v: &Spanned<String>, key: &str) -> Result<Glob, ConfigError> {
        let s = v.get_ref();
        if s.is_empty() {
            return Err(self.err(
                v.span(),
                key,
                "empty pattern: write a glob over tool names, e.g. \"mcp__fs__*\"",
            ));
        }
        GlobBuilder::new(s)
            .literal_separator(false)
            .build()
            .map_err(|e| {
                self.err(
                    v.span(),
                    key,
                    format!(
                        "invalid glob {s:?}: {} (globset syntax: * ? [abc] {{a,b}})",
                        e.kind()
                    ),
                )
            })
    }

    /// `tools`-like globs as one set (`span`: the table, for an error of the set as a whole).
    pub(super) fn glob_set(
        &self,
        patterns: &[Spanned<String>],
        span: Range<usize>,
        key: &str,
    ) -> Result<GlobSet, ConfigError> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            builder.add(self.glob(p, key)?);
        }
        builder
            .build()
            .map_err(|e| self.err(span, key, format!("invalid tools globs: {}", e.kind())))
    }

    /// A string that must be one of `allowed`.
    pub(super) fn choice<'v>(
        &self,
        v: &'v Spanned<String>,
        key: &str,
        what: &str,
        allowed: &[&str],
    ) -> Result<&'v str, ConfigError> {
        let s = v.get_ref().as_str();
        if allowed.contains(&s) {
            return Ok(s);
        }
        Err(self.err(
            v.span(),
            key,
            format!("unknown {what} {s:?} (expected {})", one_of(allowed)),
        ))
    }
}

/// `"a", "b" or "c"`.
fn one_of(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A dotted key path, quoting segments that are not bare TOML keys.
pub(super) fn key_path(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| {
            if is_name(p) {
                (*p).to_string()
            } else {
                format!("{p:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `[A-Za-z0-9_-]+`
pub(super) fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `p` if absolute, else `p` under `base_dir` (the config file's folder); made absolute against
/// the current directory when that is relative too, so that a path handed to a child that runs
/// elsewhere (a session server's `{workspace}`, its cwd) still names the same place.
pub fn resolve_path(base_dir: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    };
    std::path::absolute(&joined).unwrap_or(joined)
}

/// `mcp_servers.<name>.<k>`
pub(super) fn mcp_server_key(name: &str, k: &str) -> String {
    key_path(&["mcp_servers", name, k])
}
