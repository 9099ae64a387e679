//! The budget keys of `[keys.NAME]` and `[limits]` (see [`crate::config::Budgets`]): each a
//! positive number, named with its table when it is not.

use toml::Spanned;

use super::error::{ConfigError, Cx};
use crate::config::Budgets;

/// The budget keys of one table as written.
pub(super) struct RawBudgets<'a> {
    pub requests_per_minute: Option<&'a Spanned<i64>>,
    pub tokens_per_day: Option<&'a Spanned<i64>>,
    pub tool_calls_per_day: Option<&'a Spanned<i64>>,
    pub usd_per_month: Option<&'a Spanned<f64>>,
}

/// The budgets of the table whose key is `table` (`keys.alice`, `limits`).
pub(super) fn budgets(
    cx: &Cx<'_>,
    table: &str,
    raw: RawBudgets<'_>,
) -> Result<Budgets, ConfigError> {
    let key = |k: &str| format!("{table}.{k}");
    let count = |v: Option<&Spanned<i64>>, k: &str, max: i64| {
        cx.opt_int(v, &key(k), 1, max).map(|n| n.map(|n| n as u64))
    };
    let usd_per_month = match raw.usd_per_month {
        None => None,
        Some(v) => {
            let x = *v.get_ref();
            if !(x.is_finite() && x > 0.0) {
                return Err(cx.err(
                    v.span(),
                    &key("usd_per_month"),
                    format!(
                        "{x} is not a budget: give USD per calendar month, more than 0, e.g. 50.0"
                    ),
                ));
            }
            Some(x)
        }
    };
    Ok(Budgets {
        requests_per_minute: count(
            raw.requests_per_minute,
            "requests_per_minute",
            i64::from(u32::MAX),
        )?
        .map(|n| n as u32),
        tokens_per_day: count(raw.tokens_per_day, "tokens_per_day", i64::MAX)?,
        tool_calls_per_day: count(raw.tool_calls_per_day, "tool_calls_per_day", i64::MAX)?,
        usd_per_month,
    })
}
