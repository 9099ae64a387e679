use super::*;
use crate::log::StopReason;
use crate::log::{Event, EventBody};
use serde_json::json;

fn tool_use(id: &str) -> EventBody {
    EventBody::ToolUse {
        tool_use_id: id.into(),
        name: "get_weather".into(),
        input: json!({"city": "Tokyo"}),
    }
}

#[test]
fn a_tool_round_trip_projects_to_aap_history() {
    let mut p = Projector::with_seed(&[Message::System {
        content: "sys".into(),
    }]);
    let events = [
        EventBody::UserMessage {
            content: json!("weather?"),
            files: vec![],
            skills: vec![],
        },
        EventBody::AgentMessage {
            content: "Let me check.".into(),
            plan: false,
            compaction: false,
            replaces: None,
        },
        tool_use("call_1"),
        EventBody::TurnCompleted {
            usage: None,
            stop_reason: StopReason::ToolUse,
        },
        EventBody::UserMessage {
            content: json!([{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}]),
            files: vec![],
            skills: vec![],
        },
        EventBody::ToolResult {
            tool_use_id: "call_1".into(),
            content: json!("18C"),
            is_error: false,
            files: vec![],
        },
        EventBody::AgentMessage {
            content: "It is 18C.".into(),
            plan: false,
            compaction: false,
            replaces: None,
        },
        EventBody::TurnCompleted {
            usage: None,
            stop_reason: StopReason::EndTurn,
        },
    ];
    for e in &events {
        p.apply(e);
    }
    let v = serde_json::to_value(p.into_messages()).unwrap();
    assert_eq!(
        v,
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "toolCallId": "call_1", "name": "get_weather", "input": {"city": "Tokyo"}}
            ]},
            {"role": "tool", "toolCallId": "call_1", "content": "18C"},
            {"role": "assistant", "content": "It is 18C."}
        ])
    );
}

#[test]
fn a_turn_cancelled_while_queued_leaves_no_message() {
    let mut p = Projector::default();
    let user = |t: &str| EventBody::UserMessage {
        content: json!(t),
        files: vec![],
        skills: vec![],
    };
    p.apply(&user("one"));
    p.apply(&EventBody::AgentMessage {
        content: "answer".into(),
        plan: false,
        compaction: false,
        replaces: None,
    });
    p.apply(&EventBody::TurnCompleted {
        usage: None,
        stop_reason: StopReason::EndTurn,
    });
    p.apply(&user("two"));
    p.apply(&EventBody::TurnCancelled { usage: None });
    p.apply(&user("three"));
    p.apply(&EventBody::TurnCancelled {
        usage: Some(crate::message::Usage::default()),
    });
    let v = serde_json::to_value(p.into_messages()).unwrap();
    assert_eq!(
        v,
        json!([
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "three"}
        ]),
        "a turn cancelled while it ran keeps its message"
    );
}

#[test]
fn an_earlier_turns_call_answered_by_a_new_message_goes_before_it() {
    let mut p = Projector::default();
    let user = |t: &str| EventBody::UserMessage {
        content: json!(t),
        files: vec![],
        skills: vec![],
    };
    p.apply(&user("weather?"));
    p.apply(&tool_use("call_1"));
    p.apply(&EventBody::TurnCompleted {
        usage: None,
        stop_reason: StopReason::ToolUse,
    });
    p.apply(&user("never mind"));
    p.apply(&EventBody::ToolResult {
        tool_use_id: "call_1".into(),
        content: json!("Not answered"),
        is_error: true,
        files: vec![],
    });
    p.apply(&tool_use("call_2"));
    p.apply(&EventBody::ToolResult {
        tool_use_id: "call_2".into(),
        content: json!("ok"),
        is_error: false,
        files: vec![],
    });
    let roles: Vec<String> = serde_json::to_value(p.into_messages())
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "user", "assistant", "tool"]
    );
}

#[test]
fn plan_decisions_say_themselves_and_an_edit_replaces_the_plan() {
    let mut p = Projector::default();
    p.apply(&EventBody::UserMessage {
        content: json!("goal"),
        files: vec![],
        skills: vec![],
    });
    p.apply(&EventBody::AgentMessage {
        content: "1. a".into(),
        plan: true,
        compaction: false,
        replaces: None,
    });
    p.apply(&EventBody::TurnCompleted {
        usage: None,
        stop_reason: StopReason::EndTurn,
    });
    p.apply(&EventBody::UserMessage {
        content: json!([{"type": "plan_decision", "decision": "confirmed", "edits": "1. b"}]),
        files: vec![],
        skills: vec![],
    });
    let v = serde_json::to_value(p.into_messages()).unwrap();
    assert_eq!(v[1], json!({"role": "assistant", "content": "1. b"}));
    assert!(v[2]["content"].as_str().unwrap().contains("approved"));
}

