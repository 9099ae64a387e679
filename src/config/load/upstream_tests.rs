use super::super::test_support::*;
use crate::config::ProviderKind;
use std::time::Duration;

#[test]
fn unknown_provider_names_line_and_allowed_values() {
    let e = bad(
        "[server]\nlisten = \"127.0.0.1:8787\"\n\n[upstream]\nprovider = \"gpt\"\nmodel = \"x\"\n",
    );
    assert_eq!(e.line, Some(5));
    assert_eq!(e.key.as_deref(), Some("upstream.provider"));
    assert_eq!(
        e.to_string(),
        "tools.toml:5: upstream.provider: unknown provider \"gpt\" (expected \"openai\", \"anthropic\" or \"echo\")"
    );
}

#[test]
fn openai_and_anthropic_need_a_model() {
    let e = bad("\n[upstream]\nprovider = \"openai\"\n");
    assert_eq!(e.line, Some(2));
    assert_eq!(e.key.as_deref(), Some("upstream.model"));
    assert!(e.message.starts_with("missing model"), "{}", e.message);

    let e = bad("[upstream]\nprovider = \"anthropic\"\n");
    assert_eq!(e.key.as_deref(), Some("upstream.model"));

    let c = ok("[upstream]\nprovider = \"anthropic\"\nmodel = \"claude\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n");
    assert_eq!(c.upstreams[0].provider, ProviderKind::Anthropic);
    assert_eq!(c.upstreams[0].base_url, "https://api.anthropic.com/v1");
    let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://h:1/v1//\"\ntimeout_s = 5\nretries = 0\nmax_tokens = 100\n");
    assert_eq!(c.upstreams[0].base_url, "http://h:1/v1");
    assert_eq!(c.upstreams[0].timeout, Duration::from_secs(5));
    assert_eq!(c.upstreams[0].retries, 0);
    assert_eq!(c.upstreams[0].max_tokens, Some(100));
    let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\n");
    assert_eq!(c.upstreams[0].base_url, "https://api.openai.com/v1");
    let c = ok("[upstream]\nprovider = \"echo\"\n");
    assert_eq!(c.upstreams[0].provider, ProviderKind::Echo);
    assert_eq!(c.upstreams[0].model, "echo");

    let e = bad(
        "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"127.0.0.1:11434/v1\"\n",
    );
    assert_eq!(e.line, Some(4));
    assert_eq!(e.key.as_deref(), Some("upstream.base_url"));
    let e = bad("[upstream]\nmodel = \"m\"\n");
    assert_eq!(e.key.as_deref(), Some("upstream.provider"));
    assert_eq!(e.line, Some(1));
}

#[test]
fn several_upstreams_in_file_order_with_their_keys() {
    let c = ok(r#"
[upstreams.primary]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"
models = ["big", "small"]
max_in_flight = 4
breaker_failures = 3
breaker_open_s = 7
retries = 1
price = { input = 0.5, output = 1.5, cached_input = 0.05 }

[upstreams.backup]
provider = "anthropic"
model = "claude"
price = { input = 3, output = 15 }

[agents.a]
upstreams = ["backup", "primary"]

[agents.b]
"#);
    let names: Vec<&str> = c.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["primary", "backup"]);
    let p = &c.upstreams[0];
    assert_eq!((p.model.as_str(), p.models.len()), ("big", 2));
    assert_eq!(p.max_in_flight, Some(4));
    assert_eq!(p.breaker_failures, 3);
    assert_eq!(p.breaker_open, Duration::from_secs(7));
    assert_eq!(p.retries, 1);
    let price = p.price.unwrap();
    assert_eq!(
        (price.input, price.output, price.cached_input),
        (0.5, 1.5, 0.05)
    );
    let b = &c.upstreams[1];
    assert_eq!(b.provider, ProviderKind::Anthropic);
    assert!(b.models.is_empty() && b.serves("anything"));
    assert_eq!(b.max_in_flight, None);
    assert_eq!(
        (b.breaker_failures, b.breaker_open),
        (5, Duration::from_secs(30))
    );
    assert_eq!(b.price.unwrap().cached_input, 3.0, "defaults to input");
    assert_eq!(c.agent("a").unwrap().upstreams, ["backup", "primary"]);
    assert_eq!(c.agent("b").unwrap().upstreams, ["primary", "backup"]);
    assert_eq!(c.default_model(c.agent("a").unwrap()), "claude");
    assert_eq!(c.default_model(c.agent("b").unwrap()), "big");
}

