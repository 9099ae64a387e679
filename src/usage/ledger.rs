//! The ledger: each principal's usage of its budgets, kept in memory so that a turn's check is
//! a map lookup, and every model and tool call written to the store as a usage row.
//!
//! An owner's counts (tokens and tool calls today, USD this month) are read from the store on
//! the first check that needs them and again when the UTC day changes; each call recorded here
//! adds to them. On a shared store (PostgreSQL) they are read again once they are
//! [`REFRESH_AFTER`] old, so what other instances spent counts here within that time (and
//! what their running turns have not committed yet, once they have): a principal using several
//! instances at once may go over a budget by what those instances spend in that window. On the
//! embedded store the process is the only writer and the counts are exact.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;
use time::Date;

use super::calendar::{self, day_text, month_start, today};
use super::rate::Bucket;
use super::refusal::Refusal;
use crate::config::{Budgets, Config, Price};
use crate::log::{Store, UsageFilter, UsageRow};
use crate::message::Usage;
use crate::sync::lock;

/// How old an owner's counts may get on a shared store before they are read again.
pub const REFRESH_AFTER: Duration = Duration::from_secs(2);

/// What one owner has spent, as last read plus what was recorded here since.
#[derive(Debug, Clone, Copy)]
struct Spent {
    day: Date,
    tokens: u64,
    tool_calls: u64,
    usd: f64,
    read_at: Instant,
}

/// Every principal's counts and rate buckets (see the [module documentation](self)).
pub struct Ledger {
    store: Store,
    /// `Some` on a shared store: how old counts may get.
    refresh: Option<Duration>,
    spent: Mutex<HashMap<String, Spent>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Today and its `YYYY-MM-DD`, formatted once a day rather than once a call.
    day: Mutex<(Date, String)>,
}

/// One answered model call, as [`Ledger::model_call`] records it.
pub struct ModelCall<'a> {
    pub owner: Option<&'a str>,
    pub agent: &'a str,
    pub upstream: &'a str,
    pub model: &'a str,
    pub usage: Usage,
}

impl Ledger {
    pub fn new(store: Store) -> Ledger {
        let refresh = store.instance().is_some().then_some(REFRESH_AFTER);
        Ledger {
            store,
            refresh,
            spent: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
            day: Mutex::new((Date::MIN, String::new())),
        }
    }

    /// Whether the owner may start a turn now: its budgets not spent, then a request of its
    /// rate limit taken. Nothing is looked up for an owner without budgets.
    pub async fn admit(&self, config: &Config, owner: Option<&str>) -> Result<(), Refusal> {
        let budgets = config.budgets_of(owner);
        let refused = if budgets.any_budget() {
            let spent = self.spent_of(owner).await;
            over_budget(&budgets, &spent)
        } else {
            None
        };
        let refused = refused.or_else(|| {
            let per_minute = budgets.requests_per_minute?;
            let now = Instant::now();
            let mut buckets = lock(&self.buckets);
            let bucket = buckets
                .entry(owner.unwrap_or_default().to_string())
                .or_insert_with(|| Bucket::full(per_minute, now));
            let wait = bucket.take(per_minute, now).err()?;
            Some(Refusal {
                kind: "rate_limited",
                budget: "requests_per_minute",
                key: String::new(),
                limit: json!(per_minute),
                used: None,
                resets_at: None,
                retry_after: wait,
            })
        });
        match refused {
            None => Ok(()),
            Some(mut r) => {
                r.key = config_key(config, owner, r.budget);
                crate::metrics::spend(principal_name(owner)).refused(r.budget);
                Err(r)
            }
        }
    }

