//! Usage rows in the embedded store. A commit's usage rows ride on the last event it writes
//! (`events.usage`, JSON): the event's page is written anyway, while an upsert into `usage` in
//! every commit wrote a page of its own too (~20k instructions a turn of ~340k: the upsert and
//! its WAL frame). The writer adds up in memory what rides on the events it committed, and
//! writes that into `usage` (upsert-add, a row per key) about once a second, in the commit
//! that is due, before a session's events are deleted, and before usage is read; a commit with
//! usage and no event (or one that deletes a session) adds it at once. `usage_fold.n` is the
//! last event folded: what `kill -9` cut before a fold is read back from the events at the next
//! open. Usage is as durable as the events it rides on.

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

/// The usage rows of one commit as they ride on its last event: merged by key, as JSON (what
/// `serde_json` makes of them, written here with the keys as they are rather than escaped
/// one by one: a commit a turn writes one).
pub(super) fn riding(rows: &[UsageRow]) -> String {
    use std::io::Write as _;
    let mut out: Vec<u8> = Vec::with_capacity(256 * rows.len() + 2);
    // Writing to a Vec cannot fail, and a string or a number always serializes.
    let text = |out: &mut Vec<u8>, key: &str, value: &str| {
        out.extend_from_slice(key.as_bytes());
        let _ = serde_json::to_writer(&mut *out, value);
    };
    out.push(b'[');
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        text(&mut out, "{\"owner\":", &r.owner);
        text(&mut out, ",\"day\":", &r.day);
        text(&mut out, ",\"agent\":", &r.agent);
        text(&mut out, ",\"upstream\":", &r.upstream);
        text(&mut out, ",\"model\":", &r.model);
        let _ = write!(
            out,
            ",\"input_tokens\":{},\"output_tokens\":{},\"cached_tokens\":{},\"usd\":",
            r.input_tokens, r.output_tokens, r.cached_tokens
        );
        let _ = serde_json::to_writer(&mut out, &r.usd);
        let _ = write!(
            out,
            ",\"calls\":{},\"tool_calls\":{}}}",
            r.calls, r.tool_calls
        );
    }
    out.push(b']');
    String::from_utf8(out).unwrap_or_else(|_| "[]".into())
}

/// Add `rows` into `merged`: a row with the key (owner, day, agent, upstream, model) of one
/// there is added to it, any other appended. Few keys are live at once (one per principal,
/// agent and model in use), and consecutive rows mostly share theirs: a scan from the last
/// key added to.
pub(super) fn merge_into(merged: &mut Vec<UsageRow>, rows: impl IntoIterator<Item = UsageRow>) {
    let mut last = 0;
    for r in rows {
        let same = |m: &UsageRow| {
            (&m.owner, &m.day, &m.agent, &m.upstream, &m.model)
                == (&r.owner, &r.day, &r.agent, &r.upstream, &r.model)
        };
        let hit = merged
            .get(last)
            .filter(|m| same(m))
            .map(|_| last)
            .or_else(|| merged.iter().position(same));
        match hit {
            Some(i) => {
                let m = &mut merged[i];
                m.input_tokens = m.input_tokens.saturating_add(r.input_tokens);
                m.output_tokens = m.output_tokens.saturating_add(r.output_tokens);
                m.cached_tokens = m.cached_tokens.saturating_add(r.cached_tokens);
                m.usd += r.usd;
                m.calls = m.calls.saturating_add(r.calls);
                m.tool_calls = m.tool_calls.saturating_add(r.tool_calls);
                last = i;
            }
            None => {
                last = merged.len();
                merged.push(r);
            }
        }
    }
}

/// Fold what rides on the events past the mark into `usage` (what a process that stopped left
/// riding: the writer's first commit does this), then mark every event folded (in the
/// caller's transaction). A row that does not parse is skipped
/// with a warning (nothing else could read it either).
pub(super) fn fold_from_log(tx: &Connection) -> rusqlite::Result<()> {
    let from: i64 = tx.query_row("SELECT n FROM usage_fold WHERE id = 1", [], |r| r.get(0))?;
    let riding: Vec<(i64, String)> = tx
        .prepare("SELECT n, usage FROM events WHERE n > ?1 AND usage IS NOT NULL")?
        .query_map(params![from], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let parsed = riding.iter().flat_map(|(n, json)| {
        serde_json::from_str::<Vec<UsageRow>>(json)
            .inspect_err(|e| tracing::warn!(event = n, error = %e, "usage riding on an event does not parse; skipped"))
            .unwrap_or_default()
    });
    let mut rows = Vec::new();
    merge_into(&mut rows, parsed);
    fold(tx, &rows)
}

/// Add `rows` (the usage riding on every event past the mark, added up) to `usage`, and mark
/// every event folded (in the caller's transaction).
pub(super) fn fold(tx: &Connection, rows: &[UsageRow]) -> rusqlite::Result<()> {
    for row in rows {
        add(tx, row)?;
    }
    mark_folded(tx)
}

/// Every event there is now counts as folded: after [`fold`], and after events are deleted
/// (so that the next event, which may take a deleted one's `n`, is past the mark).
pub(super) fn mark_folded(tx: &Connection) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE usage_fold SET n = (SELECT coalesce(max(n), 0) FROM events) WHERE id = 1",
    )?
    .execute([])?;
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
