//! `GET /usage`: usage rows summed by the dimensions asked for (`group_by`), with totals.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::ledger::principal_name;
use crate::log::UsageRow;

/// A dimension rows can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dimension {
    Principal,
    Agent,
    Upstream,
    Model,
    Day,
}

impl Dimension {
    /// Its name in `group_by`.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Principal => "principal",
            Dimension::Agent => "agent",
            Dimension::Upstream => "upstream",
            Dimension::Model => "model",
            Dimension::Day => "day",
        }
    }

    /// The dimension named so.
    pub fn parse(s: &str) -> Option<Dimension> {
        [
            Dimension::Principal,
            Dimension::Agent,
            Dimension::Upstream,
            Dimension::Model,
            Dimension::Day,
        ]
        .into_iter()
        .find(|d| d.name() == s)
    }

    fn of(self, r: &UsageRow) -> &str {
        match self {
            Dimension::Principal => principal_name(Some(&r.owner)),
            Dimension::Agent => &r.agent,
            Dimension::Upstream => &r.upstream,
            Dimension::Model => &r.model,
            Dimension::Day => &r.day,
        }
    }
}

/// What a `GET /usage` asked for, checked.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub group_by: Vec<Dimension>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// The body of `GET /usage`: `{"from", "to", "group_by", "rows": [...], "totals": {...}}`,
/// each row its dimensions' values then the sums; rows in the order of their dimensions.
pub fn report(q: &Query, rows: &[UsageRow], truncated: bool) -> Value {
    let mut groups: BTreeMap<Vec<&str>, UsageRow> = BTreeMap::new();
    let mut total = UsageRow::default();
    for r in rows {
        let key: Vec<&str> = q.group_by.iter().map(|d| d.of(r)).collect();
        add(groups.entry(key).or_default(), r);
        add(&mut total, r);
    }
    let out: Vec<Value> = groups
        .into_iter()
        .map(|(key, sums)| {
            let mut row = Map::new();
            for (d, v) in q.group_by.iter().zip(key) {
                row.insert(d.name().to_string(), json!(v));
            }
            if let Value::Object(s) = sums_of(&sums) {
                row.extend(s);
            }
            Value::Object(row)
        })
        .collect();
    let names: Vec<&str> = q.group_by.iter().map(|d| d.name()).collect();
    json!({
        "from": q.from,
        "to": q.to,
        "group_by": names,
        "rows": out,
        "totals": sums_of(&total),
        "truncated": truncated,
    })
}

fn add(to: &mut UsageRow, r: &UsageRow) {
    to.input_tokens += r.input_tokens;
    to.output_tokens += r.output_tokens;
    to.cached_tokens += r.cached_tokens;
    to.usd += r.usd;
    to.calls += r.calls;
    to.tool_calls += r.tool_calls;
}

fn sums_of(r: &UsageRow) -> Value {
    json!({
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "cached_tokens": r.cached_tokens,
        "tokens": r.input_tokens + r.output_tokens,
        "usd": (r.usd * 1e6).round() / 1e6,
        "calls": r.calls,
        "tool_calls": r.tool_calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(owner: &str, day: &str, model: &str, input: u64, tools: u64) -> UsageRow {
        UsageRow {
            owner: owner.into(),
            day: day.into(),
            agent: "a".into(),
            upstream: if model.is_empty() { "" } else { "up" }.into(),
            model: model.into(),
            input_tokens: input,
            output_tokens: 1,
            usd: 0.5,
            calls: 1,
            tool_calls: tools,
            ..UsageRow::default()
        }
    }

    #[test]
    fn rows_are_summed_by_the_dimensions_asked_for() {
        let rows = [
            row("key:alice", "2026-12-01", "m", 10, 0),
            row("key:alice", "2026-12-02", "m", 20, 0),
            row("", "2026-12-02", "", 0, 3),
        ];
        let q = Query {
            group_by: vec![Dimension::Principal],
            ..Query::default()
        };
        let v = report(&q, &rows, false);
        assert_eq!(v["rows"][0]["principal"], "alice");
        assert_eq!(v["rows"][0]["input_tokens"], 30);
        assert_eq!(v["rows"][0]["tokens"], 32);
        assert_eq!(v["rows"][1]["principal"], "anonymous");
        assert_eq!(v["rows"][1]["tool_calls"], 3);
        assert_eq!(v["totals"]["calls"], 3);
        assert_eq!(v["totals"]["usd"], 1.5);
        let q = Query {
            group_by: vec![Dimension::Day, Dimension::Model],
            ..Query::default()
        };
        let v = report(&q, &rows, false);
        assert_eq!(v["rows"].as_array().unwrap().len(), 3);
        assert_eq!(v["rows"][0]["day"], "2026-12-01");
        assert!(v["rows"][0].get("principal").is_none());
        assert_eq!(v["group_by"], json!(["day", "model"]));
    }
}
