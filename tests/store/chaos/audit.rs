//! After the chaos: every session's log at rest and checked, every accepted request found in
//! it with its end, the tool executions counted, and the time each fault took to recover from.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile::log::{Event, EventBody, Store};

use super::agitator::Fault;
use super::clients::{Accepted, Key};
use super::cluster::Success;

/// A turn of a log: its id, its `user.message` content (JSON text), and how it ended
/// (`turn.completed:end_turn`, `turn.failed:worker_lost`, ...).
pub struct Turn {
    pub id: String,
    pub content: String,
    pub end: Option<String>,
}

pub fn turns(events: &[Event]) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::new();
    for e in events {
        if let EventBody::UserMessage { content, .. } = &e.body {
            out.push(Turn {
                id: e.turn_id.to_string(),
                content: content.to_string(),
                end: None,
            });
        } else if e.body.is_terminal() {
            let v: Value = serde_json::from_str(&e.json).unwrap_or_default();
            let why = v["stop_reason"].as_str().or(v["reason"].as_str());
            let end = match why {
                Some(why) => format!("{}:{why}", e.body.type_name()),
                None => e.body.type_name().to_string(),
            };
            if let Some(t) = out.iter_mut().rev().find(|t| *t.id == *e.turn_id) {
                t.end = Some(end);
            }
        }
    }
    out
}

fn find<'a>(turns: &'a [Turn], key: &Key) -> Option<&'a Turn> {
    match key {
        Key::Turn(id) => turns.iter().find(|t| t.id == *id),
        Key::Tag(tag) => {
            let tag = format!("[[{tag}]]");
            turns.iter().find(|t| t.content.contains(&tag))
        }
        Key::Permission(call) => {
            let call = format!("\"{call}\"");
            turns
                .iter()
                .find(|t| t.content.contains("tool_permission") && t.content.contains(&call))
        }
    }
}

/// Where each accepted request stands in the logs.
#[derive(Default)]
pub struct Accounting {
    /// Accepted, and not in the log.
    pub lost: Vec<String>,
    /// In the log, without an end.
    pub unended: Vec<String>,
    /// How the accepted requests' turns ended, by end.
    pub ends: BTreeMap<String, u64>,
}

pub fn account(accepted: &[Accepted], logs: &HashMap<String, Vec<Turn>>) -> Accounting {
    let mut out = Accounting::default();
    for a in accepted {
        let empty = Vec::new();
        let turns = logs.get(&a.session).unwrap_or(&empty);
        match find(turns, &a.key) {
            None => out
                .lost
                .push(format!("{} {:?} ({})", a.session, a.key, a.kind)),
            Some(Turn { end: None, id, .. }) => out
                .unended
                .push(format!("{} {id} {:?} ({})", a.session, a.key, a.kind)),
            Some(Turn { end: Some(end), .. }) => *out.ends.entry(end.clone()).or_default() += 1,
        }
    }
    out
}

/// Polls the logs until every session is at rest (its log not inside a turn) and every
/// accepted request's turn has ended, for at most `within`; the logs as last read, and whether
/// they came to rest.
pub async fn wait_for_rest(
    store: &Store,
    sessions: &[String],
    accepted: &[Accepted],
    within: Duration,
) -> (HashMap<String, Vec<Event>>, bool) {
    let deadline = Instant::now() + within;
    loop {
        let mut logs = HashMap::new();
        let mut at_rest = true;
        for sid in sessions {
            let events = store.events(sid, 0, 1 << 30).await.unwrap_or_default();
            at_rest &= events.last().is_none_or(|e| e.body.is_terminal());
            logs.insert(sid.clone(), events);
        }
        let turns = logs.iter().map(|(s, e)| (s.clone(), turns(e))).collect();
        let acc = account(accepted, &turns);
        at_rest &= acc.lost.is_empty() && acc.unended.is_empty();
        if at_rest || Instant::now() > deadline {
            return (logs, at_rest);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The tool calls that reached the MCP servers (`--log-calls` lines), and those that came
/// more than once (a call's arguments carry the tag of the request it was made for).
pub fn executions(calls: &Path) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(calls).unwrap_or_default();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        *seen.entry(line).or_default() += 1;
    }
    let twice = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(line, n)| format!("{n}x {line}"))
        .collect();
    (text.lines().count(), twice)
}

/// For each fault, the time from it to the first `2xx` after it: from the instance hit, as
/// started again; after a database restart, from any instance, to a request sent once the
/// database was back. Faults with no `2xx` after them are counted apart.
pub fn recovery(faults: &[Fault], successes: &[Success]) -> (Vec<Duration>, usize) {
    let mut times = Vec::new();
    let mut never = 0;
    for f in faults {
        let first = successes
            .iter()
            .filter(|s| match f.slot {
                Some((i, generation)) => s.slot == i && s.generation == generation,
                None => s.sent >= f.back,
            })
            .map(|s| s.answered)
            .min();
        match first {
            Some(t) => times.push(t.saturating_duration_since(f.at)),
            None => never += 1,
        }
    }
    times.sort();
    (times, never)
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
