use proptest::prelude::*;

use super::*;

fn ok(uri: &str) -> String {
    canonical(uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
}

#[test]
fn the_spellings_of_one_file_have_one_form() {
    for uri in [
        "file:///etc/shadow",
        "file:///srv/../etc/shadow",
        "file:///%65tc/shadow",
        "file://localhost/etc/shadow",
        "file://LocalHost/etc/shadow",
        "file:////etc/shadow",
        "file:/etc/shadow",
        "FILE:///etc/./shadow",
        "file:///etc//shadow",
        "file:///%2e%2e/etc/shadow",
        "file:///a/b/%2E%2E/../etc/x/../shadow",
    ] {
        assert_eq!(ok(uri), "file:///etc/shadow", "{uri}");
    }
}

#[test]
fn each_character_has_one_spelling() {
    assert_eq!(
        ok("file:///my docs/r%c3%a9sum%C3%A9.txt"),
        "file:///my%20docs/résumé.txt"
    );
    assert_eq!(
        ok("file:///my%20docs/résumé.txt"),
        "file:///my%20docs/résumé.txt"
    );
    assert_eq!(ok("file:///a%2Bb%3Bc%7e"), "file:///a+b;c~");
    assert_eq!(ok("file:///100%25"), "file:///100%25");
    assert_eq!(ok("file:///a%7Bb%7D"), ok("file:///a{b}"));
    assert_eq!(ok("file:///dir/"), "file:///dir/");
    assert_eq!(ok("file:///dir/sub/.."), "file:///dir/");
    assert_eq!(ok("file:///.."), "file:///");
}

#[test]
fn other_schemes_keep_their_host_query_and_fragment() {
    assert_eq!(
        ok("HTTPS://Docs.Example.COM/a/./b/../c?q=%7e%2f&x=1#Part%41"),
        "https://docs.example.com/a/c?q=~%2F&x=1#PartA"
    );
    assert_eq!(ok("test://static-text"), "test://static-text");
    assert_eq!(ok("db://t?q=1&limit=2"), "db://t?q=1&limit=2");
    assert_eq!(ok("urn:isbn:0451450523"), "urn:isbn:0451450523");
    assert_eq!(ok("mem:notes"), "mem:notes");
}

#[test]
fn ambiguous_uris_are_refused_saying_why() {
    for (uri, why) in [
        ("file:///etc%2Fshadow", "escaped '/'"),
        ("file:///etc/shadow%3Fx", "escaped '?'"),
        ("file:///etc/shadow%23x", "escaped '#'"),
        ("file:///etc/shadow?x", "query"),
        ("file:///etc/shadow#x", "fragment"),
        ("file://evil/etc/shadow", "another host"),
        ("file:etc/shadow", "absolute path"),
        ("file:///etc\\shadow", "character '\\\\'"),
        ("file:///etc%5Cshadow", "backslash"),
        ("file:///etc/sha%00dow", "'\\0'"),
        ("file:///etc/\u{202e}wodahs", "'\\u{202e}'"),
        ("file:///etc/%E2%80%AEwodahs", "'\\u{202e}'"),
        ("file:///etc/%zz", "two hex digits"),
        ("file:///etc/%ff", "not UTF-8"),
        ("etc/shadow", "no scheme"),
        ("1x:/y", "no scheme"),
    ] {
        let e = canonical(uri).expect_err(uri);
        assert!(e.0.contains(why), "{uri}: {e}");
    }
    let long = format!("file:///{}", "a".repeat(MAX_LEN));
    assert!(canonical(&long).unwrap_err().0.contains("at most 8192"));
}

#[test]
fn templates_keep_their_expressions() {
    assert_eq!(
        canonical_template("FILE:///{+path}").unwrap(),
        "file:///{+path}"
    );
    assert_eq!(
        canonical_template("db://t/{id}{?q,limit}").unwrap(),
        "db://t/{id}{?q,limit}"
    );
}

/// How a naive file server reads a URI: the scheme and a `localhost` host in any case, the
/// path percent-decoded whole and then split (`%2F` a separator), `?` and `#` ending it, `..`
/// and empty segments resolved as a file system does. `None`: not a local file URI.
fn naive_file_server(uri: &str, decode_first: bool) -> Option<String> {
    let (scheme, rest) = uri.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("file") {
        return None;
    }
    let rest = if decode_first {
        String::from_utf8_lossy(&decode(rest).ok()?).into_owned()
    } else {
        rest.to_string()
    };
    let rest = rest.split(['?', '#']).next()?;
    let path = match rest.strip_prefix("//") {
        Some(r) => {
            let end = r.find('/').unwrap_or(r.len());
            let host = &r[..end];
            if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
                return None;
            }
            r[end..].to_string()
        }
        None => rest.to_string(),
    };
    let path = String::from_utf8_lossy(&decode(&path).ok()?).into_owned();
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split(['/', '\\']) {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

fn deny_etc(name: &str) -> bool {
    globset::Glob::new("mcp__evil__file:///etc/*")
        .unwrap()
        .compile_matcher()
        .is_match(name)
}

/// Pieces of a path, many of them spellings of `etc`, `..`, `/` or of nothing.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("etc".to_string()),
        Just("%65tc".to_string()),
        Just("%65%74%63".to_string()),
        Just("ETC".to_string()),
        Just("shadow".to_string()),
        Just("srv".to_string()),
        Just("..".to_string()),
        Just("%2e%2e".to_string()),
        Just(".%2E".to_string()),
        Just(".".to_string()),
        Just("".to_string()),
        Just("%2F".to_string()),
        Just("%5C".to_string()),
        Just("a b".to_string()),
        Just("%20".to_string()),
        Just("caf%C3%A9".to_string()),
        Just("café".to_string()),
        Just("%3F".to_string()),
        Just("?q".to_string()),
        Just("#f".to_string()),
        Just("%".to_string()),
        "[a-z%.+~;]{0,4}",
    ]
}

fn spelling() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![
        Just("file://"),
        Just("FILE://"),
        Just("file://localhost"),
        Just("file://LOCALHOST"),
        Just("file:"),
        Just("file://evil"),
        Just("fIlE:///"),
    ];
    (prefix, prop::collection::vec(segment(), 0..7)).prop_map(|(p, segs)| {
        let mut s = p.to_string();
        for seg in segs {
            s.push('/');
            s.push_str(&seg);
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Whatever a naive server makes of the canonical form, it is the file the policy judged:
    /// any spelling the server resolves under /etc is denied by `file:///etc/*`.
    #[test]
    fn what_the_server_reads_is_what_the_policy_judged(uri in spelling()) {
        if let Ok(c) = canonical(&uri) {
            for decode_first in [false, true] {
                let served = naive_file_server(&c, decode_first);
                // The canonical form names the file the original spelling named.
                if let Some(original) = naive_file_server(&uri, decode_first) {
                    prop_assert_eq!(served.as_deref(), Some(original.as_str()), "{} -> {}", uri, c);
                }
                if let Some(path) = served {
                    if path.starts_with("/etc/") {
                        prop_assert!(deny_etc(&format!("mcp__evil__{c}")), "{} -> {} reads {}", uri, c, path);
                    }
                }
            }
            // Canonical forms are fixed points.
            prop_assert_eq!(canonical(&c), Ok(c.clone()));
        }
    }

    #[test]
    fn any_text_is_canonicalised_or_refused_without_panicking(uri in "\\PC{0,40}") {
        if let Ok(c) = canonical(&uri) {
            prop_assert_eq!(canonical(&c), Ok(c.clone()));
        }
    }
}
