//! A turn refused for its principal's rate limit or budget: what the 429 says.

use serde_json::{json, Value};

/// Why a turn was refused before it started (429).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// `rate_limited` or `budget_exceeded`.
    pub kind: &'static str,
    /// The limit: `requests_per_minute`, `tokens_per_day`, `tool_calls_per_day`, `usd_per_month`.
    pub budget: &'static str,
    /// The config key that sets it (`keys.alice.tokens_per_day`, `limits.tokens_per_day`).
    pub key: String,
    pub limit: Value,
    /// What is used of it (budgets only).
    pub used: Option<Value>,
    /// When it resets, RFC 3339 UTC (budgets only: the next UTC day or calendar month).
    pub resets_at: Option<String>,
    /// Seconds for `Retry-After`.
    pub retry_after: u64,
}

impl Refusal {
    /// What is wrong and what to do, in one sentence.
    pub fn message(&self) -> String {
        match (&self.used, &self.resets_at) {
            (Some(used), Some(at)) => format!(
                "the {} budget is spent ({used} used of {}); it resets at {at} (set by {} in tools.toml)",
                self.budget, self.limit, self.key
            ),
            _ => format!(
                "over the rate limit of {} turn requests per minute; retry in {} s (set by {} in tools.toml)",
                self.limit, self.retry_after, self.key
            ),
        }
    }

    /// The fields the error body carries besides `type` and `message`.
    pub fn fields(&self) -> Value {
        let mut v = json!({"budget": self.budget, "key": self.key, "limit": self.limit});
        if let Some(used) = &self.used {
            v["used"] = used.clone();
        }
        if let Some(at) = &self.resets_at {
            v["resets_at"] = json!(at);
        }
        v["retry_after"] = json!(self.retry_after);
        v
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}
