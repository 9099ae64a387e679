use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

/// What rmcp's reader would get from `input` written in chunks of `chunk` bytes.
async fn lines(input: Vec<u8>, chunk: usize) -> Vec<Vec<u8>> {
    let (mut w, r) = tokio::io::duplex(64 * 1024);
    let writer = tokio::spawn(async move {
        for c in input.chunks(chunk) {
            w.write_all(c).await.unwrap();
        }
    });
    let mut reader = BufReader::new(LineLimit::new(r, "big"));
    let mut out = Vec::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).await.unwrap() == 0 {
            break;
        }
        out.push(line);
    }
    writer.await.unwrap();
    out
}

fn response(id: Value, text_len: usize, id_last: bool) -> Vec<u8> {
    let text = "y".repeat(text_len);
    let s = if id_last {
        format!(
            r#"{{"result":{{"content":[{{"type":"text","text":"{text}"}}]}},"jsonrpc":"2.0","id":{id}}}"#
        )
    } else {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
        )
    };
    let mut b = s.into_bytes();
    b.push(b'\n');
    b
}

#[tokio::test]
async fn lines_within_the_limit_pass_unchanged() {
    let mut input = Vec::new();
    for i in 0..50 {
        input.extend(response(json!(i), i * 997, i % 2 == 0));
    }
    for chunk in [1, 7, 8192] {
        let got: Vec<u8> = lines(input.clone(), chunk).await.concat();
        assert!(got == input, "chunk {chunk}");
    }
    // One line of exactly the limit, its newline included.
    let pad = MAX_MESSAGE - response(json!(99), 0, false).len();
    input.extend(response(json!(99), pad, false));
    assert_eq!(
        input.iter().rev().skip(1).position(|b| *b == b'\n'),
        Some(MAX_MESSAGE - 1)
    );
    for chunk in [8192, 100_000] {
        let got: Vec<u8> = lines(input.clone(), chunk).await.concat();
        assert!(got == input, "chunk {chunk}");
    }
}

#[tokio::test]
async fn a_response_over_the_limit_becomes_its_error() {
    for id_last in [false, true] {
        let big = response(json!(41), MAX_MESSAGE, id_last);
        let size = big.len() as u64;
        let mut input = response(json!(40), 10, id_last);
        input.extend(big);
        input.extend(response(json!(42), 10, id_last));
        for chunk in [8192, 65_536 + 3] {
            let got = lines(input.clone(), chunk).await;
            assert_eq!(got.len(), 4, "id_last {id_last} chunk {chunk}");
            assert_eq!(got[0], response(json!(40), 10, id_last));
            // The cut: no more than rmcp takes, and no JSON.
            assert!(got[1].len() <= MAX_MESSAGE && got[1].ends_with(b"\n"));
            assert!(serde_json::from_slice::<Value>(&got[1]).is_err());
            let answer: Value = serde_json::from_slice(&got[2]).unwrap();
            assert_eq!(answer["id"], 41);
            assert_eq!(answer["error"]["data"]["size_bytes"], size);
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("the answer of MCP server big was 16"),
                "{message}"
            );
            assert_eq!(got[3], response(json!(42), 10, id_last));
        }
    }
}

#[tokio::test]
async fn a_notification_over_the_limit_is_dropped() {
    let text = "z".repeat(MAX_MESSAGE);
    let note = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{text}"}}}}"#
    );
    let mut input = note.into_bytes();
    input.push(b'\n');
    input.extend(response(json!(1), 5, false));
    let got = lines(input, 8192).await;
    assert_eq!(got.len(), 2);
    assert!(serde_json::from_slice::<Value>(&got[0]).is_err());
    assert_eq!(got[1], response(json!(1), 5, false));
}

#[tokio::test]
async fn an_output_that_ends_inside_a_long_line() {
    let got = lines(vec![b'a'; MAX_MESSAGE + 10], 8192).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), MAX_MESSAGE);
}
