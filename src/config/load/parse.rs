//! TOML syntax and serde errors turned into one-line [`ConfigError`]s naming the key.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::error::{ConfigError, Cx};
use super::values::key_path;
use crate::config::raw::RawConfig;

impl Cx<'_> {
    /// Deserialize the file into its raw form, turning TOML and serde errors into one-line errors.
    pub(super) fn parse(&self) -> Result<RawConfig, ConfigError> {
        let (tree, syntax_errors) = DeTable::parse_recoverable(self.text);
        if let Some(e) = syntax_errors.first() {
            return Err(self.toml_error(e, tree.get_ref(), true));
        }
        toml::from_str::<RawConfig>(self.text)
            .map_err(|e| self.toml_error(&e, tree.get_ref(), false))
    }

    fn toml_error(&self, e: &toml::de::Error, tree: &DeTable<'_>, syntax: bool) -> ConfigError {
        let offset = e.span().map(|s| s.start);
        let key = offset.and_then(|o| key_path_at(tree, o));
        let mut message = tidy_serde_message(e.message());
        if syntax {
            if message == "duplicate key" {
                if let Some(name) = e.span().and_then(|s| self.text.get(s)) {
                    message = format!(
                        "duplicate key `{name}`: a key may appear only once per table; remove one"
                    );
                }
            }
            message = format!("invalid TOML: {message}");
        } else if message.starts_with("unknown field") {
            message.push_str(" (remove it or correct its spelling)");
        }
        ConfigError {
            path: self.path.to_path_buf(),
            line: offset.map(|o| self.line_of(o)),
            key,
            message,
        }
    }
}

/// Serde's wording, in the file's terms.
fn tidy_serde_message(msg: &str) -> String {
    let mut m = msg.replace(['\r', '\n'], " ");
    if let Some(i) = m.find(", expected struct ") {
        m.truncate(i);
        m.push_str(", expected a table");
    }
    for (from, to) in [
        ("expected i64", "expected an integer"),
        ("expected u64", "expected an integer"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected an array"),
        ("invalid type: sequence", "invalid type: array"),
        ("expected a map", "expected a table"),
        ("invalid type: map", "invalid type: table"),
    ] {
        m = m.replace(from, to);
    }
    m
}

/// The key path of the innermost key or value whose span holds `offset`.
fn key_path_at(tree: &DeTable<'_>, offset: usize) -> Option<String> {
    fn holds(span: &Range<usize>, offset: usize) -> bool {
        span.start <= offset && offset < span.end.max(span.start + 1)
    }
    fn walk_table(
        t: &DeTable<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, Vec<String>)>,
    ) {
        for (k, v) in t.iter() {
            prefix.push(k.get_ref().to_string());
            for span in [k.span(), v.span()] {
                if holds(&span, offset) {
                    let len = span.len();
                    if best.as_ref().is_none_or(|(l, _)| len <= *l) {
                        *best = Some((len, prefix.clone()));
                    }
                }
            }
            walk_value(v.get_ref(), offset, prefix, best);
            prefix.pop();
        }
    }
    fn walk_value(
        v: &DeValue<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, Vec<String>)>,
    ) {
        match v {
            DeValue::Table(t) => walk_table(t, offset, prefix, best),
            DeValue::Array(a) => {
                for item in a.iter() {
                    walk_value(item.get_ref(), offset, prefix, best);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    walk_table(tree, offset, &mut Vec::new(), &mut best);
    best.map(|(_, parts)| {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        key_path(&parts)
    })
}
