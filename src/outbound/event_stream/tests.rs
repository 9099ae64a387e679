use super::*;

fn ev(event: Option<&str>, data: &str) -> SseEvent {
    SseEvent {
        event: event.map(str::to_string),
        data: data.to_string(),
    }
}

/// Feeds `chunks` in order, draining after each, then finishes.
fn parse_chunks(chunks: &[&[u8]], max: usize) -> Result<Vec<SseEvent>, SseError> {
    let mut p = SseParser::with_limit(max);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c);
        while let Some(e) = p.next_event()? {
            out.push(e);
        }
    }
    if let Some(e) = p.finish()? {
        out.push(e);
    }
    Ok(out)
}

fn parse(input: &[u8]) -> Vec<SseEvent> {
    parse_chunks(&[input], DEFAULT_MAX_EVENT_BYTES).unwrap()
}

/// Every split into two and three chunks, and byte by byte, gives the same events.
fn assert_split_invariant(input: &[u8], expected: &[SseEvent]) {
    assert_eq!(parse(input), expected, "whole input");
    for i in 0..=input.len() {
        let got = parse_chunks(&[&input[..i], &input[i..]], DEFAULT_MAX_EVENT_BYTES).unwrap();
        assert_eq!(got, expected, "split at {i}");
        for j in i..=input.len() {
            let got = parse_chunks(
                &[&input[..i], &input[i..j], &input[j..]],
                DEFAULT_MAX_EVENT_BYTES,
            )
            .unwrap();
            assert_eq!(got, expected, "split at {i} and {j}");
        }
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(
        parse_chunks(&bytes, DEFAULT_MAX_EVENT_BYTES).unwrap(),
        expected,
        "byte by byte"
    );
}

#[test]
fn openai_style_stream_splits_at_every_byte() {
    let input =
        "data: {\"a\":\"héllo 世界\"}\n\n: keep-alive\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
    assert_split_invariant(
        input.as_bytes(),
        &[
            ev(None, "{\"a\":\"héllo 世界\"}"),
            ev(None, "{\"b\":2}"),
            ev(None, "[DONE]"),
        ],
    );
}

#[test]
fn crlf_and_cr_line_endings_split_at_every_byte() {
    let input = b"event: ping\r\ndata: 1\r\n\r\ndata: 2\r\rdata:3\n\r\ndata: x\r\ndata: y\r\r";
    assert_split_invariant(
        input,
        &[
            ev(Some("ping"), "1"),
            ev(None, "2"),
            ev(None, "3"),
            ev(None, "x\ny"),
        ],
    );
}

#[test]
fn anthropic_style_named_events_and_fields() {
    let input = b"\xEF\xBB\xBFevent: message_start\ndata: {\"t\":1}\nid: 7\nretry: 100\nbogus\n\nevent: ping\n\nevent: delta\ndata:  two spaces\ndata\n\n";
    assert_split_invariant(
        input,
        &[
            ev(Some("message_start"), "{\"t\":1}"),
            // `event: ping` had no data: not dispatched, and its name does not leak.
            ev(Some("delta"), " two spaces\n"),
        ],
    );
}

#[test]
fn empty_data_line_dispatches_an_empty_event() {
    assert_eq!(parse(b"data:\n\n"), vec![ev(None, "")]);
    assert_eq!(parse(b"data\n\n"), vec![ev(None, "")]);
    assert_eq!(parse(b"\n\n\n: c\n\n"), vec![]);
}

#[test]
fn finish_dispatches_an_unterminated_last_event() {
    assert_split_invariant(
        b"data: a\n\ndata: [DONE]",
        &[ev(None, "a"), ev(None, "[DONE]")],
    );
    assert_split_invariant(
        b"data: a\n\ndata: [DONE]\n",
        &[ev(None, "a"), ev(None, "[DONE]")],
    );
    assert_split_invariant(b"data: a\r", &[ev(None, "a")]);
    assert_eq!(parse(b""), vec![]);
}

#[test]
fn bom_only_at_the_start() {
    assert_eq!(parse(b"\xEF\xBB\xBFdata: a\n\n"), vec![ev(None, "a")]);
    // A BOM later is part of the line: the field name `\u{feff}data` is unknown.
    assert_eq!(
        parse(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"),
        vec![ev(None, "a")]
    );
    // A stream that starts like a BOM but is not one.
    assert_eq!(
        parse_chunks(&[b"\xEF", b"x\n\ndata: z\n\n"], 100).unwrap(),
        vec![ev(None, "z")]
    );
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    assert_eq!(parse(b"data: a\xFFb\n\n"), vec![ev(None, "a\u{FFFD}b")]);
}

#[test]
fn a_long_line_is_an_error_even_unterminated() {
    let long = [b'x'; 64];
    let mut p = SseParser::with_limit(32);
    p.feed(b"data: ");
    assert_eq!(p.next_event(), Ok(None));
    for c in long.chunks(8) {
        p.feed(c);
        if let Err(e) = p.next_event() {
            assert_eq!(e, SseError::LineTooLong { limit: 32 });
            return;
        }
    }
    panic!("no error for a 70-byte line with a 32-byte limit");
}

#[test]
fn a_long_line_in_one_chunk_is_an_error() {
    let mut input = b"data: ".to_vec();
    input.extend(std::iter::repeat_n(b'x', 40));
    input.extend_from_slice(b"\n\n");
    assert_eq!(
        parse_chunks(&[&input], 32),
        Err(SseError::LineTooLong { limit: 32 })
    );
}

#[test]
fn many_short_data_lines_are_capped_per_event() {
    let input = b"data: 0123456789\n".repeat(4);
    assert_eq!(
        parse_chunks(&[&input], 32),
        Err(SseError::EventTooLarge { limit: 32 })
    );
    // The same lines in separate events are fine.
    let ok = b"data: 0123456789\n\n".repeat(4);
    assert_eq!(parse_chunks(&[&ok], 32).unwrap().len(), 4);
}

#[test]
fn buffer_is_compacted_between_chunks() {
    let mut p = SseParser::new();
    for _ in 0..1000 {
        p.feed(b"data: {\"x\":1}\n\n");
        assert_eq!(p.next_event().unwrap(), Some(ev(None, "{\"x\":1}")));
        assert_eq!(p.next_event().unwrap(), None);
    }
    assert_eq!(p.lines.buffered(), 0);
}
