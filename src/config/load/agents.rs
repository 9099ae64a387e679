//! `[agents.*]`: the agents offered in `GET /meta`, the first being the default.

use std::time::Duration;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::{is_name, key_path};
use crate::config::raw::RawAgent;
use crate::config::{AgentConfig, ToolGlobs, UpstreamConfig};

/// Default `[agents.X] max_steps`.
const DEFAULT_MAX_STEPS: i64 = 32;
/// Default `[agents.X] turn_timeout_s`.
const DEFAULT_TURN_TIMEOUT_S: i64 = 3600;
/// Default `[agents.X] version`.
const DEFAULT_AGENT_VERSION: &str = "0.1.0";
/// Default `[agents.X] approval_ttl_s`.
const DEFAULT_APPROVAL_TTL_S: i64 = 3600;
/// Default `[agents.X] wrap_up_s`.
const DEFAULT_WRAP_UP_S: i64 = 60;
/// Default `[agents.X] compact_at`.
const DEFAULT_COMPACT_AT: f64 = 0.8;

/// Default `[agents.X] elicitation_tool`.
const DEFAULT_ELICITATION_TOOL: &str = "elicitation";

/// The agent a file without `[agents.*]` gets.
fn default_agent() -> AgentConfig {
    let mut tools = GlobSetBuilder::new();
    if let Ok(g) = GlobBuilder::new("*").literal_separator(false).build() {
        tools.add(g);
    }
    AgentConfig {
        name: "assistant".to_string(),
        title: Some("Assistant".to_string()),
        description: None,
        version: DEFAULT_AGENT_VERSION.to_string(),
        system_prompt: "You are a helpful assistant.".to_string(),
        tools: vec!["*".to_string()],
        tool_globs: ToolGlobs::new(tools.build().unwrap_or_else(|_| GlobSet::empty())),
        max_steps: DEFAULT_MAX_STEPS as u32,
        turn_timeout: Duration::from_secs(DEFAULT_TURN_TIMEOUT_S.unsigned_abs()),
        thinking: false,
        models: Vec::new(),
        upstreams: Vec::new(),
        client_system_prompt: true,
        approval_ttl: Duration::from_secs(DEFAULT_APPROVAL_TTL_S.unsigned_abs()),
        wrap_up: Duration::from_secs(DEFAULT_WRAP_UP_S.unsigned_abs()),
        context_tokens: None,
        compact_at: DEFAULT_COMPACT_AT,
        elicitation_tool: DEFAULT_ELICITATION_TOOL.to_string(),
    }
}

/// The agents, each one's `upstreams` checked against (and defaulting to) `upstreams`.
pub(super) fn agents(
    cx: &Cx<'_>,
    raw: Option<&indexmap::IndexMap<String, Spanned<RawAgent>>>,
    upstreams: &[UpstreamConfig],
) -> Result<Vec<AgentConfig>, ConfigError> {
    let Some(raw) = raw.filter(|m| !m.is_empty()) else {
        let mut agent = default_agent();
        agent.upstreams = upstreams.iter().map(|u| u.name.clone()).collect();
        return Ok(vec![agent]);
    };
    raw.iter()
        .map(|(name, t)| {
            let mut agent = agent(cx, name, t)?;
            agent.upstreams = agent_upstreams(cx, name, t, upstreams)?;
            Ok(agent)
        })
        .collect()
}

/// `upstreams`: names of `[upstreams.*]` tables, each once (default: all, in file order); and
/// each of the agent's `models` served by one of them.
fn agent_upstreams(
    cx: &Cx<'_>,
    name: &str,
    table: &Spanned<RawAgent>,
    all: &[UpstreamConfig],
) -> Result<Vec<String>, ConfigError> {
    let t = table.get_ref();
    let key = key_path(&["agents", name, "upstreams"]);
    let mut chosen: Vec<String> = Vec::new();
    for u in t.upstreams.iter().flatten() {
        let wanted = u.get_ref();
        if !all.iter().any(|x| &x.name == wanted) {
            let known: Vec<String> = all.iter().map(|x| format!("{:?}", x.name)).collect();
            return Err(cx.err(
                u.span(),
                &key,
                format!(
                    "unknown upstream {wanted:?} (the file's upstreams: {})",
                    known.join(", ")
                ),
            ));
        }
        if chosen.contains(wanted) {
            return Err(cx.err(u.span(), &key, format!("{wanted:?} is named twice")));
        }
        chosen.push(wanted.clone());
    }
    if t.upstreams.as_ref().is_some_and(|u| u.is_empty()) {
        return Err(cx.err(
            table.span(),
            &key,
            "empty: name at least one upstream, or remove the key (default: all of them)",
        ));
    }
    if chosen.is_empty() {
        chosen = all.iter().map(|u| u.name.clone()).collect();
    }
    for m in t.models.iter().flatten() {
        let served = chosen
            .iter()
            .filter_map(|n| all.iter().find(|u| &u.name == n))
            .any(|u| u.serves(m.get_ref()));
        if !served {
            return Err(cx.err(
                m.span(),
                &key_path(&["agents", name, "models"]),
                format!(
                    "{:?} is served by none of the agent's upstreams ({}): add it to one's models",
                    m.get_ref(),
                    chosen.join(", ")
                ),
            ));
        }
    }
    Ok(chosen)
}

