//! The operator's policy: a pure function from a federated tool name to a verdict and the rule
//! that decided it. `deny` beats `ask` beats `trust`; a name no pattern matches gets `default`.
//! Within a list the first pattern in file order that matches is the deciding rule.
//!
//! The same globs judge what `/mcp` passes through of a server besides its tools: a resource by
//! `mcp__<server>__<uri>` (the URI, or URI template, in its canonical form: see
//! [`super::resource_uri`]), a prompt by `mcp__<server>__<prompt>` ([`resource_name`],
//! [`prompt_name`]). So `mcp__fs__*` covers a
//! server's tools, resources and prompts alike, and `deny = ["mcp__fs__file:///etc/*"]` one
//! folder of its resources. A prompt and a tool of the same name share a pattern.

use crate::config::{PolicyConfig, PolicyRule, Verdict};

/// A verdict and the rule that decided it (`"default"` when no pattern matched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub rule: String,
}

fn first_match<'a>(rules: &'a [PolicyRule], name: &str) -> Option<&'a PolicyRule> {
    rules.iter().find(|r| r.glob.is_match(name))
}

/// Decide a tool's verdict.
pub fn decide(policy: &PolicyConfig, name: &str) -> Decision {
    for (rules, verdict) in [
        (&policy.deny, Verdict::Deny),
        (&policy.ask, Verdict::Ask),
        (&policy.trust, Verdict::Trust),
    ] {
        if let Some(rule) = first_match(rules, name) {
            return Decision {
                verdict,
                rule: rule.pattern.clone(),
            };
        }
    }
    Decision {
        verdict: policy.default,
        rule: "default".to_string(),
    }
}

/// The name the policy judges a server's resource (or resource template) by.
pub fn resource_name(server: &str, uri: &str) -> String {
    format!("mcp__{server}__{uri}")
}

/// The name the policy judges a server's prompt by.
pub fn prompt_name(server: &str, prompt: &str) -> String {
    format!("mcp__{server}__{prompt}")
}

/// Patterns that match none of `names` (reported by `check`: probably a typo). A pattern with a
/// `:` names resources by URI (no tool name has one; `check` lists no resources): not reported.
pub fn unmatched<'a>(
    policy: &'a PolicyConfig,
    names: &[&str],
) -> Vec<(&'static str, &'a PolicyRule)> {
    let lists = [
        ("deny", &policy.deny),
        ("ask", &policy.ask),
        ("trust", &policy.trust),
    ];
    let mut out = Vec::new();
    for (list, rules) in lists {
        for rule in rules.iter() {
            if !rule.pattern.contains(':') && !names.iter().any(|n| rule.glob.is_match(n)) {
                out.push((list, rule));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
