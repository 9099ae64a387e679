use super::*;

#[test]
fn names_round_trip_to_their_server() {
    let u = expose_uri("fs", "file:///tmp/a b/c?x=1#f");
    assert_eq!(u, "turnstile://fs/file:///tmp/a b/c?x=1#f");
    assert_eq!(parse_uri(&u), Some(("fs", "file:///tmp/a b/c?x=1#f")));
    assert_eq!(
        parse_uri(&expose_uri("a-b_c", "turnstile://x/y")),
        Some(("a-b_c", "turnstile://x/y"))
    );
    assert_eq!(parse_uri("test://static-text"), None);
    assert_eq!(parse_uri("turnstile://fs"), None);
    assert_eq!(parse_uri("turnstile:///x"), None);
    let p = expose_prompt("docs", "summarize/long");
    assert_eq!(parse_prompt(&p), Some(("docs", "summarize/long")));
    assert_eq!(parse_prompt("bare"), None);
    assert_eq!(parse_prompt("/x"), None);
}

#[test]
fn own_names_where_they_name_one_thing() {
    let items = vec![
        ("add", "mcp__a__add".to_string()),
        ("add", "mcp__b__add".to_string()),
        ("echo", "mcp__a__echo".to_string()),
        ("deliver_file", "deliver_file".to_string()),
        // Its own name is another one's federated name: neither may be shown by it.
        ("mcp__a__echo", "mcp__c__mcp__a__echo".to_string()),
        // Names no client is shown as they are.
        ("../../etc/passwd", "mcp__d_______etc_passwd".to_string()),
        ("\u{fc}n\u{ef}\u{202e}code", "mcp__d___code".to_string()),
    ];
    assert_eq!(
        shown(&items, EndpointNames::Federated, plain_name),
        vec![
            "mcp__a__add",
            "mcp__b__add",
            "mcp__a__echo",
            "deliver_file",
            "mcp__c__mcp__a__echo",
            "mcp__d_______etc_passwd",
            "mcp__d___code"
        ]
    );
    assert_eq!(
        shown(&items, EndpointNames::Own, plain_name),
        vec![
            "mcp__a__add",
            "mcp__b__add",
            "echo",
            "deliver_file",
            "mcp__c__mcp__a__echo",
            "mcp__d_______etc_passwd",
            "mcp__d___code"
        ]
    );
}

fn matches(t: &str, u: &str) -> bool {
    template_matches(t, u, &mut TEMPLATE_BUDGET.clone()).expect("within budget")
}

#[test]
fn templates_match_what_they_expand_to() {
    let t = "test://template/{id}/data";
    assert!(matches(t, "test://template/123/data"));
    assert!(!matches(t, "test://template//data"));
    assert!(!matches(t, "test://template/1/2/data"));
    assert!(!matches(t, "test://template/123/data/x"));
    assert!(matches("file:///{+path}", "file:///a/b/c.txt"));
    assert!(!matches("file:///{path}", "file:///a/b"));
    assert!(matches("db://t{?q,limit}", "db://t"));
    assert!(matches("db://t{?q,limit}", "db://t?q=1&limit=2"));
    assert!(matches("x://{a}-{b}", "x://1-2"));
    assert!(!matches("x://{a", "x://1"));
    assert!(matches("plain://x", "plain://x"));
    assert!(!matches("plain://x", "plain://y"));
}

#[test]
fn a_template_that_would_backtrack_matches_in_linear_time() {
    // A backtracking matcher tries every split of the slashes among the three
    // expressions: hours of CPU for 800 slashes. One pass takes microseconds.
    let t = "u://{+a}/{+b}/{+c}.json";
    let uri = format!("u://{}x", "/".repeat(800));
    let mut budget = TEMPLATE_BUDGET;
    assert_eq!(template_matches(t, &uri, &mut budget), Some(false));
    assert!(
        budget > TEMPLATE_BUDGET - 20_000,
        "work spent: {}",
        TEMPLATE_BUDGET - budget
    );
    assert!(matches(t, "u://a/b/c.json"));
    assert!(matches(t, &format!("u://{}c.json", "/".repeat(800))));
}

#[test]
fn matching_stops_when_the_budget_is_spent() {
    let t = "u://{+a}{+b}{+c}{+d}";
    let uri = format!("u://{}", "a".repeat(2000));
    let mut budget = 1_000;
    assert_eq!(template_matches(t, &uri, &mut budget), None);
}