fn agent(cx: &Cx<'_>, name: &str, table: &Spanned<RawAgent>) -> Result<AgentConfig, ConfigError> {
    let key = |k: &str| key_path(&["agents", name, k]);
    if !is_name(name) {
        return Err(cx.err(
            table.span(),
            &key_path(&["agents", name]),
            format!("invalid agent name {name:?}: use only letters, digits, '_' and '-'"),
        ));
    }
    let t = table.get_ref();
    let (tools, tool_globs) = tools(cx, table, &key("tools"))?;
    let mut models = Vec::new();
    for m in t.models.iter().flatten() {
        models.push(cx.non_empty(m, &key("models"), "a model name")?);
    }

    let version = match &t.version {
        None => DEFAULT_AGENT_VERSION.to_string(),
        Some(v) => cx.non_empty(v, &key("version"), "the version")?,
    };

    Ok(AgentConfig {
        name: name.to_string(),
        title: Some(t.title.clone().unwrap_or_else(|| name.to_string())),
        description: t.description.clone(),
        version,
        system_prompt: t.system_prompt.clone().unwrap_or_default(),
        tools,
        tool_globs,
        max_steps: cx.int(
            t.max_steps.as_ref(),
            &key("max_steps"),
            DEFAULT_MAX_STEPS,
            1,
            u32::MAX as i64,
        )? as u32,
        turn_timeout: cx.secs(
            t.turn_timeout_s.as_ref(),
            &key("turn_timeout_s"),
            DEFAULT_TURN_TIMEOUT_S,
        )?,
        thinking: t.thinking.unwrap_or(false),
        models,
        upstreams: Vec::new(),
        client_system_prompt: t.client_system_prompt.unwrap_or(true),
        approval_ttl: cx.secs(
            t.approval_ttl_s.as_ref(),
            &key("approval_ttl_s"),
            DEFAULT_APPROVAL_TTL_S,
        )?,
        wrap_up: cx.secs(t.wrap_up_s.as_ref(), &key("wrap_up_s"), DEFAULT_WRAP_UP_S)?,
        context_tokens: cx
            .opt_int(
                t.context_tokens.as_ref(),
                &key("context_tokens"),
                1024,
                i64::from(u32::MAX),
            )?
            .map(|n| n as u32),
        compact_at: compact_at(cx, t.compact_at.as_ref(), &key("compact_at"))?,
        elicitation_tool: match &t.elicitation_tool {
            None => DEFAULT_ELICITATION_TOOL.to_string(),
            Some(v) => cx.non_empty(v, &key("elicitation_tool"), "the tool name")?,
        },
    })
}

/// `tools`: the patterns as written and their compiled set; `["*"]` when absent.
fn tools(
    cx: &Cx<'_>,
    table: &Spanned<RawAgent>,
    key: &str,
) -> Result<(Vec<String>, ToolGlobs), ConfigError> {
    let Some(patterns) = &table.get_ref().tools else {
        return Ok((vec!["*".to_string()], default_agent().tool_globs));
    };
    let set = cx.glob_set(patterns, table.span(), key)?;
    Ok((
        patterns.iter().map(|p| p.get_ref().clone()).collect(),
        ToolGlobs::new(set),
    ))
}

/// `compact_at`: a share of the context window in (0, 1].
fn compact_at(cx: &Cx<'_>, v: Option<&Spanned<f64>>, key: &str) -> Result<f64, ConfigError> {
    let Some(v) = v else {
        return Ok(DEFAULT_COMPACT_AT);
    };
    let x = *v.get_ref();
    if !(x > 0.0 && x <= 1.0) {
        return Err(cx.err(
            v.span(),
            key,
            format!("{x} is out of range: give a share of the context window above 0 and at most 1, e.g. 0.8"),
        ));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use std::time::Duration;

    #[test]
    fn bad_glob_in_agent_tools_names_its_line() {
        let e = bad("[agents.a]\ntools = [\"{a,b\"]\n");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("agents.a.tools"));
    }

    #[test]
    fn agent_order_is_kept_and_the_first_is_default() {
        let c = ok("[agents.zeta]\nmax_steps = 4\nthinking = true\nmodels = [\"a\", \"b\"]\n\n[agents.alpha]\ntitle = \"Alpha\"\ntools = [\"mcp__fs__*\", \"deliver_file\"]\nturn_timeout_s = 10\nversion = \"2.0.0\"\ndescription = \"d\"\n\n[agents.mid]\n");
        let names: Vec<&str> = c.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, vec!["zeta", "alpha", "mid"]);
        assert_eq!(c.default_agent().name, "zeta");
        let z = c.agent("zeta").unwrap();
        assert_eq!(z.title.as_deref(), Some("zeta"));
        assert_eq!(z.max_steps, 4);
        assert!(z.thinking);
        assert_eq!(z.models, vec!["a", "b"]);
        assert_eq!(z.system_prompt, "");
        let a = c.agent("alpha").unwrap();
        assert_eq!(a.title.as_deref(), Some("Alpha"));
        assert_eq!(a.description.as_deref(), Some("d"));
        assert_eq!(a.version, "2.0.0");
        assert_eq!(a.turn_timeout, Duration::from_secs(10));
        assert!(a.tool_globs.is_match("mcp__fs__read_file"));
        assert!(a.tool_globs.is_match("deliver_file"));
        assert!(!a.tool_globs.is_match("mcp__shop__buy"));
        let m = c.agent("mid").unwrap();
        assert_eq!(m.tools, vec!["*"]);
        assert!(m.tool_globs.is_match("anything"));
        assert_eq!(m.max_steps, 32);

        let e = bad("[agents.a]\n\n[agents.b]\nmax_steps = 0\n");
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("agents.b.max_steps"));
        let e = bad("[agents.\"my agent\"]\n");
        assert_eq!(e.line, Some(1));
        assert!(e.message.starts_with("invalid agent name"), "{}", e.message);
    }
}