    /// A server tool call is about to run in a turn of the owner's: counted, or refused with
    /// the text the model is given as its result when `tool_calls_per_day` is spent.
    pub async fn tool_call(
        &self,
        config: &Config,
        owner: Option<&str>,
        agent: &str,
    ) -> Result<(), String> {
        let budgets = config.budgets_of(owner);
        if let Some(limit) = budgets.tool_calls_per_day {
            let spent = self.spent_of(owner).await;
            if spent.tool_calls >= limit {
                crate::metrics::spend(principal_name(owner)).refused("tool_calls_per_day");
                return Err(format!(
                    "Not run: the tool_calls_per_day budget ({limit}) of this principal is spent; it resets at {}. Go on without tools, or stop.",
                    calendar::next_day_at(spent.day)
                ));
            }
        }
        let (date, day) = self.today();
        let row = UsageRow {
            owner: owner.unwrap_or_default().to_string(),
            day,
            agent: agent.to_string(),
            tool_calls: 1,
            ..UsageRow::default()
        };
        self.add(date, row);
        Ok(())
    }

    /// An answered model call: priced from its upstream's `price` (none: 0), written to the
    /// store with the next commit (before the events that report it), and counted.
    pub fn model_call(&self, config: &Config, call: ModelCall<'_>) {
        let price = config.upstream(call.upstream).and_then(|u| u.price);
        let usd = price.map_or(0.0, |p| cost(&p, call.usage));
        let spend = crate::metrics::spend(principal_name(call.owner));
        spend.tokens(call.usage.input_tokens, call.usage.output_tokens);
        spend.usd(usd);
        let (date, day) = self.today();
        self.add(
            date,
            UsageRow {
                owner: call.owner.unwrap_or_default().to_string(),
                day,
                agent: call.agent.to_string(),
                upstream: call.upstream.to_string(),
                model: call.model.to_string(),
                input_tokens: call.usage.input_tokens,
                output_tokens: call.usage.output_tokens,
                cached_tokens: call.usage.cached_input_tokens,
                usd,
                calls: 1,
                tool_calls: 0,
            },
        );
    }

    /// Today (UTC) and its text.
    fn today(&self) -> (Date, String) {
        let date = today();
        let mut held = lock(&self.day);
        if held.0 != date {
            *held = (date, day_text(date));
        }
        (date, held.1.clone())
    }

    /// Queue the row (of day `date`) and add it to the owner's counts, if they are held.
    fn add(&self, date: Date, row: UsageRow) {
        if let Some(s) = lock(&self.spent).get_mut(&row.owner) {
            if s.day == date {
                s.tokens = s
                    .tokens
                    .saturating_add(row.input_tokens + row.output_tokens);
                s.tool_calls = s.tool_calls.saturating_add(row.tool_calls);
                s.usd += row.usd;
            }
        }
        self.store.add_usage(row);
    }

    /// The owner's counts, read from the store when not held, from another day, or (on a
    /// shared store) too old. A store that cannot be read leaves what is held (or nothing
    /// spent): budgets never stop turns for a store error.
    async fn spent_of(&self, owner: Option<&str>) -> Spent {
        let key = owner.unwrap_or_default();
        let day = today();
        let now = Instant::now();
        if let Some(s) = lock(&self.spent).get(key) {
            let fresh = self
                .refresh
                .is_none_or(|r| now.duration_since(s.read_at) < r);
            if s.day == day && fresh {
                return *s;
            }
        }
        let filter = UsageFilter {
            owner: Some(key.to_string()),
            from: Some(day_text(month_start(day))),
            to: Some(day_text(day)),
        };
        let today_text = day_text(day);
        let spent = match self.store.usage(filter).await {
            Ok(rows) => rows.iter().fold(
                Spent {
                    day,
                    tokens: 0,
                    tool_calls: 0,
                    usd: 0.0,
                    read_at: now,
                },
                |mut s, r| {
                    if r.day == today_text {
                        s.tokens += r.input_tokens + r.output_tokens;
                        s.tool_calls += r.tool_calls;
                    }
                    s.usd += r.usd;
                    s
                },
            ),
            Err(e) => {
                tracing::warn!(error = %e, "usage could not be read from the store: budgets checked against what this instance holds");
                let held = lock(&self.spent).get(key).copied();
                return held.unwrap_or(Spent {
                    day,
                    tokens: 0,
                    tool_calls: 0,
                    usd: 0.0,
                    read_at: now,
                });
            }
        };
        lock(&self.spent).insert(key.to_string(), spent);
        spent
    }
}

