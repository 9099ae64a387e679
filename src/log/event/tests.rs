use super::*;
use serde_json::json;

#[test]
fn serialization_puts_common_fields_first_and_round_trips() {
    let ev = Event::new(
        3,
        "evt_1".into(),
        "turn_1".into(),
        "2026-01-01T00:00:00.000Z".into(),
        EventBody::ToolResult {
            tool_use_id: "call_1".into(),
            content: json!("18C"),
            is_error: false,
            files: vec![],
        },
    );
    assert_eq!(
        &*ev.json,
        r#"{"id":"evt_1","type":"agent.tool_result","turn_id":"turn_1","created_at":"2026-01-01T00:00:00.000Z","tool_use_id":"call_1","content":"18C","is_error":false,"files":[]}"#
    );
    let back = Event::parse(3, &ev.json).unwrap();
    assert_eq!(back.body, ev.body);
    assert_eq!(back.id, "evt_1");
    assert_eq!(&*back.json, &*ev.json);
}

/// The envelope as a `Value` map, the way events were first serialized: the direct writer
/// must give exactly these bytes for every kind of event.
fn via_value(id: &str, turn_id: &str, created_at: &str, body: &EventBody) -> String {
    let mut out = Map::new();
    out.insert("id".into(), Value::String(id.into()));
    out.insert("type".into(), Value::String(body.type_name().into()));
    out.insert("turn_id".into(), Value::String(turn_id.into()));
    out.insert("created_at".into(), Value::String(created_at.into()));
    if let Ok(Value::Object(fields)) = serde_json::to_value(body) {
        for (k, v) in fields {
            if k != "type" {
                out.insert(k, v);
            }
        }
    }
    Value::Object(out).to_string()
}

#[test]
fn every_kind_of_event_serializes_as_its_envelope_then_its_fields() {
    let file = FileRef {
        id: "file_1".into(),
        filename: "a \"q\".txt".into(),
        mime_type: "text/plain".into(),
        size_bytes: 3,
    };
    let usage = Some(Usage::default());
    let bodies = vec![
        EventBody::UserMessage {
            content: json!([{"type": "text", "text": "héllo\n\u{1F600} \"x\""}]),
            files: vec![file.clone()],
            skills: vec![json!({"name": "s"})],
        },
        EventBody::AgentThinking {
            content: "\t<b>&</b>".into(),
            signature: None,
            blocks: vec![],
        },
        EventBody::AgentThinking {
            content: "t".into(),
            signature: Some("U0lH".into()),
            blocks: vec![],
        },
        EventBody::AgentThinking {
            content: REDACTED_THINKING.into(),
            signature: None,
            blocks: vec![SignedThinking::RedactedThinking {
                data: "RU5D".into(),
            }],
        },
        EventBody::AgentMessage {
            content: String::new(),
            plan: false,
            compaction: false,
            replaces: None,
        },
        EventBody::AgentMessage {
            content: "1. plan".into(),
            plan: true,
            compaction: false,
            replaces: None,
        },
        EventBody::AgentMessage {
            content: "Summary".into(),
            plan: false,
            compaction: true,
            replaces: Some(["evt_1".into(), "evt_9".into()]),
        },
        EventBody::ToolUse {
            tool_use_id: "call_1".into(),
            name: "mcp__t__x".into(),
            input: json!({"z": 1, "a": [null, 2.5, "\\"]}),
        },
        EventBody::ToolResult {
            tool_use_id: "call_1".into(),
            content: json!([{"type": "text", "text": "ok"}]),
            is_error: true,
            files: vec![file],
        },
        EventBody::TurnCompleted {
            usage,
            stop_reason: StopReason::MaxSteps,
        },
        EventBody::TurnFailed {
            reason: FailReason::WorkerLost,
            usage: None,
            message: Some("gone \u{7}".into()),
        },
        EventBody::TurnFailed {
            reason: FailReason::Timeout,
            usage,
            message: None,
        },
        EventBody::TurnCancelled { usage: None },
    ];
    for body in bodies {
        let ev = Event::new(
            1,
            "evt_\"1".into(),
            "turn_1".into(),
            "2026".into(),
            body.clone(),
        );
        assert_eq!(&*ev.json, via_value("evt_\"1", "turn_1", "2026", &body));
        assert_eq!(Event::parse(1, &ev.json).unwrap().body, body);
    }
}

#[test]
fn thinking_keeps_signatures_compactly_and_is_never_empty() {
    let signed = |t: &str, s: &str| SignedThinking::Thinking {
        thinking: t.into(),
        signature: s.into(),
    };
    let redacted = SignedThinking::RedactedThinking { data: "ENC".into() };
    assert_eq!(EventBody::thinking("", &[]), None);
    let plain = EventBody::thinking("hmm", &[]).unwrap();
    assert_eq!(
        serde_json::to_value(&plain).unwrap(),
        json!({"type": "agent.thinking", "content": "hmm"})
    );
    assert!(plain.signed_thinking().is_empty());
    // One signed block: only its signature beside the content.
    let one = EventBody::thinking("hmm", &[signed("hmm", "SIG")]).unwrap();
    assert_eq!(
        serde_json::to_value(&one).unwrap(),
        json!({"type": "agent.thinking", "content": "hmm", "signature": "SIG"})
    );
    assert_eq!(one.signed_thinking(), vec![signed("hmm", "SIG")]);
    // Several, or redacted: every block as issued.
    let all = vec![redacted.clone(), signed("a", "S1"), signed("b", "S2")];
    let many = EventBody::thinking("ab", &all).unwrap();
    assert_eq!(many.signed_thinking(), all);
    let v = serde_json::to_value(&many).unwrap();
    assert_eq!(
        v["blocks"][0],
        json!({"type": "redacted_thinking", "data": "ENC"})
    );
    assert!(v.get("signature").is_none());
    // Only redacted thinking: a content that says so.
    let hidden = EventBody::thinking("", std::slice::from_ref(&redacted)).unwrap();
    assert_eq!(
        hidden,
        EventBody::AgentThinking {
            content: REDACTED_THINKING.into(),
            signature: None,
            blocks: vec![redacted],
        }
    );
    // Stored and read back.
    let ev = Event::new(1, "evt_1".into(), "turn_1".into(), "t".into(), many.clone());
    assert_eq!(Event::parse(1, &ev.json).unwrap().body, many);
}

#[test]
fn terminal_events_carry_usage_or_null() {
    let ev = Event::new(
        1,
        "evt_2".into(),
        "turn_1".into(),
        "t".into(),
        EventBody::TurnCancelled { usage: None },
    );
    assert!(ev.json.ends_with(r#""usage":null}"#), "{}", ev.json);
    assert!(ev.body.is_terminal());
}
