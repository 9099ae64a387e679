//! `[upstreams.NAME]` (or the lone `[upstream]`, its one-entry form named `default`): the
//! model providers turnstile calls.

use std::collections::BTreeMap;
use std::time::Duration;

use indexmap::IndexMap;
use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::{is_name, key_path};
use crate::config::raw::{RawPrice, RawUpstream};
use crate::config::{Price, ProviderKind, UpstreamConfig};

/// Default `[upstream] timeout_s`.
const DEFAULT_UPSTREAM_TIMEOUT_S: i64 = 600;
/// Default `[upstream] retries`.
const DEFAULT_RETRIES: i64 = 2;
/// Most accepted `[upstream] retries`.
const MAX_RETRIES: i64 = 100;
/// Default `[upstreams.X] breaker_failures`.
const DEFAULT_BREAKER_FAILURES: i64 = 5;
/// Default `[upstreams.X] breaker_open_s`.
const DEFAULT_BREAKER_OPEN_S: i64 = 30;
/// The name of the lone `[upstream]` (and of the built-in echo one).
pub(crate) const DEFAULT_UPSTREAM: &str = "default";

/// The upstreams in file order: `[upstreams.*]`, or `[upstream]` as one entry, or the built-in
/// echo provider when the file has neither. Both kinds of table at once is an error.
pub(super) fn upstreams(
    cx: &Cx<'_>,
    single: Option<&Spanned<RawUpstream>>,
    many: Option<&IndexMap<String, Spanned<RawUpstream>>>,
) -> Result<Vec<UpstreamConfig>, ConfigError> {
    let many = many.filter(|m| !m.is_empty());
    match (single, many) {
        (Some(_), Some(many)) => {
            let first = many.values().next().map_or(0..0, |t| t.span());
            Err(cx.err(
                first,
                "upstreams",
                "both [upstream] and [upstreams.*] are set: keep one (a lone [upstream] is the \
                 one-entry form; name it [upstreams.default] to add others)",
            ))
        }
        (_, Some(many)) => many
            .iter()
            .map(|(name, t)| {
                if !is_name(name) {
                    return Err(cx.err(
                        t.span(),
                        &key_path(&["upstreams", name]),
                        format!(
                            "invalid upstream name {name:?}: use only letters, digits, '_' and '-'"
                        ),
                    ));
                }
                upstream(cx, name, &format!("upstreams.{name}"), Some(t))
            })
            .collect(),
        (single, None) => Ok(vec![upstream(cx, DEFAULT_UPSTREAM, "upstream", single)?]),
    }
}

/// One upstream table, its keys named `{table}.<key>` in messages.
fn upstream(
    cx: &Cx<'_>,
    name: &str,
    table_key: &str,
    raw: Option<&Spanned<RawUpstream>>,
) -> Result<UpstreamConfig, ConfigError> {
    let mut config = UpstreamConfig {
        name: name.to_string(),
        provider: ProviderKind::Echo,
        base_url: String::new(),
        api_key_env: None,
        model: "echo".to_string(),
        models: Vec::new(),
        max_tokens: None,
        timeout: Duration::from_secs(DEFAULT_UPSTREAM_TIMEOUT_S.unsigned_abs()),
        retries: DEFAULT_RETRIES as u32,
        headers: BTreeMap::new(),
        max_in_flight: None,
        breaker_failures: DEFAULT_BREAKER_FAILURES as u32,
        breaker_open: Duration::from_secs(DEFAULT_BREAKER_OPEN_S.unsigned_abs()),
        price: None,
    };
    let Some(table) = raw else { return Ok(config) };
    let key = |k: &str| format!("{table_key}.{k}");
    let t = table.get_ref();
    config.headers = headers(cx, t, table_key)?;
    let (kind, default_url) = provider(cx, table, table_key)?;
    config.provider = kind;

    config.base_url = match &t.base_url {
        None => default_url.to_string(),
        Some(v) => cx
            .http_url(v, &key("base_url"), "http://127.0.0.1:11434/v1")?
            .trim_end_matches('/')
            .to_string(),
    };

    (config.model, config.models) = models(cx, table, kind, table_key)?;

    config.api_key_env = cx.env_var_name(t.api_key_env.as_ref(), &key("api_key_env"))?;
    config.max_tokens = cx
        .opt_int(
            t.max_tokens.as_ref(),
            &key("max_tokens"),
            1,
            u32::MAX as i64,
        )?
        .map(|n| n as u32);
    config.timeout = cx.secs(
        t.timeout_s.as_ref(),
        &key("timeout_s"),
        DEFAULT_UPSTREAM_TIMEOUT_S,
    )?;
    config.retries = cx.int(
        t.retries.as_ref(),
        &key("retries"),
        DEFAULT_RETRIES,
        0,
        MAX_RETRIES,
    )? as u32;
    limits(cx, t, table_key, &mut config)?;
    Ok(config)
}

