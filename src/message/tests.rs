use super::*;
use serde_json::json;

#[test]
fn history_messages_round_trip_in_aap_shape() {
    let v = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "toolCallId": "call_1", "name": "get_weather", "input": {"city": "Tokyo"}}
        ]},
        {"role": "tool", "toolCallId": "call_1", "content": "18C"}
    ]);
    let msgs: Vec<Message> = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(serde_json::to_value(&msgs).unwrap(), v);
}

#[test]
fn signatures_are_neither_read_nor_written_in_aap_shape() {
    let signed = Block::Thinking {
        thinking: "hmm".into(),
        signed: vec![
            SignedThinking::RedactedThinking { data: "ENC".into() },
            SignedThinking::Thinking {
                thinking: "hmm".into(),
                signature: "SIG".into(),
            },
        ],
    };
    assert_eq!(
        serde_json::to_value(&signed).unwrap(),
        json!({"type": "thinking", "thinking": "hmm"})
    );
    let sent = json!({"type": "thinking", "thinking": "x", "signed": []});
    assert!(serde_json::from_value::<Block>(sent).is_err());
    assert_eq!(
        serde_json::to_value(SignedThinking::RedactedThinking { data: "ENC".into() }).unwrap(),
        json!({"type": "redacted_thinking", "data": "ENC"})
    );
}

#[test]
fn text_joins_text_blocks_by_newlines_and_borrows_a_single_one() {
    use std::borrow::Cow;
    let text = |t: &str| Block::Text { text: t.into() };
    let image = Block::Image {
        url: "data:image/png;base64,AAAA".into(),
    };
    let one = Content::Blocks(vec![image.clone(), text("only")]);
    assert!(matches!(one.text_ref(), Cow::Borrowed("only")));
    let cases = [
        (Content::Text("plain".into()), "plain"),
        (Content::Blocks(vec![]), ""),
        (Content::Blocks(vec![image.clone()]), ""),
        (Content::Blocks(vec![text("a"), image, text("b")]), "a\nb"),
        // An empty first block adds no separator; an empty later one does.
        (
            Content::Blocks(vec![text(""), text("a"), text(""), text("b")]),
            "a\n\nb",
        ),
    ];
    for (content, want) in cases {
        assert_eq!(content.text(), want, "{content:?}");
    }
}

#[test]
fn one_text_block_collapses_to_a_string() {
    let c = Content::from_blocks(vec![Block::Text { text: "x".into() }]);
    assert_eq!(c, Content::Text("x".into()));
    let two = Content::from_blocks(vec![Block::thinking("t"), Block::Text { text: "x".into() }]);
    assert!(matches!(two, Content::Blocks(ref b) if b.len() == 2));
}

#[test]
fn content_is_text_or_blocks_and_says_what_is_wrong() {
    let parse = |v: Value| serde_json::from_value::<Content>(v);
    assert_eq!(parse(json!("hi")).unwrap(), Content::Text("hi".into()));
    assert_eq!(
        serde_json::from_str::<Content>(r#"[{"type":"text","text":"a"}]"#).unwrap(),
        Content::Blocks(vec![Block::Text { text: "a".into() }])
    );
    assert_eq!(parse(json!([])).unwrap(), Content::Blocks(vec![]));
    let wrong_type = parse(json!(42)).unwrap_err().to_string();
    assert!(
        wrong_type.contains("expected a string or an array of content blocks"),
        "{wrong_type}"
    );
    let bad_block = serde_json::from_str::<Content>(r#"[{"type":"video","url":"x"}]"#)
        .unwrap_err()
        .to_string();
    assert!(
        bad_block.contains("unknown variant `video`") && bad_block.contains("`image`"),
        "{bad_block}"
    );
}

#[test]
fn unknown_role_is_rejected() {
    let r: Result<Message, _> = serde_json::from_value(json!({"role": "robot", "content": "x"}));
    assert!(r.is_err());
}
