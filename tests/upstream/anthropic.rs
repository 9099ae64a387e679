//! Turns against the Anthropic Messages API (a fake that speaks its real streaming format).

use crate::common::{logcheck::check_log, names, TestServer};
use serde_json::json;
use turnstile::testkit::fake_anthropic::{FakeAnthropic, Reply};

#[tokio::test]
async fn turns_and_a_client_tool_round_trip_through_anthropic() {
    let fake = FakeAnthropic::start().await;
    let config = format!(
        "[upstream]\nprovider = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude-test\"\napi_key_env = \"TURNSTILE_TEST_ANTHROPIC_KEY\"\nretries = 0\n\n[agents.assistant]\nsystem_prompt = \"Be brief.\"\n",
        fake.base_url()
    );
    let server =
        TestServer::start_with_env(&config, &[("TURNSTILE_TEST_ANTHROPIC_KEY", "sk-ant-test")])
            .await;
    let sid = server
        .session(json!({"tools": [{"name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}))
        .await;
    fake.push(
        Reply::tool_calls(&[("toolu_01", "get_weather", json!({"city": "Paris"}))])
            .with_text("Checking."),
    );
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "delta", "messages": [{"role": "user", "content": "Paris?"}]}),
        )
        .await;
    let n = names(&events);
    assert_eq!(n.first(), Some(&"turn_start"));
    assert!(
        n.contains(&"text_delta") && n.contains(&"tool_call"),
        "{n:?}"
    );
    assert_eq!(
        events.last().unwrap().data,
        json!({"stopReason": "tool_use"})
    );

    fake.push(Reply::text("Paris is 21C."));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "tool", "toolCallId": "toolu_01", "content": "21C"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["messages"][0]["content"], "Paris is 21C.");

    let reqs = fake.requests();
    assert_eq!(reqs[0]["model"], "claude-test");
    assert_eq!(reqs[0]["system"][0]["text"], "Be brief.");
    assert_eq!(reqs[0]["tools"][0]["name"], "get_weather");
    let last = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"][0]["type"], "tool_result");
    assert_eq!(last["content"][0]["tool_use_id"], "toolu_01");
    let headers = fake.request_headers();
    assert_eq!(headers[0]["x-api-key"], "sk-ant-test");
    assert_eq!(headers[0]["anthropic-version"], "2023-06-01");
    check_log(server.engine().store(), &sid).await;
}
