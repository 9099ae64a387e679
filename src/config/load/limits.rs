//! `[limits]`: quotas on what a client or key can make turnstile hold.

use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::raw::RawLimits;
use crate::config::LimitsConfig;

pub(super) fn limits(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawLimits>>,
) -> Result<LimitsConfig, ConfigError> {
    let empty = RawLimits::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&empty);
    let d = LimitsConfig::default();
    // A count from 1 to u32::MAX.
    let n = |v: Option<&Spanned<i64>>, key: &str, default: usize| -> Result<usize, ConfigError> {
        Ok(cx.int(v, key, default as i64, 1, i64::from(u32::MAX))? as usize)
    };
    Ok(LimitsConfig {
        queued_turns: n(
            t.queued_turns.as_ref(),
            "limits.queued_turns",
            d.queued_turns,
        )?,
        running_turns: n(
            t.running_turns.as_ref(),
            "limits.running_turns",
            d.running_turns,
        )?,
        sessions_per_key: n(
            t.sessions_per_key.as_ref(),
            "limits.sessions_per_key",
            d.sessions_per_key,
        )?,
        subscribers_per_session: n(
            t.subscribers_per_session.as_ref(),
            "limits.subscribers_per_session",
            d.subscribers_per_session,
        )?,
        files_per_message: n(
            t.files_per_message.as_ref(),
            "limits.files_per_message",
            d.files_per_message,
        )?,
        session_servers: n(
            t.session_servers.as_ref(),
            "limits.session_servers",
            d.session_servers,
        )?,
        session_servers_per_key: n(
            t.session_servers_per_key.as_ref(),
            "limits.session_servers_per_key",
            d.session_servers_per_key,
        )?,
        files_per_key: n(
            t.files_per_key.as_ref(),
            "limits.files_per_key",
            d.files_per_key as usize,
        )? as u64,
        disk_bytes_per_key: cx
            .int(
                t.disk_bytes_per_key.as_ref(),
                "limits.disk_bytes_per_key",
                d.disk_bytes_per_key as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
        tool_result_bytes: n(
            t.tool_result_bytes.as_ref(),
            "limits.tool_result_bytes",
            d.tool_result_bytes,
        )?,
        budgets: super::budget_keys::budgets(
            cx,
            "limits",
            super::budget_keys::RawBudgets {
                requests_per_minute: t.requests_per_minute.as_ref(),
                tokens_per_day: t.tokens_per_day.as_ref(),
                tool_calls_per_day: t.tool_calls_per_day.as_ref(),
                usd_per_month: t.usd_per_month.as_ref(),
            },
        )?,
    })
}
