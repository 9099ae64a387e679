use super::*;

fn ends(message: &str) -> Outline {
    let b = message.as_bytes();
    let head = &b[..b.len().min(GLIMPSE)];
    let tail = &b[b.len().saturating_sub(GLIMPSE)..];
    outline(head, tail)
}

fn big(prefix: &str, suffix: &str) -> String {
    format!("{prefix}{}{suffix}", "x".repeat(4 * GLIMPSE))
}

#[test]
fn the_id_first_as_python_writes_it() {
    let m = big(
        r#"{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": ""#,
        r#""}]}}"#,
    );
    let o = ends(&m);
    assert_eq!(o.answered(), Some(&json!(7)), "{o:?}");
}

#[test]
fn the_id_last_as_typescript_writes_it() {
    let m = big(
        r#"{"result":{"content":[{"type":"text","text":""#,
        r#""}]},"jsonrpc":"2.0","id":"req-\"9\""}"#,
    );
    let o = ends(&m);
    assert_eq!(o.answered(), Some(&json!("req-\"9\"")), "{o:?}");
    let m = big(
        r#"{"result":{"t":""#,
        r#""}, "id" : 12 , "jsonrpc" : "2.0" }"#,
    );
    assert_eq!(ends(&m).answered(), Some(&json!(12)));
}

#[test]
fn requests_and_notifications_answer_nothing() {
    let request = big(
        r#"{"jsonrpc":"2.0","id":0,"method":"sampling/createMessage","params":{"x":""#,
        r#""}}"#,
    );
    let o = ends(&request);
    assert_eq!(
        (o.id.clone(), o.method, o.answered()),
        (Some(json!(0)), true, None)
    );
    let request = big(r#"{"method":"roots/list","params":{"x":""#, r#""},"id":3}"#);
    assert_eq!(ends(&request).answered(), None);
    let note = big(
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"d":""#,
        r#""}}"#,
    );
    let o = ends(&note);
    assert_eq!((o.id, o.method), (None, true));
}

#[test]
fn a_cut_or_an_inner_id_is_not_taken_for_the_id() {
    // The id inside the result is not a top-level member, read from either end.
    let m = big(r#"{"result":{"id":5,"t":""#, r#""}}"#);
    assert_eq!(ends(&m).id, None);
    let m = big(r#"{"result":{"t":""#, r#"","id":5}}"#);
    assert_eq!(ends(&m).id, None);
    // Kept ends that cut a number or a string in two.
    assert_eq!(outline(br#"{"id":12"#, b"").id, None);
    assert_eq!(outline(b"", br#"345,"result":1}"#).id, None);
    assert_eq!(outline(b"", br#"d":3}"#).id, None);
    // A kept tail that begins right at a key's quote cannot tell it is one.
    assert_eq!(outline(b"", br#""id":5}"#).id, None);
    assert_eq!(outline(b"", br#","id":5}"#).id, Some(json!(5)));
    // Not JSON at all, or nothing.
    assert_eq!(outline(b"\xff\xfe{{", b"}}\"\\\"").id, None);
    assert_eq!(outline(b"", b""), Outline::default());
    assert_eq!(outline(b"{", b"}"), Outline::default());
    // An id that is neither a number nor a string is no id.
    assert_eq!(outline(br#"{"id":null,"result":{"#, b"").answered(), None);
}

#[test]
fn sizes_and_the_error_line() {
    assert_eq!(mib(16 << 20), "16 MiB");
    assert_eq!(mib(23_400_000), "22.3 MiB");
    assert_eq!(mib((23 << 20) + (4 << 20) / 10), "23.4 MiB");
    let line = error_line(&json!(4), "MCP server big", Some(24_536_678));
    assert_eq!(line.last(), Some(&b'\n'));
    let v: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v["id"], 4);
    assert_eq!(v["error"]["data"]["reason"], REASON);
    assert_eq!(
        v["error"]["message"],
        "the answer of MCP server big was 23.4 MiB, over the 16 MiB an MCP message may have"
    );
}
