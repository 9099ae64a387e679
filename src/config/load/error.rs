//! What loading makes of a problem: a [`ConfigError`] (one line naming the file, the line, the
//! key), and [`Cx`], the file being checked, which builds them.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::config::Env;

/// A config file that cannot be used: which file, where, which key, and what to do about it.
///
/// `Display` is one line: `FILE[:LINE]: [KEY: ]MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.one_line())]
pub struct ConfigError {
    /// The config file, as given.
    pub path: PathBuf,
    /// 1-based line in the file, when the problem has a place.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `upstream.provider` or `mcp_servers.fs.command`.
    pub key: Option<String>,
    /// What is wrong and how to fix it (one line).
    pub message: String,
}

impl ConfigError {
    fn one_line(&self) -> String {
        let mut s = self.path.display().to_string();
        if let Some(line) = self.line {
            s.push(':');
            s.push_str(&line.to_string());
        }
        s.push_str(": ");
        if let Some(key) = &self.key {
            s.push_str(key);
            s.push_str(": ");
        }
        // Keep the promise of one line whatever a message embeds.
        s.push_str(&self.message.replace(['\r', '\n'], " "));
        s
    }
}

/// The file being checked, for building errors.
pub(super) struct Cx<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
    /// The environment.
    pub(super) env: &'a Env,
    /// The `TURNSTILE_<KEY>` variables applied, by their spans (see `env::ENV_SPAN_BASE`).
    pub(super) env_vars: Vec<String>,
}

impl Cx<'_> {
    /// The 1-based line holding byte `offset`.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    /// An error at `span`, about `key`.
    pub(super) fn err(
        &self,
        span: Range<usize>,
        key: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        if let Some(var) = span
            .start
            .checked_sub(self.text.len() + crate::config::env::ENV_SPAN_BASE)
            .and_then(|i| self.env_vars.get(i))
        {
            return ConfigError {
                path: self.path.to_path_buf(),
                line: None,
                key: Some(key.to_string()),
                message: format!("{} (from the environment variable {var})", message.into()),
            };
        }
        ConfigError {
            path: self.path.to_path_buf(),
            line: Some(self.line_of(span.start)),
            key: Some(key.to_string()),
            message: message.into(),
        }
    }
}
