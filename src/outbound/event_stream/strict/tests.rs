use super::*;

/// Feeds `chunks`, taking the items out after each; an error ends the list.
fn parse(chunks: &[&[u8]], max: usize) -> Result<Vec<StrictItem>, Utf8Error> {
    let mut p = StrictParser::new(max, 8);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c);
        while let Some(item) = p.next_item()? {
            out.push(item);
        }
    }
    Ok(out)
}

fn event(data: Option<&str>, id: Option<&str>) -> StrictItem {
    StrictItem::Event(StrictEvent {
        data: data.map(Into::into),
        id: id.map(Into::into),
        ..StrictEvent::default()
    })
}

#[test]
fn every_field_and_id_only_events() {
    let input = b"id: 1\n\nretry: 20\nretry: x\nevent: e\n\ndata: a\ndata\nid: 2\x00\n\n: only\n\n";
    let all = parse(&[input], 1024).unwrap();
    assert_eq!(
        all,
        [
            event(None, Some("1")),
            StrictItem::Event(StrictEvent {
                event: Some("e".into()),
                retry: Some(20),
                ..StrictEvent::default()
            }),
            // An id holding NUL is ignored.
            event(Some("a\n"), None),
        ]
    );
    for i in 0..=input.len() {
        assert_eq!(
            parse(&[&input[..i], &input[i..]], 1024).unwrap(),
            all,
            "{i}"
        );
    }
    // Cut off by the end of the body: not emitted.
    assert_eq!(parse(&[b"data: a\n"], 1024).unwrap(), []);
}

#[test]
fn invalid_utf8_is_an_error() {
    assert!(parse(&[b"data: \xFF\n\n"], 1024).is_err());
    assert!(parse(&[b"retry: \xFF\n\n"], 1024).is_err());
    // Not in a comment or an unknown field.
    assert_eq!(parse(&[b": \xFF\nx: \xFF\n\n"], 1024).unwrap(), []);
}

#[test]
fn an_event_over_the_limit_is_read_past_keeping_its_ends() {
    let input = b"id: 7\ndata: 0123456789\ndata\nda\rdata: abcdefghij\r\n\r\ndata: next\n\n";
    let expected = [
        StrictItem::Oversize(Oversize {
            size: 6 + 17 + 5 + 3 + 17,
            head: b"01234567".to_vec(),
            tail: b"cdefghij".to_vec(),
            id: Some("7".into()),
        }),
        event(Some("next"), None),
    ];
    for chunk in [1, 2, 5, input.len()] {
        let chunks: Vec<&[u8]> = input.chunks(chunk).collect();
        assert_eq!(parse(&chunks, 20).unwrap(), expected, "chunks of {chunk}");
    }
    // The data lines of the kept ends are joined with newlines.
    let got = parse(&[b"data: ab\ndata: cd\ndata: efghijklmnop\n\n"], 16).unwrap();
    let StrictItem::Oversize(o) = &got[0] else {
        panic!("{got:?}")
    };
    assert_eq!(
        (&o.head[..], &o.tail[..]),
        (&b"ab\ncd\nef"[..], &b"ijklmnop"[..])
    );
}

#[test]
fn the_limit_counts_line_ends_but_not_comments() {
    // `data: 12345\n` is 12 bytes: within 12.
    assert_eq!(parse(&[b"data: 12345\n\n"], 12).unwrap().len(), 1);
    assert!(matches!(
        parse(&[b"data: 123456\n\n"], 12).unwrap()[..],
        [StrictItem::Oversize(_)]
    ));
    assert_eq!(
        parse(&[b": 0123456789\ndata: 1\n\n"], 12).unwrap(),
        [event(Some("1"), None)]
    );
}
