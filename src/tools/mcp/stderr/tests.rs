use super::*;

fn split(max: usize, chunks: &[&[u8]]) -> Vec<Line> {
    let mut s = LineSplitter::new(max);
    let mut out = Vec::new();
    for c in chunks {
        s.push(c, &mut |l| out.push(l));
        assert!(
            s.buf.len() <= max,
            "the splitter held {} bytes",
            s.buf.len()
        );
    }
    out.extend(s.finish());
    out
}

fn line(text: &str, cut: bool) -> Line {
    Line {
        text: text.into(),
        cut,
    }
}

#[test]
fn lines_across_chunks() {
    assert_eq!(
        split(16, &[b"ab", b"c\nde", b"f\r\n\n", b"tail"]),
        [
            line("abc", false),
            line("def", false),
            line("", false),
            line("tail", false)
        ]
    );
    assert_eq!(split(16, &[b""]), []);
}

#[test]
fn a_long_line_is_cut_and_the_rest_discarded_up_to_the_newline() {
    assert_eq!(
        split(4, &[b"abcdefgh", b"ijk\nxy\n"]),
        [line("abcd", true), line("xy", false)]
    );
    // Cut inside one chunk with the newline in it.
    assert_eq!(
        split(4, &[b"abcdef\nok\n"]),
        [line("abcd", true), line("ok", false)]
    );
    // Exactly the limit with its newline is whole.
    assert_eq!(split(4, &[b"abcd\n"]), [line("abcd", false)]);
    // A megabyte without a newline: one cut line, nothing held.
    let big = vec![b'x'; 1 << 20];
    let out = split(8, &[&big, &big, b"\nend"]);
    assert_eq!(out, [line("xxxxxxxx", true), line("end", false)]);
}

#[test]
fn not_utf8_is_lossy_and_the_next_line_still_comes() {
    assert_eq!(
        split(64, &[b"bad \xff\xfe line\n", b"good\n"]),
        [
            line("bad \u{fffd}\u{fffd} line", false),
            line("good", false)
        ]
    );
}

#[test]
fn the_bucket_allows_a_burst_then_the_rate() {
    let t0 = Instant::now();
    let mut b = Bucket::new(10.0, 3.0, t0);
    assert!((0..3).all(|_| b.allow(t0)));
    assert!(!b.allow(t0));
    assert!(b.allow(t0 + Duration::from_millis(100)));
    assert!(!b.allow(t0 + Duration::from_millis(150)));
    // Never more than the burst saved.
    let later = t0 + Duration::from_secs(60);
    assert_eq!((0..10).filter(|_| b.allow(later)).count(), 3);
}

#[test]
fn lines_past_the_burst_and_cut_lines_are_counted() {
    let mut log = StderrLog::new("x".into());
    for _ in 0..BURST as usize + 50 {
        log.line(line("l", false));
    }
    log.line(line("long", true));
    // The bucket refills at 20 lines/s: in this loop's few microseconds, by none.
    assert!(log.dropped.limited >= 49, "{:?}", log.dropped);
    assert_eq!(log.dropped.cut, 1);
    log.report(true);
    assert_eq!(log.dropped, Dropped::default());
}

#[test]
fn control_characters_are_escaped() {
    assert_eq!(printable("a\tb"), "a\tb");
    assert_eq!(printable("\u{1b}[31mred"), "\\u{1b}[31mred");
}