#[test]
fn a_retraction_adds_nothing_and_thinking_stays() {
    let mut p = Projector::default();
    p.apply(&EventBody::AgentThinking {
        content: "hmm".into(),
        signature: None,
        blocks: vec![],
    });
    p.apply(&EventBody::AgentMessage {
        content: String::new(),
        plan: false,
        compaction: false,
        replaces: None,
    });
    p.apply(&EventBody::AgentMessage {
        content: "answer".into(),
        plan: false,
        compaction: false,
        replaces: None,
    });
    let v = serde_json::to_value(p.into_messages()).unwrap();
    assert_eq!(
        v,
        json!([{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "answer"}
        ]}])
    );
}

fn ev(n: u32, body: EventBody) -> Event {
    Event::new(
        u64::from(n),
        format!("evt_{n:02}"),
        "turn".into(),
        "t".into(),
        body,
    )
}

fn say(text: &str) -> EventBody {
    EventBody::AgentMessage {
        content: text.into(),
        plan: false,
        compaction: false,
        replaces: None,
    }
}

fn done() -> EventBody {
    EventBody::TurnCompleted {
        usage: None,
        stop_reason: StopReason::EndTurn,
    }
}

fn ask(text: &str) -> EventBody {
    EventBody::UserMessage {
        content: json!(text),
        files: vec![],
        skills: vec![],
    }
}

#[test]
fn a_compaction_starts_the_compacted_history_and_leaves_the_full_one() {
    let mut p = Projector::with_seed(&[Message::System {
        content: "sys".into(),
    }]);
    let mut n = 0;
    let mut fold = |p: &mut Projector, body: EventBody| {
        n += 1;
        p.apply_event(&ev(n, body));
    };
    fold(&mut p, ask("one")); // evt_01
    fold(&mut p, say("answer one"));
    fold(&mut p, tool_use("call_1"));
    fold(
        &mut p,
        EventBody::ToolResult {
            tool_use_id: "call_1".into(),
            content: json!("18C"),
            is_error: false,
            files: vec![],
        },
    ); // evt_04
    fold(&mut p, say("it is 18C")); // evt_05
    fold(&mut p, done()); // evt_06
    fold(&mut p, ask("two")); // evt_07
    let before = p.messages();
    let c = p.compactable();
    // Before "one" (nothing to cut) is no place; before the tool result is none either.
    let places: Vec<_> = c
        .cuts
        .iter()
        .map(|(at, _, id)| (*at, id.as_str()))
        .collect();
    assert_eq!(places, [(2, "evt_01"), (4, "evt_04"), (5, "evt_06")]);
    assert_eq!(c.first_id.as_deref(), Some("evt_01"));
    assert_eq!(c.messages.len(), 6);
    fold(
        &mut p,
        EventBody::AgentMessage {
            content: "They asked about the weather: 18C.".into(),
            plan: false,
            compaction: true,
            replaces: Some(["evt_01".into(), "evt_06".into()]),
        },
    );
    assert_eq!(p.messages(), before, "the full history is unchanged");
    let v = serde_json::to_value(p.compacted(None)).unwrap();
    assert_eq!(
        v,
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": format!("{}They asked about the weather: 18C.", crate::engine::context_window::SUMMARY_INTRO)},
            {"role": "user", "content": "two"}
        ])
    );
    fold(&mut p, say("answer two"));
    fold(&mut p, done());
    fold(&mut p, ask("three")); // evt_11
    let c = p.compactable();
    assert_eq!(c.first_id.as_deref(), Some("evt_07"));
    assert_eq!(
        c.summary.as_deref(),
        Some("They asked about the weather: 18C.")
    );
    let places: Vec<_> = c
        .cuts
        .iter()
        .map(|(at, _, id)| (*at, id.as_str()))
        .collect();
    assert_eq!(places, [(1, "evt_08"), (2, "evt_10")]);
}

#[test]
fn a_compaction_naming_no_place_is_left_out() {
    let mut p = Projector::default();
    p.apply_event(&ev(1, ask("one")));
    p.apply_event(&ev(
        2,
        EventBody::AgentMessage {
            content: "summary".into(),
            plan: false,
            compaction: true,
            replaces: Some(["evt_00".into(), "evt_99".into()]),
        },
    ));
    assert_eq!(p.compacted(None), p.messages());
    assert_eq!(p.messages().len(), 1, "a compaction is no assistant text");
}
