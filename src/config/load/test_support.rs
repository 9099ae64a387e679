//! What the config tests share: loading a text with a fixed environment.

use std::path::Path;

use super::{load_str, ConfigError};
use crate::config::{Config, Env};

pub(super) fn path() -> &'static Path {
    Path::new("/etc/turnstile/tools.toml")
}

/// The environment tests load with: `ORG`, `TOKEN` and what `extra` adds.
pub(super) fn test_env(extra: &[(&str, &str)]) -> Env {
    Env::from_vars([("ORG", "acme"), ("TOKEN", "s3cret")]).with(extra.iter().copied())
}

pub(super) fn ok_env(text: &str, extra: &[(&str, &str)]) -> Config {
    match load_str(path(), text, &test_env(extra)) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

pub(super) fn bad_env(text: &str, extra: &[(&str, &str)]) -> ConfigError {
    let e =
        load_str(Path::new("tools.toml"), text, &test_env(extra)).expect_err("expected an error");
    let shown = e.to_string();
    assert!(!shown.contains('\n'), "not one line: {shown}");
    e
}

pub(super) fn ok(text: &str) -> Config {
    match load_str(path(), text, &test_env(&[])) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

pub(super) fn bad(text: &str) -> ConfigError {
    let e = load_str(Path::new("tools.toml"), text, &test_env(&[])).expect_err("expected an error");
    let shown = e.to_string();
    assert!(!shown.contains('\n'), "not one line: {shown}");
    println!("{shown}");
    e
}
