//! Budgets, rate limits and spend per principal.
//!
//! - `ledger.rs`: what each principal has spent, checked before a turn starts (its budgets and
//!   rate limit) and before each server tool call (`tool_calls_per_day`), and every model and
//!   tool call written to the store as a usage row (durable with the turn's events: the row is
//!   queued before the events that report it, and group commit keeps the queue's order).
//! - `rate.rs`: the token bucket of `requests_per_minute`.
//! - `calendar.rs`: the UTC day and calendar month budgets count in, and when they reset.
//! - `refusal.rs`: the 429 a refused turn gets.
//! - `report.rs`: `GET /usage`, the rows summed by the dimensions asked for.
//!
//! The limits are set in `[keys.NAME]` and `[limits]` (see [`crate::config::Budgets`]).

mod calendar;
mod ledger;
mod rate;
mod refusal;
mod report;

pub(crate) use calendar::parse_day;
pub use ledger::{cost, principal_name, Ledger, ModelCall, ANONYMOUS, REFRESH_AFTER};
pub use refusal::Refusal;
pub use report::{report, Dimension, Query};
