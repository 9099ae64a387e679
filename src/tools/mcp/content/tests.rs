use super::*;

fn result(v: Value) -> CallToolResult {
    serde_json::from_value(v).unwrap()
}

#[test]
fn one_text_is_a_string_and_is_error_is_kept() {
    let out = to_output(result(
        json!({"content": [{"type": "text", "text": "5"}], "isError": true}),
    ));
    assert_eq!(out.content, json!("5"));
    assert!(out.is_error);
}

#[test]
fn images_resources_and_structured_content_become_blocks() {
    let out = to_output(result(json!({
        "content": [
            {"type": "image", "data": "iVBOR", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}}
        ],
        "structuredContent": {"sum": 5}
    })));
    assert_eq!(
        out.content,
        json!([
            {"type": "image", "url": "data:image/png;base64,iVBOR"},
            {"type": "text", "text": "hello"},
            {"type": "text", "text": "{\"sum\":5}"}
        ])
    );
    assert!(!out.is_error);
}

#[test]
fn structured_content_reaches_the_model_once() {
    // A plain value wrapped as {"result": ...} beside its text.
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "flooded 96 MiB"}],
        "structuredContent": {"result": "flooded 96 MiB"}
    })));
    assert_eq!(out.content, json!("flooded 96 MiB"));
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "42"}],
        "structuredContent": {"result": 42}
    })));
    assert_eq!(out.content, json!("42"));
    // A serialization split over two text blocks.
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "{\"a\": 1,"}, {"type": "text", "text": " \"b\": 2}"}],
        "structuredContent": {"a": 1, "b": 2}
    })));
    assert_eq!(
        out.content,
        json!([{"type": "text", "text": "{\"a\": 1,"}, {"type": "text", "text": " \"b\": 2}"}])
    );
    // Text that says something else: the structured form goes too.
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "done"}],
        "structuredContent": {"sum": 5}
    })));
    assert_eq!(
        out.content,
        json!([{"type": "text", "text": "done"}, {"type": "text", "text": "{\"sum\":5}"}])
    );
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "other"}],
        "structuredContent": {"result": "flooded"}
    })));
    assert_eq!(out.content.as_array().map(Vec::len), Some(2));
}

#[test]
fn structured_content_mirrored_in_text_is_not_repeated() {
    let out = to_output(result(json!({
        "content": [{"type": "text", "text": "{\"sum\": 5}"}],
        "structuredContent": {"sum": 5}
    })));
    assert_eq!(out.content, json!("{\"sum\": 5}"));
}
