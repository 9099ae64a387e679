//! Usage rows in the shared store: each increment added to its row in the commit that holds
//! it (`INSERT ... ON CONFLICT DO UPDATE` adding, so every instance's calls count), and the
//! rows read by owner and day range.

use deadpool_postgres::Pool;

use crate::log::rows::{UsageFilter, UsageRow, USAGE_ROWS_AT_MOST};
use crate::log::StoreError;

/// Adds one row's counts to the stored row (made at zero when absent).
pub(super) const ADD_USAGE: &str = "INSERT INTO usage (owner, day, agent, upstream, model,
         input_tokens, output_tokens, cached_tokens, usd, calls, tool_calls)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
     ON CONFLICT (owner, day, agent, upstream, model) DO UPDATE SET
         input_tokens = usage.input_tokens + excluded.input_tokens,
         output_tokens = usage.output_tokens + excluded.output_tokens,
         cached_tokens = usage.cached_tokens + excluded.cached_tokens,
         usd = usage.usd + excluded.usd,
         calls = usage.calls + excluded.calls,
         tool_calls = usage.tool_calls + excluded.tool_calls";

/// A row's counts as bound to [`ADD_USAGE`]'s `$6..$11`.
pub(super) fn counts(r: &UsageRow) -> [i64; 5] {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    [
        n(r.input_tokens),
        n(r.output_tokens),
        n(r.cached_tokens),
        n(r.calls),
        n(r.tool_calls),
    ]
}

/// The rows `f` names, by day then key.
pub(super) async fn read(pool: Pool, f: UsageFilter) -> Result<Vec<UsageRow>, StoreError> {
    let c = pool.get().await?;
    let stmt = c
        .prepare_cached(
            "SELECT owner, day, agent, upstream, model, input_tokens, output_tokens,
                    cached_tokens, usd, calls, tool_calls FROM usage
              WHERE ($1::text IS NULL OR owner = $1) AND ($2::text IS NULL OR day >= $2)
                AND ($3::text IS NULL OR day <= $3)
              ORDER BY day, owner, agent, upstream, model LIMIT $4",
        )
        .await?;
    let limit = USAGE_ROWS_AT_MOST as i64;
    let rows = c.query(&stmt, &[&f.owner, &f.from, &f.to, &limit]).await?;
    let n = |v: i64| v.max(0) as u64;
    Ok(rows
        .iter()
        .map(|r| UsageRow {
            owner: r.get(0),
            day: r.get(1),
            agent: r.get(2),
            upstream: r.get(3),
            model: r.get(4),
            input_tokens: n(r.get(5)),
            output_tokens: n(r.get(6)),
            cached_tokens: n(r.get(7)),
            usd: r.get(8),
            calls: n(r.get(9)),
            tool_calls: n(r.get(10)),
        })
        .collect())
}
