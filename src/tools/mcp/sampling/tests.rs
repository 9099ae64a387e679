use super::*;
use serde_json::json;

/// A router over the built-in echo provider (the config of a file with no upstream).
fn echo_router() -> Arc<Router> {
    let config = crate::config::load_str(
        std::path::Path::new("tools.toml"),
        "",
        &crate::config::Env::default(),
    )
    .unwrap();
    let echo = Arc::new(crate::upstream::echo::Echo);
    Arc::new(Router::new(vec![crate::upstream::router::Upstream::new(
        &config.upstreams[0],
        echo,
    )]))
}

fn budget() -> Budget {
    Budget {
        server: "s".into(),
        max_tokens: 100,
        calls_per_turn: 2,
    }
}

fn params(v: serde_json::Value) -> CreateMessageRequestParams {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_request_maps_to_one_call_with_no_tools_and_max_tokens_capped() {
    let p = params(json!({
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "hi"}},
            {"role": "assistant", "content": {"type": "text", "text": "hello"}},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"}
            ]}
        ],
        "systemPrompt": "be brief", "maxTokens": 5000, "temperature": 0.2,
        "stopSequences": ["x"]
    }));
    let req = to_request(&p, "m", &budget()).unwrap();
    assert_eq!(req.model, "m");
    assert_eq!(req.system.as_deref(), Some("be brief"));
    assert_eq!(req.max_tokens, Some(100));
    assert!(req.tools.is_empty());
    assert_eq!(
        req.tuning,
        Tuning {
            temperature: Some(0.2),
            stop: vec!["x".into()]
        }
    );
    assert_eq!(
        req.messages,
        vec![
            Message::User {
                content: Content::Text("hi".into())
            },
            Message::Assistant {
                content: Content::Text("hello".into())
            },
            Message::User {
                content: Content::Blocks(vec![
                    Block::Text {
                        text: "look".into()
                    },
                    Block::Image {
                        url: "data:image/png;base64,AAAA".into()
                    }
                ])
            },
        ]
    );
    let small = params(
        json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 7}),
    );
    assert_eq!(
        to_request(&small, "m", &budget()).unwrap().max_tokens,
        Some(7)
    );
}

#[test]
fn audio_and_empty_requests_are_refused() {
    let audio = params(
        json!({"messages": [{"role": "user", "content": {"type": "audio", "data": "AA", "mimeType": "audio/wav"}}], "maxTokens": 7}),
    );
    assert!(to_request(&audio, "m", &budget())
        .unwrap_err()
        .contains("messages[0] holds audio"));
    let empty = params(json!({"messages": [], "maxTokens": 7}));
    assert!(to_request(&empty, "m", &budget()).is_err());
}

#[test]
fn the_result_is_the_assistants_text_with_the_model_and_stop_reason() {
    let out = ModelOutput {
        thinking: String::new(),
        signed_thinking: vec![],
        text: "done".into(),
        tool_calls: vec![],
        usage: Usage::default(),
        stop: ModelStop::MaxTokens,
    };
    let v = serde_json::to_value(to_result(out, "m")).unwrap();
    assert_eq!(
        v,
        json!({"role": "assistant", "content": {"type": "text", "text": "done"}, "model": "m", "stopReason": "maxTokens"})
    );
}

#[test]
fn the_budget_counts_calls_per_server_and_names_the_key() {
    let s = UpstreamSampler::new(echo_router(), Vec::new(), "m".into());
    let b = budget();
    assert!(s.reserve(&b).is_ok() && s.reserve(&b).is_ok());
    let why = s.reserve(&b).unwrap_err();
    assert_eq!(why, "sampling refused: this turn already made 2 sampling calls for s (limit: [mcp_servers.s] sampling_calls_per_turn in tools.toml)");
    let other = Budget {
        server: "t".into(),
        ..budget()
    };
    assert!(s.reserve(&other).is_ok());
    assert_eq!(s.tally().refused, 1);
}