/// `max_in_flight`, `breaker_failures`, `breaker_open_s` and `price`.
fn limits(
    cx: &Cx<'_>,
    t: &RawUpstream,
    table_key: &str,
    config: &mut UpstreamConfig,
) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{table_key}.{k}");
    config.max_in_flight = cx
        .opt_int(
            t.max_in_flight.as_ref(),
            &key("max_in_flight"),
            1,
            1_000_000,
        )?
        .map(|n| n as usize);
    config.breaker_failures = cx.int(
        t.breaker_failures.as_ref(),
        &key("breaker_failures"),
        DEFAULT_BREAKER_FAILURES,
        1,
        1_000_000,
    )? as u32;
    config.breaker_open = cx.secs(
        t.breaker_open_s.as_ref(),
        &key("breaker_open_s"),
        DEFAULT_BREAKER_OPEN_S,
    )?;
    config.price = match &t.price {
        None => None,
        Some(p) => Some(price(cx, p, &key("price"))?),
    };
    Ok(())
}

/// `price = { input, output, cached_input }`: USD per million tokens, each finite and at
/// least 0; `input` and `output` required, `cached_input` defaulting to `input`.
fn price(cx: &Cx<'_>, p: &Spanned<RawPrice>, key: &str) -> Result<Price, ConfigError> {
    let usd = |v: Option<&Spanned<f64>>, k: &str| -> Result<Option<f64>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let x = *v.get_ref();
        if !(x.is_finite() && x >= 0.0) {
            return Err(cx.err(
                v.span(),
                &format!("{key}.{k}"),
                format!("{x} is not a price: give USD per million tokens, 0 or more, e.g. 0.5"),
            ));
        }
        Ok(Some(x))
    };
    let raw = p.get_ref();
    let required = |x: Option<f64>, k: &str| {
        x.ok_or_else(|| {
            cx.err(
                p.span(),
                &format!("{key}.{k}"),
                format!("missing {k}: a price gives input and output, USD per million tokens, e.g. price = {{ input = 0.5, output = 1.5 }}"),
            )
        })
    };
    let input = required(usd(raw.input.as_ref(), "input")?, "input")?;
    let output = required(usd(raw.output.as_ref(), "output")?, "output")?;
    let cached_input = usd(raw.cached_input.as_ref(), "cached_input")?.unwrap_or(input);
    Ok(Price {
        input,
        output,
        cached_input,
    })
}

/// `headers`, each `${VAR}` in a value naming a variable that is set.
fn headers(
    cx: &Cx<'_>,
    t: &RawUpstream,
    table_key: &str,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let headers = cx.headers(t.headers.as_ref(), &format!("{table_key}.headers"))?;
    if let Some(h) = &t.headers {
        for (name, value) in &headers {
            let key = format!("{table_key}.{}", key_path(&["headers", name]));
            cx.vars_set(value, h.span(), &key)?;
        }
    }
    Ok(headers)
}

/// `provider` (required in an upstream table) and its default base URL.
fn provider(
    cx: &Cx<'_>,
    table: &Spanned<RawUpstream>,
    table_key: &str,
) -> Result<(ProviderKind, &'static str), ConfigError> {
    let key = format!("{table_key}.provider");
    let Some(provider) = &table.get_ref().provider else {
        return Err(cx.err(
            table.span(),
            &key,
            format!(
                "missing provider: add provider = \"openai\", \"anthropic\" or \"echo\" \
                 (or remove the [{table_key}] table to use the built-in echo provider)"
            ),
        ));
    };
    Ok(
        match cx.choice(provider, &key, "provider", &["openai", "anthropic", "echo"])? {
            "openai" => (ProviderKind::OpenAi, "https://api.openai.com/v1"),
            "anthropic" => (ProviderKind::Anthropic, "https://api.anthropic.com/v1"),
            _ => (ProviderKind::Echo, ""),
        },
    )
}

/// `model` and `models`: the default model (`model`, else the first of `models`; required but
/// for the echo provider) and the models served (a `model` not among `models` is an error).
fn models(
    cx: &Cx<'_>,
    table: &Spanned<RawUpstream>,
    kind: ProviderKind,
    table_key: &str,
) -> Result<(String, Vec<String>), ConfigError> {
    let t = table.get_ref();
    let mut models = Vec::new();
    for m in t.models.iter().flatten() {
        models.push(cx.non_empty(m, &format!("{table_key}.models"), "a model name")?);
    }
    let example_model = match kind {
        ProviderKind::OpenAi => "gpt-4o-mini",
        ProviderKind::Anthropic => "claude-sonnet-4-5",
        ProviderKind::Echo => "echo",
    };
    let key = format!("{table_key}.model");
    let model = match (&t.model, models.first()) {
        (Some(v), _) => cx.non_empty(v, &key, "the model")?,
        (None, Some(first)) => first.clone(),
        (None, None) if kind == ProviderKind::Echo => "echo".to_string(),
        (None, None) => return Err(cx.err(
            table.span(),
            &key,
            format!(
                "missing model: the {} provider needs one; add model = \"{example_model}\" (or the model your server serves) under [{table_key}]",
                kind.as_str()
            ),
        )),
    };
    if let Some(v) = &t.model {
        if !models.is_empty() && !models.contains(&model) {
            return Err(cx.err(
                v.span(),
                &key,
                format!("{model:?} is not one of models: add it to models, or remove model (the first of models is the default)"),
            ));
        }
    }
    Ok((model, models))
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
