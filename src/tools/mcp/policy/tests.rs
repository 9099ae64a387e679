use super::*;

fn rule(p: &str) -> PolicyRule {
    PolicyRule {
        pattern: p.to_string(),
        glob: globset::Glob::new(p).unwrap().compile_matcher(),
        line: 1,
    }
}

fn policy() -> PolicyConfig {
    PolicyConfig {
        trust: vec![
            rule("mcp__time__*"),
            rule("mcp__fs__*"),
            rule("deliver_file"),
        ],
        ask: vec![rule("mcp__fs__write_*")],
        deny: vec![rule("mcp__fs__move_file")],
        default: Verdict::Ask,
    }
}

#[test]
fn deny_beats_ask_beats_trust_beats_default() {
    let p = policy();
    let d = |n| decide(&p, n);
    assert_eq!(
        d("mcp__fs__move_file"),
        Decision {
            verdict: Verdict::Deny,
            rule: "mcp__fs__move_file".into()
        }
    );
    assert_eq!(
        d("mcp__fs__write_file"),
        Decision {
            verdict: Verdict::Ask,
            rule: "mcp__fs__write_*".into()
        }
    );
    assert_eq!(
        d("mcp__fs__read_file"),
        Decision {
            verdict: Verdict::Trust,
            rule: "mcp__fs__*".into()
        }
    );
    assert_eq!(
        d("mcp__time__now"),
        Decision {
            verdict: Verdict::Trust,
            rule: "mcp__time__*".into()
        }
    );
    assert_eq!(
        d("deliver_file"),
        Decision {
            verdict: Verdict::Trust,
            rule: "deliver_file".into()
        }
    );
    assert_eq!(
        d("mcp__shop__buy"),
        Decision {
            verdict: Verdict::Ask,
            rule: "default".into()
        }
    );
}

#[test]
fn resources_and_prompts_are_judged_by_the_same_globs() {
    let mut p = policy();
    p.deny.push(rule("mcp__fs__file:///etc/*"));
    let d = |n: String| decide(&p, &n);
    assert_eq!(
        d(resource_name("fs", "file:///etc/passwd")),
        Decision {
            verdict: Verdict::Deny,
            rule: "mcp__fs__file:///etc/*".into()
        }
    );
    assert_eq!(
        d(resource_name("fs", "file:///home/a.txt")).verdict,
        Verdict::Trust
    );
    assert_eq!(
        d(prompt_name("fs", "write_summary")),
        Decision {
            verdict: Verdict::Ask,
            rule: "mcp__fs__write_*".into()
        }
    );
    assert_eq!(d(resource_name("shop", "db://x")).rule, "default");
}

#[test]
fn unmatched_patterns_are_reported() {
    let mut p = policy();
    p.deny.push(rule("mcp__fs__file:///etc/*"));
    let names = ["mcp__time__now", "deliver_file"];
    let un: Vec<&str> = unmatched(&p, &names)
        .iter()
        .map(|(_, r)| r.pattern.as_str())
        .collect();
    assert_eq!(
        un,
        vec!["mcp__fs__move_file", "mcp__fs__write_*", "mcp__fs__*"]
    );
}
