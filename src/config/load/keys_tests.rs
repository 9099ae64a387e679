use super::super::test_support::*;
use crate::config::KeySecret;

const AGENTS: &str = "[agents.a]\n[agents.b]\ntools = [\"mcp__b__*\"]\n";
/// SHA-256 of "secret".
const SECRET_SHA: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";

fn with(keys: &str) -> String {
    format!("{AGENTS}{keys}")
}

#[test]
fn a_principal_is_loaded_with_its_secrets_and_scope() {
    let c = ok(&with(&format!(
        "[keys.alice]\nkey_env = \"ALICE_KEY\"\nkey_sha256_next = \"{}\"\nagents = [\"b\"]\ntools = [\"mcp__b__read*\"]\nadmin = true\n\n[keys.bob]\nkey_sha256 = \"{SECRET_SHA}\"\n",
        SECRET_SHA.to_uppercase().replace('2', "3")
    )));
    let alice = &c.keys[0];
    assert_eq!(alice.name, "alice");
    assert_eq!(alice.owner_id(), "key:alice");
    assert_eq!(
        alice.secrets[0],
        ("key_env", KeySecret::Env("ALICE_KEY".into()))
    );
    assert_eq!(alice.secrets[1].0, "key_sha256_next");
    assert!(alice.scope.admin);
    assert!(alice.scope.may_use("b") && !alice.scope.may_use("a"));
    let b = c.agent_as(Some("key:alice"), "b").unwrap();
    assert!(b.tool_globs.is_match("mcp__b__read_file"));
    assert!(
        !b.tool_globs.is_match("mcp__b__write_file"),
        "narrowed by the key"
    );
    assert!(
        c.agent_as(Some("key:alice"), "a").is_none(),
        "not alice's agent"
    );
    assert_eq!(c.agents_of(Some("key:alice")).len(), 1);

    let bob = &c.keys[1];
    assert!(!bob.scope.admin);
    assert!(bob.scope.may_use("a") && bob.scope.may_use("b"));
    let b = c.agent_as(Some("key:bob"), "b").unwrap();
    assert!(b.tool_globs.is_match("mcp__b__write_file"), "no narrowing");
    assert!(
        !b.tool_globs.is_match("mcp__a__x"),
        "never wider than the agent"
    );
    // A digest owner (api_keys_env) and a keyless server: every agent, no narrowing.
    assert_eq!(
        c.agents_of(Some("0123456789abcdef0123456789abcdef")).len(),
        2
    );
    assert_eq!(c.agents_of(None).len(), 2);
}

#[test]
fn a_key_needs_exactly_one_of_key_env_and_key_sha256() {
    let e = bad(&with("[keys.alice]\nagents = [\"a\"]\n"));
    assert_eq!(e.key.as_deref(), Some("keys.alice"));
    assert!(
        e.message.contains("key_env") && e.message.contains("key_sha256"),
        "{e}"
    );
    let e = bad(&with(&format!(
        "[keys.alice]\nkey_env = \"K\"\nkey_sha256 = \"{SECRET_SHA}\"\n"
    )));
    assert_eq!(e.key.as_deref(), Some("keys.alice"));
    assert!(e.message.contains("both"), "{e}");
    let e = bad(&with(&format!(
        "[keys.alice]\nkey_env = \"K\"\nkey_env_next = \"N\"\nkey_sha256_next = \"{SECRET_SHA}\"\n"
    )));
    assert!(
        e.message.contains("key_env_next and key_sha256_next"),
        "{e}"
    );
}

#[test]
fn a_bad_digest_names_its_line_and_key() {
    let e = bad(&with("[keys.alice]\nkey_sha256 = \"abc\"\n"));
    assert_eq!(e.key.as_deref(), Some("keys.alice.key_sha256"));
    assert_eq!(e.line, Some(5));
    let not_hex = "g".repeat(64);
    let e = bad(&with(&format!(
        "[keys.alice]\nkey_sha256 = \"{not_hex}\"\n"
    )));
    assert!(e.message.contains("64 hex digits"), "{e}");
}

#[test]
fn a_bad_variable_name_is_refused() {
    let e = bad(&with("[keys.alice]\nkey_env = \"NOT A NAME\"\n"));
    assert_eq!(e.key.as_deref(), Some("keys.alice.key_env"));
}

#[test]
fn an_unknown_agent_is_named() {
    let e = bad(&with(
        "[keys.alice]\nkey_env = \"K\"\nagents = [\"a\", \"zed\"]\n",
    ));
    assert_eq!(e.key.as_deref(), Some("keys.alice.agents"));
    assert!(
        e.message.contains("\"zed\"") && e.message.contains("a, b"),
        "{e}"
    );
    let e = bad(&with("[keys.alice]\nkey_env = \"K\"\nagents = []\n"));
    assert!(e.message.contains("names no agent"), "{e}");
}

#[test]
fn an_invalid_glob_is_named() {
    let e = bad(&with("[keys.alice]\nkey_env = \"K\"\ntools = [\"{a,b\"]\n"));
    assert_eq!(e.key.as_deref(), Some("keys.alice.tools"));
    assert_eq!(e.line, Some(6));
}

