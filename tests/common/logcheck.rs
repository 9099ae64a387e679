//! Validates a session's whole log against spec 003's guarantees. Every test that makes turns
//! runs it at the end.

use std::collections::HashSet;

use turnstile::log::{Event, EventBody, Store};

/// Read every event of a session straight from the store and check the guarantees:
/// - ids are unique, prefixed `evt_`, and increase with the log's order; seq is 1, 2, 3, ...;
/// - every turn starts with `user.message` and ends with exactly one terminal event, last;
/// - turns do not interleave;
/// - every `agent.tool_use` has exactly one `agent.tool_result`, after it — except the calls a
///   turn stopped on (`stop_reason: tool_use`), answered at the start of the next turn that runs
///   (a queued turn cancelled before it started, `user.message` then `turn.cancelled`, did not);
/// - an `agent.thinking` is never empty; an `agent.message` comes before the tool uses of its
///   step (it is written first).
pub async fn check_log(store: &Store, session_id: &str) -> Vec<Event> {
    store.flush().await.expect("flush");
    let events = store.events(session_id, 0, 1 << 30).await.expect("events");
    check_events(&events);
    events
}

pub fn check_events(events: &[Event]) {
    let mut last_id = String::new();
    let mut current_turn: Option<String> = None;
    let mut seen_turns = HashSet::new();
    let mut open_calls: Vec<String> = Vec::new();
    let mut carried: Vec<String> = Vec::new();
    let mut results = HashSet::new();
    for (i, ev) in events.iter().enumerate() {
        let ctx = format!("event #{} {} ({})", i + 1, ev.id, ev.body.type_name());
        assert_eq!(ev.seq, i as u64 + 1, "{ctx}: seq");
        assert!(ev.id.starts_with("evt_"), "{ctx}: id prefix");
        assert!(ev.id > last_id, "{ctx}: ids must increase");
        last_id = ev.id.clone();
        assert!(
            ev.json.contains(&format!("\"id\":\"{}\"", ev.id)),
            "{ctx}: json has the id"
        );
        match &current_turn {
            None => {
                assert!(
                    matches!(ev.body, EventBody::UserMessage { .. }),
                    "{ctx}: a turn must start with user.message"
                );
                assert!(
                    seen_turns.insert(ev.turn_id.clone()),
                    "{ctx}: turn {} appears twice",
                    ev.turn_id
                );
                current_turn = Some(ev.turn_id.clone());
                // Calls carried from the previous turn must be answered first, in this turn.
            }
            Some(t) => assert_eq!(&ev.turn_id, t, "{ctx}: turns interleave"),
        }
        match &ev.body {
            EventBody::ToolUse { tool_use_id, .. } => {
                assert!(
                    !open_calls.contains(tool_use_id),
                    "{ctx}: duplicate tool_use"
                );
                open_calls.push(tool_use_id.clone());
            }
            EventBody::ToolResult { tool_use_id, .. } => {
                assert!(
                    results.insert(tool_use_id.clone()),
                    "{ctx}: a second result for {tool_use_id}"
                );
                if let Some(pos) = open_calls.iter().position(|c| c == tool_use_id) {
                    open_calls.remove(pos);
                } else if let Some(pos) = carried.iter().position(|c| c == tool_use_id) {
                    carried.remove(pos);
                } else {
                    panic!("{ctx}: result for {tool_use_id}, which has no tool_use");
                }
            }
            EventBody::AgentThinking { content, .. } => {
                assert!(!content.is_empty(), "{ctx}: empty thinking")
            }
            EventBody::TurnCompleted { stop_reason, .. } => {
                assert!(
                    carried.is_empty(),
                    "{ctx}: calls {carried:?} from the previous turn were never answered"
                );
                if *stop_reason == turnstile::log::StopReason::ToolUse {
                    assert!(
                        !open_calls.is_empty(),
                        "{ctx}: stop_reason tool_use with no open call"
                    );
                    carried = std::mem::take(&mut open_calls);
                } else {
                    assert!(
                        open_calls.is_empty(),
                        "{ctx}: tool uses without results: {open_calls:?}"
                    );
                }
                current_turn = None;
            }
            EventBody::TurnFailed { .. } | EventBody::TurnCancelled { .. } => {
                assert!(
                    open_calls.is_empty(),
                    "{ctx}: tool uses without results: {open_calls:?}"
                );
                // A queued turn cancelled before it started (its `user.message`, then this)
                // never ran: the calls it was carried stay open for the turn after it.
                let never_ran = matches!(ev.body, EventBody::TurnCancelled { .. })
                    && i > 0
                    && matches!(events[i - 1].body, EventBody::UserMessage { .. });
                assert!(
                    never_ran || carried.is_empty(),
                    "{ctx}: carried calls never answered: {carried:?}"
                );
                current_turn = None;
            }
            _ => {}
        }
    }
    assert!(current_turn.is_none(), "the log ends inside a turn");
}