#[test]
fn a_lone_upstream_is_the_one_entry_form_named_default() {
    let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\n");
    assert_eq!(c.upstreams.len(), 1);
    assert_eq!(c.upstreams[0].name, "default");
    assert!(
        c.upstreams[0].models.is_empty(),
        "serves any model, as before"
    );
    assert_eq!(c.default_agent().upstreams, ["default"]);
    let c = ok("");
    assert_eq!(c.upstreams[0].name, "default");
    assert_eq!(c.upstreams[0].provider, ProviderKind::Echo);
}

#[test]
fn upstream_errors_name_the_table_and_key() {
    let both = "[upstream]\nprovider = \"echo\"\n\n[upstreams.x]\nprovider = \"echo\"\n";
    let e = bad(both);
    assert_eq!((e.line, e.key.as_deref()), (Some(4), Some("upstreams")));
    assert!(
        e.message.starts_with("both [upstream] and [upstreams.*]"),
        "{}",
        e.message
    );

    let e = bad("[upstreams.x]\nprovider = \"echo\"\n\n[agents.a]\nupstreams = [\"x\", \"y\"]\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(5), Some("agents.a.upstreams"))
    );
    assert_eq!(
        e.to_string(),
        "tools.toml:5: agents.a.upstreams: unknown upstream \"y\" (the file's upstreams: \"x\")"
    );
    let e = bad("[upstreams.x]\nprovider = \"echo\"\n\n[agents.a]\nupstreams = []\n");
    assert_eq!(e.key.as_deref(), Some("agents.a.upstreams"));

    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nmax_in_flight = 0\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(4), Some("upstreams.x.max_in_flight"))
    );
    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nbreaker_open_s = 0\n");
    assert_eq!(e.key.as_deref(), Some("upstreams.x.breaker_open_s"));
    let e = bad(
        "[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nprice = { input = -1, output = 1 }\n",
    );
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(4), Some("upstreams.x.price.input"))
    );
    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nprice = { input = 1 }\n");
    assert_eq!(e.key.as_deref(), Some("upstreams.x.price.output"));
    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nprice = { input = 1, output = 1, cache = 1 }\n");
    assert_eq!(e.line, Some(4));
    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodel = \"m\"\nbogus = 1\n");
    assert_eq!(e.line, Some(4));
    let e = bad("[upstreams.x]\nprovider = \"openai\"\n");
    assert_eq!(e.key.as_deref(), Some("upstreams.x.model"));
    let e = bad("[upstreams.x]\nprovider = \"openai\"\nmodels = [\"a\"]\nmodel = \"b\"\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(4), Some("upstreams.x.model"))
    );
    let e = bad("[upstreams.\"a b\"]\nprovider = \"echo\"\n");
    assert!(
        e.message.starts_with("invalid upstream name"),
        "{}",
        e.message
    );
}

#[test]
fn a_model_an_agent_offers_must_be_served_by_one_of_its_upstreams() {
    let text = "[upstreams.x]\nprovider = \"openai\"\nmodels = [\"a\"]\n\n[upstreams.y]\nprovider = \"openai\"\nmodels = [\"b\"]\n\n[agents.one]\nupstreams = [\"x\"]\nmodels = [\"a\", \"b\"]\n";
    let e = bad(text);
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(11), Some("agents.one.models"))
    );
    // Duplicate models across upstreams are fine: the order decides.
    ok("[upstreams.x]\nprovider = \"openai\"\nmodels = [\"a\"]\n\n[upstreams.y]\nprovider = \"openai\"\nmodels = [\"a\"]\n\n[agents.one]\nmodels = [\"a\"]\n");
}