#[test]
fn an_invalid_name_and_an_unknown_key_are_refused() {
    let e = bad(&with("[keys.\"al ice\"]\nkey_env = \"K\"\n"));
    assert!(e.message.contains("invalid principal name"), "{e}");
    let e = bad(&with("[keys.alice]\nkey_env = \"K\"\nadmn = true\n"));
    assert!(e.to_string().contains("admn"), "{e}");
}

#[test]
fn one_digest_for_two_principals_is_refused() {
    let e = bad(&with(&format!(
        "[keys.alice]\nkey_sha256 = \"{SECRET_SHA}\"\n[keys.bob]\nkey_sha256_next = \"{SECRET_SHA}\"\nkey_env = \"B\"\n"
    )));
    assert_eq!(e.key.as_deref(), Some("keys.bob.key_sha256_next"));
    assert!(e.message.contains("[keys.alice]"), "{e}");
}

#[test]
fn keys_and_api_keys_env_may_be_used_together() {
    let c = ok(&with(
        "[keys.alice]\nkey_env = \"K\"\n[server]\napi_keys_env = \"KEYS\"\n",
    ));
    assert_eq!(c.keys.len(), 1);
    assert_eq!(c.server.api_keys_env.as_deref(), Some("KEYS"));
}

#[test]
fn a_principal_gone_from_the_file_may_do_nothing_and_a_digest_owner_everything() {
    let c = ok(&with(&format!(
        "[keys.bob]\nkey_sha256 = \"{SECRET_SHA}\"\n"
    )));
    assert!(c.agent_as(Some("key:bob"), "a").is_some());
    // alice's sessions outlive her table: no agent, no tool, not the unnarrowed default.
    assert!(c.agent_as(Some("key:alice"), "a").is_none());
    assert!(c.agents_of(Some("key:alice")).is_empty());
    assert!(!c.scope_of(Some("key:alice")).sees_everything());
    // A key of api_keys_env (its owner id a digest), and no keys at all: every agent.
    assert_eq!(
        c.agents_of(Some("0123456789abcdef0123456789abcdef")).len(),
        2
    );
    assert_eq!(c.agents_of(None).len(), 2);
}

#[test]
fn budgets_are_a_keys_own_else_the_limits_ones() {
    let c = ok(&with(&format!(
        "[limits]\ntokens_per_day = 1000\nrequests_per_minute = 60\n\n[keys.alice]\nkey_sha256 = \"{SECRET_SHA}\"\ntokens_per_day = 50\ntool_calls_per_day = 7\nusd_per_month = 12.5\n\n[keys.bob]\nkey_env = \"BOB\"\nrate_per_minute = 2\nusd_per_month = 3\n"
    )));
    let alice = c.budgets_of(Some("key:alice"));
    assert_eq!(alice.tokens_per_day, Some(50), "its own");
    assert_eq!(alice.requests_per_minute, Some(60), "[limits]'s");
    assert_eq!(alice.tool_calls_per_day, Some(7));
    assert_eq!(alice.usd_per_month, Some(12.5));
    let bob = c.budgets_of(Some("key:bob"));
    assert_eq!(
        bob.requests_per_minute,
        Some(2),
        "the contract's rate_per_minute"
    );
    assert_eq!(bob.usd_per_month, Some(3.0), "a whole number of dollars");
    assert_eq!(bob.tokens_per_day, Some(1000));
    // A key of api_keys_env and a keyless server: [limits]'s.
    let digest = c.budgets_of(Some("0123456789abcdef0123456789abcdef"));
    assert_eq!(digest.tokens_per_day, Some(1000));
    assert_eq!(digest.tool_calls_per_day, None);
    assert_eq!(c.budgets_of(None).requests_per_minute, Some(60));
    assert!(!ok(AGENTS).budgets_of(None).any_budget(), "none by default");
}

#[test]
fn a_budget_that_is_not_positive_names_its_table_and_key() {
    for (line, key) in [
        ("tokens_per_day = 0", "keys.alice.tokens_per_day"),
        ("requests_per_minute = -1", "keys.alice.requests_per_minute"),
        ("tool_calls_per_day = 0", "keys.alice.tool_calls_per_day"),
        ("usd_per_month = 0.0", "keys.alice.usd_per_month"),
        ("usd_per_month = nan", "keys.alice.usd_per_month"),
    ] {
        let e = bad(&with(&format!(
            "[keys.alice]\nkey_sha256 = \"{SECRET_SHA}\"\n{line}\n"
        )));
        assert_eq!(e.key.as_deref(), Some(key), "{line}: {e}");
        assert_eq!(e.line, Some(6), "{line}: {e}");
    }
    let e = bad(&with("[limits]\nusd_per_month = -5.0\n"));
    assert_eq!(e.key.as_deref(), Some("limits.usd_per_month"), "{e}");
    assert!(e.message.contains("USD per calendar month"), "{e}");
    let e = bad(&with("[limits]\ntokens_per_day = \"lots\"\n"));
    assert!(e.to_string().contains("tokens_per_day"), "{e}");
}
