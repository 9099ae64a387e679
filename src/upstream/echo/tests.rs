use super::*;
use crate::upstream::{NoDeltas, ToolDef};
use serde_json::json;

struct Collect(String);
impl DeltaSink for Collect {
    fn text(&mut self, f: &str) {
        self.0.push_str(f)
    }
    fn thinking(&mut self, _: &str) {}
}

fn req(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "echo".into(),
        system: None,
        messages,
        tools: vec![ToolDef {
            name: "get_weather".into(),
            description: String::new(),
            parameters: json!({"type": "object"}).into(),
        }],
        max_tokens: None,
        thinking: false,
        tuning: Default::default(),
    }
}

#[test]
fn echoes_the_user_streamed_word_by_word() {
    let r = req(vec![Message::User {
        content: Content::Text("hello there world".into()),
    }]);
    let mut sink = Collect(String::new());
    let out = answer(&r, &mut sink);
    assert_eq!(out.text, "Echo: hello there world");
    assert_eq!(sink.0, out.text);
    assert_eq!(out.stop, ModelStop::EndTurn);
    assert!(out.usage.input_tokens > 0 && out.usage.output_tokens > 0);
}

#[test]
fn calls_an_offered_tool_and_reports_its_result() {
    let r = req(vec![Message::User {
        content: Content::Text("/call get_weather {\"city\":\"Tokyo\"}".into()),
    }]);
    let out = answer(&r, &mut NoDeltas);
    assert_eq!(out.stop, ModelStop::ToolUse);
    assert_eq!(out.tool_calls[0].name, "get_weather");
    assert_eq!(out.tool_calls[0].input, json!({"city": "Tokyo"}));
    let id = out.tool_calls[0].id.clone();
    let r2 = req(vec![
        Message::Assistant {
            content: Content::Blocks(vec![Block::ToolUse {
                tool_call_id: id.clone(),
                name: "get_weather".into(),
                input: json!({}),
            }]),
        },
        Message::Tool {
            tool_call_id: id,
            content: Content::Text("18C".into()),
        },
    ]);
    assert_eq!(
        answer(&r2, &mut NoDeltas).text,
        "Tool get_weather returned: 18C"
    );
}

#[test]
fn an_unoffered_tool_is_echoed_not_called() {
    let r = req(vec![Message::User {
        content: Content::Text("/call rm_rf {}".into()),
    }]);
    let out = answer(&r, &mut NoDeltas);
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.text, "Echo: /call rm_rf {}");
}
