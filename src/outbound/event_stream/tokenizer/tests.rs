use super::*;

/// What the tokenizer hands out, owned: whole lines as `W`, pieces as `P` (`last` marked `$`).
fn lines(chunks: &[&[u8]], limit: usize) -> Vec<String> {
    let mut t = Tokenizer::new();
    let mut out = Vec::new();
    for c in chunks {
        t.feed(c);
        while let Some(line) = t.next_line(limit) {
            out.push(match line {
                Line::Whole(b) => format!("W{}", String::from_utf8_lossy(b)),
                Line::Piece { bytes, last } => format!(
                    "P{}{}",
                    String::from_utf8_lossy(bytes),
                    if last { "$" } else { "" }
                ),
            });
        }
    }
    out
}

fn whole(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| format!("W{s}")).collect()
}

#[test]
fn cr_at_a_chunk_end_and_lf_in_the_next_are_one_line_end() {
    assert_eq!(lines(&[b"a\r", b"\nb\n"], 100), whole(&["a", "b"]));
    // Nothing fed after the CR yet: the line is out, the LF still to be skipped.
    assert_eq!(
        lines(&[b"a\r", b"", b"\n", b"\nb\r"], 100),
        whole(&["a", "", "b"])
    );
    // A CR followed by another line's text.
    assert_eq!(lines(&[b"a\r", b"b\r\n"], 100), whole(&["a", "b"]));
    assert_eq!(lines(&[b"a\r\r\n\n"], 100), whole(&["a", "", ""]));
}

#[test]
fn a_bom_split_across_chunks_is_skipped_once() {
    let bom = b"\xEF\xBB\xBF";
    for i in 0..=3 {
        let got = lines(&[&bom[..i], &bom[i..], b"x\n", bom, b"y\n"], 100);
        assert_eq!(
            got,
            ["Wx".to_string(), "W\u{feff}y".to_string()],
            "split at {i}"
        );
    }
    // The start of a BOM that is not one stays part of the line (one U+FFFD when shown).
    assert_eq!(lines(&[b"\xEF", b"\xBBz\n"], 100), ["W\u{FFFD}z"]);
    // A stream that is only part of a BOM holds nothing back once it ends otherwise.
    assert_eq!(lines(&[b"\xEF\xBB", b"\n"], 100), ["W\u{FFFD}"]);
}

#[test]
fn a_line_over_the_limit_comes_in_pieces_never_buffered() {
    let mut t = Tokenizer::new();
    t.feed(b"data: ");
    assert_eq!(t.next_line(8), None);
    t.feed(b"0123");
    assert_eq!(
        t.next_line(8),
        Some(Line::Piece {
            bytes: b"data: 0123",
            last: false
        })
    );
    assert_eq!(t.next_line(8), None);
    assert_eq!(t.buffered(), 0);
    t.feed(b"45");
    assert_eq!(
        t.next_line(8),
        Some(Line::Piece {
            bytes: b"45",
            last: false
        })
    );
    t.feed(b"6\r");
    assert_eq!(
        t.next_line(8),
        Some(Line::Piece {
            bytes: b"6",
            last: true
        })
    );
    t.feed(b"\nok\n");
    assert_eq!(t.next_line(8), Some(Line::Whole(b"ok")));
    assert_eq!(t.next_line(8), None);
    // Over the limit in one chunk, line end included; exactly the limit is whole.
    assert_eq!(
        lines(&[b"123456789\n12345678\n"], 8),
        ["P123456789$", "W12345678"]
    );
    // The line end right after a piece closes it with an empty last piece.
    assert_eq!(lines(&[b"123456789", b"\n"], 8), ["P123456789", "P$"]);
    // A limit of 0: every non-empty line in pieces, blank lines whole.
    assert_eq!(lines(&[b"ab", b"c\n\n"], 0), ["Pab", "Pc$", "W"]);
}

#[test]
fn every_split_gives_the_same_lines() {
    let input = b"\xEF\xBB\xBFdata: a\r\n\r: c\rid\n\ndata:b\r";
    let expected = lines(&[input], 100);
    assert_eq!(expected, whole(&["data: a", "", ": c", "id", "", "data:b"]));
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let got = lines(&[&input[..i], &input[i..j], &input[j..]], 100);
            assert_eq!(got, expected, "split at {i} and {j}");
        }
    }
}

#[test]
fn fields_split_at_the_first_colon_and_one_space() {
    assert_eq!(field(b""), Field::Blank);
    assert_eq!(field(b": ping"), Field::Comment(b" ping"));
    assert_eq!(field(b":"), Field::Comment(b""));
    let value = |name: &'static [u8], value: &'static [u8]| Field::Value { name, value };
    assert_eq!(field(b"data: a: b"), value(b"data", b"a: b"));
    assert_eq!(field(b"data:  two"), value(b"data", b" two"));
    assert_eq!(field(b"data:x"), value(b"data", b"x"));
    assert_eq!(field(b"data:"), value(b"data", b""));
    assert_eq!(field(b"data"), value(b"data", b""));
    assert_eq!(field(b" data: x"), value(b" data", b"x"));
}
