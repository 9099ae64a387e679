//! Budgets and the rate limit of a principal: `requests_per_minute`, `tokens_per_day`,
//! `tool_calls_per_day` and `usd_per_month`, set per principal in `[keys.NAME]` and for every
//! principal in `[limits]` (a key's own value replaces the `[limits]` one). Unset: no limit.
//! What enforces them is `crate::usage`.

/// The four limits; each `None` when not set.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budgets {
    /// Turn-starting requests per minute (a token bucket of this size, refilled over a minute).
    pub requests_per_minute: Option<u32>,
    /// Input + output tokens per UTC day, as the upstreams report them.
    pub tokens_per_day: Option<u64>,
    /// Server tool calls run per UTC day.
    pub tool_calls_per_day: Option<u64>,
    /// USD per calendar month (UTC), priced from the answering upstream's `price`.
    pub usd_per_month: Option<f64>,
}

impl Budgets {
    /// Each limit of `self`, else the one of `default`.
    pub fn or(self, default: Budgets) -> Budgets {
        Budgets {
            requests_per_minute: self.requests_per_minute.or(default.requests_per_minute),
            tokens_per_day: self.tokens_per_day.or(default.tokens_per_day),
            tool_calls_per_day: self.tool_calls_per_day.or(default.tool_calls_per_day),
            usd_per_month: self.usd_per_month.or(default.usd_per_month),
        }
    }

    /// Whether a budget of usage (not the rate limit) is set: only then is usage looked up
    /// before a turn.
    pub fn any_budget(&self) -> bool {
        self.tokens_per_day.is_some()
            || self.tool_calls_per_day.is_some()
            || self.usd_per_month.is_some()
    }
}
