use super::*;

#[test]
fn elicitation_calls_and_their_results_are_hidden_from_the_model() {
    let call = |id: &str, name: &str| Block::ToolUse {
        tool_call_id: id.into(),
        name: name.into(),
        input: json!({}),
    };
    let tool = |id: &str| Message::Tool {
        tool_call_id: id.into(),
        content: Content::Text("r".into()),
    };
    let mut m = vec![
        Message::Assistant {
            content: Content::Blocks(vec![call("a", "mcp__s__t"), call("b", "other")]),
        },
        tool("b"),
        Message::Assistant {
            content: Content::Blocks(vec![call("e", "elicitation")]),
        },
        tool("e"),
        tool("a"),
    ];
    hide(&mut m, "elicitation");
    assert_eq!(m.len(), 3);
    assert!(matches!(&m[1], Message::Tool { tool_call_id, .. } if tool_call_id == "b"));
    assert!(matches!(&m[2], Message::Tool { tool_call_id, .. } if tool_call_id == "a"));
}

fn pending(id: &str, kind: PendingKind, input: Value) -> Pending {
    Pending {
        call_id: id.into(),
        name: "n".into(),
        input,
        kind,
        asked_at: String::new(),
        expires_at: None,
        expired: false,
        ended: None,
    }
}

#[test]
fn after_a_restart_a_question_and_its_call_are_ended_others_stay() {
    let q = json!({"server": "s", "toolCallId": "m", "message": "?", "requestedSchema": {}});
    let mut p = vec![
        pending("m", PendingKind::Permission, json!({})),
        pending("e", PendingKind::Client, q),
        pending("x", PendingKind::Client, json!({"a": 1})),
    ];
    unresumable(&mut p);
    assert_eq!(p[0].ended.as_deref(), Some("Cancelled."));
    assert_eq!(p[1].ended.as_deref(), Some(RESTARTED));
    assert!(p[0].expired && p[1].expired && !p[2].expired && p[2].ended.is_none());
}

#[test]
fn a_client_answer_is_validated_and_completed() {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "default": "Ada"}, "age": {"type": "integer"}},
        "required": ["age"]});
    let ok = client_answer(
        &schema,
        &json!({"action": "accept", "content": {"age": 3}}),
        false,
    );
    assert_eq!(
        ok.unwrap(),
        Answer::Accept(
            json!({"age": 3, "name": "Ada"})
                .as_object()
                .unwrap()
                .clone()
        )
    );
    let bad = client_answer(
        &schema,
        &json!({"action": "accept", "content": {"age": "x"}}),
        false,
    );
    assert!(bad.unwrap_err().starts_with("age: "));
    assert_eq!(
        client_answer(&schema, &json!("x"), true).unwrap(),
        Answer::Cancel
    );
}
