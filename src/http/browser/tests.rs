use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn keyless() -> Guard {
    Guard::new(None, "127.0.0.1:8787".parse().unwrap(), false)
}

fn kind(g: &Guard, m: Method, h: &[(&str, &str)], nav: bool) -> Option<&'static str> {
    check_parts(g, &m, &headers(h), nav).err().map(|e| e.kind)
}

#[test]
fn a_keyless_loopback_server_answers_loopback_names_only() {
    let g = keyless();
    for ok in [
        "127.0.0.1:8787",
        "localhost:8787",
        "LOCALHOST",
        "app.localhost:8787",
        "[::1]:8787",
        "127.1.2.3",
        "localhost.",
    ] {
        assert_eq!(kind(&g, Method::GET, &[("host", ok)], false), None, "{ok}");
    }
    for bad in [
        "evil.example:8787",
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "[::2]:8787",
    ] {
        assert_eq!(
            kind(&g, Method::GET, &[("host", bad)], false),
            Some("host_not_allowed"),
            "{bad}"
        );
    }
    let listed = Guard::new(
        Some(&["gw.example.com".to_string()]),
        "127.0.0.1:8787".parse().unwrap(),
        true,
    );
    assert_eq!(
        kind(
            &listed,
            Method::GET,
            &[("host", "GW.example.com:443")],
            false
        ),
        None
    );
    assert_eq!(
        kind(&listed, Method::GET, &[("host", "127.0.0.1")], false),
        None
    );
    assert_eq!(
        kind(&listed, Method::GET, &[("host", "other.example")], false),
        Some("host_not_allowed")
    );
    let keyed = Guard::new(None, "127.0.0.1:8787".parse().unwrap(), true);
    assert_eq!(
        kind(&keyed, Method::GET, &[("host", "gw.example.com")], false),
        None
    );
    let public = Guard::new(None, "0.0.0.0:8787".parse().unwrap(), false);
    assert_eq!(
        kind(&public, Method::GET, &[("host", "gw.example.com")], false),
        None
    );
    let star = Guard::new(
        Some(&["*".to_string()]),
        "127.0.0.1:1".parse().unwrap(),
        false,
    );
    assert_eq!(
        kind(&star, Method::GET, &[("host", "any.example")], false),
        None
    );
}

#[test]
fn requests_from_other_sites_are_refused_but_a_link_to_the_console() {
    let g = keyless();
    let h = ("host", "127.0.0.1:8787");
    for site in ["cross-site", "same-site"] {
        assert_eq!(
            kind(&g, Method::POST, &[h, ("sec-fetch-site", site)], false),
            Some("cross_site_request")
        );
        assert_eq!(
            kind(
                &g,
                Method::GET,
                &[h, ("sec-fetch-site", site), ("sec-fetch-mode", "navigate")],
                true
            ),
            None,
            "a link to the console"
        );
        assert_eq!(
            kind(
                &g,
                Method::GET,
                &[h, ("sec-fetch-site", site), ("sec-fetch-mode", "no-cors")],
                true
            ),
            Some("cross_site_request")
        );
    }
    for site in ["same-origin", "none"] {
        assert_eq!(
            kind(&g, Method::POST, &[h, ("sec-fetch-site", site)], false),
            None
        );
    }
    // A browser without Sec-Fetch-Site: its Origin decides.
    assert_eq!(
        kind(
            &g,
            Method::POST,
            &[h, ("origin", "http://127.0.0.1:8787")],
            false
        ),
        None
    );
    for o in ["http://127.0.0.1:9999", "http://evil.example", "null"] {
        assert_eq!(
            kind(&g, Method::POST, &[h, ("origin", o)], false),
            Some("cross_site_request"),
            "{o}"
        );
    }
    // Not a browser: neither header.
    assert_eq!(kind(&g, Method::POST, &[h], false), None);
}

#[test]
fn a_post_with_a_body_must_be_json() {
    let post = |h: &[(&str, &str)]| json_body(&Method::POST, &headers(h)).err().map(|e| e.kind);
    assert_eq!(post(&[("content-type", "application/json")]), None);
    assert_eq!(
        post(&[("content-type", "Application/JSON; charset=utf-8")]),
        None
    );
    assert_eq!(
        post(&[("content-type", "application/merge-patch+json")]),
        None
    );
    assert_eq!(post(&[]), None, "no body");
    assert_eq!(post(&[("content-length", "0")]), None);
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        assert_eq!(
            post(&[("content-type", ct), ("content-length", "2")]),
            Some("unsupported_media_type"),
            "{ct}"
        );
    }
    assert_eq!(
        post(&[("content-length", "2")]),
        Some("unsupported_media_type")
    );
    assert_eq!(
        post(&[("transfer-encoding", "chunked")]),
        Some("unsupported_media_type")
    );
    assert!(json_body(&Method::GET, &headers(&[("content-type", "text/plain")])).is_ok());
}
