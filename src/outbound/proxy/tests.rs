use super::*;

fn proxies(vars: &[(&str, &str)]) -> Proxies {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Proxies::from_lookup(&move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
}

fn via(p: &Proxies, url: &str) -> Option<String> {
    p.for_uri(&url.parse().unwrap())
        .map(|p| p.authority().to_string())
}

#[test]
fn proxies_follow_the_scheme_and_no_proxy() {
    let p = proxies(&[
        ("HTTPS_PROXY", "http://secure:3128"),
        ("http_proxy", "plain:8080"),
        ("HTTP_PROXY", "http://ignored:1"),
        (
            "NO_PROXY",
            "internal.example, .corp, 10.0.0.0/8, ::1, 192.168.1.5",
        ),
    ]);
    assert_eq!(
        via(&p, "https://api.openai.com/v1").as_deref(),
        Some("secure:3128")
    );
    assert_eq!(
        via(&p, "http://127.0.0.1:11434/v1").as_deref(),
        Some("plain:8080")
    );
    assert_eq!(via(&p, "https://internal.example/x"), None);
    assert_eq!(via(&p, "https://a.internal.example/x"), None);
    assert_eq!(
        via(&p, "https://notinternal.example/x").as_deref(),
        Some("secure:3128")
    );
    assert_eq!(via(&p, "https://x.corp/"), None);
    assert_eq!(via(&p, "http://10.1.2.3/"), None);
    assert_eq!(via(&p, "http://11.1.2.3/").as_deref(), Some("plain:8080"));
    assert_eq!(via(&p, "http://[::1]:8080/"), None);
    assert_eq!(via(&p, "http://192.168.1.5/"), None);
    assert_eq!(
        via(
            &proxies(&[("no_proxy", "*"), ("ALL_PROXY", "p:1")]),
            "https://a/"
        ),
        None
    );
    assert_eq!(
        via(&proxies(&[("ALL_PROXY", "p:1")]), "https://a/").as_deref(),
        Some("p:1")
    );
    assert_eq!(via(&proxies(&[]), "https://a/"), None);
    // Only http:// proxies are spoken to.
    assert_eq!(
        via(&proxies(&[("HTTPS_PROXY", "socks5://s:1")]), "https://a/"),
        None
    );
}

#[test]
fn proxy_credentials_become_basic_auth() {
    let p = Proxy::parse("http://us%40er:p%3Ass@proxy:3128/").unwrap();
    assert_eq!(p.authority(), "proxy:3128");
    let expected = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
    assert_eq!(
        p.auth.unwrap().to_str().unwrap(),
        format!("Basic {expected}")
    );
    assert_eq!(Proxy::parse("proxy").unwrap().authority(), "proxy:80");
}

#[test]
fn percent_decoding_keeps_what_is_not_an_escape() {
    assert_eq!(percent_decode("a%2"), b"a%2");
    assert_eq!(percent_decode("%zz%41"), b"%zzA");
    assert_eq!(percent_decode("%+1%2b+"), b"%+1++");
    assert_eq!(percent_decode("%e4%b8%ad"), "中".as_bytes());
}