/// The first budget `spent` has reached, as a refusal (its key filled in by the caller).
fn over_budget(b: &Budgets, spent: &Spent) -> Option<Refusal> {
    let day_reset = || {
        (
            calendar::next_day_at(spent.day),
            calendar::seconds_until(calendar::day_after(spent.day)),
        )
    };
    let refuse = |budget, limit, used, (resets_at, retry_after): (String, u64)| Refusal {
        kind: "budget_exceeded",
        budget,
        key: String::new(),
        limit,
        used: Some(used),
        resets_at: Some(resets_at),
        retry_after,
    };
    if let Some(limit) = b.tokens_per_day.filter(|l| spent.tokens >= *l) {
        return Some(refuse(
            "tokens_per_day",
            json!(limit),
            json!(spent.tokens),
            day_reset(),
        ));
    }
    if let Some(limit) = b.tool_calls_per_day.filter(|l| spent.tool_calls >= *l) {
        let used = json!(spent.tool_calls);
        return Some(refuse(
            "tool_calls_per_day",
            json!(limit),
            used,
            day_reset(),
        ));
    }
    let limit = b.usd_per_month.filter(|l| spent.usd >= *l)?;
    let month = (
        calendar::next_month_at(spent.day),
        calendar::seconds_until(calendar::month_after(spent.day)),
    );
    let used = json!((spent.usd * 1e6).round() / 1e6);
    Some(refuse("usd_per_month", json!(limit), used, month))
}

/// What `usage` costs at `price` (USD per million tokens): input tokens read from the cache
/// at `cached_input`, the rest of the input at `input`, output at `output`.
pub fn cost(price: &Price, usage: Usage) -> f64 {
    let cached = usage.cached_input_tokens.min(usage.input_tokens);
    let fresh = usage.input_tokens - cached;
    (fresh as f64 * price.input
        + cached as f64 * price.cached_input
        + usage.output_tokens as f64 * price.output)
        / 1e6
}

/// The config key that sets `budget` for this owner: its `[keys.NAME]` table's when that
/// sets it, else `[limits]`'s.
fn config_key(config: &Config, owner: Option<&str>, budget: &str) -> String {
    let own = config.key_of(owner).filter(|k| {
        let b = &k.budgets;
        match budget {
            "requests_per_minute" => b.requests_per_minute.is_some(),
            "tokens_per_day" => b.tokens_per_day.is_some(),
            "tool_calls_per_day" => b.tool_calls_per_day.is_some(),
            _ => b.usd_per_month.is_some(),
        }
    });
    match own {
        Some(k) => format!("keys.{}.{budget}", k.name),
        None => format!("limits.{budget}"),
    }
}

/// The principal's name as usage and metrics show it: `NAME` of `[keys.NAME]`, the digest
/// of an `api_keys_env` key (never the key), `anonymous` on a server without keys.
pub fn principal_name(owner: Option<&str>) -> &str {
    match owner {
        None | Some("") => ANONYMOUS,
        Some(o) => o.strip_prefix(crate::config::KEY_OWNER_PREFIX).unwrap_or(o),
    }
}

/// The principal of a server without keys, as usage and metrics name it.
pub const ANONYMOUS: &str = "anonymous";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_input_is_priced_apart_and_no_price_costs_nothing() {
        let price = Price {
            input: 2.0,
            output: 8.0,
            cached_input: 0.5,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cached_input_tokens: 400_000,
        };
        // 600k fresh at 2, 400k cached at 0.5, 500k out at 8.
        assert!((cost(&price, usage) - (1.2 + 0.2 + 4.0)).abs() < 1e-9);
        assert_eq!(principal_name(Some("key:alice")), "alice");
        assert_eq!(principal_name(None), ANONYMOUS);
        assert_eq!(principal_name(Some("")), ANONYMOUS);
    }
}
