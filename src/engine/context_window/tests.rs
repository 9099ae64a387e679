use super::*;

#[test]
fn sizes_are_the_json_lengths() {
    let m = Message::Assistant {
        content: Content::Blocks(vec![
            Block::Text {
                text: "h\u{e9}llo \"quoted\"\n".into(),
            },
            Block::ToolUse {
                tool_call_id: "call_1".into(),
                name: "read".into(),
                input: serde_json::json!({"path": "a b", "n": [1, 2.5, null]}),
            },
        ]),
    };
    assert_eq!(message_bytes(&m), serde_json::to_vec(&m).unwrap().len());
    let v = serde_json::json!({"type": "object", "properties": {"x": {"type": "string"}}});
    assert_eq!(json_len(&v), v.to_string().len());
}

#[test]
fn known_models_have_their_window_else_the_default() {
    assert_eq!(known_window("gpt-4o-mini"), Some(128_000));
    assert_eq!(known_window("gpt-4.1-nano"), Some(1_047_576));
    assert_eq!(known_window("openai/gpt-5-mini"), Some(400_000));
    assert_eq!(known_window("claude-sonnet-4-5"), Some(200_000));
    assert_eq!(known_window("Qwen3-32B"), Some(40_960));
    assert_eq!(known_window("o4-mini"), Some(200_000));
    assert_eq!(window(None, "fake-model"), (128_000, false));
    assert_eq!(window(None, "gpt-5"), (400_000, true));
    assert_eq!(window(Some(2000), "gpt-5"), (2000, true));
}

#[test]
fn calibration_moves_toward_the_reported_usage_within_bounds() {
    let c = Calibration::default();
    assert_eq!(c.tokens(4000), 1000);
    c.observe(4000, 2000); // measured 2.0: halfway from 1.0
    assert_eq!(c.tokens(4000), 1500);
    c.observe(4000, 0); // not reported: unchanged
    assert_eq!(c.tokens(4000), 1500);
    for _ in 0..20 {
        c.observe(4000, 1);
    }
    assert_eq!(c.tokens(4000), 250, "the ratio stays at or over 1/4");
}

#[test]
fn the_cut_is_the_first_that_leaves_the_rest_under_target() {
    let sizes = [100, 100, 100, 100, 100];
    let all = |v: &[usize]| v.iter().map(|&c| (c, true)).collect::<Vec<_>>();
    assert_eq!(choose_cut(&sizes, &all(&[1, 2, 3, 4]), 0, 250), Some(3));
    assert_eq!(choose_cut(&sizes, &all(&[2, 4]), 0, 350), Some(2));
    assert_eq!(choose_cut(&sizes, &all(&[2, 4]), 60, 350), Some(4));
    // A user message's start is preferred to an assistant's.
    let mixed = [(1, false), (2, true), (3, false), (4, true)];
    assert_eq!(choose_cut(&sizes, &mixed, 0, 350), Some(2));
    assert_eq!(choose_cut(&sizes, &mixed, 0, 250), Some(4));
    let mixed = [(1, true), (3, false)];
    assert_eq!(choose_cut(&sizes, &mixed, 0, 250), Some(3));
    // Nothing is enough: as much as may go.
    assert_eq!(choose_cut(&sizes, &all(&[1, 2]), 0, 10), Some(2));
    assert_eq!(choose_cut(&sizes, &[], 0, 10), None);
    assert_eq!(choose_cut(&sizes, &all(&[0]), 0, 10), None);
}

#[test]
fn the_summary_request_fits_its_budget_and_keeps_both_ends() {
    let long = format!("start {} end", "x".repeat(10_000));
    let msgs = vec![
        Message::User {
            content: Content::Text("hello".into()),
        },
        Message::Tool {
            tool_call_id: "c".into(),
            content: Content::Text(long),
        },
    ];
    let text = summary_request_text(Some("before"), &msgs, 2000);
    assert!(text.len() < 3000, "{}", text.len());
    assert!(text.contains("start") && text.contains(" end"));
    assert!(text.contains("[Summary of what came before]\nbefore"));
    assert!(text.contains("[User]\nhello"));
    assert_eq!(shorten("héllo wörld", 5), "h […10 bytes left out…] ld");
}
