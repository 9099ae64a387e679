//! Federated tool names: `mcp__<server>__<tool>`.
//!
//! Characters outside `[A-Za-z0-9_-]` become `_`; a name longer than 64 characters is cut and
//! given a stable hash suffix (of the original server and tool names), so the same tool always
//! gets the same name. Two tools that still end up with one name are a configuration error,
//! never a silent rename.

use ring::digest::{digest, SHA256};

/// The longest name most model APIs accept for a function.
pub const MAX_LEN: usize = 64;

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The federated name of `tool` on `server`.
pub fn federated(server: &str, tool: &str) -> String {
    let full = format!("mcp__{}__{}", sanitize(server), sanitize(tool));
    if full.len() <= MAX_LEN {
        return full;
    }
    let hash = digest(&SHA256, format!("{server}\0{tool}").as_bytes());
    let suffix: String = hash.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // `full` is ASCII after sanitizing, so any byte index is a char boundary.
    format!("{}_{suffix}", &full[..MAX_LEN - suffix.len() - 1])
}

/// A name that two different tools map to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub name: String,
    pub first: (String, String),
    pub second: (String, String),
}

impl std::fmt::Display for Collision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tool {:?} of server {:?} and tool {:?} of server {:?} both map to the federated name {:?}; rename one of them or the server",
            self.first.1, self.first.0, self.second.1, self.second.0, self.name
        )
    }
}

/// The first collision among `(server, tool)` pairs, if any.
pub fn find_collision<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<Collision> {
    let mut seen: std::collections::HashMap<String, (String, String)> = Default::default();
    for (server, tool) in pairs {
        let name = federated(server, tool);
        match seen.get(&name) {
            Some(first) if first != &(server.to_string(), tool.to_string()) => {
                return Some(Collision {
                    name,
                    first: first.clone(),
                    second: (server.to_string(), tool.to_string()),
                })
            }
            Some(_) => {}
            None => {
                seen.insert(name, (server.to_string(), tool.to_string()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_sanitized() {
        assert_eq!(
            federated("time", "get_current_time"),
            "mcp__time__get_current_time"
        );
        assert_eq!(federated("fs", "read.file/v2"), "mcp__fs__read_file_v2");
        assert_eq!(federated("shop", "lookup order"), "mcp__shop__lookup_order");
    }

    #[test]
    fn long_names_are_shortened_stably_to_64() {
        let tool = "a_really_long_tool_name_that_goes_on_and_on_and_on_forever_and_ever";
        let a = federated("server", tool);
        assert_eq!(a.len(), 64);
        assert_eq!(a, federated("server", tool), "stable");
        assert!(a.starts_with("mcp__server__a_really_long"));
        let b = federated("server", &format!("{tool}2"));
        assert_ne!(a, b, "different tools keep different names");
    }

    #[test]
    fn collisions_name_both_tools() {
        let c = find_collision([("fs", "read.file"), ("fs", "read_file")]).expect("collision");
        assert_eq!(c.name, "mcp__fs__read_file");
        let msg = c.to_string();
        assert!(
            msg.contains("read.file") && msg.contains("read_file"),
            "{msg}"
        );
        assert!(find_collision([("a", "x"), ("b", "x"), ("a", "x")]).is_none());
    }
}
