//! `[policy]`: which tools are trusted, asked about or denied.

use globset::GlobMatcher;
use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::raw::RawPolicy;
use crate::config::{PolicyConfig, PolicyRule, Verdict};

pub(super) fn policy(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawPolicy>>,
) -> Result<PolicyConfig, ConfigError> {
    let default = RawPolicy::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&default);
    let rules =
        |v: Option<&Vec<Spanned<String>>>, key: &str| -> Result<Vec<PolicyRule>, ConfigError> {
            v.into_iter()
                .flatten()
                .map(|p| {
                    let glob: GlobMatcher = cx.glob(p, key)?.compile_matcher();
                    Ok(PolicyRule {
                        pattern: p.get_ref().clone(),
                        glob,
                        line: cx.line_of(p.span().start),
                    })
                })
                .collect()
        };
    Ok(PolicyConfig {
        trust: rules(t.trust.as_ref(), "policy.trust")?,
        ask: rules(t.ask.as_ref(), "policy.ask")?,
        deny: rules(t.deny.as_ref(), "policy.deny")?,
        default: match &t.default {
            None => Verdict::Ask,
            Some(v) => {
                match cx.choice(v, "policy.default", "verdict", &["trust", "ask", "deny"])? {
                    "trust" => Verdict::Trust,
                    "deny" => Verdict::Deny,
                    _ => Verdict::Ask,
                }
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;

    #[test]
    fn bad_glob_in_policy_names_its_line() {
        let e = bad("[policy]\ntrust = [\"ok_*\"]\ndeny = [\n  \"fine\",\n  \"mcp__fs__[a\",\n]\n");
        assert_eq!(e.line, Some(5));
        assert_eq!(e.key.as_deref(), Some("policy.deny"));
        assert!(
            e.message.contains("invalid glob \"mcp__fs__[a\""),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("unclosed character class"),
            "{}",
            e.message
        );
    }
}
