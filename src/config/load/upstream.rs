//! `[upstream]`: the model provider turnstile calls.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::key_path;
use crate::config::raw::RawUpstream;
use crate::config::{ProviderKind, UpstreamConfig};

/// Default `[upstream] timeout_s`.
const DEFAULT_UPSTREAM_TIMEOUT_S: i64 = 600;
/// Default `[upstream] retries`.
const DEFAULT_RETRIES: i64 = 2;
/// Most accepted `[upstream] retries`.
const MAX_RETRIES: i64 = 100;

pub(super) fn upstream(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawUpstream>>,
) -> Result<UpstreamConfig, ConfigError> {
    let mut config = UpstreamConfig {
        provider: ProviderKind::Echo,
        base_url: String::new(),
        api_key_env: None,
        model: "echo".to_string(),
        max_tokens: None,
        timeout: Duration::from_secs(DEFAULT_UPSTREAM_TIMEOUT_S.unsigned_abs()),
        retries: DEFAULT_RETRIES as u32,
        headers: BTreeMap::new(),
    };
    let Some(table) = raw else { return Ok(config) };
    let t = table.get_ref();
    config.headers = headers(cx, t)?;
    let (kind, default_url) = provider(cx, table)?;
    config.provider = kind;

    config.base_url = match &t.base_url {
        None => default_url.to_string(),
        Some(v) => cx
            .http_url(v, "upstream.base_url", "http://127.0.0.1:11434/v1")?
            .trim_end_matches('/')
            .to_string(),
    };

    config.model = model(cx, table, kind)?;

    config.api_key_env = cx.env_var_name(t.api_key_env.as_ref(), "upstream.api_key_env")?;
    config.max_tokens = cx
        .opt_int(
            t.max_tokens.as_ref(),
            "upstream.max_tokens",
            1,
            u32::MAX as i64,
        )?
        .map(|n| n as u32);
    config.timeout = cx.secs(
        t.timeout_s.as_ref(),
        "upstream.timeout_s",
        DEFAULT_UPSTREAM_TIMEOUT_S,
    )?;
    config.retries = cx.int(
        t.retries.as_ref(),
        "upstream.retries",
        DEFAULT_RETRIES,
        0,
        MAX_RETRIES,
    )? as u32;
    Ok(config)
}

/// `headers`, each `${VAR}` in a value naming a variable that is set.
fn headers(cx: &Cx<'_>, t: &RawUpstream) -> Result<BTreeMap<String, String>, ConfigError> {
    let headers = cx.headers(t.headers.as_ref(), "upstream.headers")?;
    if let Some(h) = &t.headers {
        for (name, value) in &headers {
            cx.vars_set(value, h.span(), &key_path(&["upstream", "headers", name]))?;
        }
    }
    Ok(headers)
}

/// `provider` (required in an `[upstream]` table) and its default base URL.
fn provider(
    cx: &Cx<'_>,
    table: &Spanned<RawUpstream>,
) -> Result<(ProviderKind, &'static str), ConfigError> {
    let Some(provider) = &table.get_ref().provider else {
        return Err(cx.err(
            table.span(),
            "upstream.provider",
            "missing provider: add provider = \"openai\", \"anthropic\" or \"echo\" \
             (or remove the [upstream] table to use the built-in echo provider)",
        ));
    };
    Ok(
        match cx.choice(
            provider,
            "upstream.provider",
            "provider",
            &["openai", "anthropic", "echo"],
        )? {
            "openai" => (ProviderKind::OpenAi, "https://api.openai.com/v1"),
            "anthropic" => (ProviderKind::Anthropic, "https://api.anthropic.com/v1"),
            _ => (ProviderKind::Echo, ""),
        },
    )
}

/// `model`: required but for the echo provider.
fn model(
    cx: &Cx<'_>,
    table: &Spanned<RawUpstream>,
    kind: ProviderKind,
) -> Result<String, ConfigError> {
    let t = table.get_ref();
    let example_model = match kind {
        ProviderKind::OpenAi => "gpt-4o-mini",
        ProviderKind::Anthropic => "claude-sonnet-4-5",
        ProviderKind::Echo => "echo",
    };
    match &t.model {
        Some(v) => cx.non_empty(v, "upstream.model", "the model"),
        None if kind == ProviderKind::Echo => Ok("echo".to_string()),
        None => Err(cx.err(
            table.span(),
            "upstream.model",
            format!(
                "missing model: the {} provider needs one; add model = \"{example_model}\" (or the model your server serves) under [upstream]",
                t.provider.as_ref().map_or("", |p| p.get_ref().as_str())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::config::ProviderKind;
    use std::time::Duration;

    #[test]
    fn unknown_provider_names_line_and_allowed_values() {
        let e = bad("[server]\nlisten = \"127.0.0.1:8787\"\n\n[upstream]\nprovider = \"gpt\"\nmodel = \"x\"\n");
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
        assert_eq!(c.upstream.provider, ProviderKind::Anthropic);
        assert_eq!(c.upstream.base_url, "https://api.anthropic.com/v1");
        let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://h:1/v1//\"\ntimeout_s = 5\nretries = 0\nmax_tokens = 100\n");
        assert_eq!(c.upstream.base_url, "http://h:1/v1");
        assert_eq!(c.upstream.timeout, Duration::from_secs(5));
        assert_eq!(c.upstream.retries, 0);
        assert_eq!(c.upstream.max_tokens, Some(100));
        let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\n");
        assert_eq!(c.upstream.base_url, "https://api.openai.com/v1");
        let c = ok("[upstream]\nprovider = \"echo\"\n");
        assert_eq!(c.upstream.provider, ProviderKind::Echo);
        assert_eq!(c.upstream.model, "echo");

        let e = bad(
            "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"127.0.0.1:11434/v1\"\n",
        );
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("upstream.base_url"));
        let e = bad("[upstream]\nmodel = \"m\"\n");
        assert_eq!(e.key.as_deref(), Some("upstream.provider"));
        assert_eq!(e.line, Some(1));
    }
}
