use super::*;

fn headers(len: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert(http::header::CONTENT_LENGTH, len.parse().unwrap());
    h
}

#[test]
fn a_declared_length_over_the_limit_is_413_naming_the_key() {
    let e = check_declared_length(
        &headers("10737418240"),
        4096,
        "[server] max_body_bytes",
        "body_too_large",
    )
    .unwrap_err();
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(e.message.contains("10737418240"), "{}", e.message);
    assert!(e.message.contains("4096"), "{}", e.message);
    assert!(
        e.message.contains("[server] max_body_bytes"),
        "{}",
        e.message
    );
    assert!(check_declared_length(&headers("4096"), 4096, "k", "t").is_ok());
    assert!(check_declared_length(&http::HeaderMap::new(), 1, "k", "t").is_ok());
}

#[tokio::test]
async fn a_body_that_stalls_is_cut_off_and_one_that_trickles_is_not() {
    use futures_util::{stream, StreamExt};
    use http_body_util::StreamBody;
    let stall = Duration::from_millis(300);
    // Trickles a byte every 100 ms: never 300 ms without one.
    let trickle = stream::unfold(0, |i| async move {
        (i < 5).then_some(())?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Some((
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from("x"))),
            i + 1,
        ))
    });
    let body = Patient {
        stall,
        ..patient(StreamBody::new(Box::pin(trickle)))
    };
    assert_eq!(body.collect().await.unwrap().to_bytes(), "xxxxx");
    // One byte, then nothing.
    let stalls = stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(
        "x",
    )))])
    .chain(stream::pending());
    let body = Patient {
        stall,
        ..patient(StreamBody::new(Box::pin(stalls)))
    };
    let started = tokio::time::Instant::now();
    let err = body.collect().await.unwrap_err();
    assert!(err.downcast_ref::<Stalled>().is_some(), "{err}");
    let took = started.elapsed();
    assert!(took >= stall && took < stall * 5, "{took:?}");
}
