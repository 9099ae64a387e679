//! Usage rows in the embedded store: each increment added to its row in the commit that holds
//! it (upsert-add), and the rows read by owner and day range.

use rusqlite::{params, Connection};

use crate::log::rows::{UsageFilter, UsageRow, USAGE_ROWS_AT_MOST};
use crate::log::StoreError;

/// Add `r`'s counts to its row (made at zero when absent).
pub(super) fn add(tx: &Connection, r: &UsageRow) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO usage (owner, day, agent, upstream, model, input_tokens, output_tokens,
             cached_tokens, usd, calls, tool_calls)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (owner, day, agent, upstream, model) DO UPDATE SET
             input_tokens = input_tokens + excluded.input_tokens,
             output_tokens = output_tokens + excluded.output_tokens,
             cached_tokens = cached_tokens + excluded.cached_tokens,
             usd = usd + excluded.usd,
             calls = calls + excluded.calls,
             tool_calls = tool_calls + excluded.tool_calls",
    )?
    .execute(params![
        r.owner,
        r.day,
        r.agent,
        r.upstream,
        r.model,
        clamp(r.input_tokens),
        clamp(r.output_tokens),
        clamp(r.cached_tokens),
        r.usd,
        clamp(r.calls),
        clamp(r.tool_calls),
    ])?;
    Ok(())
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The rows `f` names, by day then key.
pub(super) fn read(c: &Connection, f: &UsageFilter) -> Result<Vec<UsageRow>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT owner, day, agent, upstream, model, input_tokens, output_tokens, cached_tokens,
                usd, calls, tool_calls FROM usage
          WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR day >= ?2) AND (?3 IS NULL OR day <= ?3)
          ORDER BY day, owner, agent, upstream, model LIMIT ?4",
    )?;
    let n = |v: i64| v.max(0) as u64;
    let rows = stmt.query_map(
        params![f.owner, f.from, f.to, USAGE_ROWS_AT_MOST as i64],
        |r| {
            Ok(UsageRow {
                owner: r.get(0)?,
                day: r.get(1)?,
                agent: r.get(2)?,
                upstream: r.get(3)?,
                model: r.get(4)?,
                input_tokens: n(r.get(5)?),
                output_tokens: n(r.get(6)?),
                cached_tokens: n(r.get(7)?),
                usd: r.get(8)?,
                calls: n(r.get(9)?),
                tool_calls: n(r.get(10)?),
            })
        },
    )?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}
